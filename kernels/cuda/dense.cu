// Batched small dense systems: Gauss-Jordan with partial pivoting, one warp a system.
#include <cfloat>

#include "check.h"
#include "numerics.cuh"
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
  // Q^T b: P_0 first; then x = Q y at the end: the last reflector first.
  auto apply = [&](int k) {
    if (H[k] == T(0)) return;  // uniform across the block
    const T* uk = V + k * n;
    const T dot = BlockSum((i > k && i < n) ? uk[i] * xs[i] : T(0), red);
    const T f = dot / H[k];
    if (i > k && i < n) xs[i] -= f * uk[i];
    __syncthreads();
  };
  for (int k = 0; k + 2 < n; ++k) apply(k);
  // PCR on T (the reduced W's three diagonals), as the CPU's PcrStrided.
  bool ok = true;
  if (i < n) {
    A[i] = i > 0 ? W[i * n + i - 1] : T(0);
    B[i] = W[i * n + i];
    C[i] = i + 1 < n ? W[i * n + i + 1] : T(0);
    D[i] = xs[i];
  }
  __syncthreads();
  for (int stride = 1; stride < n; stride *= 2) {
    if (i < n) {
      const int il = i - stride, ir = i + stride;
      const int l = il >= 0 ? il : i, r = ir < n ? ir : i;
      ok &= PcrCombine(A[i], B[i], C[i], D[i], il >= 0, A[l], B[l], C[l], D[l], ir < n, A[r],
                       B[r], C[r], D[r], A2[i], B2[i], C2[i], D2[i]);
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
    xs[i] = D[i] / B[i];
  }
  __syncthreads();
  for (int k = n - 3; k >= 0; --k) apply(k);
  if (i < n) {
    const T v = xs[i];
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
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      HouseholderPcrBlockKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
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
