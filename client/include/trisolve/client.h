// libtrisolve_client: arrays in, solutions and a summary out.
//
//   trisolve::Client client({.target = "127.0.0.1:50051"});
//   trisolve::Job job{trisolve::Kind::kTridiagonal};
//   job.arrays = {{"a", a}, {"b", b}, {"c", c}, {"d", d}};   // ArrayViews, no copies
//   auto result = client.Solve(job);                          // absl::StatusOr<Result>
//
// Jobs larger than one message go through the streaming RPC on their own.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trisolve/cuda_memory.h"
#include "trisolve/ndarray.h"
#include "trisolve/shared_memory.h"

namespace grpc {
class Channel;
}

namespace trisolve {

enum class Kind { kTridiagonal, kTree, kBlockTridiagonal, kDense };
absl::StatusOr<Kind> ParseKind(absl::string_view name);
absl::string_view KindName(Kind k);
// The array names each kind takes, the right-hand side first. A tridiagonal job's `lengths`
// (optional) makes it a batch of systems of different sizes: a, b, c, d each the systems' rows
// concatenated ([total]), lengths their sizes ([systems], int32 or int64; sent as int32). Its
// `abc` (instead of a, b, c) is the unified-vector layout: a, b, c of a row together, d's shape
// and 3 ([batch, n, 3]). A tree job's `lengths` (optional) makes it cells of different sizes:
// parent, lower, upper, diag, rhs each the cells' nodes concatenated ([total], every cell's
// parent values counted from its own first node, its root), lengths their sizes ([cells]).
const std::vector<std::string>& ArrayNames(Kind k);
// Arrays of integers (tree parent, lengths): sent as int32, never as the job's type.
bool IsIndexArray(absl::string_view name);

// Where a solve is, as the server reports it (SolveWithProgress). phase: "received" (bytes: the
// request's), "queued", "solving" (iterative methods: iteration, residual at the last check,
// the limits), "sending" (bytes_total: x's). Phases only move forward; iterations too.
struct Progress {
  std::string phase;
  int64_t bytes_done = 0, bytes_total = 0;
  int64_t iteration = 0, max_iterations = 0;  // max_iterations 0: not an iterative solve
  double residual = std::numeric_limits<double>::quiet_NaN();
  double tol = 0;
  double elapsed_s = 0;
};
using ProgressCallback = std::function<void(const Progress&)>;

// One point of an iterative solve's residual history.
struct HistoryPoint {
  int64_t iteration = 0;
  double residual = 0;
};

// An option the job's family does not take (tol on a tridiagonal job, interleaved on a dense
// one, skip_residual on a block one, ...) is refused with INVALID_ARGUMENT naming it.
struct JobOptions {
  std::string method;          // "" or "auto" lets the server choose
  bool interleaved = false;    // tridiagonal and tree: arrays are n x batch
  std::optional<int64_t> max_iterations;  // block-tridiagonal
  std::optional<double> tol;              // block-tridiagonal
  bool scale_rows = false;                // block-tridiagonal
  bool skip_residual = false;
  std::optional<double> timeout_s;  // the call's deadline
  std::string request_id;           // sent as x-request-id; the server's log uses it
  // Called on the calling thread with the server's reports while Solve runs (at most one every
  // progress_interval_s, 0: 0.1 s). The job then goes in one SolveWithProgress message (its
  // arrays inline up to 64 MiB, or in registered memory); a larger inline job goes through
  // SolveStream, which reports nothing.
  ProgressCallback progress;
  double progress_interval_s = 0;
  bool residual_history = false;  // block-tridiagonal: Summary::residual_history
  // Where x goes (the right-hand side's shape and the job's type): inside a registered
  // SharedMemory the server writes it there itself; elsewhere the client copies it there. The
  // Result's x then has its shape and type but no data. Null: x comes back in the Result.
  void* x_out = nullptr;
};

struct Job {
  Kind kind = Kind::kTridiagonal;
  // By name: tridiagonal a b c d; tree parent lower upper diag rhs; block-tridiagonal
  // aC cC bC cA cB f [y0]; dense A (or a) b. Values float64 or float32: the job is float32
  // only when every one is, float64 otherwise (never narrowed); parent int32 or int64.
  std::map<std::string, ArrayView> arrays;
  JobOptions options;
};

enum class SolveStatus : uint8_t { kOk = 0, kSingular = 1, kNotConverged = 2, kDiverged = 3 };
absl::string_view SolveStatusName(SolveStatus s);

struct Timings {
  double receive_us = 0, queue_us = 0, h2d_us = 0, compute_us = 0, d2h_us = 0,
         residual_us = 0, server_total_us = 0;
  double client_total_us = 0;  // from the call's start to the answer decoded, on the client
  // Transport::kStreams, on the client: writing the arrays into the server's memory, and
  // reading x back (0 on the other paths).
  double upload_us = 0, download_us = 0;
};

struct Summary {
  std::string method, backend, request_id;
  int64_t systems = 0, ok = 0, singular = 0, not_converged = 0, diverged = 0;
  int64_t iterations = 0;
  double residual = 0;
  bool streamed = false;
  std::string transport;  // "grpc", "grpc-stream", "shared-memory", "streams" or "ring"
  int pieces = 0;  // streams: the pieces a batch or a solve by handle went in (0: whole)

  std::string handle;             // SolveSystem: the system solved
  int64_t right_hand_sides = 0;   // one matrix, many right-hand sides: how many
  int batched_with = 0;
  Timings timings;
  std::vector<HistoryPoint> residual_history;  // where JobOptions::residual_history asked
};

struct Result {
  NdArray x;
  std::vector<SolveStatus> status;
  Summary summary;
};

struct ServerInfoSummary {
  std::string version, backend;
  int cpu_threads = 0;
  std::vector<std::string> devices;
  std::vector<std::string> pools;  // "device: 1.2 GiB cached, 0 in use, peak ..., hits/misses"

  int64_t max_message_bytes = 0, max_job_bytes = 0, max_job_unknowns = 0;
  int max_concurrent_jobs = 0, max_queued_jobs = 0;
  int64_t jobs_in_flight = 0, jobs_queued = 0, jobs_done = 0;
  int64_t systems = 0, system_bytes = 0;
  double uptime_s = 0;
  double cpu_s = 0;  // the server process's CPU time since it started (user and system)
  std::string replica;  // the address the server advertises, which its handles end with
};

// A persistent system on the server (CreateSystem): solves send only right-hand sides.
struct SystemInfo {
  std::string handle, label, family, method, prepared;
  DType dtype = DType::kFloat64;
  bool interleaved = false;
  std::vector<int64_t> rhs_shape;  // one right-hand side; [k, ...] solves k at once
  int64_t systems = 1;    // the batch's systems (a tree's cells)
  bool variable = false;  // systems of different sizes (created with lengths): rhs_shape [total]
  int64_t bytes = 0, solves = 0, updates = 0;
  double ttl_s = 0, idle_s = 0;
};

struct SystemOptions {
  double ttl_s = 0;   // idle time-to-live (0: the server's default)
  std::string label;  // for listings and logs: [A-Za-z0-9._-], at most 64
};

// Replacement coefficient arrays by name ("b", "diag", "cC", ...), in the system's shapes.
using Updates = std::map<std::string, ArrayView>;

class Client;

// The time-step stream of one system: Send one step (right-hand sides, optional updates), Receive
// its answer; answers come in the order of the steps. Steps may be sent ahead of answers.
class StepStream {
 public:
  ~StepStream();
  // x_out: where this step's x goes (as JobOptions::x_out); null: in the Result.
  absl::Status Send(const ArrayView& rhs, const Updates& update = {}, void* x_out = nullptr);
  absl::StatusOr<Result> Receive();
  // Ends the stream (after the answers still due were received); the server's final status.
  absl::Status Finish();

 private:
  friend class Client;
  struct Impl;
  explicit StepStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// How the arrays of a job travel.
// - kSharedMemory: by reference into shared memory (the server on this host, in the same IPC
//   namespace); arrays outside registered memory are copied into a staging region.
// - kStreams: written into the server's own memory over several connections at once
//   (parallel_streams), x read back the same way; for large jobs to a server elsewhere.
// - kGrpc: in the messages (SolveStream above stream_threshold_bytes).
// - kRing: unary solves and solves by handle through a request ring of the client's (the server
//   on this host): the request and its arrays in shared memory, no socket; FAILED_PRECONDITION
//   where the call cannot go so (progress, residual history, updates, CUDA memory, a server
//   elsewhere or with --rings off). Other calls take gRPC.
// - kAuto: a request ring for unary solves and solves by handle whose arrays and x fit
//   ring_max_arena_bytes while the server serves rings to this process, shared memory for jobs
//   of shm_min_bytes or more while it can map this process's memory, else parallel streams
//   from streams_min_bytes, else gRPC.
enum class Transport { kAuto, kSharedMemory, kStreams, kGrpc, kRing };
// auto, shm, streams, grpc, ring
absl::StatusOr<Transport> ParseTransport(absl::string_view name);

class Client {
 public:
  struct Options {
    // HOST:PORT of one server (gRPC's default pick_first: one connection); or replicas behind gRPC's round_robin with health checks: several addresses
    // "HOST:PORT,HOST:PORT" (resolved once, here), or "dns:///NAME:PORT" (every address of the
    // name, re-resolved by gRPC). There, calls that hold no state on a replica go to any serving
    // one and are retried on another on UNAVAILABLE; calls by handle go to the replica the
    // handle names (its server's --advertise-address), and are NOT_FOUND when it is gone.
    std::string target = "127.0.0.1:50051";
    // Jobs whose arrays exceed this go through SolveStream (gRPC's default limit is 4 MiB).
    int64_t stream_threshold_bytes = (int64_t{4} << 20) - (int64_t{64} << 10);
    int64_t chunk_bytes = int64_t{2} << 20;
    // TLS: the CA (PEM file) that signed the server's certificate; with a client certificate and
    // key as well, mutual TLS. tls_server_name overrides the name checked in the certificate.
    std::string tls_ca_file, tls_cert_file, tls_key_file, tls_server_name;
    // Sent as "authorization: Bearer <token>" on every call but the health check.
    std::string token;
    // A connection of this client's own (not shared with other clients of the process).
    bool own_connection = false;
    Transport transport = Transport::kAuto;
    // auto: jobs whose arrays (and x) reach this many bytes go through shared memory, copied
    // into a staging region of the client's (arrays already in registered memory always do).
    int64_t shm_min_bytes = int64_t{1} << 20;
    int64_t streams_min_bytes = int64_t{32} << 20;
    // Request rings: the arena a ring starts with, and the most it grows to under auto (a
    // call whose copied arrays, x and statuses exceed the ring's arena replaces it with one of
    // twice the room, or more, up to ring_max_arena_bytes (or ring_arena_bytes, where larger);
    // a call larger still takes another path, from shm_min_bytes a staging region, whose solve
    // holds no ring thread; the arena is shared memory reserved while the ring is open), how
    // long a call spins for its answer before it sleeps, and the most rings a Client holds (one
    // a concurrent calling thread).
    // Each ring is a shared-memory region of its own on the server (its
    // --max-regions-per-identity counts them); one it refuses sends auto's calls through the
    // RPC for a second.
    int64_t ring_arena_bytes = int64_t{256} << 10;
    int64_t ring_max_arena_bytes = int64_t{1} << 20;
    double ring_spin_us = 50;
    int max_rings = 64;
    // A unary call whose arrays all travel by reference (shared memory) is answered in a few
    // milliseconds. With rpc_spin_us > 0 such a call polls for its answer on the calling
    // thread, for up to twice the last such call's wait where that was at most rpc_spin_us,
    // and sleeps past that. Off by default: on the H100, 2^24 unknowns by handle took 4.32 ms
    // p50 polling (10 ms) and 4.41 without, within the runs' noise, for a core kept busy.
    double rpc_spin_us = 0;
    int parallel_streams = 8;  // connections a large job's bytes are spread over
    // Through the server's memory, a batch of whole tridiagonal or tree systems (not
    // interleaved) goes in up to this many pieces of pipeline_piece_bytes or more: one piece is
    // solved while the next uploads and the previous one's x comes back (0 or 1: whole). So
    // does a solve by handle (the bytes moved: the right-hand side and x), split by its k
    // right-hand sides, or by ranges of a flat tridiagonal or tree batch's systems; updates
    // sent with it are applied first, to the whole system. On
    // the lent H100 host (16 connections, 2026-11-27) 2^24 unknowns (671 MB) went from p50
    // 176-280 ms whole to 176-189 ms in 4 pieces (one local core: 229-235 ms), while 64 x 65,536
    // (168 MB) lost in 4 pieces (71 against 54-72 ms): pieces of 128 MiB or more, up to 4.
    // -1 (the default): 4 where the server solves on a GPU (asked once), whole where it
    // solves on its CPU: a CPU backend's solve takes the cores the copies need, and the same
    // job there took 382-411 ms in pieces against 243-265 whole. Solves by handle go in pieces
    // only when asked (a value >= 2): on the H100 host they did not pay (136-178 ms whole,
    // 163-183 ms in 4 pieces, 195-221 ms in 8 for 2^24 unknowns).
    int pipeline_pieces = -1;
    int64_t pipeline_piece_bytes = int64_t{128} << 20;
    // Replicas (a list or dns: target): while a call is open, each connection is pinged after
    // this many seconds without traffic and dropped when no answer comes within the timeout, so
    // that a replica gone without closing its connections (a deleted pod, a stopped process)
    // fails its calls over (or makes its handles NOT_FOUND) instead of leaving them waiting
    // for TCP (0: off). The server accepts pings 1 s apart and more.
    double keepalive_s = 30, keepalive_timeout_s = 10;
    // A call on a connection that is not up waits for it this long, and at most half the time
    // left to its deadline, before it is made (0: made at once, gRPC's fail-fast). gRPC fails a
    // call at once, UNAVAILABLE, while its channel's last connection attempt has failed, and an
    // attempt can fail by chance on a server that listens (libgrpc 1.51, Debian 12's, reads
    // errno after other calls have overwritten it: docs/testing.md, "A first call that failed
    // to connect"); gRPC tries again after its backoff (100 ms here), so a call waits for that
    // attempt instead of failing. A server that cannot be reached still fails the call
    // UNAVAILABLE, this much later.
    double connect_timeout_s = 2;
  };
  // Whether the options ask for TLS.
  static bool UsesTls(const Options& o) { return !o.tls_ca_file.empty() || !o.tls_cert_file.empty(); }
  // Fails (the channel reports UNAVAILABLE on first use) when a TLS file cannot be read; use
  // Create to learn that up front.
  explicit Client(Options options);
  static absl::StatusOr<std::unique_ptr<Client>> Create(Options options);
  ~Client();

  absl::StatusOr<Result> Solve(const Job& job);

  // Persistent systems. CreateSystem takes a Job whose right-hand side may be left out (its
  // options pick the method, layout, iterations); the others name the system by handle.
  absl::StatusOr<SystemInfo> CreateSystem(const Job& job, const SystemOptions& options = {});
  // rhs: the system's right-hand-side shape, or [k, ...that shape] for k of them.
  absl::StatusOr<Result> SolveSystem(const std::string& handle, const ArrayView& rhs,
                                     const Updates& update = {}, const JobOptions& options = {});
  absl::StatusOr<SystemInfo> UpdateSystem(const std::string& handle, const Updates& update,
                                          const JobOptions& options = {});
  absl::StatusOr<SystemInfo> ReleaseSystem(const std::string& handle,
                                           const JobOptions& options = {});
  absl::StatusOr<std::vector<SystemInfo>> ListSystems(const JobOptions& options = {});
  absl::StatusOr<std::unique_ptr<StepStream>> OpenStepStream(const std::string& handle,
                                                             const JobOptions& options = {});
  // Registers `memory` with the server (under `name`, or one made from its key): arrays that lie
  // in it then travel by reference. The server maps it once; unregister before destroying it.
  absl::Status RegisterMemory(const SharedMemory& memory, const std::string& name = "");
  absl::Status UnregisterMemory(const SharedMemory& memory);
  // Registers CUDA memory of this process (trisolve/cuda_memory.h) under `name`: arrays and x
  // that lie in it then travel by reference and stay on the device. The server must run the
  // CUDA backend on its device, on this host. Unregister before freeing it. ttl_s: the idle
  // time-to-live (0: the server's default).
  absl::Status RegisterCudaMemory(const CudaMemory& memory, const std::string& name,
                                  double ttl_s = 0);
  absl::Status UnregisterCudaMemory(const CudaMemory& memory);
  // "shared-memory" once a staging region was registered, "grpc" when auto found the server
  // cannot map this process's memory (or the transport is grpc), "untried" before.
  std::string SharedMemoryState() const;
  // "ring" once a request ring was opened, "grpc" when the server serves none to this process,
  // "off" when the transport is neither auto nor ring, "untried" before.
  std::string RingState() const;

  absl::StatusOr<ServerInfoSummary> Info(double timeout_s = 10);
  // The grpc.health.v1 status of `service` ("" = the server as a whole): "SERVING", ...
  absl::StatusOr<std::string> Health(const std::string& service = "", double timeout_s = 5);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trisolve
