// Tree cells of different sizes in one problem (TreeProblem::offsets) on the CPU reference:
// hand-worked cells, every cell against the same cell solved alone, a singular cell among good
// ones, residuals from the original arrays in float64 and float32, the family's checks of
// lengths and per-cell parents, and the joined tree (ForestAsOneTree) the CUDA backend solves.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tree_cells.h"
#include "trisolve/family.h"
#include "trisolve/reference/tree.h"
#include "trisolve/swc.h"
#include "trisolve/tree.h"

namespace trisolve {
namespace {

using testing::Cells;

template <typename T>
struct Solved {
  std::vector<T> x;
  std::vector<SystemStatus> status;
  SolveInfo info;
};
template <typename T>
Solved<T> SolveCells(const Cells& c, TreeMethod m) {
  const auto typed = c.As<T>();
  Solved<T> r;
  r.x.assign(size_t(c.total()), T(std::nan("")));
  r.status.assign(size_t(c.cells()), SystemStatus::kDiverged);
  r.info = cpu::SolveTree(c.Problem(typed), m, TreeOutput<T>{r.x.data(), r.status.data()});
  return r;
}

class TreeCells : public ::testing::TestWithParam<TreeMethod> {};

TEST_P(TreeCells, HandWorkedOneTwoAndFiveNodes) {
  const Cells c = testing::HandWorkedCells();
  const std::vector<double> want = testing::HandWorkedX();
  const auto r = SolveCells<double>(c, GetParam());
  EXPECT_EQ(r.info.method, MethodName(GetParam()));
  for (SystemStatus s : r.status) EXPECT_EQ(s, SystemStatus::kOk);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r.x[i], want[i], 1e-14) << i;
  const auto typed = c.As<double>();
  EXPECT_LT(TreeBackwardError(c.Problem(typed), r.x.data(), r.status.data()), 1e-16);

  const auto f = SolveCells<float>(c, GetParam());
  for (SystemStatus s : f.status) EXPECT_EQ(s, SystemStatus::kOk);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(f.x[i], want[i], 2e-6) << i;
  const auto typedf = c.As<float>();
  EXPECT_LT(TreeBackwardError(c.Problem(typedf), f.x.data(), f.status.data()), 1e-7);
}

// Random cells of 1 .. 300 nodes: each cell's answer is the same cell's solved alone, bit for
// bit (the same arithmetic), and the residual from the original arrays is at rounding level.
TEST_P(TreeCells, EveryCellIsTheCellSolvedAlone) {
  std::mt19937_64 rng(17);
  Cells c;
  for (int k = 0; k < 120; ++k) {
    const int64_t n = k % 7 == 0 ? 1 : 1 + int64_t(rng() % 300);
    c.AddRandom(testing::RandomParents(n, rng), rng);
  }
  const auto typed = c.As<double>();
  const auto r = SolveCells<double>(c, GetParam());
  std::vector<double> alone(size_t(c.total()));
  for (int64_t s = 0; s < c.cells(); ++s) {
    ASSERT_EQ(r.status[size_t(s)], SystemStatus::kOk) << s;
    SystemStatus st = SystemStatus::kDiverged;
    const int64_t o = c.offsets[size_t(s)];
    cpu::SolveTree(c.CellAlone(typed, s), GetParam(), TreeOutput<double>{alone.data() + o, &st});
    ASSERT_EQ(st, SystemStatus::kOk);
    for (int64_t i = o; i < c.offsets[size_t(s) + 1]; ++i)
      ASSERT_EQ(r.x[size_t(i)], alone[size_t(i)]) << "cell " << s << " node " << i - o;
  }
  EXPECT_LT(TreeBackwardError(c.Problem(typed), r.x.data(), r.status.data()), 1e-15);
  const auto typedf = c.As<float>();
  const auto f = SolveCells<float>(c, GetParam());
  for (SystemStatus s : f.status) ASSERT_EQ(s, SystemStatus::kOk);
  EXPECT_LT(TreeBackwardError(c.Problem(typedf), f.x.data(), f.status.data()), 1e-6);
}

// Subtrees of the real morphology (its first k nodes: parent[i] < i makes them a tree) of
// different sizes, and the whole cell, in one problem.
TEST_P(TreeCells, SubtreesOfTheRealMorphology) {
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  ASSERT_TRUE(m.ok()) << m.status();
  std::mt19937_64 rng(3);
  Cells c;
  for (int64_t k : {3187, 1, 17, 400, 2000, 3186, 95}) {
    std::vector<int32_t> p(m->parent.begin(), m->parent.begin() + k);
    c.AddRandom(p, rng);
  }
  const auto typed = c.As<double>();
  const auto r = SolveCells<double>(c, GetParam());
  for (SystemStatus s : r.status) EXPECT_EQ(s, SystemStatus::kOk);
  EXPECT_LT(TreeBackwardError(c.Problem(typed), r.x.data(), r.status.data()), 1e-15);
}

// A singular cell among good ones: it alone is SINGULAR with x zero; the others' answers are
// those they have without it.
TEST_P(TreeCells, OnlyTheSingularCellIsSingular) {
  std::mt19937_64 rng(5);
  Cells c, without;
  for (int k = 0; k < 9; ++k) {
    if (k == 4) {
      c.AddSingular();
      continue;
    }
    std::mt19937_64 same(100 + k);
    const auto p = testing::RandomParents(1 + int64_t(rng() % 50), rng);
    c.AddRandom(p, same);
    std::mt19937_64 again(100 + k);
    without.AddRandom(p, again);
  }
  // A one-node cell with a zero diagonal too, last.
  c.Add({-1}, {0.0}, {0.0}, {0.0}, {1.0});
  const auto r = SolveCells<double>(c, GetParam());
  const auto w = SolveCells<double>(without, GetParam());
  int64_t wi = 0;
  for (int64_t s = 0; s < c.cells(); ++s) {
    const bool bad = s == 4 || s == c.cells() - 1;
    EXPECT_EQ(r.status[size_t(s)], bad ? SystemStatus::kSingular : SystemStatus::kOk) << s;
    for (int64_t i = c.offsets[size_t(s)]; i < c.offsets[size_t(s) + 1]; ++i) {
      if (bad) {
        EXPECT_EQ(r.x[size_t(i)], 0.0) << s;
      } else {
        EXPECT_EQ(r.x[size_t(i)], w.x[size_t(wi++)]) << s;
      }
    }
  }
  const auto f = SolveCells<float>(c, GetParam());
  for (int64_t s = 0; s < c.cells(); ++s)
    EXPECT_EQ(f.status[size_t(s)],
              s == 4 || s == c.cells() - 1 ? SystemStatus::kSingular : SystemStatus::kOk);
}

INSTANTIATE_TEST_SUITE_P(Methods, TreeCells,
                         ::testing::Values(TreeMethod::kHines, TreeMethod::kCables,
                                           TreeMethod::kContraction),
                         [](const auto& i) { return std::string(MethodName(i.param)); });

// The joined tree the CUDA backend solves: a valid tree, the roots' chain log_F(cells) deep,
// and, with the roots' couplings zeroed, the cells' answers and statuses (its one status: any
// cell singular) -- the CPU's sweeps over it stand in for the device's.
TEST(TreeCellsJoined, OneTreeIsTheCellsBlockDiagonalMatrix) {
  std::mt19937_64 rng(23);
  Cells c;
  for (int k = 0; k < 2000; ++k) c.AddRandom(testing::RandomParents(1 + int64_t(rng() % 40), rng), rng);
  const std::vector<int32_t> one = ForestAsOneTree(c.parent.data(), c.offsets.data(), c.cells());
  ASSERT_EQ(int64_t(one.size()), c.total());
  ASSERT_TRUE(ValidateParents(one.data(), c.total()).ok());
  // The roots' depth: 2000 cells at fan-out 32 are 3 levels (1, 32, 1024, ...).
  int depth = 0;
  for (int64_t k = c.cells() - 1; k > 0; k = (k - 1) / kForestFanout) ++depth;
  EXPECT_LE(depth, 3);
  for (int64_t k = 1; k < c.cells(); ++k)
    EXPECT_EQ(one[size_t(c.offsets[size_t(k)])], c.offsets[size_t((k - 1) / kForestFanout)]);
  auto joined = c.As<double>();
  for (int64_t k = 1; k < c.cells(); ++k) {
    joined.lower[size_t(c.offsets[size_t(k)])] = 0;
    joined.upper[size_t(c.offsets[size_t(k)])] = 0;
  }
  TreeProblem<double> p;
  p.batch = 1;
  p.n = c.total();
  p.parent = one.data();
  p.lower = joined.lower.data();
  p.upper = joined.upper.data();
  p.diag = joined.diag.data();
  p.rhs = joined.rhs.data();
  const auto cells = SolveCells<double>(c, TreeMethod::kHines);
  for (TreeMethod m : {TreeMethod::kHines, TreeMethod::kCables, TreeMethod::kContraction}) {
    std::vector<double> x(size_t(c.total()));
    SystemStatus st = SystemStatus::kDiverged;
    cpu::SolveTree(p, m, TreeOutput<double>{x.data(), &st});
    ASSERT_EQ(st, SystemStatus::kOk) << MethodName(m);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, std::abs(x[i] - cells.x[i]) / (1 + std::abs(cells.x[i])));
    // hines: the same arithmetic as each cell alone (its terms from the other cells are 0).
    if (m == TreeMethod::kHines) {
      EXPECT_EQ(worst, 0.0);
    }
    EXPECT_LT(worst, 1e-14) << MethodName(m);
  }
  // A singular cell makes the joined tree's one status SINGULAR, wherever it is.
  for (int at : {0, 37, 99}) {
    Cells d;
    for (int k = 0; k < 100; ++k) {
      if (k == at) {
        d.AddSingular();
      } else {
        d.AddRandom(testing::RandomParents(1 + int64_t(rng() % 40), rng), rng);
      }
    }
    const std::vector<int32_t> j = ForestAsOneTree(d.parent.data(), d.offsets.data(), d.cells());
    auto a = d.As<double>();
    for (int64_t k = 1; k < d.cells(); ++k) a.lower[size_t(d.offsets[size_t(k)])] = a.upper[size_t(d.offsets[size_t(k)])] = 0;
    TreeProblem<double> q = p;
    q.n = d.total();
    q.parent = j.data();
    q.lower = a.lower.data();
    q.upper = a.upper.data();
    q.diag = a.diag.data();
    q.rhs = a.rhs.data();
    for (TreeMethod m : {TreeMethod::kHines, TreeMethod::kCables, TreeMethod::kContraction}) {
      std::vector<double> x(size_t(d.total()));
      SystemStatus st = SystemStatus::kOk;
      cpu::SolveTree(q, m, TreeOutput<double>{x.data(), &st});
      EXPECT_EQ(st, SystemStatus::kSingular) << "cell " << at << " " << MethodName(m);
    }
  }
}

// The family's checks of a request's lengths and per-cell parent arrays (the server's
// CheckStructure): every length >= 1, their sum the arrays' length, each cell's parent array a
// tree of its own nodes; the messages name the field, the cell and the node.
TEST(TreeCellsChecks, LengthsAndEveryCellsParents) {
  const FamilyDescriptor& d = Describe(Family::kTree);
  ASSERT_GE(d.Find("lengths"), 0);
  EXPECT_EQ(d.arrays[size_t(d.Find("lengths"))].role, ArrayRole::kLengths);
  const Cells c = testing::HandWorkedCells();
  std::vector<int32_t> parent = c.parent, lengths = c.lengths;
  SystemSpec s;
  s.family = Family::kTree;
  s.batch = c.cells();
  s.n = c.total();
  s.coefficients = {c.lower.data(), c.upper.data(), c.diag.data(), parent.data()};
  OneShotArrays e;
  e.lengths = lengths.data();
  EXPECT_TRUE(d.check_structure(s, e).ok());
  const auto expect = [&](const std::string& part) {
    const absl::Status st = d.check_structure(s, e);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << part;
    EXPECT_NE(st.message().find(part), std::string::npos) << st.message() << " lacks " << part;
  };
  lengths = {1, 0, 7};
  expect("lengths: lengths[1] is 0; every cell needs at least one node");
  lengths = {1, 2, 4};
  expect("lengths: the 3 lengths sum to 7, but parent, lower, upper, diag and rhs hold 8 values");
  lengths = {1, 2, 5};
  parent[3] = 0;  // cell 2's root
  expect("parent: cell 2: parent[3] (its node 0) is 0, expected -1");
  parent[3] = -1;
  parent[6] = 3;  // cell 2's node 3 may hang from 0 .. 2 only
  expect("parent: cell 2: parent[6] (its node 3) is 3, expected 0 <= parent < 3");
  parent[6] = -1;
  expect("parent: cell 2: parent[6] (its node 3) is -1");
  parent[6] = 0;
  parent[2] = 5;  // a global index where a local one belongs
  expect("parent: cell 1: parent[2] (its node 1) is 5, expected 0 <= parent < 1");
}

}  // namespace
}  // namespace trisolve
