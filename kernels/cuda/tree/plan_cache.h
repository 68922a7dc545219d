// The cable plans of the tree family's morphologies, built once and kept for the next time
// steps: a small cache of the most recent parent arrays, compared by content (a time-stepping
// client sends the same morphology every step).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory_pool.h"
#include "tree/tree.h"

namespace trisolve::cuda {

class TreePlanCache {
 public:
  static constexpr size_t kPlansKept = 4;

  // The plan of `parent` (n nodes): the cached one, else one built now (on `stream`, from
  // `pool`) and kept.
  absl::StatusOr<std::shared_ptr<const TreeCablesPlan>> Get(const int32_t* parent, int64_t n,
                                                            Pool& pool, cudaStream_t stream) {
    {
      std::lock_guard<std::mutex> lock(plans_mu_);
      for (auto it = plans_.begin(); it != plans_.end(); ++it)
        if (int64_t(it->first.size()) == n &&
            std::memcmp(it->first.data(), parent, size_t(n) * 4) == 0) {
          auto plan = it->second;
          plans_.splice(plans_.begin(), plans_, it);  // most recent first
          return plan;
        }
    }
    auto made = TreeCablesPlan::Make(parent, n, pool, stream);
    if (!made.ok()) return made.status();
    std::shared_ptr<const TreeCablesPlan> plan(std::move(*made));
    std::lock_guard<std::mutex> lock(plans_mu_);
    plans_.emplace_front(std::vector<int32_t>(parent, parent + n), plan);
    while (plans_.size() > kPlansKept) plans_.pop_back();
    return plan;
  }

 private:
  std::mutex plans_mu_;
  std::list<std::pair<std::vector<int32_t>, std::shared_ptr<const TreeCablesPlan>>> plans_;
};

}  // namespace trisolve::cuda
