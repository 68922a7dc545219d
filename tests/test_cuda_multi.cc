// The multi-device CUDA backend (--devices) against the CPU reference, for every family, over
// the devices present ("all"), device 0 listed twice ("0,0": two workers on one GPU, which
// exercises the placement on a one-GPU machine) and two devices ("0,1"). Persistent systems stay
// on the worker that prepared them under solves from several threads; concurrent calls spread
// over the workers; a call that does not fit one worker's memory goes to another; one system
// or tree too large for a worker (or large, under auto) is split over them. Skips, saying so,
// without a GPU, and the two-device cases with one.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "runtime/host_registration.h"
#include "gtest/gtest.h"
#include "trisolve/backend.h"
#include "trisolve/examples.h"

namespace trisolve {
namespace {

Backend& Cpu() {
  static std::unique_ptr<Backend> cpu = MakeCpuBackend(2);
  return *cpu;
}

// Relative max-norm distance of two answers; infinite where one is not finite.
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

// Diagonally dominant tridiagonal systems: a, b, c, d of batch * n values.
template <typename T>
struct Tri {
  int64_t batch, n;
  Layout layout;
  std::vector<T> a, b, c, d;
  TridiagonalProblem<T> P() const {
    return {batch, n, layout, a.data(), b.data(), c.data(), d.data()};
  }
};
template <typename T>
Tri<T> MakeTri(int64_t batch, int64_t n, Layout layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Tri<T> t{batch, n, layout, {}, {}, {}, {}};
  for (int64_t i = 0; i < batch * n; ++i) {
    t.a.push_back(T(u(rng)));
    t.c.push_back(T(u(rng)));
    t.b.push_back(T(3 + u(rng)));
    t.d.push_back(T(u(rng)));
  }
  return t;
}

// Cells of one random morphology (parent below each node), diagonally dominant.
struct TreeSys {
  int64_t batch, n;
  std::vector<int32_t> parent;
  std::vector<double> lower, upper, diag, rhs;
  TreeProblem<double> P() const {
    TreeProblem<double> p;
    p.batch = batch;
    p.n = n;
    p.parent = parent.data();
    p.lower = lower.data();
    p.upper = upper.data();
    p.diag = diag.data();
    p.rhs = rhs.data();
    return p;
  }
};
TreeSys MakeTree(int64_t batch, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  TreeSys t{batch, n, {}, {}, {}, {}, {}};
  t.parent.push_back(-1);
  for (int64_t i = 1; i < n; ++i)
    t.parent.push_back(u(rng) < 0.7
                           ? int32_t(i - 1)
                           : int32_t(std::uniform_int_distribution<int64_t>(0, i - 1)(rng)));
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<double> sum(size_t(n), 0.0);
    std::vector<double> lo(static_cast<size_t>(n)), up(static_cast<size_t>(n));
    for (int64_t i = 1; i < n; ++i) {
      lo[size_t(i)] = u(rng);
      up[size_t(i)] = u(rng);
      sum[size_t(i)] += std::abs(lo[size_t(i)]);
      sum[size_t(t.parent[size_t(i)])] += std::abs(up[size_t(i)]);
    }
    for (int64_t i = 0; i < n; ++i) {
      t.lower.push_back(lo[size_t(i)]);
      t.upper.push_back(up[size_t(i)]);
      t.diag.push_back(sum[size_t(i)] + 1 + std::abs(u(rng)));
      t.rhs.push_back(u(rng));
    }
  }
  return t;
}

std::vector<int64_t> JobsByWorker(const Backend& b) {
  std::vector<int64_t> jobs;
  for (const DeviceInfo& d : b.Info().devices) jobs.push_back(d.jobs);
  return jobs;
}
std::vector<int64_t> Minus(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}

class MultiDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    const std::string& which = GetParam();
    if (which == "all") {
      for (int d = 0; d < CudaDeviceCount(); ++d) devices_.push_back(d);
    } else if (which == "0,0") {
      devices_ = {0, 0};
    } else {
      REQUIRE_GPUS(2);
      devices_ = {0, 1};
    }
    backend_ = Make();
    ASSERT_NE(backend_, nullptr);
  }
  std::unique_ptr<Backend> Make(int64_t device_pool_cap_bytes = 0,
                                const PlacementOptions& placement = {}) {
    CudaOptions o;
    o.host_below_unknowns = 0;  // the kernels, however small the test's systems
    o.device_pool_cap_bytes = device_pool_cap_bytes;
    auto b = MakeMultiDeviceCudaBackend(devices_, o, placement);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  }
  size_t workers() const { return devices_.size(); }

  std::vector<int> devices_;
  std::unique_ptr<Backend> backend_;
};

TEST_P(MultiDevice, InfoListsEveryWorkerAndItsPools) {
  const BackendInfo info = backend_->Info();
  EXPECT_EQ(info.name, "cuda");
  ASSERT_EQ(info.devices.size(), workers());
  ASSERT_EQ(info.pools.size(), 2 * workers());
  for (size_t w = 0; w < workers(); ++w) {
    const DeviceInfo& d = info.devices[w];
    EXPECT_EQ(d.ordinal, devices_[w]);
    EXPECT_EQ(d.jobs, 0);
    EXPECT_EQ(d.jobs_in_flight, 0);
    EXPECT_GT(d.total_memory_bytes, 0);
    EXPECT_LE(d.free_memory_bytes, d.total_memory_bytes);
    const bool second = std::count(devices_.begin(), devices_.begin() + long(w), devices_[w]) > 0;
    const std::string tag = std::to_string(devices_[w]) + (second ? "/2" : "");
    EXPECT_EQ(info.pools[2 * w].name, "device:" + tag);
    EXPECT_EQ(info.pools[2 * w + 1].name, "pinned-host:" + tag);
  }
  // Two workers on one device split its pool's cap.
  if (devices_ == std::vector<int>{0, 0}) {
    EXPECT_LE(info.pools[0].cap_bytes + info.pools[2].cap_bytes,
              int64_t(double(info.devices[0].total_memory_bytes) * 0.81));
  }
}

TEST_P(MultiDevice, EveryFamilyEqualsTheCpuReferenceOnEveryWorker) {
  const auto before = JobsByWorker(*backend_);
  const int rounds = 2 * int(workers());
  int calls = 0;
  for (int r = 0; r < rounds; ++r) {
    {
      const auto t = MakeTri<double>(64, 1000, Layout::kFlat, 10 + r);
      std::vector<double> x(t.a.size()), want(t.a.size());
      std::vector<SystemStatus> st(64), wst(64);
      auto got = backend_->Solve(t.P(), TridiagonalMethod::kAuto, {x.data(), st.data()}, {});
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(Cpu().Solve(t.P(), TridiagonalMethod::kAuto, {want.data(), wst.data()}, {}).ok());
      EXPECT_EQ(st, wst);
      EXPECT_LE(Distance(x, want), 1e-12) << "tridiagonal round " << r;
      ++calls;
    }
    {
      const auto t = MakeTri<float>(128, 300, Layout::kInterleaved, 20 + r);
      std::vector<float> x(t.a.size()), want(t.a.size());
      std::vector<SystemStatus> st(128), wst(128);
      auto got = backend_->Solve(t.P(), TridiagonalMethod::kAuto, {x.data(), st.data()}, {});
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(Cpu().Solve(t.P(), TridiagonalMethod::kAuto, {want.data(), wst.data()}, {}).ok());
      EXPECT_EQ(st, wst);
      EXPECT_LE(Distance(x, want), 1e-4) << "tridiagonal float32 round " << r;
      ++calls;
    }
    {
      const TreeSys t = MakeTree(8, 600, 30 + r);
      std::vector<double> x(t.rhs.size()), want(t.rhs.size());
      std::vector<SystemStatus> st(8), wst(8);
      auto got =
          backend_->Solve(t.P(), TreeMethod::kAuto, TreeOutput<double>{x.data(), st.data()}, {});
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(
          Cpu()
              .Solve(t.P(), TreeMethod::kAuto, TreeOutput<double>{want.data(), wst.data()}, {})
              .ok());
      EXPECT_EQ(st, wst);
      EXPECT_LE(Distance(x, want), 1e-11) << "tree round " << r;
      ++calls;
    }
    {
      const int64_t N = 24, M = 24;
      auto ex = examples::ThesisExperiment2(N, M);
      auto c = [&](const char* k) { return ex.at(k).as<double>(); };
      const BlockTridiagonalProblem<double> p{N,       M,       c("aC"), c("cC"), c("bC"),
                                              c("cA"), c("cB"), c("f"),  nullptr};
      const BlockOptions o{16, 0, true};
      std::vector<double> y(size_t(N * M)), want(size_t(N * M));
      SystemStatus st, wst;
      auto got =
          backend_->Solve(p, BlockMethod::kRedBlack, o, BlockOutput<double>{y.data(), &st}, {});
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(
          Cpu()
              .Solve(p, BlockMethod::kRedBlack, o, BlockOutput<double>{want.data(), &wst}, {})
              .ok());
      EXPECT_EQ(st, wst);
      EXPECT_LE(Distance(y, want), 1e-12) << "block round " << r;
      ++calls;
    }
    {
      auto ex = examples::RandomDense(16, 48, false, 40 + r);
      const DenseProblem<double> p{16, 48, ex.at("a").as<double>(), ex.at("b").as<double>()};
      std::vector<double> x(16 * 48), want(16 * 48);
      std::vector<SystemStatus> st(16), wst(16);
      auto got =
          backend_->Solve(p, DenseMethod::kAuto, DenseOutput<double>{x.data(), st.data()}, {});
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(
          Cpu().Solve(p, DenseMethod::kLu, DenseOutput<double>{want.data(), wst.data()}, {}).ok());
      EXPECT_EQ(st, wst);
      EXPECT_LE(Distance(x, want), 1e-10) << "dense round " << r;
      ++calls;
    }
  }
  // One call after another, every queue empty: they take the workers in turn.
  const auto done = Minus(JobsByWorker(*backend_), before);
  int64_t total = 0;
  for (size_t w = 0; w < workers(); ++w) {
    EXPECT_GT(done[w], 0) << "worker " << w << " solved nothing";
    total += done[w];
  }
  EXPECT_EQ(total, calls);
}

TEST_P(MultiDevice, ConcurrentCallsSpreadOverTheWorkers) {
  constexpr int kThreads = 8, kCalls = 12;
  const auto t = MakeTri<double>(512, 512, Layout::kFlat, 5);
  std::vector<double> want(t.a.size());
  std::vector<SystemStatus> wst(512);
  ASSERT_TRUE(Cpu().Solve(t.P(), TridiagonalMethod::kAuto, {want.data(), wst.data()}, {}).ok());
  const auto before = JobsByWorker(*backend_);
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&] {
      std::vector<double> x(t.a.size());
      std::vector<SystemStatus> st(512);
      for (int q = 0; q < kCalls; ++q) {
        auto got = backend_->Solve(t.P(), TridiagonalMethod::kAuto, {x.data(), st.data()}, {});
        if (!got.ok())
          ++failed;
        else if (!(Distance(x, want) <= 1e-12) || st != wst)
          ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(wrong, 0);
  const auto done = Minus(JobsByWorker(*backend_), before);
  int64_t total = 0;
  for (size_t w = 0; w < workers(); ++w) {
    EXPECT_GT(done[w], 0) << "worker " << w << " solved nothing";
    total += done[w];
  }
  EXPECT_EQ(total, kThreads * kCalls);
  for (const DeviceInfo& d : backend_->Info().devices) EXPECT_EQ(d.jobs_in_flight, 0);
}

// Memory a client registers is page-locked once, through a CUDA context of the process's own
// (runtime/host_registration.h: pinning through a worker's context stalls that worker's
// copies), portably: every worker's device sees it registered, and solves read it there on
// each worker; unpinned, no device sees it registered any more.
TEST_P(MultiDevice, RegisteredMemoryIsPinnedForEveryWorker) {
  auto t = MakeTri<double>(64, 4096, Layout::kFlat, 11);
  std::vector<double> want(t.a.size());
  std::vector<SystemStatus> wst(64);
  ASSERT_TRUE(Cpu().Solve(t.P(), TridiagonalMethod::kAuto, {want.data(), wst.data()}, {}).ok());
  std::vector<double> x(t.a.size());
  auto registered = [&](const void* p, int device) {
    cudaSetDevice(device);
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    (void)cudaGetLastError();
    return e == cudaSuccess && a.type == cudaMemoryTypeHost;
  };
  std::vector<std::vector<double>*> arrays = {&t.a, &t.b, &t.c, &t.d, &x};
  for (auto* v : arrays) {
    auto pinned = backend_->PinHostMemory(v->data(), int64_t(v->size() * sizeof(double)));
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    EXPECT_TRUE(*pinned);
  }
  EXPECT_TRUE(cuda::HostRegistrationHasOwnContext())
      << "registered through a device's primary context (a second context was refused)";
  for (int d : devices_)
    for (auto* v : arrays) EXPECT_TRUE(registered(v->data(), d)) << "device " << d;
  // Calls one after another go round the workers: each reads the registered arrays.
  const auto before = JobsByWorker(*backend_);
  for (size_t q = 0; q < 2 * workers(); ++q) {
    std::vector<SystemStatus> st(64);
    std::fill(x.begin(), x.end(), 0.0);
    auto got = backend_->Solve(t.P(), TridiagonalMethod::kAuto, {x.data(), st.data()}, {});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LE(Distance(x, want), 1e-12) << "call " << q;
    EXPECT_EQ(st, wst);
  }
  for (int64_t j : Minus(JobsByWorker(*backend_), before)) EXPECT_GT(j, 0);
  for (auto* v : arrays) backend_->UnpinHostMemory(v->data());
  for (int d : devices_)
    for (auto* v : arrays) EXPECT_FALSE(registered(v->data(), d)) << "device " << d;
}

// Systems spread over the workers as they are made (what each holds), and every solve of one,
// from any thread, runs on the worker that holds it; updates reach its copy there.
TEST_P(MultiDevice, PersistentSystemsStayOnTheirWorker) {
  const int kSystems = 2 * int(workers()) + 1, kSteps = 16;
  const int64_t n = 20000;
  struct Held {
    Tri<double> t;
    std::unique_ptr<PreparedSystem> system;
    size_t worker = 0;
  };
  std::vector<Held> held;
  for (int s = 0; s < kSystems; ++s) {
    Held h{MakeTri<double>(1, n, Layout::kFlat, 100 + s), nullptr, 0};
    SystemSpec spec;
    spec.family = Family::kTridiagonal;
    spec.n = n;
    spec.coefficients = {h.t.a.data(), h.t.b.data(), h.t.c.data()};
    auto made = backend_->Prepare(spec);
    ASSERT_TRUE(made.ok()) << made.status();
    h.system = *std::move(made);
    // Where it is: the one worker whose count a solve moves.
    const auto before = JobsByWorker(*backend_);
    std::vector<double> x(static_cast<size_t>(n));
    SystemStatus st;
    ASSERT_TRUE(
        backend_->SolvePrepared(*h.system, RhsBlock<double>{h.t.d.data()}, x.data(), &st, {}).ok());
    const auto done = Minus(JobsByWorker(*backend_), before);
    ASSERT_EQ(std::count(done.begin(), done.end(), 1), 1);
    h.worker = size_t(std::find(done.begin(), done.end(), 1) - done.begin());
    EXPECT_NE(h.system->prepared().find("CUDA device " + std::to_string(devices_[h.worker])),
              std::string::npos)
        << h.system->prepared();
    held.push_back(std::move(h));
  }
  std::vector<int64_t> expected(workers(), 0);
  for (const Held& h : held) expected[h.worker] += kSteps;
  for (size_t w = 0; w < workers(); ++w) EXPECT_GT(expected[w], 0) << "no system on worker " << w;

  const auto before = JobsByWorker(*backend_);
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (Held& h : held)
    threads.emplace_back([this, &h, &wrong, &failed] {
      constexpr int64_t kRhs = 3;
      std::mt19937_64 rng(h.worker * 7 + 1);
      std::uniform_real_distribution<double> u(-1, 1);
      std::vector<double> rhs(size_t(kRhs * h.t.n)), x(rhs.size()), want(rhs.size());
      std::vector<SystemStatus> st(kRhs), wst(kRhs);
      for (int q = 0; q < kSteps; ++q) {
        if (q == kSteps / 2) {  // a new diagonal, half-way
          for (double& v : h.t.b) v += 0.5;
          if (!h.system->Update(1, h.t.b.data()).ok()) ++failed;
        }
        for (double& v : rhs) v = u(rng);
        auto solved = backend_->SolvePrepared(*h.system, RhsBlock<double>{rhs.data(), kRhs},
                                              x.data(), st.data(), {});
        if (!solved.ok()) {
          ++failed;
          continue;
        }
        const Tri<double> k{kRhs, h.t.n, Layout::kFlat, {}, {}, {}, rhs};
        Tri<double> rep = k;
        for (int64_t j = 0; j < kRhs; ++j) {
          rep.a.insert(rep.a.end(), h.t.a.begin(), h.t.a.end());
          rep.b.insert(rep.b.end(), h.t.b.begin(), h.t.b.end());
          rep.c.insert(rep.c.end(), h.t.c.begin(), h.t.c.end());
        }
        if (!Cpu().Solve(rep.P(), TridiagonalMethod::kAuto, {want.data(), wst.data()}, {}).ok() ||
            !(Distance(x, want) <= 1e-12) || st != wst)
          ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(Minus(JobsByWorker(*backend_), before), expected);
}

// A call too large for the memory one worker has left goes to another, whatever the turn.
TEST_P(MultiDevice, ACallGoesWhereItFits) {
  if (workers() < 2) GTEST_SKIP() << "one worker: nowhere else to go";
  // 32 MiB of pool a worker (two on device 0 split their device's cap).
  const int64_t per_worker = int64_t{32} << 20;
  auto backend = Make(per_worker * std::count(devices_.begin(), devices_.end(), devices_[0]));
  ASSERT_NE(backend, nullptr);
  // A system of 3 x 1M float64 coefficients (24 MiB) takes most of one worker's pool.
  const int64_t big = 1 << 20;
  const auto t = MakeTri<double>(1, big, Layout::kFlat, 3);
  SystemSpec spec;
  spec.family = Family::kTridiagonal;
  spec.n = big;
  spec.coefficients = {t.a.data(), t.b.data(), t.c.data()};
  auto system = backend->Prepare(spec);
  ASSERT_TRUE(system.ok()) << system.status();
  const BackendInfo info = backend->Info();
  size_t holder = workers();
  for (size_t w = 0; w < workers(); ++w)
    if (info.pools[2 * w].in_use_bytes >= (int64_t{24} << 20)) holder = w;
  ASSERT_LT(holder, workers()) << "the system is in no worker's pool";
  // One-shot solves of 250,000 unknowns (10 MB on the device) fit only where it is not.
  const auto u = MakeTri<double>(1, 250000, Layout::kFlat, 4);
  std::vector<double> x(u.a.size()), want(u.a.size());
  SystemStatus st, wst;
  ASSERT_TRUE(Cpu().Solve(u.P(), TridiagonalMethod::kAuto, {want.data(), &wst}, {}).ok());
  const auto before = JobsByWorker(*backend);
  for (int q = 0; q < 2 * int(workers()); ++q) {
    auto got = backend->Solve(u.P(), TridiagonalMethod::kAuto, {x.data(), &st}, {});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LE(Distance(x, want), 1e-12);
  }
  EXPECT_EQ(Minus(JobsByWorker(*backend), before)[holder], 0)
      << "a call went to the worker without room for it";
}

// A batch too large for any one worker's memory but not for the workers' together is split by
// systems, its parts solved at once, one a worker; a worker alone cannot solve it.
TEST_P(MultiDevice, ABatchLargerThanOneWorkerIsSplitBySystems) {
  if (workers() < 2) GTEST_SKIP() << "one worker: nothing to split over";
  const long same_device = long(std::count(devices_.begin(), devices_.end(), devices_[0]));
  // 64 x 16384 unknowns: 40 MB of arrays and x, and what each layout's auto adds (Thomas' copy,
  // the pivoting scratch; the flat layout's pivoting-split plan), in the pool's size classes.
  // Each worker gets room between what half the batch and the whole batch take, as the
  // backend's own estimate counts them: the whole fits no worker, a half fits each.
  for (Layout layout : {Layout::kFlat, Layout::kInterleaved}) {
    const char* name = layout == Layout::kFlat ? "flat" : "interleaved";
    const int64_t whole =
        backend_->TridiagonalDeviceBytes(16384, 64, layout, 8, TridiagonalMethod::kAuto);
    const int64_t half =
        backend_->TridiagonalDeviceBytes(16384, 32, layout, 8, TridiagonalMethod::kAuto);
    ASSERT_LT(half, whole) << name;
    const int64_t per_worker = (half + whole) / 2;
    auto backend = Make(per_worker * same_device);
    ASSERT_NE(backend, nullptr);
    const auto t = MakeTri<double>(64, 16384, layout, 11);
    std::vector<double> x(t.a.size()), want(t.a.size());
    std::vector<SystemStatus> st(64), wst(64);
    ASSERT_TRUE(Cpu().Solve(t.P(), TridiagonalMethod::kAuto, {want.data(), wst.data()}, {}).ok());
    const auto before = JobsByWorker(*backend);
    auto got = backend->Solve(t.P(), TridiagonalMethod::kAuto, {x.data(), st.data()}, {});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NE(got->method.find("(split over"), std::string::npos)
        << name << ": " << got->method << " (whole " << whole << " B, half " << half
        << " B, a worker's room " << per_worker << " B)";
    EXPECT_EQ(st, wst);
    EXPECT_LE(Distance(x, want), 1e-12) << name;
    const auto done = Minus(JobsByWorker(*backend), before);
    EXPECT_EQ(std::count(done.begin(), done.end(), 1), long(workers())) << "a part a worker";
  }
  const int64_t per_worker = int64_t{64} << 20;
  auto backend = Make(per_worker * same_device);
  ASSERT_NE(backend, nullptr);
  {  // 4000 cells of 600 nodes: 96 MB
    const TreeSys t = MakeTree(4000, 600, 12);
    std::vector<double> x(t.rhs.size()), want(t.rhs.size());
    std::vector<SystemStatus> st(4000), wst(4000);
    ASSERT_TRUE(
        Cpu()
            .Solve(t.P(), TreeMethod::kAuto, TreeOutput<double>{want.data(), wst.data()}, {})
            .ok());
    auto got =
        backend->Solve(t.P(), TreeMethod::kAuto, TreeOutput<double>{x.data(), st.data()}, {});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NE(got->method.find("(split over"), std::string::npos) << got->method;
    EXPECT_EQ(st, wst);
    EXPECT_LE(Distance(x, want), 1e-11);
  }
}

// One system over the workers by rows (kernels/cpu/split_system.h): against partial pivoting on
// the CPU, by backward error (the rounding level) and forward error.
template <typename T>
void ExpectOneSystemLikeReference(Backend& backend, const Tri<T>& t, size_t parts) {
  std::vector<T> x(t.a.size(), T(NAN)), want(t.a.size());
  SystemStatus st = SystemStatus::kSingular, wst;
  ASSERT_TRUE(Cpu().Solve(t.P(), TridiagonalMethod::kPivoting, {want.data(), &wst}, {}).ok());
  auto got = backend.Solve(t.P(), TridiagonalMethod::kAuto, {x.data(), &st}, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NE(got->method.find("(one system split over " + std::to_string(parts) + " devices)"),
            std::string::npos)
      << got->method;
  EXPECT_EQ(st, SystemStatus::kOk);
  const double eps = std::numeric_limits<T>::epsilon();
  EXPECT_LE(TridiagonalBackwardError(t.P(), x.data(), &st), 8 * eps) << got->method;
  EXPECT_LE(Distance(x, want), 100 * eps) << got->method;
}

TEST_P(MultiDevice, OneSystemLargerThanOneWorkerIsSplitByRows) {
  if (workers() < 2) GTEST_SKIP() << "one worker: nothing to split over";
  const int64_t per_worker = int64_t{48} << 20;
  auto backend = Make(per_worker * std::count(devices_.begin(), devices_.end(), devices_[0]));
  ASSERT_NE(backend, nullptr);
  // 2^20 + 5 unknowns: 40 MB on the device with x, with the solver's scratch (and
  // pivoting-split's) over one worker's 48 MiB; half of it fits one.
  for (Layout layout : {Layout::kFlat, Layout::kInterleaved})  // (one system: the same array)
    ExpectOneSystemLikeReference(*backend, MakeTri<double>(1, (1 << 20) + 5, layout, 21),
                                 workers());
  ExpectOneSystemLikeReference(*backend, MakeTri<float>(1, (1 << 21) + 3, Layout::kFlat, 22),
                               workers());
}

TEST_P(MultiDevice, OneLargeSystemIsSplitByRowsOverIdleWorkers) {
  if (workers() < 2) GTEST_SKIP() << "one worker: nothing to split over";
  // auto from 2^22 unknowns (PlacementOptions' default), every worker idle.
  ExpectOneSystemLikeReference(*backend_, MakeTri<double>(1, (1 << 22) + 16 * 7, Layout::kFlat, 23),
                               workers());
  ExpectOneSystemLikeReference(*backend_, MakeTri<float>(1, 1 << 23, Layout::kFlat, 24),
                               workers());
}

// One tree over the workers by subtrees (kernels/cpu/tree_split.h): against the Hines sweep on
// the CPU, by backward error (the rounding level) and forward error. shape: 0 a random tree
// with long cables (MakeTree's), 1 a chain, 2 a star.
template <typename T>
void ExpectOneTreeLikeReference(Backend& backend, int shape, int64_t n, uint64_t seed,
                                size_t parts) {
  const TreeSys made = MakeTree(1, shape == 0 ? n : 1, seed);
  std::vector<int32_t> parent = made.parent;
  if (shape != 0) {
    parent.assign(size_t(n), 0);
    parent[0] = -1;
    for (int64_t i = 1; shape == 1 && i < n; ++i) parent[size_t(i)] = int32_t(i - 1);
  }
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> off(size_t(n), 0.0);
  const size_t nn = static_cast<size_t>(n);
  std::vector<T> lower(nn, T(0)), upper(nn, T(0)), diag(nn), rhs(nn);
  for (int64_t i = 1; i < n; ++i) {
    lower[size_t(i)] = T(u(rng));
    upper[size_t(i)] = T(u(rng));
    off[size_t(i)] += std::abs(double(lower[size_t(i)]));
    off[size_t(parent[size_t(i)])] += std::abs(double(upper[size_t(i)]));
  }
  for (int64_t i = 0; i < n; ++i) {
    diag[size_t(i)] = T(off[size_t(i)] * (1.5 + 0.4 * u(rng)) + 0.5);
    rhs[size_t(i)] = T(u(rng));
  }
  TreeProblem<T> p;
  p.batch = 1;
  p.n = n;
  p.parent = parent.data();
  p.lower = lower.data();
  p.upper = upper.data();
  p.diag = diag.data();
  p.rhs = rhs.data();
  std::vector<T> x(static_cast<size_t>(n), T(NAN)), want(static_cast<size_t>(n));
  SystemStatus st = SystemStatus::kSingular, wst;
  ASSERT_TRUE(Cpu().Solve(p, TreeMethod::kHines, TreeOutput<T>{want.data(), &wst}, {}).ok());
  ASSERT_EQ(wst, SystemStatus::kOk);
  auto got = backend.Solve(p, TreeMethod::kAuto, TreeOutput<T>{x.data(), &st}, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NE(got->method.find("(one tree split over " + std::to_string(parts) + " devices)"),
            std::string::npos)
      << got->method;
  EXPECT_EQ(st, SystemStatus::kOk);
  const double eps = std::numeric_limits<T>::epsilon();
  EXPECT_LE(TreeBackwardError(p, x.data(), &st), 8 * eps) << got->method;
  EXPECT_LE(Distance(x, want), 100 * eps) << got->method;
}

TEST_P(MultiDevice, OneTreeLargerThanOneWorkerIsSplitBySubtrees) {
  if (workers() < 2) GTEST_SKIP() << "one worker: nothing to split over";
  // 800k nodes: 102 MB on the device in float64 (the arrays, x, the cable plan and scratch,
  // as the placement counts them: 128 bytes a node), over one worker's 64 MiB, a part of
  // 400k nodes 51 MB; 1.2M nodes in float32 (85 bytes a node): 102 MB, a part 51 MB. Random
  // trees of short cables: a chain's long-cable scratch (80 bytes a node) would not fit. A
  // backend a case: the plans stay in the pools.
  const int64_t per_worker = int64_t{64} << 20;
  const int64_t cap = per_worker * std::count(devices_.begin(), devices_.end(), devices_[0]);
  {
    auto backend = Make(cap);
    ASSERT_NE(backend, nullptr);
    ExpectOneTreeLikeReference<double>(*backend, 0, 800000, 31, workers());
  }
  {
    auto backend = Make(cap);
    ASSERT_NE(backend, nullptr);
    ExpectOneTreeLikeReference<float>(*backend, 0, 1200000, 32, workers());
  }
}

TEST_P(MultiDevice, OneLargeTreeIsSplitBySubtreesOverIdleWorkers) {
  if (workers() < 2) GTEST_SKIP() << "one worker: nothing to split over";
  // auto from 2^22 nodes where asked (trees are not split for speed by default), every worker
  // idle.
  PlacementOptions placement;
  placement.split_tree_nodes = 1 << 22;
  auto backend = Make(0, placement);
  ASSERT_NE(backend, nullptr);
  ExpectOneTreeLikeReference<double>(*backend, 0, (1 << 22) + 7, 35, workers());
  ExpectOneTreeLikeReference<double>(*backend, 2, 1 << 22, 36, workers());
  ExpectOneTreeLikeReference<float>(*backend, 1, 1 << 23, 37, workers());
}

INSTANTIATE_TEST_SUITE_P(Devices, MultiDevice, ::testing::Values("all", "0,0", "0,1"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), ',', '_');
                           return name == "all" ? std::string("AllPresent") : "Devices" + name;
                         });

TEST(MultiDeviceLists, EmptyAndMissingDevicesRefused) {
  if (CudaDeviceCount() == 0) {
    // Without a device the backend says so, whatever the list.
    auto none = MakeMultiDeviceCudaBackend({0});
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable) << none.status();
    GTEST_SKIP() << "no CUDA device: the lists of devices that exist are not checked";
  }
  EXPECT_EQ(MakeMultiDeviceCudaBackend({}).status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = MakeMultiDeviceCudaBackend({0, CudaDeviceCount()});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos);
  EXPECT_EQ(MakeMultiDeviceCudaBackend({-1}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A system kept on one backend's device is refused by another, never solved with a pointer
// into the wrong device's memory.
TEST(MultiDeviceLists, ASystemOfAnotherBackendIsRefused) {
  REQUIRE_GPU();
  auto multi = MakeMultiDeviceCudaBackend({0, 0});
  ASSERT_TRUE(multi.ok()) << multi.status();
  const auto t = MakeTri<double>(1, 4096, Layout::kFlat, 9);
  SystemSpec spec;
  spec.family = Family::kTridiagonal;
  spec.n = 4096;
  spec.coefficients = {t.a.data(), t.b.data(), t.c.data()};
  std::vector<double> x(4096);
  SystemStatus st;
  auto single = testing::Cuda()->Prepare(spec);
  ASSERT_TRUE(single.ok()) << single.status();
  auto r = (*multi)->SolvePrepared(**single, RhsBlock<double>{t.d.data()}, x.data(), &st, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  auto mine = (*multi)->Prepare(spec);
  ASSERT_TRUE(mine.ok()) << mine.status();
  r = testing::Cuda()->SolvePrepared(**mine, RhsBlock<double>{t.d.data()}, x.data(), &st, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  // Its own backend solves it.
  r = (*multi)->SolvePrepared(**mine, RhsBlock<double>{t.d.data()}, x.data(), &st, {});
  EXPECT_TRUE(r.ok()) << r.status();
}

}  // namespace
}  // namespace trisolve
