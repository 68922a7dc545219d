#include "dense/dispatch.h"

#include "dense/dense.h"

namespace trisolve::cuda {

DensePath ChooseDensePath(int64_t n, DenseMethod m) {
  const bool small = n <= kDenseGpuMaxN;
  if (m == DenseMethod::kHouseholderPcr && n <= kHouseholderBlockMaxN)
    return DensePath::kHouseholderPcrBlock;
  if (m == DenseMethod::kHouseholderPcr) return DensePath::kHouseholderPcr;
  if (m == DenseMethod::kGaussJordan && !small) return DensePath::kGaussJordanBlocked;
  if (m == DenseMethod::kLu || !small) return DensePath::kLu;
  return DensePath::kGaussJordanSmall;
}

}  // namespace trisolve::cuda
