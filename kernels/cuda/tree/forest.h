// Tree cells of different sizes on the device (TreeProblem::offsets): solved as ONE tree whose
// cells' roots hang from one another (ForestAsOneTree, trisolve/tree.h) by the one-tree paths
// (cables, cables-block, contraction-block), the couplings that join the roots set to exact
// zeros on the device copy first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trisolve::cuda {

// Sets lower[roots[k]] and upper[roots[k]] to zero for k < count (device arrays; roots: the
// first node of every cell but the first): the joined tree's matrix is then the cells'
// block-diagonal matrix.
template <typename T>
absl::Status ZeroForestCouplings(T* lower, T* upper, const int32_t* roots, int64_t count,
                                 cudaStream_t stream);

}  // namespace trisolve::cuda
