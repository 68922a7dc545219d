// Variable-size tridiagonal batches on the device (variable.h).
#include "tridiagonal/variable.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "common/numerics.cuh"
#include "runtime/check.h"
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
  bool ok = ChunkReduce<M>(ra, rb, rc, rd);
  T x0, xl;
  ok &= SolveReducedBlock<false, kLazyPcr, true>(sa, sl, j, P, S, ra[0], rc[0], rd[0],
                                                 ra[M - 1], rc[M - 1], rd[M - 1], x0, xl);
  ChunkBack<M>(ra, rc, rd, x0, xl);
#pragma unroll
  for (int i = 0; i < M; ++i) ok &= Finite(rd[i]);
  if (!ok) atomicOr(&bad[sl], 1);
  if (n > 0) StoreRowsDirect<M>(x + o, int64_t(j) * M, n, vec, rd);
  __syncthreads();
  if (tid < count && bad[tid]) flags[__ldg(order + blk.x + tid)] = 1;
}

}  // namespace

VariablePlan PlanVariable(const int64_t* offsets, int64_t batch) {
  VariablePlan plan;
  plan.batch = batch;
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
      if (VariableBlockThreads(lp) != (kVariableThreads >> g)) continue;
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

template <typename T>
absl::StatusOr<std::string> SolveVariableDevice(const TridiagonalProblem<T>& p,
                                                const VariablePlan& plan, const std::byte* meta,
                                                TridiagonalMethod method, T* x, uint8_t* flags,
                                                Pool& pool, cudaStream_t stream) {
  std::string name = "partitioned-variable";
  if (plan.blocks > 0) {
    // Unified: abc (p.a) and d; b and c point one and two values into abc.
    bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const T* const arrays[4] = {p.a, p.b, p.c, p.d};
    for (int q = 0; q < 4; ++q)
      if (!p.unified() || q == 0 || q == 3)
        aligned &= reinterpret_cast<uintptr_t>(arrays[q]) % 16 == 0;
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
                                                         Pool&, cudaStream_t);
template absl::StatusOr<std::string> SolveVariableDevice(const TridiagonalProblem<float>&,
                                                         const VariablePlan&, const std::byte*,
                                                         TridiagonalMethod, float*, uint8_t*,
                                                         Pool&, cudaStream_t);

}  // namespace trisolve::cuda
