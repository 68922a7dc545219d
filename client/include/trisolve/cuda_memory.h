// CUDA memory of this process registered with a trisolved on the same host that runs the CUDA
// backend on the same device: arrays that lie in it travel as (region, offset, bytes), and x
// can be written straight into it, on the device; the bytes cross neither the socket nor the
// host. This header needs no CUDA; trisolve/cuda_ipc.h (header only, with cuda_runtime.h)
// fills a CudaMemory from a cudaMalloc pointer.
//
//   double* d;  cudaMalloc(&d, bytes);                          // fill it on the device ...
//   auto mem = trisolve::DescribeCudaMemory(d, bytes);          // cuda_ipc.h
//   client.RegisterCudaMemory(*mem, "field");                   // the server opens it once
//   job.arrays["d"] = {trisolve::DType::kFloat64, {batch, n}, d + off};  // ... views into it
//   job.options.x_out = x_dev;                                  // x lands here, on the device
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace trisolve {

struct CudaMemory {
  const void* data = nullptr;  // the region's start, a device address of this process
  int64_t bytes = 0;
  int device = 0;              // its CUDA device (the server must number it the same)
  // cudaIpcGetMemHandle's cudaIpcMemHandle_t (64 bytes) for the allocation that holds data,
  // and data's offset in that allocation.
  std::string handle;
  int64_t offset = 0;
  bool Contains(const void* p, int64_t n) const {
    const auto* b = static_cast<const std::byte*>(p);
    const auto* base = static_cast<const std::byte*>(data);
    return b >= base && n >= 0 && b + n <= base + bytes;
  }
};

}  // namespace trisolve
