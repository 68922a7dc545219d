#include "service.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstring>
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

}  // namespace

SolverService::SolverService(std::unique_ptr<Backend> backend, ServiceOptions options)
    : options_(options),
      tokens_(std::make_shared<const BearerTokens>(options.tokens)),
      core_(std::move(backend), options),
      rings_(std::make_unique<RingManager>(&core_, options.rings)) {
  ServeMemoryRaw();
}

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

template <typename Req>
grpc::Status SolverService::HandleUnary(grpc::ServerContext* ctx, const char* rpc, Family family,
                                        const Req& req, v1::SolveResponse* resp) {
  Call call = Begin(ctx, rpc);
  call.sample.family = std::string(FamilyName(family));
  call.sample.method = MethodLabel(family, req.method());
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  RequestRegions regions = core_.Regions(call.identity);
  auto job = JobFromRequest(req, options_.limits,
                            DeclareOptions{.regions = &regions, .defer_finite = true});
  call.receive_us = Micros(Clock::now() - call.start);
  if (!job.ok()) return Finish(call, job.status());
  auto answer = core_.Solve(call, *job);
  if (!answer.ok()) return Finish(call, answer.status());
  if (auto st = regions.AfterUse(); !st.ok()) return Finish(call, st);
  AnswerToProto(*answer, resp, req.sparse_status());
  return Finish(call, absl::OkStatus());
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
  call.sample.method = std::string(job->method_name());
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
    if (d.job_seconds >= 0) {
      dev->set_solve_s(d.job_seconds);
      dev->set_h2d_s(d.h2d_seconds);
      dev->set_kernel_s(d.kernel_seconds);
      dev->set_d2h_s(d.d2h_seconds);
    }
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
  resp->set_cpu_s(st.cpu_s);
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
  if (auto st = regions.AfterUse(); !st.ok()) {
    (void)core_.ReleaseSystem(call, view->handle);  // it holds what the missing pages gave
    return Finish(call, st);
  }
  SystemInfoToProto(*view, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::SolveSystem(grpc::ServerContext* ctx,
                                        const v1::SolveSystemRequest* req,
                                        v1::SolveResponse* resp) {
  Call call = Begin(ctx, "SolveSystem");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  StepRequest step;
  StepFromProto(*req, &step);
  auto answer = core_.SolveSystem(call, step);
  if (!answer.ok()) return Finish(call, answer.status());
  AnswerToProto(*answer, resp, req->sparse_status());
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

grpc::Status SolverService::SolveSystemStream(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::SolveResponse, v1::SolveSystemRequest>* stream) {
  Call call = Begin(ctx, "SolveSystemStream");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  // Step k + 1 is read on a second thread while answer k is written: a client that writes a
  // step while it waits for an answer would otherwise block against a server that is blocked
  // writing that answer, once the two exceed HTTP/2's flow-control window, and neither moves.
  // Only one step is read ahead, held against the receive budget (back-pressure: the transport
  // holds back the rest), and only during a write, so a bad step or a solve that fails never
  // leaves a read outstanding and still ends the stream with its own status.
  struct ReadAhead {
    std::mutex mu;
    std::condition_variable cv;
    bool want = false, done = false, ok = false, quit = false;
  } ra;
  v1::SolveSystemRequest next;
  std::thread reader([&] {
    std::unique_lock<std::mutex> lock(ra.mu);
    for (;;) {
      ra.cv.wait(lock, [&] { return ra.want || ra.quit; });
      if (ra.quit) return;
      lock.unlock();
      const bool ok = stream->Read(&next);
      lock.lock();
      ra.want = false;
      ra.ok = ok;
      ra.done = true;
      ra.cv.notify_all();
    }
  });
  auto start_read = [&] {
    std::lock_guard<std::mutex> lock(ra.mu);
    ra.want = true;
    ra.done = false;
    ra.cv.notify_all();
  };
  auto wait_read = [&] {
    std::unique_lock<std::mutex> lock(ra.mu);
    ra.cv.wait(lock, [&] { return ra.done; });
    return ra.ok;
  };
  std::string handle;
  int64_t steps = 0;
  absl::Status st;
  v1::SolveSystemRequest msg;
  bool have = stream->Read(&msg);
  std::optional<ReceiveBudget::Hold> held;
  while (have) {
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
    if (core_.shutting_down()) {
      st = absl::UnavailableError("the server is shutting down");
      break;
    }
    call.start = Clock::now();
    StepRequest step;
    StepFromProto(msg, &step);
    step.handle = handle;
    auto answer = core_.SolveSystem(call, step);
    if (!answer.ok()) {
      st = answer.status();
      break;
    }
    ++steps;
    v1::SolveResponse resp;
    AnswerToProto(*answer, &resp, msg.sparse_status());
    held.reset();
    start_read();
    const bool wrote = stream->Write(resp);
    // A failed write means the call is over, so the outstanding read returns too.
    have = wait_read();
    if (!wrote) {
      st = absl::CancelledError("the client went away");
      break;
    }
    if (!have) break;
    msg.Swap(&next);
    next.Clear();
    held.emplace();
    if (auto r = core_.ReserveReceive(static_cast<int64_t>(msg.ByteSizeLong()), &*held);
        !r.ok()) {
      st = r;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(ra.mu);
    ra.quit = true;
    ra.cv.notify_all();
  }
  reader.join();
  if (st.ok() && ctx->IsCancelled()) st = absl::CancelledError("the client cancelled the call");
  if (st.ok())
    spdlog::info("[req {}] SolveSystemStream {}: {} steps", call.id, handle.empty() ? "-" : handle,
                 steps);
  return Finish(call, st);
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

grpc::Status SolverService::RegisterCudaMemory(grpc::ServerContext* ctx,
                                               const v1::RegisterCudaMemoryRequest* req,
                                               v1::MemoryRegion* resp) {
  Call call = Begin(ctx, "RegisterCudaMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  auto r = core_.RegisterCudaMemory(call, req->name(), req->handle(), req->device(),
                                    req->offset(), req->bytes(), req->ttl_s());
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

// WriteMemory and ReadMemory: memory_rpc.cc.

grpc::Status SolverService::ListMemory(grpc::ServerContext* ctx, const v1::ListMemoryRequest*,
                                       v1::ListMemoryResponse* resp) {
  Call call = Begin(ctx, "ListMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  for (const RegionInfo& r : core_.ListMemory(call)) RegionToProto(r, resp->add_regions());
  return Finish(call, absl::OkStatus());
}

// ---- request rings ---------------------------------------------------------------------------

namespace {
void RingInfoToProto(const RingView& r, v1::RingInfo* out) {
  out->set_ring(r.id);
  out->set_version(ring::kRingVersion);
  out->set_slots(r.slots);
  out->set_bytes(r.bytes);
  out->set_spin_us(r.spin_us);
}
}  // namespace

grpc::Status SolverService::OpenRing(grpc::ServerContext* ctx, const v1::OpenRingRequest* req,
                                     v1::RingInfo* resp) {
  Call call = Begin(ctx, "OpenRing");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  auto r = rings_->Open(call, req->region(), req->offset(), req->slots());
  if (!r.ok()) return Finish(call, r.status());
  RingInfoToProto(*r, resp);
  return Finish(call, absl::OkStatus());
}

grpc::Status SolverService::CloseRing(grpc::ServerContext* ctx, const v1::CloseRingRequest* req,
                                      v1::RingInfo* resp) {
  Call call = Begin(ctx, "CloseRing");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  auto r = rings_->Close(call, req->ring());
  if (!r.ok()) return Finish(call, r.status());
  RingInfoToProto(*r, resp);
  return Finish(call, absl::OkStatus());
}

}  // namespace trisolve::server
