// The gRPC frontend: translates protobuf to Jobs and back, admits, runs, answers, logs.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "admission.h"
#include "auth.h"
#include "health.h"
#include "job.h"
#include "memory.h"
#include "translate.h"
#include "metrics.h"
#include "systems.h"
#include "trisolve/backend.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve::server {

struct ServiceOptions {
  JobLimits limits;
  int64_t max_message_bytes = int64_t{64} << 20;
  int max_concurrent_jobs = 2;
  int max_queued_jobs = 64;
  // Applied to calls that carry no deadline (0: none), and the cap on any deadline (0: none).
  double default_deadline_s = 0;
  double max_deadline_s = 0;
  int64_t stream_chunk_bytes = int64_t{2} << 20;
  // Bearer tokens accepted (metadata "authorization: Bearer <token>"); empty: no authentication.
  // The health service stays open either way.
  std::vector<std::string> tokens;
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
};

class SolverService final : public v1::Solver::Service {
 public:
  SolverService(std::unique_ptr<Backend> backend, ServiceOptions options);

  grpc::Status SolveTridiagonal(grpc::ServerContext* ctx, const v1::TridiagonalRequest* req,
                                v1::SolveResponse* resp) override;
  grpc::Status SolveTree(grpc::ServerContext* ctx, const v1::TreeRequest* req,
                         v1::SolveResponse* resp) override;
  grpc::Status SolveBlockTridiagonal(grpc::ServerContext* ctx,
                                     const v1::BlockTridiagonalRequest* req,
                                     v1::SolveResponse* resp) override;
  grpc::Status SolveDense(grpc::ServerContext* ctx, const v1::DenseRequest* req,
                          v1::SolveResponse* resp) override;
  grpc::Status SolveStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::StreamResponse, v1::StreamRequest>* stream) override;
  grpc::Status GetServerInfo(grpc::ServerContext* ctx, const v1::GetServerInfoRequest* req,
                             v1::ServerInfo* resp) override;
  grpc::Status CreateSystem(grpc::ServerContext* ctx, const v1::CreateSystemRequest* req,
                            v1::SystemInfo* resp) override;
  grpc::Status SolveSystem(grpc::ServerContext* ctx, const v1::SolveSystemRequest* req,
                           v1::SolveResponse* resp) override;
  grpc::Status UpdateSystem(grpc::ServerContext* ctx, const v1::UpdateSystemRequest* req,
                            v1::SystemInfo* resp) override;
  grpc::Status ReleaseSystem(grpc::ServerContext* ctx, const v1::SystemRequest* req,
                             v1::SystemInfo* resp) override;
  grpc::Status ListSystems(grpc::ServerContext* ctx, const v1::ListSystemsRequest* req,
                           v1::ListSystemsResponse* resp) override;
  grpc::Status SolveSystemStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::SolveResponse, v1::SolveSystemRequest>* stream) override;
  grpc::Status RegisterSharedMemory(grpc::ServerContext* ctx,
                                    const v1::RegisterSharedMemoryRequest* req,
                                    v1::MemoryRegion* resp) override;
  grpc::Status UnregisterMemory(grpc::ServerContext* ctx, const v1::UnregisterMemoryRequest* req,
                                v1::MemoryRegion* resp) override;
  grpc::Status ListMemory(grpc::ServerContext* ctx, const v1::ListMemoryRequest* req,
                          v1::ListMemoryResponse* resp) override;
  grpc::Status AllocateMemory(grpc::ServerContext* ctx, const v1::AllocateMemoryRequest* req,
                              v1::MemoryRegion* resp) override;
  grpc::Status WriteMemory(grpc::ServerContext* ctx, grpc::ServerReader<v1::MemoryChunk>* reader,
                           v1::MemoryRegion* resp) override;
  grpc::Status ReadMemory(grpc::ServerContext* ctx, const v1::ReadMemoryRequest* req,
                          grpc::ServerWriter<v1::MemoryChunk>* writer) override;

  // Refuse new work (UNAVAILABLE) and wait up to `grace` for running jobs to finish.
  bool Drain(std::chrono::system_clock::time_point deadline);
  const BackendInfo& backend_info() const { return backend_info_; }
  SystemRegistry& systems() { return systems_; }
  // Lost (a sticky device error): the server refuses work and trisolved exits (health.h).
  BackendHealth& health() { return health_; }
  // Calls of this service whose handlers have not returned (open streams among them).
  int64_t open_calls() const;
  // The Prometheus exposition of everything so far.
  std::string RenderMetrics() const;
  // The accepted bearer tokens (options.tokens), for the server's credentials, which refuse a
  // call without a valid one before its message is read; and their hook for such a call.
  std::shared_ptr<const BearerTokens> tokens() const { return tokens_; }
  void RecordUnauthenticated(absl::string_view path, absl::string_view message);

 private:
  struct Call;
  template <typename Req>
  grpc::Status HandleUnary(grpc::ServerContext* ctx, const char* rpc, Family family,
                           const Req& req, v1::SolveResponse* resp);
  // Runs `run` once a slot of the pool for `unknowns` is free (deadline, cancellation and
  // shutdown as Admission says).
  absl::StatusOr<JobResult> Admit(Call& call, int64_t unknowns,
                                  const std::function<absl::StatusOr<JobResult>(const SolveControl&)>& run);
  absl::StatusOr<JobResult> Admit(Call& call, const Job& job);
  // A persistent-system call's start: its deadline and metrics labels set, UNAVAILABLE while
  // draining (where asked), then the caller's identity or UNAUTHENTICATED.
  absl::StatusOr<std::string> Open(Call& call, CallSample& sample, bool refuse_when_draining);
  // The caller's identity ("token:N", "cert:SUBJECT" or "shared"), or UNAUTHENTICATED.
  absl::StatusOr<std::string> Authenticate(grpc::ServerContext* ctx) const;
  // One step of a persistent system: updates, then the right-hand sides; the answer in *resp.
  absl::Status SolveStep(Call& call, const std::string& identity, const v1::SolveSystemRequest& req,
                         const std::string& handle, CallSample& sample, v1::SolveResponse* resp);
  // A system's coefficient updates, each checked, applied in order.
  absl::Status ApplyUpdates(SystemRegistry::Entry& e,
                            const google::protobuf::RepeatedPtrField<v1::NamedArray>& update,
                            RegionResolver* regions, CallSample& sample);
  void FillSystemInfo(const SystemRegistry::Entry& e, v1::SystemInfo* info) const;
  grpc::Status Finish(Call& call, CallSample& sample, const absl::Status& st);

  std::unique_ptr<Backend> backend_;
  BackendInfo backend_info_;
  BackendHealth health_;
  ServiceOptions options_;
  std::shared_ptr<const BearerTokens> tokens_;
  Admission admission_;
  Admission small_admission_;
  ReceiveBudget receiving_;
  DeadlineWatch deadline_watch_;
  SystemRegistry systems_;
  MemoryRegistry memory_;  // after the backend, which unpins its regions
  std::atomic<int64_t> next_id_{1};
  Metrics metrics_;
  const std::chrono::steady_clock::time_point started_;
};

}  // namespace trisolve::server
