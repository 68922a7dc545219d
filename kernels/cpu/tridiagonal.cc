// CPU reference for batched tridiagonal systems: Thomas, parallel cyclic reduction, the
// partitioned method and partial pivoting (dgtsv).
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.h"

namespace trisolve {
namespace cpu {

// Thomas' outcome in auto's checked form: the elimination grew past kThomasGrowthLimit.
enum class ThomasOutcome { kOk, kVanished, kGrowth };

// Forward elimination keeps c' in `cp` and d' in x itself; no pivoting, so a pivot that cancels
// to rounding level is a breakdown and is reported, not divided by. With kCheckGrowth, a row
// whose |a_k c'_{k-1}| (the entry of |L||U| beside the pivot) passes kThomasGrowthLimit times
// the row's own |a| + |b| + |c| is reported too: LU without pivoting has a backward error of
// about eps |L||U|, so past that limit the answer may be poor though no pivot vanished.
template <bool kCheckGrowth, typename T>
ThomasOutcome ThomasSweep(int64_t n, int64_t s, const T* a, const T* b, const T* c, const T* d,
                          T* x, T* cp) {
  if (PivotVanishes(b[0], std::abs(b[0]))) return ThomasOutcome::kVanished;
  T inv = T(1) / b[0];
  cp[0] = n > 1 ? c[0] * inv : T(0);
  x[0] = d[0] * inv;
  bool grew = false;
  for (int64_t k = 1; k < n; ++k) {
    const T ac = a[k * s] * cp[k - 1];
    const T gamma = b[k * s] - ac;
    if (PivotVanishes(gamma, std::abs(b[k * s]) + std::abs(ac))) return ThomasOutcome::kVanished;
    if constexpr (kCheckGrowth)
      grew |= std::abs(ac) > T(kThomasGrowthLimit) * (std::abs(a[k * s]) + std::abs(b[k * s]) +
                                                      (k + 1 < n ? std::abs(c[k * s]) : T(0)));
    inv = T(1) / gamma;
    cp[k] = k + 1 < n ? c[k * s] * inv : T(0);
    x[k * s] = (d[k * s] - a[k * s] * x[(k - 1) * s]) * inv;
  }
  if (grew) return ThomasOutcome::kGrowth;
  for (int64_t k = n - 2; k >= 0; --k) x[k * s] -= cp[k] * x[(k + 1) * s];
  return AllFinite(n, s, x) ? ThomasOutcome::kOk : ThomasOutcome::kVanished;
}

template <typename T>
bool ThomasStrided(int64_t n, int64_t s, const T* a, const T* b, const T* c, const T* d,
                   T* x, T* cp) {
  return ThomasSweep<false>(n, s, a, b, c, d, x, cp) == ThomasOutcome::kOk;
}

template <typename T>
bool PivotingStrided(int64_t n, int64_t s, const T* a, const T* b, const T* c, const T* d,
                     T* x, T* work) {
  // LAPACK dgtsv's elimination (one right-hand side): at step i the row of the larger of
  // |D_i| and |DL_i| is the pivot row; an interchange moves row i + 1's super-diagonal into a
  // second super-diagonal of U, kept in DL (DU2 in dgtsv). Growth is at most 2 a step's
  // column, so the backward error is a small multiple of eps ||A|| for every nonsingular
  // matrix. A pivot is tested only for being exactly zero or not finite: partial pivoting
  // picks the largest candidate, so a zero pivot means the column is zero below the diagonal
  // (the matrix is singular to working precision), not a cancellation a reordering could
  // avoid.
  T* D = work;
  T* DU = D + n;
  T* DL = DU + n;
  for (int64_t k = 0; k < n; ++k) {
    D[k] = b[k * s];
    DU[k] = k + 1 < n ? c[k * s] : T(0);
    DL[k] = k + 1 < n ? a[(k + 1) * s] : T(0);
    x[k * s] = d[k * s];
  }
  for (int64_t i = 0; i + 1 < n; ++i) {
    T* xi = x + i * s;
    T* xn = xi + s;
    if (std::abs(D[i]) >= std::abs(DL[i])) {
      if (D[i] == T(0) || !std::isfinite(D[i])) return false;
      const T fact = DL[i] / D[i];
      D[i + 1] -= fact * DU[i];
      *xn -= fact * *xi;
      DL[i] = T(0);
    } else {  // rows i and i + 1 interchanged
      if (!std::isfinite(DL[i])) return false;
      const T fact = D[i] / DL[i];
      D[i] = DL[i];
      const T temp = D[i + 1];
      D[i + 1] = DU[i] - fact * temp;
      if (i + 2 < n) {
        DL[i] = DU[i + 1];
        DU[i + 1] = -fact * DL[i];
      } else {
        DL[i] = T(0);
      }
      DU[i] = temp;
      const T t = *xi;
      *xi = *xn;
      *xn = t - fact * *xn;
    }
  }
  if (D[n - 1] == T(0) || !std::isfinite(D[n - 1])) return false;
  x[(n - 1) * s] /= D[n - 1];
  if (n > 1) x[(n - 2) * s] = (x[(n - 2) * s] - DU[n - 2] * x[(n - 1) * s]) / D[n - 2];
  for (int64_t i = n - 3; i >= 0; --i)
    x[i * s] = (x[i * s] - DU[i] * x[(i + 1) * s] - DL[i] * x[(i + 2) * s]) / D[i];
  return AllFinite(n, s, x);
}

template <typename T>
bool PcrStrided(int64_t n, int64_t s, const T* a, const T* b, const T* c, const T* d, T* x,
                T* work) {
  // Parallel cyclic reduction as in the PCR notes: at each step row i is combined with rows
  // i - stride and i + stride (k1 = a_i / b_{i-s}, k2 = c_i / b_{i+s}), the stride doubling
  // until every row is decoupled. Rows outside [0, n) act as identity rows, which is what
  // makes every n work, not only powers of two: ceil(log2 n) steps.
  T* A = work;
  T* B = A + n;
  T* C = B + n;
  T* D = C + n;
  T* A2 = D + n;
  T* B2 = A2 + n;
  T* C2 = B2 + n;
  T* D2 = C2 + n;
  for (int64_t i = 0; i < n; ++i) {
    A[i] = i > 0 ? a[i * s] : T(0);
    B[i] = b[i * s];
    C[i] = i + 1 < n ? c[i * s] : T(0);
    D[i] = d[i * s];
  }
  for (int64_t stride = 1; stride < n; stride *= 2) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t il = i - stride, ir = i + stride;
      T k1 = T(0), k2 = T(0), an = T(0), cn = T(0);
      T bn = B[i], dn = D[i], scale = std::abs(B[i]);
      if (il >= 0) {
        if (PivotVanishes(B[il], std::abs(B[il]))) return false;
        k1 = A[i] / B[il];
        an = -A[il] * k1;
        bn -= C[il] * k1;
        dn -= D[il] * k1;
        scale += std::abs(C[il] * k1);
      }
      if (ir < n) {
        if (PivotVanishes(B[ir], std::abs(B[ir]))) return false;
        k2 = C[i] / B[ir];
        cn = -C[ir] * k2;
        bn -= A[ir] * k2;
        dn -= D[ir] * k2;
        scale += std::abs(A[ir] * k2);
      }
      if (PivotVanishes(bn, scale)) return false;
      A2[i] = an;
      B2[i] = bn;
      C2[i] = cn;
      D2[i] = dn;
    }
    std::swap(A, A2);
    std::swap(B, B2);
    std::swap(C, C2);
    std::swap(D, D2);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (PivotVanishes(B[i], std::abs(B[i]))) return false;
    x[i * s] = D[i] / B[i];
  }
  return AllFinite(n, s, x);
}

template <typename T>
bool PartitionedStrided(int64_t n, int64_t s, int M, const T* a, const T* b, const T* c,
                        const T* d, T* x, T* work) {
  // The sequential form of the CUDA backend's partitioned kernel: each chunk of M rows is
  // reduced by the modified Thomas algorithm to two rows coupling its first and last unknowns
  // to the neighbouring chunks; the reduced system (2 rows a chunk) is solved by Thomas; the
  // interior unknowns follow. Rows past n are identity rows.
  const int64_t nch = (n + M - 1) / M, rn = 2 * nch;
  T* ca = work;  // the reduced chunk coefficients, padded length nch * M each
  T* cc = ca + nch * M;
  T* cd = cc + nch * M;
  T* ra = cd + nch * M;  // the reduced system, rn each
  T* rb = ra + rn;
  T* rc = rb + rn;
  T* rd = rc + rn;
  // (ca, cc, cd take 3 nch M <= 3 (n + M) values; ra..rd take 8 nch <= 8 (n / M + 1).)
  std::vector<T> xr(rn), wr(rn);
  bool ok = true;
  for (int64_t j = 0; j < nch; ++j) {
    T* A = ca + j * M;
    T* C = cc + j * M;
    T* D = cd + j * M;
    std::vector<T> B(M);
    for (int i = 0; i < M; ++i) {
      const int64_t k = j * M + i;
      const bool live = k < n;
      A[i] = live && k > 0 ? a[k * s] : T(0);
      B[i] = live ? b[k * s] : T(1);
      C[i] = live && k + 1 < n ? c[k * s] : T(0);
      D[i] = live ? d[k * s] : T(0);
    }
    for (int i = 0; i < std::min(M, 2); ++i) {
      ok &= !PivotVanishes(B[i], std::abs(B[i]));
      const T r = T(1) / B[i];
      A[i] *= r;
      C[i] *= r;
      D[i] *= r;
    }
    for (int i = 2; i < M; ++i) {
      const T t = A[i] * C[i - 1];
      const T piv = B[i] - t;
      ok &= !PivotVanishes(piv, std::abs(B[i]) + std::abs(t));
      const T r = T(1) / piv;
      D[i] = r * (D[i] - A[i] * D[i - 1]);
      A[i] = -r * A[i] * A[i - 1];
      C[i] = r * C[i];
    }
    for (int i = M - 3; i >= 1; --i) {
      D[i] -= C[i] * D[i + 1];
      A[i] -= C[i] * A[i + 1];
      C[i] = -C[i] * C[i + 1];
    }
    if (M >= 3) {
      const T t = C[0] * A[1];
      const T piv = T(1) - t;
      ok &= !PivotVanishes(piv, T(1) + std::abs(t));
      const T r = T(1) / piv;
      D[0] = r * (D[0] - C[0] * D[1]);
      A[0] = r * A[0];
      C[0] = -r * C[0] * C[1];
    }
    ra[2 * j] = A[0];
    rb[2 * j] = T(1);
    rc[2 * j] = C[0];
    rd[2 * j] = D[0];
    ra[2 * j + 1] = A[M - 1];
    rb[2 * j + 1] = T(1);
    rc[2 * j + 1] = C[M - 1];
    rd[2 * j + 1] = D[M - 1];
  }
  if (!ok) return false;
  if (!ThomasStrided<T>(rn, 1, ra, rb, rc, rd, xr.data(), wr.data())) return false;
  for (int64_t j = 0; j < nch; ++j) {
    const T x0 = xr[2 * j], xl = xr[2 * j + 1];
    for (int i = 0; i < M; ++i) {
      const int64_t k = j * M + i;
      if (k >= n) break;
      const T v = i == 0 ? x0 : i == M - 1 ? xl : cd[j * M + i] - ca[j * M + i] * x0 - cc[j * M + i] * xl;
      x[k * s] = v;
    }
  }
  return AllFinite(n, s, x);
}

// The longest system of p (p.n, but for a variable-size batch, whose n is not trusted here).
template <typename T>
int64_t LongestSystem(const TridiagonalProblem<T>& p) {
  if (!p.variable()) return p.n;
  int64_t n = 0;
  for (int64_t s = 0; s < p.batch; ++s) n = std::max(n, p.rows(s));
  return n;
}

// System s's coefficients: in place, or (unified layout, flat) gathered from their triples into
// `scratch` (3 n values), so that every solver runs the same arithmetic on either layout.
template <typename T>
void Coefficients(const TridiagonalProblem<T>& p, int64_t off, int64_t n, std::vector<T>& scratch,
                  const T** a, const T** b, const T** c) {
  if (!p.unified()) {
    *a = p.a + off;
    *b = p.b + off;
    *c = p.c + off;
    return;
  }
  scratch.resize(size_t(3 * n));
  T* ga = scratch.data();
  T* gb = ga + n;
  T* gc = gb + n;
  const int64_t cs = p.coef_stride;
  for (int64_t k = 0; k < n; ++k) {
    ga[k] = p.a[(off + k) * cs];
    gb[k] = p.b[(off + k) * cs];
    gc[k] = p.c[(off + k) * cs];
  }
  *a = ga;
  *b = gb;
  *c = gc;
}

template <typename T>
SolveInfo SolveTridiagonal(const TridiagonalProblem<T>& p, TridiagonalMethod method,
                           TridiagonalOutput<T> out) {
  // auto: on one CPU core Thomas does the fewest operations (8n against PCR's ~12 n log n);
  // a system whose pivot vanished or whose elimination grew is solved again by pivoting
  // (Thomas' x is written over), so a nonsingular system never comes back SINGULAR.
  const bool automatic = method == TridiagonalMethod::kAuto;
  const int64_t stride = p.variable() ? 1 : ElementStride(p.layout, p.batch);
  const int64_t longest = LongestSystem(p);
  constexpr int kChunk = 8;  // as the CUDA backend's partitioned kernel
  const int64_t work_per_system =
      method == TridiagonalMethod::kPcr           ? 8 * longest
      : method == TridiagonalMethod::kPartitioned ? 3 * (longest + kChunk) + 8 * (longest / kChunk + 1)
      : method == TridiagonalMethod::kPivoting || automatic ? 3 * longest
                                                  : longest;
  int64_t resolved = 0;
  // Fewer large systems than threads: pivoting goes one system at a time over every core
  // (PivotingSplit), and auto leaves its Thomas failures to ResolveSingularWithPivoting, which
  // does the same.
  const bool split = p.batch < omp_get_max_threads() && SplitPivotingParts<T>(longest) > 0;
  if (split && method == TridiagonalMethod::kPivoting) {
    std::vector<T> coefficients;
    for (int64_t s = 0; s < p.batch; ++s) {
      const int64_t off = p.first(s), n = p.rows(s);
      const T *a, *b, *c;
      Coefficients(p, off, n, coefficients, &a, &b, &c);
      T* x = out.x + off;
      const int64_t parts = SplitPivotingParts<T>(n);
      bool ok;
      if (parts > 0) {
        ok = PivotingSplit(n, stride, a, b, c, p.d + off, x, parts).ok;
      } else {
        std::vector<T> work(static_cast<size_t>(3 * n));
        ok = PivotingStrided(n, stride, a, b, c, p.d + off, x, work.data());
      }
      if (!ok) ZeroStrided(n, stride, x);
      out.status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
    }
    SolveInfo info;
    info.method = std::string(MethodName(method));
    return info;
  }
  // Systems of a variable-size batch differ in cost: dynamic chunks keep the threads even.
#pragma omp parallel reduction(+ : resolved)
  {
    std::vector<T> work(static_cast<size_t>(work_per_system)), coefficients;
#pragma omp for schedule(dynamic, 64)
    for (int64_t s = 0; s < p.batch; ++s) {
      const int64_t off = p.first(s), n = p.rows(s);
      const T *a, *b, *c, *d = p.d + off;
      Coefficients(p, off, n, coefficients, &a, &b, &c);
      T* x = out.x + off;
      bool ok;
      if (method == TridiagonalMethod::kPcr) {
        ok = PcrStrided(n, stride, a, b, c, d, x, work.data());
      } else if (method == TridiagonalMethod::kPartitioned) {
        ok = PartitionedStrided(n, stride, kChunk, a, b, c, d, x, work.data());
      } else if (method == TridiagonalMethod::kPivoting) {
        ok = PivotingStrided(n, stride, a, b, c, d, x, work.data());
      } else if (automatic) {
        ok = ThomasSweep<true>(n, stride, a, b, c, d, x, work.data()) == ThomasOutcome::kOk;
        if (!ok && split) {
          out.status[s] = SystemStatus::kSingular;  // solved again below
          continue;
        }
        if (!ok) {
          ok = PivotingStrided(n, stride, a, b, c, d, x, work.data());
          ++resolved;
        }
      } else {
        ok = ThomasStrided(n, stride, a, b, c, d, x, work.data());
      }
      if (!ok) ZeroStrided(n, stride, x);
      out.status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
    }
  }
  SolveInfo info;
  info.method = std::string(MethodName(automatic ? TridiagonalMethod::kThomas : method));
  if (resolved > 0) info.method += " + pivoting (" + std::to_string(resolved) + " systems)";
  if (split && automatic) ResolveSingularWithPivoting(p, out, &info);
  return info;
}

template <typename T>
int64_t ResolveSingularWithPivoting(const TridiagonalProblem<T>& p, TridiagonalOutput<T> out,
                                    SolveInfo* info) {
  // Most answers have no SINGULAR system: one memchr over the statuses (tens of microseconds
  // for 2^20 systems) before any thread starts.
  static_assert(sizeof(SystemStatus) == 1);
  if (p.batch <= 0 || std::memchr(out.status, int(SystemStatus::kSingular), size_t(p.batch)) ==
                          nullptr)
    return 0;
  const int64_t stride = p.variable() ? 1 : ElementStride(p.layout, p.batch);
  int64_t resolved = 0;
  // A few large systems (one of 2^24 rows from the CUDA backend's host path, say): one at a
  // time over every core, where one thread a system would leave the others idle.
  int64_t flagged = 0, longest = 0;
  for (int64_t s = 0; s < p.batch; ++s)
    if (out.status[s] == SystemStatus::kSingular) ++flagged, longest = std::max(longest, p.rows(s));
  if (flagged < omp_get_max_threads() && SplitPivotingParts<T>(longest) > 0) {
    std::vector<T> work, coefficients;
    for (int64_t s = 0; s < p.batch; ++s) {
      if (out.status[s] != SystemStatus::kSingular) continue;
      const int64_t off = p.first(s), n = p.rows(s);
      T* x = out.x + off;
      const T *a, *b, *c;
      Coefficients(p, off, n, coefficients, &a, &b, &c);
      const int64_t parts = SplitPivotingParts<T>(n);
      bool ok;
      if (parts > 0) {
        ok = PivotingSplit(n, stride, a, b, c, p.d + off, x, parts).ok;
      } else {
        work.resize(static_cast<size_t>(3 * n));
        ok = PivotingStrided(n, stride, a, b, c, p.d + off, x, work.data());
      }
      if (!ok) ZeroStrided(n, stride, x);
      out.status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
      ++resolved;
    }
    if (info != nullptr) info->method += " + pivoting (" + std::to_string(resolved) + " systems)";
    return resolved;
  }
#pragma omp parallel reduction(+ : resolved)
  {
    std::vector<T> work, coefficients;
#pragma omp for schedule(dynamic, 256)
    for (int64_t s = 0; s < p.batch; ++s) {
      if (out.status[s] != SystemStatus::kSingular) continue;
      const int64_t off = p.first(s), n = p.rows(s);
      work.resize(static_cast<size_t>(3 * n));
      T* x = out.x + off;
      const T *a, *b, *c;
      Coefficients(p, off, n, coefficients, &a, &b, &c);
      const bool ok = PivotingStrided(n, stride, a, b, c, p.d + off, x, work.data());
      if (!ok) ZeroStrided(n, stride, x);
      out.status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
      ++resolved;
    }
  }
  if (info != nullptr && resolved > 0)
    info->method += " + pivoting (" + std::to_string(resolved) + " systems)";
  return resolved;
}

template SolveInfo SolveTridiagonal(const TridiagonalProblem<double>&, TridiagonalMethod,
                                    TridiagonalOutput<double>);
template SolveInfo SolveTridiagonal(const TridiagonalProblem<float>&, TridiagonalMethod,
                                    TridiagonalOutput<float>);
template bool ThomasStrided(int64_t, int64_t, const double*, const double*, const double*,
                            const double*, double*, double*);
template bool ThomasStrided(int64_t, int64_t, const float*, const float*, const float*,
                            const float*, float*, float*);
template bool PartitionedStrided(int64_t, int64_t, int, const double*, const double*,
                                 const double*, const double*, double*, double*);
template bool PartitionedStrided(int64_t, int64_t, int, const float*, const float*,
                                 const float*, const float*, float*, float*);
template bool PcrStrided(int64_t, int64_t, const double*, const double*, const double*,
                         const double*, double*, double*);
template bool PivotingStrided(int64_t, int64_t, const double*, const double*, const double*,
                              const double*, double*, double*);
template bool PivotingStrided(int64_t, int64_t, const float*, const float*, const float*,
                              const float*, float*, float*);
template int64_t ResolveSingularWithPivoting(const TridiagonalProblem<double>&,
                                             TridiagonalOutput<double>, SolveInfo*);
template int64_t ResolveSingularWithPivoting(const TridiagonalProblem<float>&,
                                             TridiagonalOutput<float>, SolveInfo*);
template bool PcrStrided(int64_t, int64_t, const float*, const float*, const float*,
                         const float*, float*, float*);
}  // namespace cpu

template <typename T>
double TridiagonalBackwardError(const TridiagonalProblem<T>& p, const T* x,
                                const SystemStatus* status) {
  const int64_t s_ = p.variable() ? 1 : ElementStride(p.layout, p.batch);
  double worst = 0;
#pragma omp parallel for schedule(dynamic, 64) reduction(max : worst)
  for (int64_t s = 0; s < p.batch; ++s) {
    if (status && status[s] != SystemStatus::kOk) continue;
    const int64_t off = p.first(s), n = p.rows(s);
    double rmax = 0, amax = 0, xmax = 0, dmax = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = off + k * s_, ci = i * p.coef_stride;
      double ax = double(p.b[ci]) * x[i];
      double arow = std::abs(double(p.b[ci]));
      if (k > 0) {
        ax += double(p.a[ci]) * x[i - s_];
        arow += std::abs(double(p.a[ci]));
      }
      if (k + 1 < n) {
        ax += double(p.c[ci]) * x[i + s_];
        arow += std::abs(double(p.c[ci]));
      }
      rmax = std::max(rmax, std::abs(double(p.d[i]) - ax));
      amax = std::max(amax, arow);
      xmax = std::max(xmax, std::abs(double(x[i])));
      dmax = std::max(dmax, std::abs(double(p.d[i])));
    }
    const double denom = amax * xmax + dmax;
    // A non-finite x or residual is the worst error there is (std::max would drop a NaN).
    const double e = !cpu::AllFinite(n, s_, x + off) ? std::numeric_limits<double>::infinity()
                     : denom > 0                  ? rmax / denom
                                                  : 0.0;
    worst = std::max(worst, e);
  }
  return worst;
}
template double TridiagonalBackwardError(const TridiagonalProblem<double>&, const double*,
                                         const SystemStatus*);
template double TridiagonalBackwardError(const TridiagonalProblem<float>&, const float*,
                                         const SystemStatus*);

}  // namespace trisolve
