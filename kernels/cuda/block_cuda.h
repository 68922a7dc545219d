// The thesis' block iterations on the GPU, on device arrays.
//
// Rows are kept colour-major on the device (block rows 0, 2, 4, ... then 1, 3, 5, ...). Where a
// row fits one thread block (M <= 4096) or, on sm_90, the 2 or 4 blocks of a thread-block
// cluster (M <= 16384), red-black, jacobi and gauss-seidel run as fused sweeps: one kernel
// launch for up to 64 sweeps, a thread block (cluster) a row and sweep, each row's right-hand
// side F_i - A_i Y_{i-1} - B_i Y_{i+1} formed as the row is loaded (into registers, or staged
// through shared memory for rows over 2048) and the row solved on chip by the partitioned
// method; rows wait on per-row sweep counters for exactly the neighbours the method reads, so
// half-sweeps and sweeps overlap (gauss-seidel, sequential over rows within a
// sweep, runs its sweeps as a wavefront). Red-black and jacobi on float64 rows of 2049-16384
// run streamed: persistent blocks copy their next row into shared memory (by bulk tensor copies
// where the row is a multiple of 16 values, else cp.async) while they solve the current one.
// Longer rows (over 16384): per half-sweep one kernel forming the right-hand sides of a
// contiguous batch of rows and one batched tridiagonal solve (the partitioned kernel); Jacobi
// into a second buffer; Gauss-Seidel one row at a time. The method
// reported ends in "+fused" when the fused sweeps ran. The relative residual is computed on the
// device from the original arrays, its sums added in a fixed order. cg: conjugate gradients
// preconditioned by the line solves, one batched partitioned tridiagonal solve over every block
// row.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "absl/status/statusor.h"
#include "memory_pool.h"
#include "trisolve/block_tridiagonal.h"

namespace trisolve::cuda {

// The sweeps' launch choices (the benchmark compares them). fused = false: the two-kernel
// half-sweeps always. chunk: rows a thread of the fused kernel, 8 or 16; 0: 16 for rows over
// 2048 (gauss-seidel: over 4096), else 8. staged: 1 the fused kernel stages a row through shared
// memory, -1 loads it straight into registers; 0: staged for rows over 2048 at 16 rows a
// thread. cluster: blocks a row, 1, 2 or 4 (a
// thread-block cluster, sm_90); 0: the fewest that hold the row. stream (16 rows a thread
// only): 1 persistent blocks copy the next task's row into shared memory while they solve the
// current one, -1 a block a task; 0: streamed for red-black and jacobi, float64 rows of 2049 to
// 16384. bulk (streamed float64 rows of a multiple of 16 values): 0 the rows' copies by the copy
// engine's bulk tensor copies (sm_90), -1 by each thread's cp.async. stream_threads (streamed
// float64 on sm_90): 128 blocks of 128 threads, two an SM, in clusters of 2 to 8 blocks a row;
// 256 blocks of 256 threads, clusters of 1 to 4; 0: 128 for rows over 4096. group (streamed,
// bulk copies): the neighbours' loads 4 or 8 rows a thread at a time; 0: 8. window: 1 red-black
// and jacobi run the streamed form over overlapping windows of 4096 values of each row
// (trisolve/windows.h; a task a window) for any M over 4096, -1 never; 0: for float64 rows too
// long for the other fused forms (over 16384). Either way only where every row of the line
// systems has (|a| + |c|) / |b| under the limit of a halo of 256 (0.864 float64, 0.935
// float32), checked once a solve (not for a solve of one sweep, unless window is 1); else the
// two-kernel half-sweeps. window_halo: the rows each
// window reads past its core on each side, rounded up to a multiple of 16 (at most 1024), where
// the rows' ratios allow it (else no windows); 0: the least multiple of 16 they allow (64 for
// ratios up to 0.562 in float64, 256 up to 0.864). The method reported names the halo:
// "red-black+fused+windows(halo 64)".
struct SweepTuning {
  bool fused = true;
  int chunk = 0;
  int staged = 0;
  int cluster = 0;
  int stream = 0;
  int bulk = 0;
  int stream_threads = 0;
  int group = 0;
  int window = 0;
  int window_halo = 0;
};
void SetSweepTuning(const SweepTuning& t);
SweepTuning GetSweepTuning();

// Diagnostics: in a build configured with -DTRISOLVE_SWEEP_PROFILE=ON, the clock cycles a task
// of the streamed fused sweeps spent in each phase (averaged over every block's tasks since the
// last call, which clears them), then {"blocks", the most blocks a launch ran}; empty in other
// builds.
struct SweepPhaseTime {
  const char* phase;
  double cycles;
};
std::vector<SweepPhaseTime> TakeSweepProfile();

// p's arrays and y (in: the initial guess, out: the iterate) are device arrays in the natural
// layout (row i at i * M). Fills status like the CPU reference.
template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(const BlockTridiagonalProblem<T>& p,
                                                      BlockMethod method,
                                                      const BlockOptions& options, T* y,
                                                      SystemStatus* status, Pool& pool,
                                                      const SolveControl& control,
                                                      cudaStream_t stream);

}  // namespace trisolve::cuda
