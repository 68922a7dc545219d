// The row kernels shared by the tridiagonal family and the block sweeps: a line system's rows
// solved by the partitioned method in one thread block (or a thread-block cluster), either alone
// (SolveRowsStreamed: a batch of flat tridiagonal systems) or coupled to their neighbour rows
// as the sweeps of the block iterations (block/sweeps.cu). The block family depends on this
// module, never the other way round.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "tridiagonal/tuning.h"
#include "trisolve/windows.h"

namespace trisolve::cuda {

// The sweeps' tuning in use on this thread (ActiveTuning().sweeps, cuda/tuning_table.h).
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

enum class SweepKind : int { kRedBlack = 0, kJacobi = 1, kGaussSeidel = 2 };

template <typename T>
struct SweepArgs {
  int64_t N, M;
  const T *aC, *cC, *bC, *cA, *cB, *f;  // colour-major rows (Perm)
  T* Y0;                                 // the iterate (jacobi: sweeps read Y0 at even s)
  T* Y1;                                 // jacobi's second buffer
  int* done;                             // per natural row: sweeps of this launch completed
  unsigned* next;                        // the task counter
  uint8_t* bad;                          // per colour-major row: a pivot vanished
  const int* diag;                       // gauss-seidel: tasks before diagonal d, d <= ndiag
  int ndiag;
  int sweeps;
  SweepKind kind;
  bool vec;  // 16-byte loads and stores: M a multiple of 16 / sizeof(T), arrays aligned
  // Rows solved alone (SolveRowsStreamed: a batch of tridiagonal systems, one jacobi sweep from
  // F into Y1): no neighbours (cA, cB, Y0 unused), no waits on other rows, nothing published
  // but the flags; `done` unused. The streamed kernel only, instantiated with kQB = 0 for it.
  bool uncoupled = false;
  // The windowed form (the streamed kernel with kWin, one block a window): each row's line
  // solve as win.per_system overlapping windows (trisolve/windows.h), a task each; done[] then
  // counts per_system a sweep. per_system 0: not windowed.
  WindowPlan win{};
};

// The parts a row's sweep is published in: Q blocks, or (kWin) its windows.

// Threads of a streamed block (the streamed kernel's default; 128 for the small form).
constexpr int kStreamThreads = 256;

// The launch form of the fused sweeps for rows of M (SweepFormFor): rows a thread (0: no fused
// form holds the row), blocks a row, whether streamed, a streamed block's threads and the
// windowed form's plan.
struct SweepForm {
  int chunk = 0, Q = 1;
  bool stream = false;
  int threads = kStreamThreads;  // stream: a block's threads
  WindowPlan win{};              // the windowed form (per_system > 1)
};
SweepForm SweepFormFor(int64_t M, bool float64, SweepKind kind);

// Launches `g.sweeps` fused sweeps in `form` (the streamed kernel, or the one-launch fused
// kernel staged or not as the tuning and M say).
template <typename T>
absl::Status LaunchRowSweeps(const SweepForm& form, const SweepArgs<T>& g, cudaStream_t stream);

}  // namespace trisolve::cuda

#ifdef __CUDACC__
namespace trisolve::cuda {
namespace {
// Row i's place in the colour-major layout: even rows first, then odd rows.
__device__ __forceinline__ int64_t Perm(int64_t i, int64_t N) {
  return (i & 1) ? (N + 1) / 2 + i / 2 : i / 2;
}
}  // namespace
}  // namespace trisolve::cuda
#endif
