// The tridiagonal family's drivers: each launches the kernel it is given (partitioned_*.cuh,
// thomas_pcr_kernels.cuh) with the launch shape it is given, choosing nothing; dispatch.cc
// decides which and how.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "runtime/check.h"
#include "runtime/launch.h"
#include "common/numerics.cuh"
#include "tridiagonal/partitioned.cuh"
#include "runtime/pinned_word.h"
#include "tridiagonal/internal.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/windows.h"
#include "tridiagonal/partitioned_kernels.cuh"
#include "tridiagonal/partitioned_stream_kernel.cuh"
#include "tridiagonal/thomas_pcr_kernels.cuh"

namespace trisolve::cuda {
namespace tridiagonal {
namespace {

// Whether a flat system's rows are whole 16-byte words: n a multiple of 16 / sizeof(T) and
// every array (x included) 16-byte aligned -- the direct and streamed kernels' vector loads.
template <typename T>
bool Rows16(const TridiagonalProblem<T>& p, const T* x) {
  bool ok = p.n % (16 / int64_t(sizeof(T))) == 0;
  for (const void* q : {static_cast<const void*>(p.a), static_cast<const void*>(p.b),
                        static_cast<const void*>(p.c), static_cast<const void*>(p.d),
                        static_cast<const void*>(x)})
    ok &= reinterpret_cast<uintptr_t>(q) % 16 == 0;
  return ok;
}

template <int M, typename T>
absl::Status LaunchOnChipM(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, int min_threads,
                           bool flat_direct, cudaStream_t stream) {
  const int P = NextPow2((p.n + M - 1) / M);
  const int threads = std::max(P, std::min(min_threads, MaxThreadsOnChip(M)));
  const int S = threads / P;
  const int64_t blocks = (p.batch + S - 1) / S;
  const bool inter = p.layout == Layout::kInterleaved;
  const bool direct = !inter && flat_direct;
  const size_t smem = sizeof(T) * (size_t(4) * S * 2 * P +
                                   (inter || direct ? 0 : size_t(4) * S * P * (M + 1)));
  // 16-byte loads and stores of the direct flat path: n a multiple of 16 bytes' worth, every
  // array aligned.
  const bool vec = Rows16(p, x);
  auto kernel = inter    ? PartitionedOnChipKernel<M, T, true, false>
                : direct ? PartitionedOnChipKernel<M, T, false, false, true>
                         : PartitionedOnChipKernel<M, T, false, false>;
  if constexpr (sizeof(T) == 4) {  // the reduced PCR's form (kernel comment)
    if (inter || p.n > 64)
      kernel = inter    ? PartitionedOnChipKernel<M, T, true, true>
               : direct ? PartitionedOnChipKernel<M, T, false, true, true>
                        : PartitionedOnChipKernel<M, T, false, true>;
  }
  if (auto st = AllowSharedBytes(kernel, smem); !st.ok()) return st;
  kernel<<<dim3(unsigned(blocks)), threads, smem, stream>>>(p, x, flags, P, S, vec);
  return CudaStatus(cudaGetLastError(), "PartitionedOnChipKernel launch");
}


// Launches a persistent streamed kernel over `groups` groups: as many blocks as the device holds
// at once, at most one a group. Returns false (nothing launched) where not one block fits.
template <typename... Params, typename... Args>
absl::StatusOr<bool> LaunchPersistent(void (*kernel)(Params...), int threads, size_t smem,
                                      int64_t groups, cudaStream_t stream, Args... args) {
  LaunchConfig launch(0, threads, smem, stream);
  auto resident = ResidentGroups(kernel, launch);
  if (!resident.ok()) return resident.status();
  if (*resident < 1) return false;
  const int64_t blocks = std::min<int64_t>(groups, *resident);
  kernel<<<dim3(unsigned(blocks)), threads, smem, stream>>>(args...);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return true;
}

// The streamed one-pass kernel (PartitionedStreamKernel) for p where it applies: the flat layout,
// whole 16-byte words (n a multiple of 16 / sizeof(T), every array 16-byte aligned), a system in
// one block of at most 256 threads. Returns false (nothing launched) where it does not.
template <int M, typename T>
absl::StatusOr<bool> LaunchStreamM(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                   int min_threads, cudaStream_t stream) {
  constexpr int W = 16 / sizeof(T);
  if (p.layout != Layout::kFlat || !Rows16(p, x) || p.n > int64_t(M) * 256) return false;
  const int P = NextPow2((p.n + M - 1) / M);
  const int threads = std::max(P, std::min(min_threads, 256));
  const int S = threads / P;
  const int64_t groups = (p.batch + S - 1) / S;
  const size_t cap = (size_t(S) * p.n / W + 7) / 8 * 8;
  const size_t smem = sizeof(T) * 4 * size_t(S) * 2 * P + 16 * 4 * cap;
  if (smem > 227 * 1024) return false;
  return LaunchPersistent(PartitionedStreamKernel<M, T, false>, threads, smem, groups, stream,
                          p, x, flags, P, S, groups, Windows{});
}

// The streamed kernel on the interleaved layout (PartitionedStreamKernel<.., true>) where it
// applies: a group's row whole 16-byte words (S a multiple of 16 / sizeof(T) systems, batch too,
// a, b, c, d 16-byte aligned), a chunk whole 128-byte lines of the buffer, a system in one block
// of at most 256 threads. Returns false (nothing launched) where it does not.
template <int M, typename T>
absl::StatusOr<bool> LaunchStreamInterleavedM(const TridiagonalProblem<T>& p, T* x,
                                              uint8_t* flags, int min_threads,
                                              cudaStream_t stream) {
  constexpr int W = 16 / sizeof(T);
  if (p.layout != Layout::kInterleaved || p.batch % W != 0 || p.n > int64_t(M) * 256)
    return false;
  const T* arrays[4] = {p.a, p.b, p.c, p.d};
  for (const T* q : arrays)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  const int P = NextPow2((p.n + M - 1) / M);
  const int threads = std::max(P, std::min(min_threads, 256));
  const int S = threads / P;
  if (S % W != 0 || (M * (S / W)) % 8 != 0) return false;
  const int64_t groups = (p.batch + S - 1) / S;
  const size_t cap = (size_t(p.n) * (S / W) + 7) / 8 * 8;
  const size_t smem = sizeof(T) * 4 * size_t(S) * 2 * P + 16 * 4 * cap;
  if (smem > 227 * 1024) return false;
  return LaunchPersistent(PartitionedStreamKernel<M, T, true>, threads, smem, groups,
                          stream, p, x, flags, P, S, groups, Windows{});
}

template <int M, int K, typename T, bool kInterleaved>
absl::Status LaunchClusterMK(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                             const ClusterShape& c, bool vec, cudaStream_t stream) {
  auto kernel = PartitionedClusterKernel<M, K, T, kInterleaved>;
  const int Rb = 2 * c.Pb;
  const int Rp = Rb * c.Q + c.Pb;  // R + R / K
  const size_t smem = sizeof(T) * size_t(c.S) * (7 * Rb + 3 * Rp);
  if (smem > 48 * 1024)
    if (auto st = AllowSharedBytes(kernel, smem); !st.ok()) return st;
  const int64_t clusters = (p.batch + c.S - 1) / c.S;
  LaunchConfig launch(clusters * c.Q, c.S * c.Pb, smem, stream, c.Q);
  return CudaStatus(cudaLaunchKernelEx(&launch.cfg, kernel, p, x, flags, c.Pb, c.S, vec),
                    "PartitionedClusterKernel launch");
}

template <int M, typename T>
absl::Status LaunchClusterM(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                            const ClusterShape& c, cudaStream_t stream) {
  const bool vec = Rows16(p, x);
  const bool inter = p.layout == Layout::kInterleaved;
  switch (c.Q) {
    case 2:
      return inter ? LaunchClusterMK<M, 4, T, true>(p, x, flags, c, vec, stream)
                   : LaunchClusterMK<M, 4, T, false>(p, x, flags, c, vec, stream);
    case 4:
      return inter ? LaunchClusterMK<M, 8, T, true>(p, x, flags, c, vec, stream)
                   : LaunchClusterMK<M, 8, T, false>(p, x, flags, c, vec, stream);
    default:
      return inter ? LaunchClusterMK<M, 16, T, true>(p, x, flags, c, vec, stream)
                   : LaunchClusterMK<M, 16, T, false>(p, x, flags, c, vec, stream);
  }
}

// Bytes of Scratch that the two-pass path takes for `batch` systems of n rows, M rows a chunk,
// with every level below it (each counted as if it were two-pass: an upper bound).
template <typename T>
int64_t TwoPassScratchBytes(int64_t n, int64_t batch, int M) {
  int64_t total = 0;
  for (;;) {
    const int64_t rn = 2 * ((n + M - 1) / M);
    total += 5 * ((int64_t(sizeof(T)) * rn * batch + 255) / 256 * 256);
    if (rn >= n) return total;
    n = rn;
  }
}

// n too large for one block: each chunk of M rows reduced to 2 rows in global memory (one
// pass), that system solved (recursively), then each chunk substituted back (a second pass).
template <int M, typename T>
absl::Status SolveTwoPassM(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                           cudaStream_t stream, Scratch* arena, bool flat_direct) {
  const int64_t nch = (p.n + M - 1) / M;
  const int64_t rn = 2 * nch;
  Pool::Buffer own;
  Scratch mine;
  if (arena == nullptr) {
    auto buf = pool.Get(TwoPassScratchBytes<T>(p.n, p.batch, M));
    if (!buf.ok()) return buf.status();
    own = std::move(*buf);
    mine = Scratch{static_cast<char*>(own.get()), own.size()};
    arena = &mine;
  }
  T* ra = arena->Take<T>(rn * p.batch);
  T* rb = arena->Take<T>(rn * p.batch);
  T* rc = arena->Take<T>(rn * p.batch);
  T* rd = arena->Take<T>(rn * p.batch);
  T* xr = arena->Take<T>(rn * p.batch);
  if (xr == nullptr) return absl::InternalError("two-pass scratch too small");
  const int64_t total = p.batch * nch;
  const bool inter = p.layout == Layout::kInterleaved;
  // Flat: rows straight into registers (16-byte loads where n and the arrays allow), as the
  // one-pass kernel (t9), unless the tuning asks for the staging tile.
  const bool vec = Rows16(p, x);
  const bool direct = !inter && flat_direct;
  auto level = [&](auto kernel, int threads, const T* xin) {
    const unsigned blocks = unsigned((total + threads - 1) / threads);
    kernel<<<blocks, threads, 0, stream>>>(p, nch, ra, rb, rc, rd, xin, x, flags, vec);
    return CudaStatus(cudaGetLastError(), "PartitionedLevelKernel launch");
  };
  constexpr int kStaged = LevelThreads<M, T>(), kNoTile = LevelThreads<M, T, true>();
  absl::Status st =
      inter    ? level(PartitionedLevelKernel<M, T, true, false>, kNoTile, nullptr)
      : direct ? level(PartitionedLevelKernel<M, T, false, false, true>, kNoTile, nullptr)
               : level(PartitionedLevelKernel<M, T, false, false>, kStaged, nullptr);
  if (!st.ok()) return st;
  TridiagonalProblem<T> reduced{p.batch, rn, Layout::kFlat, ra, rb, rc, rd};
  if (auto r = SolvePartitioned(reduced, xr, flags, pool, stream, false, arena); !r.ok())
    return r.status();
  const absl::Status back =
      inter    ? level(PartitionedLevelKernel<M, T, true, true>, kNoTile, xr)
      : direct ? level(PartitionedLevelKernel<M, T, false, true, true>, kNoTile, xr)
               : level(PartitionedLevelKernel<M, T, false, true>, kStaged, xr);
  if (!back.ok()) return back;
  if (own.get() == nullptr) return absl::OkStatus();  // a level below: the top level waits
  // The scratch goes back to the pool now, but the kernels above still use it: wait for them
  // before another request can take it.
  return CudaStatus(cudaStreamSynchronize(stream), "partitioned solve");
}

}  // namespace

template <typename T>
absl::StatusOr<TridiagonalKernel> LaunchOnChip(const TridiagonalProblem<T>& p, T* x,
                                               uint8_t* flags, const OnChipForm& form,
                                               cudaStream_t stream) {
  const int chunk = form.chunk, min_threads = form.min_threads;
  const bool inter = p.layout == Layout::kInterleaved;
  if (form.try_stream) {
    const int st = form.stream_threads;
    absl::StatusOr<bool> ran =
        inter ? (chunk == 8 ? LaunchStreamInterleavedM<8>(p, x, flags, st, stream)
                            : LaunchStreamInterleavedM<16>(p, x, flags, st, stream))
              : (chunk == 8 ? LaunchStreamM<8>(p, x, flags, st, stream)
                            : LaunchStreamM<16>(p, x, flags, st, stream));
    if (!ran.ok()) return ran.status();
    if (*ran) return TridiagonalKernel::kPartitionedStream;
  }
  const bool d = form.direct;
  absl::Status st = chunk == 16  ? LaunchOnChipM<16>(p, x, flags, min_threads, d, stream)
                    : chunk == 2 ? LaunchOnChipM<2>(p, x, flags, min_threads, d, stream)
                    : chunk == 4 ? LaunchOnChipM<4>(p, x, flags, min_threads, d, stream)
                                 : LaunchOnChipM<kChunk>(p, x, flags, min_threads, d, stream);
  if (!st.ok()) return st;
  return TridiagonalKernel::kPartitioned;
}

// Solves flat p by overlapping windows (PartitionedStreamKernel<.., kWindow>) where they apply:
// n over one window (4096 rows), whole 16-byte rows (Rows16), the halo whole 128-byte lines.
// Returns false where they do not, or where a window failed its dominance check or met a
// vanishing pivot: x is then partly written and the caller solves p by the exact path. Waits
// for the kernel (its answer, whether a window failed, is needed before returning).
template <typename T>
absl::StatusOr<bool> SolveWindowed(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                   const WindowPlan& plan, cudaStream_t stream) {
  constexpr int W = 16 / sizeof(T);
  if (p.layout != Layout::kFlat || !Rows16(p, x) || plan.halo % (128 / sizeof(T)) != 0 ||
      plan.per_system < 2)
    return false;
  // The kernel sets the word's scratch where a window fails and its last block writes that into
  // the host word: no device word to clear before the launch, no copy after it.
  auto word = PinnedWord::Take();
  if (!word.ok()) return word.status();
  const Windows win{plan, WindowDominanceLimit(plan.halo, std::numeric_limits<T>::digits),
                    word->scratch(), word->mapped()};
  constexpr int P = kWindowThreads, M = kWindowChunk;
  const size_t cap = size_t(P * M / W + 7) / 8 * 8;
  const size_t smem = sizeof(T) * 4 * 2 * P + 16 * 4 * cap;
  const int64_t groups = plan.per_system * p.batch;
  if (groups >= (int64_t(1) << 31)) return false;  // WindowOf's 32-bit division
  auto kernel = PartitionedStreamKernel<M, T, false, true>;
  // The shared-memory attribute and the blocks that run at once: asked once a device.
  static PerDevice asked;
  const absl::StatusOr<int64_t> resident = asked.Get([&] {
    LaunchConfig launch(0, P, smem, nullptr);
    return ResidentGroups(kernel, launch);
  });
  if (!resident.ok()) return resident.status();
  if (*resident < 1) return false;
  kernel<<<unsigned(std::min(groups, *resident)), P, smem, stream>>>(p, x, flags, P, 1, groups,
                                                                      win);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return *static_cast<volatile int*>(word->get()) == 0;
}

template <typename T>
absl::Status LaunchCluster(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                           const ClusterShape& c, cudaStream_t stream) {
  if (c.M == 8) return LaunchClusterM<8>(p, x, flags, c, stream);
  return LaunchClusterM<16>(p, x, flags, c, stream);
}

template <typename T>
absl::StatusOr<bool> LaunchStreamInterleaved16(const TridiagonalProblem<T>& p, T* x,
                                               uint8_t* flags, int min_threads,
                                               cudaStream_t stream) {
  return LaunchStreamInterleavedM<16>(p, x, flags, min_threads, stream);
}

template <typename T>
absl::Status SolveTwoPass(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                          cudaStream_t stream, Scratch* arena, int level_chunk,
                          bool flat_direct) {
  return level_chunk == 8 ? SolveTwoPassM<8>(p, x, flags, pool, stream, arena, flat_direct)
                          : SolveTwoPassM<16>(p, x, flags, pool, stream, arena, flat_direct);
}

template <typename T>
absl::Status LaunchThomas(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                          cudaStream_t stream) {
  const bool inter = p.layout == Layout::kInterleaved;
  auto cp = pool.Get(int64_t(sizeof(T)) * p.n * p.batch);
  if (!cp.ok()) return cp.status();
  const unsigned blocks = unsigned((p.batch + kThomasThreads - 1) / kThomasThreads);
  ThomasKernel<T><<<blocks, kThomasThreads, 0, stream>>>(p, x, static_cast<T*>(cp->get()), flags,
                                                         inter);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before cp returns
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchPcr(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                       cudaStream_t stream) {
  const bool inter = p.layout == Layout::kInterleaved;
  const int d = int(p.n);
  const int per_block = std::max(1, 256 / d);
  const int threads = per_block * d;
  const size_t smem = sizeof(T) * 8 * size_t(threads);
  if (auto st = AllowSharedBytes(PcrNotesKernel<T>, smem); !st.ok()) return st;
  const unsigned blocks = unsigned((p.batch + per_block - 1) / per_block);
  PcrNotesKernel<T><<<blocks, threads, smem, stream>>>(p, x, flags, inter);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

#define TRISOLVE_INSTANTIATE_DRIVERS(T)                                                         \
  template absl::StatusOr<TridiagonalKernel> LaunchOnChip(const TridiagonalProblem<T>&, T*,     \
                                                          uint8_t*, const OnChipForm&,          \
                                                          cudaStream_t);                        \
  template absl::StatusOr<bool> LaunchStreamInterleaved16(const TridiagonalProblem<T>&, T*,     \
                                                          uint8_t*, int, cudaStream_t);         \
  template absl::StatusOr<bool> SolveWindowed(const TridiagonalProblem<T>&, T*, uint8_t*,       \
                                              const WindowPlan&, cudaStream_t);                 \
  template absl::Status LaunchCluster(const TridiagonalProblem<T>&, T*, uint8_t*,               \
                                      const ClusterShape&, cudaStream_t);                       \
  template absl::Status SolveTwoPass(const TridiagonalProblem<T>&, T*, uint8_t*, Pool&,         \
                                     cudaStream_t, Scratch*, int, bool);                        \
  template absl::Status LaunchThomas(const TridiagonalProblem<T>&, T*, uint8_t*, Pool&,         \
                                     cudaStream_t);                                             \
  template absl::Status LaunchPcr(const TridiagonalProblem<T>&, T*, uint8_t*, cudaStream_t);
TRISOLVE_INSTANTIATE_DRIVERS(double)
TRISOLVE_INSTANTIATE_DRIVERS(float)
#undef TRISOLVE_INSTANTIATE_DRIVERS

}  // namespace tridiagonal

bool ClustersAvailable() {
  static const bool yes = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return yes;
}

}  // namespace trisolve::cuda
