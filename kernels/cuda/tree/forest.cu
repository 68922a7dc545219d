#include "tree/forest.h"

#include "runtime/check.h"

namespace trisolve::cuda {
namespace {

template <typename T>
__global__ void ZeroForestCouplingsKernel(T* __restrict__ lower, T* __restrict__ upper,
                                          const int32_t* __restrict__ roots, int64_t count) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= count) return;
  const int32_t r = roots[k];
  lower[r] = T(0);
  upper[r] = T(0);
}

}  // namespace

template <typename T>
absl::Status ZeroForestCouplings(T* lower, T* upper, const int32_t* roots, int64_t count,
                                 cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  ZeroForestCouplingsKernel<T><<<unsigned((count + kThreads - 1) / kThreads), kThreads, 0,
                                 stream>>>(lower, upper, roots, count);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status ZeroForestCouplings(double*, double*, const int32_t*, int64_t,
                                          cudaStream_t);
template absl::Status ZeroForestCouplings(float*, float*, const int32_t*, int64_t, cudaStream_t);

}  // namespace trisolve::cuda
