// Neuron morphologies in the SWC format (id type x y z radius parent), turned into the
// parent array of a Hines system: ids renumbered from 0 in file order, every parent before
// its children, one root.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trisolve {

struct Morphology {
  std::vector<int32_t> parent;  // parent[0] = -1, parent[i] < i
  std::vector<int32_t> type;
  std::vector<double> x, y, z, radius;
  int64_t size() const { return static_cast<int64_t>(parent.size()); }
};

absl::StatusOr<Morphology> ParseSwc(const std::string& text, const std::string& origin = "swc");
absl::StatusOr<Morphology> ReadSwc(const std::string& path);

}  // namespace trisolve
