// How a call's arrays travel: by reference into registered shared memory (the server on this
// host), into the server's own memory over several connections at once (the server elsewhere),
// or in the messages.
#include <grpcpp/generic/generic_stub.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "chunk_wire.h"
#include "client_impl.h"

namespace trisolve {

absl::StatusOr<Transport> ParseTransport(absl::string_view name) {
  if (name == "auto") return Transport::kAuto;
  if (name == "shm" || name == "shared-memory") return Transport::kSharedMemory;
  if (name == "streams") return Transport::kStreams;
  if (name == "grpc") return Transport::kGrpc;
  if (name == "ring") return Transport::kRing;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "' (expected auto, shm, streams, grpc or ring)"));
}

namespace {

using Clock = std::chrono::steady_clock;

// The CUDA memory every Client of the process registered (a process's device memory is the
// process's, whichever client registered it).
std::mutex& CudaRangesMu() {
  static std::mutex mu;
  return mu;
}
std::vector<std::pair<const std::byte*, int64_t>>& CudaRanges() {
  static std::vector<std::pair<const std::byte*, int64_t>> ranges;
  return ranges;
}

bool Stale(Clock::time_point since, double ttl_s) {
  return ttl_s > 0 && std::chrono::duration<double>(Clock::now() - since).count() > 0.5 * ttl_s;
}

}  // namespace

Client::Impl::~Impl() {
  for (auto& a : idle_arenas) (void)Unregister(a.arena->data());
  for (const Remote& r : idle_remote) UnregisterRemote(r.name);
}

std::optional<v1::RegionRef> Client::Impl::RefOf(const void* p, int64_t bytes) const {
  if (p == nullptr) return std::nullopt;
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(shm_mu);
  for (const Registered& r : registered)
    if (b >= r.base && b + bytes <= r.base + r.bytes) {
      v1::RegionRef ref;
      ref.set_region(r.name);
      ref.set_offset(b - r.base);
      ref.set_bytes(bytes);
      return ref;
    }
  return std::nullopt;
}

void Client::Impl::Auth(grpc::ClientContext& ctx) const {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.token);
}

absl::Status Client::Impl::Register(const SharedMemory& m, const std::string& name,
                                    double* ttl_s) {
  if (replicas && replicas->balanced())
    return absl::FailedPreconditionError(
        "shared memory needs a client of one server: this one balances over replicas");
  v1::RegisterSharedMemoryRequest req;
  req.set_name(name);
  req.set_key(m.key());
  req.set_bytes(m.size());
  grpc::ClientContext ctx;
  Auth(ctx);
  AwaitConnection(ctx);
  v1::MemoryRegion resp;
  grpc::Status st = stub->RegisterSharedMemory(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st);
  if (ttl_s != nullptr) *ttl_s = resp.ttl_s();
  std::lock_guard<std::mutex> lock(shm_mu);
  registered.push_back({m.data(), m.size(), name});
  return absl::OkStatus();
}

absl::Status Client::Impl::RegisterCuda(const CudaMemory& m, const std::string& name,
                                        double ttl_s) {
  if (replicas && replicas->balanced())
    return absl::FailedPreconditionError(
        "CUDA memory needs a client of one server: this one balances over replicas");
  if (m.data == nullptr || m.bytes <= 0)
    return absl::InvalidArgumentError("CudaMemory: data and bytes must describe memory");
  v1::RegisterCudaMemoryRequest req;
  req.set_name(name);
  req.set_handle(m.handle);
  req.set_device(m.device);
  req.set_offset(m.offset);
  req.set_bytes(m.bytes);
  req.set_ttl_s(ttl_s);
  grpc::ClientContext ctx;
  Auth(ctx);
  AwaitConnection(ctx);
  v1::MemoryRegion resp;
  grpc::Status st = stub->RegisterCudaMemory(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st);
  {
    std::lock_guard<std::mutex> lock(shm_mu);
    registered.push_back({static_cast<const std::byte*>(m.data), m.bytes, name, true});
  }
  std::lock_guard<std::mutex> lock(CudaRangesMu());
  CudaRanges().push_back({static_cast<const std::byte*>(m.data), m.bytes});
  return absl::OkStatus();
}

namespace {
constexpr int64_t kFreshMin = int64_t{4} << 20;        // smaller: a plain resize
constexpr int64_t kFreshAsyncMin = int64_t{16} << 20;  // smaller: not worth a thread
}  // namespace

// A fresh x of 134 MB zeroed by resize alone took 190-400 ms on the 2-core build machine (one
// page fault each 4 KiB); in 2 MiB pages, 45-58 ms, and freeing it ~1 ms instead of 26-44. Not
// populated by MADV_POPULATE_WRITE as well: that holds the process's mmap lock throughout, and
// with it the H100's upload beside it took 44-45 ms against 23-27 without a fresh x made
// meanwhile (tests/bench/NOTES.md, "By handle: the unaccounted time").
std::vector<std::byte> internal::FreshBuffer(int64_t bytes) {
  std::vector<std::byte> v;
  if (bytes <= 0) return v;
  if (bytes >= kFreshMin) {
    v.reserve(size_t(bytes));
    constexpr uintptr_t kHuge = uintptr_t{2} << 20;
    const auto p = reinterpret_cast<uintptr_t>(v.data());
    const uintptr_t lo = (p + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t hi = (p + uintptr_t(bytes)) & ~(kHuge - 1);
    // Advice only: where the kernel refuses it, the pages are 4 KiB ones.
    if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
  }
  v.resize(size_t(bytes));
  return v;
}

std::future<std::vector<std::byte>> internal::FreshBufferAsync(int64_t bytes) {
  if (bytes >= kFreshAsyncMin) return std::async(std::launch::async, FreshBuffer, bytes);
  std::promise<std::vector<std::byte>> now;
  now.set_value(FreshBuffer(bytes));
  return now.get_future();
}

bool internal::InCudaMemory(const void* p, int64_t bytes) {
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(CudaRangesMu());
  for (const auto& [base, n] : CudaRanges())
    if (b < base + n && base < b + bytes) return true;
  return false;
}

absl::Status Client::Impl::Unregister(const std::byte* base) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(shm_mu);
    auto it = std::find_if(registered.begin(), registered.end(),
                           [&](const Registered& r) { return r.base == base; });
    if (it == registered.end()) return absl::NotFoundError("this memory is not registered");
    name = it->name;
    if (it->cuda) {
      std::lock_guard<std::mutex> cuda_lock(CudaRangesMu());
      auto& ranges = CudaRanges();
      auto r = std::find(ranges.begin(), ranges.end(), std::pair{it->base, it->bytes});
      if (r != ranges.end()) ranges.erase(r);
    }
    registered.erase(it);
  }
  v1::UnregisterMemoryRequest req;
  req.set_name(name);
  grpc::ClientContext ctx;
  Auth(ctx);
  AwaitConnection(ctx);
  v1::MemoryRegion resp;
  return FromGrpc(stub->UnregisterMemory(&ctx, req, &resp));
}

absl::StatusOr<std::unique_ptr<SharedMemory>> Client::Impl::AcquireArena(int64_t bytes) {
  {
    std::unique_lock<std::mutex> lock(shm_mu);
    if (shm == Shm::kNo && options.transport == Transport::kAuto)
      return absl::FailedPreconditionError("the server cannot map this process's memory");
    // Regions idle for half their time-to-live are let go: the server may drop them meanwhile.
    std::vector<std::unique_ptr<SharedMemory>> stale;
    for (auto it = idle_arenas.begin(); it != idle_arenas.end();) {
      if (Stale(it->since, it->ttl_s)) {
        stale.push_back(std::move(it->arena));
        it = idle_arenas.erase(it);
        --arenas;
      } else {
        ++it;
      }
    }
    auto best = idle_arenas.end();
    for (auto it = idle_arenas.begin(); it != idle_arenas.end(); ++it)
      if (it->arena->size() >= bytes &&
          (best == idle_arenas.end() || it->arena->size() < best->arena->size()))
        best = it;
    if (best != idle_arenas.end()) {
      auto a = std::move(best->arena);
      idle_arenas.erase(best);
      lock.unlock();
      for (auto& g : stale) (void)Unregister(g->data());
      return a;
    }
    if (arenas >= kMaxArenas && !idle_arenas.empty()) {
      // Trade the smallest idle one for a larger one.
      auto small = std::min_element(idle_arenas.begin(), idle_arenas.end(), [](const auto& x, const auto& y) {
        return x.arena->size() < y.arena->size();
      });
      stale.push_back(std::move(small->arena));
      idle_arenas.erase(small);
      --arenas;
    }
    if (!stale.empty()) {
      lock.unlock();
      for (auto& g : stale) (void)Unregister(g->data());
      lock.lock();
    }
    if (arenas >= kMaxArenas)
      return absl::ResourceExhaustedError("every staging region of this client is in use");
    ++arenas;
  }
  int64_t size = int64_t{16} << 20;
  while (size < bytes) size *= 2;
  auto a = SharedMemory::Create(size);
  absl::Status st = a.ok() ? absl::OkStatus() : a.status();
  double ttl = 0;
  if (st.ok())
    st = Register(**a, absl::StrCat("staging-", next_arena++, "-", (*a)->key().substr(10, 8)), &ttl);
  std::lock_guard<std::mutex> lock(shm_mu);
  if (st.ok()) arena_ttl[(*a)->data()] = ttl;
  if (!st.ok()) {
    --arenas;
    if (st.code() == absl::StatusCode::kFailedPrecondition ||
        st.code() == absl::StatusCode::kUnimplemented)
      shm = Shm::kNo;
    return st;
  }
  shm = Shm::kYes;
  return a;
}

void Client::Impl::ReleaseArena(std::unique_ptr<SharedMemory> a) {
  a->Reset();
  std::lock_guard<std::mutex> lock(shm_mu);
  const double ttl = arena_ttl[a->data()];
  idle_arenas.push_back({std::move(a), Clock::now(), ttl});
}

// ---- the server's memory ------------------------------------------------------------------

std::unique_ptr<Client::Impl::Remote> Client::Impl::AcquireRemoteOrNull(int64_t bytes,
                                                                        absl::Status* error) {
  std::string traded;  // an idle region given up for this one
  {
    std::lock_guard<std::mutex> lock(remote_mu);
    // Those idle for half their time-to-live are left to expire on the server.
    idle_remote.erase(std::remove_if(idle_remote.begin(), idle_remote.end(),
                                     [&](const Remote& r) {
                                       if (!Stale(r.since, r.ttl_s)) return false;
                                       --remotes;
                                       return true;
                                     }),
                      idle_remote.end());
    auto best = idle_remote.end();
    for (auto it = idle_remote.begin(); it != idle_remote.end(); ++it)
      if (it->bytes >= bytes && (best == idle_remote.end() || it->bytes < best->bytes)) best = it;
    if (best != idle_remote.end()) {
      auto r = std::make_unique<Remote>(std::move(*best));
      idle_remote.erase(best);
      r->since = Clock::now();  // in use from now (ReleaseRemote)
      return r;
    }
    if (remotes >= kMaxArenas && !idle_remote.empty()) {
      // Trade the smallest idle one for a larger one.
      auto small = std::min_element(
          idle_remote.begin(), idle_remote.end(),
          [](const Remote& x, const Remote& y) { return x.bytes < y.bytes; });
      traded = small->name;
      idle_remote.erase(small);
      --remotes;
    }
    if (remotes >= kMaxArenas) {
      *error = absl::ResourceExhaustedError("every upload region of this client is in use");
      return nullptr;
    }
    ++remotes;
  }
  if (!traded.empty()) UnregisterRemote(traded);
  int64_t size = int64_t{16} << 20;
  while (size < bytes) size *= 2;
  std::random_device rd;
  auto r = std::make_unique<Remote>();
  r->name = absl::StrFormat("upload-%08x%08x", rd(), rd());
  r->bytes = size;
  v1::AllocateMemoryRequest req;
  req.set_name(r->name);
  req.set_bytes(size);
  v1::MemoryRegion resp;
  grpc::Status st;
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext ctx;
    Auth(ctx);
    AwaitConnection(ctx);
    st = stub->AllocateMemory(&ctx, req, &resp);
    // Over the caller's caps: this client's own idle regions count against them, so they go
    // (their bytes are nobody's now) and the allocation is asked for once more.
    if (st.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || attempt > 0 ||
        DropIdleRemote() == 0)
      break;
  }
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(remote_mu);
    --remotes;
    *error = FromGrpc(st);
    return nullptr;
  }
  r->ttl_s = resp.ttl_s();
  r->since = Clock::now();
  return r;
}

int Client::Impl::DropIdleRemote() {
  std::vector<Remote> idle;
  {
    std::lock_guard<std::mutex> lock(remote_mu);
    idle.swap(idle_remote);
    remotes -= int(idle.size());
  }
  for (const Remote& r : idle) UnregisterRemote(r.name);
  return int(idle.size());
}

void Client::Impl::UnregisterRemote(const std::string& name) {
  v1::UnregisterMemoryRequest req;
  req.set_name(name);
  grpc::ClientContext ctx;
  Auth(ctx);  // errors are ignored (it may have expired): no wait for the connection either
  v1::MemoryRegion resp;
  (void)stub->UnregisterMemory(&ctx, req, &resp);
}

void Client::Impl::ReleaseRemote(Remote r) {
  // A call that held the region for half its time-to-live or more (a slow job, a loaded host)
  // may have outlived it on the server, which counts a region's idle time from its last write:
  // given up, never reused, so that no later call meets NOT_FOUND for it.
  if (Stale(r.since, r.ttl_s)) {
    UnregisterRemote(r.name);
    std::lock_guard<std::mutex> lock(remote_mu);
    --remotes;
    return;
  }
  r.since = Clock::now();
  std::lock_guard<std::mutex> lock(remote_mu);
  idle_remote.push_back(std::move(r));
}

std::shared_ptr<grpc::Channel> Client::Impl::Lane(size_t i) {
  std::lock_guard<std::mutex> lock(remote_mu);
  while (lanes.size() <= i)
    lanes.push_back(grpc::CreateCustomChannel(options.target, credentials,
                                              ChannelArgs(options, /*own_connection=*/true)));
  return lanes[i];
}

namespace {

// [0, total) in `parts` shares of whole chunks, as (begin, end).
std::vector<std::pair<int64_t, int64_t>> Shares(int64_t total, int parts) {
  std::vector<std::pair<int64_t, int64_t>> s;
  const int64_t per = (total + parts - 1) / parts;
  for (int64_t b = 0; b < total; b += per) s.emplace_back(b, std::min(total, b + per));
  return s;
}

// Runs f(i) for each i < n on a thread of its own; the first error.
absl::Status InParallel(size_t n, const std::function<absl::Status(size_t)>& f) {
  std::vector<absl::Status> st(n);
  std::vector<std::thread> t;
  for (size_t i = 1; i < n; ++i) t.emplace_back([&, i] { st[i] = f(i); });
  if (n > 0) st[0] = f(0);
  for (auto& th : t) th.join();
  for (auto& s : st)
    if (!s.ok()) return s;
  return absl::OkStatus();
}

constexpr int64_t kChunk = int64_t{4} << 20;
constexpr int64_t kPerLaneMin = int64_t{8} << 20;  // less than this a lane is not worth opening

// The bulk streams go through a generic stub so that the chunks are our own buffers
// (chunk_wire.h): a chunk sent is a slice pointing at the caller's array, and a chunk received
// is copied from gRPC's slices straight to where x goes. One operation is in flight at a time
// on each stream, as on a synchronous one.
class RawStream {
 public:
  RawStream(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx,
            const char* method)
      : stub_(channel), call_(stub_.PrepareCall(ctx, method, &cq_)) {
    call_->StartCall(this);
    ok_ = Await();
  }
  ~RawStream() {
    call_.reset();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    // gRPC may hold a chunk's slice until it is on the wire or the call is gone: the caller's
    // memory must outlive that.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_ == 0; });
  }
  // Sends [data, data + bytes) at `offset` of `region` without copying it.
  bool WriteChunk(const std::string& region, int64_t offset, const std::byte* data, int64_t bytes) {
    if (!ok_) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++held_;
    }
    grpc::ByteBuffer bb = wire::EncodeMemoryChunk(region, offset, data, bytes, &Released, this);
    call_->Write(bb, this);
    return ok_ = Await();
  }
  bool WriteMessage(const google::protobuf::Message& m) {
    if (!ok_) return false;
    grpc::ByteBuffer bb;
    bool own;
    if (!grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(m, &bb, &own)
             .ok())
      return ok_ = false;
    call_->Write(bb, this);
    return ok_ = Await();
  }
  bool Read(grpc::ByteBuffer* bb) {
    if (!ok_) return false;
    call_->Read(bb, this);
    return Await();
  }
  grpc::Status Finish() {
    if (ok_) {
      call_->WritesDone(this);
      Await();
    }
    grpc::ByteBuffer rest;  // WriteMemory's answer, unused
    while (Read(&rest)) {
    }
    grpc::Status st;
    call_->Finish(&st, this);
    Await();
    return st;
  }

 private:
  static void Released(void* self) {
    auto* s = static_cast<RawStream*>(self);
    std::lock_guard<std::mutex> lock(s->mu_);
    if (--s->held_ == 0) s->cv_.notify_all();
  }
  bool Await() {
    void* tag;
    bool ok = false;
    return cq_.Next(&tag, &ok) && ok;
  }
  grpc::CompletionQueue cq_;
  grpc::GenericStub stub_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool ok_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t held_ = 0;
};

}  // namespace

absl::Status Client::Impl::Upload(const std::string& region, const std::vector<Piece>& pieces,
                                  bool piece) {
  int64_t total = 0;
  for (const Piece& p : pieces) total += p.bytes;
  const int lanes_wanted = int(std::clamp<int64_t>(total / (piece ? kChunk : kPerLaneMin), 1,
                                                   options.parallel_streams));
  const auto shares = Shares(total, lanes_wanted);
  return InParallel(shares.size(), [&](size_t lane) -> absl::Status {
    auto [begin, end] = shares[lane];
    grpc::ClientContext ctx;
    if (!options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.token);
    const auto lane_channel = Lane(lane);
    AwaitConnection(*lane_channel, ctx.deadline());
    RawStream w(lane_channel, &ctx, "/trisolve.v1.Solver/WriteMemory");
    int64_t at = 0;  // position in the concatenation of the pieces
    bool sent = true;
    for (const Piece& p : pieces) {
      const int64_t lo = std::max(begin, at), hi = std::min(end, at + p.bytes);
      for (int64_t q = lo; sent && q < hi; q += kChunk) {
        const int64_t len = std::min(kChunk, hi - q);
        sent = w.WriteChunk(region, p.offset + (q - at), p.src + (q - at), len);
      }
      at += p.bytes;
    }
    return FromGrpc(w.Finish());
  });
}

absl::Status Client::Impl::Download(const std::string& region, int64_t offset, int64_t bytes,
                                    std::byte* dst, bool piece) {
  const int lanes_wanted = int(std::clamp<int64_t>(bytes / (piece ? kChunk : kPerLaneMin), 1,
                                                   options.parallel_streams));
  const auto shares = Shares(bytes, lanes_wanted);
  return InParallel(shares.size(), [&](size_t lane) -> absl::Status {
    auto [begin, end] = shares[lane];
    grpc::ClientContext ctx;
    if (!options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.token);
    v1::ReadMemoryRequest req;
    req.set_region(region);
    req.set_offset(offset + begin);
    req.set_bytes(end - begin);
    // Connections of their own: a connection's reads and writes take turns in gRPC's
    // transport, and a piece's x comes down while the next piece goes up (RunPipeline).
    const auto lane_channel = Lane(size_t(std::max(options.parallel_streams, 1)) + lane);
    AwaitConnection(*lane_channel, ctx.deadline());
    RawStream r(lane_channel, &ctx, "/trisolve.v1.Solver/ReadMemory");
    r.WriteMessage(req);
    grpc::ByteBuffer bb;
    wire::MemoryChunkView c;
    absl::Status bad;
    while (bad.ok() && r.Read(&bb)) {
      if (auto st = c.Parse(bb); !st.ok()) {
        bad = absl::DataLossError(st.message());
        break;
      }
      const int64_t at = c.offset() - offset;
      if (at < begin || c.bytes() > end - at) {
        bad = absl::DataLossError("the server sent a chunk outside the range asked for");
        break;
      }
      c.CopyTo(dst + at);
    }
    if (!bad.ok()) {
      ctx.TryCancel();
      (void)r.Finish();
      return bad;
    }
    return FromGrpc(r.Finish());
  });
}

absl::Status Client::Impl::RunPipeline(int pieces, const PipelineStages& stages,
                                       double* upload_us, double* download_us) {
  std::mutex mu;
  std::condition_variable cv;
  int uploaded = 0, solved = 0;
  absl::Status failed;
  auto fail = [&](absl::Status st) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.ok()) failed = std::move(st);
    cv.notify_all();
  };
  auto advance = [&](int* counter) {
    std::lock_guard<std::mutex> lock(mu);
    ++*counter;
    cv.notify_all();
  };
  auto await = [&](const int* counter, int k) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return *counter > k || !failed.ok(); });
    return failed.ok();
  };
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  };
  std::thread up([&] {
    for (int k = 0; k < pieces; ++k) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed.ok()) return;
      }
      const auto t0 = Clock::now();
      absl::Status st = stages.upload(k);
      *upload_us += since(t0);
      if (!st.ok()) return fail(st);
      advance(&uploaded);
    }
  });
  std::thread down([&] {
    for (int k = 0; k < pieces; ++k) {
      if (!await(&solved, k)) return;
      const auto t0 = Clock::now();
      absl::Status st = stages.download(k);
      *download_us += since(t0);
      if (!st.ok()) return fail(st);
    }
  });
  for (int k = 0; k < pieces; ++k) {
    if (!await(&uploaded, k)) break;
    if (absl::Status st = stages.solve(k); !st.ok()) {
      fail(st);
      break;
    }
    advance(&solved);
  }
  up.join();
  down.join();
  return failed;
}

// ---- placing a call's arrays --------------------------------------------------------------

Client::Impl::Staging::~Staging() {
  if (arena_) impl_->ReleaseArena(std::move(arena_));
  if (!remote_.name.empty()) impl_->ReleaseRemote(std::move(remote_));
}

absl::Status Client::Impl::StageShared(const std::vector<ArrayView>& arrays, int64_t need,
                                       int64_t x_bytes, Placement* pl) {
  auto arena = AcquireArena(need);
  if (!arena.ok()) return arena.status();
  pl->staging = std::make_unique<Staging>(this, *std::move(arena));
  SharedMemory& a = *pl->staging->arena();
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (pl->refs[i]) continue;
    auto p = a.Allocate(arrays[i].bytes());
    if (!p.ok()) return p.status();
    std::memcpy(*p, arrays[i].data, size_t(arrays[i].bytes()));
    pl->refs[i] = RefOf(*p, arrays[i].bytes());
  }
  if (!pl->x_ref) {
    auto p = a.Allocate(x_bytes);
    if (!p.ok()) return p.status();
    pl->x_staged = static_cast<std::byte*>(*p);
    pl->x_ref = RefOf(*p, x_bytes);
  }
  pl->inline_bytes = 0;
  pl->transport = "shared-memory";
  return absl::OkStatus();
}

absl::Status Client::Impl::StageRemote(const std::vector<ArrayView>& arrays, int64_t need,
                                       int64_t x_bytes, Placement* pl) {
  absl::Status error;
  std::unique_ptr<Remote> remote = AcquireRemoteOrNull(need, &error);
  if (!remote) return error;
  const std::string name = remote->name;
  pl->staging = std::make_unique<Staging>(this, std::move(*remote));
  std::vector<Piece> pieces;
  int64_t at = 0;
  auto ref = [&](int64_t offset, int64_t bytes) {
    v1::RegionRef r;
    r.set_region(name);
    r.set_offset(offset);
    r.set_bytes(bytes);
    return r;
  };
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (pl->refs[i]) continue;
    pieces.push_back({static_cast<const std::byte*>(arrays[i].data), at, arrays[i].bytes()});
    pl->refs[i] = ref(at, arrays[i].bytes());
    at += (arrays[i].bytes() + 63) / 64 * 64;
  }
  if (!pl->x_ref) {
    pl->x_remote = at;
    pl->x_ref = ref(at, x_bytes);
  }
  const auto t0 = Clock::now();
  if (auto st = Upload(name, pieces); !st.ok()) return st;
  pl->upload_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  pl->inline_bytes = 0;
  pl->transport = "streams";
  return absl::OkStatus();
}

absl::StatusOr<Client::Impl::Placement> Client::Impl::Place(const std::vector<ArrayView>& arrays,
                                                            void* x_out, int64_t x_bytes) {
  Placement pl;
  pl.refs.resize(arrays.size());
  int64_t need = 0;
  for (size_t i = 0; i < arrays.size(); ++i) {
    pl.refs[i] = RefOf(arrays[i].data, arrays[i].bytes());
    if (!pl.refs[i]) {
      pl.inline_bytes += arrays[i].bytes();
      need += (arrays[i].bytes() + 63) / 64 * 64;
    }
  }
  if (x_out != nullptr) pl.x_ref = RefOf(x_out, x_bytes);
  if (!pl.x_ref) need += (x_bytes + 63) / 64 * 64;
  if (pl.inline_bytes == 0 && pl.x_ref) pl.transport = "shared-memory";
  const Transport tr = options.transport;
  const int64_t moved = pl.inline_bytes + (pl.x_ref ? 0 : x_bytes);
  if (need == 0 || tr == Transport::kGrpc) return pl;
  if (replicas && replicas->balanced()) {
    if (tr == Transport::kAuto) return pl;
    return absl::FailedPreconditionError(
        "shared memory and parallel streams need a client of one server: this one balances "
        "over replicas (use transport auto or grpc)");
  }
  if (x_out == nullptr && !pl.x_ref && x_bytes > 0)
    pl.x_fresh = internal::FreshBufferAsync(x_bytes);
  if (tr == Transport::kSharedMemory ||
      (tr == Transport::kAuto && moved >= options.shm_min_bytes)) {
    const absl::Status st = StageShared(arrays, need, x_bytes, &pl);
    if (st.ok() || tr == Transport::kSharedMemory) {
      if (!st.ok()) return st;
      return pl;
    }
    pl.staging.reset();
  }
  if (tr == Transport::kStreams || (tr == Transport::kAuto && moved >= options.streams_min_bytes)) {
    const absl::Status st = StageRemote(arrays, need, x_bytes, &pl);
    if (st.ok()) return pl;
    if (tr == Transport::kStreams) return st;
    // auto: in the messages after all (refs placed by a failed upload are dropped).
    Placement plain;
    plain.refs.resize(arrays.size());
    for (size_t i = 0; i < arrays.size(); ++i) plain.refs[i] = RefOf(arrays[i].data, arrays[i].bytes());
    if (x_out != nullptr) plain.x_ref = RefOf(x_out, x_bytes);
    plain.inline_bytes = pl.inline_bytes;
    return plain;
  }
  return pl;
}

absl::Status Client::Impl::DeliverX(Placement& pl, void* x_out, int64_t x_bytes, NdArray* x,
                                    Timings* timings) {
  if (timings != nullptr) timings->upload_us = pl.upload_us;
  const auto own_x = [&] {
    x->data = pl.x_fresh.valid() ? pl.x_fresh.get() : internal::FreshBuffer(x_bytes);
  };
  if (pl.x_remote >= 0) {
    auto* dst = static_cast<std::byte*>(x_out);
    if (dst == nullptr) {
      own_x();
      dst = x->data.data();
    }
    const auto t0 = Clock::now();
    absl::Status st = Download(pl.staging->remote().name, pl.x_remote, x_bytes, dst);
    if (timings != nullptr)
      timings->download_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    return st;
  }
  if (pl.x_staged != nullptr) {
    if (x_out != nullptr) {
      std::memcpy(x_out, pl.x_staged, size_t(x_bytes));
    } else {
      own_x();
      std::memcpy(x->data.data(), pl.x_staged, size_t(x_bytes));
    }
  } else if (x_out != nullptr && !pl.x_ref) {
    std::memcpy(x_out, x->data.data(), std::min(x->data.size(), size_t(x_bytes)));
    x->data.clear();
  }
  return absl::OkStatus();
}

}  // namespace trisolve
