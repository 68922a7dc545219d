// Stand-in devices for the multi-device backend's placement (MakePlacedBackend) and the
// server's admission over its workers: each the CPU reference behind a memory to spare it
// reports, its calls counted and, on demand, held. No GPU.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trisolve/backend.h"

namespace trisolve::testing {

// A backend that solves every call through the CPU reference: the base of stand-ins that
// change one call and pass the rest on (`using CpuPassThrough::Solve;` keeps the others seen).
class CpuPassThrough : public Backend {
 public:
  CpuPassThrough() : cpu_(MakeCpuBackend(1)) {}
  BackendInfo Info() const override { return cpu_->Info(); }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p, TridiagonalMethod m,
                                  TridiagonalOutput<double> out, const SolveControl& c) override {
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p, TridiagonalMethod m,
                                  TridiagonalOutput<float> out, const SolveControl& c) override {
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                  TreeOutput<double> out, const SolveControl& c) override {
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m, TreeOutput<float> out,
                                  const SolveControl& c) override {
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& c) override {
    return cpu_->Solve(p, m, o, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& c) override {
    return cpu_->Solve(p, m, o, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                  DenseOutput<double> out, const SolveControl& c) override {
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                  DenseOutput<float> out, const SolveControl& c) override {
    return cpu_->Solve(p, m, out, c);
  }

 protected:
  std::unique_ptr<Backend> cpu_;
};

// A stand-in device: the CPU reference, a memory to spare it reports through Info(), the
// batches of the calls it took, and a gate that holds its calls while closed.
class FakeDevice final : public Backend {
 public:
  explicit FakeDevice(int64_t room) : room_(room), cpu_(MakeCpuBackend(1)) {}

  BackendInfo Info() const override {
    BackendInfo info;
    info.name = "fake";
    info.threads = 1;
    DeviceInfo d;
    d.name = "fake";
    d.total_memory_bytes = d.free_memory_bytes = room_;
    info.devices.push_back(d);
    MemoryPoolInfo device, pinned;
    device.name = "device";
    device.cap_bytes = room_;
    pinned.name = "pinned-host";
    info.pools = {device, pinned};
    return info;
  }

  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p, TridiagonalMethod m,
                                  TridiagonalOutput<double> out, const SolveControl& c) override {
    Enter(p.batch);
    return Checked(cpu_->Solve(p, m, out, c));
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p, TridiagonalMethod m,
                                  TridiagonalOutput<float> out, const SolveControl& c) override {
    Enter(p.batch);
    return Checked(cpu_->Solve(p, m, out, c));
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                  TreeOutput<double> out, const SolveControl& c) override {
    Enter(p.batch, p.n);
    return Checked(cpu_->Solve(p, m, out, c));
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m, TreeOutput<float> out,
                                  const SolveControl& c) override {
    Enter(p.batch, p.n);
    return Checked(cpu_->Solve(p, m, out, c));
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& c) override {
    Enter(1);
    return cpu_->Solve(p, m, o, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& c) override {
    Enter(1);
    return cpu_->Solve(p, m, o, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                  DenseOutput<double> out, const SolveControl& c) override {
    Enter(p.batch);
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                  DenseOutput<float> out, const SolveControl& c) override {
    Enter(p.batch);
    return cpu_->Solve(p, m, out, c);
  }

  // Its pool's figure for a tridiagonal call: tri_arrays arrays of the call's size.
  int64_t TridiagonalDeviceBytes(int64_t n, int64_t batch, Layout, int elem_bytes,
                                 TridiagonalMethod) const override {
    return tri_arrays * n * batch * elem_bytes;
  }
  int64_t tri_arrays = 5;

  // A system it holds (as a device backend's would be): only it solves it.
  class Held final : public PreparedSystem {
   public:
    Held(const SystemSpec& spec, const Backend* holder) : PreparedSystem(spec), holder_(holder) {}
    const Backend* holder() const override { return holder_; }

   private:
    const Backend* holder_;
  };
  absl::StatusOr<std::unique_ptr<PreparedSystem>> Prepare(const SystemSpec& spec) override {
    ++prepared;
    return std::unique_ptr<PreparedSystem>(new Held(spec, this));
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<double> rhs, double* x,
                                          SystemStatus* status, const SolveControl& c) override {
    if (system.holder() != nullptr && system.holder() != this)
      return absl::FailedPreconditionError("not mine");
    Enter(rhs.k, system.spec().family == Family::kTree ? system.spec().n : -1);
    return Checked(SolveThroughBackend(*cpu_, system, rhs, x, status, c));
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs, float* x,
                                          SystemStatus* status, const SolveControl& c) override {
    if (system.holder() != nullptr && system.holder() != this)
      return absl::FailedPreconditionError("not mine");
    Enter(rhs.k, system.spec().family == Family::kTree ? system.spec().n : -1);
    return Checked(SolveThroughBackend(*cpu_, system, rhs, x, status, c));
  }

  void Hold(bool closed) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = closed;
    cv_.notify_all();
  }
  int entered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return int(batches_.size());
  }
  std::vector<int64_t> batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  // The trees' sizes (nodes) of its tree calls.
  std::vector<int64_t> tree_sizes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tree_sizes_;
  }
  // Waits (up to 10 s) until `calls` calls have entered.
  bool WaitEntered(int calls) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10),
                        [&] { return int(batches_.size()) >= calls; });
  }
  std::atomic<int> prepared{0};
  // How long each call takes past its entry (microseconds), as a device's work would; its
  // answers then say a quarter of it went to copies in, half to kernels, a quarter to copies out.
  std::atomic<int> work_us{0};
  // Says it checked the inputs it read (SolveInfo::inputs_checked), as a CUDA device's scan.
  std::atomic<bool> checks_inputs{false};

 private:
  absl::StatusOr<SolveInfo> Checked(absl::StatusOr<SolveInfo> r) const {
    if (r.ok() && checks_inputs.load()) r->inputs_checked = true;
    if (const int us = work_us.load(); r.ok() && us > 0) {  // its work, as a device accounts it
      r->h2d_us = 0.25 * us;
      r->kernel_us = 0.5 * us;
      r->d2h_us = 0.25 * us;
    }
    return r;
  }
  void Enter(int64_t batch, int64_t tree_nodes = -1) {
    std::unique_lock<std::mutex> lock(mu_);
    batches_.push_back(batch);
    if (tree_nodes >= 0) tree_sizes_.push_back(tree_nodes);
    cv_.notify_all();
    // (Held 10 s at most: a call placed on a held device then fails the test, not hangs it.)
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !closed_; });
    lock.unlock();
    if (const int us = work_us.load(); us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  const int64_t room_;
  std::unique_ptr<Backend> cpu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<int64_t> batches_, tree_sizes_;
};

// The placed backend over stand-ins of the given rooms; `dev` keeps pointers to them.
inline std::unique_ptr<Backend> Placed(const std::vector<int64_t>& rooms,
                                       std::vector<FakeDevice*>* dev,
                                       const PlacementOptions& options = {}) {
  std::vector<std::unique_ptr<Backend>> workers;
  std::vector<std::string> tags;
  for (size_t i = 0; i < rooms.size(); ++i) {
    auto f = std::make_unique<FakeDevice>(rooms[i]);
    dev->push_back(f.get());
    workers.push_back(std::move(f));
    tags.push_back(std::string(1, char('a' + i)));
  }
  return MakePlacedBackend(std::move(workers), std::move(tags), options);
}

}  // namespace trisolve::testing
