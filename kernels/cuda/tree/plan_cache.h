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
#include "tree/cells.h"
#include "tree/tree.h"

namespace trisolve::cuda {

// The last kKept keys (a size and a 64-bit hash of the values) asked for without a plan built:
// a caller that builds a plan only for a tree it sees a second time (a time-stepping client's
// next step) pays no analysis for one-off requests; a false match only builds a plan, and no
// array is copied. Guarded by its owner's lock.
class SeenKeys {
 public:
  static constexpr size_t kKept = 16;
  using Key = std::pair<int64_t, uint64_t>;
  // Whether `key` is among them (then dropped: its plan is about to be built); records it if not.
  bool SeenBefore(const Key& key) {
    for (auto it = keys_.begin(); it != keys_.end(); ++it)
      if (*it == key) {
        keys_.erase(it);
        return true;
      }
    keys_.push_front(key);
    while (keys_.size() > kKept) keys_.pop_back();
    return false;
  }

 private:
  std::list<Key> keys_;
};

class TreePlanCache {
 public:
  static constexpr size_t kPlansKept = 4;

  // The plan of `parent` (n nodes): the cached one, else one built now (on `stream`, from
  // `pool`) and kept.
  absl::StatusOr<std::shared_ptr<const TreeCablesPlan>> Get(const int32_t* parent, int64_t n,
                                                            Pool& pool, cudaStream_t stream) {
    if (auto plan = Find(parent, n)) return plan;
    auto made = TreeCablesPlan::Make(parent, n, pool, stream);
    if (!made.ok()) return made.status();
    std::shared_ptr<const TreeCablesPlan> plan(std::move(*made));
    std::lock_guard<std::mutex> lock(plans_mu_);
    plans_.emplace_front(std::vector<int32_t>(parent, parent + n), plan);
    while (plans_.size() > kPlansKept) plans_.pop_back();
    return plan;
  }

  // The cached plan of `parent`, or null; builds nothing. Most recent first.
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
  // Whether `parent` was asked for before without its plan being built (SeenKeys).
  bool SeenBefore(const int32_t* parent, int64_t n) {
    const SeenKeys::Key key(n, HashParents(parent, n));
    std::lock_guard<std::mutex> lock(plans_mu_);
    return seen_.SeenBefore(key);
  }

 private:
  static bool Same(const std::vector<int32_t>& kept, const int32_t* parent, int64_t n) {
    return int64_t(kept.size()) == n && std::memcmp(kept.data(), parent, size_t(n) * 4) == 0;
  }
  SeenKeys seen_;  // guarded by plans_mu_
  std::mutex plans_mu_;
  std::list<std::pair<std::vector<int32_t>, std::shared_ptr<const TreeCablesPlan>>> plans_;
};

// The per-cell plans of forests (TreeProblem::offsets), kept by the forest: its cells' sizes
// and local parent arrays, the precision it was built for (which cells fit a block) and the
// kernel's kind.
class TreeCellsPlanCache {
 public:
  static constexpr size_t kPlansKept = 4;

  // The cached plan of the forest, or null; builds nothing.
  std::shared_ptr<const TreeCellsPlan> Find(const int32_t* parent, const int64_t* offsets,
                                            int64_t cells, int elem_bytes, TreeCellsKind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = plans_.begin(); it != plans_.end(); ++it)
      if (it->kind == kind && it->Same(parent, offsets, cells, elem_bytes)) {
        auto plan = it->plan;
        plans_.splice(plans_.begin(), plans_, it);
        return plan;
      }
    return nullptr;
  }
  // The forest's plan: the cached one, else one built now and kept.
  absl::StatusOr<std::shared_ptr<const TreeCellsPlan>> Get(const int32_t* parent,
                                                           const int64_t* offsets, int64_t cells,
                                                           int elem_bytes, TreeCellsKind kind,
                                                           Pool& pool, cudaStream_t stream) {
    if (auto plan = Find(parent, offsets, cells, elem_bytes, kind)) return plan;
    auto made = TreeCellsPlan::Make(parent, offsets, cells, elem_bytes, pool, stream, 0, kind);
    if (!made.ok()) return made.status();
    std::shared_ptr<const TreeCellsPlan> plan(std::move(*made));
    Entry e;
    e.elem_bytes = elem_bytes;
    e.kind = kind;
    e.offsets.assign(offsets, offsets + cells + 1);
    e.parent.assign(parent, parent + offsets[cells]);
    e.plan = plan;
    std::lock_guard<std::mutex> lock(mu_);
    plans_.push_front(std::move(e));
    while (plans_.size() > kPlansKept) plans_.pop_back();
    return plan;
  }
  // As TreePlanCache::SeenBefore, for a forest: its nodes and a hash of the cells, their
  // lengths and the parent values.
  bool SeenBefore(const int32_t* parent, const int64_t* offsets, int64_t cells) {
    uint64_t h = HashParents(parent, offsets[cells]) ^ uint64_t(cells);
    for (int64_t k = 0; k <= cells; ++k) h = (h ^ uint64_t(offsets[k])) * 0xff51afd7ed558ccdull;
    const SeenKeys::Key key(offsets[cells], h);
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.SeenBefore(key);
  }

 private:
  struct Entry {
    int elem_bytes = 0;
    TreeCellsKind kind = TreeCellsKind::kContraction;
    std::vector<int64_t> offsets;
    std::vector<int32_t> parent;
    std::shared_ptr<const TreeCellsPlan> plan;
    bool Same(const int32_t* p, const int64_t* off, int64_t cells, int eb) const {
      return eb == elem_bytes && int64_t(offsets.size()) == cells + 1 &&
             std::memcmp(offsets.data(), off, size_t(cells + 1) * 8) == 0 &&
             std::memcmp(parent.data(), p, size_t(off[cells]) * 4) == 0;
    }
  };
  std::mutex mu_;
  std::list<Entry> plans_;
  SeenKeys seen_;  // guarded by mu_
};

}  // namespace trisolve::cuda
