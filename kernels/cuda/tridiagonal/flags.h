// The per-system flags byte that the tridiagonal kernels write (and the families that solve
// tridiagonal systems on the device read), as bits: a kernel solving a reduced system ORs its
// own into those of the level above.
#pragma once

#include <cstdint>

namespace trisolve::cuda {

// A pivot vanished or x is not finite: the explicit methods' SINGULAR (x zeroed).
constexpr uint8_t kFlagVanished = 1;
// A row of the system is not diagonally dominant (|b| < |a| + |c|, or a NaN or infinity), so no
// fast elimination's answer is certified stable: `auto` and `pivoting` solve the system again
// by the pivoting sweep; for every other caller the answer stands (never a status).
// docs/kernels/tridiagonal.md, "Certified by dominance".
constexpr uint8_t kFlagNotDominant = 2;

}  // namespace trisolve::cuda
