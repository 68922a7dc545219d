// The CPU reference for block-tridiagonal systems
// (kernels/cpu/block_tridiagonal.cc): the solvers the CPU backend runs, the GPU tests compare with
// and the CUDA backend falls back on. Not part of the public API (trisolve/block_tridiagonal.h);
// reached through the trisolve_reference target.
#pragma once

#include "trisolve/block_tridiagonal.h"

namespace trisolve {

namespace cpu {
// CANCELLED when control says the caller has gone (checked once per sweep).
template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonal(const BlockTridiagonalProblem<T>& p, BlockMethod method,
                                const BlockOptions& options, BlockOutput<T> out,
                                const SolveControl& control = {});
// auto's fallback for a system CG cannot solve (not definite): BiCGStab from y0, preconditioned
// by the V-cycle where every level's diagonals share a sign, else by the line solves where no
// C_i is singular, else by nothing; method "multigrid-bicgstab", "bicgstab+lines" or
// "bicgstab". SINGULAR only for a zero row. The CUDA backend calls it on the host when its CG
// stops on an indefinite matrix.
template <typename T>
absl::StatusOr<SolveInfo> SolveBlockIndefinite(const BlockTridiagonalProblem<T>& p,
                                               const BlockOptions& options, BlockOutput<T> out,
                                               const SolveControl& control = {});
}  // namespace cpu

}  // namespace trisolve
