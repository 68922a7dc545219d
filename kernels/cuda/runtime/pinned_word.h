// A word of pinned host memory for the small answers of the windows' checks (the tridiagonal
// windows' failure and the halo they measured, the block sweeps' halo level), which a kernel
// gives by itself: scratch() is a device word the kernel's blocks count into (zero when taken,
// left zero), and the grid's last block writes the answer into the host word through its
// mapping (PublishAnswer below), so that a launch needs no clearing before it and no copy
// after it (~5 us a call on the H100, NOTES.md t45). Kernels do not read the host word: reads
// of mapped host memory from every block cost the windows 2.5-14x their time. A word is two
// ints: the answer, and a second value the blocks combine by atomicMax (0 where unused).
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/check.h"

namespace trisolve::cuda {

// Pages of 256 words are allocated as calls in flight need them and kept for the process (a few
// KB of each memory); a word goes back when its holder is destroyed. Words are the current
// device's: their scratch is that device's memory (a word of another device's, used by a kernel
// on this one, failed its launch on a machine of two GPUs).
class PinnedWord {
 public:
  static absl::StatusOr<PinnedWord> Take() {
    int device = 0;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(Mu());
    auto& free = Free()[device];
    if (free.empty()) {
      constexpr int kWords = 256;
      void* page = nullptr;
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&page, kWords * 2 * sizeof(int),
                                                  cudaHostAllocMapped | cudaHostAllocPortable));
      void* mapped = nullptr;
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&mapped, page, 0));
      void* scratch = nullptr;
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch, kWords * 4 * sizeof(int)));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemset(scratch, 0, kWords * 4 * sizeof(int)));
      for (int i = 0; i < kWords; ++i)
        free.push_back({static_cast<int*>(page) + 2 * i, static_cast<int*>(mapped) + 2 * i,
                        static_cast<int*>(scratch) + 4 * i, device});
    }
    PinnedWord w;
    w.p_ = free.back();
    free.pop_back();
    return w;
  }
  PinnedWord() = default;
  PinnedWord(PinnedWord&& o) noexcept : p_(std::exchange(o.p_, Ptrs{})) {}
  PinnedWord& operator=(PinnedWord&& o) noexcept {
    if (this != &o) {
      Release();
      p_ = std::exchange(o.p_, Ptrs{});
    }
    return *this;
  }
  ~PinnedWord() { Release(); }
  int* get() const { return p_.host; }        // the word (two ints), for the host
  int* mapped() const { return p_.mapped; }   // the same word, for a kernel to write
  int* scratch() const { return p_.scratch; }  // device ints: the answer, the second value,
                                               // blocks done, and one the kernel may count in

 private:
  struct Ptrs {
    int* host = nullptr;
    int* mapped = nullptr;
    int* scratch = nullptr;
    int device = 0;
  };
  static std::mutex& Mu() {
    static std::mutex mu;
    return mu;
  }
  static std::map<int, std::vector<Ptrs>>& Free() {  // by device
    static std::map<int, std::vector<Ptrs>> free;
    return free;
  }
  void Release() {
    if (p_.host == nullptr) return;
    std::lock_guard<std::mutex> lock(Mu());
    const int device = p_.device;
    Free()[device].push_back(std::exchange(p_, Ptrs{}));
  }
  Ptrs p_;
};

#ifdef __CUDACC__
// One thread of each block, after its block's last write to scratch[0] and scratch[1]
// (atomics): the grid's last block to get here writes them to the host word through its
// mapping and leaves the scratch zero for the word's next launch.
__device__ __forceinline__ void PublishAnswer(int* scratch, int* mapped) {
  __threadfence();  // this block's answer before its count
  if (atomicAdd(&scratch[2], 1) == int(gridDim.x) - 1) {
    __threadfence();  // every block's answer after their counts
    static_cast<volatile int*>(mapped)[1] = atomicExch(&scratch[1], 0);
    static_cast<volatile int*>(mapped)[0] = atomicExch(&scratch[0], 0);
    scratch[2] = 0;
    scratch[3] = 0;  // (a count of the kernel's own: thomas-window's first chunks stored)
  }
}
#endif

}  // namespace trisolve::cuda
