#include "service.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

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

std::string RequestId(grpc::ServerContextBase* ctx, std::atomic<int64_t>& next) {
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

int64_t SaturatingAdd(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }

// The values an array holds, by its shape (inline or by reference alike) or its bytes, whichever
// is larger; a shape that cannot be counted counts as too many.
int64_t ArrayValues(const v1::Array& a) {
  int64_t n = 1;
  for (int64_t d : a.shape()) {
    if (d < 0) return INT64_MAX;
    if (d != 0 && n > INT64_MAX / d) return INT64_MAX;
    n *= d;
  }
  if (a.has_region()) {
    if (a.shape_size() == 0 && a.region().bytes() <= 0) return INT64_MAX;
    n = std::max<int64_t>(n, a.region().bytes() / 4);
  }
  return std::max<int64_t>(n, int64_t(a.data().size()) / 4);
}

// The largest array of a unary request: what decides whether it is solved on gRPC's thread.
int64_t LargestArray(const google::protobuf::Message& m) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  int64_t most = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated() ||
        f->message_type() != v1::Array::descriptor() || !r->HasField(m, f))
      continue;
    most = std::max(most, ArrayValues(static_cast<const v1::Array&>(r->GetMessage(m, f))));
  }
  return most;
}

// A step by handle: its right-hand sides and updates together.
int64_t StepValues(const v1::SolveSystemRequest& req) {
  int64_t n = ArrayValues(req.rhs());
  for (const v1::NamedArray& u : req.update()) n = SaturatingAdd(n, ArrayValues(u.array()));
  return n;
}

int DefaultCallWorkers(const ServiceOptions& o) {
  const int64_t n = int64_t(o.max_concurrent_jobs) + o.max_concurrent_small_jobs +
                    o.max_queued_jobs + 16;
  return int(std::min<int64_t>(n, 4096));
}

}  // namespace

SolverService::SolverService(std::unique_ptr<Backend> backend, ServiceOptions options)
    : options_(options),
      tokens_(std::make_shared<const BearerTokens>(options.tokens)),
      core_(std::move(backend), options),
      workers_(options.call_workers > 0 ? options.call_workers : DefaultCallWorkers(options),
               std::max(16, options.max_queued_jobs)) {}

Call SolverService::Begin(grpc::ServerContextBase* ctx, const char* rpc) {
  Call call(RequestId(ctx, next_id_), rpc);
  call.deadline = core_.EffectiveDeadline(ctx->deadline());
  call.cancelled = [ctx] { return ctx->IsCancelled(); };
  call.sample.rpc = rpc;
  call.sample.family = call.sample.method = "-";
  return call;
}

absl::StatusOr<std::string> SolverService::Authenticate(grpc::ServerContextBase* ctx) const {
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

absl::Status SolverService::Open(grpc::ServerContextBase* ctx, Call& call,
                                 bool refuse_when_draining) {
  if (refuse_when_draining && core_.shutting_down())
    return absl::UnavailableError("the server is shutting down");
  auto identity = Authenticate(ctx);
  if (!identity.ok()) return identity.status();
  call.identity = *std::move(identity);
  return absl::OkStatus();
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
  core_.Record(sample);
  spdlog::warn("[req -] {} rejected before its message was read: UNAUTHENTICATED {}",
               Sanitized(path), std::string(message));
}

grpc::Status SolverService::Finish(Call& call, const absl::Status& st) {
  return ToGrpc(core_.Finish(call, st));
}

// ---- whole jobs ------------------------------------------------------------------------------

void SolverService::Dispatch(grpc::CallbackServerContext* ctx, const char* rpc, int64_t values,
                             bool unary, grpc::ServerUnaryReactor* reactor,
                             std::function<void()> run) {
  // Solved here only when it is as short as the hand-off it saves: a small job whose pool has a
  // free slot (no wait in admission, no batch to join).
  if (options_.inline_max_values > 0 && values <= options_.inline_max_values &&
      core_.WouldStartNow(values, unary)) {
    run();
    return;
  }
  if (workers_.Post(std::move(run))) return;
  Call call = Begin(ctx, rpc);
  reactor->Finish(Finish(call, absl::ResourceExhaustedError(
                                   "every call worker is busy and their queue is full; try "
                                   "again later")));
}

template <typename Req>
grpc::ServerUnaryReactor* SolverService::ServeUnary(grpc::CallbackServerContext* ctx,
                                                    const char* rpc, Family family,
                                                    const Req* req, v1::SolveResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // The block family iterates for as long as its options say, whatever its size.
  const int64_t values = family == Family::kBlockTridiagonal ? INT64_MAX : LargestArray(*req);
  Dispatch(ctx, rpc, values, /*unary=*/true, reactor,
           [this, ctx, rpc, family, req, resp, reactor] {
             reactor->Finish(HandleUnary(ctx, rpc, family, *req, resp));
           });
  return reactor;
}

template <typename Req>
grpc::Status SolverService::HandleUnary(grpc::ServerContextBase* ctx, const char* rpc, Family family,
                                        const Req& req, v1::SolveResponse* resp) {
  Call call = Begin(ctx, rpc);
  call.sample.family = std::string(FamilyName(family));
  call.sample.method = MethodLabel(family, req.method());
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  RequestRegions regions = core_.Regions(call.identity);
  auto job = JobFromRequest(req, options_.limits, DeclareOptions{.regions = &regions});
  call.receive_us = Micros(Clock::now() - call.start);
  if (!job.ok()) return Finish(call, job.status());
  auto answer = core_.Solve(call, *job);
  if (!answer.ok()) return Finish(call, answer.status());
  AnswerToProto(*answer, resp);
  return Finish(call, absl::OkStatus());
}

grpc::ServerUnaryReactor* SolverService::SolveTridiagonal(grpc::CallbackServerContext* ctx,
                                                          const v1::TridiagonalRequest* req,
                                                          v1::SolveResponse* resp) {
  return ServeUnary(ctx, "SolveTridiagonal", Family::kTridiagonal, req, resp);
}
grpc::ServerUnaryReactor* SolverService::SolveTree(grpc::CallbackServerContext* ctx,
                                                   const v1::TreeRequest* req,
                                                   v1::SolveResponse* resp) {
  return ServeUnary(ctx, "SolveTree", Family::kTree, req, resp);
}
grpc::ServerUnaryReactor* SolverService::SolveBlockTridiagonal(
    grpc::CallbackServerContext* ctx, const v1::BlockTridiagonalRequest* req,
    v1::SolveResponse* resp) {
  return ServeUnary(ctx, "SolveBlockTridiagonal", Family::kBlockTridiagonal, req, resp);
}
grpc::ServerUnaryReactor* SolverService::SolveDense(grpc::CallbackServerContext* ctx,
                                                    const v1::DenseRequest* req,
                                                    v1::SolveResponse* resp) {
  return ServeUnary(ctx, "SolveDense", Family::kDense, req, resp);
}

grpc::Status SolverService::SolveStream(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::StreamResponse, v1::StreamRequest>* stream) {
  Call call = Begin(ctx, "SolveStream");
  call.sample.family = call.sample.method = "unknown";
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
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
    return Finish(call, ctx->IsCancelled()
                            ? ended("awaiting its header")
                            : absl::InvalidArgumentError("part: the stream ended before its header"));
  auto job = JobFromStreamHeader(msg, options_.limits);
  if (!job.ok()) return Finish(call, job.status());
  call.sample.family = std::string(FamilyName(job->family));
  call.sample.method = MethodLabel(job->family, job->method);
  ReceiveBudget::Hold hold;
  if (auto st = core_.ReserveReceive(job->total_bytes(), &hold); !st.ok())
    return Finish(call, st);
  while (stream->Read(&msg)) {
    if (!msg.has_chunk())
      return Finish(call, absl::InvalidArgumentError("part: only chunks may follow the header"));
    if (auto st = AppendChunk(*job, msg.chunk()); !st.ok()) return Finish(call, st);
  }
  if (ctx->IsCancelled()) return Finish(call, ended("being received"));
  if (auto st = FinishStreamedJob(*job); !st.ok()) return Finish(call, st);
  call.receive_us = Micros(Clock::now() - call.start);
  auto answer = core_.Solve(call, *job);
  if (!answer.ok()) return Finish(call, answer.status());
  const absl::Status gone = absl::CancelledError("the client went away");

  const int64_t chunk = std::max<int64_t>(options_.stream_chunk_bytes, 1024);
  const std::string& x = answer->result.x;
  const std::vector<SystemStatus>& status = answer->result.status;
  v1::StreamResponse out;
  out.set_dtype(answer->precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  for (int64_t d : answer->x_shape) out.add_x_shape(d);
  int64_t off = 0;
  do {
    const int64_t len = std::min<int64_t>(chunk, int64_t(x.size()) - off);
    v1::Chunk* c = out.mutable_chunk();
    c->set_array("x");
    c->set_offset(off);
    c->set_data(x.data() + off, static_cast<size_t>(len));
    off += len;
    if (!stream->Write(out)) return Finish(call, gone);
    out.Clear();
  } while (off < int64_t(x.size()));
  const size_t per_msg = static_cast<size_t>(chunk);  // statuses: one byte each on the wire
  for (size_t i = 0; i < status.size(); i += per_msg) {
    const size_t end = std::min(status.size(), i + per_msg);
    for (size_t k = i; k < end; ++k) out.add_status(static_cast<v1::SystemStatus>(status[k]));
    if (end < status.size()) {
      if (!stream->Write(out)) return Finish(call, gone);
      out.Clear();
    }
  }
  // The summary's total as the last message leaves, as before the chunks were written.
  answer->summary.total_us = Micros(Clock::now() - call.start);
  SummaryToProto(answer->summary, out.mutable_summary());
  if (!stream->Write(out)) return Finish(call, gone);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::GetServerInfo(grpc::ServerContext* ctx, const v1::GetServerInfoRequest*,
                                          v1::ServerInfo* resp) {
  if (auto id = Authenticate(ctx); !id.ok()) {
    Call call = Begin(ctx, "GetServerInfo");
    return Finish(call, id.status());
  }
  const CoreStatus st = core_.Status();
  const CoreOptions& o = core_.options();
  resp->set_version(TRISOLVE_VERSION);
  const BackendInfo& info = st.backend;
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
  l->set_max_job_bytes(o.limits.max_job_bytes);
  l->set_max_job_unknowns(o.limits.max_job_unknowns);
  l->set_max_concurrent_jobs(o.max_concurrent_jobs);
  l->set_max_queued_jobs(o.max_queued_jobs);
  l->set_max_systems_per_identity(o.systems.max_per_identity);
  l->set_max_system_bytes(o.systems.max_bytes);
  l->set_max_system_ttl_s(o.systems.max_ttl_s);
  if (o.batching.max_systems > 1) {
    l->set_batch_window_us(o.batching.window_us);
    l->set_max_batch_requests(int(std::min<int64_t>(o.batching.max_systems, INT32_MAX)));
    l->set_max_batch_systems(o.batching.max_systems);
    l->set_max_batch_bytes(o.batching.max_bytes);
  }
  resp->set_jobs_in_flight(st.jobs_in_flight);
  resp->set_jobs_queued(st.jobs_queued);
  resp->set_jobs_done(st.jobs_done);
  resp->set_systems(st.systems);
  resp->set_system_bytes(st.system_bytes);
  resp->set_memory_regions(st.memory_regions);
  resp->set_memory_region_bytes(st.memory_region_bytes);
  l->set_shared_memory(o.memory.enabled);
  l->set_max_region_bytes(o.memory.max_bytes_per_identity);
  l->set_max_regions_per_identity(o.memory.max_regions_per_identity);
  resp->set_replica(st.replica);
  resp->set_uptime_s(st.uptime_s);
  return grpc::Status::OK;
}

// ---- persistent systems ----------------------------------------------------------------------

grpc::Status SolverService::CreateSystem(grpc::ServerContext* ctx,
                                         const v1::CreateSystemRequest* req,
                                         v1::SystemInfo* resp) {
  Call call = Begin(ctx, "CreateSystem");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  RequestRegions regions = core_.Regions(call.identity);
  auto job = JobFromCreateSystem(*req, options_.limits, &regions);
  if (!job.ok()) return Finish(call, job.status());
  auto view = core_.CreateSystem(call, *job, req->label(), req->ttl_s());
  if (!view.ok()) return Finish(call, view.status());
  SystemInfoToProto(*view, resp);
  return Finish(call, absl::OkStatus());
}

grpc::ServerUnaryReactor* SolverService::SolveSystem(grpc::CallbackServerContext* ctx,
                                                     const v1::SolveSystemRequest* req,
                                                     v1::SolveResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  int64_t values = StepValues(*req);
  if (values <= options_.inline_max_values) {
    auto id = Authenticate(ctx);
    if (id.ok() && !core_.SolvesDirectlyNow(*id, req->handle())) values = INT64_MAX;
  }
  Dispatch(ctx, "SolveSystem", values, /*unary=*/false, reactor,
           [this, ctx, req, resp, reactor] {
             reactor->Finish(HandleSolveSystem(ctx, *req, resp));
           });
  return reactor;
}

grpc::Status SolverService::HandleSolveSystem(grpc::ServerContextBase* ctx,
                                              const v1::SolveSystemRequest& req,
                                              v1::SolveResponse* resp) {
  Call call = Begin(ctx, "SolveSystem");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  StepRequest step;
  StepFromProto(req, &step);
  auto answer = core_.SolveSystem(call, step);
  if (!answer.ok()) return Finish(call, answer.status());
  AnswerToProto(*answer, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::UpdateSystem(grpc::ServerContext* ctx,
                                         const v1::UpdateSystemRequest* req,
                                         v1::SystemInfo* resp) {
  Call call = Begin(ctx, "UpdateSystem");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  StepRequest updates;
  UpdatesFromProto(req->update(), &updates);
  auto view = core_.UpdateSystem(call, req->handle(), updates);
  if (!view.ok()) return Finish(call, view.status());
  SystemInfoToProto(*view, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::ReleaseSystem(grpc::ServerContext* ctx, const v1::SystemRequest* req,
                                          v1::SystemInfo* resp) {
  Call call = Begin(ctx, "ReleaseSystem");
  // Releasing and listing stay open while draining: they free memory, or only read.
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  auto view = core_.ReleaseSystem(call, req->handle());
  if (!view.ok()) return Finish(call, view.status());
  SystemInfoToProto(*view, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::ListSystems(grpc::ServerContext* ctx, const v1::ListSystemsRequest*,
                                        v1::ListSystemsResponse* resp) {
  Call call = Begin(ctx, "ListSystems");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  for (const SystemView& v : core_.ListSystems(call)) SystemInfoToProto(v, resp->add_systems());
  return Finish(call, absl::OkStatus());
}

// The time-step stream. Steps are read for as long as the client sends them, while earlier ones
// are solved and answered: a server that stops reading while it writes an answer blocks against
// a client that writes step k + j while answer k waits, once the bytes in flight exceed HTTP/2's
// flow-control window, and neither side moves again. What is read ahead is held against the
// receive budget (--max-receiving-bytes); past it the stream stops reading until a step is
// answered, and the transport's flow control holds the client back (back-pressure). One step is
// solved at a time, on a call worker, and its answer written while the next is solved; a bad
// step ends the stream with its own status once the answers before it are written.
class SolverService::StepStream final
    : public grpc::ServerBidiReactor<v1::SolveSystemRequest, v1::SolveResponse> {
 public:
  StepStream(SolverService* svc, grpc::CallbackServerContext* ctx)
      : svc_(svc), ctx_(ctx), call_(svc->Begin(ctx, "SolveSystemStream")) {
    if (auto st = svc_->Open(ctx, call_, /*refuse_when_draining=*/true); !st.ok()) {
      finished_ = true;
      Finish(svc_->Finish(call_, st));
      return;
    }
    reading_ = true;
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    reading_ = false;
    if (!ok) {
      eof_ = true;
    } else {
      auto msg = std::make_unique<v1::SolveSystemRequest>();
      msg->Swap(&incoming_);
      parked_ = std::move(msg);
      parked_bytes_ = std::max<int64_t>(1, int64_t(parked_->ByteSizeLong()));
    }
    Pump(std::move(lock));
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      write_failed_ = true;
      if (error_.ok()) error_ = absl::CancelledError("the client went away");
    }
    Pump(std::move(lock));
  }

  void OnDone() override { delete this; }

 private:
  struct Step {
    std::unique_ptr<v1::SolveSystemRequest> msg;
    int64_t bytes = 0;
  };

  // Decides, under the lock, what the stream does next, and does it after releasing it (gRPC's
  // operations and the workers are not called with the lock held).
  void Pump(std::unique_lock<std::mutex> lock) {
    bool read = false, write = false, finish = false;
    std::optional<Step> solve;
    absl::Status end;
    if (parked_ && error_.ok()) {
      // A step read: held against the budget, or kept back (no further read) until the steps
      // before it are answered and their bytes returned.
      const absl::Status st = svc_->core_.GrowReceive(parked_bytes_, &hold_);
      if (st.ok()) {
        queue_.push_back(Step{std::move(parked_), parked_bytes_});
        parked_.reset();
      } else if (queue_.empty() && !solving_ && !ready_) {
        error_ = st;  // alone over the budget: it never fits
      }
    }
    if (!error_.ok()) {
      // Nothing more is solved; what was read ahead goes.
      for (Step& s : queue_) svc_->core_.ShrinkReceive(s.bytes, &hold_);
      queue_.clear();
      parked_.reset();
    }
    if (!reading_ && !eof_ && !parked_ && error_.ok()) reading_ = read = true;
    if (ready_ && !writing_ && !write_failed_) {
      out_.Swap(&*ready_);
      ready_.reset();
      writing_ = write = true;
    } else if (ready_ && write_failed_) {
      ready_.reset();
    }
    if (!solving_ && !ready_ && !queue_.empty() && error_.ok()) {
      solving_ = true;
      solve = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!finished_ && !solving_ && !writing_ && !ready_ && !write &&
        (!error_.ok() || (eof_ && queue_.empty() && !parked_))) {
      finished_ = finish = true;
      end = error_;
      if (end.ok() && ctx_->IsCancelled()) end = absl::CancelledError("the client cancelled the call");
    }
    lock.unlock();
    if (read) StartRead(&incoming_);
    if (write) StartWrite(&out_);
    if (solve) {
      auto step = std::make_shared<Step>(std::move(*solve));
      if (!svc_->workers_.Post([this, step] { Solve(std::move(*step)); })) {
        std::unique_lock<std::mutex> again(mu_);
        solving_ = false;
        svc_->core_.ShrinkReceive(step->bytes, &hold_);
        if (error_.ok())
          error_ = absl::ResourceExhaustedError(
              "every call worker is busy and their queue is full; try again later");
        Pump(std::move(again));
        return;
      }
    }
    if (finish) {
      if (end.ok())
        spdlog::info("[req {}] SolveSystemStream {}: {} steps", call_.id,
                     handle_.empty() ? "-" : handle_, steps_);
      Finish(ToGrpc(svc_->core_.Finish(call_, end)));  // last: OnDone may follow at once
    }
  }

  // On a call worker; one step at a time, so handle_ and steps_ need no lock.
  void Solve(Step step) {
    absl::Status st;
    std::optional<v1::SolveResponse> resp;
    const v1::SolveSystemRequest& msg = *step.msg;
    if (steps_ == 0) {
      handle_ = msg.handle();
      if (handle_.empty())
        st = absl::InvalidArgumentError("handle: the stream's first message must name the system");
    } else if (!msg.handle().empty() && msg.handle() != handle_) {
      st = absl::InvalidArgumentError(
          "handle: a time-step stream solves one system; later messages repeat its handle or "
          "leave it empty");
    }
    if (st.ok() && svc_->core_.shutting_down()) st = absl::UnavailableError("the server is shutting down");
    if (st.ok()) {
      call_.start = Clock::now();
      StepRequest req;
      StepFromProto(msg, &req);
      req.handle = handle_;
      auto answer = svc_->core_.SolveSystem(call_, req);
      if (answer.ok()) {
        ++steps_;
        resp.emplace();
        AnswerToProto(*answer, &*resp);
      } else {
        st = answer.status();
      }
    }
    step.msg.reset();
    std::unique_lock<std::mutex> lock(mu_);
    solving_ = false;
    svc_->core_.ShrinkReceive(step.bytes, &hold_);
    if (!st.ok()) {
      if (error_.ok()) error_ = st;
    } else if (!write_failed_) {
      ready_ = std::move(resp);
    }
    Pump(std::move(lock));
  }

  SolverService* const svc_;
  grpc::CallbackServerContext* const ctx_;
  Call call_;
  std::string handle_;
  int64_t steps_ = 0;

  std::mutex mu_;
  v1::SolveSystemRequest incoming_;  // gRPC's while a read is outstanding
  std::unique_ptr<v1::SolveSystemRequest> parked_;  // read, not yet within the budget
  int64_t parked_bytes_ = 0;
  std::deque<Step> queue_;  // read ahead, within the budget
  ReceiveBudget::Hold hold_;
  std::optional<v1::SolveResponse> ready_;  // solved, waiting for the write before it
  v1::SolveResponse out_;  // gRPC's while a write is outstanding
  bool reading_ = false, eof_ = false, solving_ = false, writing_ = false, write_failed_ = false,
       finished_ = false;
  absl::Status error_;
};

grpc::ServerBidiReactor<v1::SolveSystemRequest, v1::SolveResponse>*
SolverService::SolveSystemStream(grpc::CallbackServerContext* ctx) {
  return new StepStream(this, ctx);
}

// ---- registered memory -----------------------------------------------------------------------

grpc::Status SolverService::RegisterSharedMemory(grpc::ServerContext* ctx,
                                                 const v1::RegisterSharedMemoryRequest* req,
                                                 v1::MemoryRegion* resp) {
  Call call = Begin(ctx, "RegisterSharedMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  auto r = core_.RegisterMemory(call, req->name(), req->key(), req->offset(), req->bytes(),
                                req->ttl_s());
  if (!r.ok()) return Finish(call, r.status());
  RegionToProto(*r, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::UnregisterMemory(grpc::ServerContext* ctx,
                                             const v1::UnregisterMemoryRequest* req,
                                             v1::MemoryRegion* resp) {
  Call call = Begin(ctx, "UnregisterMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  auto r = core_.UnregisterMemory(call, req->name());
  if (!r.ok()) return Finish(call, r.status());
  RegionToProto(*r, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::AllocateMemory(grpc::ServerContext* ctx,
                                           const v1::AllocateMemoryRequest* req,
                                           v1::MemoryRegion* resp) {
  Call call = Begin(ctx, "AllocateMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  auto r = core_.AllocateMemory(call, req->name(), req->bytes(), req->ttl_s());
  if (!r.ok()) return Finish(call, r.status());
  RegionToProto(*r, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::WriteMemory(grpc::ServerContext* ctx,
                                        grpc::ServerReader<v1::MemoryChunk>* reader,
                                        v1::MemoryRegion* resp) {
  Call call = Begin(ctx, "WriteMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  // The server's deadline ends a stream however silent its client is (as SolveStream's).
  std::unique_ptr<DeadlineWatch::Guard> watch;
  if (call.deadline < ctx->deadline())
    watch = deadline_watch_.Watch(call.deadline, [ctx] { ctx->TryCancel(); });
  std::shared_ptr<Region> region;
  v1::MemoryChunk c;
  int64_t written = 0;
  while (reader->Read(&c)) {
    if (!region || c.region() != region->name()) {
      auto r = core_.FindRegion(call, c.region());
      if (!r.ok()) return Finish(call, r.status());
      region = *std::move(r);
    }
    const int64_t len = int64_t(c.data().size());
    if (c.offset() < 0 || c.offset() > region->bytes() || len > region->bytes() - c.offset())
      return Finish(call, absl::InvalidArgumentError(absl::StrCat(
                              "offset: [", c.offset(), ", ", c.offset() + len,
                              ") lies outside region '", region->name(), "' of ",
                              region->bytes(), " bytes")));
    std::memcpy(region->base() + c.offset(), c.data().data(), size_t(len));
    written += len;
  }
  call.sample.bytes_in = written;
  if (ctx->IsCancelled())
    return Finish(call,
                  std::chrono::system_clock::now() + Admission::kDeadlineSkew >= call.deadline
                      ? absl::DeadlineExceededError("the deadline passed while writing memory")
                      : absl::CancelledError("the client cancelled the call"));
  if (region) {
    resp->set_name(region->name());
    resp->set_bytes(region->bytes());
    resp->set_pinned(region->pinned());
    resp->set_server_owned(region->server_owned());
  }
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::ReadMemory(grpc::ServerContext* ctx, const v1::ReadMemoryRequest* req,
                                       grpc::ServerWriter<v1::MemoryChunk>* writer) {
  Call call = Begin(ctx, "ReadMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  auto r = core_.FindRegion(call, req->region());
  if (!r.ok()) return Finish(call, r.status());
  const Region& region = **r;
  const int64_t off = req->offset();
  const int64_t bytes = req->bytes() == 0 ? region.bytes() - std::max<int64_t>(off, 0) : req->bytes();
  if (off < 0 || bytes < 0 || off > region.bytes() || bytes > region.bytes() - off)
    return Finish(call,
                  absl::InvalidArgumentError(absl::StrCat("offset, bytes: [", off, ", ", off + bytes,
                                                          ") lies outside region '", region.name(),
                                                          "' of ", region.bytes(), " bytes")));
  if (auto st = region.StillMapped("region"); !st.ok()) return Finish(call, st);
  const int64_t chunk = std::max<int64_t>(options_.stream_chunk_bytes, 1024);
  v1::MemoryChunk msg;
  for (int64_t done = 0; done < bytes; done += chunk) {
    const int64_t len = std::min(chunk, bytes - done);
    msg.set_region(done == 0 ? region.name() : "");
    msg.set_offset(off + done);
    msg.set_data(region.base() + off + done, size_t(len));
    if (!writer->Write(msg)) return Finish(call, absl::CancelledError("the client went away"));
  }
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::ListMemory(grpc::ServerContext* ctx, const v1::ListMemoryRequest*,
                                       v1::ListMemoryResponse* resp) {
  Call call = Begin(ctx, "ListMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  for (const RegionInfo& r : core_.ListMemory(call)) RegionToProto(r, resp->add_regions());
  return Finish(call, absl::OkStatus());
}

}  // namespace trisolve::server
