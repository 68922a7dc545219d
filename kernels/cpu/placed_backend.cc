// The multi-device backend's placement, over any backends, one a device (what
// MakeMultiDeviceCudaBackend builds; the tests give it stand-in workers). A call goes to the worker
// with the fewest calls in flight among those with room for it (free memory, refreshed every few
// milliseconds), the one with a GiB more to spare at equal queues, else the next in turn; a
// prepared system goes to the worker holding the fewest bytes of systems among those with room
// for it, stays where it was prepared, and its solves go there; a tridiagonal or tree
// batch too large for any one worker is split by systems over them, and one system or tree
// too large (or large enough, under auto) by rows or subtrees (split_system.h, tree_split.h).
// A worker's room is read from its Info(): its first pool's cap less what is in use, at most
// its first device's free memory plus the pool's idle buffers.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trisolve/backend.h"
#include "trisolve/reference/tree.h"
#include "trisolve/reference/tridiagonal.h"
#include "split_system.h"
#include "tree_split.h"

namespace trisolve {
namespace {

using Clock = std::chrono::steady_clock;

// Free memory is read again at most this often for the unary calls' placement (cudaMemGetInfo
// takes the driver's lock): the queue lengths, exact at every call, decide between devices with
// room; memory only decides whether a job fits and breaks ties.
constexpr auto kMemoryRefresh = std::chrono::milliseconds(10);
// Devices whose memory to spare differs by less than this count as equal for the unary calls
// (the next in turn takes the job): a few pooled buffers must not send every job to one device.
constexpr int64_t kMemoryGrain = int64_t{1} << 30;

// A part of a batch of tridiagonal or tree systems, systems [s0, s0 + count): flat, its arrays
// where they are; interleaved, gathered into arrays of their own ([n, count]) and x scattered
// back after the solve.
template <typename T>
class PartView {
 public:
  PartView(Layout layout, int64_t batch, int64_t n, int64_t s0, int64_t count)
      : layout_(layout), batch_(batch), n_(n), s0_(s0), count_(count) {}
  const T* In(const T* whole) {
    if (whole == nullptr || layout_ == Layout::kFlat) return whole ? whole + s0_ * n_ : nullptr;
    std::vector<T>& v = copies_.emplace_back(static_cast<size_t>(count_ * n_));
    for (int64_t k = 0; k < n_; ++k)
      std::memcpy(v.data() + k * count_, whole + k * batch_ + s0_, size_t(count_) * sizeof(T));
    return v.data();
  }
  T* Out(T* whole) {
    whole_x_ = whole;
    if (layout_ == Layout::kFlat) return whole + s0_ * n_;
    x_.resize(size_t(count_ * n_));
    return x_.data();
  }
  void Scatter() const {
    if (layout_ == Layout::kFlat) return;
    for (int64_t k = 0; k < n_; ++k)
      std::memcpy(whole_x_ + k * batch_ + s0_, x_.data() + k * count_, size_t(count_) * sizeof(T));
  }

 private:
  const Layout layout_;
  const int64_t batch_, n_, s0_, count_;
  std::vector<std::vector<T>> copies_;
  std::vector<T> x_;
  T* whole_x_ = nullptr;
};

class MultiDeviceBackend final : public Backend {
 public:
  struct Worker {
    std::string tag;  // in pool names: "0", or "0/2" for a device's second worker
    std::unique_ptr<Backend> backend;
    std::atomic<int64_t> in_flight{0};
    std::atomic<int64_t> jobs{0};
    // Nanoseconds summed over its jobs: each call's time in the worker, and the device's own
    // account of it (SolveInfo: the copies in, the kernels, the copies out).
    std::atomic<int64_t> job_ns{0}, h2d_ns{0}, kernel_ns{0}, d2h_ns{0};
    // Bytes it can still take: min(pool cap - pool in use, device free + pool idle).
    std::atomic<int64_t> room{0};
    // The coefficient bytes of the prepared systems it holds (their solves' share of the work
    // that will come to it); shared with each system's release hook, which may run after the
    // backend is gone.
    std::shared_ptr<std::atomic<int64_t>> held = std::make_shared<std::atomic<int64_t>>(0);
  };

  MultiDeviceBackend(std::vector<std::unique_ptr<Worker>> workers, const PlacementOptions& options)
      : workers_(std::move(workers)), options_(options) {
    Refresh();
  }
  static std::vector<std::unique_ptr<Worker>> Workers(std::vector<std::unique_ptr<Backend>> b,
                                                      std::vector<std::string> tags) {
    std::vector<std::unique_ptr<Worker>> workers;
    for (size_t i = 0; i < b.size(); ++i) {
      auto w = std::make_unique<Worker>();
      w->tag = i < tags.size() ? tags[i] : std::to_string(i);
      w->backend = std::move(b[i]);
      workers.push_back(std::move(w));
    }
    return workers;
  }

  BackendInfo Info() const override {
    BackendInfo info;
    info.checks_finite = !workers_.empty();
    for (const auto& w : workers_) {
      BackendInfo one = w->backend->Info();
      info.name = one.name;
      info.checks_finite &= one.checks_finite;
      info.threads = std::max(info.threads, one.threads);
      for (DeviceInfo d : one.devices) {
        d.jobs = w->jobs.load();
        d.jobs_in_flight = w->in_flight.load();
        d.job_seconds = double(w->job_ns.load()) * 1e-9;
        d.h2d_seconds = double(w->h2d_ns.load()) * 1e-9;
        d.kernel_seconds = double(w->kernel_ns.load()) * 1e-9;
        d.d2h_seconds = double(w->d2h_ns.load()) * 1e-9;
        info.devices.push_back(std::move(d));
      }
      for (MemoryPoolInfo p : one.pools) {
        p.name = absl::StrCat(p.name, ":", w->tag);
        info.pools.push_back(std::move(p));
      }
    }
    return info;
  }

  // The workers' (one kind of backend, one a device).
  int64_t TridiagonalDeviceBytes(int64_t n, int64_t batch, Layout layout, int elem_bytes,
                                 TridiagonalMethod m) const override {
    return workers_.front()->backend->TridiagonalDeviceBytes(n, batch, layout, elem_bytes, m);
  }

  // One device lost is the process's loss: its context cannot come back without a restart,
  // and the systems it held are gone.
  absl::Status Health() const override {
    for (const auto& w : workers_)
      if (absl::Status st = w->backend->Health(); !st.ok())
        return absl::Status(st.code(), absl::StrCat("device ", w->tag, ": ", st.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p, TridiagonalMethod m,
                                  TridiagonalOutput<double> out, const SolveControl& c) override {
    return SolveTridiagonal(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p, TridiagonalMethod m,
                                  TridiagonalOutput<float> out, const SolveControl& c) override {
    return SolveTridiagonal(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                  TreeOutput<double> out, const SolveControl& c) override {
    return SolveTree(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m, TreeOutput<float> out,
                                  const SolveControl& c) override {
    return SolveTree(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& c) override {
    return OnPlaced(BlockBytes(p), [&](Backend& b) { return b.Solve(p, m, o, out, c); });
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& c) override {
    return OnPlaced(BlockBytes(p), [&](Backend& b) { return b.Solve(p, m, o, out, c); });
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                  DenseOutput<double> out, const SolveControl& c) override {
    return OnPlaced(DenseBytes(p), [&](Backend& b) { return b.Solve(p, m, out, c); });
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                  DenseOutput<float> out, const SolveControl& c) override {
    return OnPlaced(DenseBytes(p), [&](Backend& b) { return b.Solve(p, m, out, c); });
  }

  // A system stays on the device that prepares it and every solve of it goes there, so systems
  // are spread by what each device already holds: among the devices with room for it, the one
  // holding the fewest coefficient bytes, then a GiB more to spare, then the next in turn.
  // (The devices' free memory alone, read while many clients create their systems at once,
  // differs by the pools' buffers of the moment: on the lent 4 x H100 host it put 64 equal
  // systems 14/19/18/13 over the devices, and the busiest device bounded their solves.) The
  // choice and its count are made under one lock, so systems created at once spread too.
  absl::StatusOr<std::unique_ptr<PreparedSystem>> Prepare(const SystemSpec& spec) override {
    Refresh();
    const int64_t bytes = spec.coefficient_total_bytes();
    Worker* best = nullptr;
    {
      std::lock_guard<std::mutex> lock(prepare_mu_);
      const size_t n = workers_.size(), start = next_.fetch_add(1) % n;
      bool best_fits = false;
      for (size_t k = 0; k < n; ++k) {
        Worker* w = workers_[(start + k) % n].get();
        const bool fits = w->room.load() >= bytes;
        if (best == nullptr || fits != best_fits) {
          if (best == nullptr || fits) best = w, best_fits = fits;
          continue;
        }
        const int64_t h = w->held->load(), bh = best->held->load();
        if (h < bh || (h == bh && w->room.load() > best->room.load() + kMemoryGrain)) best = w;
      }
      best->held->fetch_add(bytes);
    }
    const InFlight busy(*best, /*count_job=*/false);
    auto system = best->backend->Prepare(spec);
    last_refresh_.store(0);  // its memory is taken: read again before the next placement
    if (!system.ok()) {
      best->held->fetch_sub(bytes);
      return system;
    }
    (*system)->OnRelease([held = best->held, bytes] { held->fetch_sub(bytes); });
    return system;
  }
  int WorkerCount() const override { return int(workers_.size()); }
  int WorkerOf(const PreparedSystem& system) const override {
    const Backend* holder = system.holder();
    for (size_t i = 0; holder != nullptr && i < workers_.size(); ++i)
      if (workers_[i]->backend.get() == holder) return int(i);
    return -1;
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<double> rhs, double* x,
                                          SystemStatus* status, const SolveControl& c) override {
    return OnHolder(system, rhs.k * system.spec().rhs_values() * 16,
                    [&](Backend& b) { return b.SolvePrepared(system, rhs, x, status, c); });
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs, float* x,
                                          SystemStatus* status, const SolveControl& c) override {
    return OnHolder(system, rhs.k * system.spec().rhs_values() * 8,
                    [&](Backend& b) { return b.SolvePrepared(system, rhs, x, status, c); });
  }

  // Memory a client shares is read by whichever worker a call lands on: every worker knows it
  // (a CUDA worker after the first finds it page-locked already, portably, and records it).
  absl::StatusOr<bool> PinHostMemory(void* p, int64_t bytes) override {
    bool any = false;
    for (const auto& w : workers_) {
      auto pinned = w->backend->PinHostMemory(p, bytes);
      if (!pinned.ok()) {
        UnpinHostMemory(p);
        return pinned.status();
      }
      any |= *pinned;
    }
    return any;
  }
  void UnpinHostMemory(void* p) override {
    for (const auto& w : workers_) w->backend->UnpinHostMemory(p);
  }

  // A client's device memory lies on one device, and the calls that read it would have to go
  // there: kept to a server of one device (the one worker's own), refused over several.
  absl::StatusOr<void*> OpenDeviceMemory(const std::string& handle, int device, int64_t offset,
                                         int64_t bytes) override {
    if (workers_.size() != 1)
      return absl::FailedPreconditionError(
          "CUDA memory regions need a server of one device (--device N, not --devices with "
          "several)");
    return workers_[0]->backend->OpenDeviceMemory(handle, device, offset, bytes);
  }
  void CloseDeviceMemory(void* p) override {
    if (workers_.size() == 1) workers_[0]->backend->CloseDeviceMemory(p);
  }
  absl::Status CopyFromDevice(void* host, const void* device, int64_t bytes) override {
    if (workers_.size() != 1) return Backend::CopyFromDevice(host, device, bytes);
    return workers_[0]->backend->CopyFromDevice(host, device, bytes);
  }

 private:
  // A call counted on its worker while it runs; a job's time added to the worker's at its end,
  // and the device's account of it where the job reports one (Report).
  class InFlight {
   public:
    InFlight(Worker& w, bool count_job) : w_(w), count_job_(count_job), start_(Clock::now()) {
      w_.in_flight.fetch_add(1);
      if (count_job) w_.jobs.fetch_add(1);
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    ~InFlight() {
      if (count_job_)
        w_.job_ns.fetch_add(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count());
      w_.in_flight.fetch_sub(1);
    }
    absl::StatusOr<SolveInfo> Report(absl::StatusOr<SolveInfo> r) const {
      if (r.ok()) {
        w_.h2d_ns.fetch_add(int64_t(r->h2d_us * 1e3));
        w_.kernel_ns.fetch_add(int64_t(r->kernel_us * 1e3));
        w_.d2h_ns.fetch_add(int64_t(r->d2h_us * 1e3));
      }
      return r;
    }

   private:
    Worker& w_;
    const bool count_job_;
    const Clock::time_point start_;
  };

  // Device bytes a one-shot call takes, as the workers' backend counts them (its arrays in, x
  // out and the method's scratch: auto's second solve keeps three arrays of its own beside the
  // five). Linear enough in the batch for its parts to be cut in proportion.
  template <typename T>
  int64_t TridiagonalBytes(const TridiagonalProblem<T>& p, TridiagonalMethod m) const {
    return TridiagonalDeviceBytes(p.n, p.batch, p.layout, int(sizeof(T)), m);
  }
  template <typename T>
  static int64_t TreeBytes(const TreeProblem<T>& p) {
    return 5 * p.unknowns() * int64_t(sizeof(T)) + (p.variable() ? p.unknowns() : p.n) * 5;
  }
  // One tree of n nodes solved on a device (a batch of one): its arrays and x, the cable
  // plan (some 32 bytes a node: the cables, their order and their children) and the solver's
  // scratch (up to 3 values a node), rounded up to the pool's size classes (up to 4/3). For a
  // large tree the plan and scratch weigh as much as the arrays: the split sizes its parts
  // by them.
  template <typename T>
  static int64_t OneTreeBytes(int64_t n) {
    return (8 * int64_t(sizeof(T)) + 32) * n * 4 / 3;
  }
  template <typename T>
  static int64_t BlockBytes(const BlockTridiagonalProblem<T>& p) {
    return 8 * p.N * p.M * int64_t(sizeof(T));
  }
  template <typename T>
  static int64_t DenseBytes(const DenseProblem<T>& p) {
    return (p.n + 2) * p.batch * p.n * int64_t(sizeof(T));
  }

  // Reads every worker's memory to spare. Pooled idle buffers count as free: the pool reuses
  // them or evicts them for a new size.
  void Refresh() const {
    for (const auto& w : workers_) {
      const BackendInfo info = w->backend->Info();
      int64_t room = 0;
      if (!info.devices.empty() && !info.pools.empty()) {
        const MemoryPoolInfo& pool = info.pools.front();  // "device"
        room = std::min(pool.cap_bytes - pool.in_use_bytes,
                        info.devices.front().free_memory_bytes + pool.cached_bytes);
      }
      w->room.store(std::max<int64_t>(room, 0));
    }
    last_refresh_.store(Clock::now().time_since_epoch().count());
  }
  void MaybeRefresh() const {
    const auto now = Clock::now().time_since_epoch().count();
    if (now - last_refresh_.load() < Clock::duration(kMemoryRefresh).count()) return;
    std::unique_lock<std::mutex> lock(refresh_mu_, std::try_to_lock);
    if (lock.owns_lock()) Refresh();  // one thread reads; the others place by the last figures
  }

  // The worker for a call of `bytes`: the fewest calls in flight among those with room for it
  // (every worker, where none has), then kMemoryGrain more memory to spare, then the next in
  // turn.
  Worker& Place(int64_t bytes) {
    MaybeRefresh();
    const size_t n = workers_.size(), start = next_.fetch_add(1) % n;
    Worker* best = workers_[start].get();
    bool best_fits = best->room.load() >= bytes;
    for (size_t k = 1; k < n; ++k) {
      Worker* w = workers_[(start + k) % n].get();
      const bool fits = w->room.load() >= bytes;
      if (fits != best_fits) {
        if (fits) best = w, best_fits = true;
        continue;
      }
      const int64_t q = w->in_flight.load(), bq = best->in_flight.load();
      if (q < bq || (q == bq && w->room.load() > best->room.load() + kMemoryGrain)) best = w;
    }
    return *best;
  }

  template <typename Call>
  absl::StatusOr<SolveInfo> OnPlaced(int64_t bytes, Call call) {
    Worker& w = Place(bytes);
    const InFlight busy(w, /*count_job=*/true);
    return busy.Report(call(*w.backend));
  }

  // A prepared system's solve on the worker that holds it; a system holding nothing on a
  // device (the host copy only) goes where a one-shot call would.
  template <typename Call>
  absl::StatusOr<SolveInfo> OnHolder(const PreparedSystem& system, int64_t bytes, Call call) {
    const Backend* holder = system.holder();
    if (holder == nullptr) return OnPlaced(bytes, call);
    for (const auto& w : workers_)
      if (w->backend.get() == holder) {
        const InFlight busy(*w, /*count_job=*/true);
        return busy.Report(call(*w->backend));
      }
    return absl::FailedPreconditionError(
        "the system was prepared by another backend: its coefficients are on no device of this "
        "one");
  }

  // A batch that fits no one worker's memory to spare but the workers' together is split by
  // systems, in proportion to their room, and its parts solved at once, each on its worker.
  struct Part {
    Worker* worker;
    int64_t s0, count;  // systems [s0, s0 + count)
  };
  // The parts for a batch of `bytes`; empty where one worker takes it (it fits one, or it fits
  // not even all of them together: the placement's call then says why).
  std::vector<Part> SplitParts(int64_t batch, int64_t bytes) {
    if (workers_.size() < 2 || batch < 2) return {};
    MaybeRefresh();
    int64_t total = 0, most = 0;
    for (const auto& w : workers_) {
      total += w->room.load();
      most = std::max(most, w->room.load());
    }
    if (bytes <= most || bytes > total) return {};
    std::vector<Part> parts;
    int64_t s0 = 0;
    for (size_t i = 0; i < workers_.size() && s0 < batch; ++i) {
      // (exact while batch * room < 2^53; beyond, off by a system at most)
      const int64_t share =
          int64_t(std::floor(double(batch) * double(workers_[i]->room.load()) / double(total)));
      const int64_t count = i + 1 == workers_.size() ? batch - s0 : std::min(batch - s0, share);
      if (count > 0) parts.push_back({workers_[i].get(), s0, count});
      s0 += count;
    }
    return parts;
  }

  // Runs `solve(part)` for every part at once (the first on the calling thread), each counted on
  // its worker; the first error, else one report: the method (" (split over N devices)"), the
  // worst iterations and residual, the longest times (the parts overlap).
  template <typename SolvePart>
  absl::StatusOr<SolveInfo> RunParts(const std::vector<Part>& parts, SolvePart solve) {
    std::vector<absl::StatusOr<SolveInfo>> results(parts.size(),
                                                   absl::InternalError("part not solved"));
    auto run = [&](size_t i) {
      const InFlight busy(*parts[i].worker, /*count_job=*/true);
      results[i] = busy.Report(solve(parts[i]));
    };
    std::vector<std::thread> threads;
    for (size_t i = 1; i < parts.size(); ++i) threads.emplace_back(run, i);
    run(0);
    for (auto& t : threads) t.join();
    SolveInfo total;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!results[i].ok()) return results[i].status();
      const SolveInfo& r = *results[i];
      if (i == 0) {
        total = r;
        continue;
      }
      if (total.method.find(r.method) == std::string::npos)
        absl::StrAppend(&total.method, " + ", r.method);
      total.iterations = std::max(total.iterations, r.iterations);
      if (!(r.residual <= total.residual)) total.residual = r.residual;  // NaN stays
      total.h2d_us = std::max(total.h2d_us, r.h2d_us);
      total.kernel_us = std::max(total.kernel_us, r.kernel_us);
      total.d2h_us = std::max(total.d2h_us, r.d2h_us);
    }
    absl::StrAppend(&total.method, " (split over ", parts.size(), " devices)");
    return total;
  }

  // The workers one system (or tree) of `bytes` is split over, and their shares; empty for no
  // split (PlacementOptions: for speed only where the method is left to auto).
  struct RowSplit {
    std::vector<Worker*> workers;
    std::vector<double> weights;
    bool fits_one = false;  // one worker has room for the whole system
  };
  // for_speed_from: PlacementOptions' split_system_unknowns or split_tree_nodes.
  RowSplit SplitSystem(int64_t n, int64_t bytes, bool auto_method, int64_t for_speed_from) {
    RowSplit split;
    if (workers_.size() < 2) return split;
    MaybeRefresh();
    int64_t total = 0, most = 0;
    for (const auto& w : workers_) {
      total += w->room.load();
      most = std::max(most, w->room.load());
    }
    split.fits_one = bytes <= most;
    if (!split.fits_one) {  // by memory: every worker with room, in proportion to it
      if (bytes > total) return split;
      for (const auto& w : workers_)
        if (w->room.load() > 0) {
          split.workers.push_back(w.get());
          split.weights.push_back(double(w->room.load()));
        }
      return split;
    }
    if (for_speed_from <= 0 || n < for_speed_from || !auto_method) return split;
    // For speed: the idle workers, as many as have room for an equal part.
    std::vector<Worker*> idle;
    for (const auto& w : workers_)
      if (w->in_flight.load() == 0) idle.push_back(w.get());
    std::sort(idle.begin(), idle.end(),
              [](const Worker* x, const Worker* y) { return x->room.load() > y->room.load(); });
    while (idle.size() >= 2 && double(idle.back()->room.load()) < 1.05 * double(bytes) /
                                                                      double(idle.size()))
      idle.pop_back();
    if (idle.size() < 2) return split;
    split.workers = idle;
    split.weights.assign(idle.size(), 1.0);
    return split;
  }

  // One system over split.workers; nullopt where the rows cannot be cut (parts too small).
  template <typename T>
  absl::StatusOr<std::optional<SolveInfo>> SolveSplit(const TridiagonalProblem<T>& p,
                                                      TridiagonalMethod m,
                                                      TridiagonalOutput<T> out,
                                                      const SolveControl& c, const RowSplit& split,
                                                      int64_t bytes) {
    const std::vector<int64_t> rows = SplitRows(p.n, split.weights);
    if (rows.empty()) return std::optional<SolveInfo>();
    auto outcome = SolveSystemSplit<T>(
        p, rows,
        [&](size_t k, const TridiagonalProblem<T>& part, TridiagonalOutput<T> o) {
          const InFlight busy(*split.workers[k], /*count_job=*/true);
          return busy.Report(split.workers[k]->backend->Solve(part, m, o, c));
        },
        out.x);
    if (!outcome.ok()) return outcome.status();
    if (outcome->solved) {
      out.status[0] = SystemStatus::kOk;
      return std::optional<SolveInfo>(outcome->info);
    }
    return Unsplit(p, m, out, c, split.fits_one, bytes, outcome->why,
                   [&] { return cpu::SolveTridiagonal(p, m, out); });
  }

  // A system (or tree) whose split parts could not be joined: whole on one worker where one
  // holds it, else by the CPU reference on the host (`host`); the method says why.
  template <typename Problem, typename Method, typename Output, typename Host>
  absl::StatusOr<std::optional<SolveInfo>> Unsplit(const Problem& p, Method m, Output out,
                                                   const SolveControl& c, bool fits_one,
                                                   int64_t bytes, const std::string& why_not,
                                                   const Host& host) {
    const std::string why = absl::StrCat(" (not split: ", why_not, ")");
    if (fits_one) {
      auto whole = OnPlaced(bytes, [&](Backend& b) { return b.Solve(p, m, out, c); });
      if (!whole.ok()) return whole.status();
      whole->method += why;
      return std::optional<SolveInfo>(*whole);
    }
    SolveInfo on_host = host();
    on_host.method = absl::StrCat(on_host.method, " on the host", why);
    return std::optional<SolveInfo>(on_host);
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveTridiagonal(const TridiagonalProblem<T>& p, TridiagonalMethod m,
                                             TridiagonalOutput<T> out, const SolveControl& c) {
    const int64_t bytes = TridiagonalBytes(p, m);
    // A variable-size or unified batch goes whole to one worker: its parts would need offsets
    // of their own (or a strided view).
    if (p.variable() || p.unified()) return OnPlaced(bytes, [&](Backend& b) { return b.Solve(p, m, out, c); });
    if (p.batch == 1) {
      const RowSplit split = SplitSystem(p.n, bytes, m == TridiagonalMethod::kAuto,
                                        options_.split_system_unknowns);
      if (!split.workers.empty()) {
        auto r = SolveSplit(p, m, out, c, split, bytes);
        if (!r.ok()) return r.status();
        if (r->has_value()) return **r;
      }
    }
    const std::vector<Part> parts = SplitParts(p.batch, bytes);
    if (parts.empty()) return OnPlaced(bytes, [&](Backend& b) { return b.Solve(p, m, out, c); });
    return RunParts(parts, [&](const Part& part) -> absl::StatusOr<SolveInfo> {
      PartView<T> v(p.layout, p.batch, p.n, part.s0, part.count);
      const TridiagonalProblem<T> sub{part.count, p.n,       p.layout, v.In(p.a),
                                      v.In(p.b),  v.In(p.c), v.In(p.d)};
      auto r = part.worker->backend->Solve(
          sub, m, TridiagonalOutput<T>{v.Out(out.x), out.status + part.s0}, c);
      if (r.ok()) v.Scatter();
      return r;
    });
  }
  // The cut of a tree over parts of these weights: the last one made where the morphology and
  // weights are the same (a simulation solves one tree step after step; the parent array is
  // compared whole, one streamed read, against the cut's passes of scattered reads).
  std::shared_ptr<const TreeCut> CutFor(const int32_t* parent, int64_t n,
                                        const std::vector<double>& weights, double tolerance) {
    {
      std::lock_guard<std::mutex> lock(cut_mu_);
      if (cut_ != nullptr && cut_weights_ == weights && cut_tolerance_ == tolerance &&
          int64_t(cut_parent_.size()) == n &&
          std::memcmp(cut_parent_.data(), parent, size_t(n) * sizeof(int32_t)) == 0)
        return cut_;
    }
    auto made = std::make_shared<const TreeCut>(CutTree(parent, n, weights, tolerance));
    std::lock_guard<std::mutex> lock(cut_mu_);
    cut_parent_.assign(parent, parent + n);
    cut_weights_ = weights;
    cut_tolerance_ = tolerance;
    cut_ = made;
    return made;
  }

  // One tree over split.workers (tree_split.h); nullopt where it cannot be cut, or a part
  // fits its worker not even one right-hand side at a time. A part whose right-hand sides
  // together do not fit its worker takes them one a call.
  template <typename T>
  absl::StatusOr<std::optional<SolveInfo>> SolveTreeSplitOver(const TreeProblem<T>& p,
                                                              TreeMethod m, TreeOutput<T> out,
                                                              const SolveControl& c,
                                                              const RowSplit& split,
                                                              int64_t bytes) {
    // For speed, parts some 20% off their shares rather than a link more (a right-hand side
    // more for two parts); by memory, parts as close to their rooms' shares as 4 links allow.
    const std::shared_ptr<const TreeCut> kept = CutFor(
        p.parent, p.n, split.weights, split.fits_one ? kTreeCutForSpeed : kTreeCutForMemory);
    const TreeCut& cut = *kept;
    if (cut.parts == 0) return std::optional<SolveInfo>();
    // A part is prepared on its device (its coefficients there once) and its k right-hand
    // sides solved one a call: no replicated coefficients (k copies on the host, then on the
    // device, a few hundred MB for a part of 2^23 nodes), 2 arrays a call.
    if (!split.fits_one)
      for (size_t k = 0; k < size_t(cut.parts); ++k)
        if (OneTreeBytes<T>(cut.nodes[k] + 1) > split.workers[k]->room.load())
          return std::optional<SolveInfo>();
    auto outcome = SolveTreeSplit<T>(
        p, cut,
        [&](size_t k, const TreeProblem<T>& part, int64_t rhs,
            TreeOutput<T> o) -> absl::StatusOr<SolveInfo> {
          Worker& w = *split.workers[k];
          const InFlight busy(w, /*count_job=*/true);
          SystemSpec spec;
          spec.family = Family::kTree;
          spec.precision = sizeof(T) == 8 ? Precision::kFloat64 : Precision::kFloat32;
          spec.n = part.n;
          spec.method = uint8_t(m);
          spec.coefficients = {part.lower, part.upper, part.diag, part.parent};
          auto system = w.backend->Prepare(spec);
          if (!system.ok()) return system.status();
          SolveInfo total;
          for (int64_t s = 0; s < rhs; ++s) {
            const int64_t at = s * part.n;
            auto r = w.backend->SolvePrepared(
                **system, RhsBlock<T>{part.rhs + at, 1, Layout::kFlat}, o.x + at, o.status + s, c);
            if (!r.ok()) return r;
            if (s == 0) {
              total = *r;
            } else {
              total.h2d_us += r->h2d_us;
              total.kernel_us += r->kernel_us;
              total.d2h_us += r->d2h_us;
            }
          }
          return busy.Report(total);
        },
        out.x);
    if (!outcome.ok()) return outcome.status();
    if (outcome->solved) {
      out.status[0] = SystemStatus::kOk;
      // The parts' coefficients went to their devices through Prepare, which scans nothing
      // (a device's scan covers what a solve copies in: here the right-hand sides): the
      // caller checks the inputs itself.
      outcome->info.inputs_checked = false;
      return std::optional<SolveInfo>(outcome->info);
    }
    return Unsplit(p, m, out, c, split.fits_one, bytes, outcome->why,
                   [&] { return cpu::SolveTree(p, m, out); });
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveTree(const TreeProblem<T>& p, TreeMethod m, TreeOutput<T> out,
                                      const SolveControl& c) {
    const int64_t bytes = p.batch == 1 ? OneTreeBytes<T>(p.n) : TreeBytes(p);
    // Cells of different sizes go whole to one worker (solved there as one tree: the plan and
    // scratch of OneTreeBytes); parts would need offsets of their own.
    if (p.variable())
      return OnPlaced(OneTreeBytes<T>(p.unknowns()),
                      [&](Backend& b) { return b.Solve(p, m, out, c); });
    if (p.batch == 1) {
      const RowSplit split =
          SplitSystem(p.n, bytes, m == TreeMethod::kAuto, options_.split_tree_nodes);
      if (!split.workers.empty()) {
        auto r = SolveTreeSplitOver(p, m, out, c, split, bytes);
        if (!r.ok()) return r.status();
        if (r->has_value()) return **r;
      }
    }
    const std::vector<Part> parts = SplitParts(p.batch, bytes);
    if (parts.empty()) return OnPlaced(bytes, [&](Backend& b) { return b.Solve(p, m, out, c); });
    return RunParts(parts, [&](const Part& part) -> absl::StatusOr<SolveInfo> {
      PartView<T> v(p.layout, p.batch, p.n, part.s0, part.count);
      TreeProblem<T> sub = p;
      sub.batch = part.count;
      // Per-system parent arrays are always flat.
      if (p.parent_per_system) sub.parent = p.parent + part.s0 * p.n;
      sub.lower = v.In(p.lower);
      sub.upper = v.In(p.upper);
      sub.diag = v.In(p.diag);
      sub.rhs = v.In(p.rhs);
      auto r =
          part.worker->backend->Solve(sub, m, TreeOutput<T>{v.Out(out.x), out.status + part.s0}, c);
      if (r.ok()) v.Scatter();
      return r;
    });
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  const PlacementOptions options_;
  std::atomic<size_t> next_{0};
  mutable std::mutex refresh_mu_;
  std::mutex prepare_mu_;  // a system's placement and its count in Worker::held
  std::mutex cut_mu_;
  std::vector<int32_t> cut_parent_;
  std::vector<double> cut_weights_;
  double cut_tolerance_ = 0;
  std::shared_ptr<const TreeCut> cut_;
  mutable std::atomic<Clock::rep> last_refresh_{0};
};

}  // namespace

std::unique_ptr<Backend> MakePlacedBackend(std::vector<std::unique_ptr<Backend>> workers,
                                           std::vector<std::string> tags,
                                           const PlacementOptions& options) {
  if (workers.empty()) return nullptr;
  return std::make_unique<MultiDeviceBackend>(
      MultiDeviceBackend::Workers(std::move(workers), std::move(tags)), options);
}

}  // namespace trisolve
