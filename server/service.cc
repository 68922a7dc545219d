#include "service.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "spdlog/spdlog.h"

#ifndef TRISOLVE_VERSION
#define TRISOLVE_VERSION "dev"
#endif

namespace trisolve::server {
namespace {

using Clock = std::chrono::steady_clock;

grpc::Status ToGrpc(const absl::Status& st) {
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

v1::SystemStatus ToProto(SystemStatus s) { return static_cast<v1::SystemStatus>(s); }

}  // namespace

namespace {
std::atomic<int64_t> live_calls{0};  // Calls alive: a process has one service
}  // namespace

int64_t SolverService::open_calls() const { return live_calls.load(); }

struct SolverService::Call {
  Call(std::string id_, const char* rpc_, grpc::ServerContext* ctx_)
      : id(std::move(id_)), rpc(rpc_), ctx(ctx_) {
    live_calls.fetch_add(1);
  }
  ~Call() { live_calls.fetch_sub(1); }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  std::string id;
  const char* rpc;
  grpc::ServerContext* ctx;
  Clock::time_point start = Clock::now();
  std::chrono::system_clock::time_point deadline;
  double receive_us = 0, queue_us = 0;
};

SolverService::SolverService(std::unique_ptr<Backend> backend, ServiceOptions options)
    : backend_(std::move(backend)),
      backend_info_(backend_->Info()),
      health_(backend_.get()),
      options_(options),
      tokens_(std::make_shared<const BearerTokens>(options.tokens)),
      admission_(options.max_concurrent_jobs, options.max_queued_jobs),
      small_admission_(std::max(1, options.max_concurrent_small_jobs), options.max_queued_jobs),
      receiving_(options.max_receiving_bytes, std::max(1, options.max_receiving_streams)),
      systems_(options.systems),
      memory_(options.memory, backend_.get()),
      started_(Clock::now()) {
  // A lost backend: queued calls are refused, new ones too (health.h).
  health_.OnLost([this] {
    admission_.Shutdown();
    small_admission_.Shutdown();
  });
}

absl::StatusOr<std::string> SolverService::Authenticate(grpc::ServerContext* ctx) const {
  // A client certificate (mutual TLS) names its holder.
  std::string cert;
  if (auto auth = ctx->auth_context(); auth && auth->IsPeerAuthenticated()) {
    for (const auto& id : auth->GetPeerIdentity())
      cert = absl::StrCat("cert:", absl::string_view(id.data(), id.size()));
  }
  if (tokens_->empty()) return cert.empty() ? std::string("shared") : cert;
  // The credentials refused a call without a valid token before its message was read; the
  // identity is derived here again from the same metadata.
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  return tokens_->Check(it == md.end() ? std::nullopt
                                       : std::optional<absl::string_view>(absl::string_view(
                                             it->second.data(), it->second.size())));
}

void SolverService::RecordUnauthenticated(absl::string_view path, absl::string_view message) {
  // The path is the client's: a metrics label only when it names a method of the service.
  CallSample sample;
  const absl::string_view prefix = "/trisolve.v1.Solver/";
  static const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::Solver::service_full_name());
  sample.rpc = "unknown";
  if (absl::StartsWith(path, prefix) && service != nullptr &&
      service->FindMethodByName(std::string(path.substr(prefix.size()))) != nullptr)
    sample.rpc = std::string(path.substr(prefix.size()));
  sample.family = sample.method = "-";
  sample.code = absl::StatusCodeToString(absl::StatusCode::kUnauthenticated);
  metrics_.Record(sample);
  spdlog::warn("[req -] {} rejected before its message was read: UNAUTHENTICATED {}",
               Sanitized(path), std::string(message));
}

grpc::Status SolverService::Finish(Call& call, CallSample& sample, const absl::Status& st) {
  sample.code = absl::StatusCodeToString(st.code());
  metrics_.Record(sample);
  if (!st.ok())
    spdlog::warn("[req {}] {} {}: {} {}", call.id, call.rpc,
                 st.code() == absl::StatusCode::kInvalidArgument ||
                         st.code() == absl::StatusCode::kUnauthenticated
                     ? "rejected"
                     : "failed",
                 absl::StatusCodeToString(st.code()), std::string(st.message()));
  return ToGrpc(st);
}

std::string SolverService::RenderMetrics() const {
  std::string out = metrics_.Render(backend_->Info(), admission_.running() + small_admission_.running(),
                                    admission_.queued() + small_admission_.queued());
  absl::StrAppend(&out,
                  "# HELP trisolve_systems Persistent systems held (every identity).\n"
                  "# TYPE trisolve_systems gauge\ntrisolve_systems ", systems_.count(), "\n",
                  "# HELP trisolve_system_bytes Memory the persistent systems hold.\n"
                  "# TYPE trisolve_system_bytes gauge\ntrisolve_system_bytes ", systems_.bytes(),
                  "\n");
  out += health_.RenderMetrics();
  return out;
}

bool SolverService::Drain(std::chrono::system_clock::time_point deadline) {
  admission_.Shutdown();
  small_admission_.Shutdown();
  const bool big = admission_.WaitIdle(deadline);
  return small_admission_.WaitIdle(deadline) && big;
}

absl::StatusOr<JobResult> SolverService::Admit(
    Call& call, int64_t unknowns,
    const std::function<absl::StatusOr<JobResult>(const SolveControl&)>& run) {
  const auto t0 = Clock::now();
  Admission::Slot slot;
  grpc::ServerContext* ctx = call.ctx;
  Admission& pool = unknowns <= options_.small_job_unknowns ? small_admission_ : admission_;
  absl::Status st = pool.Acquire(call.deadline, [ctx] { return ctx->IsCancelled(); }, &slot);
  call.queue_us = Micros(Clock::now() - t0);
  if (!st.ok()) return st;
  const auto deadline = call.deadline;
  SolveControl control;
  BackendHealth* health = &health_;  // a lost backend's running calls stop (health.h)
  control.cancelled = [ctx, deadline, health] {
    return ctx->IsCancelled() || std::chrono::system_clock::now() >= deadline ||
           health->stop_running();
  };
  auto res = run(control);
  if (!res.ok()) res = health_.Check(res.status());  // UNAVAILABLE where the backend is lost
  if (!res.ok() && res.status().code() == absl::StatusCode::kCancelled &&
      std::chrono::system_clock::now() + Admission::kDeadlineSkew >= deadline)
    return absl::DeadlineExceededError("the deadline passed while the job was running");
  return res;
}

absl::StatusOr<JobResult> SolverService::Admit(Call& call, const Job& job) {
  return Admit(call, job.unknowns(),
               [&](const SolveControl& control) { return RunJob(*backend_, job, control); });
}

namespace {

void FillSummary(Family family, int64_t systems, const JobResult& r, const BackendInfo& be,
                 const std::string& id, double receive_us, double queue_us, double total_us,
                 v1::SolveSummary* s) {
  s->set_method(r.info.method);
  s->set_backend(be.name);
  s->set_systems(systems);
  int64_t counts[4] = {0, 0, 0, 0};
  for (SystemStatus st : r.status) ++counts[static_cast<int>(st)];
  s->set_ok(counts[0]);
  s->set_singular(counts[1]);
  s->set_not_converged(counts[2]);
  s->set_diverged(counts[3]);
  s->set_iterations(r.info.iterations);
  s->set_residual(family == Family::kBlockTridiagonal ? r.info.residual : r.backward_error);
  s->set_request_id(id);
  v1::Timings* t = s->mutable_timings();
  t->set_receive_us(receive_us);
  t->set_queue_us(queue_us);
  t->set_h2d_us(r.info.h2d_us);
  t->set_compute_us(r.info.kernel_us > 0 ? r.info.kernel_us : r.compute_us);
  t->set_d2h_us(r.info.d2h_us);
  t->set_residual_us(r.residual_us);
  t->set_total_us(total_us);
}

void LogDone(const std::string& id, const char* rpc, const Job& job, const v1::SolveSummary& s) {
  spdlog::info(
      "[req {}] {} {} {} batch={} n={} method={} -> ok={} singular={} not_converged={} "
      "diverged={} iterations={} residual={} total={:.3f} ms (queue {:.3f}, compute {:.3f})",
      id, rpc, std::string(FamilyName(job.family)),
      job.precision == Precision::kFloat64 ? "float64" : "float32", job.batch,
      job.family == Family::kBlockTridiagonal ? absl::StrCat(job.block_N, "x", job.block_M)
                                              : std::to_string(job.n),
      s.method(), s.ok(), s.singular(), s.not_converged(), s.diverged(), s.iterations(),
      // NaN: the client asked for no residual (skip_residual), or no system was OK.
      std::isnan(s.residual()) ? std::string("not computed") : fmt::format("{:.3g}", s.residual()),
      s.timings().total_us() / 1e3, s.timings().queue_us() / 1e3,
      s.timings().compute_us() / 1e3);
}

// The call's own deadline, or the server's default when it has none, capped by the maximum.
std::chrono::system_clock::time_point EffectiveDeadline(std::chrono::system_clock::time_point d,
                                                       const ServiceOptions& o) {
  const auto now = std::chrono::system_clock::now();
  auto after = [&](double s) { return now + std::chrono::microseconds(int64_t(s * 1e6)); };
  if (o.default_deadline_s > 0 && d == std::chrono::system_clock::time_point::max())
    d = after(o.default_deadline_s);
  if (o.max_deadline_s > 0) d = std::min(d, after(o.max_deadline_s));
  return d;
}

std::string RequestId(grpc::ServerContext* ctx, std::atomic<int64_t>& next) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("x-request-id");
  // Taken only when it is a short token: it goes into every log line of the request.
  if (it != md.end() && !it->second.empty() && it->second.size() <= 64 &&
      std::all_of(it->second.begin(), it->second.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' ||
               ch == '.' || ch == ':';
      }))
    return std::string(it->second.data(), it->second.size());
  return std::to_string(next.fetch_add(1));
}

}  // namespace

namespace {

// A metrics label for the requested method: its name when it is one, never free text.
std::string MethodLabel(Family f, const std::string& m) {
  if (m.empty()) return "auto";
  bool known = false;
  switch (f) {
    case Family::kTridiagonal: known = ParseTridiagonalMethod(m).ok(); break;
    case Family::kTree: known = ParseTreeMethod(m).ok(); break;
    case Family::kBlockTridiagonal: known = ParseBlockMethod(m).ok(); break;
    case Family::kDense: known = ParseDenseMethod(m).ok(); break;
  }
  return known ? m : "invalid";
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
  for (SystemStatus st : r.status) ++sample->outcomes[static_cast<size_t>(st)];
}

}  // namespace

template <typename Req>
grpc::Status SolverService::HandleUnary(grpc::ServerContext* ctx, const char* rpc, Family family,
                                        const Req& req, v1::SolveResponse* resp) {
  Call call{RequestId(ctx, next_id_), rpc, ctx};
  call.deadline = EffectiveDeadline(ctx->deadline(), options_);
  CallSample sample;
  sample.rpc = rpc;
  sample.family = std::string(FamilyName(family));
  sample.method = MethodLabel(family, req.method());
  if (admission_.shutting_down())
    return Finish(call, sample, absl::UnavailableError("the server is shutting down"));
  auto identity = Authenticate(ctx);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  RequestRegions regions(&memory_, *identity);
  auto job = JobFromRequest(req, options_.limits, DeclareOptions{.regions = &regions});
  call.receive_us = Micros(Clock::now() - call.start);
  if (!job.ok()) return Finish(call, sample, job.status());
  sample.bytes_in = job->total_bytes();
  auto res = Admit(call, *job);
  if (!res.ok()) return Finish(call, sample, res.status());
  resp->set_dtype(job->precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  for (int64_t d : job->arrays.at(job->x_field).shape) resp->mutable_x()->add_shape(d);
  FillSample(job->unknowns(), *res, call.receive_us, call.queue_us, &sample);
  resp->mutable_x()->mutable_data()->swap(res->x);
  resp->mutable_status()->Reserve(static_cast<int>(res->status.size()));
  for (SystemStatus st : res->status) resp->add_status(ToProto(st));
  FillSummary(job->family, job->batch, *res, backend_info_, call.id, call.receive_us,
              call.queue_us, Micros(Clock::now() - call.start), resp->mutable_summary());
  if (job->shared_matrix) resp->mutable_summary()->set_right_hand_sides(job->batch);
  LogDone(call.id, rpc, *job, resp->summary());
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::SolveTridiagonal(grpc::ServerContext* ctx,
                                             const v1::TridiagonalRequest* req,
                                             v1::SolveResponse* resp) {
  return HandleUnary(ctx, "SolveTridiagonal", Family::kTridiagonal, *req, resp);
}
grpc::Status SolverService::SolveTree(grpc::ServerContext* ctx, const v1::TreeRequest* req,
                                      v1::SolveResponse* resp) {
  return HandleUnary(ctx, "SolveTree", Family::kTree, *req, resp);
}
grpc::Status SolverService::SolveBlockTridiagonal(grpc::ServerContext* ctx,
                                                  const v1::BlockTridiagonalRequest* req,
                                                  v1::SolveResponse* resp) {
  return HandleUnary(ctx, "SolveBlockTridiagonal", Family::kBlockTridiagonal, *req, resp);
}
grpc::Status SolverService::SolveDense(grpc::ServerContext* ctx, const v1::DenseRequest* req,
                                       v1::SolveResponse* resp) {
  return HandleUnary(ctx, "SolveDense", Family::kDense, *req, resp);
}

grpc::Status SolverService::SolveStream(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::StreamResponse, v1::StreamRequest>* stream) {
  const char* rpc = "SolveStream";
  Call call{RequestId(ctx, next_id_), rpc, ctx};
  call.deadline = EffectiveDeadline(ctx->deadline(), options_);
  CallSample sample;
  sample.rpc = rpc;
  sample.family = "unknown";
  sample.method = "unknown";
  if (admission_.shutting_down())
    return Finish(call, sample, absl::UnavailableError("the server is shutting down"));
  if (auto id = Authenticate(ctx); !id.ok()) return Finish(call, sample, id.status());
  // The server's own deadline, where it is tighter than the client's (which gRPC enforces),
  // ends the call however silent the client is.
  std::unique_ptr<DeadlineWatch::Guard> watch;
  if (call.deadline < ctx->deadline())
    watch = deadline_watch_.Watch(call.deadline, [ctx] { ctx->TryCancel(); });
  const auto ended = [&](const char* phase) {
    if (std::chrono::system_clock::now() + Admission::kDeadlineSkew >= call.deadline)
      return absl::DeadlineExceededError(
          absl::StrCat("the deadline passed while the job was ", phase));
    return absl::CancelledError(absl::StrCat("the client cancelled the call while the job was ",
                                             phase));
  };
  v1::StreamRequest msg;
  if (!stream->Read(&msg))
    return Finish(call, sample,
                  ctx->IsCancelled() ? ended("awaiting its header")
                                     : absl::InvalidArgumentError("part: the stream ended before its header"));
  auto job = JobFromStreamHeader(msg, options_.limits);
  if (!job.ok()) return Finish(call, sample, job.status());
  sample.family = std::string(FamilyName(job->family));
  sample.method = MethodLabel(job->family, job->method);
  ReceiveBudget::Hold hold;
  if (auto st = receiving_.Reserve(job->total_bytes(), &hold); !st.ok())
    return Finish(call, sample, st);
  while (stream->Read(&msg)) {
    if (!msg.has_chunk())
      return Finish(call, sample,
                    absl::InvalidArgumentError("part: only chunks may follow the header"));
    if (auto st = AppendChunk(*job, msg.chunk()); !st.ok()) return Finish(call, sample, st);
  }
  if (ctx->IsCancelled()) return Finish(call, sample, ended("being received"));
  if (auto st = FinishStreamedJob(*job); !st.ok()) return Finish(call, sample, st);
  sample.bytes_in = job->total_bytes();
  call.receive_us = Micros(Clock::now() - call.start);
  auto res = Admit(call, *job);
  if (!res.ok()) return Finish(call, sample, res.status());
  FillSample(job->unknowns(), *res, call.receive_us, call.queue_us, &sample);
  const absl::Status gone = absl::CancelledError("the client went away");

  const int64_t chunk = std::max<int64_t>(options_.stream_chunk_bytes, 1024);
  const std::string& x = res->x;
  v1::StreamResponse out;
  out.set_dtype(job->precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  for (int64_t d : job->arrays.at(job->x_field).shape) out.add_x_shape(d);
  int64_t off = 0;
  do {
    const int64_t len = std::min<int64_t>(chunk, int64_t(x.size()) - off);
    v1::Chunk* c = out.mutable_chunk();
    c->set_array("x");
    c->set_offset(off);
    c->set_data(x.data() + off, static_cast<size_t>(len));
    off += len;
    if (!stream->Write(out)) return Finish(call, sample, gone);
    out.Clear();
  } while (off < int64_t(x.size()));
  const size_t per_msg = static_cast<size_t>(chunk);  // statuses: one byte each on the wire
  for (size_t i = 0; i < res->status.size(); i += per_msg) {
    const size_t end = std::min(res->status.size(), i + per_msg);
    for (size_t k = i; k < end; ++k) out.add_status(ToProto(res->status[k]));
    if (end < res->status.size()) {
      if (!stream->Write(out)) return Finish(call, sample, gone);
      out.Clear();
    }
  }
  FillSummary(job->family, job->batch, *res, backend_info_, call.id, call.receive_us,
              call.queue_us, Micros(Clock::now() - call.start), out.mutable_summary());
  if (job->shared_matrix) out.mutable_summary()->set_right_hand_sides(job->batch);
  LogDone(call.id, rpc, *job, out.summary());
  if (!stream->Write(out)) return Finish(call, sample, gone);
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::GetServerInfo(grpc::ServerContext* ctx, const v1::GetServerInfoRequest*,
                                          v1::ServerInfo* resp) {
  if (auto id = Authenticate(ctx); !id.ok()) {
    Call call{RequestId(ctx, next_id_), "GetServerInfo", ctx};
    CallSample sample;
    sample.rpc = "GetServerInfo";
    sample.family = sample.method = "-";
    return Finish(call, sample, id.status());
  }
  resp->set_version(TRISOLVE_VERSION);
  const BackendInfo info = backend_->Info();  // fresh: free device memory changes
  resp->set_backend(info.name);
  resp->set_cpu_threads(info.threads);
  for (const DeviceInfo& d : info.devices) {
    v1::Device* dev = resp->add_devices();
    dev->set_name(d.name);
    dev->set_total_memory_bytes(d.total_memory_bytes);
    dev->set_free_memory_bytes(d.free_memory_bytes);
    dev->set_compute_capability(
        absl::StrCat(d.compute_capability_major, ".", d.compute_capability_minor));
    dev->set_multiprocessors(d.multiprocessors);
    dev->set_ordinal(d.ordinal);
    if (d.jobs >= 0) dev->set_jobs(d.jobs);
    if (d.jobs_in_flight >= 0) dev->set_jobs_in_flight(d.jobs_in_flight);
  }
  for (const MemoryPoolInfo& p : info.pools) {
    v1::MemoryPool* mp = resp->add_pools();
    mp->set_name(p.name);
    mp->set_cap_bytes(p.cap_bytes);
    mp->set_cached_bytes(p.cached_bytes);
    mp->set_in_use_bytes(p.in_use_bytes);
    mp->set_peak_bytes(p.peak_bytes);
    mp->set_hits(p.hits);
    mp->set_misses(p.misses);
    mp->set_evictions(p.evictions);
  }
  v1::Limits* l = resp->mutable_limits();
  l->set_max_message_bytes(options_.max_message_bytes);
  l->set_max_job_bytes(options_.limits.max_job_bytes);
  l->set_max_job_unknowns(options_.limits.max_job_unknowns);
  l->set_max_concurrent_jobs(options_.max_concurrent_jobs);
  l->set_max_queued_jobs(options_.max_queued_jobs);
  l->set_max_systems_per_identity(options_.systems.max_per_identity);
  l->set_max_system_bytes(options_.systems.max_bytes);
  l->set_max_system_ttl_s(options_.systems.max_ttl_s);
  resp->set_jobs_in_flight(admission_.running() + small_admission_.running());
  resp->set_jobs_queued(admission_.queued() + small_admission_.queued());
  resp->set_jobs_done(admission_.done() + small_admission_.done());
  resp->set_systems(systems_.count());
  resp->set_system_bytes(systems_.bytes());
  resp->set_memory_regions(memory_.count());
  resp->set_memory_region_bytes(memory_.bytes());
  l->set_shared_memory(options_.memory.enabled);
  l->set_max_region_bytes(options_.memory.max_bytes_per_identity);
  l->set_max_regions_per_identity(options_.memory.max_regions_per_identity);
  resp->set_replica(systems_.replica_address());
  resp->set_uptime_s(std::chrono::duration<double>(Clock::now() - started_).count());
  return grpc::Status::OK;
}


// ---- persistent systems ----------------------------------------------------------------------

namespace {

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

}  // namespace

absl::StatusOr<std::string> SolverService::Open(Call& call, CallSample& sample,
                                                bool refuse_when_draining) {
  call.deadline = EffectiveDeadline(call.ctx->deadline(), options_);
  sample.rpc = call.rpc;
  sample.family = sample.method = "-";
  if (refuse_when_draining && admission_.shutting_down())
    return absl::UnavailableError("the server is shutting down");
  return Authenticate(call.ctx);
}

// The caller holds e.mu (e.system is there, and stays).
void SolverService::FillSystemInfo(const SystemRegistry::Entry& e, v1::SystemInfo* info) const {
  const SystemSpec& s = e.system->spec();
  info->set_handle(e.handle);
  info->set_label(e.label);
  info->set_family(std::string(FamilyName(s.family)));
  info->set_dtype(s.precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  info->set_layout(s.layout == Layout::kFlat ? v1::FLAT : v1::INTERLEAVED);
  info->set_method(std::string(SpecMethodName(s)));
  info->set_prepared(e.system->prepared());
  for (int64_t d : e.rhs_shape) info->add_rhs_shape(d);
  const SystemRegistry::Usage u = systems_.UsageOf(e);
  info->set_bytes(u.bytes);
  info->set_ttl_s(e.ttl_s);
  info->set_idle_s(u.idle_s);
  info->set_solves(u.solves);
  info->set_updates(u.updates);
}

grpc::Status SolverService::CreateSystem(grpc::ServerContext* ctx,
                                         const v1::CreateSystemRequest* req,
                                         v1::SystemInfo* resp) {
  Call call{RequestId(ctx, next_id_), "CreateSystem", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/true);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  RequestRegions regions(&memory_, *identity);
  auto job = JobFromCreateSystem(*req, options_.limits, &regions);
  if (!job.ok()) return Finish(call, sample, job.status());
  sample.family = std::string(FamilyName(job->family));
  if (!std::isfinite(req->ttl_s()) || req->ttl_s() < 0)
    return Finish(call, sample, absl::InvalidArgumentError(absl::StrCat(
                                    "ttl_s is ", req->ttl_s(), ", expected >= 0 (0: the default)")));
  if (auto st = CheckLabel(req->label()); !st.ok()) return Finish(call, sample, st);
  if (auto st = systems_.Reserve(*identity, job->total_bytes()); !st.ok())
    return Finish(call, sample, st);
  sample.bytes_in = job->total_bytes();
  std::unique_ptr<PreparedSystem> prepared;
  auto res = Admit(call, job->unknowns(), [&](const SolveControl&) -> absl::StatusOr<JobResult> {
    auto p = backend_->Prepare(job->Spec());
    if (!p.ok()) return p.status();
    prepared = *std::move(p);
    return JobResult{};
  });
  if (!res.ok()) return Finish(call, sample, res.status());
  sample.method = std::string(SpecMethodName(prepared->spec()));
  auto entry = systems_.Add(*identity, req->label(), req->ttl_s(), std::move(prepared),
                            job->CoefficientShapes(), job->SystemRhsShape());
  if (!entry.ok()) return Finish(call, sample, entry.status());
  {
    std::lock_guard<std::mutex> order((*entry)->mu);
    FillSystemInfo(**entry, resp);
  }
  spdlog::info("[req {}] CreateSystem {} {} {} ({}): {} bytes, {}", call.id, resp->handle(),
               resp->family(), resp->label().empty() ? "-" : resp->label(), resp->method(),
               resp->bytes(), resp->prepared());
  return Finish(call, sample, absl::OkStatus());
}

absl::Status SolverService::SolveStep(Call& call, const std::string& identity,
                                      const v1::SolveSystemRequest& req, const std::string& handle,
                                      CallSample& sample, v1::SolveResponse* resp) {
  auto use = systems_.Acquire(identity, handle);
  if (!use.ok()) return use.status();
  SystemRegistry::Entry& e = **use;
  std::lock_guard<std::mutex> order(e.mu);  // this system's calls, one at a time, in order
  if (e.gone)
    return absl::NotFoundError("the system was released, expired or evicted");
  PreparedSystem& system = *e.system;
  const SystemSpec& spec = system.spec();
  sample.family = std::string(FamilyName(spec.family));
  sample.method = std::string(SpecMethodName(spec));
  RequestRegions regions(&memory_, identity);
  if (auto st = ApplyUpdates(e, req.update(), &regions, sample); !st.ok()) return st;
  std::string rhs_scratch;
  auto rhs_in = ArrayFromProto(req.rhs(), &rhs_scratch, &regions, "rhs", spec.elem_bytes());
  if (!rhs_in.ok()) return rhs_in.status();
  auto rhs = CheckRhs(spec, e.rhs_shape, *rhs_in, options_.limits);
  if (!rhs.ok()) return rhs.status();
  sample.bytes_in += rhs_in->bytes;
  std::byte* x_out = nullptr;
  const int64_t x_bytes = rhs_in->bytes;
  if (req.has_x_region()) {
    auto x = ResolveXRegion(req.x_region(), x_bytes, spec.elem_bytes(), &regions);
    if (!x.ok()) return x.status();
    const auto* r = static_cast<const std::byte*>(rhs->data);
    if (*x < r + x_bytes && r < *x + x_bytes)
      return absl::InvalidArgumentError("x_region: overlaps rhs (x needs memory of its own)");
    x_out = *x;
  }
  call.receive_us = Micros(Clock::now() - call.start);
  const int64_t unknowns = rhs->k * spec.rhs_values();
  auto res = Admit(call, unknowns, [&](const SolveControl& control) {
    return RunPrepared(*backend_, system, rhs->data, rhs->k, Layout::kFlat, req.skip_residual(),
                       control, x_out);
  });
  if (!res.ok()) return res.status();
  systems_.Touch(e, true, false);
  FillSample(unknowns, *res, call.receive_us, call.queue_us, &sample);
  resp->set_dtype(spec.precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  for (int64_t d : rhs->shape) resp->mutable_x()->add_shape(d);
  resp->mutable_x()->mutable_data()->swap(res->x);
  resp->mutable_status()->Reserve(static_cast<int>(res->status.size()));
  for (SystemStatus st : res->status) resp->add_status(ToProto(st));
  v1::SolveSummary* sum = resp->mutable_summary();
  FillSummary(spec.family, rhs->k * spec.batch, *res, backend_info_, call.id, call.receive_us,
              call.queue_us, Micros(Clock::now() - call.start), sum);
  sum->set_handle(e.handle);
  sum->set_right_hand_sides(rhs->k);
  spdlog::debug("[req {}] {} {} k={} -> ok={}/{} residual={:.3g} total={:.3f} ms", call.id,
                call.rpc, e.handle, rhs->k, sum->ok(), sum->systems(), sum->residual(),
                sum->timings().total_us() / 1e3);
  return absl::OkStatus();
}

absl::Status SolverService::ApplyUpdates(
    SystemRegistry::Entry& e, const google::protobuf::RepeatedPtrField<v1::NamedArray>& update,
    RegionResolver* regions, CallSample& sample) {
  const SystemSpec& spec = e.system->spec();
  std::string scratch;
  for (const v1::NamedArray& u : update) {
    const int eb = spec.family == Family::kTree && u.name() == "parent" ? 4 : spec.elem_bytes();
    auto in = ArrayFromProto(u.array(), &scratch, regions, "update", eb);
    if (!in.ok()) return in.status();
    auto checked = CheckUpdate(spec, e.coefficient_shapes, u.name(), *in);
    if (!checked.ok()) return checked.status();
    if (auto st = e.system->Update(checked->index, checked->data); !st.ok())
      return health_.Check(st);
    sample.bytes_in += in->bytes;
  }
  if (!update.empty()) systems_.Touch(e, false, true);
  return absl::OkStatus();
}

grpc::Status SolverService::SolveSystem(grpc::ServerContext* ctx,
                                        const v1::SolveSystemRequest* req,
                                        v1::SolveResponse* resp) {
  Call call{RequestId(ctx, next_id_), "SolveSystem", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/true);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  return Finish(call, sample, SolveStep(call, *identity, *req, req->handle(), sample, resp));
}

grpc::Status SolverService::UpdateSystem(grpc::ServerContext* ctx,
                                         const v1::UpdateSystemRequest* req,
                                         v1::SystemInfo* resp) {
  Call call{RequestId(ctx, next_id_), "UpdateSystem", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/true);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  auto use = systems_.Acquire(*identity, req->handle());
  if (!use.ok()) return Finish(call, sample, use.status());
  SystemRegistry::Entry& e = **use;
  std::lock_guard<std::mutex> order(e.mu);
  if (e.gone)
    return Finish(call, sample, absl::NotFoundError("the system was released, expired or evicted"));
  sample.family = std::string(FamilyName(e.system->spec().family));
  RequestRegions regions(&memory_, *identity);
  if (auto st = ApplyUpdates(e, req->update(), &regions, sample); !st.ok())
    return Finish(call, sample, st);
  if (req->update().empty()) systems_.Touch(e, false, true);
  FillSystemInfo(e, resp);
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::ReleaseSystem(grpc::ServerContext* ctx, const v1::SystemRequest* req,
                                          v1::SystemInfo* resp) {
  Call call{RequestId(ctx, next_id_), "ReleaseSystem", ctx};
  CallSample sample;
  // Releasing and listing stay open while draining: they free memory, or only read.
  auto identity = Open(call, sample, /*refuse_when_draining=*/false);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  auto e = systems_.Remove(*identity, req->handle());
  if (!e.ok()) return Finish(call, sample, e.status());
  {
    std::lock_guard<std::mutex> order((*e)->mu);  // after the calls in flight on it
    FillSystemInfo(**e, resp);
    (*e)->system.reset();  // the memory goes back now, not when the last reference does
  }
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::ListSystems(grpc::ServerContext* ctx, const v1::ListSystemsRequest*,
                                        v1::ListSystemsResponse* resp) {
  Call call{RequestId(ctx, next_id_), "ListSystems", ctx};
  CallSample sample;
  // Releasing and listing stay open while draining: they free memory, or only read.
  auto identity = Open(call, sample, /*refuse_when_draining=*/false);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  for (const auto& e : systems_.List(*identity)) {
    std::lock_guard<std::mutex> order(e->mu);  // after the call in flight on it, if any
    if (e->system) FillSystemInfo(*e, resp->add_systems());
  }
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::SolveSystemStream(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::SolveResponse, v1::SolveSystemRequest>* stream) {
  Call call{RequestId(ctx, next_id_), "SolveSystemStream", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/true);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  // One thread reads, solves and writes, in turn: a client that sends step i + 1 before answer
  // i arrives has it carried by the transport meanwhile (HTTP/2 flow control holds back one that
  // runs further ahead), and an error ends the stream with its own status, not a cancellation.
  std::string handle;
  int64_t steps = 0;
  absl::Status st;
  v1::SolveSystemRequest msg;
  while (stream->Read(&msg)) {
    if (steps == 0) {
      handle = msg.handle();
      if (handle.empty()) {
        st = absl::InvalidArgumentError("handle: the stream's first message must name the system");
        break;
      }
    } else if (!msg.handle().empty() && msg.handle() != handle) {
      st = absl::InvalidArgumentError(
          "handle: a time-step stream solves one system; later messages repeat its handle or "
          "leave it empty");
      break;
    }
    if (admission_.shutting_down()) {
      st = absl::UnavailableError("the server is shutting down");
      break;
    }
    call.start = Clock::now();
    v1::SolveResponse resp;
    st = SolveStep(call, *identity, msg, handle, sample, &resp);
    if (!st.ok()) break;
    ++steps;
    if (!stream->Write(resp)) {
      st = absl::CancelledError("the client went away");
      break;
    }
  }
  if (st.ok() && ctx->IsCancelled()) st = absl::CancelledError("the client cancelled the call");
  if (st.ok())
    spdlog::info("[req {}] SolveSystemStream {}: {} steps", call.id, handle.empty() ? "-" : handle,
                 steps);
  return Finish(call, sample, st);
}


// ---- shared memory ---------------------------------------------------------------------------

namespace {

void FillRegion(const RegionInfo& r, v1::MemoryRegion* out) {
  out->set_name(r.name);
  out->set_key(r.key);
  out->set_bytes(r.bytes);
  out->set_pinned(r.pinned);
  out->set_ttl_s(r.ttl_s);
  out->set_idle_s(r.idle_s);
  out->set_uses(r.uses);
  out->set_server_owned(r.server_owned);
}

}  // namespace

grpc::Status SolverService::RegisterSharedMemory(grpc::ServerContext* ctx,
                                                 const v1::RegisterSharedMemoryRequest* req,
                                                 v1::MemoryRegion* resp) {
  Call call{RequestId(ctx, next_id_), "RegisterSharedMemory", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/true);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  auto r = memory_.Register(*identity, req->name(), req->key(), req->offset(), req->bytes(),
                            req->ttl_s());
  if (!r.ok()) return Finish(call, sample, r.status());
  FillRegion(*r, resp);
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::UnregisterMemory(grpc::ServerContext* ctx,
                                             const v1::UnregisterMemoryRequest* req,
                                             v1::MemoryRegion* resp) {
  Call call{RequestId(ctx, next_id_), "UnregisterMemory", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/false);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  auto r = memory_.Unregister(*identity, req->name());
  if (!r.ok()) return Finish(call, sample, r.status());
  FillRegion(*r, resp);
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::AllocateMemory(grpc::ServerContext* ctx,
                                           const v1::AllocateMemoryRequest* req,
                                           v1::MemoryRegion* resp) {
  Call call{RequestId(ctx, next_id_), "AllocateMemory", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/true);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  auto r = memory_.Allocate(*identity, req->name(), req->bytes(), req->ttl_s());
  if (!r.ok()) return Finish(call, sample, r.status());
  FillRegion(*r, resp);
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::WriteMemory(grpc::ServerContext* ctx,
                                        grpc::ServerReader<v1::MemoryChunk>* reader,
                                        v1::MemoryRegion* resp) {
  Call call{RequestId(ctx, next_id_), "WriteMemory", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/true);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  // The server's deadline ends a stream however silent its client is (as SolveStream's).
  std::unique_ptr<DeadlineWatch::Guard> watch;
  if (call.deadline < ctx->deadline())
    watch = deadline_watch_.Watch(call.deadline, [ctx] { ctx->TryCancel(); });
  std::shared_ptr<Region> region;
  v1::MemoryChunk c;
  int64_t written = 0;
  while (reader->Read(&c)) {
    if (!region || c.region() != region->name()) {
      auto r = memory_.Find(*identity, c.region(), "region");
      if (!r.ok()) return Finish(call, sample, r.status());
      region = *std::move(r);
    }
    const int64_t len = int64_t(c.data().size());
    if (c.offset() < 0 || c.offset() > region->bytes() || len > region->bytes() - c.offset())
      return Finish(call, sample,
                    absl::InvalidArgumentError(absl::StrCat(
                        "offset: [", c.offset(), ", ", c.offset() + len, ") lies outside region '",
                        region->name(), "' of ", region->bytes(), " bytes")));
    std::memcpy(region->base() + c.offset(), c.data().data(), size_t(len));
    written += len;
  }
  sample.bytes_in = written;
  if (ctx->IsCancelled())
    return Finish(call, sample,
                  std::chrono::system_clock::now() + Admission::kDeadlineSkew >= call.deadline
                      ? absl::DeadlineExceededError("the deadline passed while writing memory")
                      : absl::CancelledError("the client cancelled the call"));
  if (region) {
    resp->set_name(region->name());
    resp->set_bytes(region->bytes());
    resp->set_pinned(region->pinned());
    resp->set_server_owned(region->server_owned());
  }
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::ReadMemory(grpc::ServerContext* ctx, const v1::ReadMemoryRequest* req,
                                       grpc::ServerWriter<v1::MemoryChunk>* writer) {
  Call call{RequestId(ctx, next_id_), "ReadMemory", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/false);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  auto r = memory_.Find(*identity, req->region(), "region");
  if (!r.ok()) return Finish(call, sample, r.status());
  const Region& region = **r;
  const int64_t off = req->offset();
  const int64_t bytes = req->bytes() == 0 ? region.bytes() - std::max<int64_t>(off, 0) : req->bytes();
  if (off < 0 || bytes < 0 || off > region.bytes() || bytes > region.bytes() - off)
    return Finish(call, sample,
                  absl::InvalidArgumentError(absl::StrCat("offset, bytes: [", off, ", ", off + bytes,
                                                          ") lies outside region '", region.name(),
                                                          "' of ", region.bytes(), " bytes")));
  if (auto st = region.StillMapped("region"); !st.ok()) return Finish(call, sample, st);
  const int64_t chunk = std::max<int64_t>(options_.stream_chunk_bytes, 1024);
  v1::MemoryChunk msg;
  for (int64_t done = 0; done < bytes; done += chunk) {
    const int64_t len = std::min(chunk, bytes - done);
    msg.set_region(done == 0 ? region.name() : "");
    msg.set_offset(off + done);
    msg.set_data(region.base() + off + done, size_t(len));
    if (!writer->Write(msg))
      return Finish(call, sample, absl::CancelledError("the client went away"));
  }
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::ListMemory(grpc::ServerContext* ctx, const v1::ListMemoryRequest*,
                                       v1::ListMemoryResponse* resp) {
  Call call{RequestId(ctx, next_id_), "ListMemory", ctx};
  CallSample sample;
  auto identity = Open(call, sample, /*refuse_when_draining=*/false);
  if (!identity.ok()) return Finish(call, sample, identity.status());
  for (const RegionInfo& r : memory_.List(*identity)) FillRegion(r, resp->add_regions());
  return Finish(call, sample, absl::OkStatus());
}

}  // namespace trisolve::server
