// Dense systems of n > 64 on the GPU through cuSOLVER and cuBLAS: LU (getrf/getrs), blocked
// Gauss-Jordan (panel getrf, trsm and gemm) and the
// symmetric Householder reduction (sytrd/ormtr) followed by the tridiagonal kernels.
#include <cfloat>
#include <limits>
#include <vector>

#include "runtime/check.h"
#include "common/numerics.cuh"
#include "dense/dense.h"
#include "dense/factors.h"
#include "tridiagonal/tridiagonal.h"

namespace trisolve::cuda {
namespace {

absl::Status SolverStatus(cusolverStatus_t s, const char* what) {
  if (s == CUSOLVER_STATUS_SUCCESS) return absl::OkStatus();
  const auto code = s == CUSOLVER_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
                                                      : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": cuSOLVER status ", int(s)));
}
absl::Status BlasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const auto code = s == CUBLAS_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
                                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": cuBLAS status ", int(s)));
}
#define TRISOLVE_SOLVER_RETURN_IF_ERROR(expr)                                \
  do {                                                                       \
    if (auto _st = SolverStatus((expr), #expr); !_st.ok()) return _st;       \
  } while (0)
#define TRISOLVE_BLAS_RETURN_IF_ERROR(expr)                                  \
  do {                                                                       \
    if (auto _st = BlasStatus((expr), #expr); !_st.ok()) return _st;         \
  } while (0)

// The libraries' entry points by type.
cusolverStatus_t GetrfBuf(cusolverDnHandle_t h, int n, double* A, int* lw) {
  return cusolverDnDgetrf_bufferSize(h, n, n, A, n, lw);
}
cusolverStatus_t GetrfBuf(cusolverDnHandle_t h, int n, float* A, int* lw) {
  return cusolverDnSgetrf_bufferSize(h, n, n, A, n, lw);
}
cusolverStatus_t Getrf(cusolverDnHandle_t h, int n, double* A, double* w, int* ipiv, int* info) {
  return cusolverDnDgetrf(h, n, n, A, n, w, ipiv, info);
}
cusolverStatus_t Getrf(cusolverDnHandle_t h, int n, float* A, float* w, int* ipiv, int* info) {
  return cusolverDnSgetrf(h, n, n, A, n, w, ipiv, info);
}
cusolverStatus_t Getrs(cusolverDnHandle_t h, int n, int nrhs, const double* A, const int* ipiv,
                       double* b, int* info) {
  return cusolverDnDgetrs(h, CUBLAS_OP_N, n, nrhs, A, n, ipiv, b, n, info);
}
cusolverStatus_t Getrs(cusolverDnHandle_t h, int n, int nrhs, const float* A, const int* ipiv,
                       float* b, int* info) {
  return cusolverDnSgetrs(h, CUBLAS_OP_N, n, nrhs, A, n, ipiv, b, n, info);
}
cublasStatus_t GetrfBatched(cublasHandle_t h, int n, double* const* A, int* ipiv, int* info,
                            int batch) {
  return cublasDgetrfBatched(h, n, A, n, ipiv, info, batch);
}
cublasStatus_t GetrfBatched(cublasHandle_t h, int n, float* const* A, int* ipiv, int* info,
                            int batch) {
  return cublasSgetrfBatched(h, n, A, n, ipiv, info, batch);
}
cublasStatus_t GetrsBatched(cublasHandle_t h, int n, double* const* A, const int* ipiv,
                            double* const* B, int* info, int batch) {
  return cublasDgetrsBatched(h, CUBLAS_OP_N, n, 1, A, n, ipiv, B, n, info, batch);
}
cublasStatus_t GetrsBatched(cublasHandle_t h, int n, float* const* A, const int* ipiv,
                            float* const* B, int* info, int batch) {
  return cublasSgetrsBatched(h, CUBLAS_OP_N, n, 1, A, n, ipiv, B, n, info, batch);
}
cusolverStatus_t SytrdBuf(cusolverDnHandle_t h, int n, const double* A, const double* d,
                          const double* e, const double* tau, int* lw) {
  return cusolverDnDsytrd_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, A, n, d, e, tau, lw);
}
cusolverStatus_t SytrdBuf(cusolverDnHandle_t h, int n, const float* A, const float* d,
                          const float* e, const float* tau, int* lw) {
  return cusolverDnSsytrd_bufferSize(h, CUBLAS_FILL_MODE_LOWER, n, A, n, d, e, tau, lw);
}
cusolverStatus_t Sytrd(cusolverDnHandle_t h, int n, double* A, double* d, double* e,
                       double* tau, double* w, int lw, int* info) {
  return cusolverDnDsytrd(h, CUBLAS_FILL_MODE_LOWER, n, A, n, d, e, tau, w, lw, info);
}
cusolverStatus_t Sytrd(cusolverDnHandle_t h, int n, float* A, float* d, float* e, float* tau,
                       float* w, int lw, int* info) {
  return cusolverDnSsytrd(h, CUBLAS_FILL_MODE_LOWER, n, A, n, d, e, tau, w, lw, info);
}
cusolverStatus_t OrmtrBuf(cusolverDnHandle_t h, cublasOperation_t op, int n, const double* A,
                          const double* tau, const double* C, int* lw) {
  return cusolverDnDormtr_bufferSize(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, op, n, 1, A,
                                     n, tau, C, n, lw);
}
cusolverStatus_t OrmtrBuf(cusolverDnHandle_t h, cublasOperation_t op, int n, const float* A,
                          const float* tau, const float* C, int* lw) {
  return cusolverDnSormtr_bufferSize(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, op, n, 1, A,
                                     n, tau, C, n, lw);
}
cusolverStatus_t Ormtr(cusolverDnHandle_t h, cublasOperation_t op, int n, double* A,
                       double* tau, double* C, double* w, int lw, int* info) {
  return cusolverDnDormtr(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, op, n, 1, A, n, tau, C,
                          n, w, lw, info);
}
cusolverStatus_t Ormtr(cusolverDnHandle_t h, cublasOperation_t op, int n, float* A, float* tau,
                       float* C, float* w, int lw, int* info) {
  return cusolverDnSormtr(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, op, n, 1, A, n, tau, C, n,
                          w, lw, info);
}

// The blocked Gauss-Jordan's pieces: the panel's LU, its row exchanges, the triangular solves
// and the updates as matrix products.
cusolverStatus_t PanelBuf(cusolverDnHandle_t h, int m, int w, double* A, int lda, int* lw) {
  return cusolverDnDgetrf_bufferSize(h, m, w, A, lda, lw);
}
cusolverStatus_t PanelBuf(cusolverDnHandle_t h, int m, int w, float* A, int lda, int* lw) {
  return cusolverDnSgetrf_bufferSize(h, m, w, A, lda, lw);
}
cusolverStatus_t Panel(cusolverDnHandle_t h, int m, int w, double* A, int lda, double* ws,
                       int* ipiv, int* info) {
  return cusolverDnDgetrf(h, m, w, A, lda, ws, ipiv, info);
}
cusolverStatus_t Panel(cusolverDnHandle_t h, int m, int w, float* A, int lda, float* ws,
                       int* ipiv, int* info) {
  return cusolverDnSgetrf(h, m, w, A, lda, ws, ipiv, info);
}
cusolverStatus_t Laswp(cusolverDnHandle_t h, int cols, double* A, int lda, int k2,
                       const int* ipiv) {
  return cusolverDnDlaswp(h, cols, A, lda, 1, k2, ipiv, 1);
}
cusolverStatus_t Laswp(cusolverDnHandle_t h, int cols, float* A, int lda, int k2,
                       const int* ipiv) {
  return cusolverDnSlaswp(h, cols, A, lda, 1, k2, ipiv, 1);
}
cublasStatus_t Trsm(cublasHandle_t h, cublasFillMode_t fill, cublasDiagType_t diag, int m,
                    int cols, const double* A, int lda, double* B, int ldb) {
  const double one = 1;
  return cublasDtrsm(h, CUBLAS_SIDE_LEFT, fill, CUBLAS_OP_N, diag, m, cols, &one, A, lda, B, ldb);
}
cublasStatus_t Trsm(cublasHandle_t h, cublasFillMode_t fill, cublasDiagType_t diag, int m,
                    int cols, const float* A, int lda, float* B, int ldb) {
  const float one = 1;
  return cublasStrsm(h, CUBLAS_SIDE_LEFT, fill, CUBLAS_OP_N, diag, m, cols, &one, A, lda, B, ldb);
}
// B_i = A_i^-1 B_i for every i (n x 1 each), A_i triangular.
cublasStatus_t TrsmBatched(cublasHandle_t h, cublasFillMode_t fill, cublasDiagType_t diag, int n,
                           double* const* A, double* const* B, int batch) {
  const double one = 1;
  return cublasDtrsmBatched(h, CUBLAS_SIDE_LEFT, fill, CUBLAS_OP_N, diag, n, 1, &one, A, n, B, n,
                            batch);
}
cublasStatus_t TrsmBatched(cublasHandle_t h, cublasFillMode_t fill, cublasDiagType_t diag, int n,
                           float* const* A, float* const* B, int batch) {
  const float one = 1;
  return cublasStrsmBatched(h, CUBLAS_SIDE_LEFT, fill, CUBLAS_OP_N, diag, n, 1, &one, A, n, B, n,
                            batch);
}
// C -= A B (m x k times k x cols).
cublasStatus_t GemmSub(cublasHandle_t h, int m, int cols, int k, const double* A, int lda,
                       const double* B, int ldb, double* C, int ldc) {
  const double minus = -1, one = 1;
  return cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, cols, k, &minus, A, lda, B, ldb, &one, C,
                     ldc);
}
cublasStatus_t GemmSub(cublasHandle_t h, int m, int cols, int k, const float* A, int lda,
                       const float* B, int ldb, float* C, int ldc) {
  const float minus = -1, one = 1;
  return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, cols, k, &minus, A, lda, B, ldb, &one, C,
                     ldc);
}

// r = b - A x for a symmetric A (its row-major storage is its column-major storage), x += d.
cublasStatus_t Residual(cublasHandle_t h, int n, const double* A, const double* x, double* r) {
  const double minus = -1, one = 1;
  return cublasDgemv(h, CUBLAS_OP_N, n, n, &minus, A, n, x, 1, &one, r, 1);
}
cublasStatus_t Residual(cublasHandle_t h, int n, const float* A, const float* x, float* r) {
  const float minus = -1, one = 1;
  return cublasSgemv(h, CUBLAS_OP_N, n, n, &minus, A, n, x, 1, &one, r, 1);
}
cublasStatus_t AddTo(cublasHandle_t h, int n, const double* d, double* x) {
  const double one = 1;
  return cublasDaxpy(h, n, &one, d, 1, x, 1);
}
cublasStatus_t AddTo(cublasHandle_t h, int n, const float* d, float* x) {
  const float one = 1;
  return cublasSaxpy(h, n, &one, d, 1, x, 1);
}

// Row-major A (batch of n x n) into column-major M, and colmax[s][j] = max_i |A[i][j]|.
template <typename T>
__global__ void TransposeKernel(int64_t n, const T* __restrict__ A, T* __restrict__ M) {
  __shared__ T tile[32][33];
  const int64_t s = blockIdx.z;
  const T* As = A + s * n * n;
  T* Ms = M + s * n * n;
  const int64_t i0 = int64_t(blockIdx.y) * 32, j0 = int64_t(blockIdx.x) * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int64_t i = i0 + r, j = j0 + threadIdx.x;
    if (i < n && j < n) tile[r][threadIdx.x] = As[i * n + j];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int64_t j = j0 + r, i = i0 + threadIdx.x;  // M[i + j n] = A[i][j]
    if (i < n && j < n) Ms[j * n + i] = tile[threadIdx.x][r];
  }
}

// One block per column of a column-major matrix: colmax = max |M[:, j]|.
template <typename T>
__global__ void ColumnMaxKernel(int64_t n, const T* __restrict__ M, T* __restrict__ colmax) {
  const int64_t s = blockIdx.y, j = blockIdx.x;
  const T* col = M + s * n * n + j * n;
  T m = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmax(m, fabs(col[i]));
  __shared__ T red[256];
  red[threadIdx.x] = m;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) colmax[s * n + j] = red[0];
}

// After the factorisation: flag a system whose pivot u_kk vanished.
template <typename T>
__global__ void PivotCheckKernel(int64_t n, int64_t batch, const T* __restrict__ LU,
                                 const T* __restrict__ colmax, uint8_t* __restrict__ flags) {
  const int64_t s = blockIdx.y;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x)
    if (Vanishes(LU[s * n * n + k * n + k], T(n) * colmax[s * n + k])) flags[s] = 1;
}

template <typename T>
__global__ void FiniteCheckKernel(int64_t count, int64_t n, const T* __restrict__ x,
                                  uint8_t* __restrict__ flags) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += int64_t(gridDim.x) * blockDim.x)
    if (!Finite(x[e])) flags[e / n] = 1;
}

// ptrs[q] = base + (q % batch) stride, q < count.
template <typename T>
__global__ void PointersKernel(int64_t count, int64_t batch, T* base, int64_t stride,
                               T** __restrict__ ptrs) {
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < count;
       q += int64_t(gridDim.x) * blockDim.x)
    ptrs[q] = base + (q % batch) * stride;
}

// getrf's interchanges (row i swapped with row ipiv[i] - 1, in order) as one permutation:
// (P b)[i] = b[perm[i]]. One thread a system, once a factorisation.
__global__ void PermutationKernel(int64_t batch, int64_t n, const int* __restrict__ ipiv,
                                  int* __restrict__ perm) {
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < batch;
       s += int64_t(gridDim.x) * blockDim.x) {
    int* p = perm + s * n;
    const int* v = ipiv + s * n;
    for (int64_t i = 0; i < n; ++i) p[i] = int(i);
    for (int64_t i = 0; i < n; ++i) {
      const int j = v[i] - 1;
      const int t = p[i];
      p[i] = p[j];
      p[j] = t;
    }
  }
}

// x_s = P_s b_s for every system s (k of them a factorisation: systems q = j batch + s).
template <typename T>
__global__ void PermuteKernel(int64_t count, int64_t batch, int64_t n, const int* __restrict__ perm,
                              const T* __restrict__ b, T* __restrict__ x) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = e / n, i = e - q * n, s = q % batch;
    x[e] = b[q * n + perm[s * n + i]];
  }
}

// A right-hand side's system inherits its factors' flag (a pivot vanished).
__global__ void CombineFlagsKernel(int64_t systems, int64_t batch,
                                   const uint8_t* __restrict__ factor_flags,
                                   uint8_t* __restrict__ flags) {
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < systems;
       q += int64_t(gridDim.x) * blockDim.x)
    if (factor_flags[q % batch] != 0) flags[q] = 1;
}

// T's diagonals from sytrd's d (n) and e (n - 1), in the tridiagonal kernels' convention.
template <typename T>
__global__ void TridiagonalFromSytrd(int64_t n, const T* d, const T* e, T* ta, T* tb, T* tc) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    tb[i] = d[i];
    ta[i] = i > 0 ? e[i - 1] : T(0);
    tc[i] = i + 1 < n ? e[i] : T(0);
  }
}

unsigned Blocks(int64_t count, int threads) {
  return unsigned(std::min<int64_t>((count + threads - 1) / threads, 65535));
}

// getrfBatched / getrsBatched for batches of order <= kDenseBatchedLuMaxN, else cuSOLVER
// system by system.
template <typename T>
bool LuBatched(const DenseFactorsDevice<T>& f) {
  return f.n <= kDenseBatchedLuMaxN && f.batch > 1;
}
// Larger systems, several: the solves of every system at once (the interchanges as one gather,
// then two batched triangular solves) rather than cuSOLVER's getrs system by system, three
// launches a system.
template <typename T>
bool LuTrsmBatched(const DenseFactorsDevice<T>& f) {
  return !LuBatched(f) && f.batch > 1;
}

}  // namespace

void DenseLibs::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [s, h] : solver_) cusolverDnDestroy(h);
  for (auto& [s, h] : blas_) cublasDestroy(h);
  solver_.clear();
  blas_.clear();
}

absl::StatusOr<cusolverDnHandle_t> DenseLibs::Solver(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = solver_.find(stream); it != solver_.end()) return it->second;
  cusolverDnHandle_t h;
  TRISOLVE_SOLVER_RETURN_IF_ERROR(cusolverDnCreate(&h));
  TRISOLVE_SOLVER_RETURN_IF_ERROR(cusolverDnSetStream(h, stream));
  solver_[stream] = h;
  return h;
}

absl::StatusOr<cublasHandle_t> DenseLibs::Blas(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = blas_.find(stream); it != blas_.end()) return it->second;
  cublasHandle_t h;
  TRISOLVE_BLAS_RETURN_IF_ERROR(cublasCreate(&h));
  TRISOLVE_BLAS_RETURN_IF_ERROR(cublasSetStream(h, stream));
  blas_[stream] = h;
  return h;
}

template <typename T>
absl::Status FactorDenseLuDevice(const DenseProblem<T>& p, DenseFactorsDevice<T>& f,
                                 DenseLibs& libs, Pool& pool, cudaStream_t stream) {
  const int64_t n = p.n, nn = n * n, batch = p.batch;
  if (f.kind != DenseFactorsKind::kLu || f.batch != batch || f.n != n)
    return absl::InvalidArgumentError("FactorDenseLuDevice: factors of another shape");
  if (n > std::numeric_limits<int>::max() / 2)
    return absl::InvalidArgumentError("lu: n too large for cuSOLVER");
  // colmax and getrf's infos.
  auto work = pool.Get(int64_t(sizeof(T)) * batch * n + int64_t(sizeof(int)) * batch);
  if (!work.ok()) return work.status();
  T* colmax = work->as<T>();
  int* info = reinterpret_cast<int*>(colmax + batch * n);
  const dim3 tb(32, 8);
  for (int64_t s0 = 0; s0 < batch; s0 += 65535) {
    const int64_t bs = std::min<int64_t>(65535, batch - s0);
    const dim3 grid(unsigned((n + 31) / 32), unsigned((n + 31) / 32), unsigned(bs));
    TransposeKernel<T><<<grid, tb, 0, stream>>>(n, p.A + s0 * nn, f.values + s0 * nn);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    ColumnMaxKernel<T><<<dim3(unsigned(n), unsigned(bs)), 256, 0, stream>>>(
        n, f.values + s0 * nn, colmax + s0 * n);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  PointersKernel<T><<<Blocks(batch, 256), 256, 0, stream>>>(batch, batch, f.values, nn,
                                                            f.lu_ptrs);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (LuBatched(f)) {
    auto blas = libs.Blas(stream);
    if (!blas.ok()) return blas.status();
    TRISOLVE_BLAS_RETURN_IF_ERROR(GetrfBatched(*blas, int(n), f.lu_ptrs, f.ipiv, info, int(batch)));
    f.name = "lu (cublas getrfBatched)";
  } else {
    auto solver = libs.Solver(stream);
    if (!solver.ok()) return solver.status();
    int lw = 0;
    TRISOLVE_SOLVER_RETURN_IF_ERROR(GetrfBuf(*solver, int(n), f.values, &lw));
    auto ws = pool.Get(int64_t(sizeof(T)) * std::max(lw, 1));
    if (!ws.ok()) return ws.status();
    for (int64_t s = 0; s < batch; ++s)
      TRISOLVE_SOLVER_RETURN_IF_ERROR(
          Getrf(*solver, int(n), f.values + s * nn, ws->as<T>(), f.ipiv + s * n, info + s));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before ws returns
    f.name = "lu (cusolver getrf)";
  }
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(f.flags, 0, size_t(batch), stream));
  for (int64_t s0 = 0; s0 < batch; s0 += 65535) {
    const int64_t bs = std::min<int64_t>(65535, batch - s0);
    PivotCheckKernel<T><<<dim3(Blocks(n, 256), unsigned(bs)), 256, 0, stream>>>(
        n, bs, f.values + s0 * nn, colmax + s0 * n, f.flags + s0);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (LuTrsmBatched(f)) {
    PermutationKernel<<<Blocks(batch, 128), 128, 0, stream>>>(batch, n, f.ipiv, f.perm);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return CudaStatus(cudaStreamSynchronize(stream), "lu factors");  // before work returns
}

template <typename T>
absl::Status SolveDenseLuFactoredDevice(const DenseFactorsDevice<T>& f, int64_t k, const T* b,
                                        T* x, uint8_t* flags, DenseLibs& libs, Pool& pool,
                                        cudaStream_t stream) {
  const int64_t n = f.n, batch = f.batch, systems = k * batch;
  if (systems == 0) return absl::OkStatus();
  const bool trsm_batched = LuTrsmBatched(f) && b != x;
  if (trsm_batched) {
    PermuteKernel<T><<<Blocks(systems * n, 256), 256, 0, stream>>>(systems * n, batch, n,
                                                                     f.perm, b, x);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  } else if (b != x) {
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x, b, sizeof(T) * systems * n,
                                                  cudaMemcpyDeviceToDevice, stream));
  }
  // getrs's infos (and the batched path's x pointers, a right-hand side block at a time).
  auto work = pool.Get(int64_t(sizeof(int)) * batch + int64_t(sizeof(T*)) * batch);
  if (!work.ok()) return work.status();
  T** xptrs = work->as<T*>();
  int* info = reinterpret_cast<int*>(xptrs + batch);
  if (LuBatched(f) || trsm_batched) {
    auto blas = libs.Blas(stream);
    if (!blas.ok()) return blas.status();
    // A right-hand-side block of batch systems a call (getrsBatched reads system i's
    // interchanges at ipiv + i n).
    for (int64_t j = 0; j < k; ++j) {
      PointersKernel<T><<<Blocks(batch, 256), 256, 0, stream>>>(batch, batch, x + j * batch * n,
                                                                n, xptrs);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      if (trsm_batched) {
        TRISOLVE_BLAS_RETURN_IF_ERROR(TrsmBatched(*blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_UNIT,
                                                  int(n), f.lu_ptrs, xptrs, int(batch)));
        TRISOLVE_BLAS_RETURN_IF_ERROR(TrsmBatched(*blas, CUBLAS_FILL_MODE_UPPER,
                                                  CUBLAS_DIAG_NON_UNIT, int(n), f.lu_ptrs, xptrs,
                                                  int(batch)));
        continue;
      }
      int host_info = 0;
      TRISOLVE_BLAS_RETURN_IF_ERROR(
          GetrsBatched(*blas, int(n), f.lu_ptrs, f.ipiv, xptrs, &host_info, int(batch)));
      if (host_info != 0)
        return absl::InternalError(absl::StrCat("getrsBatched: argument ", -host_info));
    }
  } else {
    auto solver = libs.Solver(stream);
    if (!solver.ok()) return solver.status();
    const int64_t nn = n * n;
    if (batch == 1 && k <= std::numeric_limits<int>::max()) {
      // k right-hand sides of one system: x [k][n] is the column-major n x k block getrs takes.
      TRISOLVE_SOLVER_RETURN_IF_ERROR(Getrs(*solver, int(n), int(k), f.values, f.ipiv, x, info));
    } else {
      for (int64_t q = 0; q < systems; ++q) {
        const int64_t s = q % batch;
        TRISOLVE_SOLVER_RETURN_IF_ERROR(
            Getrs(*solver, int(n), 1, f.values + s * nn, f.ipiv + s * n, x + q * n, info + s));
      }
    }
  }
  FiniteCheckKernel<T><<<Blocks(systems * n, 256), 256, 0, stream>>>(systems * n, n, x, flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CombineFlagsKernel<<<Blocks(systems, 256), 256, 0, stream>>>(systems, batch, f.flags, flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return CudaStatus(cudaStreamSynchronize(stream), "lu solve");  // before work returns
}

template <typename T>
absl::StatusOr<std::string> SolveDenseLuDevice(const DenseProblem<T>& p, T* x, uint8_t* flags,
                                               DenseLibs& libs, Pool& pool,
                                               cudaStream_t stream) {
  auto buf = pool.Get(DenseFactorsBytes(DenseFactorsKind::kLu, p.batch, p.n, int(sizeof(T))));
  if (!buf.ok()) return buf.status();
  DenseFactorsDevice<T> f = DenseFactorsAt<T>(DenseFactorsKind::kLu, p.batch, p.n, buf->get());
  if (auto st = FactorDenseLuDevice(p, f, libs, pool, stream); !st.ok()) return st;
  if (auto st = SolveDenseLuFactoredDevice(f, 1, p.b, x, flags, libs, pool, stream); !st.ok())
    return st;
  return f.name;
}

template <typename T>
absl::Status SolveDenseGaussJordanBlockedDevice(const DenseProblem<T>& p, T* x, uint8_t* flags,
                                                DenseLibs& libs, Pool& pool,
                                                cudaStream_t stream, int panel) {
  const int64_t n = p.n, nn = n * n;
  if (n > std::numeric_limits<int>::max() / 2)
    return absl::InvalidArgumentError("gauss-jordan-blocked: n too large for cuBLAS");
  const int nb = int(std::min<int64_t>(panel > 0 ? panel : kGaussJordanPanel, n));
  auto solver = libs.Solver(stream);
  if (!solver.ok()) return solver.status();
  auto blas = libs.Blas(stream);
  if (!blas.ok()) return blas.status();
  // M = [A | b] column-major (n x (n + 1), leading dimension n), colmax, the panel's pivots and
  // info.
  auto work = pool.Get(int64_t(sizeof(T)) * (nn + 2 * n) + int64_t(sizeof(int)) * (nb + 1));
  if (!work.ok()) return work.status();
  T* M = work->as<T>();
  T* colmax = M + nn + n;
  int* ipiv = reinterpret_cast<int*>(colmax + n);
  int* info = ipiv + nb;
  int lw = 0;
  TRISOLVE_SOLVER_RETURN_IF_ERROR(PanelBuf(*solver, int(n), nb, M, int(n), &lw));
  auto ws = pool.Get(int64_t(sizeof(T)) * std::max(lw, 1));
  if (!ws.ok()) return ws.status();
  const int ld = int(n);
  for (int64_t s = 0; s < p.batch; ++s) {
    const dim3 grid(unsigned((n + 31) / 32), unsigned((n + 31) / 32), 1);
    TransposeKernel<T><<<grid, dim3(32, 8), 0, stream>>>(n, p.A + s * nn, M);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    ColumnMaxKernel<T><<<dim3(unsigned(n), 1), 256, 0, stream>>>(n, M, colmax);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(M + nn, p.b + s * n, sizeof(T) * n,
                                                  cudaMemcpyDeviceToDevice, stream));
    for (int k0 = 0; k0 < n; k0 += nb) {
      const int w = int(std::min<int64_t>(nb, n - k0)), k1 = k0 + w;
      const int rest = int(n) + 1 - k1;  // the columns right of the panel, b the last
      T* P = M + k0 + int64_t(k0) * ld;  // the panel's diagonal block
      T* R = M + int64_t(k1) * ld;       // row 0 of the columns right of the panel
      // The panel below the eliminated rows, LU with partial pivoting (the pivot search of
      // Gauss-Jordan's task A over rows k0 .. n-1 of each column), and its row exchanges on
      // the columns right of it.
      TRISOLVE_SOLVER_RETURN_IF_ERROR(
          Panel(*solver, int(n) - k0, w, P, ld, ws->as<T>(), ipiv, info));
      TRISOLVE_SOLVER_RETURN_IF_ERROR(Laswp(*solver, rest, R + k0, ld, w, ipiv));
      // The pivot rows: Y = L11^-1 A_MR, the rows below: A_BR -= L21 Y (LU's update).
      TRISOLVE_BLAS_RETURN_IF_ERROR(
          Trsm(*blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_UNIT, w, rest, P, ld, R + k0, ld));
      if (k1 < n)
        TRISOLVE_BLAS_RETURN_IF_ERROR(
            GemmSub(*blas, int(n) - k1, rest, w, P + w, ld, R + k0, ld, R + k1, ld));
      // The pivot rows normalised, A_MR = U11^-1 Y (task E), and the rows above eliminated,
      // A_TR -= A_TJ A_MR (Gauss-Jordan's part that LU does not do).
      TRISOLVE_BLAS_RETURN_IF_ERROR(
          Trsm(*blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_DIAG_NON_UNIT, w, rest, P, ld, R + k0, ld));
      if (k0 > 0)
        TRISOLVE_BLAS_RETURN_IF_ERROR(
            GemmSub(*blas, k0, rest, w, M + int64_t(k0) * ld, ld, R + k0, ld, R, ld));
    }
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x + s * n, M + nn, sizeof(T) * n,
                                                  cudaMemcpyDeviceToDevice, stream));
    // The pivots u_kk stay on M's diagonal (later steps write only right of their panel).
    PivotCheckKernel<T><<<dim3(Blocks(n, 256), 1), 256, 0, stream>>>(n, 1, M, colmax,
                                                                      flags + s);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  FiniteCheckKernel<T><<<Blocks(p.batch * n, 256), 256, 0, stream>>>(p.batch * n, n, x, flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return CudaStatus(cudaStreamSynchronize(stream), "gauss-jordan-blocked");  // before M returns
}

template <typename T>
absl::Status SolveDenseHouseholderPcrDevice(const DenseProblem<T>& p, T* x, uint8_t* flags,
                                            DenseLibs& libs, Pool& pool, cudaStream_t stream) {
  const int64_t n = p.n, nn = n * n;
  auto solver = libs.Solver(stream);
  if (!solver.ok()) return solver.status();
  auto blas = libs.Blas(stream);
  if (!blas.ok()) return blas.status();
  // M (n x n), d, e, tau, the tridiagonal a, b, c, y, and r and dx for the refinement:
  // n^2 + 9 n values, and an info.
  auto work = pool.Get(int64_t(sizeof(T)) * (nn + 10 * n) + 16);
  if (!work.ok()) return work.status();
  T* M = work->as<T>();
  T* d = M + nn;
  T* e = d + n;
  T* tau = e + n;
  T* ta = tau + n;
  T* tb = ta + n;
  T* tc = tb + n;
  T* y = tc + n;
  T* r = y + n;
  T* dx = r + n;
  int* info = reinterpret_cast<int*>(dx + n);
  int lw_trd = 0, lw_qt = 0, lw_q = 0;
  TRISOLVE_SOLVER_RETURN_IF_ERROR(SytrdBuf(*solver, int(n), M, d, e, tau, &lw_trd));
  TRISOLVE_SOLVER_RETURN_IF_ERROR(OrmtrBuf(*solver, CUBLAS_OP_T, int(n), M, tau, y, &lw_qt));
  TRISOLVE_SOLVER_RETURN_IF_ERROR(OrmtrBuf(*solver, CUBLAS_OP_N, int(n), M, tau, y, &lw_q));
  const int lw = std::max({lw_trd, lw_qt, lw_q, 1});
  auto ws = pool.Get(int64_t(sizeof(T)) * lw);
  if (!ws.ok()) return ws.status();
  for (int64_t s = 0; s < p.batch; ++s) {
    // Symmetric: the row-major A is its own column-major copy.
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(M, p.A + s * nn, sizeof(T) * nn,
                                                  cudaMemcpyDeviceToDevice, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, p.b + s * n, sizeof(T) * n,
                                                  cudaMemcpyDeviceToDevice, stream));
    TRISOLVE_SOLVER_RETURN_IF_ERROR(Sytrd(*solver, int(n), M, d, e, tau, ws->as<T>(), lw, info));
    TRISOLVE_SOLVER_RETURN_IF_ERROR(
        Ormtr(*solver, CUBLAS_OP_T, int(n), M, tau, y, ws->as<T>(), lw, info));
    TridiagonalFromSytrd<T><<<Blocks(n, 256), 256, 0, stream>>>(n, d, e, ta, tb, tc);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    TridiagonalProblem<T> tp{1, n, Layout::kFlat, ta, tb, tc, y};
    auto k = SolveTridiagonalDevice(tp, TridiagonalMethod::kPcr, x + s * n, flags + s, pool,
                                    stream);
    if (!k.ok()) return k.status();
    TRISOLVE_SOLVER_RETURN_IF_ERROR(
        Ormtr(*solver, CUBLAS_OP_N, int(n), M, tau, x + s * n, ws->as<T>(), lw, info));
    // One step of iterative refinement with the same reduction: r = b - A x from the original
    // arrays, dx = Q T^-1 Q^T r, x += dx. PCR does not pivot, so on an indefinite T it can
    // lose digits to a small pivot; this step restores the backward error for O(n^2) work.
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r, p.b + s * n, sizeof(T) * n,
                                                  cudaMemcpyDeviceToDevice, stream));
    TRISOLVE_BLAS_RETURN_IF_ERROR(Residual(*blas, int(n), p.A + s * nn, x + s * n, r));
    TRISOLVE_SOLVER_RETURN_IF_ERROR(
        Ormtr(*solver, CUBLAS_OP_T, int(n), M, tau, r, ws->as<T>(), lw, info));
    TridiagonalProblem<T> tr{1, n, Layout::kFlat, ta, tb, tc, r};
    auto k2 = SolveTridiagonalDevice(tr, TridiagonalMethod::kPcr, dx, flags + s, pool, stream);
    if (!k2.ok()) return k2.status();
    TRISOLVE_SOLVER_RETURN_IF_ERROR(
        Ormtr(*solver, CUBLAS_OP_N, int(n), M, tau, dx, ws->as<T>(), lw, info));
    TRISOLVE_BLAS_RETURN_IF_ERROR(AddTo(*blas, int(n), dx, x + s * n));
  }
  FiniteCheckKernel<T><<<Blocks(p.batch * n, 256), 256, 0, stream>>>(p.batch * n, n, x, flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return CudaStatus(cudaStreamSynchronize(stream), "householder-pcr");  // before work returns
}

template absl::StatusOr<std::string> SolveDenseLuDevice(const DenseProblem<double>&, double*,
                                                        uint8_t*, DenseLibs&, Pool&,
                                                        cudaStream_t);
template absl::StatusOr<std::string> SolveDenseLuDevice(const DenseProblem<float>&, float*,
                                                        uint8_t*, DenseLibs&, Pool&,
                                                        cudaStream_t);
template absl::Status FactorDenseLuDevice(const DenseProblem<double>&, DenseFactorsDevice<double>&,
                                          DenseLibs&, Pool&, cudaStream_t);
template absl::Status FactorDenseLuDevice(const DenseProblem<float>&, DenseFactorsDevice<float>&,
                                          DenseLibs&, Pool&, cudaStream_t);
template absl::Status SolveDenseLuFactoredDevice(const DenseFactorsDevice<double>&, int64_t,
                                                 const double*, double*, uint8_t*, DenseLibs&,
                                                 Pool&, cudaStream_t);
template absl::Status SolveDenseLuFactoredDevice(const DenseFactorsDevice<float>&, int64_t,
                                                 const float*, float*, uint8_t*, DenseLibs&,
                                                 Pool&, cudaStream_t);
template absl::Status SolveDenseGaussJordanBlockedDevice(const DenseProblem<double>&, double*,
                                                         uint8_t*, DenseLibs&, Pool&,
                                                         cudaStream_t, int);
template absl::Status SolveDenseGaussJordanBlockedDevice(const DenseProblem<float>&, float*,
                                                         uint8_t*, DenseLibs&, Pool&,
                                                         cudaStream_t, int);
template absl::Status SolveDenseHouseholderPcrDevice(const DenseProblem<double>&, double*,
                                                     uint8_t*, DenseLibs&, Pool&, cudaStream_t);
template absl::Status SolveDenseHouseholderPcrDevice(const DenseProblem<float>&, float*,
                                                     uint8_t*, DenseLibs&, Pool&, cudaStream_t);

}  // namespace trisolve::cuda
