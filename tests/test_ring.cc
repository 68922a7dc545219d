// Request rings end to end: the real trisolved on loopback, rings opened by this process (through
// the C++ client, and by hand through the ABI, proto/ring_abi.h). Answers equal the gRPC path's
// bit for bit, every family and by handle, under many threads; every malformed descriptor field
// answered with its own status in the slot, random descriptors survived; a ring's region
// unregistered or expired closes it; a client killed mid-request costs the server nothing;
// shutdown closes the rings; the limits.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <linux/futex.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client_test_util.h"
#include "gtest/gtest.h"
#include "ring_abi.h"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/shared_memory.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using namespace trisolve::ring;  // NOLINT
using testing::ClientOptions;
using testing::ServerProcess;
using Clock = std::chrono::steady_clock;

// The ABI of version 2, pinned: a change of any size or offset must come with a new version
// (and this table extended), or this fails to compile. (Version 2 added RingArray::region,
// RingRequest::regions and x_region: arrays and x read and written in other regions in place.
// RingHeader::queued came later out of its reserved bytes, which a side that predates it leaves
// 0, so the version stayed.)
static_assert(kRingVersion != 2 ||
              (sizeof(RingHeader) == 64 && sizeof(RingSlot) == 1536 &&
               sizeof(RingRequest) == 960 && sizeof(RingAnswer) == 488 &&
               sizeof(RingArray) == 72 && offsetof(RingHeader, doorbell) == 24 &&
               offsetof(RingHeader, sleeping) == 28 && offsetof(RingHeader, heartbeat) == 32 &&
               offsetof(RingHeader, closed) == 36 && offsetof(RingHeader, queued) == 40 &&
               offsetof(RingSlot, state) == 0 &&
               offsetof(RingSlot, waiting) == 4 && offsetof(RingSlot, request) == 64 &&
               offsetof(RingSlot, answer) == 1024 && offsetof(RingRequest, method) == 24 &&
               offsetof(RingRequest, handle) == 56 && offsetof(RingRequest, request_id) == 120 &&
               offsetof(RingRequest, deadline_unix_ns) == 184 &&
               offsetof(RingRequest, arrays) == 208 && offsetof(RingRequest, x_offset) == 784 &&
               offsetof(RingRequest, regions) == 816 && offsetof(RingRequest, x_region) == 944 &&
               offsetof(RingRequest, tag) == 952 && offsetof(RingAnswer, message) == 8 &&
               offsetof(RingAnswer, x_shape) == 256 && offsetof(RingAnswer, statuses) == 288 &&
               offsetof(RingAnswer, tag) == 480 && offsetof(RingArray, region) == 20 &&
               offsetof(RingArray, offset) == 56 && kRingMaxRegions == 2 &&
               kRingMagic == 0x31474e4952535454ull),
              "the ring's layout changed: bump kRingVersion and document it (docs/api.md)");

TEST(RingAbi, LayoutIsPinnedToItsVersion) {
  EXPECT_EQ(kRingVersion, 2u);
  EXPECT_EQ(RingBytes(1), 64 + 1536);
  EXPECT_EQ(sizeof(RingSlot) % kRingAlign, 0u);
}

// Every family, and first a single system (the smallest request a ring carries).
std::vector<testing::Family> EveryFamilyAndOneSystem() {
  std::vector<testing::Family> f = testing::EveryFamily();
  f.insert(f.begin(), {Kind::kTridiagonal, examples::RandomTridiagonal(1, 64, false, 1)});
  return f;
}

TEST(Ring, EveryFamilyAnswersAsOverTheSocketBitForBit) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client grpc_client(ClientOptions(server, Transport::kGrpc));
  Client ring_client(ClientOptions(server, Transport::kRing));
  Client::Options auto_opts = ClientOptions(server, Transport::kAuto);
  auto_opts.ring_arena_bytes = 1 << 20;  // the largest job here: 64 x 300
  Client auto_client(auto_opts);
  EXPECT_EQ(ring_client.RingState(), "untried");
  EXPECT_EQ(grpc_client.RingState(), "off");
  for (const testing::Family& f : EveryFamilyAndOneSystem()) {
    SCOPED_TRACE(std::string(KindName(f.kind)));
    const Job job = f.AsJob();
    auto want = grpc_client.Solve(job);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(want->summary.transport, "grpc");
    for (Client* c : {&ring_client, &auto_client}) {
      auto got = c->Solve(job);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->summary.transport, "ring");
      EXPECT_EQ(got->x.dtype, want->x.dtype);
      EXPECT_EQ(got->x.shape, want->x.shape);
      EXPECT_EQ(got->x.data, want->x.data) << "the ring's x differs from the socket's";
      EXPECT_EQ(got->status, want->status);
      EXPECT_EQ(got->summary.method, want->summary.method);
      EXPECT_EQ(got->summary.systems, want->summary.systems);
      EXPECT_EQ(got->summary.ok, want->summary.ok);
      EXPECT_EQ(got->summary.iterations, want->summary.iterations);
      if (!std::isnan(want->summary.residual)) {
        EXPECT_EQ(got->summary.residual, want->summary.residual);
      }
      EXPECT_FALSE(got->summary.request_id.empty());
    }
  }
  EXPECT_EQ(ring_client.RingState(), "ring");

  // float32, x into the caller's own array, and a bad request's status.
  examples::Arrays a32;
  for (const auto& [name, a] : examples::RandomTridiagonal(4, 64, false, 5))
    a32[name] = *a.ConvertTo(DType::kFloat32);
  Job job32 = testing::MakeJob(Kind::kTridiagonal, a32);
  auto want32 = grpc_client.Solve(job32);
  ASSERT_TRUE(want32.ok()) << want32.status();
  std::vector<float> x(4 * 64, -1.0f);
  job32.options.x_out = x.data();
  auto got32 = ring_client.Solve(job32);
  ASSERT_TRUE(got32.ok()) << got32.status();
  EXPECT_EQ(got32->x.dtype, DType::kFloat32);
  EXPECT_TRUE(got32->x.data.empty());
  EXPECT_EQ(std::memcmp(x.data(), want32->x.data.data(), x.size() * 4), 0);

  const auto bad_arrays = examples::RandomTridiagonal(2, 64, false, 6);  // the job views them
  Job bad = testing::MakeJob(Kind::kTridiagonal, bad_arrays);
  bad.options.method = "no-such-method";
  auto over_grpc = grpc_client.Solve(bad);
  auto over_ring = ring_client.Solve(bad);
  ASSERT_FALSE(over_grpc.ok());
  EXPECT_EQ(over_ring.status(), over_grpc.status()) << "the same check, the same status";

  // A job larger than the most a ring may grow to: auto takes the RPC.
  Client::Options small = ClientOptions(server, Transport::kAuto);
  small.ring_arena_bytes = small.ring_max_arena_bytes = 4096;
  const auto big_arrays = examples::RandomTridiagonal(16, 64, false, 7);  // the job views them
  const Job big = testing::MakeJob(Kind::kTridiagonal, big_arrays);
  auto via_auto = Client(small).Solve(big);
  ASSERT_TRUE(via_auto.ok()) << via_auto.status();
  EXPECT_EQ(via_auto->summary.transport, "grpc");
}

// Under auto a call larger than its ring's arena replaces the ring with one of twice the room or
// more (up to ring_max_arena_bytes), which then serves the small calls too; past the most, the
// call takes another path. Every answer is the RPC's, bit for bit.
TEST(Ring, AutoGrowsACallersRingUpToItsMost) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client grpc_client(ClientOptions(server, Transport::kGrpc));
  Client::Options o = ClientOptions(server, Transport::kAuto);
  o.ring_arena_bytes = 4096;
  o.ring_max_arena_bytes = 1 << 20;
  Client c(o);
  const auto small = examples::RandomTridiagonal(1, 64, false, 11);   // 2.5 KiB with x
  const auto mid = examples::RandomTridiagonal(16, 512, false, 12);   // 320 KiB with x
  const auto big = examples::RandomTridiagonal(64, 512, false, 13);   // 1.25 MiB with x
  struct Step {
    const examples::Arrays* arrays;
    int64_t batch, n;
    bool ring;
  };
  for (const Step& s : {Step{&small, 1, 64, true}, Step{&mid, 16, 512, true},
                        Step{&small, 1, 64, true}, Step{&mid, 16, 512, true},
                        Step{&big, 64, 512, false}}) {
    SCOPED_TRACE(absl::StrCat(s.batch, " x ", s.n));
    const Job job = testing::MakeJob(Kind::kTridiagonal, *s.arrays);
    auto want = grpc_client.Solve(job);
    auto got = c.Solve(job);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.transport == "ring", s.ring) << got->summary.transport;
    ASSERT_EQ(got->x.data, want->x.data);
  }
  // One ring replaced (the first, of 4 KiB, by one of 512 KiB), none since: the small calls
  // after the growth took the grown ring.
  auto closed = [&] {
    const std::string log = server.Log();
    int k = 0;
    for (size_t at = 0; (at = log.find("closed (by its client)", at)) != std::string::npos; ++at) ++k;
    return k;
  };
  for (int i = 0; i < 100 && closed() < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(closed(), 1) << server.Log();
}

TEST(Ring, MetricsCountRingCallsUnderTheirTransport) {
  ServerProcess server({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client ring_client(ClientOptions(server, Transport::kRing));
  const auto job_arrays = examples::RandomTridiagonal(1, 64, false, 3);  // the job views them
  const Job job = testing::MakeJob(Kind::kTridiagonal, job_arrays);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(ring_client.Solve(job).ok());
  Job bad = job;
  bad.options.method = "nope";
  ASSERT_FALSE(ring_client.Solve(bad).ok());
  ASSERT_TRUE(Client(ClientOptions(server, Transport::kGrpc)).Solve(job).ok());
  const int metrics_port = server.MetricsPort();
  ASSERT_GT(metrics_port, 0) << server.Log();
  auto scraped = httplib::Client("127.0.0.1", metrics_port).Get("/metrics");
  ASSERT_TRUE(scraped);
  const std::string& body = scraped->body;
  // (The method label is what ran, as for the RPC.)
  EXPECT_TRUE(std::regex_search(body, std::regex(
      R"(trisolve_requests_total\{rpc="SolveTridiagonal",family="tridiagonal",method="[^"]*",code="OK",transport="ring"\} 3\n)")))
      << body;
  EXPECT_NE(body.find(R"(method="invalid",code="INVALID_ARGUMENT",transport="ring"} 1)"),
            std::string::npos) << body;
  // The gRPC call's series carries no transport label, as before.
  EXPECT_TRUE(std::regex_search(body, std::regex(
      R"(trisolve_requests_total\{rpc="SolveTridiagonal",family="tridiagonal",method="[^"]*",code="OK"\} 1\n)")))
      << body;
}

TEST(Ring, SolvesByHandleAsOverTheSocket) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client grpc_client(ClientOptions(server, Transport::kGrpc));
  Client ring_client(ClientOptions(server, Transport::kRing));
  const auto arrays = examples::RandomTridiagonal(8, 64, false, 31);
  Job job = testing::MakeJob(Kind::kTridiagonal, arrays);
  job.arrays.erase("d");
  auto sys = grpc_client.CreateSystem(job);
  ASSERT_TRUE(sys.ok()) << sys.status();
  for (int step = 0; step < 20; ++step) {
    const auto rhs = examples::RandomTridiagonal(8, 64, false, 100 + step).at("d");
    auto want = grpc_client.SolveSystem(sys->handle, rhs.view());
    auto got = ring_client.SolveSystem(sys->handle, rhs.view());
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.transport, "ring");
    EXPECT_EQ(got->summary.handle, sys->handle);
    EXPECT_EQ(got->x.shape, want->x.shape);
    EXPECT_EQ(got->x.data, want->x.data);
    EXPECT_EQ(got->status, want->status);
  }
  // Updates travel through the RPC: refused on a forced ring, taken there under auto.
  const auto diag = arrays.at("b");
  auto refused = ring_client.SolveSystem(sys->handle, arrays.at("d").view(), {{"b", diag.view()}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  auto via_auto = Client(ClientOptions(server, Transport::kAuto))
                      .SolveSystem(sys->handle, arrays.at("d").view(), {{"b", diag.view()}});
  ASSERT_TRUE(via_auto.ok()) << via_auto.status();
  EXPECT_NE(via_auto->summary.transport, "ring");
  // A handle that does not exist: NOT_FOUND, as over the socket.
  auto gone = ring_client.SolveSystem("sys-nonexistent", arrays.at("d").view());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
}

TEST(Ring, ForeignHandlesAreNotFoundAndRingsActAsTheirOpener) {
  const std::string tokens = "/tmp/trisolve_ring_tokens_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens, "--max-rings-per-identity", "1"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client alice(ClientOptions(server, Transport::kRing, "alice-token"));
  Client bob(ClientOptions(server, Transport::kRing, "bob-token"));
  const auto arrays = examples::RandomTridiagonal(2, 64, false, 41);
  Job job = testing::MakeJob(Kind::kTridiagonal, arrays);
  auto sys = alice.CreateSystem(job);
  ASSERT_TRUE(sys.ok()) << sys.status();
  auto mine = alice.SolveSystem(sys->handle, arrays.at("d").view());
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->summary.transport, "ring");
  auto theirs = bob.SolveSystem(sys->handle, arrays.at("d").view());
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kNotFound) << theirs.status();
  // One ring an identity: alice's second client gets none (forced: RESOURCE_EXHAUSTED; auto
  // takes the RPC).
  auto second = Client(ClientOptions(server, Transport::kRing, "alice-token")).Solve(job);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  auto second_auto = Client(ClientOptions(server, Transport::kAuto, "alice-token")).Solve(job);
  ASSERT_TRUE(second_auto.ok()) << second_auto.status();
  EXPECT_EQ(second_auto->summary.transport, "grpc");
  std::remove(tokens.c_str());
}

TEST(Ring, ManyThreadsManyRingsEachTheirOwnAnswer) {
  ServerProcess server({"--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  constexpr int kThreads = 12, kRequests = 150;
  Client shared(ClientOptions(server, Transport::kRing));
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one Client (a ring each while they call), half have their own.
      std::unique_ptr<Client> own;
      if (t % 2) own = std::make_unique<Client>(ClientOptions(server, Transport::kRing));
      Client& c = own ? *own : shared;
      Client reference(ClientOptions(server, Transport::kGrpc));
      for (int r = 0; r < kRequests; ++r) {
        const auto arrays = examples::RandomTridiagonal(1 + r % 3, 64, false, uint64_t(t * 1000 + r));
        const Job job = testing::MakeJob(Kind::kTridiagonal, arrays);
        auto got = c.Solve(job);
        if (!got.ok()) {
          ++failed;
          continue;
        }
        if (r % 25 == 0) {  // bit for bit against the socket now and then
          auto want = reference.Solve(job);
          if (!want.ok() || want->x.data != got->x.data) ++wrong;
        }
        // x solves the system it was asked for: residual on this side.
        const double* pa = reinterpret_cast<const double*>(arrays.at("a").data.data());
        const double* pb = reinterpret_cast<const double*>(arrays.at("b").data.data());
        const double* pc = reinterpret_cast<const double*>(arrays.at("c").data.data());
        const double* pd = reinterpret_cast<const double*>(arrays.at("d").data.data());
        const double* px = reinterpret_cast<const double*>(got->x.data.data());
        const int64_t batch = 1 + r % 3, n = 64;
        for (int64_t s = 0; s < batch; ++s)
          for (int64_t i = 0; i < n; ++i) {
            const int64_t k = s * n + i;
            double ax = pb[k] * px[k];
            if (i > 0) ax += pa[k] * px[k - 1];
            if (i + 1 < n) ax += pc[k] * px[k + 1];
            if (std::abs(ax - pd[k]) > 1e-8 * (1 + std::abs(pd[k]))) {
              ++wrong;
              s = batch;
              break;
            }
          }
        if (got->summary.transport != "ring") ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

// ---- rings by hand, through the ABI --------------------------------------------------------

class Raw {
 public:
  explicit Raw(const ServerProcess& s, std::string token = "")
      : stub_(v1::Solver::NewStub(
            grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials()))),
        token_(std::move(token)) {}
  void Ctx(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
  }
  grpc::Status Register(const SharedMemory& m, const std::string& name, double ttl_s = 0) {
    v1::RegisterSharedMemoryRequest req;
    req.set_name(name);
    req.set_key(m.key());
    req.set_bytes(m.size());
    req.set_ttl_s(ttl_s);
    grpc::ClientContext ctx;
    Ctx(ctx);
    v1::MemoryRegion resp;
    return stub_->RegisterSharedMemory(&ctx, req, &resp);
  }
  grpc::Status Unregister(const std::string& name) {
    v1::UnregisterMemoryRequest req;
    req.set_name(name);
    grpc::ClientContext ctx;
    Ctx(ctx);
    v1::MemoryRegion resp;
    return stub_->UnregisterMemory(&ctx, req, &resp);
  }
  grpc::Status Open(const std::string& region, int64_t offset, int slots, v1::RingInfo* info) {
    v1::OpenRingRequest req;
    req.set_region(region);
    req.set_offset(offset);
    req.set_slots(slots);
    grpc::ClientContext ctx;
    Ctx(ctx);
    return stub_->OpenRing(&ctx, req, info);
  }
  grpc::Status Close(const std::string& ring) {
    v1::CloseRingRequest req;
    req.set_ring(ring);
    grpc::ClientContext ctx;
    Ctx(ctx);
    v1::RingInfo info;
    return stub_->CloseRing(&ctx, req, &info);
  }

 private:
  std::unique_ptr<v1::Solver::Stub> stub_;
  std::string token_;
};

// A ring at offset 0 of its own shared memory, 2 slots, the arena after them.
struct HandRing {
  std::unique_ptr<SharedMemory> shm;
  RingHeader* h = nullptr;
  int64_t arena = 0;
  std::string id;

  static HandRing Make(int slots = 2, int64_t bytes = 1 << 20) {
    HandRing r;
    r.shm = *SharedMemory::Create(bytes);
    r.h = reinterpret_cast<RingHeader*>(r.shm->data());
    r.h->magic = kRingMagic;
    r.h->version = kRingVersion;
    r.h->slots = uint32_t(slots);
    r.h->slot_bytes = sizeof(RingSlot);
    r.h->header_bytes = sizeof(RingHeader);
    r.arena = (RingBytes(slots) + 63) / 64 * 64;
    return r;
  }
  RingSlot& slot(int i) { return Slots(h)[i]; }
  std::byte* at(int64_t off) { return shm->data() + off; }
  bool closed() const { return Word(h->closed).load() != kRingOpen; }

  // Submits `req` in slot `i` and waits (up to `timeout_s`) for its answer; false if none came.
  bool Ask(int i, const RingRequest& req, RingAnswer* ans, double timeout_s = 20) {
    RingSlot& s = slot(i);
    std::memcpy(&s.request, &req, sizeof req);
    Word(s.state).store(kSlotSubmitted);
    Word(h->doorbell).fetch_add(1);
    if (Word(h->sleeping).load())
      syscall(SYS_futex, &h->doorbell, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Word(s.state).load() != kSlotDone) {
      if (Clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::memcpy(ans, &s.answer, sizeof *ans);
    Word(s.state).store(kSlotFree);
    return true;
  }
};

void Name(RingArray& a, const char* name) {
  std::memset(a.name, 0, sizeof a.name);
  std::strncpy(a.name, name, sizeof a.name);
}

// A tridiagonal request of one system of n = 64 (`arrays`), its arrays written into the region
// at `base` from offset `at` on, x and the status after them.
RingRequest TridiagonalRequest(const examples::Arrays& arrays, std::byte* base, int64_t at,
                               uint64_t tag) {
  RingRequest q{};
  q.op = kOpSolve;
  q.family = kFamilyTridiagonal;
  q.dtype = 1;
  q.narrays = 4;
  int i = 0;
  for (const char* name : {"a", "b", "c", "d"}) {
    RingArray& a = q.arrays[i++];
    Name(a, name);
    a.rank = 1;
    a.shape[0] = 64;
    a.offset = at;
    a.bytes = 512;
    std::memcpy(base + at, arrays.at(name).data.data(), 512);
    at += 512;
  }
  q.x_offset = at;
  q.x_bytes = 512;
  q.status_offset = at + 512;
  q.status_bytes = 64;
  q.tag = tag;
  return q;
}

// A valid tridiagonal request of one system of n = 64, its arrays written into the arena.
RingRequest ValidRequest(HandRing& r, uint64_t seed = 3) {
  return TridiagonalRequest(examples::RandomTridiagonal(1, 64, false, seed), r.at(0), r.arena,
                            seed);
}

std::string Message(const RingAnswer& a) { return std::string(a.message, strnlen(a.message, sizeof a.message)); }

TEST(Ring, EveryMalformedFieldHasItsOwnStatus) {
  ServerProcess server({"--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  HandRing r = HandRing::Make();
  ASSERT_TRUE(raw.Register(*r.shm, "ring-region").ok());
  v1::RingInfo info;
  ASSERT_TRUE(raw.Open("ring-region", 0, 2, &info).ok());
  RingAnswer ans;
  {
    const RingRequest ok = ValidRequest(r);
    ASSERT_TRUE(r.Ask(0, ok, &ans));
    ASSERT_EQ(ans.code, 0) << Message(ans);
    EXPECT_EQ(ans.tag, ok.tag);
    EXPECT_EQ(ans.statuses, 1);
    EXPECT_EQ(ans.x_rank, 1);
    EXPECT_EQ(ans.x_shape[0], 64);
    EXPECT_EQ(std::string(ans.backend), ServerProcess::TestBackend());
  }
  struct Case {
    const char* what;
    std::function<void(RingRequest&)> mutate;
    absl::StatusCode code;
    const char* names;  // the message names the field
  };
  const int64_t end = r.shm->size();
  const std::vector<Case> cases = {
      {"op", [](RingRequest& q) { q.op = 9; }, absl::StatusCode::kInvalidArgument, "op"},
      {"family", [](RingRequest& q) { q.family = 7; }, absl::StatusCode::kInvalidArgument, "family"},
      {"dtype", [](RingRequest& q) { q.dtype = 5; }, absl::StatusCode::kInvalidArgument, "dtype"},
      {"layout", [](RingRequest& q) { q.layout = 3; }, absl::StatusCode::kInvalidArgument, "layout"},
      {"flags", [](RingRequest& q) { q.flags = 1u << 20; }, absl::StatusCode::kInvalidArgument, "flags"},
      {"block flags", [](RingRequest& q) { q.flags = kFlagTol; }, absl::StatusCode::kInvalidArgument, "flags"},
      {"narrays", [](RingRequest& q) { q.narrays = 9; }, absl::StatusCode::kInvalidArgument, "narrays"},
      {"narrays short", [](RingRequest& q) { q.narrays = 3; }, absl::StatusCode::kInvalidArgument, "d"},
      {"method", [](RingRequest& q) { std::memset(q.method, 'x', sizeof q.method); },
       absl::StatusCode::kInvalidArgument, "method"},
      {"method unknown", [](RingRequest& q) { std::strcpy(q.method, "nope"); },
       absl::StatusCode::kInvalidArgument, "method"},
      {"name", [](RingRequest& q) { std::memset(q.arrays[1].name, 'b', 16); },
       absl::StatusCode::kInvalidArgument, "arrays[1].name"},
      {"name unknown", [](RingRequest& q) { Name(q.arrays[1], "parent"); },
       absl::StatusCode::kInvalidArgument, "arrays[1].name"},
      {"name twice", [](RingRequest& q) { Name(q.arrays[1], "a"); },
       absl::StatusCode::kInvalidArgument, "arrays[1].name"},
      {"rank", [](RingRequest& q) { q.arrays[2].rank = 5; }, absl::StatusCode::kInvalidArgument, "c.rank"},
      {"shape", [](RingRequest& q) { q.arrays[2].shape[0] = 0; }, absl::StatusCode::kInvalidArgument, "c"},
      {"bytes", [](RingRequest& q) { q.arrays[3].bytes = 504; }, absl::StatusCode::kInvalidArgument, "d"},
      {"offset past", [end](RingRequest& q) { q.arrays[0].offset = end - 8; },
       absl::StatusCode::kInvalidArgument, "a"},
      {"offset negative", [](RingRequest& q) { q.arrays[0].offset = -64; },
       absl::StatusCode::kInvalidArgument, "a"},
      {"offset huge", [](RingRequest& q) { q.arrays[0].offset = INT64_MAX - 4; },
       absl::StatusCode::kInvalidArgument, "a"},
      {"offset in the slots", [](RingRequest& q) { q.arrays[0].offset = 128; },
       absl::StatusCode::kInvalidArgument, "a"},
      {"x outside", [end](RingRequest& q) { q.x_offset = end; }, absl::StatusCode::kInvalidArgument, "x_offset"},
      {"x in the slots", [](RingRequest& q) { q.x_offset = 64; }, absl::StatusCode::kInvalidArgument, "x_offset"},
      {"x misaligned", [](RingRequest& q) { q.x_offset += 4; }, absl::StatusCode::kInvalidArgument, "x_region"},
      {"x short", [](RingRequest& q) { q.x_bytes = 256; }, absl::StatusCode::kInvalidArgument, "x_region"},
      {"x size", [](RingRequest& q) { q.x_bytes = 0; q.x_offset = 64; }, absl::StatusCode::kInvalidArgument, "x_bytes"},
      {"statuses outside", [end](RingRequest& q) { q.status_offset = end - 10; q.status_bytes = 64; },
       absl::StatusCode::kInvalidArgument, "status_offset"},
      {"statuses no room", [](RingRequest& q) { q.status_bytes = 0; },
       absl::StatusCode::kInvalidArgument, "status_bytes"},
      {"not finite", [&r](RingRequest& q) {
         const double nan = std::nan("");
         std::memcpy(r.at(q.arrays[1].offset + 80), &nan, 8);
       }, absl::StatusCode::kInvalidArgument, "b"},
      {"deadline passed", [](RingRequest& q) { q.deadline_unix_ns = 1; },
       absl::StatusCode::kDeadlineExceeded, "deadline"},
      {"handle", [](RingRequest& q) { q.op = kOpSolveSystem; q.narrays = 1; std::memset(q.handle, 'h', 64); },
       absl::StatusCode::kInvalidArgument, "handle"},
      {"handle arrays", [](RingRequest& q) { q.op = kOpSolveSystem; std::strcpy(q.handle, "sys-1"); },
       absl::StatusCode::kInvalidArgument, "narrays"},
      {"handle rhs name", [](RingRequest& q) { q.op = kOpSolveSystem; q.narrays = 1; std::strcpy(q.handle, "sys-1"); },
       absl::StatusCode::kInvalidArgument, "arrays[0].name"},
      {"handle unknown", [](RingRequest& q) {
         q.op = kOpSolveSystem; q.narrays = 1; std::strcpy(q.handle, "sys-none");
         q.arrays[0] = q.arrays[3];
         Name(q.arrays[0], "rhs");
       }, absl::StatusCode::kNotFound, "no such system"},
  };
  uint64_t seed = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RingRequest q = ValidRequest(r, ++seed);
    c.mutate(q);
    ASSERT_TRUE(r.Ask(int(seed % 2), q, &ans)) << "no answer";
    EXPECT_EQ(absl::StatusCode(ans.code), c.code) << Message(ans);
    EXPECT_NE(Message(ans).find(c.names), std::string::npos) << Message(ans);
    EXPECT_LT(ans.message_bytes, uint32_t(kRingMessageBytes));
    EXPECT_EQ(ans.tag, q.tag);
  }
  // The ring still serves, and the server's log names the ring's calls.
  RingRequest q = ValidRequest(r, 99);
  ASSERT_TRUE(r.Ask(1, q, &ans));
  EXPECT_EQ(ans.code, 0) << Message(ans);
  EXPECT_FALSE(r.closed());
}

TEST(Ring, RandomDescriptorsAreAnsweredAndTheServerSurvives) {
  ServerProcess server({"--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  HandRing r = HandRing::Make();
  ASSERT_TRUE(raw.Register(*r.shm, "fuzz").ok());
  v1::RingInfo info;
  ASSERT_TRUE(raw.Open("fuzz", 0, 2, &info).ok());
  std::mt19937_64 rng(20261127);
  int answered = 0, ok = 0;
  for (int i = 0; i < 1500 && !r.closed(); ++i) {
    RingRequest q = ValidRequest(r, 1000 + uint64_t(i));
    auto* bytes = reinterpret_cast<uint8_t*>(&q);
    if (i % 3 == 0) {  // all random
      for (size_t k = 0; k < sizeof q; ++k) bytes[k] = uint8_t(rng());
    } else {  // a valid one with a few bytes changed
      const int flips = 1 + int(rng() % 6);
      for (int k = 0; k < flips; ++k) bytes[rng() % sizeof q] = uint8_t(rng());
    }
    RingAnswer ans;
    ASSERT_TRUE(r.Ask(i % 2, q, &ans, 60)) << "descriptor " << i << " was not answered";
    ++answered;
    ok += ans.code == 0;
    EXPECT_LT(ans.message_bytes, uint32_t(kRingMessageBytes));
  }
  EXPECT_GT(answered, 1000);
  // Alive: the health check serves and the ring (or a new one) answers a valid request.
  Client c(ClientOptions(server, Transport::kGrpc));
  auto health = c.Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
  RingAnswer ans;
  ASSERT_TRUE(r.Ask(0, ValidRequest(r, 5), &ans));
  EXPECT_EQ(ans.code, 0) << Message(ans);
}

TEST(Ring, OpenChecksItsArgumentsAndLimits) {
  ServerProcess server({"--max-rings", "2"});
  ServerProcess off({"--rings", "off"});
  ASSERT_GT(server.port(), 0) << server.Log();
  ASSERT_GT(off.port(), 0) << off.Log();
  Raw raw(server);
  HandRing r = HandRing::Make(2, 64 << 10);
  ASSERT_TRUE(raw.Register(*r.shm, "reg").ok());
  v1::RingInfo info;
  EXPECT_EQ(raw.Open("nope", 0, 2, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(raw.Open("reg", 32, 2, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(raw.Open("reg", 0, 0, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(raw.Open("reg", 0, 65, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(raw.Open("reg", 0, 3, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << "the header says 2 slots";
  EXPECT_EQ(raw.Open("reg", (64 << 10) - 64, 1, &info).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(raw.Open("reg", 4096, 2, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << "no header there";
  r.h->version = kRingVersion + 1;
  EXPECT_EQ(raw.Open("reg", 0, 2, &info).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  r.h->version = kRingVersion;
  // Two rings, then the cap. Rings at different offsets of one region.
  auto header_at = [&r](int64_t where) { std::memcpy(r.at(where), r.h, sizeof(RingHeader)); };
  header_at(8192);
  header_at(16384);
  v1::RingInfo a, b, c;
  ASSERT_TRUE(raw.Open("reg", 0, 2, &a).ok());
  ASSERT_TRUE(raw.Open("reg", 8192, 2, &b).ok());
  EXPECT_EQ(raw.Open("reg", 16384, 2, &c).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(raw.Close("ring-no-such").error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(raw.Close(b.ring()).ok());
  EXPECT_EQ(Word(reinterpret_cast<RingHeader*>(r.at(8192))->closed).load(), uint32_t(kClosedByClient));
  EXPECT_TRUE(raw.Open("reg", 16384, 2, &c).ok());
  EXPECT_EQ(raw.Close(b.ring()).error_code(), grpc::StatusCode::NOT_FOUND) << "closed twice";

  // --rings off: FAILED_PRECONDITION; the client's auto takes the RPC, ring is refused.
  Raw raw_off(off);
  HandRing r2 = HandRing::Make(2, 64 << 10);
  ASSERT_TRUE(raw_off.Register(*r2.shm, "reg").ok());
  EXPECT_EQ(raw_off.Open("reg", 0, 2, &info).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const auto job_arrays = examples::RandomTridiagonal(1, 64, false, 2);  // the job views them
  const Job job = testing::MakeJob(Kind::kTridiagonal, job_arrays);
  Client auto_client(ClientOptions(off, Transport::kAuto));
  auto got = auto_client.Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.transport, "grpc");
  EXPECT_EQ(auto_client.RingState(), "grpc");
  EXPECT_EQ(Client(ClientOptions(off, Transport::kRing)).Solve(job).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Ring, ForeignRegionsAndRingsAreNotFound) {
  const std::string tokens = "/tmp/trisolve_ring_tokens2_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw alice(server, "alice-token"), bob(server, "bob-token");
  HandRing r = HandRing::Make(1, 64 << 10);
  ASSERT_TRUE(alice.Register(*r.shm, "mine").ok());
  v1::RingInfo info;
  EXPECT_EQ(bob.Open("mine", 0, 1, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(alice.Open("mine", 0, 1, &info).ok());
  EXPECT_EQ(bob.Close(info.ring()).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(alice.Close(info.ring()).ok());
  std::remove(tokens.c_str());
}

bool WaitUntil(const std::function<bool()>& f, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

TEST(Ring, ARegionUnregisteredOrExpiredClosesItsRings) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  HandRing r = HandRing::Make(1, 64 << 10);
  ASSERT_TRUE(raw.Register(*r.shm, "goes").ok());
  v1::RingInfo info;
  ASSERT_TRUE(raw.Open("goes", 0, 1, &info).ok());
  const uint32_t beat = Word(r.h->heartbeat).load();
  EXPECT_TRUE(WaitUntil([&] { return Word(r.h->heartbeat).load() != beat; }, 5)) << "no heartbeat";
  ASSERT_TRUE(raw.Unregister("goes").ok());
  EXPECT_TRUE(WaitUntil([&] { return r.closed(); }, 5));
  EXPECT_EQ(Word(r.h->closed).load(), uint32_t(kClosedRegionGone));
  EXPECT_TRUE(WaitUntil([&] { return server.Log().find(info.ring() + " (1 slots) closed") != std::string::npos; }, 5))
      << server.Log();
  EXPECT_EQ(raw.Close(info.ring()).error_code(), grpc::StatusCode::NOT_FOUND);

  // Expiry: a region idle past its time-to-live.
  HandRing e = HandRing::Make(1, 64 << 10);
  ASSERT_TRUE(raw.Register(*e.shm, "expires", 0.5).ok());
  ASSERT_TRUE(raw.Open("expires", 0, 1, &info).ok());
  RingAnswer ans;
  ASSERT_TRUE(e.Ask(0, ValidRequest(e), &ans));
  EXPECT_EQ(ans.code, 0) << Message(ans);
  EXPECT_TRUE(WaitUntil([&] { return e.closed(); }, 10));
  EXPECT_EQ(Word(e.h->closed).load(), uint32_t(kClosedRegionGone));

  // The client notices a closed ring and opens a new one.
  Client c(ClientOptions(server, Transport::kRing));
  const auto job_arrays = examples::RandomTridiagonal(1, 64, false, 9);  // the job views them
  const Job job = testing::MakeJob(Kind::kTridiagonal, job_arrays);
  ASSERT_TRUE(c.Solve(job).ok());
  auto regions_before = c.Info();
  ASSERT_TRUE(regions_before.ok());
}

TEST(Ring, AnObjectShrunkUnderItsRingClosesTheRingNotTheServer) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  HandRing r = HandRing::Make(1, 64 << 10);
  ASSERT_TRUE(raw.Register(*r.shm, "shrinks").ok());
  v1::RingInfo info;
  ASSERT_TRUE(raw.Open("shrinks", 0, 1, &info).ok());
  RingAnswer ans;
  ASSERT_TRUE(r.Ask(0, ValidRequest(r), &ans));
  ASSERT_EQ(ans.code, 0) << Message(ans);
  // The object's pages go (this process must not touch them either from here): the server's
  // ring thread reads its slots within 0.1 s, and would fault there.
  const int fd = shm_open(r.shm->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  EXPECT_TRUE(WaitUntil([&] {
    return server.Log().find(info.ring() + " (1 slots) closed (its region no longer spans it)") !=
           std::string::npos;
  }, 10)) << server.Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.Wait(0), -1) << "the server exited: " << server.Log();
  auto health = Client(ClientOptions(server, Transport::kGrpc)).Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
  const auto job_arrays = examples::RandomTridiagonal(1, 64, false, 9);  // the job views them
  const Job job = testing::MakeJob(Kind::kTridiagonal, job_arrays);
  auto got = Client(ClientOptions(server, Transport::kRing)).Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.transport, "ring");
}

TEST(Ring, AClientKilledMidRequestCostsTheServerNothing) {
  ServerProcess server({"--region-ttl", "1", "--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  // The CLI's bench through rings, killed while its requests are in flight.
  const std::string cmd = ServerProcess::CliBin();
  std::vector<std::string> args = {cmd, "--server", server.target(), "bench", "--transport", "ring",
                                   "--clients", "4", "--requests", "100000000", "--n", "64"};
  testing::ChildProcess cli(args);
  ASSERT_GT(cli.pid(), 0);
  EXPECT_TRUE(WaitUntil([&] { return server.Log().find("opened") != std::string::npos; }, 30))
      << server.Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  cli.Kill();
  Client c(ClientOptions(server, Transport::kRing));
  const auto job_arrays = examples::RandomTridiagonal(1, 64, false, 9);  // the job views them
  const Job job = testing::MakeJob(Kind::kTridiagonal, job_arrays);
  auto got = c.Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.transport, "ring");
  // The dead client's regions expire (1 s), and its rings close with them.
  EXPECT_TRUE(WaitUntil([&] {
    const std::string log = server.Log();
    size_t n = 0;
    for (size_t p = log.find("its region is gone"); p != std::string::npos;
         p = log.find("its region is gone", p + 1))
      ++n;
    return n >= 4;
  }, 20)) << server.Log();
}

TEST(Ring, ShutdownClosesTheRings) {
  ServerProcess server({"--grace", "5"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  HandRing r = HandRing::Make(2, 64 << 10);
  ASSERT_TRUE(raw.Register(*r.shm, "r").ok());
  v1::RingInfo info;
  ASSERT_TRUE(raw.Open("r", 0, 2, &info).ok());
  RingAnswer ans;
  ASSERT_TRUE(r.Ask(0, ValidRequest(r), &ans));
  ASSERT_EQ(ans.code, 0);
  server.Signal(SIGTERM);
  // Requests keep coming while it shuts down: each answered (UNAVAILABLE once it drains), and
  // the ring ends closed for the shutdown.
  int unavailable = 0;
  for (int i = 0; i < 2000 && !r.closed(); ++i) {
    if (!r.Ask(i % 2, ValidRequest(r, uint64_t(i)), &ans, 10)) break;
    if (ans.code == int(absl::StatusCode::kUnavailable)) ++unavailable;
  }
  EXPECT_GE(server.Wait(20), 0);
  EXPECT_EQ(Word(r.h->closed).load(), uint32_t(kClosedShutdown));
  for (int i = 0; i < 2; ++i) EXPECT_NE(Word(r.slot(i).state).load(), uint32_t(kSlotSubmitted));
  (void)unavailable;
}


// ---- many rings on few serving threads (--ring-threads) ------------------------------------

// Rings of one slot each, kStride bytes apart in one region: a ring's header and slot, then
// its arena (a system of n = 64: a, b, c, d, x and the status).
struct RingsInOneRegion {
  static constexpr int64_t kStride = 8192;
  std::unique_ptr<SharedMemory> shm;
  std::vector<std::string> ids;

  explicit RingsInOneRegion(int rings) {
    shm = *SharedMemory::Create(rings * kStride);
    for (int i = 0; i < rings; ++i) {
      RingHeader* h = header(i);
      h->magic = kRingMagic;
      h->version = kRingVersion;
      h->slots = 1;
      h->slot_bytes = sizeof(RingSlot);
      h->header_bytes = sizeof(RingHeader);
    }
  }
  RingHeader* header(int i) { return reinterpret_cast<RingHeader*>(shm->data() + i * kStride); }
  RingSlot& slot(int i) { return Slots(header(i))[0]; }
  int64_t arena(int i) const { return i * kStride + (RingBytes(1) + kRingAlign - 1) / kRingAlign * kRingAlign; }

  // Writes ring i's request (a system of its own, from `seed`) and hands the slot over, as a
  // client does: SUBMITTED, then the doorbell, then a wake if the server sleeps.
  examples::Arrays Submit(int i, uint64_t seed) {
    auto arrays = examples::RandomTridiagonal(1, 64, false, seed);
    const RingRequest q = TridiagonalRequest(arrays, shm->data(), arena(i), seed);
    RingSlot& s = slot(i);
    std::memcpy(&s.request, &q, sizeof q);
    Word(s.state).store(kSlotSubmitted);
    RingHeader* h = header(i);
    Word(h->doorbell).fetch_add(1);
    if (Word(h->sleeping).load())
      syscall(SYS_futex, &h->doorbell, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    return arrays;
  }
  // Ring i's answer, once there (false: none within `timeout_s`); the slot is freed.
  bool Take(int i, RingAnswer* ans, double timeout_s = 30) {
    RingSlot& s = slot(i);
    const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Word(s.state).load() != kSlotDone) {
      if (Clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    std::memcpy(ans, &s.answer, sizeof *ans);
    Word(s.state).store(kSlotFree);
    return true;
  }
  // Ring i's answer, waited for as the client library waits once it sleeps: `waiting` set, the
  // state read again, FUTEX_WAIT on it, woken only by the server (each wait's own timeout is
  // 5 s: a wake-up lost shows as a wait that long). `longest_s` gets the longest single wait.
  // A request the server never takes because it closed the ring first (the caller saw it
  // open, then submitted) is taken back and answered UNAVAILABLE here, as the client library
  // does: no one will answer or wake it.
  bool TakeAsleep(int i, RingAnswer* ans, double* longest_s, double limit_s = 30) {
    RingSlot& s = slot(i);
    const auto end = Clock::now() + std::chrono::duration<double>(limit_s);
    const auto taken_back = [&] {
      uint32_t submitted = kSlotSubmitted;
      if (Word(header(i)->closed).load() == kRingOpen ||
          !Word(s.state).compare_exchange_strong(submitted, kSlotFree))
        return false;
      *ans = RingAnswer{};
      ans->code = int32_t(absl::StatusCode::kUnavailable);
      ans->tag = s.request.tag;
      Word(s.waiting).store(0);
      return true;
    };
    while (true) {
      uint32_t state = Word(s.state).load();
      if (state == kSlotDone) break;
      if (taken_back()) return true;
      if (Clock::now() > end) return false;
      Word(s.waiting).store(1);
      state = Word(s.state).load();
      if (state == kSlotDone) break;
      if (taken_back()) return true;
      const auto t0 = Clock::now();
      timespec ts{5, 0};
      syscall(SYS_futex, &s.state, FUTEX_WAIT, state, &ts, nullptr, 0);
      *longest_s =
          std::max(*longest_s, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    Word(s.waiting).store(0);
    std::memcpy(ans, &s.answer, sizeof *ans);
    Word(s.state).store(kSlotFree);
    return true;
  }
  // Whether ring i's x (after an OK answer) solves its system: the residual, on this side.
  bool Solves(int i, const examples::Arrays& arrays) {
    const auto* pa = reinterpret_cast<const double*>(arrays.at("a").data.data());
    const auto* pb = reinterpret_cast<const double*>(arrays.at("b").data.data());
    const auto* pc = reinterpret_cast<const double*>(arrays.at("c").data.data());
    const auto* pd = reinterpret_cast<const double*>(arrays.at("d").data.data());
    const auto* px = reinterpret_cast<const double*>(shm->data() + arena(i) + 4 * 512);
    for (int k = 0; k < 64; ++k) {
      double ax = pb[k] * px[k];
      if (k > 0) ax += pa[k] * px[k - 1];
      if (k < 63) ax += pc[k] * px[k + 1];
      if (!(std::abs(ax - pd[k]) <= 1e-8 * (1 + std::abs(pd[k])))) return false;
    }
    return true;
  }
};

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

class RingThreads : public ::testing::TestWithParam<const char*> {};

// 150 rings: more than one thread's share (127). With --ring-threads 1 a second thread starts
// for the rings past 127; with 2 they are shared out evenly; with 0 each has its own thread (the
// path where futex_waitv is missing). Every ring's requests, all in flight at once, answered
// with their own x.
TEST_P(RingThreads, ManyRingsAllAnsweredWithTheirOwnX) {
  const std::string threads = GetParam();
  ServerProcess server({"--ring-threads", threads, "--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  constexpr int kRings = 150;
  RingsInOneRegion rings(kRings);
  ASSERT_TRUE(raw.Register(*rings.shm, "many").ok());
  for (int i = 0; i < kRings; ++i) {
    v1::RingInfo info;
    const grpc::Status st = raw.Open("many", i * RingsInOneRegion::kStride, 1, &info);
    ASSERT_TRUE(st.ok()) << i << ": " << st.error_message();
    rings.ids.push_back(info.ring());
  }
  const std::string log = server.Log();
  if (threads == "0") {
    EXPECT_EQ(Count(log, "on ring thread"), 0) << log;
  } else {
    // Two threads either way: 127 rings and 23 (one asked for), or 75 and 75.
    const int on0 = Count(log, "on ring thread 0\n"), on1 = Count(log, "on ring thread 1\n");
    EXPECT_EQ(on0 + on1, kRings) << log;
    EXPECT_EQ(Count(log, "on ring thread 2\n"), 0);
    if (threads == "1") {
      EXPECT_EQ(on0, 127);
    } else {
      EXPECT_EQ(on0, 75);
    }
  }
  for (int round = 0; round < 4; ++round) {
    std::vector<examples::Arrays> asked;
    for (int i = 0; i < kRings; ++i) asked.push_back(rings.Submit(i, uint64_t(round * 1000 + i)));
    for (int i = 0; i < kRings; ++i) {
      RingAnswer ans;
      ASSERT_TRUE(rings.Take(i, &ans)) << "ring " << i << " not answered in round " << round;
      ASSERT_EQ(ans.code, 0) << "ring " << i << ": " << Message(ans);
      EXPECT_EQ(ans.tag, uint64_t(round * 1000 + i));
      EXPECT_TRUE(rings.Solves(i, asked[size_t(i)])) << "ring " << i << ", round " << round;
    }
    // Between rounds the threads go idle and sleep: the next round's doorbells wake them.
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 50));
  }
  for (const std::string& id : rings.ids) EXPECT_TRUE(raw.Close(id).ok());
  for (int i = 0; i < kRings; ++i)
    EXPECT_EQ(Word(rings.header(i)->closed).load(), uint32_t(kClosedByClient));
}

// A ring closed while its thread serves the others: the others go on answering, a request
// left in the closed ring is answered (or CANCELLED, if not taken before the close), nothing
// more is taken from it, and a new ring joins the thread.
TEST_P(RingThreads, ARingClosedWhileItsThreadServesOthers) {
  ServerProcess server({"--ring-threads", GetParam(), "--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  constexpr int kRings = 5, kBusy = 3;  // ring 0 closes; 1-3 busy; 4 opened after
  RingsInOneRegion rings(kRings);
  ASSERT_TRUE(raw.Register(*rings.shm, "r").ok());
  for (int i = 0; i < kRings - 1; ++i) {
    v1::RingInfo info;
    ASSERT_TRUE(raw.Open("r", i * RingsInOneRegion::kStride, 1, &info).ok());
    rings.ids.push_back(info.ring());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0}, failed{0};
  std::vector<std::thread> busy;
  for (int t = 1; t <= kBusy; ++t)
    busy.emplace_back([&, t] {
      for (uint64_t k = 0; !stop.load(); ++k) {
        const uint64_t seed = uint64_t(t) * 1000000 + k;
        const auto arrays = rings.Submit(t, seed);
        RingAnswer ans;
        if (!rings.Take(t, &ans) || ans.code != 0 || ans.tag != seed || !rings.Solves(t, arrays)) {
          ++failed;
          return;
        }
        ++answered;
      }
    });
  RingAnswer ans;
  rings.Submit(0, 7);
  ASSERT_TRUE(rings.Take(0, &ans));
  EXPECT_EQ(ans.code, 0) << Message(ans);
  // A request, then the close at once: taken and answered, or answered CANCELLED.
  rings.Submit(0, 8);
  const auto before = Clock::now();
  ASSERT_TRUE(raw.Close(rings.ids[0]).ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - before).count(), 5);
  EXPECT_EQ(Word(rings.header(0)->closed).load(), uint32_t(kClosedByClient));
  ASSERT_TRUE(rings.Take(0, &ans, 1)) << "a request left in a closed ring, unanswered";
  EXPECT_TRUE(ans.code == 0 || ans.code == int(absl::StatusCode::kCancelled)) << Message(ans);
  EXPECT_EQ(ans.tag, 8u);
  const int at_close = answered.load();
  // Nothing more is taken from the closed ring; the others keep being answered.
  rings.Submit(0, 9);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Word(rings.slot(0).state).load(), uint32_t(kSlotSubmitted));
  EXPECT_GT(answered.load(), at_close) << "the other rings stopped with the closed one";
  v1::RingInfo info;
  ASSERT_TRUE(raw.Open("r", 4 * RingsInOneRegion::kStride, 1, &info).ok());
  const auto arrays = rings.Submit(4, 10);
  ASSERT_TRUE(rings.Take(4, &ans));
  EXPECT_EQ(ans.code, 0) << Message(ans);
  EXPECT_TRUE(rings.Solves(4, arrays));
  stop.store(true);
  for (auto& th : busy) th.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GT(answered.load(), 0);
  EXPECT_TRUE(raw.Close(info.ring()).ok());
}

// A sleeping thread wakes for any of its rings' doorbells at once, not at its next timed look
// (every 0.1 s): a lost wake-up shows as answers 0-100 ms late. No spinning, so every request
// finds the thread asleep.
TEST_P(RingThreads, ASleepingThreadWakesForAnyOfItsRings) {
  ServerProcess server({"--ring-threads", GetParam(), "--ring-spin-us", "0", "--request-log",
                        "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  constexpr int kRings = 6, kTrials = 30;
  RingsInOneRegion rings(kRings);
  ASSERT_TRUE(raw.Register(*rings.shm, "r").ok());
  for (int i = 0; i < kRings; ++i) {
    v1::RingInfo info;
    ASSERT_TRUE(raw.Open("r", i * RingsInOneRegion::kStride, 1, &info).ok());
  }
  std::vector<double> ms;
  for (int k = 0; k < kTrials; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    const int i = (k * 7) % kRings;
    const auto t0 = Clock::now();
    const auto arrays = rings.Submit(i, uint64_t(100 + k));
    RingAnswer ans;
    ASSERT_TRUE(rings.Take(i, &ans));
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ASSERT_EQ(ans.code, 0) << Message(ans);
    EXPECT_TRUE(rings.Solves(i, arrays));
  }
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[kTrials / 2], 20) << "median " << ms[kTrials / 2] << " ms: wake-ups are lost";
}

// ---- the wakers (--ring-wakers): wakes handed over by a busy serving thread ---------------

// Parameter: --ring-wakers, with one serving thread ("1": its wakes go to a waker while it has
// more requests to answer; "0": it makes them itself).
class RingWakers : public ::testing::TestWithParam<const char*> {};

// The waker count a server's log gives at shutdown, -1 when it has none.
int64_t WakesMade(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("ring waker 0 made ([0-9]+) wakes"))) return -1;
  return std::stoll(m[1]);
}

// 48 callers at once on one serving thread, each asleep on its slot (no spinning on either
// side), 25 requests each: every request answered with its own x and every caller woken by
// the server (a lost wake-up would show as a 5 s wait), the queue each answer reports at least
// 1 and, with 48 rings in flight on one thread, above 1 at times. With a waker it made wakes.
TEST_P(RingWakers, ManyCallersAsleepAllAnsweredAndWoken) {
  const std::string wakers = GetParam();
  ServerProcess server({"--ring-threads", "1", "--ring-wakers", wakers, "--ring-spin-us", "0",
                        "--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  constexpr int kRings = 48, kRequests = 25;
  RingsInOneRegion rings(kRings);
  ASSERT_TRUE(raw.Register(*rings.shm, "r").ok());
  for (int i = 0; i < kRings; ++i) {
    v1::RingInfo info;
    ASSERT_TRUE(raw.Open("r", i * RingsInOneRegion::kStride, 1, &info).ok());
  }
  std::atomic<int> wrong{0}, unanswered{0}, low_queue{0};
  std::atomic<uint32_t> most_queued{0};
  std::vector<double> longest(kRings, 0);
  std::vector<std::thread> callers;
  for (int i = 0; i < kRings; ++i)
    callers.emplace_back([&, i] {
      for (int k = 0; k < kRequests; ++k) {
        const uint64_t seed = uint64_t(i) * 1000 + uint64_t(k);
        const auto arrays = rings.Submit(i, seed);
        RingAnswer ans;
        if (!rings.TakeAsleep(i, &ans, &longest[size_t(i)])) {
          ++unanswered;
          return;
        }
        if (ans.code != 0 || ans.tag != seed || !rings.Solves(i, arrays)) ++wrong;
        const uint32_t q = Word(rings.header(i)->queued).load();
        if (q < 1) ++low_queue;
        uint32_t seen = most_queued.load();
        while (q > seen && !most_queued.compare_exchange_weak(seen, q)) {
        }
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(unanswered.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(low_queue.load(), 0);
  EXPECT_GT(most_queued.load(), 1u);
  EXPECT_LT(*std::max_element(longest.begin(), longest.end()), 2.5) << "a wake-up was lost";
  server.Signal(SIGTERM);
  EXPECT_GE(server.Wait(20), 0);
  const std::string log = server.Log();
  if (wakers == "0") {
    EXPECT_EQ(WakesMade(log), -1) << log;
  } else {
    EXPECT_GT(WakesMade(log), 0) << log;
  }
}

// Shutdown while 48 callers keep a waker busy: every caller is woken for each answer up to the
// last (OK, or UNAVAILABLE once the server drains; the ring ends closed for the shutdown), none
// left asleep on a wake the waker was handed when it stopped.
TEST_P(RingWakers, AWakerStoppedWithWakesPendingLeavesNoCallerAsleep) {
  ServerProcess server({"--ring-threads", "1", "--ring-wakers", GetParam(), "--ring-spin-us",
                        "0", "--request-log", "errors", "--grace", "5"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  constexpr int kRings = 48;
  RingsInOneRegion rings(kRings);
  ASSERT_TRUE(raw.Register(*rings.shm, "r").ok());
  for (int i = 0; i < kRings; ++i) {
    v1::RingInfo info;
    ASSERT_TRUE(raw.Open("r", i * RingsInOneRegion::kStride, 1, &info).ok());
  }
  std::atomic<int> wrong{0}, unanswered{0}, ok{0}, unavailable{0};
  std::vector<double> longest(kRings, 0);
  std::vector<std::thread> callers;
  for (int i = 0; i < kRings; ++i)
    callers.emplace_back([&, i] {
      for (uint64_t k = 0; Word(rings.header(i)->closed).load() == kRingOpen; ++k) {
        const uint64_t seed = uint64_t(i) * 1000000 + k;
        const auto arrays = rings.Submit(i, seed);
        RingAnswer ans;
        if (!rings.TakeAsleep(i, &ans, &longest[size_t(i)])) {
          ++unanswered;
          return;
        }
        if (ans.tag != seed) {
          ++wrong;
        } else if (ans.code == 0) {
          if (rings.Solves(i, arrays)) {
            ++ok;
          } else {
            ++wrong;
          }
        } else if (ans.code == int(absl::StatusCode::kUnavailable)) {
          ++unavailable;
        } else {
          ++wrong;
        }
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server.Signal(SIGTERM);
  for (auto& t : callers) t.join();
  EXPECT_GE(server.Wait(20), 0);
  EXPECT_EQ(unanswered.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_LT(*std::max_element(longest.begin(), longest.end()), 2.5) << "a wake-up was lost";
  for (int i = 0; i < kRings; ++i)
    EXPECT_EQ(Word(rings.header(i)->closed).load(), uint32_t(kClosedShutdown));
  (void)unavailable;
}

INSTANTIATE_TEST_SUITE_P(Pool, RingWakers, ::testing::Values("1", "0"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param[0] == '0' ? "NoWaker" : "Waker");
                         });

INSTANTIATE_TEST_SUITE_P(Pool, RingThreads, ::testing::Values("1", "2", "0"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param[0] == '0' ? "ThreadPerRing"
                                                                : "Threads") +
                                  (p.param[0] == '0' ? "" : p.param);
                         });

}  // namespace
}  // namespace trisolve

// ---- arrays already in registered memory: by reference through the ring (ABI v2) -----------

namespace trisolve {
namespace {

// Views of a tridiagonal batch's arrays copied into registered shared memory, x there too.
struct InShm {
  std::unique_ptr<SharedMemory> shm;
  std::map<std::string, ArrayView> view;
  double* x = nullptr;
  int64_t values = 0;

  InShm(const examples::Arrays& arrays, int64_t batch, int64_t n) : values(batch * n) {
    shm = *SharedMemory::Create((5 * values + 64) * 8);
    for (const char* name : {"a", "b", "c", "d"}) {
      double* p = *shm->Allocate<double>(values);
      std::memcpy(p, arrays.at(name).data.data(), size_t(values) * 8);
      view[name] = {DType::kFloat64, {batch, n}, p};
    }
    x = *shm->Allocate<double>(values);
  }
};

// A call whose arrays lie in memory the client registered sends references through its ring,
// whatever their size: nothing is copied into the ring's arena, x is written in place, and the
// answer is the socket's, bit for bit, unary and by handle, forced and under auto.
TEST(Ring, ArraysInRegisteredMemoryTravelByReference) {
  ServerProcess server({"--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  const int64_t batch = 1024, n = 256;  // 2 MiB an array: past the arena and the stream cut
  const auto arrays = examples::RandomTridiagonal(batch, n, false, 77);
  Client grpc_client(ClientOptions(server, Transport::kGrpc));
  auto want = grpc_client.Solve(testing::MakeJob(Kind::kTridiagonal, arrays));
  ASSERT_TRUE(want.ok()) << want.status();
  for (const Transport t : {Transport::kRing, Transport::kAuto}) {
    Client client(ClientOptions(server, t));
    InShm in(arrays, batch, n);
    ASSERT_TRUE(client.RegisterMemory(*in.shm).ok());
    Job job{Kind::kTridiagonal};
    for (const char* name : {"a", "b", "c", "d"}) job.arrays[name] = in.view[name];
    job.options.x_out = in.x;
    for (int round = 0; round < 3; ++round) {
      std::fill(in.x, in.x + in.values, -1.0);
      auto got = client.Solve(job);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->summary.transport, "ring");
      EXPECT_EQ(got->status, want->status);
      EXPECT_EQ(std::memcmp(in.x, want->x.data.data(), size_t(in.values) * 8), 0);
    }
    // Some arrays in registered memory, the others copied into the arena; x into a new array.
    Job mixed{Kind::kTridiagonal};
    mixed.arrays = {{"a", arrays.at("a").view()}, {"b", in.view["b"]}, {"c", in.view["c"]},
                    {"d", in.view["d"]}};
    mixed.arrays["a"].shape = {batch, n};
    if (t == Transport::kRing) {
      // The copied array alone (2 MiB) fits no default arena: a forced ring makes one that does.
      auto got = client.Solve(mixed);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->summary.transport, "ring");
      EXPECT_EQ(got->x.data, want->x.data);
    }
    // By handle: the right-hand side and x in registered memory.
    Job coefficients = testing::MakeJob(Kind::kTridiagonal, arrays);
    coefficients.arrays.erase("d");
    auto sys = grpc_client.CreateSystem(coefficients);
    ASSERT_TRUE(sys.ok()) << sys.status();
    std::fill(in.x, in.x + in.values, -1.0);
    JobOptions jo;
    jo.x_out = in.x;
    auto step = client.SolveSystem(sys->handle, in.view["d"], {}, jo);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->summary.transport, "ring");
    EXPECT_EQ(std::memcmp(in.x, want->x.data.data(), size_t(in.values) * 8), 0);
    EXPECT_TRUE(client.UnregisterMemory(*in.shm).ok());
  }
}

// The request's other regions, by hand: each is the caller's, named in the request, and checked
// as an RPC's RegionRef is; the ring's own region is reached only as region 0.
TEST(Ring, OtherRegionsAreTheCallersAndChecked) {
  const std::string tokens = "/tmp/trisolve_ring_tokens3_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens, "--request-log", "errors"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw alice(server, "alice-token"), bob(server, "bob-token");
  HandRing r = HandRing::Make();
  auto data = *SharedMemory::Create(64 << 10);
  auto bobs = *SharedMemory::Create(64 << 10);
  ASSERT_TRUE(alice.Register(*r.shm, "alice-ring").ok());
  ASSERT_TRUE(alice.Register(*data, "alice-data").ok());
  ASSERT_TRUE(bob.Register(*bobs, "bob-data").ok());
  v1::RingInfo info;
  ASSERT_TRUE(alice.Open("alice-ring", 0, 2, &info).ok());
  const auto arrays = examples::RandomTridiagonal(1, 64, false, 5);
  // The arrays and x at the start of alice-data (region 1), the status in the ring's arena.
  auto request = [&](const char* region_name) {
    RingRequest q = TridiagonalRequest(arrays, data->data(), 0, 9);
    std::memset(q.regions, 0, sizeof q.regions);
    std::strncpy(q.regions[0], region_name, sizeof q.regions[0]);
    for (int i = 0; i < q.narrays; ++i) q.arrays[i].region = 1;
    q.x_region = 1;
    q.status_offset = r.arena;
    return q;
  };
  RingAnswer ans;
  {
    auto* x = reinterpret_cast<double*>(data->data() + 2048);
    std::fill(x, x + 64, -1.0);
    ASSERT_TRUE(r.Ask(0, request("alice-data"), &ans));
    ASSERT_EQ(ans.code, 0) << Message(ans);
    // a x = d, computed from the original arrays.
    const auto& a = arrays.at("a"), &b = arrays.at("b"), &c = arrays.at("c"), &d = arrays.at("d");
    const double* av = a.as<double>(), *bv = b.as<double>(), *cv = c.as<double>(),
                *dv = d.as<double>();
    double worst = 0;
    for (int i = 0; i < 64; ++i) {
      double lhs = bv[i] * x[i];
      if (i > 0) lhs += av[i] * x[i - 1];
      if (i < 63) lhs += cv[i] * x[i + 1];
      worst = std::max(worst, std::abs(lhs - dv[i]) / (std::abs(dv[i]) + 1));
    }
    EXPECT_LT(worst, 1e-12);
    EXPECT_EQ(ans.statuses, 1);
  }
  struct Bad {
    std::function<void(RingRequest&)> change;
    int code;
    std::string names;
  };
  for (const Bad& bad : std::vector<Bad>{
           {[](RingRequest& q) { q.arrays[1].region = 3; }, 3, "b.region"},
           {[](RingRequest& q) { q.x_region = 7; }, 3, "x_region"},
           {[](RingRequest& q) { std::strcpy(q.regions[0], "alice-ring"); }, 3,
            "names the ring's own region"},
           {[](RingRequest& q) { std::strcpy(q.regions[0], "bob-data"); }, 5, "bob-data"},
           {[](RingRequest& q) { std::strcpy(q.regions[0], "no-such"); }, 5, "no-such"},
           {[](RingRequest& q) { std::memset(q.regions[0], 'x', sizeof q.regions[0]); }, 3,
            "regions[0]"},
           {[](RingRequest& q) { q.arrays[0].region = 2; }, 3, "regions[1]"},
           {[](RingRequest& q) { q.arrays[3].offset = (64 << 10) - 8; }, 3, "d"},
           {[](RingRequest& q) { q.x_offset = 3; }, 3, "x"}}) {
    RingRequest q = request("alice-data");
    bad.change(q);
    ASSERT_TRUE(r.Ask(0, q, &ans));
    EXPECT_EQ(ans.code, bad.code) << bad.names << ": " << Message(ans);
    EXPECT_TRUE(Message(ans).find(bad.names) != std::string::npos) << bad.names << ": " << Message(ans);
  }
  // By handle: the right-hand side and x in alice-data.
  Client client(ClientOptions(server, Transport::kGrpc, "alice-token"));
  Job job = testing::MakeJob(Kind::kTridiagonal, arrays);
  job.arrays.erase("d");
  auto sys = client.CreateSystem(job);
  ASSERT_TRUE(sys.ok()) << sys.status();
  RingRequest q = request("alice-data");
  q.op = kOpSolveSystem;
  std::strncpy(q.handle, sys->handle.c_str(), sizeof q.handle - 1);
  q.narrays = 1;
  q.arrays[0] = q.arrays[3];
  Name(q.arrays[0], "rhs");
  auto* x = reinterpret_cast<double*>(data->data() + 2048);
  std::fill(x, x + 64, -1.0);
  ASSERT_TRUE(r.Ask(0, q, &ans));
  ASSERT_EQ(ans.code, 0) << Message(ans);
  auto direct = client.SolveSystem(sys->handle, arrays.at("d").view());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(std::memcmp(x, direct->x.data.data(), 512), 0);
  q.regions[0][0] = 'B';  // "Blice-data": no region of alice's
  ASSERT_TRUE(r.Ask(0, q, &ans));
  EXPECT_EQ(ans.code, 5) << Message(ans);
  std::remove(tokens.c_str());
}

}  // namespace
}  // namespace trisolve
