#include "service.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

struct SolverService::Call {
  Call(std::string id_, const char* rpc_, grpc::ServerContext* ctx_)
      : id(std::move(id_)), rpc(rpc_), ctx(ctx_) {}
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
      options_(options),
      admission_(options.max_concurrent_jobs, options.max_queued_jobs),
      started_(Clock::now()) {}

absl::Status SolverService::Authenticate(grpc::ServerContext* ctx) const {
  if (options_.tokens.empty()) return absl::OkStatus();
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end())
    return absl::UnauthenticatedError(
        "missing bearer token (metadata 'authorization: Bearer <token>')");
  const std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (value.size() <= kBearer.size() || value.compare(0, kBearer.size(), kBearer.data()) != 0)
    return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
  const std::string token = value.substr(kBearer.size());
  // Compare against every token, each in time independent of where they differ.
  bool match = false;
  for (const std::string& t : options_.tokens) {
    unsigned diff = t.size() != token.size();
    for (size_t i = 0; i < t.size(); ++i) diff |= unsigned(t[i] ^ (i < token.size() ? token[i] : 0));
    match |= diff == 0;
  }
  if (!match) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
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
  return metrics_.Render(backend_->Info(), admission_.running(), admission_.queued());
}

bool SolverService::Drain(std::chrono::system_clock::time_point deadline) {
  admission_.Shutdown();
  return admission_.WaitIdle(deadline);
}

absl::StatusOr<JobResult> SolverService::Admit(Call& call, const Job& job) {
  const auto t0 = Clock::now();
  Admission::Slot slot;
  grpc::ServerContext* ctx = call.ctx;
  absl::Status st = admission_.Acquire(call.deadline, [ctx] { return ctx->IsCancelled(); }, &slot);
  call.queue_us = Micros(Clock::now() - t0);
  if (!st.ok()) return st;
  const auto deadline = call.deadline;
  SolveControl control;
  control.cancelled = [ctx, deadline] {
    return ctx->IsCancelled() || std::chrono::system_clock::now() >= deadline;
  };
  auto res = RunJob(*backend_, job, control);
  if (!res.ok() && res.status().code() == absl::StatusCode::kCancelled &&
      std::chrono::system_clock::now() + Admission::kDeadlineSkew >= deadline)
    return absl::DeadlineExceededError("the deadline passed while the job was running");
  return res;
}

namespace {

void FillSummary(const Job& job, const JobResult& r, const BackendInfo& be, const std::string& id,
                 double receive_us, double queue_us, double total_us, v1::SolveSummary* s) {
  s->set_method(r.info.method);
  s->set_backend(be.name);
  s->set_systems(job.batch);
  int64_t counts[4] = {0, 0, 0, 0};
  for (SystemStatus st : r.status) ++counts[static_cast<int>(st)];
  s->set_ok(counts[0]);
  s->set_singular(counts[1]);
  s->set_not_converged(counts[2]);
  s->set_diverged(counts[3]);
  s->set_iterations(r.info.iterations);
  s->set_residual(job.family == Family::kBlockTridiagonal ? r.info.residual : r.backward_error);
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
  if (it != md.end() && !it->second.empty() && it->second.size() <= 64)
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

void FillSample(const Job& job, const JobResult& r, double receive_us, double queue_us,
                CallSample* sample) {
  sample->solved = true;
  sample->method = r.info.method;
  sample->queue_s = queue_us * 1e-6;
  sample->transfer_s = (receive_us + r.info.h2d_us + r.info.d2h_us) * 1e-6;
  sample->compute_s = (r.info.kernel_us > 0 ? r.info.kernel_us : r.compute_us) * 1e-6;
  sample->bytes_out = int64_t(r.x.size());
  sample->unknowns = job.unknowns();
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
  if (auto st = Authenticate(ctx); !st.ok()) return Finish(call, sample, st);
  auto job = JobFromRequest(req, options_.limits);
  call.receive_us = Micros(Clock::now() - call.start);
  if (!job.ok()) return Finish(call, sample, job.status());
  sample.bytes_in = job->total_bytes();
  auto res = Admit(call, *job);
  if (!res.ok()) return Finish(call, sample, res.status());
  resp->set_dtype(job->precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  for (int64_t d : job->arrays.at(job->x_field).shape) resp->mutable_x()->add_shape(d);
  FillSample(*job, *res, call.receive_us, call.queue_us, &sample);
  resp->mutable_x()->mutable_data()->swap(res->x);
  resp->mutable_status()->Reserve(static_cast<int>(res->status.size()));
  for (SystemStatus st : res->status) resp->add_status(ToProto(st));
  FillSummary(*job, *res, backend_info_, call.id, call.receive_us, call.queue_us,
              Micros(Clock::now() - call.start), resp->mutable_summary());
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
  if (auto st = Authenticate(ctx); !st.ok()) return Finish(call, sample, st);
  v1::StreamRequest msg;
  if (!stream->Read(&msg))
    return Finish(call, sample,
                  absl::InvalidArgumentError("part: the stream ended before its header"));
  auto job = JobFromStreamHeader(msg, options_.limits);
  if (!job.ok()) return Finish(call, sample, job.status());
  sample.family = std::string(FamilyName(job->family));
  sample.method = MethodLabel(job->family, job->method);
  while (stream->Read(&msg)) {
    if (!msg.has_chunk())
      return Finish(call, sample,
                    absl::InvalidArgumentError("part: only chunks may follow the header"));
    if (auto st = AppendChunk(*job, msg.chunk()); !st.ok()) return Finish(call, sample, st);
  }
  if (ctx->IsCancelled())
    return Finish(call, sample, absl::CancelledError("the client cancelled the call"));
  if (auto st = FinishStreamedJob(*job); !st.ok()) return Finish(call, sample, st);
  sample.bytes_in = job->total_bytes();
  call.receive_us = Micros(Clock::now() - call.start);
  auto res = Admit(call, *job);
  if (!res.ok()) return Finish(call, sample, res.status());
  FillSample(*job, *res, call.receive_us, call.queue_us, &sample);
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
  FillSummary(*job, *res, backend_info_, call.id, call.receive_us, call.queue_us,
              Micros(Clock::now() - call.start), out.mutable_summary());
  LogDone(call.id, rpc, *job, out.summary());
  if (!stream->Write(out)) return Finish(call, sample, gone);
  return Finish(call, sample, absl::OkStatus());
}

grpc::Status SolverService::GetServerInfo(grpc::ServerContext* ctx, const v1::GetServerInfoRequest*,
                                          v1::ServerInfo* resp) {
  if (auto st = Authenticate(ctx); !st.ok()) {
    Call call{RequestId(ctx, next_id_), "GetServerInfo", ctx};
    CallSample sample;
    sample.rpc = "GetServerInfo";
    sample.family = sample.method = "-";
    return Finish(call, sample, st);
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
  resp->set_jobs_in_flight(admission_.running());
  resp->set_jobs_queued(admission_.queued());
  resp->set_jobs_done(admission_.done());
  resp->set_uptime_s(std::chrono::duration<double>(Clock::now() - started_).count());
  return grpc::Status::OK;
}

}  // namespace trisolve::server
