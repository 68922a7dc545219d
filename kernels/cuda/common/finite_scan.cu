#include "common/finite_scan.h"

#include <algorithm>
#include <type_traits>

#include "runtime/check.h"

namespace trisolve::cuda {
namespace {

// The exponent bits all set: Inf or NaN. Tested on the bits, so that no floating-point
// comparison (or fast-math assumption) can let a NaN through.
template <typename U>
__device__ __forceinline__ bool BadBits(U bits) {
  constexpr U kExp = sizeof(U) == 8 ? U(0x7ff0000000000000ull) : U(0x7f800000u);
  return (bits & kExp) == kExp;
}

// Vectors of 16 bytes where the array is aligned for them (pooled device buffers are), the
// tail one value at a time. One flag store per block that found something.
template <typename U>
__global__ void ScanKernel(const U* __restrict__ v, int64_t n, uint8_t* found) {
  constexpr int kPer = 16 / sizeof(U);
  const int64_t vectors = n / kPer;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  bool bad = false;
  const auto* v4 = reinterpret_cast<const uint4*>(v);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    const uint4 q = __ldg(v4 + i);
    if constexpr (sizeof(U) == 8) {
      bad |= BadBits<U>((U(q.y) << 32) | q.x) | BadBits<U>((U(q.w) << 32) | q.z);
    } else {
      bad |= BadBits<U>(q.x) | BadBits<U>(q.y) | BadBits<U>(q.z) | BadBits<U>(q.w);
    }
  }
  for (int64_t i = vectors * kPer + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    bad |= BadBits<U>(v[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;
}

// An array not aligned for vectors (never a pooled buffer): one value at a time.
template <typename U>
__global__ void ScanTail(const U* __restrict__ v, int64_t n, uint8_t* found) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    bad |= BadBits<U>(v[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;
}

}  // namespace

template <typename T>
absl::Status ScanNonFinite(const T* v, int64_t n, uint8_t* found, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  using U = std::conditional_t<sizeof(T) == 8, unsigned long long, unsigned int>;
  constexpr int kThreads = 256;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t per_block = int64_t(kThreads) * (16 / int64_t(sizeof(T))) * 8;
  const int blocks = int(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 8 * sms));
  if (reinterpret_cast<uintptr_t>(v) % 16 == 0) {
    ScanKernel<U><<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const U*>(v), n, found);
  } else {
    ScanTail<U><<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const U*>(v), n, found);
  }
  return CudaStatus(cudaGetLastError(), "ScanNonFinite");
}

template absl::Status ScanNonFinite(const double*, int64_t, uint8_t*, cudaStream_t);
template absl::Status ScanNonFinite(const float*, int64_t, uint8_t*, cudaStream_t);

}  // namespace trisolve::cuda
