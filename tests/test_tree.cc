#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "error_measure.h"
#include "gtest/gtest.h"
#include "trisolve/examples.h"
#include "trisolve/reference/tree.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/swc.h"
#include "trisolve/tree.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

template <typename T>
struct Trees {
  int64_t batch, n;
  std::vector<int32_t> parent;  // n or batch * n
  std::vector<T> lower, upper, diag, rhs, x;
  std::vector<SystemStatus> status;
  Layout layout = Layout::kFlat;
  TreeProblem<T> problem() const {
    TreeProblem<T> p;
    p.batch = batch;
    p.n = n;
    p.layout = layout;
    p.parent = parent.data();
    p.parent_per_system = int64_t(parent.size()) == batch * n && batch > 1;
    p.lower = lower.data();
    p.upper = upper.data();
    p.diag = diag.data();
    p.rhs = rhs.data();
    return p;
  }
  void Solve(TreeMethod method = TreeMethod::kHines) {
    x.assign(batch * n, T(std::nan("")));
    status.assign(batch, SystemStatus::kDiverged);
    const SolveInfo info =
        cpu::SolveTree(problem(), method, TreeOutput<T>{x.data(), status.data()});
    EXPECT_EQ(info.method, MethodName(method));
  }
  // ||rhs - A x||_inf / (||A|| ||x|| + ||rhs||) computed from the original arrays.
  double Residual() const {
    double worst = 0;
    for (int64_t s = 0; s < batch; ++s) {
      const int32_t* par = parent.data() + (int64_t(parent.size()) == batch * n ? s * n : 0);
      auto at = [&](const std::vector<T>& v, int64_t i) {
        return double(v[ElementIndex(layout, batch, n, s, i)]);
      };
      std::vector<double> ax(n), row(n);
      for (int64_t i = 0; i < n; ++i) ax[i] = at(diag, i) * at(x, i), row[i] = std::abs(at(diag, i));
      for (int64_t i = 1; i < n; ++i) {
        ax[i] += at(lower, i) * at(x, par[i]);
        row[i] += std::abs(at(lower, i));
        ax[par[i]] += at(upper, i) * at(x, i);
        row[par[i]] += std::abs(at(upper, i));
      }
      double r = 0, an = 0, xn = 0, bn = 0;
      for (int64_t i = 0; i < n; ++i) {
        r = testing::WorseOf(r, std::abs(at(rhs, i) - ax[i]));
        an = testing::WorseOf(an, row[i]);
        xn = testing::WorseOf(xn, std::abs(at(x, i)));
        bn = testing::WorseOf(bn, std::abs(at(rhs, i)));
      }
      worst = testing::WorseOf(worst, r / (an * xn + bn));
    }
    return worst;
  }
};

// Every solving test runs each method: the Hines sweeps and the sequential forms of the GPU's
// cable elimination and tree contraction.
class TreeBoth : public ::testing::TestWithParam<TreeMethod> {};

TEST_P(TreeBoth, HandWorkedFourNodes) {
  // Root 0 with children 1 and 3; node 2 under node 1. x = [1 2 3 4]:
  //   row 0: 4*1 + 0.5*2 + 1*4 = 9      row 1: 1*1 + 5*2 + 0.25*3 = 11.75
  //   row 2: 2*2 + 6*3 = 22             row 3: 3*1 + 7*4 = 31
  Trees<double> t{1, 4, {-1, 0, 1, 0}, {0, 1, 2, 3}, {0, 0.5, 0.25, 1}, {4, 5, 6, 7},
                  {9, 11.75, 22, 31}};
  t.Solve(GetParam());
  ASSERT_EQ(t.status[0], SystemStatus::kOk);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(t.x[i], i + 1, 1e-14);
}

TEST_P(TreeBoth, ChainIsATridiagonalSystem) {
  const int64_t n = 257;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> a(n), b(n), c(n), d(n), xt(n), w(n);
  Trees<double> t{1, n};
  t.parent.resize(n);
  t.lower.resize(n); t.upper.resize(n); t.diag.resize(n); t.rhs.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = u(rng); c[i] = u(rng); d[i] = u(rng);
    b[i] = 3 + u(rng);
    t.parent[i] = int32_t(i - 1);
  }
  for (int64_t i = 0; i < n; ++i) {
    t.lower[i] = a[i];                   // A[i][i-1]
    t.upper[i] = i > 0 ? c[i - 1] : 0;   // A[i-1][i]
    t.diag[i] = b[i];
    t.rhs[i] = d[i];
  }
  t.Solve(GetParam());
  cpu::ThomasStrided<double>(n, 1, a.data(), b.data(), c.data(), d.data(), xt.data(), w.data());
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(t.x[i], xt[i], 1e-13);
  EXPECT_LT(t.Residual(), 1e-15);
}

TEST_P(TreeBoth, Star) {
  const int64_t n = 1000;
  Trees<double> t{1, n};
  t.parent.assign(n, 0);
  t.parent[0] = -1;
  t.lower.assign(n, -1);
  t.upper.assign(n, -0.5);
  t.diag.assign(n, 2);
  t.diag[0] = 600;  // dominant: 999 * 0.5 = 499.5
  t.rhs.resize(n);
  for (int64_t i = 0; i < n; ++i) t.rhs[i] = std::sin(double(i));
  t.Solve(GetParam());
  EXPECT_EQ(t.status[0], SystemStatus::kOk);
  EXPECT_LT(t.Residual(), 1e-15);
}

Trees<double> FromArrays(const examples::Arrays& a, int64_t cells) {
  Trees<double> t;
  const auto& p = a.at("parent");
  t.n = p.elements();
  t.batch = cells;
  t.parent.assign(p.as<int32_t>(), p.as<int32_t>() + t.n);
  auto take = [&](const char* k) {
    const auto& v = a.at(k);
    return std::vector<double>(v.as<double>(), v.as<double>() + v.elements());
  };
  t.lower = take("lower");
  t.upper = take("upper");
  t.diag = take("diag");
  t.rhs = take("rhs");
  return t;
}

TEST_P(TreeBoth, RealMorphologyCableEquation) {
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 3187);
  ASSERT_TRUE(ValidateParents(m->parent.data(), m->size()).ok());
  auto t = FromArrays(examples::CableTree(*m, 8, 1), 8);
  t.Solve(GetParam());
  for (auto s : t.status) EXPECT_EQ(s, SystemStatus::kOk);
  EXPECT_LT(t.Residual(), 1e-15);

  // The interleaved layout gives the same answer.
  Trees<double> ti = t;
  ti.layout = Layout::kInterleaved;
  for (auto [src, dst] : {std::pair{&t.lower, &ti.lower}, {&t.upper, &ti.upper},
                          {&t.diag, &ti.diag}, {&t.rhs, &ti.rhs}})
    for (int64_t s = 0; s < t.batch; ++s)
      for (int64_t i = 0; i < t.n; ++i) (*dst)[i * t.batch + s] = (*src)[s * t.n + i];
  ti.Solve(GetParam());
  for (int64_t s = 0; s < t.batch; ++s)
    for (int64_t i = 0; i < t.n; ++i) ASSERT_EQ(ti.x[i * t.batch + s], t.x[s * t.n + i]);
}

TEST_P(TreeBoth, PerSystemParentsAndFloat32) {
  // Two different random trees in one batch, each checked on its own.
  std::mt19937_64 rng(5);
  const int64_t n = 500;
  Trees<float> t{2, n};
  t.parent.resize(2 * n);
  for (int s = 0; s < 2; ++s) {
    t.parent[s * n] = -1;
    for (int64_t i = 1; i < n; ++i)
      t.parent[s * n + i] = int32_t(std::uniform_int_distribution<int64_t>(s == 0 ? 0 : i - 3 < 0 ? 0 : i - 3, i - 1)(rng));
  }
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto* v : {&t.lower, &t.upper, &t.rhs}) {
    v->resize(2 * n);
    for (auto& e : *v) e = u(rng);
  }
  t.diag.assign(2 * n, 0);
  for (int s = 0; s < 2; ++s)
    for (int64_t i = 0; i < n; ++i) {
      t.diag[s * n + i] += 1 + std::abs(t.lower[s * n + i]);
      if (i > 0) t.diag[s * n + t.parent[s * n + i]] += std::abs(t.upper[s * n + i]);
    }
  t.Solve(GetParam());
  EXPECT_EQ(t.status[0], SystemStatus::kOk);
  EXPECT_EQ(t.status[1], SystemStatus::kOk);
  EXPECT_LT(t.Residual(), 1e-6);
}

TEST_P(TreeBoth, SingularPivotIsReported) {
  // Node 2's eliminated diagonal is zero: 0 on a leaf.
  Trees<double> t{2, 3, {-1, 0, 0}, {0, 1, 1, 0, 1, 1}, {0, 1, 1, 0, 1, 1},
                  {4, 4, 4, 4, 4, 0}, {1, 1, 1, 1, 1, 1}};
  t.Solve(GetParam());
  EXPECT_EQ(t.status[0], SystemStatus::kOk);
  EXPECT_EQ(t.status[1], SystemStatus::kSingular);
  EXPECT_EQ(t.x[3], 0.0);
  // The root's pivot can vanish too: [1 1; 1 1].
  Trees<double> r{1, 2, {-1, 0}, {0, 1}, {0, 1}, {1, 1}, {1, 1}};
  r.Solve(GetParam());
  EXPECT_EQ(r.status[0], SystemStatus::kSingular);
}

INSTANTIATE_TEST_SUITE_P(Methods, TreeBoth,
                         ::testing::Values(TreeMethod::kHines, TreeMethod::kCables,
                                           TreeMethod::kContraction),
                         [](const auto& i) { return std::string(MethodName(i.param)); });

TEST(TreeCables, HandWorkedDecomposition) {
  // Node: parent      0: -     1: 0    2: 1    3: 2    4: 1    5: 4    6: 5    7: 0    8: 7
  // Cables [0] [1] [2 3] [4 5 6] [7 8] of heights 2, 1, 0, 0, 0: [2 3] and [4 5 6] hang from
  // node 1, [1] and [7 8] from node 0.
  const std::vector<int32_t> parent = {-1, 0, 1, 2, 1, 4, 5, 0, 7};
  const TreeCables t = BuildTreeCables(parent.data(), 9);
  EXPECT_EQ(t.start, (std::vector<int32_t>{0, 1, 2, 4, 7, 9}));
  EXPECT_EQ(t.anchor, (std::vector<int32_t>{-1, 0, 1, 1, 0}));
  EXPECT_EQ(t.child_ptr, (std::vector<int32_t>{0, 2, 4, 4, 4, 4}));
  EXPECT_EQ(t.child_list, (std::vector<int32_t>{1, 4, 2, 3}));
  EXPECT_EQ(t.order, (std::vector<int32_t>{2, 3, 4, 1, 0}));
  EXPECT_EQ(t.level_ptr, (std::vector<int32_t>{0, 3, 4, 5}));
  EXPECT_EQ(t.node_order, (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 8, 1, 0}));
  EXPECT_EQ(t.node_level_ptr, (std::vector<int32_t>{0, 7, 8, 9}));
  EXPECT_EQ(t.levels(), 3);

  // A chain is one cable; a star is a root cable and n - 1 leaves of height 0.
  std::vector<int32_t> chain(1000);
  for (int i = 0; i < 1000; ++i) chain[i] = i - 1;
  const TreeCables c = BuildTreeCables(chain.data(), 1000);
  EXPECT_EQ(c.cables(), 1);
  EXPECT_EQ(c.length(0), 1000);
  EXPECT_EQ(c.levels(), 1);
  std::vector<int32_t> star(100, 0);
  star[0] = -1;
  const TreeCables st = BuildTreeCables(star.data(), 100);
  EXPECT_EQ(st.cables(), 100);
  EXPECT_EQ(st.levels(), 2);
  EXPECT_EQ(st.level_ptr[1], 99);
}

TEST(TreeCables, AnyValidNumberingNotOnlyDepthFirst) {
  // parent[i] < i without depth-first numbering: the only child of node i need not be i + 1,
  // so cables break there. The cable elimination must still equal the Hines sweeps.
  std::mt19937_64 rng(11);
  for (int64_t n : {1, 2, 3, 17, 1000, 20000}) {
    for (int kind = 0; kind < 3; ++kind) {
      Trees<double> t{3, n};
      t.parent.resize(n);
      t.parent[0] = -1;
      for (int64_t i = 1; i < n; ++i) {
        const int64_t lo = kind == 0 ? 0 : kind == 1 ? std::max<int64_t>(0, i - 3) : i - 1;
        t.parent[i] = int32_t(std::uniform_int_distribution<int64_t>(lo, i - 1)(rng));
      }
      std::uniform_real_distribution<double> u(-1, 1);
      for (auto* v : {&t.lower, &t.upper, &t.rhs}) {
        v->resize(3 * n);
        for (auto& e : *v) e = u(rng);
      }
      t.diag.assign(3 * n, 0);
      for (int s = 0; s < 3; ++s)
        for (int64_t i = 0; i < n; ++i) {
          t.diag[s * n + i] += 0.5 + std::abs(t.lower[s * n + i]);
          if (i > 0) t.diag[s * n + t.parent[i]] += std::abs(t.upper[s * n + i]);
        }
      t.Solve(TreeMethod::kHines);
      const std::vector<double> xh = t.x;
      for (TreeMethod m : {TreeMethod::kCables, TreeMethod::kContraction}) {
        t.Solve(m);
        for (auto s : t.status) ASSERT_EQ(s, SystemStatus::kOk);
        double dm = 0, xm = 0;
        for (int64_t i = 0; i < 3 * n; ++i) {
          dm = std::max(dm, std::abs(t.x[i] - xh[i]));
          xm = std::max(xm, std::abs(xh[i]));
        }
        EXPECT_LE(dm, 1e-13 * xm) << MethodName(m) << ", n = " << n << ", kind " << kind;
        EXPECT_LT(t.Residual(), 1e-15) << MethodName(m) << ", n = " << n << ", kind " << kind;
      }
    }
  }
}

TEST(TreeContraction, HandWorkedRounds) {
  // Node: parent   0: -   1: 0   2: 1   3: 2   4: 1   5: 0
  // Round 0 rakes the leaves 3, 4, 5 (node 2 has one child, 3, which is raked: 2 stays);
  // round 1 rakes 2 (now a leaf); round 2 rakes 1; then the root alone.
  const std::vector<int32_t> parent = {-1, 0, 1, 2, 1, 0};
  const TreeContraction t = BuildTreeContraction(parent.data(), 6);
  ASSERT_EQ(t.rounds(), 4);
  EXPECT_EQ(t.elim_ptr, (std::vector<int32_t>{0, 3, 4, 5, 6}));
  std::vector<int32_t> order;
  for (const auto& e : t.elim) order.push_back(e.v);
  EXPECT_EQ(order, (std::vector<int32_t>{3, 4, 5, 2, 1, 0}));
  // After round 0: node 0 takes 5, node 1 takes 4, node 2 takes 3.
  ASSERT_EQ(t.upd_ptr[1], 3);
  EXPECT_EQ(t.upd[0].u, 0);
  EXPECT_EQ(t.upd[1].u, 1);
  EXPECT_EQ(t.upd[2].u, 2);
  EXPECT_EQ(t.children[t.upd[1].first], 4);

  // A chain of 8: round 0 rakes 7 and compresses 1, 3, 5 (every other node with one child
  // whose neighbours stay), joining 2 to 0, 4 to 2 and 6 to 4.
  std::vector<int32_t> chain(8);
  for (int i = 0; i < 8; ++i) chain[i] = i - 1;
  const TreeContraction c = BuildTreeContraction(chain.data(), 8);
  ASSERT_GE(c.rounds(), 2);
  std::vector<int32_t> r0;
  for (int32_t k = c.elim_ptr[0]; k < c.elim_ptr[1]; ++k) r0.push_back(c.elim[k].v);
  EXPECT_EQ(r0, (std::vector<int32_t>{1, 3, 5, 7}));
  EXPECT_EQ(c.elim[0].p, 0);
  EXPECT_EQ(c.elim[0].c, 2);
  EXPECT_EQ(c.elim[3].c, -1);  // 7 is a leaf
  // Each round removes an independent set; every node goes exactly once; O(log n) rounds.
  for (int64_t n : {1, 2, 1000, 65536}) {
    std::vector<int32_t> p(n);
    std::mt19937_64 rng(n);
    p[0] = -1;
    for (int64_t i = 1; i < n; ++i)
      p[i] = std::uniform_real_distribution<double>(0, 1)(rng) < 0.85
                 ? int32_t(i - 1)
                 : int32_t(std::uniform_int_distribution<int64_t>(0, i - 1)(rng));
    const TreeContraction r = BuildTreeContraction(p.data(), n);
    std::vector<int> seen(n, 0);
    for (const auto& e : r.elim) ++seen[e.v];
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "node " << i << ", n = " << n;
    EXPECT_EQ(r.elim.back().v, 0);
    EXPECT_LE(r.rounds(), 4 * std::log2(double(n)) + 2) << "n = " << n;
    for (int64_t q = 0; q + 1 < r.rounds(); ++q) {
      std::vector<char> in(n, 0);
      for (int32_t k = r.elim_ptr[q]; k < r.elim_ptr[q + 1]; ++k) in[r.elim[k].v] = 1;
      for (int32_t k = r.elim_ptr[q]; k < r.elim_ptr[q + 1]; ++k) {
        const auto& e = r.elim[k];
        ASSERT_FALSE(in[e.p]) << "round " << q;
        if (e.c >= 0) {
          ASSERT_FALSE(in[e.c]) << "round " << q;
        }
      }
    }
  }
}

TEST(Tree, ParentValidation) {
  std::vector<int32_t> ok = {-1, 0, 1, 1, 0};
  EXPECT_TRUE(ValidateParents(ok.data(), 5).ok());
  std::vector<int32_t> root = {0, 0};
  EXPECT_FALSE(ValidateParents(root.data(), 2).ok());
  std::vector<int32_t> fwd = {-1, 2, 0};
  auto st = ValidateParents(fwd.data(), 3);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("parent[1] is 2"), absl::string_view::npos) << st;
  std::vector<int32_t> neg = {-1, 0, -1};
  EXPECT_FALSE(ValidateParents(neg.data(), 3).ok());
}

}  // namespace
}  // namespace trisolve
