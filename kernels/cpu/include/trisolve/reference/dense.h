// The CPU reference for small dense systems
// (kernels/cpu/dense.cc): the solvers the CPU backend runs, the GPU tests compare with and the CUDA
// backend falls back on. Not part of the public API (trisolve/dense.h); reached through the
// trisolve_reference target.
#pragma once

#include "trisolve/dense.h"

namespace trisolve {

namespace cpu {
template <typename T>
SolveInfo SolveDense(const DenseProblem<T>& p, DenseMethod method, DenseOutput<T> out);
}  // namespace cpu

}  // namespace trisolve
