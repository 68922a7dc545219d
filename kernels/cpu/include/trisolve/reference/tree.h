// The CPU reference for tree (Hines) systems
// (kernels/cpu/tree.cc): the solvers the CPU backend runs, the GPU tests compare with and the CUDA
// backend falls back on. Not part of the public API (trisolve/tree.h); reached through the
// trisolve_reference target.
#pragma once

#include "trisolve/tree.h"

namespace trisolve {

namespace cpu {
template <typename T>
SolveInfo SolveTree(const TreeProblem<T>& p, TreeMethod method, TreeOutput<T> out);
}  // namespace cpu

}  // namespace trisolve
