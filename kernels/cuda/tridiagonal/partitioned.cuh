// The partitioned tridiagonal solve's device parts, shared by the batched tridiagonal kernels
// (partitioned_kernels.cuh) and the fused sweeps (row_sweep_kernels.cuh, row_stream_kernel.cuh):
// each thread reduces M consecutive rows in registers to two (modified Thomas), the reduced
// system of a block is solved by PCR in shared memory, and each thread substitutes back.
#pragma once

#include <cstdint>

#include "common/numerics.cuh"
#include "tridiagonal/flags.h"
#include "trisolve/tridiagonal.h"

namespace trisolve::cuda {

// Whether every row of a chunk is diagonally dominant by kDominanceRatio (flags.h),
// |a| + |c| <= kDominanceRatio |b|, a NaN or an infinity counting as not: an add, a multiply and
// a compare a row, the absolute values operand modifiers and the predicate ANDed in the
// compare. The loaders zero a[0] and c[n - 1] and make rows past n identity rows, which pass.
template <int M, typename T>
__device__ __forceinline__ bool ChunkDominant(const T (&a)[M], const T (&b)[M], const T (&c)[M]) {
  bool dominant = true;
#pragma unroll
  for (int i = 0; i < M; ++i)
    dominant &= fabs(a[i]) + fabs(c[i]) <= T(kDominanceRatio) * fabs(b[i]);
  return dominant;
}

// flags[s] |= v where several threads of one launch may flag system s with different bits (the
// level kernels: a thread a chunk): an atomic OR on the aligned word holding the byte, skipped
// where the bits are seen set already (a system not dominant in every chunk costs a few
// atomics, not one a chunk). Nothing on good data. The flags lie in pooled or cudaMalloc'ed
// buffers (256-byte granules): the word never leaves the allocation.
__device__ __forceinline__ void FlagOr(uint8_t* flags, int64_t s, unsigned v) {
  if ((flags[s] & v) == v) return;  // (a stale read only costs the atomic below)
  const auto at = reinterpret_cast<uintptr_t>(flags + s);
  atomicOr(reinterpret_cast<unsigned*>(at & ~uintptr_t(3)), v << (8 * (at & 3)));
}

// The modified Thomas reduction of one chunk of M rows (Laszlo, Giles & Appleyard 2016).
// On entry row i reads a[i] x[i-1] + b[i] x[i] + c[i] x[i+1] = d[i]. On exit
//   row 0:      a[0] x[-1] + x[0] + c[0] x[M-1] = d[0]
//   row M-1:    a[M-1] x[0] + x[M-1] + c[M-1] x[M] = d[M-1]
//   rows 1..M-2: x[i] = d[i] - a[i] x[0] - c[i] x[M-1]
// where x[-1] and x[M] belong to the neighbouring chunks. Returns false if a pivot vanished.
template <int M, typename T>
__device__ __forceinline__ bool ChunkReduce(T (&a)[M], const T (&b)[M], T (&c)[M], T (&d)[M]) {
  static_assert(M >= 2, "a chunk needs two rows");
  bool ok = true;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    ok &= !Vanishes(b[i], fabs(b[i]));
    const T r = Rcp(b[i]);
    a[i] *= r;
    c[i] *= r;
    d[i] *= r;
  }
#pragma unroll
  for (int i = 2; i < M; ++i) {
    const T t = a[i] * c[i - 1];
    const T piv = b[i] - t;
    ok &= !Vanishes(piv, fabs(b[i]) + fabs(t));
    const T r = Rcp(piv);
    d[i] = r * (d[i] - a[i] * d[i - 1]);
    a[i] = -r * a[i] * a[i - 1];
    c[i] = r * c[i];
  }
#pragma unroll
  for (int i = M - 3; i >= 1; --i) {
    d[i] -= c[i] * d[i + 1];
    a[i] -= c[i] * a[i + 1];
    c[i] = -c[i] * c[i + 1];
  }
  if (M >= 3) {
    const T t = c[0] * a[1];
    const T piv = T(1) - t;
    ok &= !Vanishes(piv, T(1) + fabs(t));
    const T r = Rcp(piv);
    d[0] = r * (d[0] - c[0] * d[1]);
    a[0] = r * a[0];
    c[0] = -r * c[0] * c[1];
  }
  return ok;
}

template <int M, typename T>
__device__ __forceinline__ void ChunkBack(const T (&a)[M], const T (&c)[M], T (&d)[M], T x0,
                                          T xl) {
  d[0] = x0;
  d[M - 1] = xl;
#pragma unroll
  for (int i = 1; i < M - 1; ++i) d[i] = d[i] - a[i] * x0 - c[i] * xl;
}

// Reads this thread's chunk (rows j*M .. j*M+M-1 of system s) from the staged tiles; rows past
// n, or of no system (s < 0), are identity rows; a[0] and c[n-1] are zeroed.
template <int M, typename T>
__device__ __forceinline__ void ReadChunkFromTile(const T* tile, int tsz, int64_t s, int64_t j,
                                                  int64_t n, T (&a)[M], T (&b)[M], T (&c)[M],
                                                  T (&d)[M]) {
  const int base = threadIdx.x * (M + 1);
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int64_t k = j * M + i;
    if (s >= 0 && k < n) {
      a[i] = k > 0 ? tile[base + i] : T(0);
      b[i] = tile[tsz + base + i];
      c[i] = k + 1 < n ? tile[2 * tsz + base + i] : T(0);
      d[i] = tile[3 * tsz + base + i];
    } else {
      a[i] = T(0);
      b[i] = T(1);
      c[i] = T(0);
      d[i] = T(0);
    }
  }
}

template <int M, typename T, typename Where>
__device__ __forceinline__ void StoreFlat(T* __restrict__ x, T* tile, int nthreads, Where where,
                                          const T (&v)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) tile[threadIdx.x * (M + 1) + i] = v[i];
  __syncthreads();
#pragma unroll
  for (int q = 0; q < M; ++q) {
    int64_t g;
    int pos;
    if (where(threadIdx.x + q * nthreads, g, pos)) x[g] = tile[pos];
  }
  __syncthreads();
}

// Rows k0 .. k0+M-1 of a row-contiguous array straight from global memory into registers,
// `pad` past n. 16-byte loads where `vec` (the caller checks: src 16-byte aligned, k0 a multiple
// of 16 / sizeof(T)) and the M rows lie inside n; a warp's loads are then strided, each filling
// half of 32 sectors that the thread's next load finds in L1. kL2: through L2 only (`__ldcg`),
// for arrays other blocks write while the kernel runs.

template <int M, bool kL2 = false, typename T>
__device__ __forceinline__ void LoadRowsDirect(const T* src, int64_t k0, int64_t n, bool vec,
                                               T pad, T (&v)[M]) {
  using V = typename Vec16<T>::type;
  constexpr int W = 16 / sizeof(T);
  if constexpr (M % W == 0) {
    if (vec && k0 + M <= n) {
      const V* s = reinterpret_cast<const V*>(src + k0);
#pragma unroll
      for (int q = 0; q < M / W; ++q) Unpack(kL2 ? __ldcg(s + q) : __ldg(s + q), v + q * W);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i)
    v[i] = k0 + i < n ? (kL2 ? __ldcg(src + k0 + i) : __ldg(src + k0 + i)) : pad;
}

// a[0] and c[n-1] zeroed (unused by definition), for a chunk starting at row k0.
template <int M, typename T>
__device__ __forceinline__ void EndRows(int64_t k0, int64_t n, T (&a)[M], T (&c)[M]) {
  if (k0 == 0) a[0] = T(0);
#pragma unroll
  for (int i = 0; i < M; ++i)
    if (k0 + i + 1 >= n) c[i] = T(0);
}

template <int M, typename T>
__device__ __forceinline__ void StoreRowsDirect(T* dst, int64_t k0, int64_t n, bool vec,
                                                const T (&v)[M]) {
  using V = typename Vec16<T>::type;
  constexpr int W = 16 / sizeof(T);
  if constexpr (M % W == 0) {
    if (vec && k0 + M <= n) {
#pragma unroll
      for (int q = 0; q < M / W; ++q) reinterpret_cast<V*>(dst + k0)[q] = Pack(v + q * W);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i)
    if (k0 + i < n) dst[k0 + i] = v[i];
}

// Flat layout: the block's rows are staged through shared memory so that global reads and
// writes are coalesced. Thread t's chunk (M rows) sits at tile[t*(M+1) .. t*(M+1)+M): one word of
// padding per chunk keeps the per-thread reads free of bank conflicts. `where(e, g, pos)` maps
// the block's e-th element (consecutive e = consecutive addresses) to its global index g and
// tile position pos, or returns false. Each thread gathers M elements of every array before it
// stores any: 4M independent loads in flight per thread.
template <int M, typename T, typename Where>
__device__ __forceinline__ void StageFlat4(const TridiagonalProblem<T>& p, T* tile, int tsz,
                                           int nthreads, Where where) {
  int64_t g[M];
  int pos[M];
  bool live[M];
#pragma unroll
  for (int q = 0; q < M; ++q) live[q] = where(threadIdx.x + q * nthreads, g[q], pos[q]);
  T va[M], vb[M], vc[M], vd[M];
#pragma unroll
  for (int q = 0; q < M; ++q) {
    if (live[q]) {
      va[q] = __ldg(p.a + g[q]);
      vb[q] = __ldg(p.b + g[q]);
      vc[q] = __ldg(p.c + g[q]);
      vd[q] = __ldg(p.d + g[q]);
    }
  }
#pragma unroll
  for (int q = 0; q < M; ++q) {
    if (live[q]) {
      tile[pos[q]] = va[q];
      tile[tsz + pos[q]] = vb[q];
      tile[2 * tsz + pos[q]] = vc[q];
      tile[3 * tsz + pos[q]] = vd[q];
    }
  }
}

// A chunk's four arrays (rows k0 .. k0+M-1 of a system whose arrays start at a, b, c, d) by
// LoadRowsDirect: rows past n are identity rows, a[0] and c[n-1] zeroed.
template <int M, typename T>
__device__ __forceinline__ void LoadChunkDirect(const T* a_in, const T* b_in, const T* c_in,
                                                const T* d_in, int64_t k0, int64_t n, bool vec,
                                                T (&a)[M], T (&b)[M], T (&c)[M], T (&d)[M]) {
  LoadRowsDirect<M>(a_in, k0, n, vec, T(0), a);
  LoadRowsDirect<M>(b_in, k0, n, vec, T(1), b);
  LoadRowsDirect<M>(c_in, k0, n, vec, T(0), c);
  LoadRowsDirect<M>(d_in, k0, n, vec, T(0), d);
  EndRows<M>(k0, n, a, c);
}

// A system's reduced rows in shared memory.
// Block = S systems x P threads (P a power of two, P * M >= n). Flat layout: thread
// tid = s_local * P + j; interleaved: tid = j * S + s_local (systems fastest, coalesced).
// The reduced system (R = 2P rows a system) lives in shared memory with its rows placed by the
// PCR notes' even/odd permutation, perm(i) = (R/2 + R%2) * (i%2) + i/2, so that the rows 2j and
// 2j+1 a thread owns sit P apart and consecutive threads touch consecutive words; in the
// interleaved mapping the systems are the fastest index instead. Either way a warp's accesses
// fall in distinct banks.
template <bool kInterleaved>
__device__ __forceinline__ int ReducedIndex(int sl, int i, int P, int S) {
  const int r = (i & 1) * P + (i >> 1);
  return kInterleaved ? r * S + sl : sl * 2 * P + r;
}

// The barrier of the block's threads.
struct BlockSync {
  __device__ void operator()() const { __syncthreads(); }
};

// The barrier of the block's first n threads alone (the others never reach it): a warp's
// __syncwarp for n <= 32, else named barrier 1 (n a multiple of 32).
struct FirstThreadsSync {
  int n;
  __device__ void operator()() const {
    if (n <= 32)
      __syncwarp(n == 32 ? 0xffffffffu : (1u << n) - 1);
    else
      asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory");
  }
};

// The reduced system of system sl (R = 2P rows: thread j's chunk gave rows 2j and 2j+1, its
// first and last rows after ChunkReduce) solved by PCR in sa..sd (S * R values each); returns
// x of the thread's two rows in x0, xl. Every thread of the block calls it (barriers inside),
// or with `sync` the barrier of a group of threads, the group alone. kLazy: PcrCombine's form
// (measured per caller). Returns false if a pivot vanished.
template <bool kInterleaved, bool kLazy, typename T, typename Sync = BlockSync>
__device__ __forceinline__ bool SolveReduced(T* sa, T* sb, T* sc, T* sd, int sl, int j, int P,
                                             int S, T a0, T c0, T d0, T al, T cl, T dl, T& x0,
                                             T& xl, Sync sync = {}) {
  const int R = 2 * P;
  const auto at = [&](int r) { return ReducedIndex<kInterleaved>(sl, r, P, S); };
  const int e0 = at(2 * j), e1 = at(2 * j + 1);
  sa[e0] = a0;
  sb[e0] = T(1);
  sc[e0] = c0;
  sd[e0] = d0;
  sa[e1] = al;
  sb[e1] = T(1);
  sc[e1] = cl;
  sd[e1] = dl;
  sync();
  bool ok = true;
  for (int stride = 1; stride < R; stride *= 2) {
    T na[2], nb[2], nc[2], nd[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int i = 2 * j + q, il = i - stride, ir = i + stride;
      ok &= PcrCombine<kLazy>(sa, sb, sc, sd, i, il >= 0, il, ir < R, ir, at, na[q], nb[q],
                              nc[q], nd[q]);
    }
    sync();
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int e = at(2 * j + q);
      sa[e] = na[q];
      sb[e] = nb[q];
      sc[e] = nc[q];
      sd[e] = nd[q];
    }
    sync();
  }
  x0 = sd[e0] * Rcp(sb[e0]);
  xl = sd[e1] * Rcp(sb[e1]);
  return ok;
}

// K consecutive reduced rows (b = 1) from shared memory, starting at `base`, into registers.
template <int K, typename T>
__device__ __forceinline__ void LoadReducedRows(const T* ra, const T* rc, const T* rd, int base,
                                                T (&a)[K], T (&b)[K], T (&c)[K], T (&d)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) {
    a[i] = ra[base + i];
    b[i] = T(1);
    c[i] = rc[base + i];
    d[i] = rd[base + i];
  }
}

// The unit-diagonal tridiagonal system of R rows in ra, rc, rd (row r at r + r / K: a thread's K
// rows start K + 1 words apart; R a multiple of 2 K) solved by the first T = R / K threads,
// which alone call it: each reduces K rows in registers (ChunkReduce), the 2 T rows left are
// solved by PCR among them (a named barrier of T threads, or __syncwarp) in the memory of ra,
// free once they have read their rows, and each substitutes back: x in rd. Returns false if a
// pivot vanished.
template <int K, typename T>
__device__ __forceinline__ bool SolvePaddedRows(T* ra, const T* rc, T* rd, int j, int R) {
  static_assert(K >= 7, "the PCR's 8 T values must fit in ra's (K + 1) T");
  const int T1 = R / K, base = j * (K + 1);
  T ka[K], kb[K], kc[K], kd[K];
  LoadReducedRows<K>(ra, rc, rd, base, ka, kb, kc, kd);
  const FirstThreadsSync sync{T1};
  sync();  // ra and rc read: the PCR's 8 T1 values may overwrite them
  bool ok = ChunkReduce<K>(ka, kb, kc, kd);
  T y0, yl;
  T* pcr = ra;
  ok &= SolveReduced<false, false>(pcr, pcr + 2 * T1, pcr + 4 * T1, pcr + 6 * T1, 0, j, T1, 1,
                                   ka[0], kc[0], kd[0], ka[K - 1], kc[K - 1], kd[K - 1], y0, yl,
                                   sync);
  ChunkBack<K>(ka, kc, kd, y0, yl);
#pragma unroll
  for (int i = 0; i < K; ++i) rd[base + i] = kd[i];
  return ok;
}

// Thread j's two reduced rows (2j and 2j + 1, b = 1) into ra, rc, rd at their padded places
// (row r at r + r / K), which it returns in e0, e1.
template <int K, typename T>
__device__ __forceinline__ void PutPaddedRows(T* ra, T* rc, T* rd, int j, T a0, T c0, T d0, T al,
                                              T cl, T dl, int& e0, int& e1) {
  e0 = 2 * j + 2 * j / K;
  e1 = 2 * j + 1 + (2 * j + 1) / K;
  ra[e0] = a0;
  rc[e0] = c0;
  rd[e0] = d0;
  ra[e1] = al;
  rc[e1] = cl;
  rd[e1] = dl;
}

// The reduced system of one system a block (R = 2P rows; thread j holds rows 2j and 2j + 1,
// b = 1) solved by a second partition level instead of PCR over all R rows: the rows go to
// shared memory (row r at r + r / K1) and the first R / K1 threads solve them
// (SolvePaddedRows); every thread then reads its own x. Two block barriers where PCR takes
// 2 log2 R + 1, and a fraction of its shared-memory traffic: PCR over R rows moves ~128 bytes
// a row and step in float64, which bounds it by the SM's 128 bytes a cycle (512 rows: ~4,600
// cycles; NOTES.md t26). `rows` holds 3 (R + R / K1) values. Returns x of the thread's rows in
// x0, xl, and false if a pivot vanished.
template <int K1, typename T>
__device__ __forceinline__ bool SolveReducedTwoLevel(T* rows, int j, int P, T a0, T c0, T d0,
                                                     T al, T cl, T dl, T& x0, T& xl) {
  const int R = 2 * P, Rp = R + R / K1;
  T* ra = rows;
  T* rc = ra + Rp;
  T* rd = rc + Rp;
  int e0, e1;
  PutPaddedRows<K1>(ra, rc, rd, j, a0, c0, d0, al, cl, dl, e0, e1);
  __syncthreads();
  bool ok = true;
  if (j < R / K1) ok = SolvePaddedRows<K1>(ra, rc, rd, j, R);
  __syncthreads();
  x0 = rd[e0];
  xl = rd[e1];
  return ok;
}

// The reduced systems of a block in sa (8 S P values: S systems of R = 2P rows): one system of
// 64 threads or more by the second partition level (SolveReducedTwoLevel, 8 rows a thread), the
// rest by PCR (SolveReduced). H100 (NOTES.md t26): block sweeps at M = 4096 on 512 threads
// 0.557 -> 0.476 ms a sweep, 1024 0.026 -> 0.024.
constexpr int kTwoLevelChunk = 8;
// kTwoLevel: whether the kernel may take the second level at all (where it cannot, its code
// would only cost the kernel registers).
template <bool kInterleaved, bool kLazy, bool kTwoLevel = true, typename T>
__device__ __forceinline__ bool SolveReducedBlock(T* sa, int sl, int j, int P, int S, T a0, T c0,
                                                  T d0, T al, T cl, T dl, T& x0, T& xl) {
  if (kTwoLevel && S == 1 && P >= 64)
    return SolveReducedTwoLevel<kTwoLevelChunk>(sa, j, P, a0, c0, d0, al, cl, dl, x0, xl);
  const int n = 2 * P * S;
  return SolveReduced<kInterleaved, kLazy>(sa, sa + n, sa + 2 * n, sa + 3 * n, sl, j, P, S, a0,
                                           c0, d0, al, cl, dl, x0, xl);
}

// The reduced system of systems split over the Q = K / 2 blocks of a thread-block cluster
// (sm_90; PartitionedClusterKernel, the fused block sweeps), solved redundantly by every block.
// Block = S systems x Pb threads; thread j of system sl holds its chunk's two reduced rows
// (a0, c0, d0) and (al, cl, dl), b = 1 implied; the cluster's block `rank` owns reduced rows
// rank * Rb .. rank * Rb + Rb - 1 of each system (Rb = 2 Pb; R = Rb Q rows a system).
//  1. The rows go to this block's `own` (3 S Rb values); cluster barrier.
//  2. The whole reduced system is copied from the cluster's shared memory (distributed shared
//     memory) into `gather` (3 S Rp values, Rp = R + R / K), coalesced: consecutive threads
//     read consecutive words of one block (a thread reading its own K rows straight from the
//     others' shared memory, strided, took 2-7x the whole kernel's time on the H100). Row r of
//     system sl goes to g*[sl * Rp + r + r / K]: a thread's K rows then start K + 1 words apart.
//     The block then arrives at a second cluster barrier: done reading the others' memory.
//  3. K consecutive rows a thread reduced in registers (ChunkReduce), PCR on the 2 Pb rows left
//     in `pcr` (4 S Rb values; SolveReduced), ChunkBack into gather (x: [sl * R + r]).
// Returns x of the thread's two rows in x0, xl, and false if a pivot vanished. `own` must
// outlive the other blocks' reads: the caller waits on the second barrier
// (cluster.barrier_wait()) before it exits or writes `own` again. after_sync() runs right after
// the first cluster barrier (the streamed block sweeps start their next copies there).
template <int K, bool kInterleaved, typename T, typename Cluster, typename AfterSync>
__device__ __forceinline__ bool SolveReducedCluster(Cluster& cluster, T* own, T* pcr, T* gather,
                                                    int sl, int j, int Pb, int S, T a0, T c0,
                                                    T d0, T al, T cl, T dl, T& x0, T& xl,
                                                    AfterSync after_sync) {
  constexpr int Q = K / 2;
  const int rank = int(cluster.block_rank());
  const int Rb = 2 * Pb, R = Rb * Q, Rp = R + R / K;
  T* oa = own;
  T* oc = oa + S * Rb;
  T* od = oc + S * Rb;
  oa[sl * Rb + 2 * j] = a0;
  oc[sl * Rb + 2 * j] = c0;
  od[sl * Rb + 2 * j] = d0;
  oa[sl * Rb + 2 * j + 1] = al;
  oc[sl * Rb + 2 * j + 1] = cl;
  od[sl * Rb + 2 * j + 1] = dl;
  cluster.sync();  // every block's reduced rows written
  after_sync();
  T* ga = gather;
  T* gc = ga + S * Rp;
  T* gd = gc + S * Rp;
  T* gx = ga;  // x of the reduced system, once ga is read
  const int tid = threadIdx.x, nthreads = S * Pb;
#pragma unroll
  for (int q = 0; q < K; ++q) {  // S * R = K * nthreads elements
    const int e = tid + q * nthreads;
    const int es = e / R, r = e - es * R;
    const int src = r / Rb, off = es * Rb + (r - src * Rb);
    const int dst = es * Rp + r + r / K;
    ga[dst] = cluster.map_shared_rank(oa, src)[off];
    gc[dst] = cluster.map_shared_rank(oc, src)[off];
    gd[dst] = cluster.map_shared_rank(od, src)[off];
  }
  cluster.barrier_arrive();  // done reading the others' shared memory
  __syncthreads();
  bool ok;
  {
    const int r0 = j * K, base = sl * Rp + r0 + j;
    T ka[K], kb[K], kc[K], kd[K];
    LoadReducedRows<K>(ga, gc, gd, base, ka, kb, kc, kd);
    ok = ChunkReduce<K>(ka, kb, kc, kd);
    T y0, yl;
    T* sa = pcr;
    // Barriers inside: every thread has read its rows of ga before gx (= ga) is written.
    ok &= SolveReduced<kInterleaved, false>(sa, sa + S * Rb, sa + 2 * S * Rb, sa + 3 * S * Rb,
                                            sl, j, Pb, S, ka[0], kc[0], kd[0], ka[K - 1],
                                            kc[K - 1], kd[K - 1], y0, yl);
    ChunkBack<K>(ka, kc, kd, y0, yl);
#pragma unroll
    for (int i = 0; i < K; ++i) gx[sl * R + r0 + i] = kd[i];
  }
  __syncthreads();
  x0 = gx[sl * R + rank * Rb + 2 * j];
  xl = gx[sl * R + rank * Rb + 2 * j + 1];
  return ok;
}

// The blocks' threads P (a power of two) times Q that SolveReducedClusterTwoLevel<Q, 8, 8>
// needs at least (whole chunks of 8 rows at both levels).
constexpr int kClusterTwoLevelMin = 64;

// The reduced system of one system a block split over the Q blocks of a thread-block cluster
// (sm_90; the fused block sweeps), solved with the second partition level before the
// exchange (SolveReducedCluster gathers all Q 2P rows and reduces them after; at 8192 its PCR
// over 512 rows and the gather of 1024 were a third of a task, NOTES.md t26):
//  1. The block's 2P reduced rows go to `rows` (row r at r + r / K1, 3 (2P + 2P / K1) values);
//     the first T1 = 2P / K1 threads reduce K1 rows each in registers (ChunkReduce), put the
//     result back in place and store their two rows straight into every block's `gather`
//     (distributed shared memory: stores, which wait for nothing; row r of the cluster's
//     Rg = 2 T1 Q at r + r / K2, 3 (Rg + Rg / K2) values); one cluster barrier.
//  2. Every block solves the Rg rows redundantly (SolvePaddedRows).
//  3. The first T1 threads substitute back into their K1 rows (ChunkBack); each thread reads x
//     of its two rows.
// Every block holds 2 T1 Q rows (256 at Q = 2, P = 256) instead of 2 P Q (1024). The rows were
// first gathered by loads from the other blocks' memory after the barrier: two round trips of
// DSMEM loads, 5,000-6,700 cycles of a ~32,000-cycle task at 16384 (NOTES.md t29). The other
// blocks write this block's `gather` between their previous use of the function and the
// barrier: the caller keeps them from it while it still uses that memory (the streamed sweeps:
// a split cluster barrier around the whole task). after_sync() runs right after the cluster
// barrier; mark(k) after step 1's reduction (k = 0) and step 2 (1): the streamed sweeps' phase
// profile. Returns x of the thread's rows in x0, xl, and false if a pivot vanished.
struct NoMark {
  __device__ void operator()(int) const {}
};
template <int Q, int K1, int K2, typename T, typename Cluster, typename AfterSync,
          typename Mark = NoMark>
__device__ __forceinline__ bool SolveReducedClusterTwoLevel(Cluster& cluster, T* rows, T* gather,
                                                            int j, int P, T a0, T c0, T d0, T al,
                                                            T cl, T dl, T& x0, T& xl,
                                                            AfterSync after_sync,
                                                            Mark mark = {}) {
  const int rank = int(cluster.block_rank());
  const int R = 2 * P, Rp = R + R / K1, T1 = R / K1, R1 = 2 * T1;
  const int Rg = R1 * Q, Rgp = Rg + Rg / K2;
  T* ra = rows;
  T* rc = ra + Rp;
  T* rd = rc + Rp;
  T* ga = gather;
  T* gc = ga + Rgp;
  T* gd = gc + Rgp;
  int e0, e1;
  PutPaddedRows<K1>(ra, rc, rd, j, a0, c0, d0, al, cl, dl, e0, e1);
  __syncthreads();
  bool ok = true;
  const int base = j * (K1 + 1);
  if (j < T1) {
    T ka[K1], kb[K1], kc[K1], kd[K1];
    LoadReducedRows<K1>(ra, rc, rd, base, ka, kb, kc, kd);
    ok = ChunkReduce<K1>(ka, kb, kc, kd);
#pragma unroll
    for (int i = 0; i < K1; ++i) {
      ra[base + i] = ka[i];
      rc[base + i] = kc[i];
      rd[base + i] = kd[i];
    }
    const int g0 = rank * R1 + 2 * j, g1 = g0 + 1;
    const int p0 = g0 + g0 / K2, p1 = g1 + g1 / K2;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      T* qg = cluster.map_shared_rank(ga, unsigned(q));
      qg[p0] = ka[0];
      qg[Rgp + p0] = kc[0];
      qg[2 * Rgp + p0] = kd[0];
      qg[p1] = ka[K1 - 1];
      qg[Rgp + p1] = kc[K1 - 1];
      qg[2 * Rgp + p1] = kd[K1 - 1];
    }
  }
  mark(0);
  cluster.sync();  // every block's rows in every block's `gather`
  after_sync();
  if (j < Rg / K2) ok &= SolvePaddedRows<K2>(ga, gc, gd, j, Rg);
  __syncthreads();
  mark(1);
  if (j < T1) {
    const int r0 = rank * R1 + 2 * j, r1 = r0 + 1;
    const T y0 = gd[r0 + r0 / K2], yl = gd[r1 + r1 / K2];
    T ka[K1], kb[K1], kc[K1], kd[K1];
    LoadReducedRows<K1>(ra, rc, rd, base, ka, kb, kc, kd);  // as reduced in step 1
    ChunkBack<K1>(ka, kc, kd, y0, yl);
#pragma unroll
    for (int i = 0; i < K1; ++i) rd[base + i] = kd[i];
  }
  __syncthreads();
  x0 = rd[e0];
  xl = rd[e1];
  return ok;
}

}  // namespace trisolve::cuda
