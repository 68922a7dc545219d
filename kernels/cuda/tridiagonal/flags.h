// The per-system flags byte that the tridiagonal kernels write (and the families that solve
// tridiagonal systems on the device read), as bits: a kernel solving a reduced system ORs its
// own into those of the level above.
#pragma once

#include <cstdint>

namespace trisolve::cuda {

// A pivot vanished or x is not finite: the explicit methods' SINGULAR (x zeroed).
constexpr uint8_t kFlagVanished = 1;
// A row of the system is not diagonally dominant by kDominanceRatio (|a| + |c| > kDominanceRatio
// |b|, or a NaN or infinity), so no fast kernel's answer is certified stable: `auto` and
// `pivoting` solve the system again by the pivoting sweep; for every other caller the answer
// stands (never a status). docs/kernels/tridiagonal.md, "Certified by dominance".
constexpr uint8_t kFlagNotDominant = 2;

// The dominance a row needs to be certified: |a| + |c| <= kDominanceRatio |b|. Under 1: weak
// dominance certifies Thomas but not the PCR the partitioned kernels solve their reduced
// systems by (dorr, |b| = |a| + |c| in every row: backward error 0.03 on the GPU). The value is
// measured on the CPU's PCR (the GPU's arithmetic) by test_stability's
// PcrNeedsAMarginBelowWeakDominance, which keeps it true.
constexpr double kDominanceRatio = 0.99;

}  // namespace trisolve::cuda
