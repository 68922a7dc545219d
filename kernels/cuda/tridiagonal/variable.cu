// Variable-size tridiagonal batches on the device (variable.h).
#include "tridiagonal/variable.h"

#include <cuda_pipeline.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>

#include "common/numerics.cuh"
#include "runtime/check.h"
#include "runtime/launch.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/internal.h"
#include "tridiagonal/partitioned.cuh"
#include "tridiagonal/tridiagonal.h"

namespace trisolve::cuda {
namespace {

constexpr int kMaxLog2P = 8;  // 256 threads a system: kVariableBlockRows rows
static_assert((1 << kMaxLog2P) == kVariableThreads);

int Log2Threads(int64_t rows) {
  int lp = 0;
  while ((int64_t(kVariableChunk) << lp) < rows) ++lp;
  return lp;
}

// Rows k0 .. k0+M-1 of a system in the unified-vector layout (abc: a, b, c of a row together)
// into registers, rows past n identity rows, a[0] and c[n-1] zeroed: 3M consecutive values,
// 16-byte loads where `vec` (abc + 3 k0 16-byte aligned) and the rows lie inside n.
template <int M, typename T>
__device__ __forceinline__ void LoadChunkUnified(const T* abc, int64_t k0, int64_t n, bool vec,
                                                 T (&a)[M], T (&b)[M], T (&c)[M]) {
  using V = typename Vec16<T>::type;
  constexpr int W = 16 / sizeof(T);
  if constexpr ((3 * M) % W == 0) {
    if (vec && k0 + M <= n) {
      T t[3 * M];
      const V* src = reinterpret_cast<const V*>(abc + 3 * k0);
#pragma unroll
      for (int q = 0; q < 3 * M / W; ++q) Unpack(__ldg(src + q), t + q * W);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        a[i] = t[3 * i];
        b[i] = t[3 * i + 1];
        c[i] = t[3 * i + 2];
      }
      EndRows<M>(k0, n, a, c);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const bool live = k0 + i < n;
    a[i] = live ? __ldg(abc + 3 * (k0 + i)) : T(0);
    b[i] = live ? __ldg(abc + 3 * (k0 + i) + 1) : T(1);
    c[i] = live ? __ldg(abc + 3 * (k0 + i) + 2) : T(0);
  }
  EndRows<M>(k0, n, a, c);
}

// Copies rows [0, n) of the unified array abc into separate a, b, c (a long system's rows for
// the uniform kernels, which read separate arrays).
template <typename T>
__global__ void SplitUnifiedKernel(const T* __restrict__ abc, int64_t n, T* __restrict__ a,
                                   T* __restrict__ b, T* __restrict__ c) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    a[k] = abc[3 * k];
    b[k] = abc[3 * k + 1];
    c[k] = abc[3 * k + 2];
  }
}

// One block of NT threads (64, 128 or 256: VariableBlockThreads): systems of one class (P = 2^lp
// threads each, S = NT / P of them),
// thread tid = sl * P + j holding rows j*M .. j*M+M-1 of system sl. Rows past a system's end
// (and every row of a slot with no system) are identity rows, so that one reduced-system solve
// of the block's shape serves every size in the class. A system's rows are loaded straight
// into registers (16-byte loads where its first row is 16-byte aligned); kUnified: a, b, c
// read from their triples (a points at abc).
template <int M, typename T, bool kLazyPcr, bool kUnified>
__global__ void __launch_bounds__(kVariableThreads)
    VariableOnChipKernel(const T* __restrict__ a, const T* __restrict__ b,
                         const T* __restrict__ c, const T* __restrict__ d, T* __restrict__ x,
                         uint8_t* flags, const int64_t* __restrict__ offsets,
                         const int32_t* __restrict__ order, const int2* __restrict__ table,
                         bool aligned) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sa = reinterpret_cast<T*>(smem_raw);  // the reduced systems: 8 * blockDim.x values
  __shared__ int bad[kVariableThreads];
  constexpr int W = 16 / sizeof(T);
  const int2 blk = table[blockIdx.x];
  const int lp = blk.y >> 16, count = blk.y & 0xffff;
  const int P = 1 << lp, S = int(blockDim.x) >> lp;
  const int tid = threadIdx.x, sl = tid >> lp, j = tid & (P - 1);
  int64_t o = 0, n = 0;
  if (sl < count) {
    const int32_t s = __ldg(order + blk.x + sl);
    o = __ldg(offsets + s);
    n = __ldg(offsets + s + 1) - o;
  }
  if (tid < S) bad[tid] = 0;
  const bool vec = aligned && o % W == 0;
  T ra[M], rb[M], rc[M], rd[M];
  if constexpr (kUnified) {
    LoadChunkUnified<M>(a + 3 * o, int64_t(j) * M, n, vec, ra, rb, rc);
    LoadRowsDirect<M>(d + o, int64_t(j) * M, n, vec, T(0), rd);
  } else {
    LoadChunkDirect<M>(a + o, b + o, c + o, d + o, int64_t(j) * M, n, vec, ra, rb, rc, rd);
  }
  const bool dominant = ChunkDominant<M>(ra, rb, rc);  // (flags.h: kFlagNotDominant)
  bool ok = ChunkReduce<M>(ra, rb, rc, rd);
  T x0, xl;
  ok &= SolveReducedBlock<false, kLazyPcr, true>(sa, sl, j, P, S, ra[0], rc[0], rd[0],
                                                 ra[M - 1], rc[M - 1], rd[M - 1], x0, xl);
  ChunkBack<M>(ra, rc, rd, x0, xl);
#pragma unroll
  for (int i = 0; i < M; ++i) ok &= Finite(rd[i]);
  if (const int v = (ok ? 0 : kFlagVanished) | (dominant ? 0 : kFlagNotDominant); v)
    atomicOr(&bad[sl], v);
  if (n > 0) StoreRowsDirect<M>(x + o, int64_t(j) * M, n, vec, rd);
  __syncthreads();
  if (tid < count && bad[tid]) flags[__ldg(order + blk.x + tid)] = uint8_t(bad[tid]);
}


// The streamed form, for the large classes: persistent blocks of P threads, each taking the
// systems of one class in turn (`order`: the class's systems) and copying the next one into
// shared memory (cp.async) while it solves the current one -- the overlap of the uniform
// partitioned-stream kernel, which the block table's kernel (a block's loads, then its
// arithmetic, then its stores) lacks where one block fills an SM. A system's rows are copied as
// the 16-byte words that cover them (its row 0 at value sh = its offset mod W of the slot), so
// every copy is a whole word whatever the offset; a word past the arrays' end is copied value
// by value. Buffer value v sits in word Swizzle16(v / W), so that threads reading their own M
// consecutive rows meet few bank conflicts. kUnified: the slot holds the abc triples as they
// lie, then d.

// Values a slot of `rows` values takes: room for the offset's shift and the last word, in whole
// 128-byte lines (the swizzle permutes words within a line).
template <typename T>
__host__ __device__ constexpr int VariableSlotValues(int rows) {
  constexpr int line = 128 / sizeof(T);
  return (rows + 2 * (16 / int(sizeof(T))) + line - 1) / line * line;
}

template <typename T>
__device__ __forceinline__ T BufAt(const T* buf, int v) {
  constexpr int W = 16 / sizeof(T);
  return buf[Swizzle16(v / W) * W + v % W];
}

// Starts the copy of values [first, first + count) of K arrays srcs (`total` values each)
// into the buffers bufs from value `at` on (a multiple of W), the words that cover them whole:
// bufs[q]'s value at + i holds srcs[q][first - first % W + i]. `vec`: the arrays are 16-byte
// aligned; else, and for a word past the arrays' end, each value is copied alone. One loop for
// the K arrays, its bound checked once: the per-word index work is most of a thread's
// instructions besides the arithmetic (four loops with the check per word ran the uniform
// 4096-row batch at 62% of the copy rate against the uniform kernel's 86%).
template <int K, typename T>
__device__ __forceinline__ void CopyWords(T* const (&bufs)[K], int at, const T* const (&srcs)[K],
                                          int64_t first, int64_t count, int64_t total, bool vec) {
  using V = typename Vec16<T>::type;
  constexpr int W = 16 / sizeof(T);
  const int64_t w0 = first / W;
  const int words = int((first + count + W - 1) / W - w0);
  const int whole = vec ? int(std::max<int64_t>(0, std::min<int64_t>(words, total / W - w0))) : 0;
  const int a0 = at / W;
  for (int w = threadIdx.x; w < whole; w += blockDim.x) {
    const int ph = Swizzle16(a0 + w) * W;
#pragma unroll
    for (int q = 0; q < K; ++q)
      __pipeline_memcpy_async(reinterpret_cast<V*>(bufs[q] + ph),
                              reinterpret_cast<const V*>(srcs[q]) + w0 + w, 16);
  }
  for (int w = whole + threadIdx.x; w < words; w += blockDim.x) {
    const int ph = Swizzle16(a0 + w) * W;
    for (int i = 0; i < W && (w0 + w) * W + i < total; ++i)
#pragma unroll
      for (int q = 0; q < K; ++q)
        __pipeline_memcpy_async(bufs[q] + ph + i, srcs[q] + (w0 + w) * W + i, sizeof(T));
  }
}

// Rows k0 .. k0+M-1 of a system whose row 0 sits at value `sh` of a slot (sh < W: its offset
// mod W) into registers: the M / W + 1 words that cover them read whole (16-byte reads), the
// values picked at compile-time positions.
template <int SH, int M, typename T>
__device__ __forceinline__ void ReadShifted(const T* slot, int k0, T (&v)[M]) {
  using V = typename Vec16<T>::type;
  constexpr int W = 16 / sizeof(T);
  const V* w = reinterpret_cast<const V*>(slot);
  if constexpr (SH == 0) {
#pragma unroll
    for (int q = 0; q < M / W; ++q) Unpack(w[Swizzle16(k0 / W + q)], v + q * W);
  } else {
    T t[M + W];
#pragma unroll
    for (int q = 0; q <= M / W; ++q) Unpack(w[Swizzle16(k0 / W + q)], t + q * W);
#pragma unroll
    for (int i = 0; i < M; ++i) v[i] = t[SH + i];
  }
}

// Rows k0 .. k0+M-1 (all inside the system) stored at dst (row 0 of the system, dst - SH
// 16-byte aligned): whole words with 16-byte stores, the values before the first and after the
// last alone.
template <int SH, int M, typename T>
__device__ __forceinline__ void StoreShifted(T* dst, int k0, const T (&v)[M]) {
  using V = typename Vec16<T>::type;
  constexpr int W = 16 / sizeof(T);
  constexpr int head = (W - SH) % W;           // values before the first whole word
  constexpr int words = (M - head) / W;
  T* p = dst + k0;
#pragma unroll
  for (int i = 0; i < head; ++i) p[i] = v[i];
#pragma unroll
  for (int q = 0; q < words; ++q) reinterpret_cast<V*>(p + head)[q] = Pack(v + head + q * W);
#pragma unroll
  for (int i = head + words * W; i < M; ++i) p[i] = v[i];
}

// Calls f(std::integral_constant<int, sh>) for sh in 0 .. W-1.
template <typename T, typename F>
__device__ __forceinline__ void WithShift(int sh, F&& f) {
  if constexpr (sizeof(T) == 8) {
    if (sh == 0) f(std::integral_constant<int, 0>{});
    else f(std::integral_constant<int, 1>{});
  } else {
    switch (sh) {
      case 0: f(std::integral_constant<int, 0>{}); break;
      case 1: f(std::integral_constant<int, 1>{}); break;
      case 2: f(std::integral_constant<int, 2>{}); break;
      default: f(std::integral_constant<int, 3>{}); break;
    }
  }
}

// One system a block of P threads (a class's systems, `order`, taken in turn by persistent
// blocks). The next system's offset is loaded a step ahead, so that its copy starts without
// waiting on global memory.
template <int M, typename T, bool kLazyPcr, bool kUnified>
__global__ void __launch_bounds__(kVariableThreads)
    VariableStreamKernel(const T* __restrict__ a, const T* __restrict__ b,
                         const T* __restrict__ c, const T* __restrict__ d, T* __restrict__ x,
                         uint8_t* flags, const int64_t* __restrict__ offsets,
                         const int32_t* __restrict__ order, int count, int64_t total,
                         bool in_aligned, bool x_aligned) {
  constexpr int W = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int bad;
  const int P = int(blockDim.x), j = threadIdx.x;
  const int rows = P * M;
  const int rs = VariableSlotValues<T>(rows);                       // a, b, c, d
  const int us = kUnified ? VariableSlotValues<T>(3 * rows) : rs;  // abc (kUnified)
  // The buffer starts on a 128-byte line of the shared space (the swizzle's unit), whatever
  // static shared memory precedes it: 16 bytes off, each warp's copies read every sector from
  // L2 twice (as NOTES.md t31 found for partitioned-stream; here vb8).
  const unsigned lead = (128u - unsigned(__cvta_generic_to_shared(smem_raw)) % 128u) % 128u;
  T* sa = reinterpret_cast<T*>(smem_raw + lead);  // the reduced system: 8 P values
  T* buf = sa + 8 * P;                     // a, b, c (kUnified: abc), then d
  T* bufd = buf + (kUnified ? us : 3 * rs);
  struct Sys {
    int32_t s;
    int64_t o, n;
  };
  auto load = [&](int e) {
    Sys y{-1, 0, 0};
    if (e < count) {
      y.s = __ldg(order + e);
      y.o = __ldg(offsets + y.s);
      y.n = __ldg(offsets + y.s + 1) - y.o;
    }
    return y;
  };
  auto issue = [&](const Sys& y) {
    if constexpr (kUnified) {
      T* const to_abc[1] = {buf};
      const T* const from_abc[1] = {a};
      CopyWords(to_abc, 0, from_abc, 3 * y.o, 3 * y.n, 3 * total, in_aligned);
      T* const to_d[1] = {bufd};
      const T* const from_d[1] = {d};
      CopyWords(to_d, 0, from_d, y.o, y.n, total, in_aligned);
    } else {
      T* const to[4] = {buf, buf + rs, buf + 2 * rs, bufd};
      const T* const from[4] = {a, b, c, d};
      CopyWords(to, 0, from, y.o, y.n, total, in_aligned);
    }
    __pipeline_commit();
  };
  int g = blockIdx.x;
  Sys cur = load(g);
  if (g < count) issue(cur);
  Sys next = load(g + int(gridDim.x));
  for (; g < count; g += gridDim.x) {
    __pipeline_wait_prior(0);
    __syncthreads();  // system g in the buffer
    const int k0 = j * M;
    const int n = int(cur.n), sh = int(cur.o % W);
    T ra[M], rb[M], rc[M], rd[M];
    if (!kUnified && k0 + M <= n) {
      WithShift<T>(sh, [&](auto SH) {
        ReadShifted<decltype(SH)::value>(buf, k0, ra);
        ReadShifted<decltype(SH)::value>(buf + rs, k0, rb);
        ReadShifted<decltype(SH)::value>(buf + 2 * rs, k0, rc);
        ReadShifted<decltype(SH)::value>(bufd, k0, rd);
      });
    } else {
      const int shu = int(3 * cur.o % W);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        const int k = k0 + i;
        if (k < n) {
          if constexpr (kUnified) {
            ra[i] = BufAt(buf, shu + 3 * k);
            rb[i] = BufAt(buf, shu + 3 * k + 1);
            rc[i] = BufAt(buf, shu + 3 * k + 2);
          } else {
            ra[i] = BufAt(buf, sh + k);
            rb[i] = BufAt(buf + rs, sh + k);
            rc[i] = BufAt(buf + 2 * rs, sh + k);
          }
          rd[i] = BufAt(bufd, sh + k);
        } else {
          ra[i] = T(0);
          rb[i] = T(1);
          rc[i] = T(0);
          rd[i] = T(0);
        }
      }
    }
    EndRows<M>(k0, n, ra, rc);
    const bool dominant = ChunkDominant<M>(ra, rb, rc);  // (flags.h: kFlagNotDominant)
    if (j == 0) bad = 0;
    __syncthreads();  // the buffer read: the next system may land in it
    if (next.s >= 0) issue(next);
    const Sys after = load(g + 2 * int(gridDim.x));
    bool ok = ChunkReduce<M>(ra, rb, rc, rd);
    T x0, xl;
    ok &= SolveReducedBlock<false, kLazyPcr, true>(sa, 0, j, P, 1, ra[0], rc[0], rd[0],
                                                   ra[M - 1], rc[M - 1], rd[M - 1], x0, xl);
    ChunkBack<M>(ra, rc, rd, x0, xl);
#pragma unroll
    for (int i = 0; i < M; ++i) ok &= Finite(rd[i]);
    if (const int v = (ok ? 0 : kFlagVanished) | (dominant ? 0 : kFlagNotDominant); v)
      atomicOr(&bad, v);
    if (x_aligned && k0 + M <= n) {
      WithShift<T>(sh, [&](auto SH) { StoreShifted<decltype(SH)::value>(x + cur.o, k0, rd); });
    } else if (n > 0) {
      StoreRowsDirect<M>(x + cur.o, k0, n, false, rd);
    }
    __syncthreads();
    if (j == 0 && bad) flags[cur.s] = uint8_t(bad);
    cur = next;
    next = after;
  }
}

}  // namespace

VariablePlan PlanVariable(const int64_t* offsets, int64_t batch, int stream_from) {
  VariablePlan plan;
  plan.batch = batch;
  plan.stream_from = stream_from;
  // Counting sort by class, largest first: the long blocks start first and the short ones
  // fill the tail.
  std::vector<int64_t> per_class(kMaxLog2P + 1, 0);
  std::vector<uint8_t> cls(static_cast<size_t>(batch));
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t rows = offsets[s + 1] - offsets[s];
    if (rows > kVariableBlockRows) {
      plan.long_systems.push_back(s);
      cls[size_t(s)] = 0xff;
      continue;
    }
    cls[size_t(s)] = uint8_t(Log2Threads(rows));
    ++per_class[cls[size_t(s)]];
  }
  std::vector<int64_t> begin(kMaxLog2P + 1, 0);
  int64_t at = 0;
  for (int lp = kMaxLog2P; lp >= 0; --lp) {
    begin[lp] = at;
    at += per_class[lp];
    plan.class_first[lp] = begin[lp];
    plan.class_count[lp] = per_class[lp];
  }
  const int64_t short_systems = at;
  std::vector<int32_t> order(static_cast<size_t>(short_systems));
  std::vector<int64_t> fill = begin;
  for (int64_t s = 0; s < batch; ++s)
    if (cls[size_t(s)] != 0xff) order[size_t(fill[cls[size_t(s)]]++)] = int32_t(s);
  // One launch a block size, largest first: the table's entries for it are contiguous.
  std::vector<int32_t> table;
  for (int g = 0; g < 3; ++g) {
    plan.launch_first[g] = int64_t(table.size()) / 2;
    for (int lp = kMaxLog2P; lp >= 0; --lp) {
      if (VariableBlockThreads(lp) != (kVariableThreads >> g) || lp >= plan.stream_from) continue;
      const int64_t S = VariableBlockThreads(lp) >> lp;
      for (int64_t i = 0; i < per_class[lp]; i += S) {
        table.push_back(int32_t(begin[lp] + i));
        table.push_back(int32_t(lp << 16 | int(std::min<int64_t>(S, per_class[lp] - i))));
      }
    }
    plan.launch_blocks[g] = int64_t(table.size()) / 2 - plan.launch_first[g];
  }
  plan.blocks = int64_t(table.size()) / 2;
  const size_t off_bytes = sizeof(int64_t) * size_t(batch + 1);
  plan.order_offset = off_bytes;
  plan.table_offset = (off_bytes + sizeof(int32_t) * order.size() + 7) / 8 * 8;
  plan.meta.resize(plan.table_offset + sizeof(int32_t) * table.size());
  std::memcpy(plan.meta.data(), offsets, off_bytes);
  if (!order.empty())
    std::memcpy(plan.meta.data() + plan.order_offset, order.data(), sizeof(int32_t) * order.size());
  if (!table.empty())
    std::memcpy(plan.meta.data() + plan.table_offset, table.data(), sizeof(int32_t) * table.size());
  return plan;
}

// Whether the arrays are 16-byte aligned (unified: abc (p.a) and d; b and c point one and two
// values into abc).
template <typename T>
bool Aligned16(const TridiagonalProblem<T>& p) {
  bool aligned = true;
  const T* const arrays[4] = {p.a, p.b, p.c, p.d};
  for (int q = 0; q < 4; ++q)
    if (!p.unified() || q == 0 || q == 3)
      aligned &= reinterpret_cast<uintptr_t>(arrays[q]) % 16 == 0;
  return aligned;
}

// Each system's a[0] and c[n-1] (read by no system) set to zero: the batch's rows then make
// one block-diagonal tridiagonal system.
template <typename T>
__global__ void CutCouplingsKernel(const int64_t* __restrict__ offsets, int64_t batch, T* a,
                                   T* c) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s < batch;
       s += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o0 = offsets[s], o1 = offsets[s + 1];
    if (o1 > o0) {
      a[o0] = T(0);
      c[o1 - 1] = T(0);
    }
  }
}

// A buffer the stream's work may still write: back to its pool only once the stream is done
// (a pending answer dropped unfinished waits for it).
struct StreamHeld {
  Pool::Buffer buffer;
  cudaStream_t stream;
  StreamHeld(Pool::Buffer b, cudaStream_t s) : buffer(std::move(b)), stream(s) {}
  StreamHeld(StreamHeld&& o) noexcept
      : buffer(std::move(o.buffer)), stream(std::exchange(o.stream, nullptr)) {}
  StreamHeld& operator=(StreamHeld&&) = delete;
  ~StreamHeld() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
  }
};

// The per-system kernels (below): every system of the batch, each flagged on its own.
template <typename T>
absl::StatusOr<std::string> SolvePerSystem(const TridiagonalProblem<T>& p, const VariablePlan& plan,
                                           const std::byte* meta, TridiagonalMethod method, T* x,
                                           uint8_t* flags, Pool& pool, cudaStream_t stream);

// The batch as one block-diagonal system (kBlockDiagonalUnknowns), queued. Its answer stands
// where no flag the method reads was set (auto: every flag, the certificate's too; partitioned:
// a vanished pivot); otherwise the per-system kernels solve every system again. Who learns
// which: `later` (after the caller's wait for the stream, as thomas-window's own answer: no
// wait here, *again where the per-system kernels or the windows' second solve wrote x and the
// flags again), else this call, which waits for the one flag.
template <typename T>
absl::StatusOr<std::string> SolveBlockDiagonal(const TridiagonalProblem<T>& p,
                                               const VariablePlan& plan, const std::byte* meta,
                                               TridiagonalMethod method, T* x, uint8_t* flags,
                                               Pool& pool, cudaStream_t stream,
                                               LaterAnswer* later) {
  const int64_t total = p.offsets[p.batch];
  auto flag = pool.Get(16);
  if (!flag.ok()) return flag.status();
  auto* one_flag = static_cast<uint8_t*>(flag->get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(one_flag, 0, 1, stream));
  CutCouplingsKernel<T><<<dim3(unsigned(std::min<int64_t>((p.batch + 255) / 256, 4096))), 256, 0,
                          stream>>>(reinterpret_cast<const int64_t*>(meta), p.batch,
                                    const_cast<T*>(p.a), const_cast<T*>(p.c));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const TridiagonalProblem<T> one{1, total, Layout::kFlat, p.a, p.b, p.c, p.d};
  LaterAnswer windows;
  auto k = SolveTridiagonalDevice(one, method, x, one_flag, pool, stream,
                                  later != nullptr ? &windows : nullptr);
  if (!k.ok()) return k.status();
  const uint8_t stops =
      method == TridiagonalMethod::kAuto ? kFlagVanished | kFlagNotDominant : kFlagVanished;
  LaterAnswer::NamedRest rest = [flag = StreamHeld(*std::move(flag), stream), windows = std::move(windows),
                                 ran = *k, stops, p, &plan, meta, method, x, flags, &pool,
                                 stream](bool* again) mutable -> absl::StatusOr<std::string> {
    bool rewritten = false;
    if (windows.pending()) {
      auto r = windows.Finish(&rewritten);
      if (!r.ok()) return r.status();
      ran = *r;
    }
    uint8_t seen = 0;
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&seen, flag.buffer.get(), 1, cudaMemcpyDeviceToHost, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    *again = rewritten;
    if ((seen & stops) == 0) return std::string(KernelName(ran)) + " (block-diagonal)";
    *again = true;
    return SolvePerSystem(p, plan, meta, method, x, flags, pool, stream);
  };
  if (later != nullptr) {
    *later = LaterAnswer::Named(std::move(rest));
    return std::string(KernelName(*k)) + " (block-diagonal)";
  }
  bool again = false;
  return rest(&again);
}

template <typename T>
absl::StatusOr<std::string> SolveVariableDevice(const TridiagonalProblem<T>& p,
                                                const VariablePlan& plan, const std::byte* meta,
                                                TridiagonalMethod method, T* x, uint8_t* flags,
                                                Pool& pool, cudaStream_t stream,
                                                bool own_couplings, LaterAnswer* later) {
  if (own_couplings && !p.unified() && BlockDiagonalByShape(p.offsets[p.batch]))
    return SolveBlockDiagonal(p, plan, meta, method, x, flags, pool, stream, later);
  return SolvePerSystem(p, plan, meta, method, x, flags, pool, stream);
}

template <typename T>
absl::StatusOr<std::string> SolvePerSystem(const TridiagonalProblem<T>& p, const VariablePlan& plan,
                                           const std::byte* meta, TridiagonalMethod method, T* x,
                                           uint8_t* flags, Pool& pool, cudaStream_t stream) {
  std::string name = "partitioned-variable";
  if (plan.blocks > 0) {
    const bool aligned = Aligned16(p) && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    constexpr bool kLazy = sizeof(T) == 4;  // as the one-block kernel's float32 form
    auto kernel = p.unified() ? VariableOnChipKernel<kVariableChunk, T, kLazy, true>
                              : VariableOnChipKernel<kVariableChunk, T, kLazy, false>;
    const auto* table = reinterpret_cast<const int2*>(meta + plan.table_offset);
    for (int g = 0; g < 3; ++g) {
      if (plan.launch_blocks[g] == 0) continue;
      const int threads = kVariableThreads >> g;
      const size_t smem = sizeof(T) * 8 * size_t(threads);
      kernel<<<dim3(unsigned(plan.launch_blocks[g])), threads, smem, stream>>>(
          p.a, p.b, p.c, p.d, x, flags, reinterpret_cast<const int64_t*>(meta),
          reinterpret_cast<const int32_t*>(meta + plan.order_offset),
          table + plan.launch_first[g], aligned);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
  }
  // The streamed classes, largest first, one persistent launch a class.
  for (int lp = kMaxLog2P; lp >= plan.stream_from; --lp) {
    if (plan.class_count[lp] == 0) continue;
    // One system a block (P threads): several blocks an SM where they fit, as the uniform
    // streamed kernel's best form (one block of 256 threads and two systems an SM ran the
    // uniform 2048-row batch at 60% of the copy rate, against its 90%).
    const int P = 1 << lp, S = 1;
    auto smem_of = [&](int P) {
      const int rs = VariableSlotValues<T>(P * kVariableChunk);
      const int us = p.unified() ? VariableSlotValues<T>(3 * P * kVariableChunk) : rs;
      // (+128: the lead that puts the buffer on a 128-byte line)
      return 128 + sizeof(T) * (size_t(8) * S * P + size_t(S) * (p.unified() ? us + rs : 4 * rs));
    };
    const size_t smem = smem_of(P);
    constexpr bool kLazy = sizeof(T) == 4;
    auto kernel = p.unified() ? VariableStreamKernel<kVariableChunk, T, kLazy, true>
                              : VariableStreamKernel<kVariableChunk, T, kLazy, false>;
    static PerDevice resident[2][kMaxLog2P + 1];
    auto blocks = resident[p.unified()][lp].Get([&]() -> absl::StatusOr<int64_t> {
      LaunchConfig launch(0, P, smem, stream);
      auto r = ResidentGroups(kernel, launch);
      // The attribute is the kernel's, whatever the class: left at the largest class's need.
      if (auto st = AllowSharedBytes(kernel, smem_of(1 << kMaxLog2P)); !st.ok()) return st;
      return r;
    });
    if (!blocks.ok()) return blocks.status();
    if (*blocks < 1) return absl::InternalError("the streamed variable kernel fits no SM");
    const int64_t groups = plan.class_count[lp];
    kernel<<<dim3(unsigned(std::min(groups, *blocks))), P, smem, stream>>>(
        p.a, p.b, p.c, p.d, x, flags, reinterpret_cast<const int64_t*>(meta),
        reinterpret_cast<const int32_t*>(meta + plan.order_offset) + plan.class_first[lp],
        int(plan.class_count[lp]), p.offsets[p.batch], Aligned16(p),
        reinterpret_cast<uintptr_t>(x) % 16 == 0);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  for (int64_t s : plan.long_systems) {
    const int64_t o = p.offsets[s], n = p.offsets[s + 1] - o;
    TridiagonalProblem<T> one{1, n, Layout::kFlat, p.a + o, p.b + o, p.c + o, p.d + o};
    // Unified: the system's a, b, c split into arrays of their own on the device first (one
    // more pass over its rows), for the uniform kernels.
    std::optional<Pool::Buffer> split;
    if (p.unified()) {
      auto buf = pool.Get(3 * n * int64_t(sizeof(T)));
      if (!buf.ok()) return buf.status();
      split.emplace(*std::move(buf));
      T* sa = static_cast<T*>(split->get());
      SplitUnifiedKernel<T><<<dim3(unsigned(std::min<int64_t>((n + 255) / 256, 4096))), 256, 0,
                              stream>>>(p.a + 3 * o, n, sa, sa + n, sa + 2 * n);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      one.a = sa;
      one.b = sa + n;
      one.c = sa + 2 * n;
    }
    auto k = SolveTridiagonalDevice(one, method, x + o, flags + s, pool, stream);
    if (!k.ok()) return k.status();
    // The split arrays go back to the pool once the solve has read them.
    if (split) TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (plan.blocks == 0 && s == plan.long_systems.front()) name = KernelName(*k);
  }
  if (!plan.long_systems.empty() && plan.blocks > 0) name += " + long systems";
  return name;
}

template absl::StatusOr<std::string> SolveVariableDevice(const TridiagonalProblem<double>&,
                                                         const VariablePlan&, const std::byte*,
                                                         TridiagonalMethod, double*, uint8_t*,
                                                         Pool&, cudaStream_t, bool,
                                                         LaterAnswer*);
template absl::StatusOr<std::string> SolveVariableDevice(const TridiagonalProblem<float>&,
                                                         const VariablePlan&, const std::byte*,
                                                         TridiagonalMethod, float*, uint8_t*,
                                                         Pool&, cudaStream_t, bool,
                                                         LaterAnswer*);

}  // namespace trisolve::cuda
