// The client's insides, shared by client.cc (requests and answers) and transport.cc (how the
// arrays travel: shared memory on the server's host, the server's memory over parallel
// connections elsewhere). Not installed.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "replicas.h"
#include "trisolve/client.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {

inline absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const Client::Options& o);
// The channel arguments every connection of the client uses.
grpc::ChannelArguments ChannelArgs(const Client::Options& o, bool own_connection);

struct Client::Impl {
  Options options;
  absl::Status setup;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Solver::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  // Several replicas: the balanced channel (`channel`), and each handle's replica's. Regions
  // (shared memory, the server's memory) live on one replica: a balanced client sends its
  // arrays in the messages.
  std::unique_ptr<internal::Replicas> replicas;
  // The last unary call by reference's wait for its answer, microseconds (-1: none yet):
  // Options::rpc_spin_us.
  std::atomic<double> last_reference_wait_us{-1};

  ~Impl();

  // Before a call on `channel`: returns once it is connected, or when Options::connect_timeout_s
  // or half the time left to `deadline` has passed (the call is then made, and gRPC answers it
  // with its own reason). At once where it is connected already.
  void AwaitConnection(grpc::Channel& ch, std::chrono::system_clock::time_point deadline) const;
  // The same for a call on the client's channel with the context `ctx`.
  void AwaitConnection(const grpc::ClientContext& ctx) const {
    AwaitConnection(*channel, ctx.deadline());
  }

  // ---- shared memory (the server on this host) --------------------------------------------
  struct Registered {
    const std::byte* base;
    int64_t bytes;
    std::string name;
    bool cuda = false;  // RegisterCuda's: device memory, which this process never reads
  };
  enum class Shm { kUntried, kYes, kNo };
  static constexpr int kMaxArenas = 16;
  // Whether the server solves on a GPU (asked once, with the first job large enough for
  // pieces): pieces pay only there (client.h, pipeline_pieces).
  bool ServerSolvesOnGpu();
  // The pieces options.pipeline_pieces asks for (its default, -1: kAutoPieces on a GPU
  // server, whole on a CPU one).
  int PiecesWanted();
  static constexpr int kAutoPieces = 4;
  std::mutex backend_mu;
  enum class OnGpu { kUnknown, kYes, kNo } on_gpu = OnGpu::kUnknown;
  mutable std::mutex shm_mu;
  std::vector<Registered> registered;
  Shm shm = Shm::kUntried;
  // Staging regions not in use, with when they were last used and the server's idle
  // time-to-live for them: one idle for half of it is replaced rather than reused.
  struct IdleArena {
    std::unique_ptr<SharedMemory> arena;
    std::chrono::steady_clock::time_point since;
    double ttl_s = 0;
  };
  std::vector<IdleArena> idle_arenas;
  std::map<const std::byte*, double> arena_ttl;  // the server's TTL of each staging region
  int arenas = 0;
  int64_t next_arena = 0;

  // The region reference of [p, p + bytes) when it lies in registered memory.
  std::optional<v1::RegionRef> RefOf(const void* p, int64_t bytes) const;
  void Auth(grpc::ClientContext& ctx) const;
  // ttl_s: the server's idle time-to-live for the region, when asked for.
  absl::Status Register(const SharedMemory& m, const std::string& name, double* ttl_s = nullptr);
  absl::Status Unregister(const std::byte* base);
  absl::Status RegisterCuda(const CudaMemory& m, const std::string& name, double ttl_s);
  // A registered staging region of at least `bytes`, or an error (auto then tries the next
  // path, and stops trying shared memory where the server cannot map this process's memory).
  absl::StatusOr<std::unique_ptr<SharedMemory>> AcquireArena(int64_t bytes);
  void ReleaseArena(std::unique_ptr<SharedMemory> a);

  // ---- the server's memory over parallel connections (the server elsewhere) ---------------
  struct Remote {
    std::string name;
    int64_t bytes = 0;
    double ttl_s = 0;
    std::chrono::steady_clock::time_point since;
  };
  std::mutex remote_mu;
  std::vector<Remote> idle_remote;
  int remotes = 0;
  std::vector<std::shared_ptr<grpc::Channel>> lanes;  // one connection each
  std::unique_ptr<Remote> AcquireRemoteOrNull(int64_t bytes, absl::Status* error);
  void ReleaseRemote(Remote r);
  // Unregisters every idle region on the server; how many there were.
  int DropIdleRemote();
  void UnregisterRemote(const std::string& name);  // errors ignored: it may have expired
  std::shared_ptr<grpc::Channel> Lane(size_t i);
  // Writes the pieces (source, offset in the region) over the lanes at once.
  struct Piece {
    const std::byte* src;
    int64_t offset, bytes;
  };
  // A whole job opens a lane for each 8 MiB, a pipeline's piece (`piece`) one for each 4 MiB
  // chunk: a piece is a fraction of the job, and it alone is on the wire in its direction.
  absl::Status Upload(const std::string& region, const std::vector<Piece>& pieces,
                      bool piece = false);
  absl::Status Download(const std::string& region, int64_t offset, int64_t bytes, std::byte* dst,
                        bool piece = false);

  // ---- placing a call's arrays -------------------------------------------------------------
  // A staging region held for one call; back to the client's idle list afterwards.
  class Staging {
   public:
    Staging(Impl* impl, std::unique_ptr<SharedMemory> arena)
        : impl_(impl), arena_(std::move(arena)) {}
    Staging(Impl* impl, Remote remote) : impl_(impl), remote_(std::move(remote)) {}
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    ~Staging();
    SharedMemory* arena() { return arena_.get(); }
    const Remote& remote() const { return remote_; }

   private:
    Impl* impl_;
    std::unique_ptr<SharedMemory> arena_;
    Remote remote_;
  };

  // Arrays of a call as they travel: by reference where they lie in registered memory or were
  // staged into a region (this host's shared memory, or the server's memory), inline otherwise;
  // and where x goes.
  struct Placement {
    std::vector<std::optional<v1::RegionRef>> refs;
    std::optional<v1::RegionRef> x_ref;
    std::byte* x_staged = nullptr;  // x in a shared-memory staging region, to copy out after
    int64_t x_remote = -1;          // x's offset in the server's memory, to download after
    std::unique_ptr<Staging> staging;
    int64_t inline_bytes = 0;
    std::string transport = "grpc";
    double upload_us = 0;  // StageRemote's upload
    // x's own array (x_out not given, x staged): made while the arrays travel.
    std::future<std::vector<std::byte>> x_fresh;
  };
  absl::StatusOr<Placement> Place(const std::vector<ArrayView>& arrays, void* x_out,
                                  int64_t x_bytes);
  // A batch of whole systems over the server's memory in pieces (client.cc): the pieces its
  // systems are split into (0: the job goes whole), and the solve.
  int Pieces(const Job& job, const std::vector<std::pair<std::string, ArrayView>>& send,
             void* x_out, int64_t x_bytes);
  absl::StatusOr<Result> SolveInPieces(const Job& job, DType dtype,
                                       const std::vector<std::pair<std::string, ArrayView>>& send,
                                       void* x_out, int64_t x_bytes, int pieces);
  // Three stages, each on a thread of its own, a piece apart: piece k uploads while k - 1 is
  // solved and k - 2's x downloads (solve on the calling thread). The first error stops every
  // stage; each stage's time, summed over the pieces, in upload_us and download_us.
  struct PipelineStages {
    std::function<absl::Status(int)> upload, solve, download;
  };
  static absl::Status RunPipeline(int pieces, const PipelineStages& stages, double* upload_us,
                                  double* download_us);

  // ---- persistent systems by handle -------------------------------------------------------
  // The systems this client knows the shapes of (its CreateSystem answers; ListSystems' on a
  // miss), which a large solve by handle is split by.
  std::mutex systems_mu;
  std::map<std::string, SystemInfo> systems;
  void Remember(const SystemInfo& info);
  void Forget(const std::string& handle);
  std::optional<SystemInfo> SystemOf(const std::string& handle, const JobOptions& o);
  // The pieces a solve by handle goes in through the server's memory (0: whole, serially), as
  // Pieces decides for a batch: split by right-hand sides ([k, ...] with k >= 2), or by ranges
  // of a flat tridiagonal or tree batch's systems (*by_range).
  int HandlePieces(const std::string& handle, const ArrayView& rhs, const JobOptions& o,
                   bool* by_range, SystemInfo* info);
  absl::StatusOr<Result> SolveSystemInPieces(const std::string& handle, const ArrayView& rhs,
                                             const Updates& update, const JobOptions& o,
                                             int pieces, bool by_range);
  // After the call: x where the caller wanted it (x_out, else the result's own array).
  // x read back from the server's memory adds its time to timings->download_us.
  absl::Status DeliverX(Placement& pl, void* x_out, int64_t x_bytes, NdArray* x,
                        Timings* timings = nullptr);

  // ---- request rings (the server on this host; ring.cc) -----------------------------------
  // One ring of the client's, and the rings it holds.
  struct RingLane;
  struct RingPool;
  struct RingPoolDeleter {
    void operator()(RingPool* p) const;
  };
  static std::unique_ptr<RingPool, RingPoolDeleter> MakeRingPool(Impl* impl);
  // A small call through one of the client's rings: nullopt when it takes another path (auto:
  // not eligible, or the server serves no rings to this process), else its answer. op: a
  // ring_abi.h RingOp; send: the arrays by request field (SolveSystem: "rhs" alone), the
  // right-hand side's named rhs_field. Arrays and x in registered regions go by reference.
  std::optional<absl::StatusOr<Result>> SolveOnRing(
      uint32_t op, Kind kind, DType dtype,
      const std::vector<std::pair<std::string, ArrayView>>& send, const std::string& rhs_field,
      const JobOptions& jo, const std::string& handle, void* x_out, int64_t x_bytes);
  // A ring whose arena holds `need` bytes: an idle one, or a new one (registered, opened).
  // *fall_back: the call should take the RPC instead (auto).
  absl::StatusOr<std::unique_ptr<RingLane>> AcquireRing(int64_t need, bool* fall_back);
  void ReleaseRing(std::unique_ptr<RingLane> lane);
  std::string RingState() const;
  // Last: its rings are closed while the stub is still there.
  std::unique_ptr<RingPool, RingPoolDeleter> rings = MakeRingPool(this);

 private:
  absl::Status StageShared(const std::vector<ArrayView>& arrays, int64_t need, int64_t x_bytes,
                           Placement* pl);
  absl::Status StageRemote(const std::vector<ArrayView>& arrays, int64_t need, int64_t x_bytes,
                           Placement* pl);
};

namespace internal {
// Whether [p, p + bytes) overlaps CUDA memory some Client of this process registered: the
// marshalling must not read it (it cannot convert such an array).
bool InCudaMemory(const void* p, int64_t bytes);
// A zeroed array of `bytes` for an answer's x, in 2 MiB pages where the kernel allows rather
// than faulted in one 4 KiB page at a time.
std::vector<std::byte> FreshBuffer(int64_t bytes);
// FreshBuffer on a thread of its own, for arrays large enough to pay for one (else made now):
// x's pages are made while the call's arrays travel.
std::future<std::vector<std::byte>> FreshBufferAsync(int64_t bytes);
}  // namespace internal

}  // namespace trisolve
