// One large tridiagonal system by partial pivoting on every core: a partition method whose
// parts are eliminated with dgtsv's row interchanges, kept only where its backward error says
// the answer is as good as the serial sweep's.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "trisolve/reference/tridiagonal.h"

namespace trisolve {
namespace cpu {
namespace {

// dgttrf / dgttrs (no transpose) on rows [r0, r0 + L) of a strided system, the couplings
// outside the block dropped: factored once, solved for several right-hand sides.
template <typename T>
class BlockLu {
 public:
  bool Factor(int64_t L, int64_t s, int64_t r0, const T* a, const T* b, const T* c) {
    L_ = L;
    d_.resize(size_t(L));
    du_.resize(size_t(L));
    dl_.resize(size_t(L));
    du2_.assign(size_t(L), T(0));
    swapped_.assign(size_t(L), 0);
    for (int64_t i = 0; i < L; ++i) {
      d_[i] = b[(r0 + i) * s];
      du_[i] = i + 1 < L ? c[(r0 + i) * s] : T(0);
      dl_[i] = i + 1 < L ? a[(r0 + i + 1) * s] : T(0);
    }
    for (int64_t i = 0; i + 1 < L; ++i) {
      if (std::abs(d_[i]) >= std::abs(dl_[i])) {
        if (d_[i] != T(0)) {
          const T fact = dl_[i] / d_[i];
          dl_[i] = fact;
          d_[i + 1] -= fact * du_[i];
        }
      } else {
        const T fact = d_[i] / dl_[i];
        d_[i] = dl_[i];
        dl_[i] = fact;
        const T temp = du_[i];
        du_[i] = d_[i + 1];
        d_[i + 1] = temp - fact * d_[i + 1];
        if (i + 2 < L) {
          du2_[i] = du_[i + 1];
          du_[i + 1] = -fact * du_[i + 1];
        }
        swapped_[i] = 1;
      }
    }
    for (int64_t i = 0; i < L; ++i)
      if (d_[i] == T(0) || !std::isfinite(d_[i])) return false;
    return true;
  }

  void Solve(T* r) const {
    for (int64_t i = 0; i + 1 < L_; ++i) {
      if (!swapped_[i]) {
        r[i + 1] -= dl_[i] * r[i];
      } else {
        const T temp = r[i];
        r[i] = r[i + 1];
        r[i + 1] = temp - dl_[i] * r[i];
      }
    }
    r[L_ - 1] /= d_[L_ - 1];
    if (L_ > 1) r[L_ - 2] = (r[L_ - 2] - du_[L_ - 2] * r[L_ - 1]) / d_[L_ - 2];
    for (int64_t i = L_ - 3; i >= 0; --i)
      r[i] = (r[i] - du_[i] * r[i + 1] - du2_[i] * r[i + 2]) / d_[i];
  }

 private:
  int64_t L_ = 0;
  std::vector<T> d_, du_, dl_, du2_;
  std::vector<uint8_t> swapped_;
};

// ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf), the residual in long double; infinite
// where x is not finite.
template <typename T>
double BackwardErrorOf(int64_t n, int64_t s, const T* a, const T* b, const T* c, const T* d,
                       const T* x) {
  double rm = 0, am = 0, xm = 0, dm = 0;
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(max : rm, am, xm, dm) reduction(&& : finite)
  for (int64_t k = 0; k < n; ++k) {
    const long double xk = x[k * s];
    long double ax = (long double)b[k * s] * xk;
    double row = std::abs(double(b[k * s]));
    if (k > 0) ax += (long double)a[k * s] * x[(k - 1) * s], row += std::abs(double(a[k * s]));
    if (k + 1 < n) ax += (long double)c[k * s] * x[(k + 1) * s], row += std::abs(double(c[k * s]));
    finite = finite && std::isfinite(double(xk));
    rm = std::max(rm, double(std::abs((long double)d[k * s] - ax)));
    am = std::max(am, row);
    xm = std::max(xm, std::abs(double(xk)));
    dm = std::max(dm, std::abs(double(d[k * s])));
  }
  if (!finite) return std::numeric_limits<double>::infinity();
  const double den = am * xm + dm;
  return den > 0 ? rm / den : rm;
}

}  // namespace

SplitLayout SplitPivotingLayout(int64_t n, int64_t parts) {
  // Each part but the last ends in an interface row, whose unknown the reduced system carries;
  // the rows before it (the part's interior) are eliminated with partial pivoting inside the
  // part. Interiors of even length keep blocks such as a zero diagonal's nonsingular: rows an
  // odd count, and the count of parts chosen so that the last part (all interior) is even too
  // (interiors even and parts - 1 interfaces make n, so parts = n + 1 modulo 2).
  SplitLayout l;
  int64_t p = std::max<int64_t>(parts, 3);
  if (p % 2 != (n + 1) % 2) ++p;
  int64_t m = (n - 1) / p;
  if (m % 2 == 0) --m;
  if (m < 3) return l;
  l.parts = p;
  l.rows = m;
  return l;
}

SplitLayout SplitPivotingLayoutOfRows(int64_t n, int64_t rows) {
  // With m odd, the last part n - (parts - 1) m flips parity with parts: one fewer part makes
  // it even (and m longer).
  SplitLayout l;
  if (rows < 3 || rows % 2 == 0) return l;
  int64_t parts = n / rows;
  if (parts >= 3 && (n - (parts - 1) * rows) % 2 != 0) --parts;
  if (parts < 3) return l;
  l.parts = parts;
  l.rows = rows;
  return l;
}

template <typename T>
SplitPivoting PivotingSplit(int64_t n, int64_t s, const T* a, const T* b, const T* c,
                            const T* d, T* x, int64_t parts_wanted) {
  SplitPivoting out;
  const SplitLayout layout = SplitPivotingLayout(n, parts_wanted);
  const int64_t parts = layout.parts, part_rows = layout.rows;
  auto serial = [&] {
    std::vector<T> work(size_t(3 * n));
    out.ok = PivotingStrided(n, s, a, b, c, d, x, work.data());
    out.split = false;
    return out;
  };
  if (parts < 3) return serial();
  const int64_t reduced = parts - 1;
  // The first and last entries of each interior's three solutions: y (the right-hand side),
  // w (the left interface's column) and v (the right interface's).
  std::vector<T> yf(static_cast<size_t>(parts)), yl(static_cast<size_t>(parts)), wf(static_cast<size_t>(parts), T(0)),
      wl(static_cast<size_t>(parts), T(0)), vf(static_cast<size_t>(parts), T(0)), vl(static_cast<size_t>(parts), T(0));
  bool blocks_ok = true;
#pragma omp parallel reduction(&& : blocks_ok)
  {
    BlockLu<T> lu;
    std::vector<T> r;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < parts; ++k) {
      const int64_t r0 = k * part_rows;
      const int64_t L = k + 1 < parts ? part_rows - 1 : n - r0;
      if (!lu.Factor(L, s, r0, a, b, c)) {
        blocks_ok = false;
        continue;
      }
      r.assign(size_t(L), T(0));
      for (int64_t i = 0; i < L; ++i) r[i] = d[(r0 + i) * s];
      lu.Solve(r.data());
      yf[k] = r[0], yl[k] = r[L - 1];
      if (k > 0) {
        std::fill(r.begin(), r.end(), T(0));
        r[0] = a[r0 * s];
        lu.Solve(r.data());
        wf[k] = r[0], wl[k] = r[L - 1];
      }
      if (k + 1 < parts) {
        std::fill(r.begin(), r.end(), T(0));
        r[L - 1] = c[(r0 + L - 1) * s];
        lu.Solve(r.data());
        vf[k] = r[0], vl[k] = r[L - 1];
      }
    }
  }
  if (!blocks_ok) return serial();
  // Interface k (row e = (k + 1) part_rows - 1) couples the last interior row of part k and
  // the first of part k + 1; substituting their expressions leaves a tridiagonal system in
  // the interfaces, solved by the sweep (it is small: one row a part).
  std::vector<T> ra(static_cast<size_t>(reduced)), rb(static_cast<size_t>(reduced)), rc(static_cast<size_t>(reduced)),
      rd(static_cast<size_t>(reduced)), z(static_cast<size_t>(reduced)), work(static_cast<size_t>(3 * reduced));
  for (int64_t k = 0; k < reduced; ++k) {
    const int64_t e = (k + 1) * part_rows - 1;
    const T ae = a[e * s], ce = c[e * s];
    ra[k] = -ae * wl[k];
    rb[k] = b[e * s] - ae * vl[k] - ce * wf[k + 1];
    rc[k] = -ce * vf[k + 1];
    rd[k] = d[e * s] - ae * yl[k] - ce * yf[k + 1];
  }
  if (!PivotingStrided(reduced, 1, ra.data(), rb.data(), rc.data(), rd.data(), z.data(),
                       work.data()))
    return serial();
  // Each interior once more, its right-hand side carrying the interfaces' values.
#pragma omp parallel reduction(&& : blocks_ok)
  {
    BlockLu<T> lu;
    std::vector<T> r;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < parts; ++k) {
      const int64_t r0 = k * part_rows;
      const int64_t L = k + 1 < parts ? part_rows - 1 : n - r0;
      if (!lu.Factor(L, s, r0, a, b, c)) {
        blocks_ok = false;
        continue;
      }
      r.resize(size_t(L));
      for (int64_t i = 0; i < L; ++i) r[i] = d[(r0 + i) * s];
      if (k > 0) r[0] -= a[r0 * s] * z[k - 1];
      if (k + 1 < parts) {
        r[L - 1] -= c[(r0 + L - 1) * s] * z[k];
        x[(r0 + L) * s] = z[k];
      }
      lu.Solve(r.data());
      for (int64_t i = 0; i < L; ++i) x[(r0 + i) * s] = r[i];
    }
  }
  if (!blocks_ok) return serial();
  out.backward_error = BackwardErrorOf(n, s, a, b, c, d, x);
  if (!(out.backward_error <= kSplitPivotingTolerance * double(std::numeric_limits<T>::epsilon())))
    return serial();
  out.ok = true;
  out.split = true;
  out.parts = parts;
  return out;
}

template <typename T>
int64_t SplitPivotingParts(int64_t n) {
  const int threads = omp_get_max_threads();
  if (threads < kSplitPivotingMinThreads || n < kSplitPivotingMinRows) return 0;
  // Eight parts a thread keeps the dynamic schedule even; parts of 1024 rows or more.
  return std::min<int64_t>(8 * int64_t(threads), n / 1024);
}

template SplitPivoting PivotingSplit(int64_t, int64_t, const double*, const double*,
                                     const double*, const double*, double*, int64_t);
template SplitPivoting PivotingSplit(int64_t, int64_t, const float*, const float*,
                                     const float*, const float*, float*, int64_t);
template int64_t SplitPivotingParts<double>(int64_t);
template int64_t SplitPivotingParts<float>(int64_t);

}  // namespace cpu
}  // namespace trisolve
