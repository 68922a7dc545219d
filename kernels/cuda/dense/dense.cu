// Batched small dense systems: Gauss-Jordan with partial pivoting, one warp a system.
#include <cfloat>
#include <algorithm>
#include <limits>

#include "runtime/check.h"
#include "runtime/launch.h"
#include "common/numerics.cuh"
#include "dense/dense.h"
#include "dense/factors.h"

namespace trisolve::cuda {
namespace {

template <typename T>
__device__ __forceinline__ T DenseEps() { return sizeof(T) == 8 ? T(DBL_EPSILON) : T(FLT_EPSILON); }

// Gauss-Jordan with the pivot row shared through shared memory (not shuffles), and the
// elimination done above the pivot as well as below at each step (the classic Gauss-Jordan: a
// row already used as a pivot row costs its lane nothing extra, since every lane updates its
// own row anyway, and it removes the back-substitution phase). W lanes a system, lane j holding
// row j of [A | b] in registers (b at index W); W <= 32: 32 / W systems a warp, the arg-max by
// shuffles of width W; W = 64: two warps a system, the two warps' arg-maxes exchanged through
// shared memory. Per step k: the arg-max over the rows not yet used (one 64-bit key a lane; ties
// to the lower lane), the pivot lane writes its row divided by the pivot into shared memory,
// every other lane subtracts row[k] times it, from k's chunk of columns on (W <= 32: the steps
// unrolled, chunks of 2; W = 64: a loop over k, chunks of 8, so that register indices stay
// compile-time constants; columns left of k are never read again). Pivoting is implicit: rows
// stay in their lanes, each lane records the step at which its row was the pivot row, and x
// comes out in that order (no row exchanges). A vanishing pivot flags the system.
template <int W>
struct RowsShape {
  static constexpr int kThreads = W <= 32 ? 128 : 64;  // a block
  static constexpr int kSystems = kThreads / W;        // systems a block
  static constexpr int kPitch = W + 2;                 // even: 16-byte aligned rows of doubles
  // Blocks an SM, for the register budget (W = 64: 65 doubles a thread, 6 blocks = 12 warps).
  static constexpr int kMinBlocks = W <= 32 ? 4 : 6;
};

template <int W>
__device__ __forceinline__ void GroupSync() {
  if constexpr (W <= 32) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

template <typename T>
struct Pair;
template <>
struct Pair<double> {
  using type = double2;
  __device__ static double2 Make(double a, double b) { return make_double2(a, b); }
};
template <>
struct Pair<float> {
  using type = float2;
  __device__ static float2 Make(float a, float b) { return make_float2(a, b); }
};

// row[k] for a k the same in every lane: a branch to k's chunk of 8, then 8 selects.
template <typename T, int W>
__device__ __forceinline__ T Pick(const T (&row)[W + 1], int k) {
  T r = T(0);
#pragma unroll
  for (int c0 = 0; c0 < W; c0 += 8)
    if (k >= c0 && k < c0 + 8) {
#pragma unroll
      for (int t = 0; t < 8; ++t)
        if (c0 + t == k) r = row[c0 + t];
    }
  return r;
}

// kRecord: the elimination of A alone, recorded (Factors below), b neither read nor solved.
template <typename T>
struct Record {
  T* mult = nullptr;            // [batch][n steps][n rows]
  uint8_t* pivot_row = nullptr;  // [batch][n]
};

template <typename T, int W, bool kRecord = false>
__global__ void __launch_bounds__(RowsShape<W>::kThreads, RowsShape<W>::kMinBlocks)
    GaussJordanRowsKernel(DenseProblem<T> p, T* __restrict__ x, uint8_t* __restrict__ flags,
                          Record<T> rec = {}) {
  using S = RowsShape<W>;
  constexpr int kWidth = W < 32 ? W : 32;  // the shuffles' width
  __shared__ __align__(16) T prow[2][S::kSystems][S::kPitch];
  __shared__ T colmax_s[S::kSystems][W];
  __shared__ uint64_t cand[2][2];  // W = 64: the two warps' arg-max keys, by step parity
  const int j = threadIdx.x % W, g = threadIdx.x / W;
  const int64_t s = int64_t(blockIdx.x) * S::kSystems + g;
  const int n = int(p.n);
  const unsigned full = 0xffffffffu;
  const bool valid = s < p.batch;  // every lane keeps to the barriers; invalid ones write nothing
  const bool live = valid && j < n;
  const T tmax = sizeof(T) == 8 ? T(DBL_MAX) : T(FLT_MAX);
  const T* A = p.A + (valid ? s : 0) * p.n * p.n;
  T row[W + 1];
#pragma unroll
  for (int c = 0; c < W; ++c) row[c] = (live && c < n) ? __ldg(A + j * p.n + c) : T(0);
  row[W] = (live && !kRecord) ? __ldg(p.b + s * p.n + j) : T(0);
  // Column j's largest magnitude (lane j reads column j: coalesced, and in cache).
  {
    T m = T(0);
    if (live)
      for (int r = 0; r < n; ++r) m = fmax(m, fabs(__ldg(A + r * p.n + j)));
    colmax_s[g][j] = m;
  }
  GroupSync<W>();
  bool ok = true, used = false;
  int my_step = 0;
  // W <= 32: the steps unrolled (k a constant: row[k] and the first column a plain register);
  // W = 64: a loop, the columns in chunks of 8 (a uniform branch a chunk).
  constexpr int kUnroll = W <= 32 ? W : 1;
  constexpr int kChunk = W <= 32 ? 2 : 8;
#pragma unroll kUnroll
  for (int k = 0; k < W; ++k) {
    if (k >= n) break;
    // A_k: the pivot among the rows not yet used, as one 64-bit key a lane: |row[k]| (its
    // six lowest bits dropped in float64: ties within 2^-46 go to the lower lane) above the
    // lane's index, so that one max-reduction picks it; a used or empty row has key 0.
    const T mk = Pick<T, W>(row, k);  // also the multiplier: the pivot row is divided by pv
    const T v = fabs(mk);
    uint64_t key = 0;
    if (live && !used) {
      const uint64_t bits = sizeof(T) == 8 ? (uint64_t(__double_as_longlong(double(v))) >> 6)
                                           : uint64_t(__float_as_uint(float(v)));
      key = ((bits + 1) << 6) | uint64_t(63 - j);
    }
#pragma unroll
    for (int o = kWidth / 2; o > 0; o >>= 1) {
      const uint64_t other = __shfl_xor_sync(full, key, o, kWidth);
      key = other > key ? other : key;
    }
    if constexpr (W > 32) {
      if ((threadIdx.x & 31) == 0) cand[k & 1][threadIdx.x >> 5] = key;
      __syncthreads();
      const uint64_t k0 = cand[k & 1][0], k1 = cand[k & 1][1];
      key = k1 > k0 ? k1 : k0;
    }
    const bool pivot_lane = j == 63 - int(key & 63);
    const T* pr = prow[k & 1][g];
    if (pivot_lane) {
      // The pivot row divided by the pivot (task E), into shared memory: whole chunks from
      // k's chunk on (the columns left of k are never read again; whatever they hold).
      ok &= v <= tmax && !(v <= DenseEps<T>() * T(n) * colmax_s[g][k]);
      const T inv = T(1) / mk;
      if constexpr (kRecord) {
        rec.mult[(s * p.n + k) * p.n + j] = inv;
        rec.pivot_row[s * p.n + k] = uint8_t(j);
      }
      T* pw = prow[k & 1][g];
#pragma unroll
      for (int c0 = 0; c0 <= W; c0 += kChunk)
        if (c0 + kChunk > k) {
#pragma unroll
          for (int c = c0; c < c0 + kChunk && c <= W; ++c) row[c] *= inv;
#pragma unroll
          for (int c = c0; c < c0 + kChunk && c <= W; c += 2) {
            if (c + 1 <= W)
              *reinterpret_cast<typename Pair<T>::type*>(pw + c) = Pair<T>::Make(row[c], row[c + 1]);
            else
              pw[c] = row[c];
          }
        }
      used = true;
      my_step = k;
    }
    GroupSync<W>();
    if (!pivot_lane) {
      if constexpr (kRecord)
        if (live) rec.mult[(s * p.n + k) * p.n + j] = mk;
      // C, D, F: every other row, used or not, subtracts row[k] times the pivot row.
#pragma unroll
      for (int c0 = 0; c0 <= W; c0 += kChunk)
        if (c0 + kChunk > k) {
#pragma unroll
          for (int c = c0; c < c0 + kChunk && c <= W; c += 2) {
            if (c + 1 <= W) {
              const auto q = *reinterpret_cast<const typename Pair<T>::type*>(pr + c);
              row[c] -= mk * q.x;
              row[c + 1] -= mk * q.y;
            } else {
              row[c] -= mk * pr[c];
            }
          }
        }
    }
  }
  ok &= fabs(row[W]) <= tmax;
  if (live && !kRecord) x[s * p.n + my_step] = row[W];
  // A system is flagged when one of its pivot lanes saw a vanishing pivot, or an x is not
  // finite.
  if constexpr (W <= 32) {
    const unsigned bad = __ballot_sync(full, live && !ok);
    const int lane = threadIdx.x & 31, gw = lane / W;
    const unsigned group = (W == 32 ? full : ((1u << W) - 1u)) << (gw * W);
    if (valid && j == 0 && (bad & group)) flags[s] = 1;
  } else {
    if (__syncthreads_or(live && !ok) && threadIdx.x == 0 && valid) flags[s] = 1;
  }
}

// 64 < n <= 128: "gauss-jordan-block", one block of 256 threads a system, two threads a row:
// thread t holds row t % 128, columns 64 (t / 128) .. +63 of [A | b] in registers, the upper half
// also b (column 128). The halves are whole warps, so every branch on the half is uniform. Per
// step k: the half owning column k has the multiplier row[k]; it forms the arg-max keys (as in
// the rows kernel) and shares row[k] with the other half through shared memory; barrier; the
// pivot row's two threads write it divided by the pivot; barrier; every other row subtracts
// row[k] times it, each half on its own columns from k's chunk on. Two barriers a step.
constexpr int kBlockGjThreads = 256;
template <typename T, bool kRecord = false>
__global__ void __launch_bounds__(kBlockGjThreads, 1)
    GaussJordanBlockKernel(DenseProblem<T> p, T* __restrict__ x, uint8_t* __restrict__ flags,
                           Record<T> rec = {}) {
  constexpr int kHalf = 64, kRows = 128;
  __shared__ __align__(16) T prow[2][kRows + 2];
  __shared__ T mk_s[2][kRows];
  __shared__ T colmax_s[kRows];
  __shared__ uint64_t cand[2][4];
  const int t = threadIdx.x, h = t / kRows, j = t % kRows;
  const int64_t s = blockIdx.x;
  const int n = int(p.n);
  const bool live = j < n;
  const T tmax = sizeof(T) == 8 ? T(DBL_MAX) : T(FLT_MAX);
  const T* A = p.A + s * p.n * p.n;
  T row[kHalf + 1];
#pragma unroll
  for (int c = 0; c < kHalf; ++c) {
    const int gc = h * kHalf + c;
    row[c] = (live && gc < n) ? __ldg(A + j * p.n + gc) : T(0);
  }
  row[kHalf] = (live && h == 1 && !kRecord) ? __ldg(p.b + s * p.n + j) : T(0);
  if (t < kRows) {  // column t's largest magnitude: coalesced reads
    T m = T(0);
    if (t < n)
      for (int r = 0; r < n; ++r) m = fmax(m, fabs(__ldg(A + r * p.n + t)));
    colmax_s[t] = m;
  }
  bool ok = true, used = false;
  int my_step = 0;
  for (int k = 0; k < n; ++k) {
    const int owner = k / kHalf;
    T mk = T(0);
    if (h == owner) {
      mk = Pick<T, kHalf>(row, k % kHalf);
      mk_s[k & 1][j] = mk;
      uint64_t key = 0;
      if (live && !used) {
        const T v = fabs(mk);
        const uint64_t bits = sizeof(T) == 8 ? (uint64_t(__double_as_longlong(double(v))) >> 6)
                                             : uint64_t(__float_as_uint(float(v)));
        key = ((bits + 1) << 7) | uint64_t(kRows - 1 - j);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint64_t other = __shfl_xor_sync(0xffffffffu, key, o);
        key = other > key ? other : key;
      }
      if ((t & 31) == 0) cand[k & 1][(t % kRows) / 32] = key;
    }
    __syncthreads();
    if (h != owner) mk = mk_s[k & 1][j];
    uint64_t best = cand[k & 1][0];
#pragma unroll
    for (int w = 1; w < 4; ++w) best = cand[k & 1][w] > best ? cand[k & 1][w] : best;
    const bool pivot_row = j == kRows - 1 - int(best & (kRows - 1));
    if (pivot_row) {
      const T v = fabs(mk);
      ok &= v <= tmax && !(v <= DenseEps<T>() * T(n) * colmax_s[k]);
      const T inv = T(1) / mk;
      if constexpr (kRecord)
        if (h == 0) {
          rec.mult[(s * p.n + k) * p.n + j] = inv;
          rec.pivot_row[s * p.n + k] = uint8_t(j);
        }
      T* pw = prow[k & 1] + h * kHalf;
#pragma unroll
      for (int c0 = 0; c0 <= kHalf; c0 += 8)
        if (h * kHalf + c0 + 8 > k) {
#pragma unroll
          for (int c = c0; c < c0 + 8 && c <= kHalf; ++c)
            if (c < kHalf || h == 1) {  // the lower half's slot kHalf is not a column
              row[c] *= inv;
              pw[c] = row[c];
            }
        }
      used = true;
      my_step = k;
    }
    __syncthreads();
    if (!pivot_row) {
      if constexpr (kRecord)
        if (live && h == 0) rec.mult[(s * p.n + k) * p.n + j] = mk;
      const T* pr = prow[k & 1] + h * kHalf;
#pragma unroll
      for (int c0 = 0; c0 <= kHalf; c0 += 8)
        if (h * kHalf + c0 + 8 > k) {
#pragma unroll
          for (int c = c0; c < c0 + 8 && c <= kHalf; c += 2) {
            if (c + 1 <= kHalf) {
              const auto q = *reinterpret_cast<const typename Pair<T>::type*>(pr + c);
              row[c] -= mk * q.x;
              row[c + 1] -= mk * q.y;
            } else {
              row[c] -= mk * pr[c];
            }
          }
        }
    }
  }
  if (live && h == 1 && !kRecord) {
    ok &= fabs(row[kHalf]) <= tmax;
    x[s * p.n + my_step] = row[kHalf];
  }
  if (__syncthreads_or(live && !ok) && t == 0) flags[s] = 1;
}

template <typename T, int W, bool kRecord = false>
absl::Status LaunchRows(const DenseProblem<T>& p, T* x, uint8_t* flags, cudaStream_t stream,
                        Record<T> rec = {}) {
  using S = RowsShape<W>;
  const unsigned blocks = unsigned((p.batch + S::kSystems - 1) / S::kSystems);
  GaussJordanRowsKernel<T, W, kRecord><<<blocks, S::kThreads, 0, stream>>>(p, x, flags, rec);
  return CudaStatus(cudaGetLastError(), "GaussJordanRowsKernel launch");
}

// The recorded elimination applied to b alone: at step k the pivot row's value times its slot
// (1 / pivot), then every other row less its multiplier times that value -- the operations the
// kernels above apply to b's column, in the same order and form, so that x is theirs bit for
// bit. W lanes a system (W <= 32: 128 / W systems a block, the pivot's value by a shuffle of
// width W; W = 64, 128: one block a system, the value through shared memory, a slot a step so
// that one barrier a step suffices). The multipliers of step k are n consecutive values:
// coalesced, read once. Systems q = j * batch + s: k right-hand sides of the same factors.
template <int W>
struct ReplayShape {
  static constexpr int kThreads = W <= 32 ? 128 : W;
  static constexpr int kSystems = kThreads / W;
};

template <typename T, int W>
__global__ void __launch_bounds__(ReplayShape<W>::kThreads)
    GaussJordanReplayKernel(int64_t batch, int n, const T* __restrict__ mult,
                            const uint8_t* __restrict__ pivot_row,
                            const uint8_t* __restrict__ factor_flags, const T* __restrict__ b,
                            T* __restrict__ x, uint8_t* __restrict__ flags) {
  using S = ReplayShape<W>;
  constexpr int kWidth = W < 32 ? W : 32;
  __shared__ T bcast[W > 32 ? W : 1];
  __shared__ uint8_t piv_s[S::kSystems][W];
  const int j = threadIdx.x % W, g = threadIdx.x / W;
  const int64_t s0 = int64_t(blockIdx.x) * S::kSystems + g;  // the system; blockIdx.y: its rhs
  const bool valid = s0 < batch;
  const int64_t s = valid ? s0 : 0, q = int64_t(blockIdx.y) * batch + s;
  const bool live = valid && j < n;
  const T tmax = sizeof(T) == 8 ? T(DBL_MAX) : T(FLT_MAX);
  piv_s[g][j] = live ? pivot_row[s * n + j] : uint8_t(0);
  T v = live ? __ldg(b + q * n + j) : T(0);
  const T* m = mult + s * int64_t(n) * n;
  GroupSync<W>();
  int my_step = 0;
#pragma unroll 8
  for (int k = 0; k < n; ++k) {
    const int pk = piv_s[g][k];
    const T mk = live ? __ldg(m + int64_t(k) * n + j) : T(0);
    const bool pivot = j == pk;
    if (pivot) {
      v *= mk;
      my_step = k;
    }
    T vp;
    if constexpr (W <= 32) {
      vp = __shfl_sync(0xffffffffu, v, pk, kWidth);
    } else {
      if (pivot) bcast[k] = v;
      __syncthreads();
      vp = bcast[k];
    }
    if (!pivot) v -= mk * vp;
  }
  const bool ok = !live || fabs(v) <= tmax;
  if (live) x[q * n + my_step] = v;
  const bool factor_bad = valid && factor_flags[s] != 0;
  if constexpr (W <= 32) {
    const unsigned bad = __ballot_sync(0xffffffffu, !ok || factor_bad);
    const int lane = threadIdx.x & 31, gw = lane / W;
    const unsigned group = (W == 32 ? 0xffffffffu : ((1u << W) - 1u)) << (gw * W);
    if (valid && j == 0 && (bad & group)) flags[q] = 1;
  } else {
    if (__syncthreads_or(!ok || factor_bad) && threadIdx.x == 0 && valid) flags[q] = 1;
  }
}

template <typename T, int W>
absl::Status LaunchReplay(const DenseFactorsDevice<T>& f, int64_t systems, const T* b, T* x,
                          uint8_t* flags, cudaStream_t stream) {
  using S = ReplayShape<W>;
  const int64_t blocks = (f.batch + S::kSystems - 1) / S::kSystems;
  if (blocks > int64_t(std::numeric_limits<int>::max()))
    return absl::InvalidArgumentError("too many systems for one launch");
  const int64_t k = systems / f.batch, per_launch = 65535;  // right-hand sides: gridDim.y
  for (int64_t j0 = 0; j0 < k; j0 += per_launch) {
    const int64_t at = j0 * f.batch * f.n;
    GaussJordanReplayKernel<T, W>
        <<<dim3(unsigned(blocks), unsigned(std::min(per_launch, k - j0))), S::kThreads, 0,
           stream>>>(f.batch, int(f.n), f.values, f.pivot_row, f.flags, b + at, x + at,
                     flags + j0 * f.batch);
    if (auto st = CudaStatus(cudaGetLastError(), "GaussJordanReplayKernel launch"); !st.ok())
      return st;
  }
  return absl::OkStatus();
}

const char* GaussJordanName(int64_t n) {
  return n <= kDenseWarpMaxN ? "gauss-jordan-warp"
         : n <= kDenseTwoWarpsMaxN ? "gauss-jordan-2warps"
                                   : "gauss-jordan-block";
}

}  // namespace

template <typename T>
absl::Status FactorDenseGaussJordanDevice(const DenseProblem<T>& p, DenseFactorsDevice<T>& f,
                                          cudaStream_t stream) {
  if (p.n > kDenseGpuMaxN || f.kind != DenseFactorsKind::kGaussJordan)
    return absl::InvalidArgumentError("the kept GPU Gauss-Jordan takes n <= 128");
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(f.flags, 0, size_t(p.batch), stream));
  const Record<T> rec{f.values, f.pivot_row};
  f.name = GaussJordanName(p.n);
  if (p.n <= 8) return LaunchRows<T, 8, true>(p, nullptr, f.flags, stream, rec);
  if (p.n <= 16) return LaunchRows<T, 16, true>(p, nullptr, f.flags, stream, rec);
  if (p.n <= 32) return LaunchRows<T, 32, true>(p, nullptr, f.flags, stream, rec);
  if (p.n <= 64) return LaunchRows<T, 64, true>(p, nullptr, f.flags, stream, rec);
  GaussJordanBlockKernel<T, true>
      <<<unsigned(p.batch), kBlockGjThreads, 0, stream>>>(p, nullptr, f.flags, rec);
  return CudaStatus(cudaGetLastError(), "GaussJordanBlockKernel launch");
}

template <typename T>
absl::Status SolveDenseGaussJordanFactoredDevice(const DenseFactorsDevice<T>& f, int64_t k,
                                                 const T* b, T* x, uint8_t* flags,
                                                 cudaStream_t stream) {
  const int64_t systems = k * f.batch;
  if (systems == 0) return absl::OkStatus();
  if (f.n <= 8) return LaunchReplay<T, 8>(f, systems, b, x, flags, stream);
  if (f.n <= 16) return LaunchReplay<T, 16>(f, systems, b, x, flags, stream);
  if (f.n <= 32) return LaunchReplay<T, 32>(f, systems, b, x, flags, stream);
  if (f.n <= 64) return LaunchReplay<T, 64>(f, systems, b, x, flags, stream);
  if (f.n <= 128) return LaunchReplay<T, 128>(f, systems, b, x, flags, stream);
  return absl::InvalidArgumentError("the kept GPU Gauss-Jordan takes n <= 128");
}

template absl::Status FactorDenseGaussJordanDevice(const DenseProblem<double>&,
                                                   DenseFactorsDevice<double>&, cudaStream_t);
template absl::Status FactorDenseGaussJordanDevice(const DenseProblem<float>&,
                                                   DenseFactorsDevice<float>&, cudaStream_t);
template absl::Status SolveDenseGaussJordanFactoredDevice(const DenseFactorsDevice<double>&,
                                                          int64_t, const double*, double*,
                                                          uint8_t*, cudaStream_t);
template absl::Status SolveDenseGaussJordanFactoredDevice(const DenseFactorsDevice<float>&,
                                                          int64_t, const float*, float*,
                                                          uint8_t*, cudaStream_t);

template <typename T>
absl::Status SolveDenseWarpDevice(const DenseProblem<T>& p, T* x, uint8_t* flags,
                                  cudaStream_t stream) {
  if (p.n <= 8) return LaunchRows<T, 8>(p, x, flags, stream);
  if (p.n <= 16) return LaunchRows<T, 16>(p, x, flags, stream);
  if (p.n <= 32) return LaunchRows<T, 32>(p, x, flags, stream);
  if (p.n <= 64) return LaunchRows<T, 64>(p, x, flags, stream);
  if (p.n <= 128) {
    GaussJordanBlockKernel<T><<<unsigned(p.batch), kBlockGjThreads, 0, stream>>>(p, x, flags);
    return CudaStatus(cudaGetLastError(), "GaussJordanBlockKernel launch");
  }
  return absl::InvalidArgumentError("the batched GPU Gauss-Jordan takes n <= 128");
}

namespace {

// Householder + PCR for a batch of small symmetric systems: one block a system, thread i owns
// row i (the notes' mapping), W = A and the reflectors (row k of V holds u_k) in shared
// memory. The steps are the CPU reference's HouseholderPcrOne; sums are block reductions.
constexpr int kHhThreads = 64;

template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // red may still be read from the previous sum
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  return red[0] + red[1];
}

template <typename T>
__global__ void __launch_bounds__(kHhThreads)
    HouseholderPcrBlockKernel(DenseProblem<T> p, T* __restrict__ x, uint8_t* __restrict__ flags) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int n = int(p.n), i = threadIdx.x;
  T* W = reinterpret_cast<T*>(smem_raw);  // n x n
  T* V = W + n * n;                       // n x n
  T* H = V + n * n;                       // n
  T* u = H + n;                           // n: the current reflector
  T* pq = u + n;                          // n: p, then q
  T* xs = pq + n;                         // n: b, Q^T b, y, x
  T* A = xs + n;                          // PCR: 4 n and 4 n
  T* B = A + n;
  T* C = B + n;
  T* D = C + n;
  T* A2 = D + n;
  T* B2 = A2 + n;
  T* C2 = B2 + n;
  T* D2 = C2 + n;
  __shared__ T red[2];
  const int64_t s = blockIdx.x;
  const T* As = p.A + s * p.n * p.n;
  for (int e = i; e < n * n; e += blockDim.x) {
    W[e] = As[e];
    V[e] = T(0);
  }
  if (i < n) xs[i] = p.b[s * p.n + i];
  __syncthreads();
  for (int k = 0; k + 2 < n; ++k) {
    const T wik = (i > k && i < n) ? W[i * n + k] : T(0);
    const T sigma = BlockSum(wik * wik, red);
    if (sigma == T(0)) {  // every thread sees the same sum
      if (i == 0) H[k] = T(0);
      __syncthreads();
      continue;
    }
    const T x0 = W[(k + 1) * n + k];
    const T g = x0 >= T(0) ? sqrt(sigma) : -sqrt(sigma);
    const T h = sigma + x0 * g;
    if (i < n) u[i] = i > k ? wik + (i == k + 1 ? g : T(0)) : T(0);
    if (i == 0) H[k] = h;
    __syncthreads();
    T pi = T(0);
    if (i >= k && i < n) {
      T acc = T(0);
      for (int j = k + 1; j < n; ++j) acc += W[i * n + j] * u[j];
      pi = acc / h;
    }
    const T K = BlockSum((i >= k && i < n) ? u[i] * pi : T(0), red) / (T(2) * h);
    if (i < n) {
      pq[i] = i >= k ? pi - K * u[i] : T(0);
      V[k * n + i] = u[i];
    }
    __syncthreads();
    if (i >= k && i < n)
      for (int j = k; j < n; ++j) W[i * n + j] -= pq[i] * u[j] + u[i] * pq[j];
    __syncthreads();
  }
  // v <- Q T^-1 Q^T v, as the CPU reference: Q^T v (P_0 first), PCR on T (the reduced W's three
  // diagonals, as the CPU's PcrStrided), Q y (the last reflector first).
  auto apply = [&](int k, T* v) {
    if (H[k] == T(0)) return;  // uniform across the block
    const T* uk = V + k * n;
    const T dot = BlockSum((i > k && i < n) ? uk[i] * v[i] : T(0), red);
    const T f = dot / H[k];
    if (i > k && i < n) v[i] -= f * uk[i];
    __syncthreads();
  };
  bool ok = true;
  auto solve = [&](T* v) {
    for (int k = 0; k + 2 < n; ++k) apply(k, v);
    if (i < n) {
      A[i] = i > 0 ? W[i * n + i - 1] : T(0);
      B[i] = W[i * n + i];
      C[i] = i + 1 < n ? W[i * n + i + 1] : T(0);
      D[i] = v[i];
    }
    __syncthreads();
    for (int stride = 1; stride < n; stride *= 2) {
      if (i < n) {
        const int il = i - stride, ir = i + stride;
        ok &= PcrCombine<false>(A, B, C, D, i, il >= 0, il, ir < n, ir, [](int r) { return r; },
                                A2[i], B2[i], C2[i], D2[i]);
      }
      __syncthreads();
      if (i < n) {
        A[i] = A2[i];
        B[i] = B2[i];
        C[i] = C2[i];
        D[i] = D2[i];
      }
      __syncthreads();
    }
    if (i < n) {
      ok &= !Vanishes(B[i], fabs(B[i]));
      v[i] = D[i] / B[i];
    }
    __syncthreads();
    for (int k = n - 3; k >= 0; --k) apply(k, v);
  };
  solve(xs);
  // One step of iterative refinement with the same reduction, as the CPU reference:
  // r = b - A x (row i by thread i, from the original arrays), x += Q T^-1 Q^T r.
  if (i < n) {
    T acc = T(0);
    for (int j = 0; j < n; ++j) acc += As[i * n + j] * xs[j];
    pq[i] = p.b[s * p.n + i] - acc;
  }
  __syncthreads();
  solve(pq);
  if (i < n) {
    const T v = xs[i] + pq[i];
    ok &= Finite(v);
    x[s * p.n + i] = v;
  }
  if (!ok) flags[s] = 1;
}

}  // namespace

template <typename T>
absl::Status SolveDenseHouseholderPcrBlockDevice(const DenseProblem<T>& p, T* x, uint8_t* flags,
                                                 cudaStream_t stream) {
  if (p.n > kHhThreads)
    return absl::InvalidArgumentError("the batched householder-pcr kernel takes n <= 64");
  const size_t smem = sizeof(T) * (2 * size_t(p.n) * p.n + 12 * size_t(p.n));
  if (auto st = AllowSharedBytes(HouseholderPcrBlockKernel<T>, smem); !st.ok()) return st;
  for (int64_t s0 = 0; s0 < p.batch; s0 += int64_t(1) << 30) {
    DenseProblem<T> q{std::min<int64_t>(p.batch - s0, int64_t(1) << 30), p.n,
                      p.A + s0 * p.n * p.n, p.b + s0 * p.n};
    HouseholderPcrBlockKernel<T><<<unsigned(q.batch), kHhThreads, smem, stream>>>(
        q, x + s0 * p.n, flags + s0);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}
template absl::Status SolveDenseHouseholderPcrBlockDevice(const DenseProblem<double>&, double*,
                                                          uint8_t*, cudaStream_t);
template absl::Status SolveDenseHouseholderPcrBlockDevice(const DenseProblem<float>&, float*,
                                                          uint8_t*, cudaStream_t);

template absl::Status SolveDenseWarpDevice(const DenseProblem<double>&, double*, uint8_t*,
                                           cudaStream_t);
template absl::Status SolveDenseWarpDevice(const DenseProblem<float>&, float*, uint8_t*,
                                           cudaStream_t);

}  // namespace trisolve::cuda
