// Request rings: small unary solves and solves by handle of a client on the server's host,
// asked and answered through a slot in shared memory (proto/ring_abi.h) instead of over the
// socket. Each call takes a ring of the client's own (one a thread at a time, opened on first
// use and kept), copies its arrays into the ring's arena, rings the server's doorbell, and
// spins briefly (where the ring's last answer came within the spin), then sleeps on its slot
// until the answer is there.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client_impl.h"
#include "ring_abi.h"

namespace trisolve {

using namespace trisolve::ring;  // NOLINT: the ABI's names

namespace {

using Clock = std::chrono::steady_clock;

int64_t Align(int64_t v) { return (v + kRingAlign - 1) / kRingAlign * kRingAlign; }

// Calls of this process spinning for their answers now, and the most that may: past half the
// cores, spinning takes the cores from the threads with work (the server's among them).
std::atomic<int> spinners{0};
const int max_spinners = std::max(1, int(std::thread::hardware_concurrency()) / 2);
// A ring whose last answer took longer than the spin sleeps at once on its next call: with more
// calling threads than cores the answers wait in the server's queue for longer than any spin,
// and a spinning caller holds a core that a ring thread or another caller with work needs. One
// call in kSpinProbe spins anyway, to notice that the load fell, unless the server said with
// its last answer that its thread had others queued (RingHeader::queued above 1): then the
// load has not fallen, and the next answer will find the caller asleep anyway.
constexpr uint64_t kSpinProbe = 16;

// A long call (its ring's last answer took kLongCallUs or more: a large solve by reference)
// sleeps until kEarlyUs before the time its last answer took, then spins up to 2 kEarlyUs for
// this one: the answer then finds the caller awake, instead of paying the wake-up of a thread
// asleep on a futex (about 0.1 ms on the lent H100 host's virtual machine). At most a sixth of
// such a call's time is spent spinning, and only within the spinners' bound; never where the
// server's thread had others queued (the time was the queue's, not the solve's).
constexpr double kLongCallUs = 1500;
constexpr double kEarlyUs = 125;

// A server that stops advancing a ring's heartbeat for this long is taken for gone.
constexpr double kHeartbeatTimeoutS = 3;

void SetText(char* dst, size_t n, absl::string_view s) {
  const size_t len = std::min(n - 1, s.size());
  std::memcpy(dst, s.data(), len);
  std::memset(dst + len, 0, n - len);
}

}  // namespace

// One ring of the client's: its shared memory (the header, one slot, then the arena), registered
// and opened on the server.
struct Client::Impl::RingLane {
  std::unique_ptr<SharedMemory> shm;
  std::string ring_id;
  RingHeader* header = nullptr;
  RingSlot* slot = nullptr;
  int64_t arena = 0;  // where the arena starts in the region
  uint64_t sequence = 0;
  double last_wait_us = 0;  // from submitting the last request to its answer
  uint32_t last_queued = 0;  // RingHeader::queued with the last answer (0: not told)
  bool broken = false;  // the server went, or a request was left with it: not reused

  bool closed() const { return Word(header->closed).load() != kRingOpen; }
  int64_t arena_bytes() const { return shm->size() - arena; }
};


struct Client::Impl::RingPool {
  Client::Impl* impl;
  std::mutex mu;
  std::vector<std::unique_ptr<RingLane>> idle;
  int open = 0;
  enum class State { kUntried, kYes, kNo } state = State::kUntried;
  std::string why_not;  // kNo: what the server said
  // After the server refused a ring for want of room (its caps on rings or regions), no new
  // one is asked for before this: auto's calls take the RPC meanwhile without paying for a
  // refused OpenRing each.
  Clock::time_point retry_after{};

  ~RingPool() {
    for (auto& lane : idle) Close(*lane);
  }
  void Close(RingLane& lane) {
    if (!lane.ring_id.empty() && !lane.closed()) {
      v1::CloseRingRequest req;
      req.set_ring(lane.ring_id);
      grpc::ClientContext ctx;
      impl->Auth(ctx);
      v1::RingInfo info;
      (void)impl->stub->CloseRing(&ctx, req, &info);
    }
    if (lane.shm) (void)impl->Unregister(lane.shm->data());
  }
};

void Client::Impl::RingPoolDeleter::operator()(RingPool* p) const { delete p; }

std::unique_ptr<Client::Impl::RingPool, Client::Impl::RingPoolDeleter> Client::Impl::MakeRingPool(
    Impl* impl) {
  auto* p = new RingPool;
  p->impl = impl;
  return std::unique_ptr<RingPool, RingPoolDeleter>(p);
}

namespace {

// The most a ring's arena grows to under auto: ring_max_arena_bytes, or the arena a ring starts
// with where that is larger.
int64_t RingMostBytes(const Client::Options& o) {
  return std::max(o.ring_arena_bytes, o.ring_max_arena_bytes);
}

// Why a call did not go through a ring: kSkip under auto (take the other path), an error when
// the ring was asked for.
absl::Status NotOnRing(bool forced, absl::string_view why) {
  if (!forced) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("transport ring: ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client::Impl::RingLane>> Client::Impl::AcquireRing(int64_t need,
                                                                              bool* fall_back) {
  *fall_back = false;
  const bool forced = options.transport == Transport::kRing;
  std::unique_ptr<Client::Impl::RingLane> smaller;  // closed below, outside the lock
  {
    std::lock_guard<std::mutex> lock(rings->mu);
    if (rings->state == RingPool::State::kNo) {
      *fall_back = !forced;
      return absl::FailedPreconditionError(absl::StrCat("transport ring: ", rings->why_not));
    }
    for (auto it = rings->idle.begin(); it != rings->idle.end();) {
      if ((*it)->closed()) {  // its region expired meanwhile, or the server restarted
        std::unique_ptr<Client::Impl::RingLane> gone = std::move(*it);
        it = rings->idle.erase(it);
        --rings->open;
        (void)Unregister(gone->shm->data());
        continue;
      }
      if ((*it)->arena_bytes() >= need) {
        auto lane = std::move(*it);
        rings->idle.erase(it);
        return lane;
      }
      ++it;
    }
    if (Clock::now() < rings->retry_after) {
      *fall_back = !forced;
      return absl::ResourceExhaustedError(
          "transport ring: the server refused a new ring a moment ago (its ring or region caps)");
    }
    // None idle holds the call: an idle ring too small gives way to a larger one, so that the
    // rings stay one a calling thread (a thread whose calls grow grows its ring).
    if (!rings->idle.empty()) {
      smaller = std::move(rings->idle.front());
      rings->idle.erase(rings->idle.begin());
      --rings->open;
    }
    if (rings->open >= std::max(1, options.max_rings)) {
      if (smaller) {
        rings->idle.push_back(std::move(smaller));
        ++rings->open;
      }
      *fall_back = !forced;
      return absl::ResourceExhaustedError(
          absl::StrCat("transport ring: this client holds ", rings->open, " rings (max_rings)"));
    }
    ++rings->open;
  }
  if (smaller) rings->Close(*smaller);
  auto lane = std::make_unique<Client::Impl::RingLane>();
  auto fail = [&](absl::Status st, bool never) -> absl::Status {
    std::lock_guard<std::mutex> lock(rings->mu);
    --rings->open;
    if (never) {
      rings->state = RingPool::State::kNo;
      rings->why_not = std::string(st.message());
    } else if (st.code() == absl::StatusCode::kResourceExhausted) {
      rings->retry_after = Clock::now() + std::chrono::seconds(1);
    }
    *fall_back = !forced;
    return st;
  };
  const int64_t arena = Align(RingBytes(1));
  // Grown rings double, so that a thread whose calls grow by a little each time does not
  // replace its ring each call.
  int64_t room = std::max<int64_t>(options.ring_arena_bytes, 4096);
  while (room < need) room *= 2;
  if (!forced) room = std::max(need, std::min(room, RingMostBytes(options)));
  auto memory = SharedMemory::Create(arena + room);
  if (!memory.ok()) return fail(memory.status(), false);
  lane->shm = *std::move(memory);
  lane->arena = arena;
  lane->header = reinterpret_cast<RingHeader*>(lane->shm->data());
  lane->slot = Slots(lane->header);
  RingHeader& h = *lane->header;
  h.magic = kRingMagic;
  h.version = kRingVersion;
  h.slots = 1;
  h.slot_bytes = sizeof(RingSlot);
  h.header_bytes = sizeof(RingHeader);
  const std::string name = absl::StrCat("ring", lane->shm->key().substr(9));
  if (auto st = Register(*lane->shm, name); !st.ok()) {
    // Another host, or a server that refuses shared memory: never on this client.
    const bool never = st.code() == absl::StatusCode::kFailedPrecondition ||
                       st.code() == absl::StatusCode::kUnimplemented;
    return fail(st, never);
  }
  v1::OpenRingRequest req;
  req.set_region(name);
  req.set_offset(0);
  req.set_slots(1);
  grpc::ClientContext ctx;
  Auth(ctx);
  AwaitConnection(ctx);
  v1::RingInfo info;
  const grpc::Status st = stub->OpenRing(&ctx, req, &info);
  if (!st.ok()) {
    (void)Unregister(lane->shm->data());
    const bool never = st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                       st.error_code() == grpc::StatusCode::UNIMPLEMENTED;
    return fail(FromGrpc(st), never);
  }
  lane->ring_id = info.ring();
  std::lock_guard<std::mutex> lock(rings->mu);
  rings->state = RingPool::State::kYes;
  return lane;
}

void Client::Impl::ReleaseRing(std::unique_ptr<Client::Impl::RingLane> lane) {
  if (lane->broken || lane->closed()) {
    rings->Close(*lane);
    std::lock_guard<std::mutex> lock(rings->mu);
    --rings->open;
    return;
  }
  std::lock_guard<std::mutex> lock(rings->mu);
  rings->idle.push_back(std::move(lane));
}

std::string Client::Impl::RingState() const {
  if (options.transport != Transport::kAuto && options.transport != Transport::kRing) return "off";
  std::lock_guard<std::mutex> lock(rings->mu);
  switch (rings->state) {
    case RingPool::State::kYes: return "ring";
    case RingPool::State::kNo: return "grpc";
    default: return "untried";
  }
}

namespace {

// Hands the slot's request to the server and waits for its answer (spinning `spin_us`, then
// on the slot's futex). The answer is copied to `out`; the slot is free again afterwards.
// expect_us > 0: the answer is expected about then; sleep until a little before it, then spin.
absl::Status Exchange(RingHeader& h, RingSlot& s, double spin_us, double expect_us,
                      std::optional<Clock::time_point> deadline, RingAnswer* out, bool* broken) {
  const auto closed = [&h] { return Word(h.closed).load() != kRingOpen; };
  if (closed()) {
    *broken = true;
    return absl::UnavailableError("the server closed the ring");
  }
  Word(s.waiting).store(0);
  Word(s.state).store(kSlotSubmitted);
  const auto submitted = Clock::now();
  Word(h.doorbell).fetch_add(1);
  if (Word(h.sleeping).load() != 0) FutexWake(&h.doorbell);
  uint32_t state = Word(s.state).load();
  if (expect_us > 0) {
    // Asleep (woken by the server should it answer sooner) until shortly before the answer.
    const auto wake_at = submitted + std::chrono::nanoseconds(int64_t((expect_us - kEarlyUs) * 1e3));
    while (state != kSlotDone && !closed()) {
      const double left_s = std::chrono::duration<double>(wake_at - Clock::now()).count();
      if (left_s <= 0) break;
      Word(s.waiting).store(1);
      state = Word(s.state).load();
      if (state == kSlotDone) break;
      FutexWait(&s.state, state, std::min(left_s, 0.05));
      state = Word(s.state).load();
    }
    Word(s.waiting).store(0);
    state = Word(s.state).load();
    spin_us = 2 * kEarlyUs;
  }
  if (spin_us > 0 && spinners.fetch_add(1) < max_spinners) {
    const auto spin_until = Clock::now() + std::chrono::nanoseconds(int64_t(spin_us * 1e3));
    while (state != kSlotDone && Clock::now() < spin_until) {
      for (int k = 0; k < 16; ++k) CpuRelax();
      state = Word(s.state).load();
    }
  }
  if (spin_us > 0) spinners.fetch_sub(1);
  uint32_t beat = Word(h.heartbeat).load();
  auto beat_seen = Clock::now();
  while (state != kSlotDone) {
    Word(s.waiting).store(1);
    state = Word(s.state).load();
    if (state == kSlotDone) break;
    FutexWait(&s.state, state, 0.05);
    state = Word(s.state).load();
    if (state == kSlotDone) break;
    const auto now = Clock::now();
    if (const uint32_t b = Word(h.heartbeat).load(); b != beat) {
      beat = b;
      beat_seen = now;
    }
    // The slot stays the server's: this ring is not used again.
    if (closed() && state == kSlotSubmitted) {
      *broken = true;
      return absl::UnavailableError("the server closed the ring before taking the request");
    }
    if (std::chrono::duration<double>(now - beat_seen).count() > kHeartbeatTimeoutS) {
      *broken = true;
      return absl::UnavailableError(absl::StrCat(
          "the server stopped serving the ring (no heartbeat for ", kHeartbeatTimeoutS, " s)"));
    }
    if (deadline && now > *deadline + std::chrono::seconds(1)) {
      *broken = true;
      return absl::DeadlineExceededError("the server did not answer within the deadline");
    }
  }
  Word(s.waiting).store(0);
  std::memcpy(out, &s.answer, sizeof *out);
  Word(s.state).store(kSlotFree);
  if (out->tag != s.request.tag) {
    *broken = true;
    return absl::DataLossError("the ring's answer is not its request's");
  }
  return absl::OkStatus();
}

void ReadAnswer(const RingAnswer& a, const std::string& request_id, Summary* out) {
  out->method = std::string(a.method, strnlen(a.method, sizeof a.method));
  out->backend = std::string(a.backend, strnlen(a.backend, sizeof a.backend));
  out->request_id = request_id;
  out->systems = a.systems;
  out->ok = a.ok;
  out->singular = a.singular;
  out->not_converged = a.not_converged;
  out->diverged = a.diverged;
  out->iterations = a.iterations;
  out->residual = a.residual;
  out->right_hand_sides = a.right_hand_sides;
  out->batched_with = a.batched_with;
  out->timings.receive_us = a.receive_us;
  out->timings.queue_us = a.queue_us;
  out->timings.h2d_us = a.h2d_us;
  out->timings.compute_us = a.compute_us;
  out->timings.d2h_us = a.d2h_us;
  out->timings.residual_us = a.residual_us;
  out->timings.server_total_us = a.total_us;
  out->transport = "ring";
}

}  // namespace

std::optional<absl::StatusOr<Result>> Client::Impl::SolveOnRing(
    uint32_t op, Kind kind, DType dtype, const std::vector<std::pair<std::string, ArrayView>>& send,
    const std::string& rhs_field, const JobOptions& jo, const std::string& handle, void* x_out,
    int64_t x_bytes) {
  const Transport t = options.transport;
  const bool forced = t == Transport::kRing;
  if (t != Transport::kAuto && !forced) return std::nullopt;
  auto skip = [&](absl::string_view why) -> std::optional<absl::StatusOr<Result>> {
    const absl::Status st = NotOnRing(forced, why);
    if (st.ok()) return std::nullopt;
    return absl::StatusOr<Result>(st);
  };
  if (replicas && replicas->balanced()) return skip("needs a client of one server");
  if (jo.progress) return skip("progress reports travel through the RPC");
  if (jo.residual_history) return skip("a residual history travels through the RPC");
  if (int(send.size()) > kRingMaxArrays) return skip("too many arrays");
  if (jo.method.size() >= sizeof(RingRequest::method)) return skip("the method name is too long");
  if (handle.size() >= sizeof(RingRequest::handle)) return skip("the handle is too long");
  if (x_out != nullptr && internal::InCudaMemory(x_out, x_bytes))
    return skip("x in CUDA memory travels by reference");
  const int elem = dtype == DType::kFloat32 ? 4 : 8;
  // Arrays (and x) already in a region this client registered travel by reference, read and
  // written there in place: only the others are copied into the ring's arena. Their regions
  // are named in the request, at most kRingMaxRegions of them (an array of a further region
  // is copied).
  std::vector<std::string> regions;
  auto region_of = [&](const void* p, int64_t bytes) -> std::optional<v1::RegionRef> {
    auto ref = RefOf(p, bytes);
    if (!ref || ref->region().size() >= sizeof(RingRequest::regions[0])) return std::nullopt;
    if (std::find(regions.begin(), regions.end(), ref->region()) == regions.end()) {
      if (int(regions.size()) >= kRingMaxRegions) return std::nullopt;
      regions.push_back(ref->region());
    }
    return ref;
  };
  auto index_of = [&](const v1::RegionRef& ref) {
    return uint32_t(std::find(regions.begin(), regions.end(), ref.region()) - regions.begin()) + 1;
  };
  std::vector<std::optional<v1::RegionRef>> refs(send.size());
  const std::optional<v1::RegionRef> x_ref =
      x_out != nullptr ? region_of(x_out, x_bytes) : std::nullopt;
  // Room for a status a system. The systems are at most the right-hand side's values over its
  // shortest dimension (a batch's systems, or k right-hand sides, each of n >= that dimension),
  // or a variable-size batch's lengths. By handle, a system of different sizes takes [total]
  // or [k, total] and answers k statuses a system: its count where this client created or
  // listed it, else a status a value.
  int64_t most_systems = x_bytes / elem;
  std::optional<SystemInfo> system;
  if (!handle.empty()) {
    std::lock_guard<std::mutex> lock(systems_mu);
    if (auto it = systems.find(handle); it != systems.end()) system = it->second;
  }
  for (const auto& [field, v] : send) {
    if (field != rhs_field) continue;
    if (system && system->variable) {
      most_systems = (v.shape.size() == 2 ? v.shape[0] : 1) * system->systems;
    } else if (v.shape.size() >= 2 && (handle.empty() || system)) {
      const int64_t shortest = *std::min_element(v.shape.begin(), v.shape.end());
      if (shortest > 0) most_systems = v.elements() / shortest;
    }
  }
  for (const auto& [field, v] : send)
    if (field == "lengths") most_systems = std::max<int64_t>(1, v.elements());
  int64_t need = (x_ref ? 0 : Align(x_bytes)) + Align(std::max<int64_t>(1, most_systems));
  bool referenced = x_ref.has_value();
  for (size_t i = 0; i < send.size(); ++i) {
    const auto& [field, v] = send[i];
    if (v.shape.empty() || v.shape.size() > size_t(kRingMaxRank))
      return skip("an array of rank 0 or above 4");
    if (field.size() >= sizeof(RingArray::name)) return skip("an array name is too long");
    if (internal::InCudaMemory(v.data, v.bytes()))
      return skip("arrays in CUDA memory travel by reference");
    refs[i] = region_of(v.data, v.bytes());
    if (refs[i]) {
      referenced = true;
    } else {
      need += Align(v.bytes());
    }
  }
  // auto: small calls only, those the client would send in one message over gRPC, where their
  // bytes are copied; arrays already in registered memory are not, whatever their size.
  if (!forced && (need > RingMostBytes(options) ||
                  (!referenced && need > options.stream_threshold_bytes)))
    return std::nullopt;
  bool fall_back = false;
  auto lane = AcquireRing(need, &fall_back);
  if (!lane.ok()) {
    if (fall_back) return std::nullopt;
    return absl::StatusOr<Result>(lane.status());
  }
  Client::Impl::RingLane& l = **lane;
  std::byte* base = l.shm->data();
  RingRequest& rq = l.slot->request;
  std::memset(&rq, 0, sizeof rq);
  rq.op = op;
  rq.family = kind == Kind::kTridiagonal        ? kFamilyTridiagonal
              : kind == Kind::kTree             ? kFamilyTree
              : kind == Kind::kBlockTridiagonal ? kFamilyBlockTridiagonal
                                                : kFamilyDense;
  rq.dtype = dtype == DType::kFloat32 ? 2 : 1;
  rq.layout = jo.interleaved ? 1 : 0;
  rq.flags = (jo.skip_residual ? uint32_t(kFlagSkipResidual) : 0u) |
             (jo.scale_rows ? uint32_t(kFlagScaleRows) : 0u) |
             (jo.max_iterations ? uint32_t(kFlagMaxIterations) : 0u) |
             (jo.tol ? uint32_t(kFlagTol) : 0u);
  if (op == kOpSolveSystem) {  // the system has its options: as SolveSystemRequest, only these
    rq.layout = 0;
    rq.flags &= uint32_t(kFlagSkipResidual);
  }
  if (jo.max_iterations) rq.max_iterations = *jo.max_iterations;
  if (jo.tol) rq.tol = *jo.tol;
  SetText(rq.method, sizeof rq.method, jo.method == "auto" ? "" : jo.method);
  SetText(rq.handle, sizeof rq.handle, handle);
  const bool own_id = !jo.request_id.empty() && jo.request_id.size() < sizeof rq.request_id &&
                      std::all_of(jo.request_id.begin(), jo.request_id.end(), [](char ch) {
                        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' ||
                               ch == '_' || ch == '.' || ch == ':';
                      });
  if (own_id) SetText(rq.request_id, sizeof rq.request_id, jo.request_id);
  std::optional<Clock::time_point> deadline;
  if (jo.timeout_s) {
    rq.deadline_unix_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            (std::chrono::system_clock::now() +
             std::chrono::microseconds(int64_t(*jo.timeout_s * 1e6)))
                .time_since_epoch())
            .count();
    deadline = Clock::now() + std::chrono::microseconds(int64_t(*jo.timeout_s * 1e6));
  }
  int64_t at = l.arena;
  for (size_t k = 0; k < regions.size(); ++k)
    SetText(rq.regions[k], sizeof rq.regions[k], regions[k]);
  rq.narrays = int32_t(send.size());
  for (size_t i = 0; i < send.size(); ++i) {
    const auto& [field, v] = send[i];
    RingArray& a = rq.arrays[i];
    SetText(a.name, sizeof a.name, field);
    a.rank = int32_t(v.shape.size());
    for (size_t k = 0; k < v.shape.size(); ++k) a.shape[k] = v.shape[k];
    a.bytes = v.bytes();
    if (refs[i]) {
      a.region = index_of(*refs[i]);
      a.offset = refs[i]->offset();
      continue;
    }
    a.offset = at;
    std::memcpy(base + at, v.data, size_t(v.bytes()));
    at += Align(v.bytes());
  }
  rq.x_bytes = x_bytes;
  if (x_ref) {
    rq.x_region = index_of(*x_ref);
    rq.x_offset = x_ref->offset();
  } else {
    rq.x_offset = at;
    at += Align(x_bytes);
  }
  rq.status_offset = at;
  rq.status_bytes = std::max<int64_t>(1, most_systems);
  rq.tag = ++l.sequence;
  RingAnswer ans;
  const bool queue = l.last_queued > 1;
  const bool spin = l.last_wait_us <= options.ring_spin_us || (!queue && rq.tag % kSpinProbe == 0);
  // (Not past a second: the sleep does not watch the heartbeat or the deadline.)
  const bool long_call =
      !queue && options.ring_spin_us > 0 && l.last_wait_us >= kLongCallUs && l.last_wait_us <= 1e6;
  const auto asked = Clock::now();
  absl::Status st =
      Exchange(*l.header, *l.slot, spin ? options.ring_spin_us : 0,
               long_call ? l.last_wait_us : 0, deadline, &ans, &l.broken);
  l.last_wait_us = std::chrono::duration<double, std::micro>(Clock::now() - asked).count();
  l.last_queued = Word(l.header->queued).load();
  if (!st.ok()) {
    ReleaseRing(*std::move(lane));
    return absl::StatusOr<Result>(st);
  }
  if (ans.code != 0) {
    ReleaseRing(*std::move(lane));
    return absl::StatusOr<Result>(absl::Status(
        static_cast<absl::StatusCode>(ans.code),
        absl::string_view(ans.message, std::min<size_t>(ans.message_bytes, kRingMessageBytes))));
  }
  Result result;
  result.x.dtype = ans.dtype == 2 ? DType::kFloat32 : DType::kFloat64;
  int64_t values = 1;
  for (int k = 0; k < std::clamp(ans.x_rank, 0, kRingMaxRank); ++k) {
    result.x.shape.push_back(ans.x_shape[k]);
    values *= ans.x_shape[k];
  }
  const int64_t got = values * DTypeSize(result.x.dtype);
  if (got != x_bytes || ans.statuses < 0 || ans.statuses > rq.status_bytes) {
    l.broken = true;
    ReleaseRing(*std::move(lane));
    return absl::StatusOr<Result>(absl::DataLossError("the ring's answer does not fit its request"));
  }
  if (x_ref) {
    // The server wrote x in place.
  } else if (x_out != nullptr) {
    std::memcpy(x_out, base + rq.x_offset, size_t(x_bytes));
  } else {
    result.x.data.resize(size_t(x_bytes));
    std::memcpy(result.x.data.data(), base + rq.x_offset, size_t(x_bytes));
  }
  result.status.resize(size_t(ans.statuses));
  for (int64_t i = 0; i < ans.statuses; ++i)
    result.status[size_t(i)] = static_cast<SolveStatus>(base[rq.status_offset + i]);
  ReadAnswer(ans, own_id ? jo.request_id : absl::StrCat(l.ring_id, ".", rq.tag), &result.summary);
  result.summary.handle = handle;
  ReleaseRing(*std::move(lane));
  return absl::StatusOr<Result>(std::move(result));
}

}  // namespace trisolve
