// The server's admission over a backend of several workers (Backend::WorkerCount: the
// multi-device backend, one worker a device): a persistent system's large solves first take a
// slot of their device's share of --max-concurrent-jobs, so the solves of the systems one device
// holds never take the slots another device's solves could use. Over two stand-in devices (the
// CPU reference, calls held on demand): runs everywhere, no GPU.
// And slots count jobs, not bytes: a large job refused for memory the jobs beside it hold
// (MemoryHeldByOthers) runs again when one of them ends; alone, its refusal is the answer.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core.h"
#include "fake_devices.h"
#include "gtest/gtest.h"
#include "translate.h"
#include "trisolve/backend.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve::server {
namespace {

constexpr int64_t kBatch = 4, kN = 8, kE = kBatch * kN;

class WorkerAdmission : public ::testing::Test {
 protected:
  // Two stand-in devices; one slot each (max_concurrent_jobs 2); every job a large one.
  WorkerAdmission() {
    auto placed = testing::Placed({int64_t{1} << 30, int64_t{1} << 30}, &dev_);
    EXPECT_EQ(placed->WorkerCount(), 2);
    CoreOptions o;
    o.max_concurrent_jobs = 2;
    o.small_job_unknowns = 0;
    core_ = std::make_unique<Core>(std::move(placed), o);
  }
  static Call MakeCall() {
    Call c("t", "Test");
    c.identity = "alice";
    return c;
  }
  std::string Create() {
    v1::CreateSystemRequest cr;
    v1::TridiagonalRequest& r = *cr.mutable_tridiagonal();
    r.set_dtype(v1::FLOAT64);
    const double value[3] = {-1, 4, -1};
    int k = 0;
    for (v1::Array* a : {r.mutable_a(), r.mutable_b(), r.mutable_c()}) {
      a->add_shape(kBatch);
      a->add_shape(kN);
      std::vector<double> v(kE, value[k++]);
      a->set_data(v.data(), v.size() * 8);
    }
    auto job = JobFromCreateSystem(cr, JobLimits());
    EXPECT_TRUE(job.ok()) << job.status();
    Call c = MakeCall();
    auto sys = core_->CreateSystem(c, *job, "", 0);
    EXPECT_TRUE(sys.ok()) << sys.status();
    return sys.ok() ? sys->handle : "";
  }
  absl::Status Solve(const std::string& handle) {
    std::vector<double> d(kE, 1.0);
    StepRequest step;
    step.handle = handle;
    step.rhs.shape = {kBatch, kN};
    step.rhs.data = d.data();
    step.rhs.bytes = kE * 8;
    Call c = MakeCall();
    auto a = core_->SolveSystem(c, step);
    if (!a.ok()) return a.status();
    for (SystemStatus s : a->result.status)
      if (s != SystemStatus::kOk) return absl::InternalError("a system not OK");
    return absl::OkStatus();
  }
  // The device a system's solves go to: the one whose call count a solve moves.
  int DeviceOf(const std::string& handle) {
    const int before[2] = {dev_[0]->entered(), dev_[1]->entered()};
    EXPECT_TRUE(Solve(handle).ok());
    for (int k = 0; k < 2; ++k)
      if (dev_[size_t(k)]->entered() > before[k]) return k;
    return -1;
  }

  std::vector<testing::FakeDevice*> dev_;
  std::unique_ptr<Core> core_;
};

TEST_F(WorkerAdmission, OneDevicesSolvesNeverHoldTheOthersSlots) {
  // Systems until two lie on one device (a) and one on the other (b).
  std::map<int, std::vector<std::string>> on;
  for (int i = 0; i < 8 && !(on[0].size() >= 2 && on[1].size() >= 1) &&
                  !(on[1].size() >= 2 && on[0].size() >= 1);
       ++i) {
    const std::string h = Create();
    on[DeviceOf(h)].push_back(h);
  }
  const int a = on[0].size() >= 2 && !on[1].empty() ? 0 : 1, b = 1 - a;
  ASSERT_GE(on[a].size(), 2u);
  ASSERT_GE(on[b].size(), 1u);

  // Device a held: its first solve runs (and waits there), its second waits for a's slot.
  const int entered = dev_[size_t(a)]->entered();
  dev_[size_t(a)]->Hold(true);
  auto first = std::async(std::launch::async, [&] { return Solve(on[a][0]); });
  ASSERT_TRUE(dev_[size_t(a)]->WaitEntered(entered + 1));
  auto second = std::async(std::launch::async, [&] { return Solve(on[a][1]); });
  for (int i = 0; i < 500 && core_->Status().jobs_queued < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(core_->Status().jobs_queued, 1);
  EXPECT_EQ(core_->Status().jobs_in_flight, 1);

  // A solve of b's system runs at once. With one pool of two slots, a's second solve held the
  // other slot, and this one waited until a's device let go (the stand-in's 10 s).
  auto other = std::async(std::launch::async, [&] { return Solve(on[b][0]); });
  ASSERT_EQ(other.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "device " << b << "'s solve waited behind device " << a << "'s";
  EXPECT_TRUE(other.get().ok());
  EXPECT_EQ(dev_[size_t(a)]->entered(), entered + 1);  // a's second still waiting

  dev_[size_t(a)]->Hold(false);
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(second.get().ok());
  EXPECT_EQ(dev_[size_t(a)]->entered(), entered + 2);
  EXPECT_EQ(core_->Status().jobs_queued, 0);
}

TEST_F(WorkerAdmission, DrainRefusesTheCallersWaitingForADevicesShare) {
  std::string h = Create();
  const int d = DeviceOf(h);
  std::string h2;
  for (int i = 0; i < 8 && h2.empty(); ++i) {
    const std::string more = Create();
    if (DeviceOf(more) == d) h2 = more;
  }
  ASSERT_FALSE(h2.empty());
  const int entered = dev_[size_t(d)]->entered();
  dev_[size_t(d)]->Hold(true);
  auto first = std::async(std::launch::async, [&] { return Solve(h); });
  ASSERT_TRUE(dev_[size_t(d)]->WaitEntered(entered + 1));
  auto waiting = std::async(std::launch::async, [&] { return Solve(h2); });
  for (int i = 0; i < 500 && core_->Status().jobs_queued < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(core_->Status().jobs_queued, 1);
  auto drained = std::async(std::launch::async, [&] {
    return core_->Drain(std::chrono::system_clock::now() + std::chrono::seconds(20));
  });
  // The waiting caller is refused at once, UNAVAILABLE; the running one finishes.
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(waiting.get().code(), absl::StatusCode::kUnavailable);
  dev_[size_t(d)]->Hold(false);
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(drained.get());
}

// A device of `room` bytes: a tridiagonal call takes 5 arrays' bytes for as long as it runs
// (held while the gate is closed) and is refused, MemoryHeldByOthers, where they do not fit.
class RoomDevice final : public testing::CpuPassThrough {
 public:
  explicit RoomDevice(int64_t room) : room_(room) {}
  BackendInfo Info() const override {
    BackendInfo info = cpu_->Info();
    info.name = "room";
    return info;
  }
  using CpuPassThrough::Solve;
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p, TridiagonalMethod m,
                                  TridiagonalOutput<double> out, const SolveControl& c) override {
    const int64_t bytes = 5 * 8 * p.batch * p.n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++calls;
      if (used_ + bytes > room_) {
        ++refused;
        cv_.notify_all();
        return MemoryHeldByOthers(absl::ResourceExhaustedError("room: memory in use"));
      }
      used_ += bytes;
      ++running;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !closed_; });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(hold_us.load()));
    auto r = cpu_->Solve(p, m, out, c);
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= bytes;
    --running;
    return r;
  }
  void Hold(bool closed) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = closed;
    cv_.notify_all();
  }
  // Waits (up to 10 s) until `n` calls run and `r` have been refused.
  bool WaitFor(int n, int r) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10),
                        [&] { return running >= n && refused >= r; });
  }
  int running = 0, refused = 0, calls = 0;  // (under mu_)
  std::atomic<int> hold_us{0};                // how long a call holds its memory at least

 private:
  const int64_t room_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int64_t used_ = 0;
};

class MemoryRetry : public ::testing::Test {
 protected:
  // Room for two jobs of kBatch x kN (5 arrays each), four slots, every job a large one.
  MemoryRetry() {
    auto b = std::make_unique<RoomDevice>(2 * 5 * 8 * kE + 8);
    dev_ = b.get();
    CoreOptions o;
    o.max_concurrent_jobs = 4;
    o.small_job_unknowns = 0;
    o.batching.max_systems = 0;
    core_ = std::make_unique<Core>(std::move(b), o);
  }
  // A unary tridiagonal job of `batch` x kN; its answer's statuses all OK, or its error.
  absl::Status SolveUnary(int64_t batch = kBatch) {
    v1::TridiagonalRequest r;
    r.set_dtype(v1::FLOAT64);
    const double value[4] = {-1, 4, -1, 1};
    int k = 0;
    for (v1::Array* a : {r.mutable_a(), r.mutable_b(), r.mutable_c(), r.mutable_d()}) {
      a->add_shape(batch);
      a->add_shape(kN);
      std::vector<double> v(size_t(batch * kN), value[k++]);
      a->set_data(v.data(), v.size() * 8);
    }
    auto job = JobFromRequest(r, JobLimits());
    if (!job.ok()) return job.status();
    Call c("t", "Test");
    c.identity = "alice";
    auto a = core_->Solve(c, *job);
    if (!a.ok()) return a.status();
    for (SystemStatus s : a->result.status)
      if (s != SystemStatus::kOk) return absl::InternalError("a system not OK");
    return absl::OkStatus();
  }
  int64_t Retries() const {
    const std::string m = core_->RenderMetrics();
    const std::string key = "\ntrisolve_memory_retries_total ";
    const size_t at = m.find(key);
    return at == std::string::npos ? -1 : std::stoll(m.substr(at + key.size()));
  }
  RoomDevice* dev_;
  std::unique_ptr<Core> core_;
};

TEST_F(MemoryRetry, JobsRefusedForOthersMemoryRunWhenItIsFree) {
  EXPECT_EQ(Retries(), 0);
  dev_->Hold(true);
  std::vector<std::future<absl::Status>> jobs;
  for (int i = 0; i < 4; ++i)
    jobs.push_back(std::async(std::launch::async, [&] { return SolveUnary(); }));
  // Two run and hold the room; the other two were refused and wait for one of them to end.
  ASSERT_TRUE(dev_->WaitFor(2, 2));
  dev_->Hold(false);
  for (auto& j : jobs) EXPECT_TRUE(j.get().ok());
  EXPECT_GE(Retries(), 2);
}

TEST_F(MemoryRetry, AJobRefusedAloneGetsItsRefusal) {
  // A job larger than the whole room: refused with nothing beside it, at once.
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status st = SolveUnary(3 * kBatch);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(Retries(), 0);
  EXPECT_TRUE(SolveUnary().ok());  // and the next job runs
}

TEST_F(MemoryRetry, AJobThatNeverFitsStopsTryingWhileOthersKeepRunning) {
  // Two callers keep solving jobs that fit, so that one of them always runs and jobs keep
  // ending; a job larger than the whole room gets its refusal after its most runs again, not
  // when they stop.
  dev_->hold_us = 3000;
  std::atomic<bool> stop{false};
  std::atomic<int> fed{0};
  auto feed = [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!stop.load() && std::chrono::steady_clock::now() < until)
      if (SolveUnary().ok()) ++fed;
  };
  std::thread a(feed), b(feed);
  while (fed.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status st = SolveUnary(3 * kBatch);
  const auto took = std::chrono::steady_clock::now() - t0;
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_LE(Retries(), 16);
}

}  // namespace
}  // namespace trisolve::server
