// dgtsv's elimination step, shared by the pivoting sweep (pivoting.cu) and the split
// (pivoting_split.cu): the same arithmetic, term for term, in both.
#pragma once

#include "common/numerics.cuh"

namespace trisolve::cuda {

// One step of dgtsv's elimination: the pivot row's state (d: D[i], u: DU[i], r: the right-hand
// side of row i) meets row k = i + 1 (a, b, c: c_k where k + 1 < n else 0, y: its right-hand
// side). Gives row i of U (oD, oU, oL: dgtsv's DU2, oY) and leaves the state of row k. The
// expressions are the reference's, term for term.
template <typename T>
__device__ __forceinline__ void Absorb(T& d, T& u, T& r, T a, T b, T c, T y, bool& ok, T& oD,
                                       T& oU, T& oL, T& oY) {
  if (fabs(d) >= fabs(a)) {
    ok &= d != T(0) && Finite(d);
    const T f = a / d;
    oD = d;
    oU = u;
    oL = T(0);
    oY = r;
    d = b - f * u;
    u = c;
    r = y - f * r;
  } else {  // rows i and k interchanged
    ok &= Finite(a);
    const T f = d / a;
    oD = a;
    oU = b;
    oL = c;
    oY = y;
    d = u - f * b;
    u = -f * c;
    r = r - f * y;
  }
}

}  // namespace trisolve::cuda
