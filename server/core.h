// The transport-neutral core of trisolved: admission (the large and small jobs' pools), the
// receive budget, the batcher of small unary requests, the persistent systems, the registered
// memory, the backend and the metrics. A transport (service.cc: gRPC) authenticates its caller,
// translates its messages into the plain requests below (translate.h), calls the core, and
// translates the answers back. Nothing here knows protobuf, gRPC or CUDA.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "admission.h"
#include "batcher.h"
#include "health.h"
#include "job.h"
#include "memory.h"
#include "metrics.h"
#include "systems.h"
#include "trisolve/backend.h"

namespace trisolve::server {

struct CoreOptions {
  JobLimits limits;
  int max_concurrent_jobs = 2;
  int max_queued_jobs = 64;
  // Applied to calls that carry no deadline (0: none), and the cap on any deadline (0: none).
  double default_deadline_s = 0;
  double max_deadline_s = 0;
  // Persistent systems: caps and time-to-live.
  SystemLimits systems;
  // Jobs of at most this many unknowns take a slot of their own pool (max_concurrent_small_jobs),
  // so that small requests are not queued behind two large ones (0: every job shares one pool).
  int64_t small_job_unknowns = 1 << 16;
  int max_concurrent_small_jobs = 64;
  // Streamed requests being received: the bytes their headers declare, together, and how many
  // at once (admitted at the header; memory is taken as chunks arrive).
  int64_t max_receiving_bytes = int64_t{16} << 30;
  int max_receiving_streams = 16;
  // Shared-memory regions of clients on this host.
  MemoryLimits memory;
  // Small unary requests solved together in one backend call.
  BatchOptions batching;
  // A log line (info) for every answered solve; failures are logged (warn) either way.
  bool log_answers = true;
};

// One call as the core sees it, whatever transport brought it. The transport sets the id, the
// method name, the identity, the deadline and how to tell that its caller went away; the core
// fills the timings and the metrics sample.
// Counts the calls alive in the process (open streams among them): what a server whose
// backend was lost waits for before it exits (health.h). Copies count as calls of their own.
struct LiveCall {
  LiveCall() { count().fetch_add(1); }
  LiveCall(const LiveCall&) : LiveCall() {}
  LiveCall& operator=(const LiveCall&) { return *this; }
  ~LiveCall() { count().fetch_sub(1); }
  static std::atomic<int64_t>& count();
};

// Where a call is, for a transport that reports progress (SolveWithProgress). Phases only
// move forward.
struct ProgressEvent {
  enum Phase { kReceived = 1, kQueued = 2, kSolving = 3, kSending = 4 };
  Phase phase = kReceived;
  int64_t bytes_done = 0, bytes_total = 0;
  int64_t iteration = 0;  // iterative solves, kSolving (the residual NaN until known)
  double residual = std::numeric_limits<double>::quiet_NaN();
};

struct Call {
  using Clock = std::chrono::steady_clock;
  Call(std::string id_, const char* rpc_) : id(std::move(id_)), rpc(rpc_) {}
  LiveCall live;
  std::string id;
  const char* rpc;
  std::string identity;
  Clock::time_point start = Clock::now();
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::function<bool()> cancelled;
  // Set by a transport that reports progress (empty: nobody asked, nothing is reported). Called
  // on the thread running the call, the solver's among them: it must be quick.
  std::function<void(const ProgressEvent&)> progress;
  double receive_us = 0, queue_us = 0;
  CallSample sample;
};

// What an answer says besides x: the method run, the systems by outcome, where the time went.
struct AnswerSummary {
  std::string method, backend, request_id, handle;
  int64_t systems = 0;
  std::array<int64_t, 4> outcomes{};  // ok, singular, not_converged, diverged
  int64_t iterations = 0;
  double residual = 0;
  double receive_us = 0, queue_us = 0, h2d_us = 0, compute_us = 0, d2h_us = 0, residual_us = 0,
         total_us = 0;
  int batched_with = 0;       // unary calls: requests solved in the same backend call (1: alone)
  int64_t batch_systems = 0;  // and that call's systems, when batched
  int64_t right_hand_sides = 0;
  std::vector<ResidualPoint> residual_history;  // where the request asked (Job::history_limit)
};

// A solve's answer: x (in result.x unless written into the caller's memory), its shape and
// precision, the per-system statuses and the summary.
struct Answer {
  JobResult result;
  std::vector<int64_t> x_shape;
  Precision precision = Precision::kFloat64;
  AnswerSummary summary;
};

// One time step of a persistent system (SolveSystem, a SolveSystemStream message): updates
// applied in order, then the right-hand sides solved.
struct StepRequest {
  std::string handle;
  std::vector<std::pair<std::string, ArrayArg>> updates;
  ArrayArg rhs;
  bool has_x_region = false;
  RegionRef x_region;
  bool skip_residual = false;
  // A range of the batch's systems (systems 0: all); no updates with one.
  int64_t first_system = 0, systems = 0;
  // Copies of message bytes that were not aligned (ArrayArg::data may point here).
  std::deque<std::string> scratch;
};

// A persistent system as listed.
struct SystemView {
  std::string handle, label, method, prepared;
  Family family = Family::kTridiagonal;
  Precision precision = Precision::kFloat64;
  Layout layout = Layout::kFlat;
  std::vector<int64_t> rhs_shape;
  int64_t systems = 1;    // the batch's (a tree's cells)
  bool variable = false;  // systems of different sizes: rhs_shape [total]
  int64_t bytes = 0, solves = 0, updates = 0;
  double ttl_s = 0, idle_s = 0;
};

// The core's state now, for GetServerInfo.
struct CoreStatus {
  BackendInfo backend;
  int64_t jobs_in_flight = 0, jobs_queued = 0, jobs_done = 0;
  int64_t systems = 0, system_bytes = 0, memory_regions = 0, memory_region_bytes = 0;
  std::string replica;
  double uptime_s = 0;
  double cpu_s = 0;  // the process's CPU time, user and system
};

// The process's CPU time so far (user and system, every thread), in seconds.
double ProcessCpuSeconds();

class Core {
 public:
  Core(std::unique_ptr<Backend> backend, CoreOptions options);
  ~Core();

  const CoreOptions& options() const { return options_; }
  const BackendInfo& backend_info() const { return backend_info_; }
  SystemRegistry& systems() { return systems_; }
  // Lost (a sticky device error): the core refuses work and trisolved exits (health.h).
  BackendHealth& health() { return health_; }
  // Calls alive (LiveCall), open streams among them.
  static int64_t open_calls() { return LiveCall::count().load(); }
  CoreStatus Status() const;

  // The call's own deadline (max: none), or the server's default when it has none, capped by
  // the maximum.
  std::chrono::system_clock::time_point EffectiveDeadline(
      std::chrono::system_clock::time_point client_deadline) const;
  bool shutting_down() const { return admission_.shutting_down(); }
  // Refuse new work (UNAVAILABLE) and wait until the deadline for running jobs to finish.
  bool Drain(std::chrono::system_clock::time_point deadline);

  // Records the call's metrics sample with `st`'s code and logs a failure; returns `st`.
  absl::Status Finish(Call& call, const absl::Status& st);
  // A call refused before it reached the core (unauthenticated): counted, nothing else.
  void Record(const CallSample& sample) { metrics_.Record(sample); }
  // The Prometheus exposition of everything so far.
  std::string RenderMetrics() const;

  // The caller's registered memory, for a translation that resolves region references.
  RequestRegions Regions(const std::string& identity) { return RequestRegions(&memory_, identity); }
  // Holds `bytes` of the receive budget for a streamed request until `hold` is destroyed.
  absl::Status ReserveReceive(int64_t bytes, ReceiveBudget::Hold* hold) {
    return receiving_.Reserve(bytes, hold);
  }

  // A whole job (unary, or streamed and assembled): admitted, batched with others of its kind
  // where it can be, solved. call.receive_us is the transport's.
  absl::StatusOr<Answer> Solve(Call& call, const Job& job);

  // Persistent systems.
  absl::StatusOr<SystemView> CreateSystem(Call& call, const Job& job, const std::string& label,
                                          double ttl_s);
  absl::StatusOr<Answer> SolveSystem(Call& call, const StepRequest& step);
  absl::StatusOr<SystemView> UpdateSystem(Call& call, const std::string& handle,
                                          const StepRequest& updates);
  absl::StatusOr<SystemView> ReleaseSystem(Call& call, const std::string& handle);
  std::vector<SystemView> ListSystems(Call& call);

  // Registered memory.
  absl::StatusOr<RegionInfo> RegisterMemory(Call& call, const std::string& name,
                                            const std::string& key, int64_t offset,
                                            int64_t bytes, double ttl_s);
  absl::StatusOr<RegionInfo> RegisterCudaMemory(Call& call, const std::string& name,
                                                const std::string& handle, int device,
                                                int64_t offset, int64_t bytes, double ttl_s);
  absl::StatusOr<RegionInfo> AllocateMemory(Call& call, const std::string& name, int64_t bytes,
                                            double ttl_s);
  absl::StatusOr<RegionInfo> UnregisterMemory(Call& call, const std::string& name);
  std::vector<RegionInfo> ListMemory(Call& call);
  // A region the transport reads or writes on the host (ReadMemory, WriteMemory):
  // FAILED_PRECONDITION for a client's CUDA memory.
  absl::StatusOr<std::shared_ptr<Region>> FindRegion(Call& call, const std::string& name);
  // Whether `region` is still the identity's `name` (a request ring's liveness check; not a use).
  bool HoldsRegion(const std::string& identity, const std::string& name, const Region* region) const {
    return memory_.Holds(identity, name, region);
  }

 private:
  // Runs `run` once a slot of the pool for `unknowns` is free (deadline, cancellation and
  // shutdown as Admission says). A large job bound to one of several workers (`worker`: a
  // persistent system's device, Backend::WorkerOf) first takes a slot of that worker's share.
  absl::StatusOr<JobResult> Admit(
      Call& call, int64_t unknowns,
      const std::function<absl::StatusOr<JobResult>(const SolveControl&)>& run,
      int worker = -1);
  // Every pool: the large jobs', the small jobs', the workers' shares.
  std::vector<Admission*> Pools();
  // Jobs waiting in any pool.
  int64_t QueuedJobs() const;
  absl::Status ApplyUpdates(SystemRegistry::Entry& e, const StepRequest& step,
                            RegionResolver* regions, CallSample& sample);
  SystemView ViewOf(const SystemRegistry::Entry& e) const;
  // Copies a client's device memory to the host, for the checks that name a bad value.
  DeviceReader ReadDevice();
  AnswerSummary Summarize(const Call& call, Family family, int64_t systems,
                          const JobResult& r) const;

  std::unique_ptr<Backend> backend_;
  BackendInfo backend_info_;
  BackendHealth health_;
  const CoreOptions options_;
  Admission admission_;
  Admission small_admission_;
  // With several workers, each one's share of max_concurrent_jobs, taken before a slot of
  // admission_ by the large solves of the systems it holds: with one pool only, the solves of
  // one device's systems could hold every slot while another device idled.
  std::vector<std::unique_ptr<Admission>> worker_admission_;
  std::atomic<int64_t> memory_retries_{0};  // Admit's runs again after MemoryHeldByOthers
  static constexpr int kMemoryRetries = 16;  // a job's most
  ReceiveBudget receiving_;
  SystemRegistry systems_;
  MemoryRegistry memory_;  // after the backend, which unpins its regions
  Metrics metrics_;
  std::unique_ptr<Batcher> batcher_;
  const std::chrono::steady_clock::time_point started_;
};

// A metrics label for the requested method: its name when it is one, never free text.
std::string MethodLabel(Family f, const std::string& method);

}  // namespace trisolve::server
