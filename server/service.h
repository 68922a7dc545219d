// The gRPC transport: authenticates each call, translates protobuf into the core's plain
// requests and the answers back (translate.h); the core (core.h) does the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "admission.h"
#include "auth.h"
#include "core.h"
#include "ring.h"
#include "translate.h"
#include "trisolve/backend.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve::server {

// The core's options and the gRPC transport's own.
struct ServiceOptions : CoreOptions {
  int64_t max_message_bytes = int64_t{64} << 20;
  int64_t stream_chunk_bytes = int64_t{2} << 20;
  // Bearer tokens accepted (metadata "authorization: Bearer <token>"); empty: no authentication.
  // The health service stays open either way.
  std::vector<std::string> tokens;
  // The request rings of clients on this host (ring.h).
  RingOptions rings;
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
  // progress.cc
  grpc::Status SolveWithProgress(grpc::ServerContext* ctx, const v1::ProgressRequest* req,
                                 grpc::ServerWriter<v1::ProgressResponse>* writer) override;
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
  grpc::Status RegisterCudaMemory(grpc::ServerContext* ctx,
                                  const v1::RegisterCudaMemoryRequest* req,
                                  v1::MemoryRegion* resp) override;
  grpc::Status UnregisterMemory(grpc::ServerContext* ctx, const v1::UnregisterMemoryRequest* req,
                                v1::MemoryRegion* resp) override;
  grpc::Status ListMemory(grpc::ServerContext* ctx, const v1::ListMemoryRequest* req,
                          v1::ListMemoryResponse* resp) override;
  grpc::Status AllocateMemory(grpc::ServerContext* ctx, const v1::AllocateMemoryRequest* req,
                              v1::MemoryRegion* resp) override;
  // WriteMemory and ReadMemory take and send their chunks as raw buffers (memory_rpc.cc).
  grpc::Status WriteMemoryRaw(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  grpc::Status ReadMemoryRaw(grpc::ServerContext* ctx,
                             grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  grpc::Status OpenRing(grpc::ServerContext* ctx, const v1::OpenRingRequest* req,
                        v1::RingInfo* resp) override;
  grpc::Status CloseRing(grpc::ServerContext* ctx, const v1::CloseRingRequest* req,
                         v1::RingInfo* resp) override;
  // Closes every request ring (after Drain: requests not yet taken are answered UNAVAILABLE).
  void ShutdownRings() { rings_->Shutdown(); }

  // Refuse new work (UNAVAILABLE) and wait up to `grace` for running jobs to finish.
  bool Drain(std::chrono::system_clock::time_point deadline) { return core_.Drain(deadline); }
  const BackendInfo& backend_info() const { return core_.backend_info(); }
  SystemRegistry& systems() { return core_.systems(); }
  Core& core() { return core_; }
  // Lost (a sticky device error): the server refuses work and trisolved exits (health.h).
  BackendHealth& health() { return core_.health(); }
  // Calls whose handlers have not returned (open streams among them).
  int64_t open_calls() const { return Core::open_calls(); }
  // The Prometheus exposition of everything so far.
  std::string RenderMetrics() const { return core_.RenderMetrics(); }
  // The accepted bearer tokens (options.tokens), for the server's credentials, which refuse a
  // call without a valid one before its message is read; and their hook for such a call.
  std::shared_ptr<const BearerTokens> tokens() const { return tokens_; }
  void RecordUnauthenticated(absl::string_view path, absl::string_view message);

 private:
  template <typename Req>
  grpc::Status HandleUnary(grpc::ServerContext* ctx, const char* rpc, Family family,
                           const Req& req, v1::SolveResponse* resp);
  // A call's start: its id, deadline and cancellation from the context.
  Call Begin(grpc::ServerContextBase* ctx, const char* rpc);
  // A call's opening: metrics labels set, UNAVAILABLE while draining (where asked), then the
  // caller's identity into call.identity, or UNAUTHENTICATED.
  absl::Status Open(grpc::ServerContextBase* ctx, Call& call, bool refuse_when_draining);
  // The caller's identity ("token:N", "cert:SUBJECT" or "shared"), or UNAUTHENTICATED.
  absl::StatusOr<std::string> Authenticate(grpc::ServerContextBase* ctx) const;
  grpc::Status Finish(Call& call, const absl::Status& st);
  // Installs WriteMemoryRaw and ReadMemoryRaw as the two methods' handlers.
  void ServeMemoryRaw();

  ServiceOptions options_;
  std::shared_ptr<const BearerTokens> tokens_;
  Core core_;
  std::unique_ptr<RingManager> rings_;  // after the core, which its threads call
  DeadlineWatch deadline_watch_;
  std::atomic<int64_t> next_id_{1};
};

}  // namespace trisolve::server
