// The tridiagonal module's inside: what its dispatch (dispatch.cc: which kernel runs a shape,
// with which launch shape) hands its drivers (tridiagonal.cu: the launches), and the launch
// limits both read. Not for other modules: they call tridiagonal.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/memory_pool.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/windows.h"

namespace trisolve::cuda {

// ---- launch limits, which the kernels' __launch_bounds__ (partitioned_kernels.cuh) and the
// dispatch's shapes share
constexpr int kChunk = 8;  // rows per thread (registers: ~4 * kChunk values)
constexpr int kMaxThreadsOnChip = 512;
// Threads a block of the one-pass kernel at most: 16 rows a thread need 255 registers.
constexpr int MaxThreadsOnChip(int chunk) { return chunk >= 16 ? 256 : kMaxThreadsOnChip; }
constexpr int kThomasThreads = 128;
constexpr int kWindowThreads = 256, kWindowChunk = 16;  // windows of 4096 rows, one a block
constexpr int kMaxCluster = 8;                           // the portable cluster size

inline int NextPow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

namespace tridiagonal {

// The one-block kernels' launch (OnChipFormFor): rows a thread, threads a block at least,
// whether flat rows load straight into registers, and whether the streamed kernel is tried
// first (chunk 8 or 16), at how many threads a block.
struct OnChipForm {
  int chunk = kChunk;
  int min_threads = 128;
  bool direct = true;
  bool try_stream = false;
  int stream_threads = 128;
};

// A cluster launch's shape: Q blocks a system, S systems x Pb threads a block, M rows a thread.
struct ClusterShape {
  int M = 0, Q = 1, Pb = 0, S = 0;
};

// Device scratch of the two-pass path and of the reduced systems below it: taken from the pool
// once, by the top level, and handed down, so that the levels below neither allocate nor wait
// for the device before the next level's launch (one wait, at the top).
struct Scratch {
  char* p = nullptr;
  int64_t left = 0;
  template <typename T>
  T* Take(int64_t count) {
    const int64_t bytes = (int64_t(sizeof(T)) * count + 255) / 256 * 256;
    if (bytes > left) return nullptr;
    T* r = reinterpret_cast<T*>(p);
    p += bytes;
    left -= bytes;
    return r;
  }
};

// ---- the drivers (tridiagonal.cu): each launches what it is told, choosing nothing

// The one-pass kernel (or the streamed one, where form.try_stream and it applies) on p.
template <typename T>
absl::StatusOr<TridiagonalKernel> LaunchOnChip(const TridiagonalProblem<T>& p, T* x,
                                               uint8_t* flags, const OnChipForm& form,
                                               cudaStream_t stream);
// The streamed kernel on the interleaved layout, 16 rows a thread; false (nothing launched)
// where it does not apply.
template <typename T>
absl::StatusOr<bool> LaunchStreamInterleaved16(const TridiagonalProblem<T>& p, T* x,
                                               uint8_t* flags, int min_threads,
                                               cudaStream_t stream);
// Flat p by the overlapping windows of `plan`. Returns false where they do not apply, or where
// a window failed its dominance check or met a vanishing pivot: x is then partly written and
// the caller solves p by the exact path. Waits for the kernel.
template <typename T>
absl::StatusOr<bool> SolveWindowed(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                   const WindowPlan& plan, cudaStream_t stream);
// The cluster kernel in shape c (c.Q > 1).
template <typename T>
absl::Status LaunchCluster(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                           const ClusterShape& c, cudaStream_t stream);
// n too large for one block: each chunk of level_chunk (8 or 16) rows reduced to 2 rows in
// global memory, that system solved by SolvePartitioned (recursively), then each chunk
// substituted back. arena: the level above's scratch (nullptr at the top, which then waits).
template <typename T>
absl::Status SolveTwoPass(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                          cudaStream_t stream, Scratch* arena, int level_chunk, bool direct);
// cuThomasBatch (waits: its scratch goes back to the pool) and the PCR notes' kernel.
template <typename T>
absl::Status LaunchThomas(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                          cudaStream_t stream);
template <typename T>
absl::Status LaunchPcr(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                       cudaStream_t stream);

// ---- the dispatch (dispatch.cc)

// The partitioned solve of p: the first of the partitioned kernels that the shape and the
// tuning pick and that runs it (windows, the streamed rows, the streamed interleaved kernel,
// the cluster kernel, one block, else the two-pass path). top: the problem asked for (the
// benchmark's two_pass applies to it), not a reduced system. arena: the scratch of the level
// above (nullptr at the top). Returns the kernel that solved p (its first level, for the
// two-pass path).
template <typename T>
absl::StatusOr<TridiagonalKernel> SolvePartitioned(const TridiagonalProblem<T>& p, T* x,
                                                   uint8_t* flags, Pool& pool,
                                                   cudaStream_t stream, bool top = true,
                                                   Scratch* arena = nullptr);

}  // namespace tridiagonal
}  // namespace trisolve::cuda
