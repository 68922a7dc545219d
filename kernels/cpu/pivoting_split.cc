// One large tridiagonal system by partial pivoting on every core: a partition method whose
// parts are eliminated with dgtsv's row interchanges, kept only where its backward error says
// the answer is as good as the serial sweep's.
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "trisolve/reference/tridiagonal.h"

namespace trisolve {
namespace cpu {
namespace {

// One part's factors, made and used within EliminateParts (a thread's, reused part after
// part).
template <typename T>
struct PartScratch {
  std::vector<T> d, du, du2, ry, rw;
  void Reserve(int64_t L) {
    if (int64_t(d.size()) >= L) return;
    for (std::vector<T>* v : {&d, &du, &du2, &ry, &rw}) v->resize(size_t(L));
  }
};

// A spike's entries under kSpikeCut in magnitude are dropped (not stored, read as zero): the
// interfaces' values are entries of x, so each dropped entry moves x_i by under kSpikeCut
// ||x||, which adds at most 2 kSpikeCut = eps / 8 to the backward error. Spikes of most
// matrices decay (random rows, dominant ones: within tens of rows), so they are stored over
// a short range and the second pass reads little more than y.
template <typename T>
constexpr T kSpikeCut = std::numeric_limits<T>::epsilon() / 16;

// What the second pass needs of one part beyond y: the spikes' stored ranges, w on [0,
// w_end) and v on [v_begin, L), and the six ends (first and last entries of y, w and v) the
// interfaces' system is made of.
template <typename T>
struct PartEnds {
  T yf = 0, wf = 0, vf = 0, yl = 0, wl = 0, vl = 0;
  int64_t w_end = 0, v_begin = 0;
};

template <typename T>
struct Lane {
  const T *a, *b, *c, *rhs;
  T *y, *w, *v;
  PartEnds<T>* ends;
  PartScratch<T>* sc;
};

// A part's interior, rows [0, L) of a strided block (a, b, c, rhs offset to its first row; the
// couplings a[0] and c[L - 1] to the interfaces around it dropped from the block), eliminated
// with dgtsv's interchanges and solved for three right-hand sides at once: the part's own rows
// of d (y), the left interface's column a[0] e_1 (w) and the right one's c[L - 1] e_L (v). The
// spikes w and v are kept whole, so that the second pass is x = y - w z_left - v z_right, no
// second factorisation nor substitution, and the interface rows' residuals are those of the
// reduced system (its coefficients are these very ends). The factors live only in the lane's
// scratch (five arrays of L, one part at a time), so memory beyond x is the two spikes: 2 n values.
// The interchange is a select, not a branch: random rows pivot half the time, which a branch
// predictor cannot learn. The arithmetic is dgtsv's but for the pivot's reciprocal, made
// once and multiplied by (one division a row, not four). rhs and y have stride
// rs (y may be rhs); w (v) null where there is no left (right) interface or the spikes are
// not wanted.
// K parts of the same length L at once, each a lane (K = 2 for pairs of parts): the
// elimination is one dependent chain a row (a division, then the next pivot), so a core
// runs K chains in little more than the time of one. True where every lane's block factored.
template <typename T, int K>
bool EliminateParts(int64_t L, int64_t s, int64_t rs, const Lane<T> (&lane)[K]) {
  T *sd[K], *sdu[K], *sdu2[K], *sry[K], *srw[K];
  T vl[K], di[K], dui[K], yi[K], wi[K], last_fact[K];
  bool last_swapped[K], good = true;
  for (int l = 0; l < K; ++l) {
    const Lane<T>& q = lane[l];
    q.sc->Reserve(L);
    sd[l] = q.sc->d.data(), sdu[l] = q.sc->du.data(), sdu2[l] = q.sc->du2.data();
    sry[l] = q.sc->ry.data(), srw[l] = q.sc->rw.data();
    vl[l] = q.v != nullptr ? q.c[(L - 1) * s] : T(0);
    di[l] = q.b[0], dui[l] = L > 1 ? q.c[0] : T(0), yi[l] = q.rhs[0];
    wi[l] = q.w != nullptr ? q.a[0] : T(0);
    // The last step's interchange and multiplier: v's right-hand side is zero above L - 2.
    last_swapped[l] = false, last_fact[l] = T(0);
  }
  for (int64_t i = 0; i + 1 < L; ++i) {
    for (int l = 0; l < K; ++l) {
      const Lane<T>& q = lane[l];
      const T dl = q.a[(i + 1) * s], b1 = q.b[(i + 1) * s];
      const T c1 = i + 2 < L ? q.c[(i + 1) * s] : T(0), y1 = q.rhs[(i + 1) * rs];
      const bool sw = std::abs(di[l]) < std::abs(dl);
      const T p0 = sw ? dl : di[l], p1 = sw ? b1 : dui[l], p2 = sw ? c1 : T(0),
              py = sw ? y1 : yi[l], pw = sw ? T(0) : wi[l];
      const T o0 = sw ? di[l] : dl, o1 = sw ? dui[l] : b1, o2 = sw ? T(0) : c1,
              oy = sw ? yi[l] : y1, ow = sw ? wi[l] : T(0);
      // One division a row, its reciprocal kept for the back substitution: the divider, not
      // the chain, bounded the loop (four divisions a row took as long as the sweep).
      const T inv = T(1) / p0;
      const T fact = o0 * inv;
      const T ap = std::abs(p0);
      good &= (ap > T(0)) & (ap <= std::numeric_limits<T>::max());
      sd[l][i] = inv, sdu[l][i] = p1, sdu2[l][i] = p2, sry[l][i] = py, srw[l][i] = pw;
      di[l] = o1 - fact * p1;
      dui[l] = o2 - fact * p2;
      yi[l] = oy - fact * py;
      // w decays in most matrices: flushed once subnormal, where x86 arithmetic is ~100
      // times slower (reached only in parts far longer than SplitPivotingPartsFor's ~4096).
      const T wn = ow - fact * pw;
      wi[l] = std::abs(wn) < std::numeric_limits<T>::min() ? T(0) : wn;
      last_swapped[l] = sw, last_fact[l] = fact;
    }
  }
  for (int l = 0; l < K; ++l) {
    const T ap = std::abs(di[l]);
    good &= (ap > T(0)) & (ap <= std::numeric_limits<T>::max());
  }
  if (!good) return false;
  T rv_prev[K], rv_last[K];
  for (int l = 0; l < K; ++l) {
    sd[l][L - 1] = T(1) / di[l], sdu[l][L - 1] = T(0), sdu2[l][L - 1] = T(0);
    sry[l][L - 1] = yi[l], srw[l][L - 1] = wi[l];
    if (L > 1) sdu2[l][L - 2] = T(0);
    // v's right-hand side after the last step: rows L - 2 and L - 1 of (0, ..., 0, vl).
    rv_prev[l] = L > 1 && last_swapped[l] ? vl[l] : T(0);
    rv_last[l] = L == 1 ? vl[l] : last_swapped[l] ? -(last_fact[l] * vl[l]) : vl[l];
  }
  // Back substitution, three columns a lane in one sweep (independent chains, so their
  // latencies overlap): x_i = (r_i - du_i x_{i+1} - du2_i x_{i+2}) / d_i, the rows past L
  // zero. w and v go over their right-hand sides in the scratch (read before written), the
  // stored ranges copied out after.
  T y1[K] = {}, y2[K] = {}, w1[K] = {}, w2[K] = {}, v1[K] = {}, v2[K] = {};
  int64_t w_end[K], v_begin[K];
  for (int l = 0; l < K; ++l) w_end[l] = 0, v_begin[l] = L;
  constexpr T tiny = std::numeric_limits<T>::min(), cut = kSpikeCut<T>;
  for (int64_t i = L - 1; i >= 0; --i) {
    for (int l = 0; l < K; ++l) {
      const T rv = i == L - 1 ? rv_last[l] : i == L - 2 ? rv_prev[l] : T(0);
      const T yn = (sry[l][i] - sdu[l][i] * y1[l] - sdu2[l][i] * y2[l]) * sd[l][i];
      T wn = (srw[l][i] - sdu[l][i] * w1[l] - sdu2[l][i] * w2[l]) * sd[l][i];
      T vn = (rv - sdu[l][i] * v1[l] - sdu2[l][i] * v2[l]) * sd[l][i];
      wn = std::abs(wn) < tiny ? T(0) : wn;
      vn = std::abs(vn) < tiny ? T(0) : vn;
      lane[l].y[i * rs] = yn;
      srw[l][i] = wn, sry[l][i] = vn;
      if (w_end[l] == 0 && std::abs(wn) >= cut) w_end[l] = i + 1;
      if (std::abs(vn) >= cut) v_begin[l] = i;
      y2[l] = y1[l], y1[l] = yn, w2[l] = w1[l], w1[l] = wn, v2[l] = v1[l], v1[l] = vn;
    }
  }
  for (int l = 0; l < K; ++l) {
    const Lane<T>& q = lane[l];
    if (q.w == nullptr) w_end[l] = 0;
    if (q.v == nullptr) v_begin[l] = L;
    if (w_end[l] > 0) std::copy(srw[l], srw[l] + w_end[l], q.w);
    if (v_begin[l] < L) std::copy(sry[l] + v_begin[l], sry[l] + L, q.v + v_begin[l]);
    PartEnds<T>& e = *q.ends;
    e.yf = q.y[0], e.yl = q.y[(L - 1) * rs];
    // The ends as computed, the dropped ones included: the interfaces' system is the one the
    // parts define (dropping a tiny wf of a zero diagonal's block, say, would make it
    // singular); only x's interior rows read the stored ranges.
    e.wf = q.w != nullptr ? srw[l][0] : T(0), e.wl = q.w != nullptr ? srw[l][L - 1] : T(0);
    e.vf = q.v != nullptr ? sry[l][0] : T(0), e.vl = q.v != nullptr ? sry[l][L - 1] : T(0);
    e.w_end = w_end[l], e.v_begin = v_begin[l];
  }
  return true;
}

// The maxima a backward error is made of: ||d - A x||_inf (the residual in long double),
// ||A||_inf, ||x||_inf, ||d||_inf; finite false where some x is not.
struct ResidualMax {
  double r = 0, a = 0, x = 0, d = 0;
  bool finite = true;
  void Row(int64_t k, int64_t n, long double ak, long double bk, long double ck,
           long double dk, long double xm1, long double x0, long double xp1) {
    long double ax = bk * x0;
    double row = std::abs(double(bk));
    if (k > 0) ax += ak * xm1, row += std::abs(double(ak));
    if (k + 1 < n) ax += ck * xp1, row += std::abs(double(ck));
    finite = finite && std::isfinite(double(x0));
    r = std::max(r, double(std::abs(dk - ax)));
    a = std::max(a, row);
    x = std::max(x, std::abs(double(x0)));
    d = std::max(d, std::abs(double(dk)));
  }
  void Merge(const ResidualMax& o) {
    r = std::max(r, o.r), a = std::max(a, o.a), x = std::max(x, o.x), d = std::max(d, o.d);
    finite = finite && o.finite;
  }
  double BackwardError() const {
    if (!finite) return std::numeric_limits<double>::infinity();
    const double den = a * x + d;
    return den > 0 ? r / den : r;
  }
};

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

namespace {

// The split's arrays and its passes over them. Part k holds rows [k m, k m + L_k): its
// interior, then (all but the last) an interface row whose unknown z_k the reduced system
// carries.
template <typename T>
class Split {
 public:
  Split(int64_t n, int64_t s, const T* a, const T* b, const T* c, SplitLayout layout)
      : n_(n), s_(s), a_(a), b_(b), c_(c), parts_(layout.parts), m_(layout.rows),
        spikes_(new T[size_t(2 * n)]), ends_(size_t(layout.parts)) {
    // Not zeroed: only the spikes' stored ranges are written (and so touched), the first
    // touch in the parallel pass. In 2 MiB pages where the kernel grants them: a fresh page
    // of 4 KiB faults at every 512 rows of a spike, and on the 2-core build machine (a VM)
    // those faults took half as long as the elimination itself (perf, full spikes, 2^22
    // rows), as client/transport.cc's FreshBuffer found for its buffers.
    constexpr uintptr_t kHuge = uintptr_t{2} << 20;
    const auto p = reinterpret_cast<uintptr_t>(spikes_.get());
    const uintptr_t lo = (p + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t hi = (p + uintptr_t(2 * n) * sizeof(T)) & ~(kHuge - 1);
    if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
  }

  int64_t First(int64_t k) const { return k * m_; }
  int64_t Length(int64_t k) const { return k + 1 < parts_ ? m_ - 1 : n_ - k * m_; }
  int64_t factorizations() const { return factorizations_; }

  // Every part eliminated for the right-hand side `rhs` (stride rs), its solution y written
  // over rows of `y` (stride rs; may be rhs), the spikes too where `spikes`. False as soon as
  // one block does not factor: the parts not yet started are skipped.
  bool Eliminate(const T* rhs, T* y, int64_t rs, bool spikes) {
    std::atomic<bool> failed{false};
    int64_t count = 0;
    // The parts of equal length in pairs (ceil((parts - 1) / 2) of them), the last alone.
    const int64_t pairs = parts_ / 2, tasks = pairs + 1;
#pragma omp parallel reduction(+ : count)
    {
      PartScratch<T> sc[2];
      PartEnds<T> e[2];
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < tasks; ++t) {
        if (failed.load(std::memory_order_relaxed)) continue;
        const int64_t k0 = t < pairs ? 2 * t : parts_ - 1;
        const int64_t lanes = t < pairs ? std::min<int64_t>(2, parts_ - 1 - k0) : 1;
        Lane<T> q[2];
        for (int64_t l = 0; l < lanes; ++l) {
          const int64_t k = k0 + l, r0 = First(k);
          q[l] = Lane<T>{a_ + r0 * s_, b_ + r0 * s_, c_ + r0 * s_, rhs + r0 * rs, y + r0 * rs,
                         spikes && k > 0 ? W() + r0 : nullptr,
                         spikes && k + 1 < parts_ ? V() + r0 : nullptr, &e[l], &sc[l]};
        }
        const int64_t L = Length(k0);
        count += lanes;
        bool ok;
        if (lanes == 2) {
          const Lane<T> two[2] = {q[0], q[1]};
          ok = EliminateParts<T, 2>(L, s_, rs, two);
        } else {
          const Lane<T> one[1] = {q[0]};
          ok = EliminateParts<T, 1>(L, s_, rs, one);
        }
        if (!ok) {
          failed.store(true, std::memory_order_relaxed);
          continue;
        }
        for (int64_t l = 0; l < lanes; ++l) {
          PartEnds<T>& to = ends_[size_t(k0 + l)];
          if (spikes) {
            to = e[l];
          } else {  // a refinement's right-hand side: the spikes are the first pass's
            to.yf = e[l].yf, to.yl = e[l].yl;
          }
        }
      }
    }
    factorizations_ += count;
    return !failed.load();
  }

  // The interfaces' unknowns: row e = (k + 1) m - 1 couples the last interior row of part k
  // and the first of part k + 1; their expressions in z leave a tridiagonal system of one row
  // a part, solved by the sweep. False where it is singular to working precision.
  bool Interfaces(const T* rhs, int64_t rs, std::vector<T>& z) {
    const int64_t R = parts_ - 1;
    ra_.resize(size_t(R)), rb_.resize(size_t(R)), rc_.resize(size_t(R)), rd_.resize(size_t(R));
    z.resize(size_t(R));
    std::vector<T> work(size_t(3 * R));
    for (int64_t k = 0; k < R; ++k) {
      const int64_t e = (k + 1) * m_ - 1;
      const T ae = a_[e * s_], ce = c_[e * s_];
      const PartEnds<T>& lo = ends_[size_t(k)];
      const PartEnds<T>& hi = ends_[size_t(k + 1)];
      ra_[k] = -ae * lo.wl;
      rb_[k] = b_[e * s_] - ae * lo.vl - ce * hi.wf;
      rc_[k] = -ce * hi.vf;
      rd_[k] = rhs[e * rs] - ae * lo.yl - ce * hi.yf;
    }
    return PivotingStrided(R, 1, ra_.data(), rb_.data(), rc_.data(), rd_.data(), z.data(),
                           work.data());
  }

  // x = y - w z_left - v z_right in every interior and z at the interfaces (added to x where
  // `accumulate`: a refinement's correction), and in the same pass the backward error of the
  // new x against (d, the original arrays): its residual rows read x's neighbours as they are
  // made, so the check costs no pass of its own.
  double Combine(const T* y, int64_t ys, const std::vector<T>& z, bool accumulate, const T* d,
                 T* x) {
    const int64_t s = s_;
    ResidualMax total;
#pragma omp parallel
    {
      ResidualMax mine;
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t k = 0; k < parts_; ++k) {
        const int64_t r0 = First(k), L = Length(k);
        const T zl = k > 0 ? z[size_t(k - 1)] : T(0), zr = k + 1 < parts_ ? z[size_t(k)] : T(0);
        const T* w = W() + r0;
        const T* v = V() + r0;
        const int64_t w_end = ends_[size_t(k)].w_end, v_begin = ends_[size_t(k)].v_begin;
        const T* yk = y + r0 * ys;
        T* xk = x + r0 * s;
        auto value = [&](int64_t i) {
          T t = yk[i * ys];
          if (i < w_end) t -= w[i] * zl;
          if (i >= v_begin) t -= v[i] * zr;
          return accumulate ? xk[i * s] + t : t;
        };
        // The interfaces around the part, as they will be once written below.
        T prev = k > 0 ? (accumulate ? xk[-s] + zl : zl) : T(0);
        const T after = k + 1 < parts_ ? (accumulate ? xk[L * s] + zr : zr) : T(0);
        T cur = value(0);
        for (int64_t i = 0; i < L; ++i) {
          const T next = i + 1 < L ? value(i + 1) : after;
          const int64_t row = r0 + i;
          mine.Row(row, n_, a_[row * s], b_[row * s], c_[row * s], d[row * s], prev, cur, next);
          xk[i * s] = cur;
          prev = cur, cur = next;
        }
      }
#pragma omp critical
      total.Merge(mine);
    }
    for (int64_t k = 0; k + 1 < parts_; ++k) {
      const int64_t e = (k + 1) * m_ - 1;
      x[e * s] = accumulate ? x[e * s] + z[size_t(k)] : z[size_t(k)];
    }
    for (int64_t k = 0; k + 1 < parts_; ++k) {
      const int64_t e = (k + 1) * m_ - 1;
      total.Row(e, n_, a_[e * s], b_[e * s], c_[e * s], d[e * s], x[(e - 1) * s], x[e * s],
                x[(e + 1) * s]);
    }
    return total.BackwardError();
  }

 private:
  const int64_t n_, s_;
  const T *a_, *b_, *c_;
  const int64_t parts_, m_;
  T* W() { return spikes_.get(); }
  T* V() { return spikes_.get() + n_; }

  std::unique_ptr<T[]> spikes_;  // w, then v, by row (interface rows unused)
  std::vector<PartEnds<T>> ends_;
  std::vector<T> ra_, rb_, rc_, rd_;
  int64_t factorizations_ = 0;
};

}  // namespace

template <typename T>
SplitPivoting PivotingSplit(int64_t n, int64_t s, const T* a, const T* b, const T* c,
                            const T* d, T* x, int64_t parts_wanted) {
  SplitPivoting out;
  const SplitLayout layout = SplitPivotingLayout(n, parts_wanted);
  auto serial = [&] {
    std::vector<T> work(size_t(3 * n));
    out.ok = PivotingStrided(n, s, a, b, c, d, x, work.data());
    out.split = false;
    return out;
  };
  if (layout.parts < 3) return serial();
  Split<T> split(n, s, a, b, c, layout);
  std::vector<T> z;
  const bool solved = split.Eliminate(d, x, s, true) && split.Interfaces(d, s, z);
  out.factorizations = split.factorizations();
  if (!solved) return serial();
  const double tol = kSplitPivotingTolerance * double(std::numeric_limits<T>::epsilon());
  out.backward_error = split.Combine(x, s, z, false, d, x);
  // Where the parts alone miss the bound (a block far worse conditioned than the matrix: its
  // spikes large where x is not), iterative refinement with the residual in long double; each
  // step factors the blocks again (their factors are not kept: 5 n values more) but reuses the
  // spikes and the interfaces' coefficients. As LAPACK's dgtrfs, a step is taken only while
  // the last one at least halved the backward error: a refinement that stalls (dorr's matrix,
  // whose sweep itself misses 8 eps at 2^20 rows) goes to the sweep without further passes.
  std::unique_ptr<T[]> r;
  double before = std::numeric_limits<double>::infinity();
  for (int step = 0; step < kSplitPivotingRefineSteps && std::isfinite(out.backward_error) &&
                     !(out.backward_error <= tol) && 2 * out.backward_error <= before;
       ++step) {
    before = out.backward_error;
    if (r == nullptr) r.reset(new T[size_t(n)]);
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; ++k) {
      long double v = (long double)d[k * s] - (long double)b[k * s] * x[k * s];
      if (k > 0) v -= (long double)a[k * s] * x[(k - 1) * s];
      if (k + 1 < n) v -= (long double)c[k * s] * x[(k + 1) * s];
      r[size_t(k)] = T(v);
    }
    const bool refined = split.Eliminate(r.get(), r.get(), 1, false) &&
                         split.Interfaces(r.get(), 1, z);
    out.factorizations = split.factorizations();
    if (!refined) break;
    out.backward_error = split.Combine(r.get(), 1, z, true, d, x);
    ++out.refinements;
  }
  if (!(out.backward_error <= tol)) return serial();
  out.ok = true;
  out.split = true;
  out.parts = layout.parts;
  return out;
}

int64_t SplitPivotingPartsFor(int64_t n, int threads) {
  // Parts of about 4096 rows: a part's factors (5 values a row) stay in a core's L2 between
  // its elimination and its back substitution; with parts of n / 8 threads (as first written)
  // they were megabytes, allocated afresh every call, and one core's split of 2^22 rows took
  // 3x longer at 9 parts than at 257 to 2049 (flat in between). At least eight parts a thread
  // keeps the dynamic schedule even; at least 1024 rows a part.
  return std::min<int64_t>(std::max<int64_t>(8 * int64_t(threads), n / 4096), n / 1024);
}

template <typename T>
int64_t SplitPivotingParts(int64_t n) {
  const int threads = omp_get_max_threads();
  if (threads < kSplitPivotingMinThreads || n < kSplitPivotingMinRows) return 0;
  return SplitPivotingPartsFor(n, threads);
}

template SplitPivoting PivotingSplit(int64_t, int64_t, const double*, const double*,
                                     const double*, const double*, double*, int64_t);
template SplitPivoting PivotingSplit(int64_t, int64_t, const float*, const float*,
                                     const float*, const float*, float*, int64_t);
template int64_t SplitPivotingParts<double>(int64_t);
template int64_t SplitPivotingParts<float>(int64_t);

}  // namespace cpu
}  // namespace trisolve
