// The dense family's dispatch on the device: the one place where a DenseMethod (auto included)
// becomes the path that runs it. The CUDA backend stages the arrays and runs the path.
#pragma once

#include <cstdint>

#include "trisolve/dense.h"

namespace trisolve::cuda {

enum class DensePath {
  kHouseholderPcrBlock,  // "householder-pcr-block": one block a system (n <= 64)
  kHouseholderPcr,       // "householder-pcr (cusolver sytrd)": cuSOLVER's sytrd, then the
                         // tridiagonal kernels
  kGaussJordanBlocked,   // "gauss-jordan-blocked" (n > kDenseGpuMaxN, asked for by name)
  kLu,                   // LU through cuBLAS / cuSOLVER
  kGaussJordanSmall,     // Gauss-Jordan, a warp, two warps or a block a system (n <= 128)
};

// Small systems (n <= kDenseGpuMaxN): Gauss-Jordan, a warp, two warps or a block a system.
// Larger n: LU through cuBLAS/cuSOLVER (auto, lu: 2n^3/3 flops), or blocked Gauss-Jordan when
// asked for by name (n^3). householder-pcr: one block a system up to n = 64, cuSOLVER's sytrd
// and the tridiagonal kernels above.
DensePath ChooseDensePath(int64_t n, DenseMethod m);

}  // namespace trisolve::cuda
