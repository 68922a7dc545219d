// The copy engine's bulk tensor copies (sm_90): global memory to shared memory in 2D boxes
// described by a tensor map, counted on an mbarrier. Shared by the block sweeps' streamed
// kernel (tridiagonal/row_stream_kernel.cuh) and the interleaved Thomas windows
// (tridiagonal/thomas_window_kernel.cuh).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

namespace trisolve::cuda {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// The copies' instructions exist from compute capability 9.0 (the launches pick them only
// there); in builds for older devices the helpers trap.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void BarInit(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(SmemAddr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void BarExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// The box of `map` at coordinates (x0, x1) (x0 the inner dimension) into dst.
__device__ __forceinline__ void BulkLoad2D(void* dst, const CUtensorMap* map, int x0, int x1,
                                           uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x0), "r"(x1), "r"(SmemAddr(bar))
      : "memory");
}
// This thread's generic-proxy accesses to shared memory ordered before the copy engine's next
// writes into it (with the barrier that follows), or before its reads of what they wrote.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// src into the box of `map` at (x0, x1), clipped to the tensor; completes in a bulk group.
__device__ __forceinline__ void BulkStore2D(const CUtensorMap* map, int x0, int x1,
                                            const void* src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::
                   "l"(reinterpret_cast<uint64_t>(map)),
               "r"(x0), "r"(x1), "r"(SmemAddr(src))
               : "memory");
}
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// This thread's bulk groups have read their shared memory (it may be written again).
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// This thread's bulk groups are complete.
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// This thread's bulk groups but the last committed are complete.
__device__ __forceinline__ void BulkWaitAllButLast() {
  asm volatile("cp.async.bulk.wait_group 1;" ::: "memory");
}
// The global writes of this thread's completed bulk groups ordered before its later generic
// accesses (a release after it publishes them to other blocks).
__device__ __forceinline__ void FenceProxyAsyncGlobal() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
#else
__device__ __forceinline__ void BarInit(uint64_t*) { __trap(); }
__device__ __forceinline__ void BarExpect(uint64_t*, uint32_t) { __trap(); }
__device__ __forceinline__ void BarWait(uint64_t*, uint32_t) { __trap(); }
__device__ __forceinline__ void BulkLoad2D(void*, const CUtensorMap*, int, int, uint64_t*) {
  __trap();
}
__device__ __forceinline__ void FenceProxyAsync() { __trap(); }
__device__ __forceinline__ void BulkStore2D(const CUtensorMap*, int, int, const void*) {
  __trap();
}
__device__ __forceinline__ void BulkCommit() { __trap(); }
__device__ __forceinline__ void BulkWaitRead() { __trap(); }
__device__ __forceinline__ void BulkWaitAll() { __trap(); }
__device__ __forceinline__ void BulkWaitAllButLast() { __trap(); }
__device__ __forceinline__ void FenceProxyAsyncGlobal() { __trap(); }
#endif

// Loads that see other blocks' writes: a counter with acquire (what its releaser wrote before
// is visible after it), a value relaxed (from the L2, no stale L1 line).
__device__ __forceinline__ int AcquireLoad(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ double RelaxedLoad(const double* p) {
  double v;
  asm volatile("ld.relaxed.gpu.global.f64 %0, [%1];" : "=d"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float RelaxedLoad(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

// cuTensorMapEncodeTiled from the driver (through the runtime: no link to libcuda), or null.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    else
      cudaGetLastError();
  });
  return fn;
}

}  // namespace trisolve::cuda
