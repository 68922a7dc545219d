// The CPU reference for block-tridiagonal systems
// (kernels/cpu/block_tridiagonal.cc): the solvers the CPU backend runs, the GPU tests compare with
// and the CUDA backend falls back on. Not part of the public API (trisolve/block_tridiagonal.h);
// reached through the trisolve_reference target.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trisolve/block_tridiagonal.h"

namespace trisolve {

namespace cpu {
// What a method sets up from the coefficients alone, before its first iteration: auto's
// symmetry test (its choice of method), the zero-row and line-pivot tests, the multigrid
// hierarchy with its diagonals' sign, and the line solves' factors (Thomas' pivots' reciprocals
// and normalised super-diagonals) for cg and bicgstab+lines. A prepared system keeps it
// (PrepareBlock), so that a solve by handle runs the iterations alone; only what the method
// (and auto's fall-backs for this matrix) can use is built. Read-only once built: solves that
// share it may run at once.
template <typename T>
struct BlockSetup;
// The setup for solving p's matrix by `method` with `options` (p.f and p.y0 unread).
template <typename T>
std::shared_ptr<const BlockSetup<T>> PrepareBlock(const BlockTridiagonalProblem<T>& p,
                                                  BlockMethod method, const BlockOptions& options);
// The values it holds, in bytes, and what it holds in words ("multigrid hierarchy (6 levels)").
template <typename T>
int64_t BlockSetupBytes(const BlockSetup<T>& setup);
template <typename T>
std::string DescribeBlockSetup(const BlockSetup<T>& setup);

// CANCELLED when control says the caller has gone (checked once per sweep). kept: the setup
// PrepareBlock made from p's coefficients with the same method and options, used instead of
// building it again; x is bit for bit the answer without it.
template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonal(const BlockTridiagonalProblem<T>& p, BlockMethod method,
                                const BlockOptions& options, BlockOutput<T> out,
                                const SolveControl& control = {},
                                const BlockSetup<T>* kept = nullptr);
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
