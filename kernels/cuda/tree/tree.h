// Tree (Hines) systems on the GPU, on device arrays.
//
// "hines-batch": cells sharing one morphology, one thread per cell. The parent array and a
// byte of flags per node are staged once per block in shared memory (not read once per cell).
// Along an unbranched cable (parent[i] = i - 1, most nodes of a real morphology) the backward
// sweep hands node i's contribution to node i - 1 in registers; only contributions to branch
// points go through a scratch array, initialised by the first child to arrive (no memset). The
// backward sweep leaves R_i / D_i in x and lower_i / D_i in a scratch array; the forward sweep
// reads them back: about 9 arrays of traffic against the 5 that must move.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "runtime/memory_pool.h"
#include "trisolve/tree.h"

namespace trisolve::cuda {

// Per-node flags for a shared morphology, computed once on the host from a valid parent array.
enum TreeNodeFlag : uint8_t {
  kCarryToParent = 1,  // parent[i] == i - 1: the contribution travels in registers
  kHasBranchAcc = 2,   // some child j != i + 1 left a contribution in the scratch array
  kFirstBranchChild = 4,  // the first (highest) such child of its parent: initialises it
};
std::vector<uint8_t> TreeNodeFlags(const int32_t* parent, int64_t n);

// The largest n the batch kernel stages in shared memory (5 bytes a node).
int64_t MaxTreeNodesOnChip();

// Solves p (device arrays, either layout) on `stream`; node_flags is a device copy of
// TreeNodeFlags(parent). status_flags as for the tridiagonal kernels. With one shared parent
// array of at most MaxTreeNodesOnChip() nodes the parent array and flags are staged in shared
// memory; otherwise (p.parent_per_system: batch * n parents and flags, one set per cell, or a
// larger shared tree) each thread reads them from global memory.
template <typename T>
absl::Status SolveTreeBatchDevice(const TreeProblem<T>& p, const uint8_t* node_flags, T* x,
                                  uint8_t* status_flags, Pool& pool, cudaStream_t stream);

// "cables": one large tree (or a few) across the whole GPU, by the cable decomposition of
// trisolve/tree.h. Each height of the cable tree is one launch of the backward phase (a thread
// per cable, loads run ahead of the elimination; a cable's children leave their contributions
// in adjacent slots) and one of the forward phase (a thread per node: x_j = q_j - w_j
// x_anchor); the narrow top of the cable tree (levels of at most 2048 cables) runs in one
// block a system with barriers between the levels instead of launches. Cables longer than kLongCable nodes are instead solved as
// tridiagonal systems by the partitioned kernel across many threads: T y = r for q and, when
// the cable hangs from a node, T z = e_0 for w -- the same values the sweep would leave.
constexpr int64_t kLongCable = 512;

class TreeCablesPlan {
 public:
  // Analyses a valid host parent array and copies the analysis to the device (synchronously).
  static absl::StatusOr<std::unique_ptr<TreeCablesPlan>> Make(const int32_t* parent, int64_t n,
                                                              Pool& pool, cudaStream_t stream);
  const TreeCables& cables() const { return t_; }
  int64_t n() const { return t_.n; }
  int64_t levels() const { return t_.levels(); }
  int64_t longest_cable() const { return longest_; }
  int64_t tail_levels() const { return t_.levels() - tail_begin_; }

 private:
  template <typename T>
  friend absl::Status SolveTreeCablesDevice(const TreeProblem<T>&, const TreeCablesPlan&, T*,
                                            uint8_t*, Pool&, cudaStream_t);
  template <typename T>
  friend absl::Status SolveTreeCablesBlockDevice(const TreeProblem<T>&, const TreeCablesPlan&,
                                                 T*, uint8_t*, cudaStream_t);
  template <typename T>
  friend bool CablesBlockFits(const TreeProblem<T>&, const TreeCablesPlan&);
  template <typename T>
  friend absl::Status SolveTreeContractionBlockDevice(const TreeProblem<T>&,
                                                      const TreeCablesPlan&, T*, uint8_t*,
                                                      cudaStream_t);
  template <typename T>
  friend bool ContractionBlockFits(const TreeProblem<T>&, const TreeCablesPlan&);
  TreeCables t_;                    // `order` has each level's long cables last
  std::vector<int32_t> short_end_;  // per level h: order[level_ptr[h] .. short_end_[h]) short
  std::vector<int32_t> slot_of_cable_;  // where a cable leaves its contribution (-1: root)
  int32_t tail_begin_ = 0;          // heights from here on run in the one-block tail kernel
  int64_t longest_ = 0;
  Pool::Buffer buf_;
  const int32_t *start_ = nullptr, *child_ptr_ = nullptr, *order_ = nullptr, *slot_ = nullptr,
                *node_order_ = nullptr, *node_anchor_ = nullptr, *level_ptr_ = nullptr,
                *node_level_ptr_ = nullptr;
  // For the one-block-a-cell kernel (n < 65536, no cable over kBlockMaxCable nodes): per
  // cable in `order`, its description (tree_cables.cu, BlockCable); per child slot, the child
  // cable's top node.
  Pool::Buffer block_buf_;
  const int4* cinfo_ = nullptr;
  const int2* cmore_ = nullptr;
  const int32_t* ctop_ = nullptr;
  // The tree contraction's rounds (n < 65535), for contraction-block: per removal and per
  // update an 8-byte entry (tree_cables.cu), the removed-children lists of updates with more
  // than two, the rounds' offsets.
  Pool::Buffer contraction_buf_;
  const int2 *elim_ = nullptr, *upd_ = nullptr, *upd_more_ = nullptr;
  const int32_t *elim_ptr_ = nullptr, *upd_ptr_ = nullptr, *children_ = nullptr;
  int32_t rounds_ = 0;
};

// "cables-block": cells of one morphology (either layout), one thread block a cell: the cell's
// lower, upper, diag and rhs are copied once into shared memory (asynchronous copies, all in
// flight), the cable elimination runs there level by level with barriers (a thread a cable in
// both phases; a cable's contribution to its anchor left in its top node's spent diag/upper),
// and x is written once: 5 arrays of traffic, as the floor. Fits when the four arrays fit in
// shared memory (n <= ~7,200 in float64) and no cable is longer than 64 nodes.
template <typename T>
bool CablesBlockFits(const TreeProblem<T>& p, const TreeCablesPlan& plan);
template <typename T>
absl::Status SolveTreeCablesBlockDevice(const TreeProblem<T>& p, const TreeCablesPlan& plan,
                                        T* x, uint8_t* status_flags, cudaStream_t stream);

// "contraction-block": cells of one morphology (either layout), one thread block a cell, the
// arrays in shared memory as for cables-block, the elimination by tree contraction
// (trisolve/tree.h): O(log n) rounds of parallel removals and updates instead of the cable
// heights' chains. Fits when the four arrays fit in shared memory (n <= ~7,200 in float64).
template <typename T>
bool ContractionBlockFits(const TreeProblem<T>& p, const TreeCablesPlan& plan);
template <typename T>
absl::Status SolveTreeContractionBlockDevice(const TreeProblem<T>& p, const TreeCablesPlan& plan,
                                             T* x, uint8_t* status_flags, cudaStream_t stream);

// Solves p (device arrays, one shared parent array whose plan is given, either layout, any
// batch) on `stream`; status_flags as above.
template <typename T>
absl::Status SolveTreeCablesDevice(const TreeProblem<T>& p, const TreeCablesPlan& plan, T* x,
                                   uint8_t* status_flags, Pool& pool, cudaStream_t stream);

}  // namespace trisolve::cuda
