// The CUDA backend for the GPU tests, made once; tests skip, saying why, where none exists.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "trisolve/backend.h"

namespace trisolve::testing {

inline Backend* Cuda() {
  static std::unique_ptr<Backend> be = [] {
    CudaOptions o;
    o.host_below_unknowns = 0;  // the kernels, however small the test's systems
    auto b = MakeCudaBackend(o);
    if (!b.ok()) {
      std::fprintf(stderr, "[ CUDA     ] no CUDA backend here: %s\n",
                   std::string(b.status().message()).c_str());
      return std::unique_ptr<Backend>();
    }
    return *std::move(b);
  }();
  return be.get();
}

}  // namespace trisolve::testing

#define REQUIRE_GPU()                                   \
  if (::trisolve::testing::Cuda() == nullptr) GTEST_SKIP() << "no CUDA device: GPU test skipped"

// Skips, saying so, where fewer than k devices are present.
#define REQUIRE_GPUS(k)                                                                   \
  if (const int present_ = ::trisolve::CudaDeviceCount(); present_ < (k))                 \
  GTEST_SKIP() << "needs " << (k) << " CUDA devices, " << present_ << " present: skipped"
