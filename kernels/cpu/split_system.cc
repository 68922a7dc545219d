#include "split_system.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "trisolve/reference/tridiagonal.h"

namespace trisolve {
namespace {

// A window's solution: rows [row0, row0 + size) of part k, T_window z = e_first or e_last,
// the couplings past the window dropped. Solved in double by partial pivoting.
struct Window {
  int64_t row0 = 0;
  std::vector<double> z;
  bool ok = false;
};

template <typename T>
Window SolveWindow(const TridiagonalProblem<T>& p, int64_t row0, int64_t size, bool unit_first) {
  Window w;
  w.row0 = row0;
  const auto rows = static_cast<size_t>(size);
  std::vector<double> a(rows), b(rows), c(rows), rhs(rows, 0.0), work(3 * rows);
  for (int64_t i = 0; i < size; ++i) {
    a[size_t(i)] = double(p.a[row0 + i]);
    b[size_t(i)] = double(p.b[row0 + i]);
    c[size_t(i)] = double(p.c[row0 + i]);
  }
  rhs[unit_first ? 0 : size_t(size - 1)] = 1.0;
  w.z.resize(size_t(size));
  w.ok = cpu::PivotingStrided<double>(size, 1, a.data(), b.data(), c.data(), rhs.data(),
                                      w.z.data(), work.data());
  return w;
}

}  // namespace

bool SolveSmallDense(int q, std::vector<long double>& A, std::vector<long double>& rhs) {
  for (int k = 0; k < q; ++k) {
    int piv = k;
    for (int i = k + 1; i < q; ++i)
      if (std::fabs(A[size_t(i * q + k)]) > std::fabs(A[size_t(piv * q + k)])) piv = i;
    if (!(std::fabs(A[size_t(piv * q + k)]) > 0) || !std::isfinite(A[size_t(piv * q + k)]))
      return false;
    if (piv != k) {
      for (int j = 0; j < q; ++j) std::swap(A[size_t(k * q + j)], A[size_t(piv * q + j)]);
      std::swap(rhs[size_t(k)], rhs[size_t(piv)]);
    }
    for (int i = k + 1; i < q; ++i) {
      const long double l = A[size_t(i * q + k)] / A[size_t(k * q + k)];
      if (l == 0) continue;
      for (int j = k; j < q; ++j) A[size_t(i * q + j)] -= l * A[size_t(k * q + j)];
      rhs[size_t(i)] -= l * rhs[size_t(k)];
    }
  }
  for (int k = q - 1; k >= 0; --k) {
    long double s = rhs[size_t(k)];
    for (int j = k + 1; j < q; ++j) s -= A[size_t(k * q + j)] * rhs[size_t(j)];
    rhs[size_t(k)] = s / A[size_t(k * q + k)];
    if (!std::isfinite(rhs[size_t(k)])) return false;
  }
  return true;
}

std::vector<int64_t> SplitRows(int64_t n, const std::vector<double>& weights) {
  const size_t parts = weights.size();
  if (parts < 2) return {};
  double total = 0;
  for (double w : weights) total += std::max(w, 0.0);
  if (!(total > 0)) return {};
  std::vector<int64_t> out;
  int64_t given = 0;
  for (size_t k = 0; k < parts; ++k) {
    int64_t m = int64_t(std::floor(double(n) * std::max(weights[k], 0.0) / total));
    // Whole 16-row groups (the one-system kernels' unit) where that leaves a part of some size.
    if (m >= 1024) m -= m % 16;
    if (k + 1 == parts) m = n - given;
    if (m < 2) return {};
    out.push_back(m);
    given += m;
  }
  return out;
}

template <typename T>
absl::StatusOr<SplitOutcome> SolveSystemSplit(const TridiagonalProblem<T>& p,
                                              const std::vector<int64_t>& rows,
                                              const SolvePartFn<T>& solve_part, T* x) {
  const size_t P = rows.size();
  if (P < 2 || p.batch != 1) return absl::InternalError("SolveSystemSplit: one system, 2+ parts");
  std::vector<int64_t> s(P), e(P);
  int64_t at = 0;
  for (size_t k = 0; k < P; ++k) {
    s[k] = at;
    e[k] = at += rows[k];
  }
  if (at != p.n) return absl::InternalError("SolveSystemSplit: rows do not add up to n");

  // Pass 1: y of every part, at once, straight into x.
  std::vector<absl::StatusOr<SolveInfo>> solved(P, absl::InternalError("part not solved"));
  std::vector<SystemStatus> status(P, SystemStatus::kOk);
  auto run = [&](size_t k) {
    const TridiagonalProblem<T> part{1,           rows[k],     Layout::kFlat, p.a + s[k],
                                     p.b + s[k], p.c + s[k], p.d + s[k]};
    solved[k] = solve_part(k, part, TridiagonalOutput<T>{x + s[k], &status[k]});
  };
  {
    std::vector<std::thread> threads;
    for (size_t k = 1; k < P; ++k) threads.emplace_back(run, k);
    run(0);
    for (auto& t : threads) t.join();
  }
  SplitOutcome outcome;
  for (size_t k = 0; k < P; ++k) {
    if (!solved[k].ok()) return solved[k].status();
    const SolveInfo& r = *solved[k];
    if (k == 0) {
      outcome.info = r;
    } else {
      if (outcome.info.method.find(r.method) == std::string::npos)
        absl::StrAppend(&outcome.info.method, " + ", r.method);
      outcome.info.inputs_checked &= r.inputs_checked;  // every part read its own rows
      outcome.info.h2d_us = std::max(outcome.info.h2d_us, r.h2d_us);
      outcome.info.kernel_us = std::max(outcome.info.kernel_us, r.kernel_us);
      outcome.info.d2h_us = std::max(outcome.info.d2h_us, r.d2h_us);
    }
    if (status[k] != SystemStatus::kOk) {
      outcome.why = absl::StrCat("part ", k, " (rows ", s[k], "-", e[k] - 1,
                                 ") is singular on its own");
      return outcome;
    }
  }
  absl::StrAppend(&outcome.info.method, " (one system split over ", P, " devices)");

  // The windows, the interfaces and the corrections; K grows where a window's dropped tail
  // shows in its row's residual.
  const double u = std::numeric_limits<T>::epsilon();
  const int q = int(P - 1);
  std::vector<int64_t> K(P, kSplitFirstWindow);
  std::vector<Window> top(P), bottom(P);  // top: v (parts 1..P-1); bottom: w (parts 0..P-2)
  std::vector<long double> X;
  auto full = [&](size_t k) { return 2 * K[k] + 2 > rows[k]; };
  auto y = [&](int64_t row) { return double(x[row]); };  // pass 1's values, until written
  std::vector<bool> stale(P, true);
  // K x 8, unless the window would pass kSplitMaxWindow rows (then outcome.why says so).
  auto Grow = [&](size_t k) {
    K[k] *= 8;
    if ((full(k) ? rows[k] : K[k]) <= kSplitMaxWindow) return true;
    outcome.why = absl::StrCat("part ", k, "'s couplings do not decay within ", kSplitMaxWindow,
                               " rows");
    return false;
  };
  for (;;) {
    for (size_t k = 0; k < P; ++k) {
      if (!stale[k]) continue;
      const int64_t size = full(k) ? rows[k] : K[k];
      if (k > 0) top[k] = SolveWindow(p, s[k], size, /*unit_first=*/true);
      if (k + 1 < P) bottom[k] = SolveWindow(p, e[k] - size, size, /*unit_first=*/false);
      if ((k > 0 && !top[k].ok) || (k + 1 < P && !bottom[k].ok)) {
        if (full(k)) {
          outcome.why = absl::StrCat("part ", k, " is singular on its own");
          return outcome;
        }
        if (!Grow(k)) return outcome;
        continue;  // (still stale)
      }
      stale[k] = false;
    }
    if (std::any_of(stale.begin(), stale.end(), [](bool b) { return b; })) continue;

    // The interfaces' system: interface j (between parts j and j + 1) has two unknowns,
    // L_j = x[e_j - 1] (unknown 2j) and F_j = x[s_{j+1}] (unknown 2j + 1):
    //   L_j + alpha_j v_j[m-1] L_{j-1} + gamma_j w_j[m-1] F_j = y_j[m-1]
    //   F_j + alpha_{j+1} v_{j+1}[0] L_j + gamma_{j+1} w_{j+1}[0] F_{j+1} = y_{j+1}[0]
    // with v at the far end of its part, and w at its near end, zero where the window is not
    // the whole part.
    const int dim = 2 * q;
    std::vector<long double> A(static_cast<size_t>(dim * dim), 0.0L);
    std::vector<long double> R(static_cast<size_t>(dim));
    auto at2 = [&](int i, int j) -> long double& { return A[size_t(i * dim + j)]; };
    for (int j = 0; j < q; ++j) {
      const size_t l = size_t(j), r = size_t(j + 1);
      const int iL = 2 * j, iF = 2 * j + 1;
      at2(iL, iL) = 1;
      if (l > 0 && full(l)) at2(iL, iL - 2) = (long double)p.a[s[l]] * top[l].z.back();
      at2(iL, iF) = (long double)p.c[e[l] - 1] * bottom[l].z.back();
      R[size_t(iL)] = y(e[l] - 1);
      at2(iF, iF) = 1;
      at2(iF, iL) = (long double)p.a[s[r]] * top[r].z.front();
      if (r + 1 < P && full(r)) at2(iF, iF + 2) = (long double)p.c[e[r] - 1] * bottom[r].z.front();
      R[size_t(iF)] = y(s[r]);
    }
    X = R;
    if (!SolveSmallDense(dim, A, X)) {
      outcome.why = "the interfaces' system is singular";
      return outcome;
    }
    auto L = [&](size_t j) { return double(X[2 * j]); };
    auto F = [&](size_t j) { return double(X[2 * j + 1]); };

    // Each truncated window's residual: one row past it, exactly a * (the last correction).
    bool grown = false;
    for (size_t k = 0; k < P; ++k) {
      if (full(k)) continue;
      auto fails = [&](int64_t row, double residual, double x_left, double x_mid,
                       double x_right) {
        const double scale = std::abs(double(p.a[row]) * x_left) +
                             std::abs(double(p.b[row]) * x_mid) +
                             std::abs(double(p.c[row]) * x_right) + std::abs(double(p.d[row]));
        return !(std::abs(residual) <= u * scale);
      };
      bool fail = false;
      if (k > 0) {  // top: correction -alpha X_{k-1} v on rows s..s+K-1; residual at row s+K
        const double delta = -double(p.a[s[k]]) * L(k - 1) * top[k].z.back();
        const int64_t row = s[k] + K[k];
        fail |= fails(row, double(p.a[row]) * delta, y(row - 1) + delta, y(row), y(row + 1));
      }
      if (k + 1 < P) {  // bottom: -gamma X_k w on rows e-K..e-1; residual at row e-K-1
        const double delta = -double(p.c[e[k] - 1]) * F(k) * bottom[k].z.front();
        const int64_t row = e[k] - K[k] - 1;
        fail |= fails(row, double(p.c[row]) * delta, y(row - 1), y(row), y(row + 1) + delta);
      }
      if (fail) {
        if (!Grow(k)) return outcome;
        stale[k] = grown = true;
      }
    }
    if (!grown) break;
  }

  // Write: the corrections onto pass 1's y.
  auto L = [&](size_t j) { return double(X[2 * j]); };
  auto F = [&](size_t j) { return double(X[2 * j + 1]); };
  for (size_t k = 0; k < P; ++k) {
    if (k > 0) {
      const double f = -double(p.a[s[k]]) * L(k - 1);
      const std::vector<double>& v = top[k].z;
      for (size_t i = 0; i < v.size(); ++i) x[s[k] + int64_t(i)] += T(f * v[i]);
    }
    if (k + 1 < P) {
      const double f = -double(p.c[e[k] - 1]) * F(k);
      const std::vector<double>& w = bottom[k].z;
      const int64_t row0 = bottom[k].row0;
      for (size_t i = 0; i < w.size(); ++i) x[row0 + int64_t(i)] += T(f * w[i]);
    }
  }
  outcome.solved = true;
  return outcome;
}

template absl::StatusOr<SplitOutcome> SolveSystemSplit(const TridiagonalProblem<double>&,
                                                       const std::vector<int64_t>&,
                                                       const SolvePartFn<double>&, double*);
template absl::StatusOr<SplitOutcome> SolveSystemSplit(const TridiagonalProblem<float>&,
                                                       const std::vector<int64_t>&,
                                                       const SolvePartFn<float>&, float*);

}  // namespace trisolve
