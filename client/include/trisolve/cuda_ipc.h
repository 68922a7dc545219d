// DescribeCudaMemory: a CudaMemory for device memory of this process, through the CUDA runtime
// (header only: include it where CUDA is; libtrisolve_client itself does not need CUDA).
#pragma once

#include <cuda_runtime.h>

#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "trisolve/cuda_memory.h"

namespace trisolve {

// [base, base + bytes) of an allocation of cudaMalloc, `base` as cudaMalloc returned it (the
// handle names the whole allocation; a region may start inside it: set offset and data after).
// Memory of cudaMallocManaged, cudaMallocAsync pools or cudaHostAlloc has no IPC handle.
inline absl::StatusOr<CudaMemory> DescribeCudaMemory(void* base, int64_t bytes) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, base) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError("not device memory of cudaMalloc");
  }
  cudaIpcMemHandle_t h;
  if (cudaError_t e = cudaIpcGetMemHandle(&h, base); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat("cudaIpcGetMemHandle: ", cudaGetErrorString(e)));
  }
  CudaMemory m;
  m.data = base;
  m.bytes = bytes;
  m.device = attr.device;
  m.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return m;
}

}  // namespace trisolve
