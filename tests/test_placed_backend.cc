// The multi-device backend's placement (MakePlacedBackend) over stand-in devices: each the CPU
// reference behind a memory to spare it reports, its calls counted and, on demand, held. Runs
// everywhere (no GPU): calls taken in turn, a call where it fits, a busy device passed over,
// prepared systems kept and routed to their device, and batches too large for one device split
// by systems (flat, interleaved, trees with one or many morphologies) against the reference.
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/swc.h"
#include "fake_devices.h"
#include "tree_cells.h"

namespace trisolve {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

using testing::FakeDevice;
using testing::Placed;

Backend& Cpu() {
  static std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  return *cpu;
}

template <typename T>
double Distance(const std::vector<T>& got, const std::vector<T>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(double(got[i]))) return INFINITY;
    d = std::max(d, std::abs(double(got[i]) - double(want[i])));
    m = std::max(m, std::abs(double(want[i])));
  }
  return d / std::max(m, 1e-300);
}

struct Tri {
  int64_t batch, n;
  Layout layout;
  std::vector<double> a, b, c, d;
  TridiagonalProblem<double> P() const {
    return {batch, n, layout, a.data(), b.data(), c.data(), d.data()};
  }
};
Tri MakeTri(int64_t batch, int64_t n, Layout layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Tri t{batch, n, layout, {}, {}, {}, {}};
  for (int64_t i = 0; i < batch * n; ++i) {
    t.a.push_back(u(rng));
    t.c.push_back(u(rng));
    t.b.push_back(3 + u(rng));
    t.d.push_back(u(rng));
  }
  // A singular system among them: its status and zeros must land in its own place.
  for (int64_t k = 0; batch >= 3 && k < n; ++k) {
    const int64_t e = ElementIndex(layout, batch, n, batch / 2 + 1, k);
    t.a[size_t(e)] = t.b[size_t(e)] = t.c[size_t(e)] = 0;
  }
  return t;
}

// Solves t through `be` and the reference; the answers and statuses must agree.
void ExpectTriLikeReference(Backend& be, const Tri& t, const char* what) {
  std::vector<double> x(t.a.size(), NAN), want(t.a.size());
  std::vector<SystemStatus> st(size_t(t.batch)), wst(size_t(t.batch));
  auto got = be.Solve(t.P(), TridiagonalMethod::kThomas, {x.data(), st.data()}, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(Cpu().Solve(t.P(), TridiagonalMethod::kThomas, {want.data(), wst.data()}, {}).ok());
  EXPECT_EQ(st, wst) << what;
  EXPECT_EQ(Distance(x, want), 0) << what;
  if (t.batch >= 3) {
    EXPECT_EQ(st[size_t(t.batch / 2 + 1)], SystemStatus::kSingular) << what;
  }
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

TEST(PlacedBackend, CallsTakeTheDevicesInTurnAndInfoNamesThem) {
  std::vector<FakeDevice*> dev;
  auto be = Placed({kMiB << 10, kMiB << 10, kMiB << 10}, &dev);
  const Tri t = MakeTri(4, 16, Layout::kFlat, 1);
  for (int q = 0; q < 6; ++q) ExpectTriLikeReference(*be, t, "small");
  for (FakeDevice* d : dev) EXPECT_EQ(d->entered(), 2);
  const BackendInfo info = be->Info();
  EXPECT_EQ(info.name, "fake");
  ASSERT_EQ(info.devices.size(), 3u);
  ASSERT_EQ(info.pools.size(), 6u);
  EXPECT_EQ(info.pools[2].name, "device:b");
  EXPECT_EQ(info.pools[3].name, "pinned-host:b");
  for (const DeviceInfo& d : info.devices) {
    EXPECT_EQ(d.jobs, 2);
    EXPECT_EQ(d.jobs_in_flight, 0);
  }
}

// Many callers at once over equal devices, each call some milliseconds of a device's work:
// every device takes its share of the calls, whatever its place in the list. (On four H200s
// the first listed device ran 164-167 of 704 unary block solves and the second 185-188; this
// model of the placement stays within a few percent of even, so that bias is elsewhere.)
TEST(PlacedBackend, EqualDevicesTakeEqualSharesUnderLoad) {
  std::vector<FakeDevice*> dev;
  auto be = Placed(std::vector<int64_t>(4, kMiB << 10), &dev);
  for (FakeDevice* d : dev) d->work_us = 2000;
  const Tri t = MakeTri(4, 64, Layout::kFlat, 5);
  constexpr int kThreads = 16, kCalls = 60;
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&] {
      std::vector<double> x(t.a.size());
      std::vector<SystemStatus> st(size_t(t.batch));
      for (int k = 0; k < kCalls; ++k)
        if (!be->Solve(t.P(), TridiagonalMethod::kThomas, {x.data(), st.data()}, {}).ok())
          ++failed;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed.load(), 0);
  const double fair = double(kThreads * kCalls) / double(dev.size());
  std::string counts;
  for (FakeDevice* d : dev) counts += std::to_string(d->entered()) + " ";
  for (FakeDevice* d : dev) EXPECT_NEAR(d->entered(), fair, 0.1 * fair) << counts;
}

// Each device's solves are timed where they run, and the devices' own account of them summed:
// Info() says how long a job took on each (a slow device shows beside its peers).
TEST(PlacedBackend, EachDevicesJobTimesAreSummed) {
  std::vector<FakeDevice*> dev;
  auto be = Placed({kMiB << 10, kMiB << 10}, &dev);
  dev[0]->work_us = 2000;
  dev[1]->work_us = 6000;
  const Tri t = MakeTri(4, 16, Layout::kFlat, 8);
  for (int q = 0; q < 6; ++q) ExpectTriLikeReference(*be, t, "timed");
  const BackendInfo info = be->Info();
  ASSERT_EQ(info.devices.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const DeviceInfo& d = info.devices[i];
    const double work = dev[i]->work_us.load() * 1e-6, jobs = double(d.jobs);
    ASSERT_EQ(d.jobs, 3) << i;  // one after another: in turn
    EXPECT_NEAR(d.h2d_seconds, 0.25 * work * jobs, 1e-8) << i;
    EXPECT_NEAR(d.kernel_seconds, 0.5 * work * jobs, 1e-8) << i;
    EXPECT_NEAR(d.d2h_seconds, 0.25 * work * jobs, 1e-8) << i;
    EXPECT_GE(d.job_seconds, work * jobs) << i;  // each call slept its work at least
  }
  EXPECT_GT(info.devices[1].job_seconds, info.devices[0].job_seconds);
}

TEST(PlacedBackend, ACallGoesWhereItFits) {
  std::vector<FakeDevice*> dev;
  auto be = Placed({1 * kMiB, 64 * kMiB}, &dev);
  const Tri big = MakeTri(64, 1024, Layout::kFlat, 2);  // 2.6 MB: only the second
  for (int q = 0; q < 4; ++q) ExpectTriLikeReference(*be, big, "fits one");
  EXPECT_EQ(dev[0]->entered(), 0);
  EXPECT_EQ(dev[1]->entered(), 4);
  const Tri small = MakeTri(4, 16, Layout::kFlat, 3);  // fits both: in turn
  for (int q = 0; q < 4; ++q) ExpectTriLikeReference(*be, small, "fits both");
  EXPECT_EQ(dev[0]->entered(), 2);
}

TEST(PlacedBackend, ABusyDeviceIsPassedOver) {
  std::vector<FakeDevice*> dev;
  auto be = Placed({kMiB << 10, kMiB << 10}, &dev);
  const Tri t = MakeTri(4, 16, Layout::kFlat, 4);
  for (FakeDevice* d : dev) d->Hold(true);
  std::thread held([&] { ExpectTriLikeReference(*be, t, "held"); });
  // The held call is in flight on one device; the others go to the other.
  for (int spin = 0; spin < 1000 && dev[0]->entered() + dev[1]->entered() == 0; ++spin)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int busy = dev[0]->entered() == 1 ? 0 : 1;
  ASSERT_EQ(dev[size_t(busy)]->entered(), 1);
  dev[size_t(1 - busy)]->Hold(false);
  for (int q = 0; q < 3; ++q) ExpectTriLikeReference(*be, t, "beside the held one");
  EXPECT_EQ(dev[size_t(1 - busy)]->entered(), 3);
  EXPECT_EQ(be->Info().devices[size_t(busy)].jobs_in_flight, 1);
  dev[size_t(busy)]->Hold(false);
  held.join();
  EXPECT_EQ(dev[size_t(busy)]->entered(), 1);
}

// Systems are spread by what each device holds, also when created at once from many threads
// (their solves all go where they live): 8 equal systems over 4 devices, 2 each; a released
// system's share is given back, so the next system goes to the device that released two; a
// system 3 times as large counts 3 times.
TEST(PlacedBackend, SystemsSpreadByWhatEachDeviceHolds) {
  std::vector<FakeDevice*> dev;
  auto be = Placed(std::vector<int64_t>(4, 64 * kMiB), &dev);
  auto spec_of = [](const Tri& t, int64_t n) {
    SystemSpec spec;
    spec.family = Family::kTridiagonal;
    spec.n = n;
    spec.coefficients = {t.a.data(), t.b.data(), t.c.data()};
    return spec;
  };
  const Tri small = MakeTri(1, 100, Layout::kFlat, 7), large = MakeTri(1, 300, Layout::kFlat, 8);
  auto device_of = [&](const PreparedSystem& s) {
    for (size_t k = 0; k < dev.size(); ++k)
      if (s.holder() == dev[k]) return int(k);
    return -1;
  };
  std::vector<std::unique_ptr<PreparedSystem>> systems(8);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([&, i] {
        auto made = be->Prepare(spec_of(small, 100));
        ASSERT_TRUE(made.ok()) << made.status();
        systems[size_t(i)] = *std::move(made);
      });
    for (auto& t : threads) t.join();
  }
  std::vector<int> count(4);
  for (const auto& s : systems) {
    ASSERT_NE(s, nullptr);
    ASSERT_GE(device_of(*s), 0);
    ++count[size_t(device_of(*s))];
  }
  EXPECT_EQ(count, (std::vector<int>{2, 2, 2, 2}));
  // Device 2's two released: the next two go there, one after the other.
  for (auto& s : systems)
    if (s != nullptr && device_of(*s) == 2) s.reset();
  for (int i = 0; i < 2; ++i) {
    auto made = be->Prepare(spec_of(small, 100));
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_EQ(device_of(**made), 2) << i;
    systems.push_back(*std::move(made));
  }
  // One system of 3 times the bytes on some device: the next three small ones go elsewhere.
  auto big = be->Prepare(spec_of(large, 300));
  ASSERT_TRUE(big.ok());
  const int big_on = device_of(**big);
  for (int i = 0; i < 3; ++i) {
    auto made = be->Prepare(spec_of(small, 100));
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_NE(device_of(**made), big_on) << i;
    systems.push_back(*std::move(made));
  }
  // A system outliving its backend releases into its own count, not freed memory.
  be.reset();
  systems.clear();
  big->reset();
}

TEST(PlacedBackend, PreparedSystemsStayOnTheirDevice) {
  std::vector<FakeDevice*> dev;
  // (Device 0's room, 4 KiB, is less than a system's 4,800 bytes of coefficients.)
  auto be = Placed({4096, 64 * kMiB}, &dev);
  const Tri t = MakeTri(1, 200, Layout::kFlat, 5);
  SystemSpec spec;
  spec.family = Family::kTridiagonal;
  spec.n = 200;
  spec.coefficients = {t.a.data(), t.b.data(), t.c.data()};
  // Only the device with room for them takes them.
  std::vector<std::unique_ptr<PreparedSystem>> systems;
  for (int s = 0; s < 3; ++s) {
    auto made = be->Prepare(spec);
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_EQ((*made)->holder(), dev[1]);
    systems.push_back(*std::move(made));
  }
  EXPECT_EQ(dev[1]->prepared, 3);
  // Its solves go there, even while that device is busy and the other idle.
  std::vector<double> d(600), x(600), want(600);
  std::mt19937_64 rng(6);
  for (double& v : d) v = std::uniform_real_distribution<double>(-1, 1)(rng);
  std::vector<SystemStatus> st(3), wst(3);
  dev[1]->Hold(true);
  std::thread solve([&] {
    auto r = be->SolvePrepared(*systems[0], RhsBlock<double>{d.data(), 3}, x.data(), st.data(), {});
    EXPECT_TRUE(r.ok()) << r.status();
  });
  ASSERT_TRUE(dev[1]->WaitEntered(1));
  dev[1]->Hold(false);
  solve.join();
  EXPECT_EQ(dev[0]->entered(), 0);
  Tri rep = MakeTri(3, 200, Layout::kFlat, 0);
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t k = 0; k < 200; ++k) {
      rep.a[size_t(j * 200 + k)] = t.a[size_t(k)];
      rep.b[size_t(j * 200 + k)] = t.b[size_t(k)];
      rep.c[size_t(j * 200 + k)] = t.c[size_t(k)];
      rep.d[size_t(j * 200 + k)] = d[size_t(j * 200 + k)];
    }
  ASSERT_TRUE(Cpu().Solve(rep.P(), TridiagonalMethod::kAuto, {want.data(), wst.data()}, {}).ok());
  EXPECT_EQ(st, wst);
  EXPECT_LE(Distance(x, want), 1e-14);
  // A system held by a backend outside it is refused; one held by none (the host copy) solved.
  FakeDevice other(kMiB);
  auto foreign = other.Prepare(spec);
  ASSERT_TRUE(foreign.ok());
  auto r = be->SolvePrepared(**foreign, RhsBlock<double>{d.data()}, x.data(), st.data(), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  auto host = Cpu().Prepare(spec);
  ASSERT_TRUE(host.ok());
  r = be->SolvePrepared(**host, RhsBlock<double>{d.data()}, x.data(), st.data(), {});
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(dev[0]->entered() + dev[1]->entered(), 2);
}

// A call is weighed by the devices' own figure (a device backend's scratch beside the five
// arrays): 100 systems of 1000 unknowns are 4 MB by five arrays, under either device's 5 MB,
// and 6.4 MB by eight, over it: then split, in proportion to the rooms.
TEST(PlacedBackend, ABatchIsWeighedByTheDevicesOwnFigure) {
  const Tri t = MakeTri(100, 1000, Layout::kFlat, 9);
  for (int64_t arrays : {5, 8}) {
    std::vector<FakeDevice*> dev;
    auto be = Placed({5 * 1000 * 1000, 5 * 1000 * 1000}, &dev);
    for (FakeDevice* d : dev) d->tri_arrays = arrays;
    EXPECT_EQ(be->TridiagonalDeviceBytes(1000, 100, Layout::kFlat, 8, TridiagonalMethod::kAuto),
              arrays * 800 * 1000);
    ExpectTriLikeReference(*be, t, arrays == 5 ? "five arrays" : "eight arrays");
    if (arrays == 5) {
      EXPECT_EQ(dev[0]->entered() + dev[1]->entered(), 1);
    } else {
      EXPECT_EQ(dev[0]->batches(), std::vector<int64_t>{50});
      EXPECT_EQ(dev[1]->batches(), std::vector<int64_t>{50});
    }
  }
}

TEST(PlacedBackend, ABatchTooLargeForOneDeviceIsSplitBySystems) {
  // 100 systems of 1000 unknowns: 4 MB (a, b, c, d, x), over either device's room, not both's.
  for (Layout layout : {Layout::kFlat, Layout::kInterleaved}) {
    std::vector<FakeDevice*> dev;
    auto be = Placed({3 * 1000 * 1000, 2 * 1000 * 1000}, &dev);
    const Tri t = MakeTri(100, 1000, layout, 7);
    ExpectTriLikeReference(*be, t, layout == Layout::kFlat ? "flat" : "interleaved");
    EXPECT_EQ(dev[0]->batches(), std::vector<int64_t>{60});  // in proportion to the rooms
    EXPECT_EQ(dev[1]->batches(), std::vector<int64_t>{40});
    std::vector<double> x(t.a.size());
    std::vector<SystemStatus> st(100);
    auto info = be->Solve(t.P(), TridiagonalMethod::kThomas, {x.data(), st.data()}, {});
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->method, "thomas (split over 2 devices)");
  }
  // Trees: one morphology and one a cell, both layouts.
  for (bool per_cell : {false, true})
    for (Layout layout : {Layout::kFlat, Layout::kInterleaved}) {
      std::vector<FakeDevice*> dev;
      auto be = Placed({3 * 1000 * 1000, 2 * 1000 * 1000}, &dev);
      const int64_t batch = 100, n = 1000;
      std::mt19937_64 rng(8);
      std::uniform_real_distribution<double> u(-1, 1);
      std::vector<int32_t> parent(size_t(per_cell ? batch * n : n));
      for (size_t i = 0; i < parent.size(); ++i)
        parent[i] = i % size_t(n) == 0 ? -1 : int32_t(rng() % (i % size_t(n)));
      std::vector<double> lower(size_t(batch * n)), upper(lower.size()), diag(lower.size()),
          rhs(lower.size());
      for (size_t i = 0; i < lower.size(); ++i) {
        lower[i] = u(rng);
        upper[i] = u(rng);
        diag[i] = 2 * n + u(rng);  // dominant whatever the degrees
        rhs[i] = u(rng);
      }
      TreeProblem<double> p;
      p.batch = batch;
      p.n = n;
      p.layout = layout;
      p.parent = parent.data();
      p.parent_per_system = per_cell;
      p.lower = lower.data();
      p.upper = upper.data();
      p.diag = diag.data();
      p.rhs = rhs.data();
      std::vector<double> x(lower.size(), NAN), want(lower.size());
      std::vector<SystemStatus> st(static_cast<size_t>(batch)), wst(st.size());
      auto got = be->Solve(p, TreeMethod::kHines, TreeOutput<double>{x.data(), st.data()}, {});
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(
          Cpu().Solve(p, TreeMethod::kHines, TreeOutput<double>{want.data(), wst.data()}, {}).ok());
      EXPECT_EQ(st, wst);
      EXPECT_EQ(Distance(x, want), 0) << "tree per_cell=" << per_cell << " layout=" << int(layout);
      EXPECT_EQ(Sum(dev[0]->batches()) + Sum(dev[1]->batches()), batch);
      EXPECT_EQ(dev[0]->batches().size(), 1u);
      EXPECT_EQ(dev[1]->batches().size(), 1u);
    }
}

TEST(PlacedBackend, TreeCellsOfDifferentSizesGoWholeToOneDevice) {
  // Cells of different sizes are never split by systems (the parts would need offsets of their
  // own): one device takes them all; a singular cell last keeps its place.
  std::mt19937_64 rng(12);
  testing::Cells c;
  for (int k = 0; k < 300; ++k)
    c.AddRandom(testing::RandomParents(1 + int64_t(rng() % 400), rng), rng);
  c.AddSingular();
  std::vector<FakeDevice*> dev;
  auto be = Placed({40 * kMiB, 30 * kMiB}, &dev);
  const auto typed = c.As<double>();
  const TreeProblem<double> p = c.Problem(typed);
  std::vector<double> x(size_t(c.total()), NAN), want(x.size());
  std::vector<SystemStatus> st(size_t(c.cells())), wst(st.size());
  auto got = be->Solve(p, TreeMethod::kHines, TreeOutput<double>{x.data(), st.data()}, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(
      Cpu().Solve(p, TreeMethod::kHines, TreeOutput<double>{want.data(), wst.data()}, {}).ok());
  EXPECT_EQ(st, wst);
  EXPECT_EQ(st.back(), SystemStatus::kSingular);
  EXPECT_EQ(Distance(x, want), 0);
  EXPECT_EQ(dev[0]->batches().size() + dev[1]->batches().size(), 1u);
  EXPECT_EQ(Sum(dev[0]->batches()) + Sum(dev[1]->batches()), c.cells());
}

TEST(PlacedBackend, ABatchIsSplitOnlyWhereNoOneDeviceHoldsIt) {
  const Tri t = MakeTri(100, 1000, Layout::kFlat, 9);  // 4 MB
  {
    std::vector<FakeDevice*> dev;
    auto be = Placed({8 * 1000 * 1000, 2 * 1000 * 1000}, &dev);  // the first holds it
    ExpectTriLikeReference(*be, t, "fits one");
    EXPECT_EQ(dev[0]->batches(), std::vector<int64_t>{100});
    EXPECT_EQ(dev[1]->entered(), 0);
  }
  {
    std::vector<FakeDevice*> dev;
    auto be = Placed({1000 * 1000, 1000 * 1000}, &dev);  // not even both: one takes it whole
    ExpectTriLikeReference(*be, t, "fits none");
    EXPECT_EQ(Sum(dev[0]->batches()) + Sum(dev[1]->batches()), 100);
    EXPECT_EQ(dev[0]->entered() + dev[1]->entered(), 1);
  }
}

// One system split by rows (kernels/cpu/split_system.h) ------------------------------------

enum class Rows { kDominant, kHeat, kRandom, kZeroDiagonal };

template <typename T>
struct One {
  int64_t n;
  std::vector<T> a, b, c, d;
  TridiagonalProblem<T> P() const {
    return {1, n, Layout::kFlat, a.data(), b.data(), c.data(), d.data()};
  }
};
template <typename T>
One<T> MakeOne(int64_t n, Rows rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  One<T> o{n, {}, {}, {}, {}};
  for (int64_t i = 0; i < n; ++i) {
    double a = u(rng), b = 4 + u(rng), c = u(rng);
    if (rows == Rows::kHeat) a = c = -1e5, b = 1 + 2e5;  // implicit heat step, r = 1e5
    if (rows == Rows::kRandom) b = u(rng);
    if (rows == Rows::kZeroDiagonal) a = c = 1, b = 0;
    o.a.push_back(T(a));
    o.b.push_back(T(b));
    o.c.push_back(T(c));
    // kHeat: a source at the middle rows (the interface of two parts) alone, so that x
    // decays from there as the couplings do, and a window cut short shows in x.
    const double source = std::abs(double(i - n / 2)) <= 2 ? 1.0 : 0.0;
    o.d.push_back(T(rows == Rows::kHeat ? source : u(rng)));
  }
  return o;
}

// Solves o through `be` (auto) and by partial pivoting on the CPU: OK, backward error at the
// rounding level, the same x as the reference within `forward`. Returns the method.
template <typename T>
std::string ExpectSplitLikeReference(Backend& be, const One<T>& o, double forward,
                                     const std::string& what) {
  std::vector<T> x(size_t(o.n), T(NAN)), want(size_t(o.n));
  SystemStatus st = SystemStatus::kSingular, wst;
  auto got = be.Solve(o.P(), TridiagonalMethod::kAuto, {x.data(), &st}, {});
  EXPECT_TRUE(got.ok()) << what << ": " << got.status();
  if (!got.ok()) return "";
  EXPECT_EQ(st, SystemStatus::kOk) << what;
  EXPECT_TRUE(
      Cpu().Solve(o.P(), TridiagonalMethod::kPivoting, {want.data(), &wst}, {}).ok());
  const double eps = std::numeric_limits<T>::epsilon();
  const double be_got = TridiagonalBackwardError(o.P(), x.data(), &st);
  const double be_want = TridiagonalBackwardError(o.P(), want.data(), &wst);
  EXPECT_LE(be_got, std::max(10 * be_want, 4 * eps)) << what << " (" << got->method << ")";
  EXPECT_LE(Distance(x, want), forward) << what << " (" << got->method << ")";
  return got->method;
}

TEST(PlacedBackend, OneLargeSystemIsSplitByRowsOverIdleDevices) {
  PlacementOptions options;
  options.split_system_unknowns = 100000;
  for (int devices : {2, 3}) {
    std::vector<FakeDevice*> dev;
    auto be = Placed(std::vector<int64_t>(size_t(devices), int64_t{1} << 30), &dev, options);
    const std::string method = ExpectSplitLikeReference(
        *be, MakeOne<double>(300001, Rows::kDominant, 1), 1e-13, "dominant");
    EXPECT_NE(method.find("split over " + std::to_string(devices) + " devices"),
              std::string::npos)
        << method;
    for (FakeDevice* d : dev) EXPECT_EQ(d->batches(), std::vector<int64_t>{1});
  }
  {  // under the threshold: whole, on one device
    std::vector<FakeDevice*> dev;
    auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
    const std::string method = ExpectSplitLikeReference(
        *be, MakeOne<double>(99999, Rows::kDominant, 2), 1e-13, "small");
    EXPECT_EQ(method.find("split"), std::string::npos) << method;
    EXPECT_EQ(dev[0]->entered() + dev[1]->entered(), 1);
  }
}

TEST(PlacedBackend, OneSystemTooLargeForAnyDeviceIsSplitByRows) {
  PlacementOptions never;
  never.split_system_unknowns = 0;  // by memory only
  const One<double> o = MakeOne<double>(100000, Rows::kDominant, 3);  // 4 MB with x
  const One<float> f = MakeOne<float>(100000, Rows::kDominant, 4);    // 2 MB
  for (const auto& rooms : std::vector<std::vector<int64_t>>{
           {3 * kMiB, 2 * kMiB}, {2 * kMiB, 2 * kMiB, kMiB}}) {
    std::vector<FakeDevice*> dev;
    auto be = Placed(rooms, &dev, never);
    const std::string method = ExpectSplitLikeReference(*be, o, 1e-13, "float64");
    EXPECT_NE(method.find("split over " + std::to_string(rooms.size())), std::string::npos)
        << method;
    std::vector<FakeDevice*> dev32;
    std::vector<int64_t> half;
    for (int64_t r : rooms) half.push_back(r / 2);
    auto be32 = Placed(half, &dev32, never);
    const std::string m32 = ExpectSplitLikeReference(*be32, f, 1e-5, "float32");
    EXPECT_NE(m32.find("split over"), std::string::npos) << m32;
  }
}

TEST(PlacedBackend, ASplitWhoseCouplingsDecaySlowlyWidensItsWindows) {
  // Rows of an implicit heat step with r = 1e5: a coupling decays by e every sqrt(r) ~ 316
  // rows, so the first windows (8192 rows: e^-26) leave a residual above the rounding level
  // and grow (65,536 rows: e^-207). x decays the same way from the source in the middle: with
  // the first windows kept, the backward error is ~1e-12.
  PlacementOptions options;
  options.split_system_unknowns = 1000;
  std::vector<FakeDevice*> dev;
  auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
  const std::string method =
      ExpectSplitLikeReference(*be, MakeOne<double>(1 << 20, Rows::kHeat, 5), 1e-9, "heat");
  EXPECT_NE(method.find("split over 2"), std::string::npos) << method;
}

TEST(PlacedBackend, ASplitOfANonDominantSystemIsBackwardStable) {
  PlacementOptions options;
  options.split_system_unknowns = 1000;
  std::vector<FakeDevice*> dev;
  auto be = Placed({int64_t{1} << 30, int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
  // The forward error is whatever the conditioning allows; the backward error is the test.
  const std::string method =
      ExpectSplitLikeReference(*be, MakeOne<double>(30000, Rows::kRandom, 6), 1e-3, "random");
  EXPECT_NE(method.find("split over 3"), std::string::npos) << method;
}

TEST(PlacedBackend, ASplitWithASingularPartIsSolvedAnotherWayNotCalledSingular) {
  // tridiag(1, 0, 1) of even order is nonsingular (condition ~n), but of odd order singular:
  // cut in two parts of 999 rows, the split cannot join, and the system is solved whole -- on
  // a device where one holds it, else on the host.
  const One<double> o = MakeOne<double>(1998, Rows::kZeroDiagonal, 7);  // 80 kB with x
  PlacementOptions options;
  options.split_system_unknowns = 1000;
  {
    std::vector<FakeDevice*> dev;
    auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
    const std::string method = ExpectSplitLikeReference(*be, o, 1e-12, "fits one");
    EXPECT_NE(method.find("not split: part 0"), std::string::npos) << method;
  }
  {
    std::vector<FakeDevice*> dev;
    auto be = Placed({48000, 48000}, &dev, options);
    const std::string method = ExpectSplitLikeReference(*be, o, 1e-12, "fits none");
    EXPECT_NE(method.find("on the host (not split: part 0"), std::string::npos) << method;
  }
}


// One tree split by subtrees (kernels/cpu/tree_split.h) ----------------------------------

enum class Shape { kChain, kStar, kRandom, kCell };
const char* ShapeName(Shape s) {
  const char* names[] = {"chain", "star", "random", "cell"};
  return names[int(s)];
}

// A chain, a star, a random recursive tree (each node's parent drawn from those before it), or
// the real cell of tests/data (its own size).
std::vector<int32_t> TreeParents(Shape shape, int64_t n, uint64_t seed) {
  if (shape == Shape::kCell) {
    auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? m->parent : std::vector<int32_t>{-1};
  }
  std::mt19937_64 rng(seed);
  std::vector<int32_t> parent(size_t(n), -1);
  for (int64_t i = 1; i < n; ++i)
    parent[size_t(i)] = shape == Shape::kChain ? int32_t(i - 1)
                        : shape == Shape::kStar ? 0
                                                : int32_t(rng() % uint64_t(i));
  return parent;
}

template <typename T>
struct OneTree {
  std::vector<int32_t> parent;
  std::vector<T> lower, upper, diag, rhs;
  TreeProblem<T> P() const {
    TreeProblem<T> p;
    p.batch = 1;
    p.n = int64_t(parent.size());
    p.parent = parent.data();
    p.lower = lower.data();
    p.upper = upper.data();
    p.diag = diag.data();
    p.rhs = rhs.data();
    return p;
  }
};
// Random couplings; each diagonal 1.2 to 2 times its row's off-diagonal sum, plus 0.1 (a star's
// root has n - 1 terms), so every part is nonsingular too.
template <typename T>
OneTree<T> MakeTree(std::vector<int32_t> parent, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  OneTree<T> t;
  const size_t n = parent.size();
  t.parent = std::move(parent);
  std::vector<double> lower(n), upper(n), off(n, 0.0);
  for (size_t i = 1; i < n; ++i) {
    lower[i] = u(rng);
    upper[i] = u(rng);
    off[i] += std::abs(lower[i]);
    off[size_t(t.parent[i])] += std::abs(upper[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    t.lower.push_back(T(lower[i]));
    t.upper.push_back(T(upper[i]));
    t.diag.push_back(T((1.6 + 0.4 * u(rng)) * off[i] + 0.1));
    t.rhs.push_back(T(u(rng)));
  }
  return t;
}

// Solves t through `be` (method m) and by the Hines sweep on the CPU: OK, backward error at the
// rounding level, the same x as the reference within `forward`. Returns the method.
template <typename T>
std::string ExpectTreeLikeReference(Backend& be, const OneTree<T>& t, double forward,
                                    const std::string& what, TreeMethod m = TreeMethod::kAuto) {
  std::vector<T> x(t.parent.size(), T(NAN)), want(t.parent.size());
  SystemStatus st = SystemStatus::kSingular, wst = SystemStatus::kSingular;
  auto got = be.Solve(t.P(), m, TreeOutput<T>{x.data(), &st}, {});
  EXPECT_TRUE(got.ok()) << what << ": " << got.status();
  if (!got.ok()) return "";
  EXPECT_EQ(st, SystemStatus::kOk) << what << " (" << got->method << ")";
  EXPECT_TRUE(Cpu().Solve(t.P(), TreeMethod::kHines, TreeOutput<T>{want.data(), &wst}, {}).ok());
  EXPECT_EQ(wst, SystemStatus::kOk) << what;
  const double eps = std::numeric_limits<T>::epsilon();
  // (Residuals from the original arrays.)
  const double be_got = TreeBackwardError(t.P(), x.data(), &st);
  const double be_want = TreeBackwardError(t.P(), want.data(), &wst);
  EXPECT_LE(be_got, std::max(10 * be_want, 4 * eps)) << what << " (" << got->method << ")";
  EXPECT_LE(Distance(x, want), forward) << what << " (" << got->method << ")";
  return got->method;
}

TEST(PlacedBackend, OneLargeTreeIsSplitBySubtreesOverIdleDevices) {
  PlacementOptions options;
  options.split_system_unknowns = 1000;
  options.split_tree_nodes = 1000;
  for (Shape shape : {Shape::kChain, Shape::kStar, Shape::kRandom, Shape::kCell})
    for (int devices : {2, 3}) {
      const std::string what = std::string(ShapeName(shape)) + " over " +
                               std::to_string(devices);
      const auto parent = TreeParents(shape, 30001, 11 + uint64_t(shape));
      const int64_t n = int64_t(parent.size());
      for (bool single : {false, true}) {
        std::vector<FakeDevice*> dev;
        auto be = Placed(std::vector<int64_t>(size_t(devices), int64_t{1} << 30), &dev, options);
        const std::string method =
            single ? ExpectTreeLikeReference(*be, MakeTree<float>(parent, 12), 1e-5,
                                             what + " float32")
                   : ExpectTreeLikeReference(*be, MakeTree<double>(parent, 12), 1e-13,
                                             what + " float64");
        EXPECT_EQ(method, "hines (one tree split over " + std::to_string(devices) + " devices)")
            << what;
        // One part a device, prepared there once, and a call for each of its right-hand
        // sides (its own and one a link, two at least); every node in one part (each part
        // has a root of its own).
        int64_t nodes = 0;
        for (FakeDevice* d : dev) {
          EXPECT_EQ(d->prepared, 1) << what;
          ASSERT_GE(d->tree_sizes().size(), 2u) << what;
          for (int64_t b : d->batches()) EXPECT_EQ(b, 1) << what;
          for (int64_t m : d->tree_sizes()) EXPECT_EQ(m, d->tree_sizes()[0]) << what;
          nodes += d->tree_sizes()[0] - 1;
          // Parts of equal shares: within 1% where whole subtrees allow (a chain's and a
          // star's always do).
          if (shape == Shape::kChain || shape == Shape::kStar) {
            EXPECT_NEAR(double(d->tree_sizes()[0]), double(n) / devices, 0.01 * double(n))
                << what;
          }
          // For speed a part may be some 20% off its share rather than take a link more (a
          // right-hand side more for two parts): the cell over two devices is cut at one
          // node, each part with its own and one extra right-hand side.
          if (shape == Shape::kCell && devices == 2) {
            EXPECT_EQ(d->entered(), 2) << what;
          }
        }
        EXPECT_EQ(nodes, n) << what;
      }
    }
  {  // under the threshold, or a method named: whole, on one device
    std::vector<FakeDevice*> dev;
    auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
    const OneTree<double> small = MakeTree<double>(TreeParents(Shape::kRandom, 999, 13), 14);
    EXPECT_EQ(ExpectTreeLikeReference(*be, small, 1e-13, "small"), "hines");
    const OneTree<double> big = MakeTree<double>(TreeParents(Shape::kRandom, 5000, 15), 16);
    EXPECT_EQ(ExpectTreeLikeReference(*be, big, 1e-13, "named", TreeMethod::kContraction),
              "contraction");
    EXPECT_EQ(dev[0]->entered() + dev[1]->entered(), 2);
  }
  {  // trees are split for speed only where asked (PlacementOptions' default: never)
    PlacementOptions rows_only;
    rows_only.split_system_unknowns = 1000;
    ASSERT_EQ(PlacementOptions().split_tree_nodes, 0);
    std::vector<FakeDevice*> dev;
    auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, rows_only);
    const OneTree<double> big = MakeTree<double>(TreeParents(Shape::kRandom, 30001, 17), 18);
    EXPECT_EQ(ExpectTreeLikeReference(*be, big, 1e-13, "not asked"), "hines");
    EXPECT_EQ(dev[0]->entered() + dev[1]->entered(), 1);
  }
}

TEST(PlacedBackend, ATreeSplitKeepsItsCutOnlyForTheSameMorphology) {
  // One backend, trees of one size in turn: a random tree, another, a chain, the first again.
  PlacementOptions options;
  options.split_system_unknowns = 1000;
  options.split_tree_nodes = 1000;
  std::vector<FakeDevice*> dev;
  auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
  const auto first = TreeParents(Shape::kRandom, 20000, 41);
  for (const auto& parent : {first, TreeParents(Shape::kRandom, 20000, 42),
                             TreeParents(Shape::kChain, 20000, 0), first}) {
    const std::string method =
        ExpectTreeLikeReference(*be, MakeTree<double>(parent, 43), 1e-13, "in turn");
    EXPECT_EQ(method, "hines (one tree split over 2 devices)");
  }
}

TEST(PlacedBackend, ASplitSaysItsInputsWereCheckedOnlyWhereEveryPartsWere) {
  PlacementOptions options;
  options.split_system_unknowns = 1000;
  options.split_tree_nodes = 1000;
  const One<double> o = MakeOne<double>(20000, Rows::kDominant, 44);
  const OneTree<double> t = MakeTree<double>(TreeParents(Shape::kRandom, 20000, 45), 46);
  for (bool both : {false, true}) {
    std::vector<FakeDevice*> dev;
    auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
    dev[0]->checks_inputs = true;
    dev[1]->checks_inputs = both;
    std::vector<double> x(20000);
    SystemStatus st;
    auto tri = be->Solve(o.P(), TridiagonalMethod::kAuto, {x.data(), &st}, {});
    ASSERT_TRUE(tri.ok()) << tri.status();
    EXPECT_NE(tri->method.find("split over 2"), std::string::npos) << tri->method;
    EXPECT_EQ(tri->inputs_checked, both) << tri->method;
    // A tree's parts are prepared on their devices, which scans no coefficient: never.
    auto tree = be->Solve(t.P(), TreeMethod::kAuto, TreeOutput<double>{x.data(), &st}, {});
    ASSERT_TRUE(tree.ok()) << tree.status();
    EXPECT_NE(tree->method.find("split over 2"), std::string::npos) << tree->method;
    EXPECT_FALSE(tree->inputs_checked) << tree->method;
  }
}

TEST(PlacedBackend, OneTreeTooLargeForAnyDeviceIsSplitBySubtrees) {
  PlacementOptions never;
  never.split_system_unknowns = 0;  // by memory only
  for (Shape shape : {Shape::kChain, Shape::kRandom}) {
    // 100,000 nodes: 12.8 MB on a device in float64 (the arrays, x, the cable plan and the
    // solver's scratch, as the placement counts them), 8.5 MB in float32.
    const auto parent = TreeParents(shape, 100000, 17);
    const OneTree<double> o = MakeTree<double>(parent, 18);
    const OneTree<float> f = MakeTree<float>(parent, 19);
    for (const auto& rooms : std::vector<std::vector<int64_t>>{
             {8 * kMiB, 6 * kMiB}, {6 * kMiB, 6 * kMiB, 9 * kMiB / 2}}) {
      const std::string what = std::string(ShapeName(shape)) + " over " +
                               std::to_string(rooms.size());
      std::vector<FakeDevice*> dev;
      auto be = Placed(rooms, &dev, never);
      const std::string method = ExpectTreeLikeReference(*be, o, 1e-13, what + " float64");
      EXPECT_NE(method.find("one tree split over " + std::to_string(rooms.size())),
                std::string::npos)
          << what << ": " << method;
      for (FakeDevice* d : dev) {
        EXPECT_EQ(d->prepared, 1) << what;
        EXPECT_GE(d->entered(), 2) << what;
        for (int64_t b : d->batches()) EXPECT_EQ(b, 1) << what;
      }
      std::vector<FakeDevice*> dev32;
      std::vector<int64_t> rooms32;
      for (int64_t r : rooms) rooms32.push_back(r * 2 / 3);
      auto be32 = Placed(rooms32, &dev32, never);
      const std::string m32 = ExpectTreeLikeReference(*be32, f, 1e-5, what + " float32");
      EXPECT_NE(m32.find("one tree split over"), std::string::npos) << what << ": " << m32;
    }
  }
  {  // not even together: one device takes it whole (and says what the backend says)
    std::vector<FakeDevice*> dev;
    auto be = Placed({kMiB, kMiB}, &dev, never);
    const OneTree<double> o = MakeTree<double>(TreeParents(Shape::kChain, 100000, 20), 21);
    EXPECT_EQ(ExpectTreeLikeReference(*be, o, 1e-13, "fits none"), "hines");
    EXPECT_EQ(dev[0]->entered() + dev[1]->entered(), 1);
  }
}

TEST(PlacedBackend, ATreeSplitWithASingularPartIsSolvedAnotherWayNotCalledSingular) {
  // A chain of zero diagonals with unit couplings, its last node's diagonal 1: the Hines sweep
  // meets pivots 1, -1, 1, ... (nonsingular, well conditioned), but the part that keeps the
  // root ends on a node of zero diagonal whose child went to the other part: singular on its
  // own. The tree is solved whole -- on a device where one holds it, else on the host.
  for (bool single : {false, true}) {
    OneTree<double> o = MakeTree<double>(TreeParents(Shape::kChain, 2000, 22), 23);
    for (size_t i = 0; i < o.parent.size(); ++i) {
      o.lower[i] = o.upper[i] = i > 0 ? 1 : 0;
      o.diag[i] = i + 1 == o.parent.size() ? 1 : 0;
    }
    OneTree<float> f{o.parent, {}, {}, {}, {}};
    for (size_t i = 0; i < o.parent.size(); ++i) {
      f.lower.push_back(float(o.lower[i]));
      f.upper.push_back(float(o.upper[i]));
      f.diag.push_back(float(o.diag[i]));
      f.rhs.push_back(float(o.rhs[i]));
    }
    auto check = [&](Backend& be, const std::string& what) {
      return single ? ExpectTreeLikeReference(be, f, 1e-4, what + " float32")
                    : ExpectTreeLikeReference(be, o, 1e-12, what + " float64");
    };
    PlacementOptions options;
    options.split_system_unknowns = 1000;
    options.split_tree_nodes = 1000;
  options.split_tree_nodes = 1000;
    {
      std::vector<FakeDevice*> dev;
      auto be = Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev, options);
      const std::string method = check(*be, "fits one");
      EXPECT_NE(method.find("hines (not split: part 0 (1000 nodes) is singular on its own)"),
                std::string::npos)
          << method;
    }
    {
      // 2,000 nodes: 256 kB on a device in float64 (170 kB in float32); a part of 1,001
      // nodes fits.
      std::vector<FakeDevice*> dev;
      const int64_t room = single ? 100000 : 150000;
      auto be = Placed({room, room}, &dev, options);
      const std::string method = check(*be, "fits none");
      EXPECT_NE(method.find("hines on the host (not split: part 0"), std::string::npos)
          << method;
    }
  }
}

}  // namespace
}  // namespace trisolve
