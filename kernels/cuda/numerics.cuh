// Device-side numerical rules shared by the CUDA kernels: the vanishing-pivot test of the CPU
// reference (trisolve/types.h) and one PCR step (the PCR notes).
#pragma once

#include <cfloat>

namespace trisolve::cuda {

template <typename T>
__device__ __forceinline__ T Eps();
template <>
__device__ __forceinline__ double Eps<double>() { return DBL_EPSILON; }
template <>
__device__ __forceinline__ float Eps<float>() { return FLT_EPSILON; }

template <typename T>
__device__ __forceinline__ T MaxFinite();
template <>
__device__ __forceinline__ double MaxFinite<double>() { return DBL_MAX; }
template <>
__device__ __forceinline__ float MaxFinite<float>() { return FLT_MAX; }

// A pivot vanishes when zero, not finite, or cancelled below the rounding level of its terms.
template <typename T>
__device__ __forceinline__ bool Vanishes(T p, T scale) {
  const T m = fabs(p);
  return !(m <= MaxFinite<T>()) || m <= Eps<T>() * scale || m == T(0);
}

template <typename T>
__device__ __forceinline__ bool Finite(T v) {
  return fabs(v) <= MaxFinite<T>();
}

// One PCR step for row i (the PCR notes): combine it with rows i - stride and i + stride, which
// exist when has_l / has_r: k1 = a_i / b_l, k2 = c_i / b_r, a' = -a_l k1, c' = -c_r k2,
// b' = b_i - c_l k1 - a_r k2, d' = d_i - d_l k1 - d_r k2. Returns false if a pivot vanished.
template <typename T>
__device__ __forceinline__ bool PcrCombine(T ai, T bi, T ci, T di, bool has_l, T al, T bl, T cl,
                                           T dl, bool has_r, T ar, T br, T cr, T dr, T& an,
                                           T& bn, T& cn, T& dn) {
  bool ok = true;
  an = T(0);
  cn = T(0);
  bn = bi;
  dn = di;
  T scale = fabs(bi);
  if (has_l) {
    ok &= !Vanishes(bl, fabs(bl));
    const T k1 = ai / bl;
    an = -al * k1;
    bn -= cl * k1;
    dn -= dl * k1;
    scale += fabs(cl * k1);
  }
  if (has_r) {
    ok &= !Vanishes(br, fabs(br));
    const T k2 = ci / br;
    cn = -cr * k2;
    bn -= ar * k2;
    dn -= dr * k2;
    scale += fabs(ar * k2);
  }
  return ok && !Vanishes(bn, scale);
}

}  // namespace trisolve::cuda
