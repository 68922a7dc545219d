// A prepared block-tridiagonal system keeps its method's setup (cpu::PrepareBlock: the multigrid
// hierarchy, the line factors, auto's symmetry and the pivot tests): by handle, x must be bit
// for bit the one-shot call's on the same arrays, for every method with a setup, both
// precisions, either sign of definite matrix, auto's fall-backs, and after updates.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "../kernels/cpu/block_steps.h"  // internal to cpu/: the line factors
#include "block_systems.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/examples.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/system.h"

namespace trisolve {
namespace {

const char* const kNames[] = {"aC", "cC", "bC", "cA", "cB"};

using testing::Experiment;
using testing::Sys;

struct Answer {
  std::vector<char> x;  // the bytes
  std::vector<SystemStatus> status;
  SolveInfo info;
};

template <typename T>
Answer OneShot(Backend& be, const Sys<T>& s, const std::vector<T>& f, BlockMethod m,
               BlockOptions o) {
  BlockTridiagonalProblem<T> p = s.P();
  p.f = f.data();
  std::vector<T> y(f.size(), T(std::nan("")));
  Answer a;
  a.status.assign(1, SystemStatus::kDiverged);
  auto info = be.Solve(p, m, o, BlockOutput<T>{y.data(), a.status.data()}, SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) a.info = *info;
  a.x.resize(y.size() * sizeof(T));
  std::memcpy(a.x.data(), y.data(), a.x.size());
  return a;
}

// k right-hand sides by handle; answer j of them.
template <typename T>
std::vector<Answer> ByHandle(Backend& be, PreparedSystem& sys, const std::vector<T>& rhs,
                             int64_t k) {
  const size_t n = rhs.size() / size_t(k);
  std::vector<T> y(rhs.size(), T(std::nan("")));
  std::vector<SystemStatus> st(size_t(k), SystemStatus::kDiverged);
  RhsBlock<T> block;
  block.rhs = rhs.data();
  block.k = k;
  auto info = be.SolvePrepared(sys, block, y.data(), st.data(), SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  std::vector<Answer> out(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    out[size_t(j)].status = {st[size_t(j)]};
    if (info.ok()) out[size_t(j)].info = *info;
    out[size_t(j)].x.resize(n * sizeof(T));
    std::memcpy(out[size_t(j)].x.data(), y.data() + j * n, n * sizeof(T));
  }
  return out;
}

void ExpectSame(const Answer& kept, const Answer& once, bool whole_info, const std::string& what) {
  EXPECT_EQ(kept.status, once.status) << what << ": " << once.info.method;
  if (whole_info) {  // (k > 1 reports the worst of the k)
    EXPECT_EQ(kept.info.method, once.info.method) << what;
    EXPECT_EQ(kept.info.iterations, once.info.iterations) << what;
    EXPECT_EQ(std::memcmp(&kept.info.residual, &once.info.residual, sizeof(double)), 0)
        << what << ": " << kept.info.residual << " against " << once.info.residual;
  }
  ASSERT_EQ(kept.x.size(), once.x.size());
  EXPECT_EQ(kept.x, once.x) << what << ": x differs from the one-shot answer ("
                            << once.info.method << ")";
}

// One case: prepare, solve k = 1 and k = 2 by handle against the one-shot calls; then each
// update in `updates` (coefficient name -> values) and the same again.
template <typename T>
void Check(Sys<T> s, BlockMethod m, BlockOptions o, const std::string& what,
           const std::vector<std::pair<std::string, std::vector<T>>>& updates = {},
           const std::string& expect_kept = "") {
  auto be = MakeCpuBackend(2);
  auto sys = be->Prepare(s.Spec(m, o));
  ASSERT_TRUE(sys.ok()) << sys.status();
  const std::string kept = (*sys)->prepared();
  if (!expect_kept.empty()) {
    EXPECT_NE(kept.find(expect_kept), std::string::npos) << what << ": " << kept;
    // The kept values count in the system's bytes (the host copy: 5 arrays).
    EXPECT_GT((*sys)->bytes(), 5 * s.N * s.M * int64_t(sizeof(T)) + 4 * s.N * s.M)
        << what << ": " << kept;
  }
  const int64_t n = s.N * s.M;
  auto round = [&](const std::string& when) {
    std::vector<T> two(size_t(2 * n));
    for (int64_t e = 0; e < n; ++e) {
      two[size_t(e)] = s.a.at("f")[size_t(e)];
      two[size_t(n + e)] = T(0.5) * s.a.at("f")[size_t(e)] + T((e % 7) - 3);
    }
    const std::vector<T> f0(two.begin(), two.begin() + n), f1(two.begin() + n, two.end());
    const Answer once0 = OneShot(*be, s, f0, m, o), once1 = OneShot(*be, s, f1, m, o);
    ExpectSame(ByHandle(*be, **sys, f0, 1)[0], once0, true, what + when + ", k = 1");
    // Twice: the kept setup is unchanged by a solve.
    ExpectSame(ByHandle(*be, **sys, f0, 1)[0], once0, true, what + when + ", k = 1 again");
    auto both = ByHandle(*be, **sys, two, 2);
    ExpectSame(both[0], once0, false, what + when + ", k = 2, first");
    ExpectSame(both[1], once1, false, what + when + ", k = 2, second");
    return once0;
  };
  round("");
  for (const auto& [name, values] : updates) {
    const int i = CoefficientIndex(Family::kBlockTridiagonal, name);
    ASSERT_GE(i, 0) << name;
    ASSERT_TRUE((*sys)->Update(i, values.data()).ok());
    s.a[name] = values;
    round(", after updating " + name);
  }
}

template <typename T>
std::vector<T> Scaled(const std::vector<T>& v, T by) {
  std::vector<T> out(v);
  for (T& x : out) x *= by;
  return out;
}

template <typename T>
void EveryMethodWithASetup(T tol) {
  const std::string p = sizeof(T) == 8 ? "float64 " : "float32 ";
  const BlockOptions o{400, double(tol), false};
  for (int sign : {1, -1}) {
    const std::string sg = sign > 0 ? "positive definite " : "negative definite ";
    Sys<T> s = Experiment<T>(2, 40, 33, sign);
    // Updates: the diagonal scaled (still definite), then every array negated one at a time
    // (the matrix indefinite and not symmetric on the way, definite of the other sign at the
    // end), so that the kept setup follows the sign and the symmetry.
    std::vector<std::pair<std::string, std::vector<T>>> updates = {
        {"cC", Scaled(s.a.at("cC"), T(1.5))}};
    for (const char* k : kNames)
      updates.push_back({k, Scaled(k == std::string("cC") ? updates[0].second : s.a.at(k), T(-1))});
    Check(s, BlockMethod::kMultigridCg, o, p + sg + "multigrid-cg", updates, "multigrid hierarchy");
    Check(s, BlockMethod::kCg, o, p + sg + "cg", updates, "line factors");
    Check(s, BlockMethod::kMultigridBicgstab, o, p + sg + "multigrid-bicgstab", updates,
          "multigrid hierarchy");
    Check(s, BlockMethod::kAuto, o, p + sg + "auto", updates, "multigrid hierarchy");
  }
  // Not symmetric: auto runs gauss-seidel (nothing to keep but its tests); multigrid-bicgstab.
  Sys<T> e1 = Experiment<T>(1, 30, 26);
  Check(e1, BlockMethod::kMultigridBicgstab, o, p + "experiment 1, multigrid-bicgstab", {},
        "multigrid hierarchy");
  Check(e1, BlockMethod::kAuto, o, p + "experiment 1, auto");
  // auto's fall-backs: a singular line block in a nonsingular matrix (gauss-seidel skipped ->
  // BiCGStab with the V-cycle), and a symmetric matrix whose diagonals have both signs
  // (multigrid-cg skipped -> bicgstab+lines: the kept line factors).
  Sys<T> line = Experiment<T>(1, 6, 6);
  line.a["cC"][6] = T(0);
  Check(line, BlockMethod::kAuto, o, p + "auto, a singular line", {}, "multigrid hierarchy");
  Sys<T> mixed = Experiment<T>(2, 12, 10);
  mixed.a["cC"][37] = -mixed.a["cC"][37];
  Check(mixed, BlockMethod::kAuto, o, p + "auto, diagonals of both signs", {}, "line factors");
  // Symmetric indefinite: multigrid-cg stops on indefiniteness, then BiCGStab (issue 33).
  Sys<T> shifted = Experiment<T>(2, 24, 24);
  for (T& v : shifted.a["cC"]) v -= T(0.11);
  Check(shifted, BlockMethod::kAuto, {400, double(tol) * 100, false}, p + "auto, indefinite");
  // Fixed iteration counts (no tolerance) and a zero row.
  Check(Experiment<T>(2, 17, 23), BlockMethod::kMultigridCg, {7, 0, false},
        p + "multigrid-cg, 7 iterations");
}

TEST(BlockKept, ByHandleGivesTheOneShotAnswerBitForBit) {
  EveryMethodWithASetup<double>(1e-10);
  EveryMethodWithASetup<float>(1e-5f);
}

TEST(BlockKept, AZeroRowIsStillSingular) {
  Sys<double> z = Experiment<double>(2, 8, 8);
  const int64_t e0 = 3 * 8 + 4;
  for (const char* k : kNames) z.a[k][e0] = 0;
  z.a["bC"][e0 - 1] = 0;
  z.a["aC"][e0 + 1] = 0;
  z.a["cB"][e0 - 8] = 0;
  z.a["cA"][e0 + 8] = 0;
  for (auto m : {BlockMethod::kAuto, BlockMethod::kMultigridCg, BlockMethod::kCg})
    Check(z, m, {100, 1e-8, false}, std::string("zero row, ") + std::string(MethodName(m)));
  auto be = MakeCpuBackend(1);
  auto sys = be->Prepare(z.Spec(BlockMethod::kAuto, {100, 1e-8, false}));
  ASSERT_TRUE(sys.ok());
  auto a = ByHandle(*be, **sys, z.a.at("f"), 1);
  EXPECT_EQ(a[0].status[0], SystemStatus::kSingular);
}

// The line solves from kept factors are ThomasStrided's answers bit for bit (both the one-shot
// and the by-handle solves now factor the lines once: nothing else would compare them): random
// lines, a pivot that vanishes (no factors kept) and an x that overflows (false, as
// ThomasStrided).
template <typename T>
void LineFactorsAreThomas() {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t M : {1, 2, 3, 17, 200}) {
    const int64_t N = 9;
    std::vector<T> a(size_t(N * M)), b(a.size()), c(a.size()), d(a.size());
    for (size_t e = 0; e < a.size(); ++e) {
      a[e] = T(u(rng));
      c[e] = T(u(rng));
      b[e] = T(2.2 * u(rng));  // not dominant: pivots of every size
      d[e] = T(u(rng) * (e % 5 == 0 ? 1e3 : 1));
    }
    BlockTridiagonalProblem<T> p{N, M, a.data(), b.data(), c.data(), nullptr, nullptr,
                                 nullptr, nullptr};
    cpu::LineFactors<T> f;
    const bool factored = cpu::FactorLines(p, f);
    bool any_failed = false;
    for (int64_t i = 0; i < N; ++i) {
      std::vector<T> want(static_cast<size_t>(M)), got(want), work(want);
      const bool ok = cpu::ThomasStrided<T>(M, 1, a.data() + i * M, b.data() + i * M,
                                            c.data() + i * M, d.data() + i * M, want.data(),
                                            work.data());
      any_failed |= !ok;
      if (!factored) continue;
      EXPECT_EQ(cpu::SolveFactoredLine(M, a.data() + i * M, f.inv.data() + i * M,
                                       f.cp.data() + i * M, d.data() + i * M, got.data()),
                ok);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), size_t(M) * sizeof(T)), 0)
          << "M = " << M << ", line " << i;
    }
    if (!factored) {
      EXPECT_TRUE(any_failed) << M;
    }
  }
  // A pivot that vanishes: FactorLines says so.
  std::vector<T> a = {0, 1}, b = {1, 1}, c = {1, 0};
  BlockTridiagonalProblem<T> p{1, 2, a.data(), b.data(), c.data(), nullptr, nullptr, nullptr,
                               nullptr};
  cpu::LineFactors<T> f;
  EXPECT_FALSE(cpu::FactorLines(p, f));
  // x overflows: false, as ThomasStrided.
  std::vector<T> one = {1}, big = {std::numeric_limits<T>::max()}, x(1), w(1);
  std::vector<T> tiny = {T(1e-30)};
  BlockTridiagonalProblem<T> q{1, 1, one.data(), tiny.data(), one.data(), nullptr, nullptr,
                               nullptr, nullptr};
  ASSERT_TRUE(cpu::FactorLines(q, f));
  EXPECT_FALSE(cpu::SolveFactoredLine<T>(1, one.data(), f.inv.data(), f.cp.data(), big.data(),
                                         x.data()));
  EXPECT_FALSE(cpu::ThomasStrided<T>(1, 1, one.data(), tiny.data(), one.data(), big.data(),
                                     x.data(), w.data()));
}

TEST(BlockKept, LineFactorsGiveThomasStridedsAnswerBitForBit) {
  LineFactorsAreThomas<double>();
  LineFactorsAreThomas<float>();
}

// The kept setup is what the solve uses: one made from other arrays (the diagonal doubled)
// changes the answer, though the arrays solved are the same. (Without this, a solve that
// ignored the kept setup would pass the bit-for-bit test above.)
TEST(BlockKept, TheSolveReadsTheKeptSetup) {
  for (auto m : {BlockMethod::kMultigridCg, BlockMethod::kCg, BlockMethod::kMultigridBicgstab}) {
    Sys<double> s = Experiment<double>(2, 20, 20);
    Sys<double> other = s;
    other.a["cC"] = Scaled(s.a.at("cC"), 2.0);
    const BlockOptions o{5, 0, false};
    auto kept = cpu::PrepareBlock(other.P(), m, o);
    ASSERT_NE(kept, nullptr);
    std::vector<double> y1(400), y2(400);
    SystemStatus s1, s2;
    ASSERT_TRUE(cpu::SolveBlockTridiagonal(s.P(), m, o, BlockOutput<double>{y1.data(), &s1}).ok());
    ASSERT_TRUE(cpu::SolveBlockTridiagonal(s.P(), m, o, BlockOutput<double>{y2.data(), &s2}, {},
                                           kept.get())
                    .ok());
    EXPECT_NE(y1, y2) << MethodName(m);
    // And from the same arrays: the same bits.
    auto same = cpu::PrepareBlock(s.P(), m, o);
    ASSERT_TRUE(cpu::SolveBlockTridiagonal(s.P(), m, o, BlockOutput<double>{y2.data(), &s2}, {},
                                           same.get())
                    .ok());
    EXPECT_EQ(y1, y2) << MethodName(m);
    EXPECT_GT(cpu::BlockSetupBytes(*same), 400 * 8) << MethodName(m);
  }
}

// Manual timing (the CPU backend alone, one thread, no RPC): the setup alone (cpu::PrepareBlock:
// what a solve by handle no longer builds), the one-shot call and the solve by handle, best of
// 9 each, experiment 2 (experiment 1 for multigrid-bicgstab), float64, tol 1e-8. Run with
// --gtest_also_run_disabled_tests.
TEST(BlockKept, DISABLED_TimeAgainstTheOneShotCall) {
  auto be = MakeCpuBackend(1);
  auto ms = [](auto&& run) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3;
  };
  for (int64_t n : {256, 512, 1024})
    for (auto m : {BlockMethod::kMultigridCg, BlockMethod::kAuto, BlockMethod::kMultigridBicgstab,
                   BlockMethod::kCg}) {
      if (m == BlockMethod::kCg && n > 256) continue;  // thousands of iterations
      Sys<double> s = Experiment<double>(m == BlockMethod::kMultigridBicgstab ? 1 : 2, n, n);
      const BlockOptions o{4000, 1e-8, false};
      auto sys = be->Prepare(s.Spec(m, o));
      ASSERT_TRUE(sys.ok());
      Answer a;
      // Interleaved, the best of 9 each: the machine's other load shifts all three alike.
      double setup = 1e30, once = 1e30, kept = 1e30;
      for (int r = 0; r < 9; ++r) {
        setup = std::min(setup, ms([&] { cpu::PrepareBlock(s.P(), m, o); }));
        once = std::min(once, ms([&] { a = OneShot(*be, s, s.a.at("f"), m, o); }));
        kept = std::min(kept, ms([&] { ByHandle(*be, **sys, s.a.at("f"), 1); }));
      }
      std::printf("%4lld^2 %-18s %4lld its: setup %7.2f ms, one-shot %8.2f ms, by handle %8.2f ms "
                  "(%s)\n",
                  (long long)n, std::string(MethodName(m)).c_str(), (long long)a.info.iterations,
                  setup, once, kept, (*sys)->prepared().c_str());
      std::fflush(stdout);
    }
}

}  // namespace
}  // namespace trisolve
