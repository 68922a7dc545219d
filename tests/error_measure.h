// Error measures that cannot be fooled by NaN: std::max(worst, NaN) keeps worst, so a NaN
// (an element never written, a breakdown) would score as no error at all. Every running
// maximum of an error in the tests goes through WorseOf.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace trisolve::testing {

// The larger of two error values; a NaN in either is the worst error there is (+inf).
inline double WorseOf(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
  return std::max(a, b);
}

}  // namespace trisolve::testing
