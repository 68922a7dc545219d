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

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory_pool.h"
#include "tridiagonal/row_sweeps.h"
#include <optional>

#include "trisolve/block_tridiagonal.h"

namespace trisolve::cuda {


// The method that runs `method` on p (host arrays), the one place auto is resolved for the
// device: multigrid-preconditioned conjugate gradients for a symmetric system solved to a
// tolerance (either sign of definite matrix: CgDevice folds the sign in), else red-black.
// `symmetric`: p's symmetry where the caller knows it (a prepared system tests it once, not at
// every solve: a pass over four arrays on one host thread, 4.3 ms at 1024 x 1024); else tested.
template <typename T>
BlockMethod ResolveBlockMethod(const BlockTridiagonalProblem<T>& p, BlockMethod method,
                               const BlockOptions& options,
                               std::optional<bool> symmetric = std::nullopt);
// IsSymmetric (trisolve/block_tridiagonal.h) of p's device arrays, on the device: one pass
// over aC, bC, cA and cB on `stream` (waited for), the same comparisons and so the same answer
// as the host's pass, which took a host thread 5 ms at 1024 x 1024 (lent 4 x H200 host,
// 2026-11-28). A one-shot solve under auto tests it so, once its arrays are on the device.
template <typename T>
absl::StatusOr<bool> IsSymmetricDevice(const BlockTridiagonalProblem<T>& p, cudaStream_t stream);

// How multigrid-cg and multigrid-bicgstab launch their V-cycle (the same bits either way).
// kGraph: the V-cycle of each pair of vectors a solve applies it to is captured as a CUDA graph
// at its first application and replayed by one launch (on a stream the caller created; on the
// legacy default stream, or where a capture fails, the plain launches); kPlain: its kernels one
// launch each (6 a level and the coarsest level's). kDefault: kGraph unless the environment has
// TRISOLVE_BLOCK_GRAPHS=0 (read once). SetBlockLaunches sets it for the process from then on
// (tests, benchmarks); BlockGraphsOn is what solves starting now use.
enum class BlockLaunches : uint8_t { kDefault, kPlain, kGraph };
void SetBlockLaunches(BlockLaunches launches);
bool BlockGraphsOn();
// V-cycles launched as a graph in this process so far (how a test knows the graphs ran), and
// graphs captured (a prepared system's solves after its first capture none: they reuse the work
// the system keeps, its vectors and graphs).
int64_t VCycleGraphLaunches();
int64_t VCycleGraphCaptures();

// What a prepared block system keeps on the device between solves (krylov.cu): for
// multigrid-cg and multigrid-bicgstab the hierarchy's levels and their diagonals' signs, and
// one solve's work (its Krylov and coarse vectors, and the V-cycle's graphs over them) that one
// solve at a time takes and gives back; for cg the fine diagonals' sign. Built from the device
// copy of the coefficients by the kernels a solve would run (the same values); the levels only
// read by the solves, two of which at once never share vectors.
template <typename T>
struct BlockDeviceSetup;
// The setup of `method` (resolved: not auto) for p's coefficients (device arrays; f unread);
// nullptr for a method with nothing to keep. Synchronises `stream`.
template <typename T>
absl::StatusOr<std::shared_ptr<const BlockDeviceSetup<T>>> PrepareBlockDevice(
    const BlockTridiagonalProblem<T>& p, BlockMethod method, Pool& pool, cudaStream_t stream);
template <typename T>
int64_t BlockDeviceSetupBytes(const BlockDeviceSetup<T>& setup);
template <typename T>
std::string DescribeBlockDeviceSetup(const BlockDeviceSetup<T>& setup);

// p's arrays and y (in: the initial guess, out: the iterate) are device arrays in the natural
// layout (row i at i * M). Fills status like the CPU reference. auto here is red-black (the
// backend resolves it first, ResolveBlockMethod). kept: PrepareBlockDevice's for p's
// coefficients and this method, used instead of building the setup again (x bit for bit the
// same).
template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(const BlockTridiagonalProblem<T>& p,
                                                      BlockMethod method,
                                                      const BlockOptions& options, T* y,
                                                      SystemStatus* status, Pool& pool,
                                                      const SolveControl& control,
                                                      cudaStream_t stream,
                                                      const BlockDeviceSetup<T>* kept = nullptr);

}  // namespace trisolve::cuda
