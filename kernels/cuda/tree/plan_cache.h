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
    {
      // Built now: no longer waiting for a second sight.
      std::lock_guard<std::mutex> lock(plans_mu_);
      Forget(seen_, parent, n);
    }
    auto made = TreeCablesPlan::Make(parent, n, pool, stream);
    if (!made.ok()) return made.status();
    std::shared_ptr<const TreeCablesPlan> plan(std::move(*made));
    std::lock_guard<std::mutex> lock(plans_mu_);
    plans_.emplace_front(std::vector<int32_t>(parent, parent + n), plan);
    while (plans_.size() > kPlansKept) plans_.pop_back();
    return plan;
  }

  // The cached plan of `parent`, or null; builds nothing.
  std::shared_ptr<const TreeCablesPlan> Find(const int32_t* parent, int64_t n) {
    std::lock_guard<std::mutex> lock(plans_mu_);
    for (auto it = plans_.begin(); it != plans_.end(); ++it)
      if (Same(it->first, parent, n)) {
        auto plan = it->second;
        plans_.splice(plans_.begin(), plans_, it);
        return plan;
      }
    return nullptr;
  }
  // Whether `parent` was asked for before without its plan being built (SeenBefore's last
  // kPlansKept arrays); records it if not. A caller that builds a plan only for a tree it sees
  // a second time (a time-stepping client's next step) pays no analysis for one-off requests.
  bool SeenBefore(const int32_t* parent, int64_t n) {
    std::lock_guard<std::mutex> lock(plans_mu_);
    if (Forget(seen_, parent, n)) return true;
    seen_.emplace_front(parent, parent + n);
    while (seen_.size() > kPlansKept) seen_.pop_back();
    return false;
  }

 private:
  static bool Same(const std::vector<int32_t>& kept, const int32_t* parent, int64_t n) {
    return int64_t(kept.size()) == n && std::memcmp(kept.data(), parent, size_t(n) * 4) == 0;
  }
  // Drops `parent` from `list`; whether it was there.
  static bool Forget(std::list<std::vector<int32_t>>& list, const int32_t* parent, int64_t n) {
    for (auto it = list.begin(); it != list.end(); ++it)
      if (Same(*it, parent, n)) {
        list.erase(it);
        return true;
      }
    return false;
  }
  std::list<std::vector<int32_t>> seen_;  // guarded by plans_mu_
  std::mutex plans_mu_;
  std::list<std::pair<std::vector<int32_t>, std::shared_ptr<const TreeCablesPlan>>> plans_;
};

}  // namespace trisolve::cuda
