// Device-side numerical rules shared by the CUDA kernels: the vanishing-pivot test of the CPU
// reference (trisolve/types.h) and one PCR step (the PCR notes).
#pragma once

#include <cfloat>

namespace trisolve::cuda {

// 16 bytes of T as one vector (one 16-byte load or store) and back.
template <typename T> struct Vec16;
template <> struct Vec16<double> { using type = double2; };
template <> struct Vec16<float> { using type = float4; };
__device__ __forceinline__ void Unpack(double2 v, double* o) { o[0] = v.x; o[1] = v.y; }
__device__ __forceinline__ void Unpack(float4 v, float* o) {
  o[0] = v.x;
  o[1] = v.y;
  o[2] = v.z;
  o[3] = v.w;
}
// The 16-byte word c of a buffer in shared memory at c ^ ((c >> 3) & 7): an XOR swizzle within
// each 128-byte line, so that threads reading their own runs of consecutive 16-byte words, a
// run's length apart, meet no bank conflict (the streamed tridiagonal kernels' buffers).
__device__ __forceinline__ int Swizzle16(int c) { return c ^ ((c >> 3) & 7); }

__device__ __forceinline__ double2 Pack(const double* o) { return make_double2(o[0], o[1]); }
__device__ __forceinline__ float4 Pack(const float* o) {
  return make_float4(o[0], o[1], o[2], o[3]);
}

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
  const T m = fabs(p);  // (two comparisons: m > Eps scale fails for m = 0 and NaN alike)
  return !(m > Eps<T>() * scale && m <= MaxFinite<T>());
}

template <typename T>
__device__ __forceinline__ bool Finite(T v) {
  return fabs(v) <= MaxFinite<T>();
}

// 1 / x without the division's special-case branch: the hardware's approximate reciprocal
// refined by Newton steps (two in float64: ~2^-22 -> below an ulp; one in float32), within an
// ulp or two of the rounded quotient. Zero, infinite and NaN x give a non-finite result or 0,
// as the callers' vanishing-pivot and finiteness checks expect; |x| near the largest finite
// value (1/x subnormal) gives 0 (flush to zero). The partitioned kernels spend much of their
// instructions on divisions, whose IEEE sequence carries a slow-path branch (H100 profile,
// NOTES.md t15).
__device__ __forceinline__ double Rcp(double x) {
  double r;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(x));
  double e = fma(-x, r, 1.0);
  r = fma(r, e, r);
  e = fma(-x, r, 1.0);
  return fma(r, e, r);
}
__device__ __forceinline__ float Rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  const float e = fmaf(-x, r, 1.0f);
  return fmaf(r, e, r);
}

// One PCR step for row i of the arrays A, B, C, D (the PCR notes): combine it with rows il and
// ir (i - stride and i + stride), which exist when has_l / has_r: k1 = a_i / b_l,
// k2 = c_i / b_r, a' = -a_l k1, c' = -c_r k2, b' = b_i - c_l k1 - a_r k2,
// d' = d_i - d_l k1 - d_r k2. `at` maps a row to its place in the arrays. kLazy: a neighbour
// (and a_i, c_i) is read only when it is used; otherwise every value is read first (an absent
// neighbour reads row i), which the compiler schedules better in some kernels -- measured per
// kernel on the H100, see the callers. Returns false if a pivot vanished.
template <bool kLazy, typename T, typename At>
__device__ __forceinline__ bool PcrCombine(const T* A, const T* B, const T* C, const T* D, int i,
                                           bool has_l, int il, bool has_r, int ir, At at, T& an,
                                           T& bn, T& cn, T& dn) {
  const int e = at(i);
  T a = T(0), c = T(0), b = B[e], d = D[e], scale = fabs(b);
  T ai = T(0), ci = T(0), al = T(0), bl = T(0), cl = T(0), dl = T(0);
  T ar = T(0), br = T(0), cr = T(0), dr = T(0);
  if constexpr (!kLazy) {
    const int el = at(has_l ? il : i), er = at(has_r ? ir : i);
    ai = A[e];
    ci = C[e];
    al = A[el], bl = B[el], cl = C[el], dl = D[el];
    ar = A[er], br = B[er], cr = C[er], dr = D[er];
  }
  bool ok = true;
  if (has_l) {
    if constexpr (kLazy) {
      const int el = at(il);
      ai = A[e];
      al = A[el], bl = B[el], cl = C[el], dl = D[el];
    }
    ok &= !Vanishes(bl, fabs(bl));
    const T k1 = ai * Rcp(bl);
    a = -al * k1;
    b -= cl * k1;
    d -= dl * k1;
    scale += fabs(cl * k1);
  }
  if (has_r) {
    if constexpr (kLazy) {
      const int er = at(ir);
      ci = C[e];
      ar = A[er], br = B[er], cr = C[er], dr = D[er];
    }
    ok &= !Vanishes(br, fabs(br));
    const T k2 = ci * Rcp(br);
    c = -cr * k2;
    b -= ar * k2;
    d -= dr * k2;
    scale += fabs(ar * k2);
  }
  an = a;
  bn = b;
  cn = c;
  dn = d;
  return ok && !Vanishes(b, scale);
}

}  // namespace trisolve::cuda
