// Variable-size tridiagonal batches (TridiagonalProblem::offsets) on the CPU reference:
// hand-worked systems, random batches against LAPACK dgtsv system by system, both precisions,
// every method, a zero diagonal that auto must not call SINGULAR, and the per-system residual;
// then the unified-vector layout (coef_stride 3) against the same systems as separate arrays.
#include <lapacke.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

template <typename T>
struct VarBatch {
  std::vector<int64_t> offsets{0};
  std::vector<T> a, b, c, d, x;
  std::vector<SystemStatus> status;
  int64_t batch() const { return int64_t(offsets.size()) - 1; }
  TridiagonalProblem<T> problem() const {
    int64_t longest = 0;
    for (int64_t s = 0; s < batch(); ++s) longest = std::max(longest, offsets[s + 1] - offsets[s]);
    TridiagonalProblem<T> p{batch(), longest, Layout::kFlat, a.data(), b.data(), c.data(),
                            d.data()};
    p.offsets = offsets.data();
    return p;
  }
  void Add(std::vector<T> sa, std::vector<T> sb, std::vector<T> sc, std::vector<T> sd) {
    a.insert(a.end(), sa.begin(), sa.end());
    b.insert(b.end(), sb.begin(), sb.end());
    c.insert(c.end(), sc.begin(), sc.end());
    d.insert(d.end(), sd.begin(), sd.end());
    offsets.push_back(int64_t(a.size()));
  }
};

template <typename T>
void Solve(VarBatch<T>& v, TridiagonalMethod m) {
  v.x.assign(v.a.size(), T(std::nan("")));  // poisoned: every element must be written
  v.status.assign(size_t(v.batch()), SystemStatus::kDiverged);
  cpu::SolveTridiagonal(v.problem(), m, TridiagonalOutput<T>{v.x.data(), v.status.data()});
}

// Random systems of the given sizes; `dominant`: |b| > |a| + |c| (every method solves them),
// else entries U(-1, 1) everywhere (auto must pivot where Thomas fails).
template <typename T>
VarBatch<T> Random(const std::vector<int64_t>& sizes, bool dominant, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  VarBatch<T> v;
  for (int64_t n : sizes) {
    std::vector<T> a(n), b(n), c(n), d(n);
    for (int64_t k = 0; k < n; ++k) {
      a[k] = T(u(rng));
      c[k] = T(u(rng));
      b[k] = dominant ? T((std::abs(double(a[k])) + std::abs(double(c[k])) + 0.5) *
                          (u(rng) < 0 ? -1 : 1))
                      : T(u(rng));
      d[k] = T(u(rng));
    }
    v.Add(a, b, c, d);
  }
  return v;
}

// LAPACK dgtsv on system s (in double, from the arrays as given); false where it finds the
// matrix singular.
template <typename T>
bool Dgtsv(const VarBatch<T>& v, int64_t s, std::vector<double>* x) {
  const int64_t o = v.offsets[s], n = v.offsets[s + 1] - o;
  std::vector<double> dl(std::max<int64_t>(n - 1, 1)), dd(n), du(std::max<int64_t>(n - 1, 1));
  x->assign(n, 0);
  for (int64_t k = 0; k < n; ++k) {
    dd[k] = double(v.b[o + k]);
    (*x)[k] = double(v.d[o + k]);
    if (k + 1 < n) {
      dl[k] = double(v.a[o + k + 1]);
      du[k] = double(v.c[o + k]);
    }
  }
  return LAPACKE_dgtsv(LAPACK_COL_MAJOR, lapack_int(n), 1, dl.data(), dd.data(), du.data(),
                       x->data(), lapack_int(n)) == 0;
}

// ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf) of system s, from the original arrays.
template <typename T>
double Backward(const VarBatch<T>& v, int64_t s) {
  const int64_t o = v.offsets[s], n = v.offsets[s + 1] - o;
  double r = 0, an = 0, xn = 0, dn = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = o + k;
    double ax = double(v.b[i]) * v.x[i], row = std::abs(double(v.b[i]));
    if (k > 0) ax += double(v.a[i]) * v.x[i - 1], row += std::abs(double(v.a[i]));
    if (k + 1 < n) ax += double(v.c[i]) * v.x[i + 1], row += std::abs(double(v.c[i]));
    if (!std::isfinite(double(v.x[i]))) return std::numeric_limits<double>::infinity();
    r = std::max(r, std::abs(double(v.d[i]) - ax));
    an = std::max(an, row);
    xn = std::max(xn, std::abs(double(v.x[i])));
    dn = std::max(dn, std::abs(double(v.d[i])));
  }
  return an * xn + dn > 0 ? r / (an * xn + dn) : 0;
}

TEST(VariableTridiagonal, HandWorkedSystemsOfThreeSizes) {
  // System 0 (n = 1): 2 x = 4 -> x = 2.
  // System 1 (n = 2): [2 1; 1 2] x = [3 3] -> x = [1 1].
  // System 2 (n = 3): [4 1 0; 1 4 1; 0 1 4] x = [5 6 5] -> x = [1 1 1].
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kThomas, TridiagonalMethod::kPcr,
                 TridiagonalMethod::kPartitioned, TridiagonalMethod::kPivoting}) {
    VarBatch<double> v;
    v.Add({0}, {2}, {0}, {4});
    v.Add({0, 1}, {2, 2}, {1, 0}, {3, 3});
    v.Add({0, 1, 1}, {4, 4, 4}, {1, 1, 0}, {5, 6, 5});
    Solve(v, m);
    const std::vector<double> want = {2, 1, 1, 1, 1, 1};
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(v.x[i], want[i], 1e-15) << MethodName(m) << " element " << i;
    for (SystemStatus st : v.status) EXPECT_EQ(st, SystemStatus::kOk) << MethodName(m);
  }
}

template <typename T>
void RandomAgainstDgtsv(bool dominant, TridiagonalMethod m, double tol, double rel) {
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int64_t> size(1, 300);
  std::vector<int64_t> sizes = {1, 2, 3, 31, 32, 33, 1025};
  for (int i = 0; i < 60; ++i) sizes.push_back(size(rng));
  VarBatch<T> v = Random<T>(sizes, dominant, 5);
  Solve(v, m);
  for (int64_t s = 0; s < v.batch(); ++s) {
    std::vector<double> ref;
    ASSERT_TRUE(Dgtsv(v, s, &ref)) << "system " << s;
    ASSERT_EQ(v.status[s], SystemStatus::kOk) << MethodName(m) << " system " << s;
    EXPECT_LE(Backward(v, s), tol) << MethodName(m) << " system " << s << " n " << ref.size();
    double diff = 0, norm = 0;
    for (size_t k = 0; k < ref.size(); ++k) {
      diff = std::max(diff, std::abs(double(v.x[v.offsets[s] + k]) - ref[k]));
      norm = std::max(norm, std::abs(ref[k]));
    }
    EXPECT_LE(diff, rel * norm) << MethodName(m) << " system " << s;
  }
}

TEST(VariableTridiagonal, RandomDominantBatchesMatchDgtsvEveryMethod) {
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kThomas, TridiagonalMethod::kPcr,
                 TridiagonalMethod::kPartitioned, TridiagonalMethod::kPivoting}) {
    RandomAgainstDgtsv<double>(true, m, 1e-15, 1e-13);
    RandomAgainstDgtsv<float>(true, m, 2e-7, 1e-5);
  }
}

TEST(VariableTridiagonal, RandomNonDominantBatchesMatchDgtsvUnderAutoAndPivoting) {
  // Not diagonally dominant: Thomas' growth sends many systems to pivoting under auto.
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPivoting}) {
    RandomAgainstDgtsv<double>(false, m, 1e-14, 1e-8);
  }
}

TEST(VariableTridiagonal, ZeroDiagonalSystemIsNeverSingularUnderAuto) {
  // b = 0, a = c = 1, n even: nonsingular (condition 41 at n = 4 .. large), a zero first
  // pivot for Thomas; between two ordinary systems.
  for (int64_t n : {2, 4, 10, 64}) {
    VarBatch<double> v = Random<double>({5}, true, 1);
    std::vector<double> z(n, 0.0), one(n, 1.0), d(n);
    for (int64_t k = 0; k < n; ++k) d[k] = double(k % 3) - 1;
    v.Add(one, z, one, d);
    VarBatch<double> tail = Random<double>({7}, true, 2);
    v.Add(tail.a, tail.b, tail.c, tail.d);
    Solve(v, TridiagonalMethod::kAuto);
    for (int64_t s = 0; s < 3; ++s) {
      EXPECT_EQ(v.status[s], SystemStatus::kOk) << "n " << n << " system " << s;
      EXPECT_LE(Backward(v, s), 1e-15) << "n " << n << " system " << s;
    }
    // Thomas alone flags it, zeroing only that system's rows.
    Solve(v, TridiagonalMethod::kThomas);
    EXPECT_EQ(v.status[0], SystemStatus::kOk);
    EXPECT_EQ(v.status[1], SystemStatus::kSingular);
    EXPECT_EQ(v.status[2], SystemStatus::kOk);
    for (int64_t k = v.offsets[1]; k < v.offsets[2]; ++k) EXPECT_EQ(v.x[k], 0.0);
    // The resolve pass patches exactly that system.
    SolveInfo info;
    info.method = "thomas";
    std::vector<SystemStatus> st = v.status;
    const int64_t resolved = cpu::ResolveSingularWithPivoting(
        v.problem(), TridiagonalOutput<double>{v.x.data(), st.data()}, &info);
    EXPECT_EQ(resolved, 1);
    EXPECT_EQ(st[1], SystemStatus::kOk);
    v.status = st;
    EXPECT_LE(Backward(v, 1), 1e-15);
    EXPECT_EQ(info.method, "thomas + pivoting (1 systems)");
  }
}

TEST(VariableTridiagonal, SingularSystemIsFlaggedAloneAndZeroed) {
  VarBatch<double> v = Random<double>({4}, true, 3);
  v.Add({0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {1, 1, 1});  // the zero matrix
  VarBatch<double> tail = Random<double>({6}, true, 4);
  v.Add(tail.a, tail.b, tail.c, tail.d);
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPivoting}) {
    Solve(v, m);
    EXPECT_EQ(v.status[0], SystemStatus::kOk);
    EXPECT_EQ(v.status[1], SystemStatus::kSingular);
    EXPECT_EQ(v.status[2], SystemStatus::kOk);
    for (int64_t k = v.offsets[1]; k < v.offsets[2]; ++k) EXPECT_EQ(v.x[k], 0.0);
    EXPECT_LE(Backward(v, 2), 1e-15);
  }
}

TEST(VariableTridiagonal, BackwardErrorIsPerSystem) {
  // The batch's backward error is the worst system's, each measured on its own rows: a
  // uniform batch's residual of the same concatenation (one long system) would couple them.
  VarBatch<double> v = Random<double>({3, 8, 1, 40}, true, 9);
  Solve(v, TridiagonalMethod::kAuto);
  double worst = 0;
  for (int64_t s = 0; s < v.batch(); ++s) worst = std::max(worst, Backward(v, s));
  EXPECT_DOUBLE_EQ(TridiagonalBackwardError(v.problem(), v.x.data(), v.status.data()), worst);
  // A wrong row in system 2 (n = 1) shows in the batch's error.
  v.x[v.offsets[2]] += 1;
  EXPECT_GT(TridiagonalBackwardError(v.problem(), v.x.data(), v.status.data()), 1e-3);
}

TEST(VariableTridiagonal, SameAnswerAsTheUniformBatchWhenSizesAreEqual) {
  // Equal lengths through offsets must give the uniform batch's answer bit for bit.
  VarBatch<double> v = Random<double>(std::vector<int64_t>(20, 50), true, 11);
  for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPcr,
                 TridiagonalMethod::kPartitioned}) {
    Solve(v, m);
    std::vector<double> x(v.a.size());
    std::vector<SystemStatus> st(20);
    TridiagonalProblem<double> u{20, 50, Layout::kFlat, v.a.data(), v.b.data(), v.c.data(),
                                 v.d.data()};
    cpu::SolveTridiagonal(u, m, TridiagonalOutput<double>{x.data(), st.data()});
    EXPECT_EQ(x, v.x) << MethodName(m);
  }
}

// The unified layout's abc of a batch whose a, b, c are given: abc[i] = (a[i], b[i], c[i]).
template <typename T>
std::vector<T> Unify(const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& c) {
  std::vector<T> abc(3 * a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    abc[3 * i] = a[i];
    abc[3 * i + 1] = b[i];
    abc[3 * i + 2] = c[i];
  }
  return abc;
}

template <typename T>
void UnifiedIsFlatBitForBit(bool variable) {
  std::vector<int64_t> sizes;
  std::mt19937_64 rng(23);
  for (int i = 0; i < 40; ++i) sizes.push_back(variable ? int64_t(1 + rng() % 200) : 77);
  // Not dominant: auto's pivoting fallback runs on some systems too.
  for (bool dominant : {true, false}) {
    VarBatch<T> v = Random<T>(sizes, dominant, 29);
    const std::vector<T> abc = Unify(v.a, v.b, v.c);
    for (auto m : {TridiagonalMethod::kAuto, TridiagonalMethod::kThomas, TridiagonalMethod::kPcr,
                   TridiagonalMethod::kPartitioned, TridiagonalMethod::kPivoting}) {
      TridiagonalProblem<T> flat = v.problem();
      if (!variable) flat.offsets = nullptr;
      TridiagonalProblem<T> uni = flat;
      uni.a = abc.data();
      uni.b = abc.data() + 1;
      uni.c = abc.data() + 2;
      uni.coef_stride = 3;
      std::vector<T> x1(v.a.size()), x2(v.a.size(), T(std::nan("")));
      std::vector<SystemStatus> s1(sizes.size()), s2(sizes.size(), SystemStatus::kDiverged);
      const SolveInfo i1 = cpu::SolveTridiagonal(flat, m, TridiagonalOutput<T>{x1.data(), s1.data()});
      const SolveInfo i2 = cpu::SolveTridiagonal(uni, m, TridiagonalOutput<T>{x2.data(), s2.data()});
      EXPECT_EQ(s1, s2) << MethodName(m);
      EXPECT_EQ(x1, x2) << MethodName(m) << (variable ? " variable" : " uniform");
      EXPECT_EQ(i1.method, i2.method);
      EXPECT_EQ(TridiagonalBackwardError(flat, x1.data(), s1.data()),
                TridiagonalBackwardError(uni, x2.data(), s2.data()));
      // Thomas' SINGULAR systems patched by pivoting from abc as from a, b, c.
      if (m == TridiagonalMethod::kThomas) {
        EXPECT_EQ(cpu::ResolveSingularWithPivoting(flat, TridiagonalOutput<T>{x1.data(), s1.data()}, nullptr),
                  cpu::ResolveSingularWithPivoting(uni, TridiagonalOutput<T>{x2.data(), s2.data()}, nullptr));
        EXPECT_EQ(x1, x2);
      }
    }
  }
}

TEST(UnifiedTridiagonal, SameAnswerAsSeparateArraysBitForBit) {
  UnifiedIsFlatBitForBit<double>(false);
  UnifiedIsFlatBitForBit<float>(false);
  UnifiedIsFlatBitForBit<double>(true);
  UnifiedIsFlatBitForBit<float>(true);
}

TEST(UnifiedTridiagonal, HandWorkedSystem) {
  // [[2,1,0],[1,2,1],[0,1,2]] x = [4,8,8] -> x = [1, 2, 3]; abc rows (a, b, c).
  const std::vector<double> abc = {0, 2, 1, 1, 2, 1, 1, 2, 0}, d = {4, 8, 8};
  TridiagonalProblem<double> p{1, 3, Layout::kFlat, abc.data(), abc.data() + 1, abc.data() + 2,
                               d.data()};
  p.coef_stride = 3;
  std::vector<double> x(3);
  SystemStatus st;
  cpu::SolveTridiagonal(p, TridiagonalMethod::kAuto, TridiagonalOutput<double>{x.data(), &st});
  EXPECT_EQ(st, SystemStatus::kOk);
  EXPECT_NEAR(x[0], 1, 1e-15);
  EXPECT_NEAR(x[1], 2, 1e-15);
  EXPECT_NEAR(x[2], 3, 1e-15);
  EXPECT_LE(TridiagonalBackwardError(p, x.data(), &st), 1e-16);
}

}  // namespace
}  // namespace trisolve
