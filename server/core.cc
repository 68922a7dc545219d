#include "core.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>

#include <sys/resource.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace trisolve::server {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// Labels name systems in listings and logs: short and plain.
absl::Status CheckLabel(const std::string& label) {
  if (label.size() > 64)
    return absl::InvalidArgumentError(absl::StrCat("label has ", label.size(),
                                                   " characters, at most 64"));
  for (char ch : label)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-'))
      return absl::InvalidArgumentError("label: only letters, digits, '.', '_' and '-'");
  return absl::OkStatus();
}

// How many systems ended in each SystemStatus. Mostly all are OK: a count that vectorizes says
// so (the histogram over 65,536 statuses took ~65 us a pass on the 2-core VM, and ran twice).
std::array<int64_t, 4> Outcomes(const std::vector<SystemStatus>& status) {
  std::array<int64_t, 4> o{};
  o[0] = std::count(status.begin(), status.end(), SystemStatus::kOk);
  if (o[0] == int64_t(status.size())) return o;
  o[0] = 0;
  for (SystemStatus st : status) ++o[static_cast<size_t>(st)];
  return o;
}

void FillSample(int64_t unknowns, const JobResult& r, double receive_us, double queue_us,
                CallSample* sample) {
  sample->solved = true;
  sample->method = r.info.method;
  sample->queue_s = queue_us * 1e-6;
  sample->transfer_s = (receive_us + r.info.h2d_us + r.info.d2h_us) * 1e-6;
  sample->compute_s = (r.info.kernel_us > 0 ? r.info.kernel_us : r.compute_us) * 1e-6;
  sample->bytes_out = int64_t(r.x.size());
  sample->unknowns = unknowns;
  const auto o = Outcomes(r.status);
  for (size_t i = 0; i < o.size(); ++i) sample->outcomes[i] += o[i];
}

void LogDone(const std::string& id, const char* rpc, const Job& job, const AnswerSummary& s) {
  spdlog::info(
      "[req {}] {} {} {} batch={} n={} method={} -> ok={} singular={} not_converged={} "
      "diverged={} iterations={} residual={} total={:.3f} ms (queue {:.3f}, compute {:.3f}){}",
      id, rpc, std::string(FamilyName(job.family)),
      job.precision == Precision::kFloat64 ? "float64" : "float32", job.batch,
      job.block_N > 0 ? absl::StrCat(job.block_N, "x", job.block_M) : std::to_string(job.n),
      s.method, s.outcomes[0], s.outcomes[1], s.outcomes[2], s.outcomes[3], s.iterations,
      // NaN: the client asked for no residual (skip_residual), or no system was OK.
      std::isnan(s.residual) ? std::string("not computed") : fmt::format("{:.3g}", s.residual),
      s.total_us / 1e3, s.queue_us / 1e3, s.compute_us / 1e3,
      s.batched_with > 1 ? fmt::format(" batched with {} ({} systems)", s.batched_with,
                                       s.batch_systems)
                         : std::string());
}

}  // namespace

std::string MethodLabel(Family f, const std::string& m) {
  if (m.empty()) return "auto";
  return Describe(f).parse_method(m).ok() ? m : "invalid";
}

Core::Core(std::unique_ptr<Backend> backend, CoreOptions options)
    : backend_(std::move(backend)),
      backend_info_(backend_->Info()),
      health_(backend_.get()),
      options_(std::move(options)),
      admission_(options_.max_concurrent_jobs, options_.max_queued_jobs),
      small_admission_(std::max(1, options_.max_concurrent_small_jobs), options_.max_queued_jobs),
      receiving_(options_.max_receiving_bytes, std::max(1, options_.max_receiving_streams)),
      systems_(options_.systems),
      memory_(options_.memory, backend_.get()),
      started_(Clock::now()) {
  if (const int workers = backend_->WorkerCount(); workers > 1)
    for (int w = 0; w < workers; ++w)
      worker_admission_.push_back(std::make_unique<Admission>(
          std::max(1, (options_.max_concurrent_jobs + workers - 1) / workers),
          options_.max_queued_jobs));
  // A lost backend: queued calls are refused, new ones too (health.h).
  health_.OnLost([this] {
    for (Admission* a : Pools()) a->Shutdown();
  });
  if (options_.batching.max_systems > 1)
    batcher_ = std::make_unique<Batcher>(
        options_.batching,
        [this](const Job& job, const SolveControl& control) {
          return RunJob(*backend_, job, control);
        },
        &metrics_);
}

Core::~Core() = default;

int64_t Core::QueuedJobs() const {
  int64_t queued = admission_.queued() + small_admission_.queued();
  for (const auto& a : worker_admission_) queued += a->queued();
  return queued;
}

std::vector<Admission*> Core::Pools() {
  std::vector<Admission*> pools = {&admission_, &small_admission_};
  for (auto& a : worker_admission_) pools.push_back(a.get());
  return pools;
}

std::atomic<int64_t>& LiveCall::count() {
  static std::atomic<int64_t> live{0};
  return live;
}

CoreStatus Core::Status() const {
  CoreStatus s;
  s.backend = backend_->Info();  // fresh: free device memory changes
  s.jobs_in_flight = admission_.running() + small_admission_.running();
  s.jobs_queued = QueuedJobs();
  s.jobs_done = admission_.done() + small_admission_.done();
  s.systems = systems_.count();
  s.system_bytes = systems_.bytes();
  s.memory_regions = memory_.count();
  s.memory_region_bytes = memory_.bytes();
  s.replica = systems_.replica_address();
  s.uptime_s = std::chrono::duration<double>(Clock::now() - started_).count();
  s.cpu_s = ProcessCpuSeconds();
  return s;
}

double ProcessCpuSeconds() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto s = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return s(u.ru_utime) + s(u.ru_stime);
}

std::chrono::system_clock::time_point Core::EffectiveDeadline(
    std::chrono::system_clock::time_point d) const {
  const auto now = std::chrono::system_clock::now();
  auto after = [&](double s) { return now + std::chrono::microseconds(int64_t(s * 1e6)); };
  if (options_.default_deadline_s > 0 && d == std::chrono::system_clock::time_point::max())
    d = after(options_.default_deadline_s);
  if (options_.max_deadline_s > 0) d = std::min(d, after(options_.max_deadline_s));
  return d;
}

bool Core::Drain(std::chrono::system_clock::time_point deadline) {
  bool idle = true;
  for (Admission* a : Pools()) a->Shutdown();
  for (Admission* a : Pools()) idle &= a->WaitIdle(deadline);
  return idle;
}

absl::Status Core::Finish(Call& call, const absl::Status& st) {
  call.sample.code = absl::StatusCodeToString(st.code());
  metrics_.Record(call.sample);
  if (!st.ok())
    spdlog::warn("[req {}] {} {}: {} {}", call.id, call.rpc,
                 st.code() == absl::StatusCode::kInvalidArgument ||
                         st.code() == absl::StatusCode::kUnauthenticated
                     ? "rejected"
                     : "failed",
                 absl::StatusCodeToString(st.code()), std::string(st.message()));
  return st;
}

std::string Core::RenderMetrics() const {
  std::string out = metrics_.Render(backend_->Info(), admission_.running() + small_admission_.running(),
                                    QueuedJobs());
  absl::StrAppend(&out,
                  "# HELP trisolve_systems Persistent systems held (every identity).\n"
                  "# TYPE trisolve_systems gauge\ntrisolve_systems ", systems_.count(), "\n",
                  "# HELP trisolve_system_bytes Memory the persistent systems hold.\n"
                  "# TYPE trisolve_system_bytes gauge\ntrisolve_system_bytes ", systems_.bytes(),
                  "\n",
                  "# HELP trisolve_memory_retries_total Large jobs run again after a refusal for "
                  "memory that jobs beside them held.\n"
                  "# TYPE trisolve_memory_retries_total counter\ntrisolve_memory_retries_total ",
                  memory_retries_.load(std::memory_order_relaxed), "\n",
                  "# HELP process_cpu_seconds_total The process's CPU time, user and system.\n"
                  "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ",
                  absl::StrFormat("%.3f", ProcessCpuSeconds()), "\n");
  out += health_.RenderMetrics();
  return out;
}

absl::StatusOr<JobResult> Core::Admit(
    Call& call, int64_t unknowns,
    const std::function<absl::StatusOr<JobResult>(const SolveControl&)>& run, int worker) {
  const auto t0 = Clock::now();
  Admission::Slot worker_slot, slot;
  const bool small = unknowns <= options_.small_job_unknowns;
  Admission& pool = small ? small_admission_ : admission_;
  if (call.progress) call.progress({.phase = ProgressEvent::kQueued});
  absl::Status st;
  // (Always the worker's share first, then the pool: a fixed order, so no two callers each
  // hold what the other waits for.)
  if (!small && worker >= 0 && size_t(worker) < worker_admission_.size())
    st = worker_admission_[size_t(worker)]->Acquire(call.deadline, call.cancelled, &worker_slot);
  if (st.ok()) st = pool.Acquire(call.deadline, call.cancelled, &slot);
  call.queue_us = Micros(Clock::now() - t0);
  if (!st.ok()) return st;
  if (call.progress) call.progress({.phase = ProgressEvent::kSolving});
  const auto deadline = call.deadline;
  SolveControl control;
  const BackendHealth* health = &health_;  // a lost backend's running calls stop (health.h)
  control.cancelled = [cancelled = call.cancelled, deadline, health] {
    return (cancelled && cancelled()) || std::chrono::system_clock::now() >= deadline ||
           health->stop_running();
  };
  if (call.progress)
    control.progress = [&call](int64_t it, double r) {
      call.progress({.phase = ProgressEvent::kSolving, .iteration = it, .residual = r});
    };
  // Slots count jobs, not bytes: a large job refused for memory that the jobs beside it hold
  // runs again once one of them ends (one has ended since it started: at once), at most
  // kMemoryRetries times (a job too large for what it can ever get, or one that the jobs coming
  // after it keep beating to the memory, must not hold its slot for ever); refused with none
  // beside it, the refusal is its own.
  int64_t seen = pool.done();
  auto res = run(control);
  for (int retries = 0;
       !small && !res.ok() && IsMemoryHeldByOthers(res.status()) && retries < kMemoryRetries;
       ++retries) {
    if (pool.done() == seen &&
        (pool.running() <= 1 || !pool.AwaitDone(seen, deadline, call.cancelled)))
      break;
    memory_retries_.fetch_add(1, std::memory_order_relaxed);
    seen = pool.done();
    res = run(control);
  }
  if (!res.ok()) res = health_.Check(res.status());  // UNAVAILABLE where the backend is lost
  if (!res.ok() && res.status().code() == absl::StatusCode::kCancelled &&
      std::chrono::system_clock::now() + Admission::kDeadlineSkew >= deadline)
    return absl::DeadlineExceededError("the deadline passed while the job was running");
  return res;
}

AnswerSummary Core::Summarize(const Call& call, Family family, int64_t systems,
                              const JobResult& r) const {
  AnswerSummary s;
  s.method = r.info.method;
  s.backend = backend_info_.name;
  s.systems = systems;
  s.outcomes = Outcomes(r.status);
  s.iterations = r.info.iterations;
  s.residual = Describe(family).iterative ? r.info.residual : r.backward_error;
  s.request_id = call.id;
  s.receive_us = call.receive_us;
  s.queue_us = call.queue_us;
  s.h2d_us = r.info.h2d_us;
  s.compute_us = r.info.kernel_us > 0 ? r.info.kernel_us : r.compute_us;
  s.d2h_us = r.info.d2h_us;
  s.residual_us = r.residual_us;
  s.total_us = Micros(Clock::now() - call.start);
  s.residual_history = r.info.residual_history;
  return s;
}

absl::StatusOr<Answer> Core::Solve(Call& call, const Job& job) {
  call.sample.family = std::string(FamilyName(job.family));
  call.sample.method = std::string(job.method_name());
  call.sample.bytes_in = job.total_bytes();
  // (Arrays in a client's device memory: never batched, the batcher reads them on the host.)
  const bool device_arrays = job.device_arrays();
  const bool batch = batcher_ != nullptr && job.unknowns() <= options_.small_job_unknowns &&
                     !device_arrays && batcher_->Eligible(job);
  // A large job's values unchecked yet: the device checks them after the copy in, where the
  // backend can and the job is not batched; here otherwise.
  const bool on_device =
      !job.values_checked && !batch && (backend_info_.checks_finite || device_arrays);
  if (!job.values_checked && !on_device)
    if (auto st = CheckValues(job); !st.ok()) return st;
  auto res = Admit(call, job.unknowns(), [&](const SolveControl& control) {
    if (batch) return batcher_->Solve(job, call.deadline, control.cancelled);
    if (!on_device) return RunJob(*backend_, job, control);
    SolveControl c = control;
    c.check_finite = true;
    return RunJob(*backend_, job, c);
  });
  if (on_device)
    if (auto st = AfterDeviceCheck(res.status(), res.ok() && res->info.inputs_checked,
                                   [&] { return CheckValues(job, ReadDevice()); });
        !st.ok())
      return st;
  if (!res.ok()) return res.status();
  FillSample(job.unknowns(), *res, call.receive_us, call.queue_us, &call.sample);
  Answer a;
  a.precision = job.precision;
  a.x_shape = job.rhs().shape;
  a.summary = Summarize(call, job.family, job.batch, *res);
  if (job.shared_matrix) a.summary.right_hand_sides = job.batch;
  if (batch) {
    a.summary.batched_with = res->batched_with;
    if (res->batched_with > 1) a.summary.batch_systems = res->batch_systems;
  }
  a.result = *std::move(res);
  if (options_.log_answers) LogDone(call.id, call.rpc, job, a.summary);
  return a;
}

// ---- persistent systems ----------------------------------------------------------------------

// The caller holds e.mu (e.system is there, and stays).
SystemView Core::ViewOf(const SystemRegistry::Entry& e) const {
  const SystemSpec& s = e.system->spec();
  SystemView v;
  v.handle = e.handle;
  v.label = e.label;
  v.family = s.family;
  v.precision = s.precision;
  v.layout = s.layout;
  v.method = std::string(SpecMethodName(s));
  v.prepared = e.system->prepared();
  v.rhs_shape = e.rhs_shape;
  v.systems = s.batch;
  v.variable = s.variable();
  const SystemRegistry::Usage u = systems_.UsageOf(e);
  v.bytes = u.bytes;
  v.ttl_s = e.ttl_s;
  v.idle_s = u.idle_s;
  v.solves = u.solves;
  v.updates = u.updates;
  return v;
}

absl::StatusOr<SystemView> Core::CreateSystem(Call& call, const Job& job,
                                              const std::string& label, double ttl_s) {
  call.sample.family = std::string(FamilyName(job.family));
  if (!std::isfinite(ttl_s) || ttl_s < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("ttl_s is ", ttl_s, ", expected >= 0 (0: the default)"));
  if (auto st = CheckLabel(label); !st.ok()) return st;
  if (auto st = systems_.Reserve(call.identity, job.total_bytes()); !st.ok()) return st;
  call.sample.bytes_in = job.total_bytes();
  std::unique_ptr<PreparedSystem> prepared;
  auto res = Admit(call, job.unknowns(), [&](const SolveControl&) -> absl::StatusOr<JobResult> {
    auto p = backend_->Prepare(job.Spec());
    if (!p.ok()) return p.status();
    prepared = *std::move(p);
    return JobResult{};
  });
  if (!res.ok()) return res.status();
  call.sample.method = std::string(SpecMethodName(prepared->spec()));
  auto entry = systems_.Add(call.identity, label, ttl_s, std::move(prepared),
                            job.CoefficientShapes(), job.SystemRhsShape());
  if (!entry.ok()) return entry.status();
  SystemView v;
  {
    std::lock_guard<std::mutex> order((*entry)->mu);
    v = ViewOf(**entry);
  }
  spdlog::info("[req {}] CreateSystem {} {} {} ({}): {} bytes, {}", call.id, v.handle,
               std::string(FamilyName(v.family)), v.label.empty() ? "-" : v.label, v.method,
               v.bytes, v.prepared);
  return v;
}

absl::Status Core::ApplyUpdates(SystemRegistry::Entry& e, const StepRequest& step,
                                RegionResolver* regions, CallSample& sample) {
  const SystemSpec& spec = e.system->spec();
  for (const auto& [name, arg] : step.updates) {
    const int i = CoefficientIndex(spec.family, name);
    const bool int32 = i >= 0 && Describe(spec.family).coefficient(i).int32;
    const int eb = int32 ? 4 : int(spec.elem_bytes());
    auto in = ResolveArray(arg, regions, "update", eb,
                           int32 ? RegionUse::kStructure : RegionUse::kHost);
    if (!in.ok()) return in.status();
    auto checked = CheckUpdate(spec, e.coefficient_shapes, name, *in);
    if (!checked.ok()) return checked.status();
    if (auto st = e.system->Update(checked->index, checked->data); !st.ok())
      return health_.Check(st);
    sample.bytes_in += in->bytes;
  }
  if (!step.updates.empty()) systems_.Touch(e, false, true);
  return absl::OkStatus();
}

absl::StatusOr<Answer> Core::SolveSystem(Call& call, const StepRequest& step) {
  CallSample& sample = call.sample;
  auto use = systems_.Acquire(call.identity, step.handle);
  if (!use.ok()) return use.status();
  SystemRegistry::Entry& e = **use;
  std::lock_guard<std::mutex> order(e.mu);  // this system's calls, one at a time, in order
  if (e.gone) return absl::NotFoundError("the system was released, expired or evicted");
  PreparedSystem& system = *e.system;
  const SystemSpec& spec = system.spec();
  sample.family = std::string(FamilyName(spec.family));
  sample.method = std::string(SpecMethodName(spec));
  // A range of the batch's systems: checked before anything is applied; the whole batch given
  // as a range is the whole batch.
  SystemRange range{step.first_system, step.systems};
  if (range.systems != 0 || range.first != 0) {
    if (!step.updates.empty())
      return absl::InvalidArgumentError(
          "update: a step on a range of systems (first_system, systems) cannot update "
          "coefficients, as an update applies to the whole system: send it with UpdateSystem or "
          "in a step without a range");
    if (auto st = CheckSystemRange(spec, range.first, range.systems); !st.ok()) return st;
    if (range.first == 0 && range.systems == spec.batch) range = {};
  }
  const bool ranged = range.systems > 0;
  const SystemSpec rspec = ranged ? RangeOf(spec, range.first, range.systems) : spec;
  std::vector<int64_t> rhs_shape = e.rhs_shape;
  if (ranged) {
    if (rhs_shape.size() != 2 || rhs_shape[0] != spec.batch)
      return absl::InvalidArgumentError(
          absl::StrCat("first_system: this system's right-hand side has shape ",
                       absl::StrJoin(rhs_shape, ", "), ", not [batch, n]: solve it whole"));
    rhs_shape[0] = range.systems;
  }
  RequestRegions regions(&memory_, call.identity);
  if (auto st = ApplyUpdates(e, step, &regions, sample); !st.ok()) return st;
  auto rhs_in =
      ResolveArray(step.rhs, &regions, "rhs", int(spec.elem_bytes()), RegionUse::kBackend);
  if (!rhs_in.ok()) return rhs_in.status();
  // A large right-hand side's values, and one in a client's device memory: checked on the
  // device where the backend can.
  const bool on_device = rhs_in->on_device ||
                         (backend_info_.checks_finite && rhs_in->bytes >= kDeviceCheckBytes);
  auto rhs = CheckRhs(rspec, rhs_shape, *rhs_in, options_.limits, /*check_finite=*/false);
  if (!rhs.ok()) {
    if (!ranged) return rhs.status();
    return absl::Status(rhs.status().code(),
                        absl::StrCat("systems [", range.first, ", ", range.first + range.systems,
                                     ") of the batch: ", rhs.status().message()));
  }
  rhs->first_system = range.first;
  if (!on_device)
    if (auto st = CheckRhsValues(rspec, *rhs); !st.ok()) return st;
  sample.bytes_in += rhs_in->bytes;
  std::byte* x_out = nullptr;
  bool x_on_device = false;
  const int64_t x_bytes = rhs_in->bytes;
  if (step.has_x_region) {
    auto x = ResolveRegionRef("x_region", step.x_region, x_bytes, int(spec.elem_bytes()),
                              &regions, RegionUse::kBackend, &x_on_device);
    if (!x.ok()) return x.status();
    const auto* r = static_cast<const std::byte*>(rhs->data);
    if (*x < r + x_bytes && r < *x + x_bytes)
      return absl::InvalidArgumentError("x_region: overlaps rhs (x needs memory of its own)");
    x_out = *x;
  }
  call.receive_us = Micros(Clock::now() - call.start);
  const int64_t unknowns = rhs->k * rspec.rhs_values();
  auto res = Admit(call, unknowns, [&](const SolveControl& control) {
    SolveControl c = control;
    c.check_finite = on_device;
    // (The residual would read device memory back: the client has it there.)
    return RunPrepared(*backend_, system, rhs->data, rhs->k, Layout::kFlat,
                       step.skip_residual || rhs_in->on_device || x_on_device, c, x_out, range);
  }, backend_->WorkerOf(system));
  if (on_device)
    if (auto st = AfterDeviceCheck(res.status(), res.ok() && res->info.inputs_checked,
                                   [&] {
                                     return CheckRhsValues(rspec, *rhs, rhs_in->on_device,
                                                           ReadDevice());
                                   });
        !st.ok())
      return st;
  if (!res.ok()) return res.status();
  if (auto st = regions.AfterUse(); !st.ok()) return st;
  systems_.Touch(e, true, false);
  FillSample(unknowns, *res, call.receive_us, call.queue_us, &sample);
  Answer a;
  a.precision = spec.precision;
  a.x_shape = rhs->shape;
  a.summary = Summarize(call, spec.family, rhs->k * rspec.batch, *res);
  a.summary.handle = e.handle;
  a.summary.right_hand_sides = rhs->k;
  a.result = *std::move(res);
  // The backend's call on the host's clock beside the device's own account of its copies and
  // kernels: what a call costs past its transfers shows as their difference.
  spdlog::debug(
      "[req {}] {} {} k={} -> ok={}/{} residual={:.3g} total={:.3f} ms (receive {:.3f}, queue "
      "{:.3f}, backend {:.3f}: h2d {:.3f} kernels {:.3f} d2h {:.3f})",
      call.id, call.rpc, e.handle, rhs->k, a.summary.outcomes[0], a.summary.systems,
      a.summary.residual, a.summary.total_us / 1e3, call.receive_us / 1e3, call.queue_us / 1e3,
      a.result.compute_us / 1e3, a.summary.h2d_us / 1e3, a.summary.compute_us / 1e3,
      a.summary.d2h_us / 1e3);
  return a;
}

absl::StatusOr<SystemView> Core::UpdateSystem(Call& call, const std::string& handle,
                                              const StepRequest& updates) {
  auto use = systems_.Acquire(call.identity, handle);
  if (!use.ok()) return use.status();
  SystemRegistry::Entry& e = **use;
  std::lock_guard<std::mutex> order(e.mu);
  if (e.gone) return absl::NotFoundError("the system was released, expired or evicted");
  call.sample.family = std::string(FamilyName(e.system->spec().family));
  RequestRegions regions(&memory_, call.identity);
  if (auto st = ApplyUpdates(e, updates, &regions, call.sample); !st.ok()) return st;
  if (auto st = regions.AfterUse(); !st.ok())
    return absl::Status(st.code(), absl::StrCat(st.message(), "; the update read zeros there: "
                                                "update the system again or release it"));
  if (updates.updates.empty()) systems_.Touch(e, false, true);
  return ViewOf(e);
}

absl::StatusOr<SystemView> Core::ReleaseSystem(Call& call, const std::string& handle) {
  auto e = systems_.Remove(call.identity, handle);
  if (!e.ok()) return e.status();
  std::lock_guard<std::mutex> order((*e)->mu);  // after the calls in flight on it
  SystemView v = ViewOf(**e);
  (*e)->system.reset();  // the memory goes back now, not when the last reference does
  return v;
}

std::vector<SystemView> Core::ListSystems(Call& call) {
  std::vector<SystemView> out;
  for (const auto& e : systems_.List(call.identity)) {
    std::lock_guard<std::mutex> order(e->mu);  // after the call in flight on it, if any
    if (e->system) out.push_back(ViewOf(*e));
  }
  return out;
}

// ---- registered memory -----------------------------------------------------------------------

absl::StatusOr<RegionInfo> Core::RegisterMemory(Call& call, const std::string& name,
                                                const std::string& key, int64_t offset,
                                                int64_t bytes, double ttl_s) {
  return memory_.Register(call.identity, name, key, offset, bytes, ttl_s);
}

absl::StatusOr<RegionInfo> Core::RegisterCudaMemory(Call& call, const std::string& name,
                                                    const std::string& handle, int device,
                                                    int64_t offset, int64_t bytes, double ttl_s) {
  return memory_.RegisterCuda(call.identity, name, handle, device, offset, bytes, ttl_s);
}

absl::StatusOr<RegionInfo> Core::AllocateMemory(Call& call, const std::string& name,
                                                int64_t bytes, double ttl_s) {
  return memory_.Allocate(call.identity, name, bytes, ttl_s);
}

absl::StatusOr<RegionInfo> Core::UnregisterMemory(Call& call, const std::string& name) {
  return memory_.Unregister(call.identity, name);
}

std::vector<RegionInfo> Core::ListMemory(Call& call) { return memory_.List(call.identity); }

absl::StatusOr<std::shared_ptr<Region>> Core::FindRegion(Call& call, const std::string& name) {
  auto r = memory_.Find(call.identity, name, "region");
  if (r.ok() && (*r)->on_device())
    return absl::FailedPreconditionError(absl::StrCat(
        "region: '", (*r)->name(), "' is CUDA memory of the client's: read and write it there"));
  return r;
}

DeviceReader Core::ReadDevice() {
  return [backend = backend_.get()](void* host, const void* device, int64_t bytes) {
    return backend->CopyFromDevice(host, device, bytes);
  };
}

}  // namespace trisolve::server
