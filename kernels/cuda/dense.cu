// Batched small dense systems: Gauss-Jordan with partial pivoting, one warp a system.
#include <cfloat>

#include "check.h"
#include "dense_cuda.h"

namespace trisolve::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

template <typename T>
__device__ __forceinline__ T DenseEps() { return sizeof(T) == 8 ? T(DBL_EPSILON) : T(FLT_EPSILON); }

// A warp holds 32 / W systems of order n <= W, one per group of W lanes; lane j of a group holds
// row j of [A | b]. Pivoting is implicit: rows stay in their lanes, each lane records the step at
// which its row became the pivot row, and x comes out in that order. That saves the row
// exchanges' shuffles (half of them).
template <typename T, int W>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    GaussJordanWarpKernel(DenseProblem<T> p, T* __restrict__ x, uint8_t* __restrict__ flags) {
  constexpr int G = 32 / W;  // systems a warp
  __shared__ T colmax_s[kWarpsPerBlock][32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int j = lane % W, g = lane / W;
  const int64_t s = (int64_t(blockIdx.x) * kWarpsPerBlock + w) * G + g;
  const int n = int(p.n);
  const unsigned full = 0xffffffffu;
  const bool valid = s < p.batch;  // every lane keeps shuffling; invalid groups write nothing
  const bool live = valid && j < n;
  const T tmax = sizeof(T) == 8 ? T(DBL_MAX) : T(FLT_MAX);
  T row[W];
  T bb = T(0);
  const T* A = p.A + (valid ? s : 0) * p.n * p.n;
#pragma unroll
  for (int c = 0; c < W; ++c) row[c] = (live && c < n) ? __ldg(A + j * p.n + c) : T(0);
  if (live) bb = __ldg(p.b + s * p.n + j);
  // The largest magnitude of each column of A: the scale a pivot is judged against.
#pragma unroll
  for (int c = 0; c < W; ++c) {
    T m = fabs(row[c]);
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(full, m, o, W));
    if (j == 0) colmax_s[w][g * W + c] = m;
  }
  __syncwarp();
  bool ok = true;
  int my_step = W;  // the step at which this lane's row was the pivot row
  int piv_of[W];    // the lane (within the group) chosen at each step
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if (k >= n) break;
    // A_k: the pivot, an arg-max of |row[k]| over the rows not yet used (ties: lower lane).
    T v = (live && my_step == W) ? fabs(row[k]) : T(-1);
    int idx = j;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
      const T ov = __shfl_xor_sync(full, v, o, W);
      const int oi = __shfl_xor_sync(full, idx, o, W);
      if (ov > v || (ov == v && oi < idx)) {
        v = ov;
        idx = oi;
      }
    }
    const int piv = idx;
    piv_of[k] = piv;
    const T pv = __shfl_sync(full, row[k], piv, W);
    ok &= fabs(pv) <= tmax && !(fabs(pv) <= DenseEps<T>() * T(n) * colmax_s[w][g * W + k]);
    // C, D, F: the rows not yet used subtract (row[k] / pv) times the pivot row;
    // E: the pivot row is normalised.
    const bool pivot_lane = j == piv;
    const bool below = live && my_step == W && !pivot_lane;
    const T m = below ? row[k] / pv : T(0);
    const T inv = T(1) / pv;
#pragma unroll
    for (int c = 0; c < W; ++c) {
      if (c >= k) {
        const T pk = __shfl_sync(full, row[c], piv, W);
        if (below) row[c] -= m * pk;
        if (pivot_lane) row[c] *= inv;
      }
    }
    const T pb = __shfl_sync(full, bb, piv, W);
    if (below) bb -= m * pb;
    if (pivot_lane) {
      bb *= inv;
      my_step = k;
    }
  }
  // Phase 2: steps i = n-1 .. 1 clear column i in the rows chosen before them; only b changes.
#pragma unroll
  for (int i = W - 1; i >= 1; --i) {
    if (i < n) {
      const T bi = __shfl_sync(full, bb, piv_of[i], W);
      if (live && my_step < i) bb -= row[i] * bi;
    }
  }
  ok &= fabs(bb) <= tmax;
  if (live) x[s * p.n + my_step] = bb;
  const unsigned bad = __ballot_sync(full, live && !ok);
  const unsigned group = (W == 32 ? full : ((1u << W) - 1u)) << (g * W);
  if (valid && j == 0 && (bad & group)) flags[s] = 1;
}

// 32 < n <= 32 R: one warp a system, [A | b] in shared memory (pitch n + 2), R rows a lane,
// the same implicit pivoting; the pivot row is read by every lane at once (a broadcast).
constexpr int kSmemWarps = 2;

template <typename T, int R>
__global__ void __launch_bounds__(32 * kSmemWarps)
    GaussJordanSmemKernel(DenseProblem<T> p, T* __restrict__ x, uint8_t* __restrict__ flags) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int n = int(p.n), pitch = n + 2;
  T* Mw = reinterpret_cast<T*>(smem_raw) + size_t(w) * (32 * R * pitch + 32 * R);
  T* colmax = Mw + 32 * R * pitch;
  int* piv_of = reinterpret_cast<int*>(reinterpret_cast<T*>(smem_raw) +
                                       size_t(kSmemWarps) * (32 * R * pitch + 32 * R)) +
                w * 32 * R;
  const int64_t s = int64_t(blockIdx.x) * kSmemWarps + w;
  if (s >= p.batch) return;  // whole warps leave together
  const T tmax = sizeof(T) == 8 ? T(DBL_MAX) : T(FLT_MAX);
  const T* A = p.A + s * p.n * p.n;
  for (int e = lane; e < n * n; e += 32) Mw[(e / n) * pitch + e % n] = __ldg(A + e);
  for (int r = lane; r < n; r += 32) Mw[r * pitch + n] = __ldg(p.b + s * p.n + r);
  __syncwarp();
  for (int c = lane; c < n; c += 32) {
    T m = T(0);
    for (int r = 0; r < n; ++r) m = fmax(m, fabs(Mw[r * pitch + c]));
    colmax[c] = m;
  }
  __syncwarp();
  int step[R];
#pragma unroll
  for (int q = 0; q < R; ++q) step[q] = n;  // not yet a pivot row
  bool ok = true;
  for (int k = 0; k < n; ++k) {
    T v = T(-1);
    int idx = 1 << 30;
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int r = lane + 32 * q;
      if (r < n && step[q] == n) {
        const T a = fabs(Mw[r * pitch + k]);
        if (a > v) {
          v = a;
          idx = r;
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const T ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ov > v || (ov == v && oi < idx)) {
        v = ov;
        idx = oi;
      }
    }
    const int piv = idx;
    const T pv = Mw[piv * pitch + k];
    ok &= fabs(pv) <= tmax && !(fabs(pv) <= DenseEps<T>() * T(n) * colmax[k]);
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int r = lane + 32 * q;
      if (r < n && step[q] == n && r != piv) {
        const T m = Mw[r * pitch + k] / pv;
        for (int c = k; c <= n; ++c) Mw[r * pitch + c] -= m * Mw[piv * pitch + c];
      }
    }
    __syncwarp();
    const T inv = T(1) / pv;
    for (int c = k + lane; c <= n; c += 32) Mw[piv * pitch + c] *= inv;
#pragma unroll
    for (int q = 0; q < R; ++q)
      if (lane + 32 * q == piv) step[q] = k;
    if (lane == 0) piv_of[k] = piv;
    __syncwarp();
  }
  for (int i = n - 1; i >= 1; --i) {
    const T bi = Mw[piv_of[i] * pitch + n];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int r = lane + 32 * q;
      if (r < n && step[q] < i) Mw[r * pitch + n] -= Mw[r * pitch + i] * bi;
    }
    __syncwarp();
  }
#pragma unroll
  for (int q = 0; q < R; ++q) {
    const int r = lane + 32 * q;
    if (r < n) {
      const T xv = Mw[r * pitch + n];
      ok &= fabs(xv) <= tmax;
      x[s * p.n + step[q]] = xv;
    }
  }
  if (__any_sync(0xffffffffu, !ok) && lane == 0) flags[s] = 1;
}

template <typename T, int W>
absl::Status Launch(const DenseProblem<T>& p, T* x, uint8_t* flags, cudaStream_t stream) {
  const int64_t per_block = int64_t(kWarpsPerBlock) * (32 / W);
  const unsigned blocks = unsigned((p.batch + per_block - 1) / per_block);
  GaussJordanWarpKernel<T, W><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(p, x, flags);
  return CudaStatus(cudaGetLastError(), "GaussJordanWarpKernel launch");
}

}  // namespace

template <typename T>
absl::Status SolveDenseWarpDevice(const DenseProblem<T>& p, T* x, uint8_t* flags,
                                  cudaStream_t stream) {
  if (p.n <= 8) return Launch<T, 8>(p, x, flags, stream);
  if (p.n <= 16) return Launch<T, 16>(p, x, flags, stream);
  if (p.n <= 32) return Launch<T, 32>(p, x, flags, stream);
  if (p.n <= 64) {
    constexpr int R = 2;
    const size_t smem = size_t(kSmemWarps) * (sizeof(T) * (32 * R * (p.n + 2) + 32 * R) +
                                              sizeof(int) * 32 * R);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        GaussJordanSmemKernel<T, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const unsigned blocks = unsigned((p.batch + kSmemWarps - 1) / kSmemWarps);
    GaussJordanSmemKernel<T, R><<<blocks, 32 * kSmemWarps, smem, stream>>>(p, x, flags);
    return CudaStatus(cudaGetLastError(), "GaussJordanSmemKernel launch");
  }
  return absl::InvalidArgumentError("the GPU Gauss-Jordan takes n <= 64");
}

template absl::Status SolveDenseWarpDevice(const DenseProblem<double>&, double*, uint8_t*,
                                           cudaStream_t);
template absl::Status SolveDenseWarpDevice(const DenseProblem<float>&, float*, uint8_t*,
                                           cudaStream_t);

}  // namespace trisolve::cuda
