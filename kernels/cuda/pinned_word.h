// A word of pinned host memory: the one-int answers of the windows' checks (the tridiagonal
// windows' failure word, the block sweeps' halo) read back without the pageable copy's staging.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "check.h"

namespace trisolve::cuda {

// Pages of 1024 words are allocated as calls in flight need them and kept for the process (a few
// KB); a word goes back when its holder is destroyed.
class PinnedWord {
 public:
  static absl::StatusOr<PinnedWord> Take() {
    std::lock_guard<std::mutex> lock(Mu());
    auto& free = Free();
    if (free.empty()) {
      void* page = nullptr;
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&page, 1024 * sizeof(int), 0));
      for (int i = 0; i < 1024; ++i) free.push_back(static_cast<int*>(page) + i);
    }
    PinnedWord w;
    w.p_ = free.back();
    free.pop_back();
    return w;
  }
  PinnedWord() = default;
  PinnedWord(PinnedWord&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PinnedWord& operator=(PinnedWord&&) = delete;
  ~PinnedWord() {
    if (p_ == nullptr) return;
    std::lock_guard<std::mutex> lock(Mu());
    Free().push_back(p_);
  }
  int* get() const { return p_; }

 private:
  static std::mutex& Mu() {
    static std::mutex mu;
    return mu;
  }
  static std::vector<int*>& Free() {
    static std::vector<int*> free;
    return free;
  }
  int* p_ = nullptr;
};

}  // namespace trisolve::cuda
