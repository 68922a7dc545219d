// What the GPU benchmarks share: checked CUDA calls and a median timing with CUDA events.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace trisolve::bench {

// Median time in ms of `reps` runs of fn, each preceded (untimed) by prep, after a warm-up; a
// routine whose warm-up takes over 50 ms gets 3 timed runs.
inline double TimeIt(int reps, const std::function<void()>& prep,
                     const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  prep();
  CK(cudaEventRecord(a));
  fn();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float warm;
  CK(cudaEventElapsedTime(&warm, a, b));
  if (warm > 50) reps = std::min(reps, 3);
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    prep();
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline double TimeIt(int reps, const std::function<void()>& fn) { return TimeIt(reps, [] {}, fn); }

// A large device-to-device copy, bytes read + written per second / 1e9: the ceiling.
inline double CopyGBs(int reps) {
  const size_t cb = size_t(1) << 30;
  void *src, *dst;
  CK(cudaMalloc(&src, cb));
  CK(cudaMalloc(&dst, cb));
  CK(cudaMemset(src, 1, cb));
  const double ms = TimeIt(reps, [&] { CK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice)); });
  CK(cudaFree(src));
  CK(cudaFree(dst));
  return 2.0 * cb / ms / 1e6;
}

}  // namespace trisolve::bench
