// Batched tridiagonal kernels: partitioned modified Thomas + PCR, cuThomasBatch, block PCR.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "check.h"
#include "numerics.cuh"
#include "partitioned.cuh"
#include "tridiagonal_cuda.h"

namespace trisolve::cuda {
namespace {

// ---- launch parameters, next to the kernels they tune ---------------------------------------
constexpr int kChunk = 8;            // rows per thread (registers: ~4 * kChunk values)
constexpr int kMaxThreadsOnChip = 512;
// Threads a block of the one-pass kernel at most: 16 rows a thread need 255 registers.
constexpr int MaxThreadsOnChip(int chunk) { return chunk >= 16 ? 256 : kMaxThreadsOnChip; }
constexpr int kStreamThreads = 128;  // reduce/back kernels of the multi-level path
constexpr int kThomasThreads = 128;

// Element k of system s in a layout.
__device__ __forceinline__ int64_t At(bool interleaved, int64_t batch, int64_t n, int64_t s,
                                      int64_t k) {
  return interleaved ? k * batch + s : s * n + k;
}

// Loads chunk rows k = j*M + i (i < M) of system s into registers; rows past n are identity
// rows, a[0] and c[n-1] are zeroed (unused by definition). Interleaved layout: direct loads
// (consecutive threads = consecutive systems = consecutive words).
template <int M, typename T>
__device__ __forceinline__ void LoadChunkInterleaved(const TridiagonalProblem<T>& p, int64_t s,
                                                     int64_t j, T (&a)[M], T (&b)[M], T (&c)[M],
                                                     T (&d)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int64_t k = j * M + i;
    if (k < p.n && s < p.batch) {
      const int64_t e = k * p.batch + s;
      a[i] = k > 0 ? __ldg(p.a + e) : T(0);
      b[i] = __ldg(p.b + e);
      c[i] = k + 1 < p.n ? __ldg(p.c + e) : T(0);
      d[i] = __ldg(p.d + e);
    } else {
      a[i] = T(0);
      b[i] = T(1);
      c[i] = T(0);
      d[i] = T(0);
    }
  }
}

// Flat layout without the staging tile (t9): a thread's M consecutive rows of system s straight
// from global memory (LoadRowsDirect). Rows past n, or of no system, are identity rows; a[0] and
// c[n-1] are zeroed.
template <int M, typename T>
__device__ __forceinline__ void LoadChunkFlatDirect(const TridiagonalProblem<T>& p, int64_t s,
                                                    int64_t j, bool vec, T (&a)[M], T (&b)[M],
                                                    T (&c)[M], T (&d)[M]) {
  const int64_t o = s < p.batch ? s * p.n : 0, n = s < p.batch ? p.n : 0;
  LoadChunkDirect<M>(p.a + o, p.b + o, p.c + o, p.d + o, j * M, n, vec, a, b, c, d);
}

// ---- one pass: whole systems in one block -------------------------------------------------
// Block = S systems x P threads (P a power of two, P * M >= n). Flat layout: thread
// tid = s_local * P + j; interleaved: tid = j * S + s_local (systems fastest, coalesced); the
// reduced rows placed by ReducedIndex (partitioned.cuh).
template <int M, typename T, bool kInterleaved, bool kLazyPcr, bool kDirect = false>
__global__ void __launch_bounds__(MaxThreadsOnChip(M))
    PartitionedOnChipKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags, int P,
                            int S, bool vec) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int R = 2 * P;  // reduced rows per system
  const int nthreads = S * P;
  T* sa = smem;  // S * R each
  T* sb = sa + S * R;
  T* sc = sb + S * R;
  T* sd = sc + S * R;
  T* tile = sd + S * R;  // flat staging: 4 arrays of S * P * (M + 1)
  static_assert((M & (M - 1)) == 0, "M a power of two");
  __shared__ int bad[kMaxThreadsOnChip];

  const int tid = threadIdx.x;
  const int sl = kInterleaved ? tid % S : tid / P;
  const int j = kInterleaved ? tid / S : tid % P;
  const int64_t s0 = int64_t(blockIdx.x) * S;
  const int64_t s = s0 + sl;
  if (tid < S) bad[tid] = 0;

  T a[M], b[M], c[M], d[M];
  // The block's systems are contiguous in the flat layout: element e of the block is element
  // k = e % n of system e / n, and sits at chunk k / M, row k % M of that system's threads.
  const int64_t live_elems = std::min<int64_t>(S, p.batch - s0) * p.n;
  auto where = [&](int e, int64_t& g, int& pos) {
    if (e >= live_elems) return false;
    const int es = int(e / p.n);
    const int k = e - es * int(p.n);
    g = s0 * p.n + e;
    pos = es * P * (M + 1) + k + k / M;
    return true;
  };
  const int tsz = nthreads * (M + 1);
  if (kInterleaved) {
    LoadChunkInterleaved<M>(p, s, j, a, b, c, d);
  } else if (kDirect) {
    LoadChunkFlatDirect<M>(p, s, j, vec, a, b, c, d);
  } else {
    StageFlat4<M>(p, tile, tsz, nthreads, where);
    __syncthreads();
    ReadChunkFromTile<M>(tile, tsz, s < p.batch ? s : -1, j, p.n, a, b, c, d);
  }
  bool ok = ChunkReduce<M>(a, b, c, d);
  // kLazyPcr (LaunchOnChipM picks; H100, NOTES.md t6b): reading the neighbours only when
  // present is 1.3-1.45x faster in float32 at n = 256-4096, 5-9% slower in float32 flat
  // n <= 64 and 2-6% slower in float64.
  T x0, xl;
  ok &= SolveReduced<kInterleaved, kLazyPcr>(sa, sb, sc, sd, sl, j, P, S, a[0], c[0], d[0],
                                             a[M - 1], c[M - 1], d[M - 1], x0, xl);
  ChunkBack<M>(a, c, d, x0, xl);
#pragma unroll
  for (int i = 0; i < M; ++i) ok &= Finite(d[i]);
  if (!ok) atomicOr(&bad[sl], 1);
  if (kInterleaved) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const int64_t k = int64_t(j) * M + i;
      if (k < p.n && s < p.batch) x[k * p.batch + s] = d[i];
    }
    __syncthreads();
  } else if (kDirect) {
    if (s < p.batch) StoreRowsDirect<M>(x + s * p.n, int64_t(j) * M, p.n, vec, d);
    __syncthreads();
  } else {
    StoreFlat<M>(x, tile, nthreads, where, d);
  }
  if (tid < S && s0 + tid < p.batch && bad[tid]) flags[s0 + tid] = 1;
}

// ---- multi-level: reduce to 2 rows per chunk in global memory, then substitute back ----------
// Chunk g of the problem: flat (s, j) = (g / nch, g % nch); interleaved (j, s) = (g / batch,
// g % batch). The reduced system is flat: system s, rows 2j and 2j+1 of 2 * nch.
// Threads a block of the level kernels: the staging tile (4 arrays of M + 1 values a thread)
// must stay under the 48 KB of static shared memory.
template <int M, typename T>
constexpr int LevelThreads() {
  return M * sizeof(T) > 64 ? kStreamThreads / 2 : kStreamThreads;
}

template <int M, typename T, bool kInterleaved, bool kBack>
__global__ void __launch_bounds__(LevelThreads<M, T>())
    PartitionedLevelKernel(TridiagonalProblem<T> p, int64_t nch, T* __restrict__ ra,
                           T* __restrict__ rb, T* __restrict__ rc, T* __restrict__ rd,
                           const T* __restrict__ xr, T* __restrict__ x, uint8_t* flags) {
  constexpr int kThreads = LevelThreads<M, T>();
  constexpr int tsz = kThreads * (M + 1);
  __shared__ T tile[4 * tsz];
  const int64_t total = p.batch * nch;
  const int64_t g0 = int64_t(blockIdx.x) * blockDim.x;
  const int64_t g = g0 + threadIdx.x;
  auto decode = [&](int64_t gg, int64_t& s, int64_t& j) {
    if (gg >= total) {
      s = -1;
      j = 0;
    } else if (kInterleaved) {
      j = gg / p.batch;
      s = gg - j * p.batch;
    } else {
      s = gg / nch;
      j = gg - s * nch;
    }
  };
  int64_t s, j;
  decode(g, s, j);
  T a[M], b[M], c[M], d[M];
  // Flat: element e of the block is row e % M of the block's chunk e / M.
  auto where = [&](int e, int64_t& gi, int& pos) {
    const int cidx = e / M, i = e - cidx * M;
    int64_t cs, cj;
    decode(g0 + cidx, cs, cj);
    const int64_t k = cj * M + i;
    if (cs < 0 || k >= p.n) return false;
    gi = cs * p.n + k;
    pos = cidx * (M + 1) + i;
    return true;
  };
  if (kInterleaved) {
    LoadChunkInterleaved<M>(p, s < 0 ? p.batch : s, j, a, b, c, d);
  } else {
    StageFlat4<M>(p, tile, tsz, kThreads, where);
    __syncthreads();
    ReadChunkFromTile<M>(tile, tsz, s, j, p.n, a, b, c, d);
    __syncthreads();
  }
  const bool ok = ChunkReduce<M>(a, b, c, d);
  const int64_t rn = 2 * nch;
  if (!kBack) {
    if (s >= 0) {
      const int64_t r = s * rn + 2 * j;
      ra[r] = a[0];
      rb[r] = T(1);
      rc[r] = c[0];
      rd[r] = d[0];
      ra[r + 1] = a[M - 1];
      rb[r + 1] = T(1);
      rc[r + 1] = c[M - 1];
      rd[r + 1] = d[M - 1];
      if (!ok) flags[s] = 1;
    }
  } else {
    T x0 = T(0), xl = T(0);
    if (s >= 0) {
      x0 = xr[s * rn + 2 * j];
      xl = xr[s * rn + 2 * j + 1];
    }
    ChunkBack<M>(a, c, d, x0, xl);
    bool finite = true;
#pragma unroll
    for (int i = 0; i < M; ++i) finite &= Finite(d[i]);
    if (s >= 0 && !finite) flags[s] = 1;
    if (kInterleaved) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int64_t k = j * M + i;
        if (s >= 0 && k < p.n) x[k * p.batch + s] = d[i];
      }
    } else {
      StoreFlat<M>(x, tile, kThreads, where, d);
    }
  }
}

// ---- cuThomasBatch: one thread per system ------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThomasThreads)
    ThomasKernel(TridiagonalProblem<T> p, T* __restrict__ x, T* __restrict__ cp, uint8_t* flags,
                 bool interleaved) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= p.batch) return;
  const int64_t st = interleaved ? p.batch : 1;
  const int64_t off = interleaved ? s : s * p.n;
  const T* a = p.a + off;
  const T* b = p.b + off;
  const T* c = p.c + off;
  const T* d = p.d + off;
  T* xs = x + off;
  T* cs = cp + off;
  bool ok = !Vanishes(b[0], fabs(b[0]));
  T inv = T(1) / b[0];
  T cprev = p.n > 1 ? c[0] * inv : T(0);
  T dprev = d[0] * inv;
  cs[0] = cprev;
  xs[0] = dprev;
  for (int64_t k = 1; k < p.n; ++k) {
    const T ak = a[k * st];
    const T t = ak * cprev;
    const T piv = b[k * st] - t;
    ok &= !Vanishes(piv, fabs(b[k * st]) + fabs(t));
    inv = T(1) / piv;
    cprev = k + 1 < p.n ? c[k * st] * inv : T(0);
    dprev = (d[k * st] - ak * dprev) * inv;
    cs[k * st] = cprev;
    xs[k * st] = dprev;
  }
  T xn = dprev;
  ok &= Finite(xn);
  for (int64_t k = p.n - 2; k >= 0; --k) {
    xn = xs[k * st] - cs[k * st] * xn;
    ok &= Finite(xn);
    xs[k * st] = xn;
  }
  if (!ok) flags[s] = 1;
}

// ---- the PCR notes' kernel: one thread per row, blockDim / d systems per block ------------
template <typename T>
__global__ void PcrNotesKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags,
                               bool interleaved) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sm = reinterpret_cast<T*>(smem_raw);
  const int d = int(p.n);
  const int per_block = blockDim.x / d;
  const int tidx = threadIdx.x % d;                       // the row
  const int Qt = (threadIdx.x - tidx) / d;                // the system within the block
  const int64_t gbx = Qt + int64_t(blockIdx.x) * per_block;  // the system
  const bool live = Qt < per_block && gbx < p.batch;
  T* A = sm + 8 * d * Qt;  // two buffers of a, b, c, d per system
  T* B = A + d;
  T* C = B + d;
  T* D = C + d;
  T* A2 = D + d;
  T* B2 = A2 + d;
  T* C2 = B2 + d;
  T* D2 = C2 + d;
  bool ok = true;
  if (live) {
    const int64_t e = At(interleaved, p.batch, p.n, gbx, tidx);
    A[tidx] = tidx > 0 ? p.a[e] : T(0);
    B[tidx] = p.b[e];
    C[tidx] = tidx + 1 < d ? p.c[e] : T(0);
    D[tidx] = p.d[e];
  }
  __syncthreads();
  for (int stride = 1; stride < d; stride *= 2) {
    if (live) {
      // The neighbours read only when present: reading them always cost this kernel 20% (H100,
      // n = 32).
      const int il = tidx - stride, ir = tidx + stride;
      T an, bn, cn, dn;
      ok &= PcrCombine<true>(A, B, C, D, tidx, il >= 0, il, ir < d, ir, [](int r) { return r; },
                             an, bn, cn, dn);
      A2[tidx] = an;
      B2[tidx] = bn;
      C2[tidx] = cn;
      D2[tidx] = dn;
    }
    __syncthreads();
    T* t;
    t = A; A = A2; A2 = t;
    t = B; B = B2; B2 = t;
    t = C; C = C2; C2 = t;
    t = D; D = D2; D2 = t;
  }
  if (live) {
    const T xv = D[tidx] / B[tidx];
    ok &= !Vanishes(B[tidx], fabs(B[tidx])) && Finite(xv);
    x[At(interleaved, p.batch, p.n, gbx, tidx)] = xv;
    if (!ok) flags[gbx] = 1;
  }
}

PartitionedTuning g_tuning;

int NextPow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Whether the flat one-pass kernel loads its rows directly (no staging tile): the tuning's, or
// always (0). Measured on the H100 (t9): direct beat staged at every n, chunk and block size,
// 13-45% (float64 n = 32 0.315 -> 0.249 ms, float32 0.187 -> 0.118 ms).
inline bool FlatDirect() { return g_tuning.flat_direct >= 0; }

template <int M, typename T>
absl::Status LaunchOnChipM(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, int min_threads,
                           cudaStream_t stream) {
  const int P = NextPow2((p.n + M - 1) / M);
  const int threads = std::max(P, std::min(min_threads, MaxThreadsOnChip(M)));
  const int S = threads / P;
  const int64_t blocks = (p.batch + S - 1) / S;
  const bool inter = p.layout == Layout::kInterleaved;
  const bool direct = !inter && FlatDirect();
  const size_t smem = sizeof(T) * (size_t(4) * S * 2 * P +
                                   (inter || direct ? 0 : size_t(4) * S * P * (M + 1)));
  // 16-byte loads and stores of the direct flat path: n a multiple of 16 bytes' worth, every
  // array aligned.
  constexpr int W = 16 / sizeof(T);
  bool vec = p.n % W == 0;
  for (const void* q : {static_cast<const void*>(p.a), static_cast<const void*>(p.b),
                        static_cast<const void*>(p.c), static_cast<const void*>(p.d),
                        static_cast<const void*>(x)})
    vec &= reinterpret_cast<uintptr_t>(q) % 16 == 0;
  auto kernel = inter    ? PartitionedOnChipKernel<M, T, true, false>
                : direct ? PartitionedOnChipKernel<M, T, false, false, true>
                         : PartitionedOnChipKernel<M, T, false, false>;
  if constexpr (sizeof(T) == 4) {  // the reduced PCR's form (kernel comment)
    if (inter || p.n > 64)
      kernel = inter    ? PartitionedOnChipKernel<M, T, true, true>
               : direct ? PartitionedOnChipKernel<M, T, false, true, true>
                        : PartitionedOnChipKernel<M, T, false, true>;
  }
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<dim3(unsigned(blocks)), threads, smem, stream>>>(p, x, flags, P, S, vec);
  return CudaStatus(cudaGetLastError(), "PartitionedOnChipKernel launch");
}

// Whether one block can hold whole systems of this size.
// Rows a thread of the one-pass kernel: the tuning's, or by shape (0). Measured on the H100
// (bench_tridiagonal --tune): interleaved float64, 16 rows a thread beat 8 for n = 4096 (-11%)
// and n = 256 (-10%), 8 won n <= 128 and n = 1024 (results/tune-h100-2026-11-22-chunk16.log);
// flat with direct loads, 16 wins above n = 256 in float64 (1024: 0.345 -> 0.325 ms; up to 256
// 8 rows in 64-thread blocks win, results/tune-h100-2026-11-22-threads64.log) and from n = 64
// in float32 (128: 0.153 -> 0.127 ms; results/tune-h100-2026-11-22-flat-direct.log).
// Interleaved float32: 16 from n = 128 (128: 0.218 -> 0.156 ms, 1024: 0.358 -> 0.330, with 256
// threads a block above n = 128; results/tune-h100-2026-11-22-float32-interleaved.log).
template <typename T>
int OnChipChunk(int64_t n, Layout layout) {
  if (g_tuning.chunk > 0) return g_tuning.chunk;
  if (layout == Layout::kFlat) return n > (sizeof(T) == 8 ? 256 : 32) ? 16 : kChunk;
  if (sizeof(T) != 8) return n > 64 ? 16 : kChunk;
  if (n > 2048) return 16;
  if (n > 128 && n <= 512) return 16;
  return kChunk;
}

template <typename T>
bool FitsOnChip(int64_t n) {
  const int chunk = g_tuning.chunk > 0 ? g_tuning.chunk : kChunk;
  return n <= int64_t(chunk) * MaxThreadsOnChip(chunk);
}

template <typename T>
absl::Status LaunchOnChip(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                          cudaStream_t stream) {
  // Measured on the H100 (tests/bench/results): small blocks pack more systems per SM for the
  // flat layout and small n; interleaved systems above n = 128 want wider blocks (more systems
  // per warp-load).
  const int chunk = OnChipChunk<T>(p.n, p.layout);
  const bool inter = p.layout == Layout::kInterleaved;
  // Flat blocks of 64 threads where --tune measured them faster (t11: float64 from n = 64, n = 256
  // 0.294 -> 0.274 ms, 1024 0.322 -> 0.298; float32 from n = 128, 1024 0.158 -> 0.149). Above
  // n = 1024 a system's threads fill 128 or more anyway.
  const bool flat64 = !inter && p.n >= (sizeof(T) == 8 ? 64 : 128);
  const int auto_threads = flat64         ? 64
                           : chunk == 16  ? (sizeof(T) == 4 && inter && p.n > 128 ? 256 : 128)
                           : inter && p.n > 128 ? 512
                                                : 128;
  const int min_threads = std::min(
      std::max(g_tuning.min_threads > 0 ? g_tuning.min_threads : auto_threads, 32),
      kMaxThreadsOnChip);
  if (chunk == 16) return LaunchOnChipM<16>(p, x, flags, min_threads, stream);
  if (chunk == 2) return LaunchOnChipM<2>(p, x, flags, min_threads, stream);
  if (chunk == 4) return LaunchOnChipM<4>(p, x, flags, min_threads, stream);
  return LaunchOnChipM<kChunk>(p, x, flags, min_threads, stream);
}

template <typename T>
absl::Status SolvePartitioned(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                              cudaStream_t stream);

// n too large for one block: each chunk of M rows reduced to 2 rows in global memory (one
// pass), that system solved (recursively), then each chunk substituted back (a second pass).
template <int M, typename T>
absl::Status SolveTwoPass(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                          cudaStream_t stream) {
  constexpr int kThreads = LevelThreads<M, T>();
  const int64_t nch = (p.n + M - 1) / M;
  const int64_t rn = 2 * nch;
  auto buf = pool.Get(int64_t(sizeof(T)) * 5 * rn * p.batch);
  if (!buf.ok()) return buf.status();
  T* ra = static_cast<T*>(buf->get());
  T* rb = ra + rn * p.batch;
  T* rc = rb + rn * p.batch;
  T* rd = rc + rn * p.batch;
  T* xr = rd + rn * p.batch;
  const int64_t total = p.batch * nch;
  const unsigned blocks = unsigned((total + kThreads - 1) / kThreads);
  const bool inter = p.layout == Layout::kInterleaved;
  if (inter)
    PartitionedLevelKernel<M, T, true, false><<<blocks, kThreads, 0, stream>>>(
        p, nch, ra, rb, rc, rd, nullptr, x, flags);
  else
    PartitionedLevelKernel<M, T, false, false><<<blocks, kThreads, 0, stream>>>(
        p, nch, ra, rb, rc, rd, nullptr, x, flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TridiagonalProblem<T> reduced{p.batch, rn, Layout::kFlat, ra, rb, rc, rd};
  if (auto st = SolvePartitioned(reduced, xr, flags, pool, stream); !st.ok()) return st;
  if (inter)
    PartitionedLevelKernel<M, T, true, true><<<blocks, kThreads, 0, stream>>>(
        p, nch, nullptr, nullptr, nullptr, nullptr, xr, x, flags);
  else
    PartitionedLevelKernel<M, T, false, true><<<blocks, kThreads, 0, stream>>>(
        p, nch, nullptr, nullptr, nullptr, nullptr, xr, x, flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // The scratch goes back to the pool now, but the kernels above still use it: wait for them
  // before another request can take it.
  return CudaStatus(cudaStreamSynchronize(stream), "partitioned solve");
}

template <typename T>
absl::Status SolvePartitioned(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, Pool& pool,
                              cudaStream_t stream) {
  if (FitsOnChip<T>(p.n)) return LaunchOnChip(p, x, flags, stream);
  if (g_tuning.level_chunk == 8) return SolveTwoPass<8>(p, x, flags, pool, stream);
  return SolveTwoPass<16>(p, x, flags, pool, stream);
}

}  // namespace

void SetPartitionedTuning(const PartitionedTuning& t) { g_tuning = t; }
PartitionedTuning GetPartitionedTuning() { return g_tuning; }

const char* KernelName(TridiagonalKernel k) {
  switch (k) {
    case TridiagonalKernel::kPartitioned: return "partitioned";
    case TridiagonalKernel::kThomas: return "thomas";
    case TridiagonalKernel::kPcr: return "pcr";
  }
  return "?";
}

TridiagonalKernel ChooseTridiagonalKernel(TridiagonalMethod m, int64_t n, int64_t, Layout,
                                          bool) {
  switch (m) {
    case TridiagonalMethod::kThomas: return TridiagonalKernel::kThomas;
    case TridiagonalMethod::kPcr:
      return n <= 1024 ? TridiagonalKernel::kPcr : TridiagonalKernel::kPartitioned;
    default: return TridiagonalKernel::kPartitioned;
  }
}

template <typename T>
absl::StatusOr<TridiagonalKernel> SolveTridiagonalDevice(const TridiagonalProblem<T>& p_in,
                                                         TridiagonalMethod method, T* x,
                                                         uint8_t* flags, Pool& pool,
                                                         cudaStream_t stream) {
  // One system is laid out the same way in both layouts (k * 1 + 0 = 0 * n + k): solve it as
  // flat, whose kernels read a system's rows coalesced.
  TridiagonalProblem<T> p = p_in;
  if (p.batch == 1) p.layout = Layout::kFlat;
  const TridiagonalKernel k =
      ChooseTridiagonalKernel(method, p.n, p.batch, p.layout, sizeof(T) == 4);
  const bool inter = p.layout == Layout::kInterleaved;
  switch (k) {
    case TridiagonalKernel::kPartitioned:
      if (auto st = SolvePartitioned(p, x, flags, pool, stream); !st.ok()) return st;
      break;
    case TridiagonalKernel::kThomas: {
      auto cp = pool.Get(int64_t(sizeof(T)) * p.n * p.batch);
      if (!cp.ok()) return cp.status();
      const unsigned blocks = unsigned((p.batch + kThomasThreads - 1) / kThomasThreads);
      ThomasKernel<T><<<blocks, kThomasThreads, 0, stream>>>(p, x, static_cast<T*>(cp->get()), flags, inter);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before cp returns
      break;
    }
    case TridiagonalKernel::kPcr: {
      const int d = int(p.n);
      const int per_block = std::max(1, 256 / d);
      const int threads = per_block * d;
      const size_t smem = sizeof(T) * 8 * size_t(threads);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          PcrNotesKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      const unsigned blocks = unsigned((p.batch + per_block - 1) / per_block);
      PcrNotesKernel<T><<<blocks, threads, smem, stream>>>(p, x, flags, inter);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      break;
    }
  }
  return k;
}

template absl::StatusOr<TridiagonalKernel> SolveTridiagonalDevice(
    const TridiagonalProblem<double>&, TridiagonalMethod, double*, uint8_t*, Pool&, cudaStream_t);
template absl::StatusOr<TridiagonalKernel> SolveTridiagonalDevice(
    const TridiagonalProblem<float>&, TridiagonalMethod, float*, uint8_t*, Pool&, cudaStream_t);

}  // namespace trisolve::cuda
