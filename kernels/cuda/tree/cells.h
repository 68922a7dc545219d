// Tree cells of different sizes (TreeProblem::offsets) one thread block a cell: the
// contraction-block (or cables-block) kernel with each block reading its own cell's offset,
// size and plan. Cells of one structure (the same local parent array) share one plan; the
// distinct structures' tree contractions (cable decompositions) are built on host threads and
// laid end to end in one device buffer. Cells that cannot run one a block (too many nodes for
// shared memory in this precision, too many rounds, a cable over 64 nodes) are left for
// another path (TreeCellsPlan::rest).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory_pool.h"
#include "trisolve/tree.h"

namespace trisolve::cuda {

// A 64-bit hash of n int32 values at memory speed (the plan caches' keys and the cells'
// structures: a match is then compared exactly, or only costs a plan built).
uint64_t HashParents(const int32_t* v, int64_t n);

// The cells grouped by structure: cells of the same size and the same local parent array
// (compared exactly after a hash) share a structure. Host only.
struct TreeCellGroups {
  std::vector<int32_t> structure_of;  // per cell
  std::vector<int64_t> first_cell;    // per structure: the cell whose parent array it is
};
TreeCellGroups GroupTreeCells(const int32_t* parent, const int64_t* offsets, int64_t cells);

// The elimination a block runs on its cell: tree contraction (contraction-block) or the
// cable heights (cables-block).
enum class TreeCellsKind : uint8_t { kContraction, kCables };

// Whether a cell of n nodes and `rounds` contraction rounds runs one a block, its four arrays
// of elem_bytes values in shared memory.
bool TreeCellFitsBlock(int64_t n, int64_t rounds, int elem_bytes);
// The same for cables-block: its longest cable at most 64 nodes.
bool TreeCellFitsCablesBlock(int64_t n, int64_t longest_cable, int elem_bytes);

// The forest's analysis as the block kernel reads it (host arrays; TreeCellsPlan copies them
// to the device). Blocks run largest cell first, in launches of similar sizes.
struct TreeCellsSchedule {
  struct Launch {
    int32_t block0, blocks, max_n, threads;
  };
  TreeCellsKind kind = TreeCellsKind::kContraction;
  int64_t structures = 0;
  std::vector<int32_t> cell_of_block;  // the cells one a block, in block order
  std::vector<int32_t> rest;           // the cells left to another path (ascending)
  std::vector<Launch> launches;
  // Per block {first node, low and high halves; n | rounds (cable heights) << 16; where its
  // structure's round offsets start in ptr_e and ptr_u (its level offsets in level_ptr)}.
  std::vector<int4> info;
  // kContraction: the distinct structures' contraction schedules end to end, packed as for
  // one morphology (cables_kernels.cuh, ContractionBlockKernel), every offset rebased to these
  // arrays.
  std::vector<int2> elim, upd, upd_more;
  std::vector<int32_t> ptr_e, ptr_u, children;
  // kCables: their cable descriptions (CablesBlockKernel's cinfo, cmore, ctop) and levels,
  // likewise.
  std::vector<int4> cinfo;
  std::vector<int2> cmore;
  std::vector<int32_t> ctop, level_ptr;
};
// A launch's threads a block. kBySize: by its largest cell (128 up to 256 nodes, 256 up to
// 1,024, 512 above). kOccupancy: as many of its blocks on an SM as their shared memory lets
// run, within the 1,024 threads an SM runs of kernels of 64 registers a thread (float64).
enum class TreeCellsThreads : uint8_t { kOccupancy, kBySize };
int TreeCellsBlockThreads(int64_t max_n, int elem_bytes, TreeCellsKind kind,
                          TreeCellsThreads rule);

// threads: host threads for the distinct structures' analyses (0: the hardware's).
TreeCellsSchedule ScheduleTreeCells(const int32_t* parent, const int64_t* offsets, int64_t cells,
                                    int elem_bytes, int threads = 0,
                                    TreeCellsKind kind = TreeCellsKind::kContraction,
                                    TreeCellsThreads rule = TreeCellsThreads::kOccupancy);

// How a plan's launches (one a size class) are ordered. kSerial: one after the other on the
// caller's stream, each launch's last wave leaving SMs idle until the next starts. kOverlapped:
// the largest cells' launch on the caller's stream, every other on a stream of the plan forked
// from it (an event a call) and joined back, so the smaller cells fill the SMs the larger ones'
// tail leaves. kDefault: kOverlapped unless TRISOLVE_TREE_CELLS_SERIAL=1.
enum class TreeCellsLaunches : uint8_t { kDefault, kSerial, kOverlapped };
TreeCellsLaunches TreeCellsLaunchesFromEnv();

class TreeCellsPlan;

// Solves the cells of p (flat, p.offsets given on the host, device arrays) that the plan runs
// one a block; x and status_flags (a byte per cell, kFlagVanished where a pivot vanished) of
// the other cells are not touched. Every launch is ordered after the work already on `stream`
// and the work enqueued on `stream` afterwards after every launch, whichever `launches`.
template <typename T>
absl::Status SolveTreeCellsBlockDevice(const TreeProblem<T>& p, const TreeCellsPlan& plan, T* x,
                                       uint8_t* status_flags, cudaStream_t stream,
                                       TreeCellsLaunches launches = TreeCellsLaunches::kDefault);

class TreeCellsPlan {
 public:
  ~TreeCellsPlan();
  TreeCellsPlan(const TreeCellsPlan&) = delete;
  TreeCellsPlan& operator=(const TreeCellsPlan&) = delete;
  // Analyses the forest (valid local parent arrays, host) for arrays of elem_bytes values
  // (4 or 8) and copies the analysis to the device (synchronously). threads: host threads for
  // the distinct structures' analyses (0: the hardware's).
  static absl::StatusOr<std::unique_ptr<TreeCellsPlan>> Make(const int32_t* parent,
                                                             const int64_t* offsets,
                                                             int64_t cells, int elem_bytes,
                                                             Pool& pool, cudaStream_t stream,
                                                             int threads = 0,
                                                             TreeCellsKind kind =
                                                                 TreeCellsKind::kContraction,
                                                             TreeCellsThreads rule =
                                                                 TreeCellsThreads::kOccupancy);
  int64_t cells() const { return cells_; }
  int64_t structures() const { return structures_; }
  int elem_bytes() const { return elem_bytes_; }
  TreeCellsKind kind() const { return kind_; }
  // The cells the block kernel solves, and those it leaves (ascending).
  int64_t block_cells() const { return int64_t(cell_of_block_.size()); }
  const std::vector<int32_t>& rest() const { return rest_; }
  // Host time of Make's analysis (grouping, contractions, packing), milliseconds.
  double analysis_ms() const { return analysis_ms_; }
  // The kernel launches a solve makes (one a size class).
  int64_t launches() const { return int64_t(launches_.size()); }

 private:
  TreeCellsPlan() = default;
  template <typename T>
  friend absl::Status SolveTreeCellsBlockDevice(const TreeProblem<T>&, const TreeCellsPlan&, T*,
                                                uint8_t*, cudaStream_t, TreeCellsLaunches);
  using Launch = TreeCellsSchedule::Launch;
  int64_t cells_ = 0, structures_ = 0;
  int elem_bytes_ = 8;
  TreeCellsKind kind_ = TreeCellsKind::kContraction;
  double analysis_ms_ = 0;
  std::vector<int32_t> cell_of_block_;  // largest cells first
  std::vector<int32_t> rest_;
  std::vector<Launch> launches_;  // blocks of similar sizes: one shared-memory size a launch
  // The streams of launches 1.. when they overlap (non-blocking; a call's events order them
  // after the caller's stream's work and the caller's after them, so two calls may share them).
  std::vector<cudaStream_t> side_streams_;
  Pool::Buffer buf_;
  const int4* cell_info_ = nullptr;  // per block {first lo, first hi, n | rounds << 16, ptr}
  const int32_t* cell_id_ = nullptr;  // per block: its cell (the status index)
  const int2 *elim_ = nullptr, *upd_ = nullptr, *upd_more_ = nullptr;
  const int32_t *ptr_e_ = nullptr, *ptr_u_ = nullptr, *children_ = nullptr;
  const int4* cinfo_ = nullptr;
  const int2* cmore_ = nullptr;
  const int32_t *ctop_ = nullptr, *level_ptr_ = nullptr;
};

}  // namespace trisolve::cuda
