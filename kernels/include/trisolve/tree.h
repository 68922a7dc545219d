// Tree (Hines) systems: nodes numbered depth-first from the root 0, parent[0] = -1 and
// parent[i] < i. A[i][i] = diag[i], A[i][parent[i]] = lower[i], A[parent[i]][i] = upper[i].
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/types.h"

namespace trisolve {

enum class TreeMethod : uint8_t { kAuto, kHines };
absl::StatusOr<TreeMethod> ParseTreeMethod(absl::string_view name);
absl::string_view MethodName(TreeMethod m);

template <typename T>
struct TreeProblem {
  int64_t batch = 0;
  int64_t n = 0;
  Layout layout = Layout::kFlat;
  // n values shared by every system, or batch * n (one array per system, always flat).
  const int32_t* parent = nullptr;
  bool parent_per_system = false;
  const T* lower = nullptr;
  const T* upper = nullptr;
  const T* diag = nullptr;
  const T* rhs = nullptr;
};

template <typename T>
struct TreeOutput {
  T* x = nullptr;
  SystemStatus* status = nullptr;
};

// OK when parent[0] == -1 and 0 <= parent[i] < i for i > 0; otherwise names the first
// offending node.
absl::Status ValidateParents(const int32_t* parent, int64_t n);

namespace cpu {
template <typename T>
SolveInfo SolveTree(const TreeProblem<T>& p, TreeMethod method, TreeOutput<T> out);
}  // namespace cpu

template <typename T>
double TreeBackwardError(const TreeProblem<T>& p, const T* x, const SystemStatus* status);

}  // namespace trisolve
