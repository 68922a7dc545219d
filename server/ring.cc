#include "ring.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "translate.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve::server {

using namespace trisolve::ring;  // NOLINT: the ABI's names

namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// A fixed-size text field of the descriptor: NUL-terminated within its bytes.
absl::StatusOr<std::string> Text(absl::string_view field, const char* p, size_t n) {
  const void* end = std::memchr(p, 0, n);
  if (end == nullptr)
    return Invalid(field, absl::StrCat("not NUL-terminated within its ", n, " bytes"));
  return std::string(p, static_cast<const char*>(end));
}

// The request's id for the log: the client's, where it is a short token (as gRPC's x-request-id
// is taken), else the ring's id and the tag.
std::string RequestIdOf(const RingRequest& r, const std::string& ring) {
  const size_t n = strnlen(r.request_id, sizeof r.request_id);
  const absl::string_view id(r.request_id, n);
  if (n > 0 && n < sizeof r.request_id &&
      std::all_of(id.begin(), id.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' ||
               ch == '.' || ch == ':';
      }))
    return std::string(id);
  return absl::StrCat(ring, ".", r.tag);
}

const char* RpcOf(const RingRequest& r) {
  if (r.op == kOpSolveSystem) return "SolveSystem";
  switch (r.family) {
    case kFamilyTridiagonal: return "SolveTridiagonal";
    case kFamilyTree: return "SolveTree";
    case kFamilyBlockTridiagonal: return "SolveBlockTridiagonal";
    case kFamilyDense: return "SolveDense";
    default: return "Ring";
  }
}

void SetText(char* dst, size_t n, absl::string_view s) {
  const size_t len = std::min(n - 1, s.size());
  std::memcpy(dst, s.data(), len);
  std::memset(dst + len, 0, n - len);
}

// futex_waitv (Linux 5.16): one sleep on many futex words, woken by a FUTEX_WAKE on any of
// them. Defined here per the kernel's ABI, since older headers lack it (the number is the
// same on x86-64 and aarch64).
constexpr long kSysFutexWaitv = 449;
struct FutexWaitv {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(FutexWaitv) == 24);
constexpr uint32_t kFutex2SizeU32 = 0x02;
// Only for the thread's own word: the rings' words are in memory other processes map, where a
// private futex would never see their FUTEX_WAKE.
constexpr uint32_t kFutex2Private = 128;
constexpr int kFutexWaitvMax = 128;

// Whether this kernel has futex_waitv (a call with no words: EINVAL where it exists; ENOSYS
// where not, or EPERM where a seccomp filter refuses it).
bool HaveFutexWaitv() {
  const long rc = syscall(kSysFutexWaitv, nullptr, 0, 0, nullptr, 0);
  return !(rc < 0 && (errno == ENOSYS || errno == EPERM));
}

}  // namespace

// A thread that makes the FUTEX_WAKEs of clients asleep on their slots for the serving threads
// (RingOptions::wakers). With more calling threads than cores nearly every caller sleeps, and
// each answer's wake (a system call, the scheduler's wake-up of the caller, on a virtual
// machine an interrupt to another core) cost the serving thread as much as the request's solve;
// handed over, the serving thread goes back to the requests waiting at once.
class RingManager::Waker {
 public:
  Waker(const RingOptions& options, std::atomic<int>* spinners, int max_spinners, int index)
      : options_(options), spinners_(spinners), max_spinners_(max_spinners), index_(index) {}
  ~Waker() { Stop(); }

  void Start() {
    thread_ = std::thread([this] { Run(); });
    pthread_setname_np(thread_.native_handle(),
                       absl::StrCat("ring-wake-", index_).substr(0, 15).c_str());
  }
  // Takes over the FUTEX_WAKE of `word`, a slot's state in `ring`'s mapping (kept mapped until
  // the wake is done). False: the caller wakes it itself, because the waker is asleep and the
  // caller has nothing else to do (waking the waker would cost what it saves, and a hop), it
  // has kMaxPending wakes waiting already (it fell behind: the caller's own wake is sooner), or
  // it is stopping.
  bool Offer(std::shared_ptr<Ring> ring, uint32_t* word, bool busy) {
    if (!busy && asleep_.load()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || pending_.size() >= kMaxPending) return false;
      pending_.push_back(Pending{std::move(ring), word});
      count_.fetch_add(1);
    }
    if (asleep_.load()) Bell();
    return true;
  }
  // Makes the wakes it was handed, then ends; later Offers are refused. True when this call
  // ended it.
  bool Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    Bell();
    if (!thread_.joinable()) return false;
    thread_.join();
    return true;
  }
  // Wakes handed over and made (logged at the end: the tests look for it).
  int64_t woken() const { return woken_.load(); }
  int index() const { return index_; }

 private:
  struct Pending {
    std::shared_ptr<RingManager::Ring> ring;
    uint32_t* word;
  };
  // Past this many waiting, a serving thread wakes its client itself: each wake waits for the
  // ones before it, a microsecond or a few each.
  static constexpr size_t kMaxPending = 16;

  void Bell() {
    Word(bell_).fetch_add(1);
    syscall(SYS_futex, &bell_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  }
  void Run();

  const RingOptions& options_;
  std::atomic<int>* const spinners_;
  const int max_spinners_;
  const int index_;
  std::mutex mu_;
  std::vector<Pending> pending_;  // under mu_
  bool stopping_ = false;         // under mu_
  std::atomic<int> count_{0};     // pending_'s size, read without mu_
  std::atomic<bool> asleep_{false};
  std::atomic<int64_t> woken_{0};
  uint32_t bell_ = 0;  // a futex word of this process only
  std::thread thread_;
};

class RingManager::Ring : public std::enable_shared_from_this<RingManager::Ring> {
 public:
  Ring(Core* core, const RingOptions& options, std::atomic<int>* spinners, int max_spinners,
       std::string id, std::string identity, std::shared_ptr<Region> region, int64_t offset,
       int slots, Pool* pool)
      : core_(core),
        options_(options),
        spinners_(spinners),
        max_spinners_(max_spinners),
        id_(std::move(id)),
        identity_(std::move(identity)),
        region_(std::move(region)),
        offset_(offset),
        slots_(slots),
        header_(reinterpret_cast<RingHeader*>(region_->base() + offset)),
        slot_(Slots(header_)),
        pool_(pool) {}
  ~Ring() { Join(); }

  const std::string& id() const { return id_; }
  const std::string& identity() const { return identity_; }
  const Region& region() const { return *region_; }
  int slots() const { return slots_; }
  int64_t bytes() const { return RingBytes(slots_); }
  bool ended() const { return ended_.load(); }
  // The server stopped serving it (its region went, a shutdown), or its client closed it.
  bool stopped() const { return stop_.load(); }

  // Starts its own serving thread, or (with a pool) only readies the header: the pool's thread
  // serves it once the pool has it.
  void Start() {
    Word(header_->closed).store(kRingOpen);
    Word(header_->sleeping).store(0);
    if (pool_ == nullptr) {
      thread_ = std::thread([this] { Serve(); });
      pthread_setname_np(thread_.native_handle(), "ring");
    }
  }
  Pool* pool() const { return pool_; }
  // Asks its thread to stop serving it after the request it is answering. `touch` false: the
  // region no longer spans the ring (truncated), so nothing more is written into it.
  void Stop(RingClosed why, bool touch = true);
  // Until its thread has stopped serving it (closed it).
  void Join() {
    if (thread_.joinable()) thread_.join();
    if (pool_ != nullptr) ended_.wait(false);
  }
  void Beat() {
    if (touch_.load() && !stop_.load()) Word(header_->heartbeat).fetch_add(1);
  }

  // ---- for a pool's thread ----
  // Answers one request of the ring, if it has one: the first submitted slot from where the
  // last sweep left off (so a ring of many slots takes its turn with the others of its thread,
  // a slot a sweep). A ring whose doorbell has not moved since a look found nothing is passed
  // over without reading its slots (`full`: read them anyway). True if it found a request.
  bool Sweep(bool full);
  // Its doorbell's word, and the value it had before the last look at the slots that found
  // none submitted (meaningful once a Sweep returned false): a FUTEX_WAKE on the word, or a
  // value other than that, means a request may have come since.
  uint32_t* doorbell() const { return &header_->doorbell; }
  uint32_t quiet() const { return quiet_; }
  bool rang() const { return Word(header_->doorbell).load() != quiet_; }
  // Whether its header may be read and written (false once its object shrank under it).
  bool touchable() const { return touch_.load(); }
  void Sleeping(bool on) { Word(header_->sleeping).store(on ? 1 : 0); }
  // Closes it (on its pool's thread, once stopped): as a thread of its own does on leaving.
  void End() {
    Closing();
    ended_.store(true);
    ended_.notify_all();
  }

 private:
  void Serve();
  void Answer(RingSlot& slot);
  // The request's answer; `ans` gets x's shape and the summary, the slot's region x and the
  // statuses.
  absl::Status Run(Call& call, const RingRequest& req, RingAnswer* ans);
  absl::Status RunSolve(Call& call, const RingRequest& req, RingAnswer* ans);
  absl::Status RunSolveSystem(Call& call, const RingRequest& req, RingAnswer* ans);
  template <typename Req>
  absl::Status FillFamily(const RingRequest& req, Req* msg);
  // [offset, offset + bytes) of the region, outside the ring's header and slots.
  absl::Status CheckRange(absl::string_view field, int64_t offset, int64_t bytes) const;
  // The region an array or x lies in (RingArray::region): "" for the ring's own, else the name
  // request.regions[k - 1] gives (resolved later as the identity's, as an RPC's RegionRef is).
  absl::StatusOr<std::string> OtherRegion(const RingRequest& req, absl::string_view field,
                                          uint32_t k) const;
  absl::Status WriteStatuses(const RingRequest& req, const std::vector<SystemStatus>& status,
                             RingAnswer* ans);
  void Fill(const server::Answer& a, RingAnswer* ans) const;
  void Closing();

  Core* const core_;
  const RingOptions& options_;
  std::atomic<int>* const spinners_;  // the manager's: rings spinning now
  const int max_spinners_;
  const std::string id_, identity_;
  const std::shared_ptr<Region> region_;
  const int64_t offset_;
  const int slots_;
  RingHeader* const header_;
  RingSlot* const slot_;
  std::atomic<bool> stop_{false}, touch_{true}, ended_{false};
  std::atomic<uint32_t> why_{kRingOpen};
  int64_t served_ = 0;
  Pool* const pool_;  // null: the ring has a thread of its own
  std::thread thread_;
  // A pool's thread's state of the ring (only that thread touches them).
  uint32_t quiet_ = 0;
  bool looked_ = false;  // quiet_ is set
  int cursor_ = 0;       // the slot the next sweep looks at first
};

// One serving thread and the rings it owns. A thread with work sweeps its rings, a request of
// each in turn, without sleeping; one without spins briefly, then sleeps in futex_waitv on all
// of its rings' doorbells and its own word (rings added or stopped, the manager shutting down).
class RingManager::Pool {
 public:
  Pool(const RingOptions& options, std::atomic<int>* spinners, int max_spinners, int index,
       Waker* waker)
      : options_(options),
        spinners_(spinners),
        max_spinners_(max_spinners),
        index_(index),
        waker_(waker) {}
  ~Pool() { Join(); }

  int index() const { return index_; }
  int load() const { return load_.load(); }
  // ---- for its own thread (its rings' Answer) ----
  Waker* waker() const { return waker_; }
  // Requests its last pass over its rings answered (a request a ring a pass), at least 1: the
  // queue a client's next request joins.
  int queued() const { return std::max(1, queued_); }
  void Start() {
    thread_ = std::thread([this] { Run(); });
    // Named for top -H and perf (else it carries the name of the gRPC thread that opened the
    // ring that started it).
    pthread_setname_np(thread_.native_handle(), absl::StrCat("ring-", index_).substr(0, 15).c_str());
  }
  void Add(std::shared_ptr<Ring> ring) {
    load_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      rings_.push_back(std::move(ring));
      ++version_;
    }
    Poke();
  }
  // Wakes the thread (its rings changed, or one was stopped).
  void Poke() {
    Word(poke_).fetch_add(1);
    syscall(SYS_futex, &poke_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  }
  // After every ring of it was stopped: the thread closes them and ends.
  void Quit() {
    quit_.store(true);
    Poke();
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run();
  // Sleeps until a doorbell of `rings` or the thread's word moves (from the values seen), or
  // idle_wait_s passes; false on the timeout.
  bool Sleep(const std::vector<Ring*>& rings, uint32_t poked);

  const RingOptions& options_;
  std::atomic<int>* const spinners_;
  const int max_spinners_;
  const int index_;
  Waker* const waker_;        // null: its rings wake their clients themselves
  int queued_ = 0;            // its thread's: requests answered in the last pass
  std::atomic<int> load_{0};  // rings it owns and has not closed
  std::atomic<bool> quit_{false};
  uint32_t poke_ = 0;  // a futex word of this process only
  std::mutex mu_;
  std::vector<std::shared_ptr<Ring>> rings_;  // under mu_
  uint64_t version_ = 0;                      // under mu_: rings_'s changes
  std::thread thread_;
};

void RingManager::Ring::Stop(RingClosed why, bool touch) {
  uint32_t none = kRingOpen;
  if (why_.compare_exchange_strong(none, why)) touch_.store(touch);
  stop_.store(true);
  if (pool_ != nullptr) {
    pool_->Poke();
  } else if (touch_.load()) {
    FutexWake(&header_->doorbell);
  }
}

bool RingManager::Ring::Sweep(bool full) {
  if (stop_.load()) return false;
  const uint32_t rung = Word(header_->doorbell).load();
  if (!full && looked_ && rung == quiet_) return false;
  for (int k = 0; k < slots_; ++k) {
    const int i = (cursor_ + k) % slots_;
    if (Word(slot_[i].state).load() == kSlotSubmitted) {
      cursor_ = (i + 1) % slots_;
      Answer(slot_[i]);
      return true;
    }
  }
  // Nothing submitted. A request submitted after this look rings the doorbell after its slot
  // is SUBMITTED (the client's order, seq_cst), so after `rung` was read: the doorbell differs
  // from quiet_ from then on.
  quiet_ = rung;
  looked_ = true;
  return false;
}

// Why no wake-up is lost, with one sleeper for many rings. The client of a ring (client/ring.cc,
// Exchange) stores its slot SUBMITTED, then adds 1 to the doorbell D, then reads `sleeping` S
// and, if it is 1, FUTEX_WAKEs D. This thread, for every ring: reads D (quiet_) before it looks
// at the slots and finds none submitted (Sweep); then stores S = 1 for every ring, then reads
// every D again and sleeps only if each still equals its quiet_, in futex_waitv with quiet_ as
// each word's expected value. All of these are seq_cst atomics, so of the client's "D += 1,
// read S" and this thread's "S = 1, read D" at least one sees the other's write: either the
// client sees S = 1 and wakes D, or this thread sees D moved and does not sleep. A wake that
// comes before futex_waitv has queued on D is not lost either: futex_waitv compares each word
// with its expected value under the word's futex lock as it queues, and returns at once
// (EAGAIN) when D has moved. The thread's own word (poke_) follows the same rule: read before
// the ring list and the stop flags are looked at, expected unchanged in the sleep.
// The other direction, the answer's wake of a client asleep on its slot (Answer): the thread
// stores the slot DONE, then reads `waiting` W; the client stores W = 1, then reads the state
// and sleeps only if it is not DONE, in FUTEX_WAIT with that state as the expected value. So
// either the thread sees W = 1 and a FUTEX_WAKE follows, or the client sees DONE and does not
// sleep; and a FUTEX_WAIT that queues after DONE was stored returns at once (EAGAIN). The wake
// may therefore come late without being lost: a thread with more requests waiting hands it to
// a waker (Waker::Offer, whose own sleep is argued beside Waker::Run), which makes every wake it
// took before it ends; a closing ring wakes all its slots in any case.
void RingManager::Pool::Run() {
  std::vector<std::shared_ptr<Ring>> mine;
  std::vector<Ring*> awake;  // mine's rings whose headers may be read
  uint64_t seen = ~uint64_t{0};
  bool full = true;
  const auto spin = std::chrono::nanoseconds(int64_t(options_.spin_us * 1e3));
  while (true) {
    const uint32_t poked = Word(poke_).load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (seen != version_) {
        seen = version_;
        mine = rings_;
        full = true;  // a new ring's slots are read before its doorbell is trusted
      }
    }
    if (quit_.load())
      for (auto& r : mine) r->Stop(kClosedShutdown);
    // Rings asked to stop are closed here, between two requests.
    bool ended = false;
    for (auto& r : mine)
      if (r->stopped()) {
        r->End();
        ended = true;
      }
    if (ended) {
      std::lock_guard<std::mutex> lock(mu_);
      const auto gone = std::remove_if(rings_.begin(), rings_.end(),
                                       [](const std::shared_ptr<Ring>& r) { return r->ended(); });
      load_.fetch_sub(int(rings_.end() - gone));
      rings_.erase(gone, rings_.end());
      ++version_;
      seen = version_;
      mine = rings_;
    }
    if (quit_.load() && mine.empty()) break;
    int answered = 0;
    for (auto& r : mine) answered += r->Sweep(full) ? 1 : 0;
    full = false;
    queued_ = answered;
    if (answered > 0) continue;
    awake.clear();
    for (auto& r : mine)
      if (r->touchable() && !r->stopped()) awake.push_back(r.get());
    const auto moved = [&] {
      if (Word(poke_).load() != poked) return true;
      for (Ring* r : awake)
        if (r->rang()) return true;
      return false;
    };
    // Nothing to do: spin a little (a client in a loop sends its next request within
    // microseconds), then sleep until a doorbell rings. Never more threads spin at once than
    // half the cores.
    bool rang = false;
    if (spin.count() > 0 && spinners_->fetch_add(1) < max_spinners_) {
      const auto until = Clock::now() + spin;
      while (!rang && Clock::now() < until) {
        for (int k = 0; k < 32; ++k) CpuRelax();
        rang = moved();
      }
    }
    if (spin.count() > 0) spinners_->fetch_sub(1);
    if (rang) continue;
    for (Ring* r : awake) r->Sleeping(true);
    if (!moved() && !Sleep(awake, poked)) full = true;  // timed out: every slot read again
    for (Ring* r : awake) r->Sleeping(false);
  }
}

bool RingManager::Pool::Sleep(const std::vector<Ring*>& rings, uint32_t poked) {
  FutexWaitv w[kFutexWaitvMax];
  int n = 0;
  w[n++] = FutexWaitv{poked, reinterpret_cast<uintptr_t>(&poke_), kFutex2SizeU32 | kFutex2Private, 0};
  for (Ring* r : rings) {
    if (n == kFutexWaitvMax) break;  // never so (kRingsPerThread); the timeout looks at the rest
    w[n++] = FutexWaitv{r->quiet(), reinterpret_cast<uintptr_t>(r->doorbell()), kFutex2SizeU32, 0};
  }
  timespec until{};
  clock_gettime(CLOCK_MONOTONIC, &until);
  const double wait_s = std::max(1e-3, options_.idle_wait_s);
  const auto whole = time_t(wait_s);
  until.tv_sec += whole;
  until.tv_nsec += long((wait_s - double(whole)) * 1e9);
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec += 1;
    until.tv_nsec -= 1000000000L;
  }
  const long rc = syscall(kSysFutexWaitv, w, n, 0, &until, CLOCK_MONOTONIC);
  if (rc >= 0 || errno == EAGAIN || errno == EINTR) return true;
  if (errno == ETIMEDOUT) return false;
  // Not expected (the kernel was probed at start): a short nap instead of a busy loop.
  FutexWait(&poke_, poked, 1e-3);
  return false;
}

// Why no wake is lost between a serving thread and its waker: Offer adds to count_ (under mu_),
// then reads asleep_; the waker stores asleep_ = 1, then reads count_, and sleeps only if it is
// 0, on bell_ with the value it read before it took the last batch. Both pairs are seq_cst, so
// either the waker sees the new wake waiting and does not sleep, or Offer sees asleep_ and
// rings bell_, which the waker's FUTEX_WAIT then finds moved (EAGAIN) or is woken by. Stop sets
// stopping_ under mu_ and rings; the waker ends only when, under mu_, it finds stopping_ with
// nothing pending, and Offer refuses under mu_ once stopping_ is set: no wake handed over is
// left unmade.
void RingManager::Waker::Run() {
  std::vector<Pending> batch;
  const auto spin = std::chrono::nanoseconds(int64_t(options_.spin_us * 1e3));
  while (true) {
    const uint32_t bell = Word(bell_).load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(pending_);
      count_.store(0);
      if (batch.empty() && stopping_) break;
    }
    if (!batch.empty()) {
      for (const Pending& p : batch)
        if (p.ring->touchable()) FutexWake(p.word);
      woken_.fetch_add(int64_t(batch.size()));
      batch.clear();  // the rings may be let go now (their mappings with the last of them)
      continue;
    }
    // As an idle serving thread: a spin (the next wake comes within microseconds while the
    // serving threads are busy), within the spinners' bound, then a sleep.
    bool more = false;
    if (spin.count() > 0 && spinners_->fetch_add(1) < max_spinners_) {
      const auto until = Clock::now() + spin;
      while (!more && Clock::now() < until) {
        for (int k = 0; k < 32; ++k) CpuRelax();
        more = count_.load() > 0 || Word(bell_).load() != bell;
      }
    }
    if (spin.count() > 0) spinners_->fetch_sub(1);
    if (more) continue;
    asleep_.store(true);
    if (count_.load() == 0 && Word(bell_).load() == bell) {
      timespec ts{0, 100'000'000};
      syscall(SYS_futex, &bell_, FUTEX_WAIT_PRIVATE, bell, &ts, nullptr, 0);
    }
    asleep_.store(false);
  }
}

void RingManager::Ring::Serve() {
  const auto spin = std::chrono::nanoseconds(int64_t(options_.spin_us * 1e3));
  while (!stop_.load()) {
    const uint32_t rung = Word(header_->doorbell).load();
    bool any = false;
    while (Sweep(true)) any = true;  // every submitted slot, as a pool thread takes them
    if (any || stop_.load()) continue;
    // Nothing to do: spin a little (the next request of a client in a loop comes within
    // microseconds), then sleep until the doorbell rings. Never more rings spin at once than
    // half the cores: past that, spinning takes the cores from the threads with work.
    bool rang = false;
    if (spin.count() > 0 && spinners_->fetch_add(1) < max_spinners_) {
      const auto until = Clock::now() + spin;
      while (!rang && Clock::now() < until && !stop_.load()) {
        for (int k = 0; k < 32; ++k) CpuRelax();
        rang = Word(header_->doorbell).load() != rung;
      }
      spinners_->fetch_sub(1);
    } else if (spin.count() > 0) {
      spinners_->fetch_sub(1);
    }
    if (rang || stop_.load()) continue;
    Word(header_->sleeping).store(1);
    if (Word(header_->doorbell).load() == rung && !stop_.load())
      FutexWait(&header_->doorbell, rung, options_.idle_wait_s);
    Word(header_->sleeping).store(0);
  }
  Closing();
  ended_.store(true);
}

void RingManager::Ring::Closing() {
  const uint32_t why = why_.load();
  spdlog::info("ring {} ({} slots) closed ({}) after {} requests", id_, slots_,
               why == kClosedByClient     ? "by its client"
               : why == kClosedRegionGone ? "its region is gone"
               : why == kClosedShutdown   ? "the server is shutting down"
                                          : "its region no longer spans it",
               served_);
  if (!touch_.load()) return;
  // Requests not taken are answered; every waiting client is woken.
  for (int i = 0; i < slots_; ++i) {
    RingSlot& s = slot_[i];
    uint32_t submitted = kSlotSubmitted;
    if (Word(s.state).compare_exchange_strong(submitted, kSlotTaken)) {
      RingAnswer ans{};
      const absl::Status st =
          why == kClosedShutdown ? absl::UnavailableError("the server is shutting down")
                                 : absl::CancelledError("the ring was closed before the request was taken");
      ans.code = int32_t(st.code());
      ans.message_bytes = uint32_t(std::min<size_t>(st.message().size(), kRingMessageBytes - 1));
      SetText(ans.message, kRingMessageBytes, st.message());
      ans.tag = s.request.tag;
      std::memcpy(&s.answer, &ans, sizeof ans);
      Word(s.state).store(kSlotDone);
    }
  }
  Word(header_->closed).store(why);
  for (int i = 0; i < slots_; ++i) FutexWake(&slot_[i].state);
  FutexWake(&header_->doorbell);
}

void RingManager::Ring::Answer(RingSlot& slot) {
  uint32_t submitted = kSlotSubmitted;
  if (!Word(slot.state).compare_exchange_strong(submitted, kSlotTaken)) return;
  // The request is copied out once: the client may write to the slot at any time, and every
  // check and the solve see this copy.
  RingRequest req;
  std::memcpy(&req, &slot.request, sizeof req);
  ++served_;
  Call call(RequestIdOf(req, id_), RpcOf(req));
  call.identity = identity_;
  call.sample.rpc = call.rpc;
  call.sample.transport = "ring";
  call.sample.family = call.sample.method = "-";
  call.cancelled = [this] { return stop_.load() && why_.load() != kClosedShutdown; };
  RingAnswer ans{};
  ans.tag = req.tag;
  absl::Status st;
  if (core_->shutting_down()) {
    st = absl::UnavailableError("the server is shutting down");
  } else {
    auto deadline = std::chrono::system_clock::time_point::max();
    if (req.deadline_unix_ns > 0)
      deadline = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::nanoseconds(req.deadline_unix_ns)));
    call.deadline = core_->EffectiveDeadline(deadline);
    if (std::chrono::system_clock::now() >= call.deadline)
      st = absl::DeadlineExceededError("the deadline passed before the request was taken");
    else
      st = Run(call, req, &ans);
  }
  st = core_->Finish(call, st);
  if (!st.ok()) {
    const RingAnswer blank{};
    const uint64_t tag = ans.tag;
    ans = blank;
    ans.tag = tag;
  }
  ans.code = int32_t(st.code());
  ans.message_bytes = uint32_t(std::min<size_t>(st.message().size(), kRingMessageBytes - 1));
  SetText(ans.message, kRingMessageBytes, st.message());
  ans.total_us = Micros(Clock::now() - call.start);
  if (!touch_.load()) return;
  std::memcpy(&slot.answer, &ans, sizeof ans);
  // Before DONE, so the client reads this answer's: the queue its next request joins.
  Word(header_->queued).store(pool_ != nullptr ? uint32_t(pool_->queued()) : 1u);
  Word(slot.state).store(kSlotDone);
  if (Word(slot.waiting).load() == 0) return;
  // A thread with more requests to answer (the last pass answered more than this one) hands
  // the wake to its waker and goes on to them.
  if (pool_ != nullptr && pool_->waker() != nullptr &&
      pool_->waker()->Offer(shared_from_this(), &slot.state, pool_->queued() > 1))
    return;
  FutexWake(&slot.state);
}

absl::Status RingManager::Ring::Run(Call& call, const RingRequest& req, RingAnswer* ans) {
  if (req.op == kOpSolve) return RunSolve(call, req, ans);
  if (req.op == kOpSolveSystem) return RunSolveSystem(call, req, ans);
  return Invalid("op", absl::StrCat("unknown operation ", req.op,
                                    " (1: solve a job, 2: solve a system by handle)"));
}

absl::Status RingManager::Ring::CheckRange(absl::string_view field, int64_t offset,
                                           int64_t bytes) const {
  const int64_t size = region_->bytes();
  if (offset < 0 || bytes < 0 || offset > size || bytes > size - offset)
    return Invalid(field, absl::StrCat("[", offset, ", ", offset, " + ", bytes,
                                       ") lies outside region '", region_->name(), "' of ", size,
                                       " bytes"));
  const int64_t lo = offset_, hi = offset_ + RingBytes(slots_);
  if (bytes > 0 && offset < hi && lo < offset + bytes)
    return Invalid(field, absl::StrCat("[", offset, ", ", offset + bytes,
                                       ") overlaps the ring's header and slots [", lo, ", ", hi,
                                       ")"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RingManager::Ring::OtherRegion(const RingRequest& req,
                                                           absl::string_view field,
                                                           uint32_t k) const {
  if (k == 0) return std::string();
  if (k > uint32_t(kRingMaxRegions))
    return Invalid(field, absl::StrCat(k, ", expected 0 (the ring's region) .. ",
                                       kRingMaxRegions, " (regions[", kRingMaxRegions - 1, "])"));
  const std::string at = absl::StrCat("regions[", k - 1, "]");
  auto name = Text(at, req.regions[k - 1], sizeof req.regions[k - 1]);
  if (!name.ok()) return name.status();
  if (name->empty()) return Invalid(at, absl::StrCat("is empty, and ", field, " names it"));
  // The ring's own bytes are reached only as region 0, where CheckRange keeps x and the arrays
  // off its header and slots.
  if (*name == region_->name())
    return Invalid(at, "names the ring's own region: give its arrays as region 0");
  return name;
}

template <typename Req>
absl::Status RingManager::Ring::FillFamily(const RingRequest& req, Req* msg) {
  constexpr bool kBlock = std::is_same_v<Req, v1::BlockTridiagonalRequest>;
  constexpr bool kDense = std::is_same_v<Req, v1::DenseRequest>;
  const uint32_t known = kFlagSkipResidual | kFlagScaleRows | kFlagMaxIterations | kFlagTol;
  if ((req.flags & ~known) != 0)
    return Invalid("flags", absl::StrFormat("unknown bits 0x%x", req.flags & ~known));
  if (req.dtype != v1::FLOAT64 && req.dtype != v1::FLOAT32)
    return Invalid("dtype", absl::StrCat("must be 1 (FLOAT64) or 2 (FLOAT32), got ", req.dtype));
  msg->set_dtype(static_cast<v1::DType>(req.dtype));
  auto method = Text("method", req.method, sizeof req.method);
  if (!method.ok()) return method.status();
  msg->set_method(*method);
  if constexpr (kBlock || kDense) {
    if (req.layout != 0)
      return Invalid("layout", absl::StrCat("a ", kBlock ? "block-tridiagonal" : "dense",
                                            " request has no layout (0), got ", req.layout));
  } else {
    if (req.layout != v1::FLAT && req.layout != v1::INTERLEAVED)
      return Invalid("layout", absl::StrCat("unknown layout ", req.layout));
    msg->set_layout(static_cast<v1::Layout>(req.layout));
  }
  if constexpr (kBlock) {
    if (req.flags & kFlagSkipResidual)
      return Invalid("flags", "skip_residual: a block-tridiagonal request does not take it");
    msg->set_scale_rows((req.flags & kFlagScaleRows) != 0);
    if (req.flags & kFlagMaxIterations) msg->set_max_iterations(req.max_iterations);
    if (req.flags & kFlagTol) msg->set_tol(req.tol);
  } else {
    if (req.flags & (kFlagScaleRows | kFlagMaxIterations | kFlagTol))
      return Invalid("flags", "scale_rows, max_iterations and tol: block-tridiagonal requests only");
    msg->set_skip_residual((req.flags & kFlagSkipResidual) != 0);
  }
  if (req.narrays < 0 || req.narrays > kRingMaxArrays)
    return Invalid("narrays", absl::StrCat(req.narrays, ", expected 0 .. ", kRingMaxArrays));
  const google::protobuf::Descriptor* d = msg->GetDescriptor();
  const google::protobuf::Reflection* r = msg->GetReflection();
  // Before its arrays are read (a flag; an fstat where the region is unguarded), and again once
  // the work is done (RunSolve).
  if (auto st = region_->StillMapped("region"); !st.ok()) return st;
  // Nothing is copied for a job over the limit (refused as CheckLimits words it).
  int64_t total = 0;
  for (int i = 0; i < req.narrays; ++i) total += std::max<int64_t>(0, req.arrays[i].bytes);
  if (total > core_->options().limits.max_job_bytes)
    return absl::ResourceExhaustedError(
        absl::StrCat("the job has ", total, " bytes of arrays, over the limit max_job_bytes = ",
                     core_->options().limits.max_job_bytes));
  for (int i = 0; i < req.narrays; ++i) {
    const RingArray& a = req.arrays[i];
    const std::string at = absl::StrCat("arrays[", i, "]");
    auto name = Text(absl::StrCat(at, ".name"), a.name, sizeof a.name);
    if (!name.ok()) return name.status();
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(*name);
    if (f == nullptr || f->message_type() != v1::Array::descriptor())
      return Invalid(absl::StrCat(at, ".name"),
                     absl::StrCat("'", Sanitized(*name), "' is not an array of a ", d->name()));
    if (r->HasField(*msg, f))
      return Invalid(absl::StrCat(at, ".name"), absl::StrCat("'", *name, "' given twice"));
    if (a.rank < 1 || a.rank > kRingMaxRank)
      return Invalid(absl::StrCat(*name, ".rank"),
                     absl::StrCat(a.rank, ", expected 1 .. ", kRingMaxRank));
    auto where = OtherRegion(req, absl::StrCat(*name, ".region"), a.region);
    if (!where.ok()) return where.status();
    auto* arr = static_cast<v1::Array*>(r->MutableMessage(msg, f));
    for (int k = 0; k < a.rank; ++k) arr->add_shape(a.shape[k]);
    if (!where->empty()) {
      // Read in place, as an RPC's RegionRef: the job resolves it as this identity's (another's
      // region is NOT_FOUND) and checks its range and alignment.
      v1::RegionRef* ref = arr->mutable_region();
      ref->set_region(*where);
      ref->set_offset(a.offset);
      ref->set_bytes(a.bytes);
      continue;
    }
    if (auto st = CheckRange(*name, a.offset, a.bytes); !st.ok()) return st;
    // The one copy out of shared memory: what is checked is what is solved.
    arr->set_data(reinterpret_cast<const char*>(region_->base() + a.offset), size_t(a.bytes));
  }
  // x's size is given (never "the shape's", which would let it reach into the ring's slots).
  if (req.x_bytes <= 0) return Invalid("x_bytes", absl::StrCat(req.x_bytes, ": give x's size"));
  auto x_where = OtherRegion(req, "x_region", req.x_region);
  if (!x_where.ok()) return x_where.status();
  if (x_where->empty())
    if (auto st = CheckRange("x_offset", req.x_offset, req.x_bytes); !st.ok()) return st;
  v1::RegionRef* x = msg->mutable_x_region();
  x->set_region(x_where->empty() ? region_->name() : *x_where);
  x->set_offset(req.x_offset);
  x->set_bytes(req.x_bytes);
  return absl::OkStatus();
}

absl::Status RingManager::Ring::RunSolve(Call& call, const RingRequest& req, RingAnswer* ans) {
  RequestRegions regions = core_->Regions(identity_);
  const DeclareOptions opts{.regions = &regions, .defer_finite = true};
  const JobLimits& limits = core_->options().limits;
  absl::StatusOr<Job> job;
  // The messages outlive the job, which borrows their bytes.
  v1::TridiagonalRequest tri;
  v1::TreeRequest tree;
  v1::BlockTridiagonalRequest block;
  v1::DenseRequest dense;
  absl::Status st;
  switch (req.family) {
    case kFamilyTridiagonal:
      if (st = FillFamily(req, &tri); st.ok()) job = JobFromRequest(tri, limits, opts);
      break;
    case kFamilyTree:
      if (st = FillFamily(req, &tree); st.ok()) job = JobFromRequest(tree, limits, opts);
      break;
    case kFamilyBlockTridiagonal:
      if (st = FillFamily(req, &block); st.ok()) job = JobFromRequest(block, limits, opts);
      break;
    case kFamilyDense:
      if (st = FillFamily(req, &dense); st.ok()) job = JobFromRequest(dense, limits, opts);
      break;
    default:
      return Invalid("family", absl::StrCat("unknown family ", req.family,
                                            " (0 tridiagonal, 1 tree, 2 block-tridiagonal, 3 dense)"));
  }
  // The labels the RPC's would carry: the family, and the method asked for ("invalid" when it
  // is none).
  static constexpr Family kFamilies[] = {Family::kTridiagonal, Family::kTree,
                                         Family::kBlockTridiagonal, Family::kDense};
  call.sample.family = std::string(FamilyName(kFamilies[req.family]));
  call.sample.method =
      MethodLabel(kFamilies[req.family], std::string(req.method, strnlen(req.method, sizeof req.method)));
  if (!st.ok()) return st;
  call.receive_us = Micros(Clock::now() - call.start);
  if (!job.ok()) return job.status();
  if (job->history_limit > 0)
    return Invalid("flags", "a residual history does not travel through a ring: use the RPC");
  if (auto range = CheckRange("status_offset", req.status_offset, req.status_bytes); !range.ok())
    return range;
  const int64_t statuses = std::max<int64_t>(1, job->batch);
  if (statuses > req.status_bytes)
    return Invalid("status_bytes", absl::StrCat(req.status_bytes, " bytes of room, the answer has ",
                                                statuses, " statuses"));
  auto answer = core_->Solve(call, *job);
  if (!answer.ok()) return answer.status();
  if (auto used = regions.AfterUse(); !used.ok()) return used;
  Fill(*answer, ans);
  if (auto written = WriteStatuses(req, answer->result.status, ans); !written.ok())
    return written;
  return region_->StillMapped("status_offset");
}

absl::Status RingManager::Ring::RunSolveSystem(Call& call, const RingRequest& req,
                                               RingAnswer* ans) {
  auto handle = Text("handle", req.handle, sizeof req.handle);
  if (!handle.ok()) return handle.status();
  if ((req.flags & ~uint32_t(kFlagSkipResidual)) != 0)
    return Invalid("flags", "a solve by handle takes skip_residual only");
  if (req.narrays != 1)
    return Invalid("narrays", absl::StrCat(req.narrays, ": a solve by handle takes one array, rhs"));
  const RingArray& a = req.arrays[0];
  auto name = Text("arrays[0].name", a.name, sizeof a.name);
  if (!name.ok()) return name.status();
  if (*name != "rhs")
    return Invalid("arrays[0].name", absl::StrCat("'", Sanitized(*name), "', expected 'rhs'"));
  if (a.rank < 1 || a.rank > kRingMaxRank)
    return Invalid("rhs.rank", absl::StrCat(a.rank, ", expected 1 .. ", kRingMaxRank));
  auto rhs_where = OtherRegion(req, "rhs.region", a.region);
  if (!rhs_where.ok()) return rhs_where.status();
  if (rhs_where->empty())
    if (auto st = CheckRange("rhs", a.offset, a.bytes); !st.ok()) return st;
  if (a.bytes > core_->options().limits.max_job_bytes)
    return absl::ResourceExhaustedError(absl::StrCat("rhs: ", a.bytes, " bytes exceed the server's limit of ",
                                                     core_->options().limits.max_job_bytes));
  if (req.x_bytes <= 0) return Invalid("x_bytes", absl::StrCat(req.x_bytes, ": give x's size"));
  auto x_where = OtherRegion(req, "x_region", req.x_region);
  if (!x_where.ok()) return x_where.status();
  if (x_where->empty())
    if (auto st = CheckRange("x_offset", req.x_offset, req.x_bytes); !st.ok()) return st;
  if (auto st = CheckRange("status_offset", req.status_offset, req.status_bytes); !st.ok())
    return st;
  if (auto st = region_->StillMapped("rhs"); !st.ok()) return st;
  StepRequest step;
  step.handle = *handle;
  step.skip_residual = (req.flags & kFlagSkipResidual) != 0;
  step.rhs.shape.assign(a.shape, a.shape + a.rank);
  std::unique_ptr<uint64_t[]> copy;
  if (!rhs_where->empty()) {
    // Read in place, as SolveSystem's RegionRef (resolved as this identity's region).
    step.rhs.in_region = true;
    step.rhs.region = RegionRef{*rhs_where, a.offset, a.bytes};
  } else {
    // The one copy out of the ring's region, aligned for any element type.
    copy.reset(new uint64_t[size_t(a.bytes + 7) / 8]);
    std::memcpy(copy.get(), region_->base() + a.offset, size_t(a.bytes));
    step.rhs.data = copy.get();
    step.rhs.bytes = a.bytes;
  }
  step.has_x_region = true;
  step.x_region =
      RegionRef{x_where->empty() ? region_->name() : *x_where, req.x_offset, req.x_bytes};
  call.receive_us = Micros(Clock::now() - call.start);
  auto answer = core_->SolveSystem(call, step);
  if (!answer.ok()) return answer.status();
  if (auto st = region_->StillMapped("rhs"); !st.ok()) return st;  // the copy out of it
  Fill(*answer, ans);
  if (auto st = WriteStatuses(req, answer->result.status, ans); !st.ok()) return st;
  return region_->StillMapped("status_offset");
}

absl::Status RingManager::Ring::WriteStatuses(const RingRequest& req,
                                              const std::vector<SystemStatus>& status,
                                              RingAnswer* ans) {
  if (int64_t(status.size()) > req.status_bytes)
    return Invalid("status_bytes", absl::StrCat(req.status_bytes, " bytes of room, the answer has ",
                                                status.size(), " statuses"));
  std::byte* out = region_->base() + req.status_offset;
  for (size_t i = 0; i < status.size(); ++i) out[i] = std::byte(uint8_t(status[i]));
  ans->statuses = int64_t(status.size());
  return absl::OkStatus();
}

void RingManager::Ring::Fill(const server::Answer& a, RingAnswer* ans) const {
  ans->dtype = a.precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32;
  ans->x_rank = int32_t(std::min<size_t>(a.x_shape.size(), kRingMaxRank));
  for (int k = 0; k < ans->x_rank; ++k) ans->x_shape[k] = a.x_shape[size_t(k)];
  const AnswerSummary& s = a.summary;
  ans->systems = s.systems;
  ans->ok = s.outcomes[0];
  ans->singular = s.outcomes[1];
  ans->not_converged = s.outcomes[2];
  ans->diverged = s.outcomes[3];
  ans->iterations = s.iterations;
  ans->residual = s.residual;
  ans->receive_us = s.receive_us;
  ans->queue_us = s.queue_us;
  ans->h2d_us = s.h2d_us;
  ans->compute_us = s.compute_us;
  ans->d2h_us = s.d2h_us;
  ans->residual_us = s.residual_us;
  ans->batched_with = s.batched_with;
  ans->batch_systems = s.batch_systems;
  ans->right_hand_sides = s.right_hand_sides;
  SetText(ans->method, sizeof ans->method, s.method);
  SetText(ans->backend, sizeof ans->backend, s.backend);
}

// ---- the manager -------------------------------------------------------------------------

namespace {
// The cores this process may run on (its affinity mask: a taskset or a container's cpuset), not
// the host's.
int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, int(std::thread::hardware_concurrency()));
}
}  // namespace

int DefaultRingThreads() { return std::max(1, UsableCores() / 2); }

RingManager::RingManager(Core* core, RingOptions options)
    : core_(core),
      options_(options),
      max_spinners_(std::max(1, UsableCores() / 2)),
      pooled_(options_.threads > 0 && HaveFutexWaitv()),
      watcher_([this] { Watch(); }) {
  if (!options_.enabled) return;
  if (pooled_) {
    const int wakers =
        std::min(options_.threads, options_.wakers < 0 ? options_.threads / 4 : options_.wakers);
    for (int i = 0; i < wakers; ++i) {
      wakers_.push_back(std::make_unique<Waker>(options_, &spinners_, max_spinners_, i));
      wakers_.back()->Start();
    }
  }
  if (pooled_)
    spdlog::info(
        "rings served by up to {} threads ({} rings a thread at most; more threads past "
        "that), {} waker threads",
        options_.threads, kRingsPerThread, wakers_.size());
  else if (options_.threads > 0)
    spdlog::warn("futex_waitv is missing (Linux < 5.16, or refused): each request ring gets a "
                 "serving thread of its own");
  else
    spdlog::info("rings served by a thread each (--ring-threads 0)");
}

RingManager::~RingManager() { Shutdown(); }

absl::StatusOr<RingView> RingManager::Open(Call& call, const std::string& region_name,
                                           int64_t offset, int slots) {
  if (!options_.enabled)
    return absl::FailedPreconditionError("this server does not serve request rings (--rings off)");
  if (!core_->options().memory.enabled)
    return absl::FailedPreconditionError(
        "this server does not accept shared memory (--no-shared-memory), where rings live");
  if (slots < 1 || slots > 64) return Invalid("slots", absl::StrCat(slots, ", expected 1 .. 64"));
  if (offset < 0 || offset % kRingAlign != 0)
    return Invalid("offset", absl::StrCat(offset, " is not a non-negative multiple of ", kRingAlign));
  auto region = core_->FindRegion(call, region_name);
  if (!region.ok()) return region.status();
  if ((*region)->server_owned())
    return absl::FailedPreconditionError(
        "region: a ring lives in shared memory the client maps (RegisterSharedMemory), not in "
        "the server's own");
  if (offset > (*region)->bytes() || RingBytes(slots) > (*region)->bytes() - offset)
    return Invalid("offset", absl::StrCat("a ring of ", slots, " slots (", RingBytes(slots),
                                          " bytes) at ", offset, " does not fit region '",
                                          (*region)->name(), "' of ", (*region)->bytes(), " bytes"));
  if (auto st = (*region)->ObjectSpans("region"); !st.ok()) return st;
  const auto* h = reinterpret_cast<const RingHeader*>((*region)->base() + offset);
  RingHeader seen;
  std::memcpy(&seen, h, sizeof seen);
  if (seen.magic != kRingMagic)
    return Invalid("offset", absl::StrFormat("no ring header at %d (magic 0x%016x)", offset,
                                             seen.magic));
  if (seen.version != kRingVersion || seen.slot_bytes != sizeof(RingSlot) ||
      seen.header_bytes != sizeof(RingHeader))
    return absl::FailedPreconditionError(absl::StrCat(
        "version: the ring's header is version ", seen.version, " (", seen.header_bytes,
        "-byte header, ", seen.slot_bytes, "-byte slots), this server speaks version ",
        kRingVersion, " (", sizeof(RingHeader), ", ", sizeof(RingSlot), ")"));
  if (seen.slots != uint32_t(slots))
    return Invalid("slots", absl::StrCat(slots, ", the ring's header says ", seen.slots));
  std::shared_ptr<Ring> ring;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || core_->shutting_down())
      return absl::UnavailableError("the server is shutting down");
    if (int(rings_.size()) >= options_.max_rings)
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server serves ", options_.max_rings, " rings already (--max-rings)"));
    int mine = 0;
    for (const auto& [id, r] : rings_) mine += r->identity() == call.identity && !r->ended();
    if (mine >= options_.max_rings_per_identity)
      return absl::ResourceExhaustedError(absl::StrCat(
          "this caller has ", mine, " rings open, the most one identity may (--max-rings-per-identity)"));
    std::random_device rd;
    const std::string id =
        absl::StrFormat("ring-%d-%08x%08x", next_ring_.fetch_add(1), rd(), rd());
    // The least loaded thread takes it; a new thread while there are fewer than
    // options_.threads and every one has a ring, or while every one is full.
    Pool* pool = nullptr;
    if (pooled_) {
      for (auto& p : pools_)
        if (p->load() < kRingsPerThread && (pool == nullptr || p->load() < pool->load()))
          pool = p.get();
      if (pool == nullptr || (pool->load() > 0 && int(pools_.size()) < options_.threads)) {
        Waker* waker = wakers_.empty() ? nullptr : wakers_[pools_.size() % wakers_.size()].get();
        pools_.push_back(
            std::make_unique<Pool>(options_, &spinners_, max_spinners_, int(pools_.size()), waker));
        pool = pools_.back().get();
        pool->Start();
      }
    }
    ring = std::make_shared<Ring>(core_, options_, &spinners_, max_spinners_, id, call.identity,
                                  *std::move(region), offset, slots, pool);
    rings_.emplace(id, ring);
    ring->Start();
    if (pool != nullptr) pool->Add(ring);
  }
  if (ring->pool() != nullptr)
    spdlog::info("ring {} opened: {} slots at {} of region {}, on ring thread {}", ring->id(),
                 slots, offset, ring->region().name(), ring->pool()->index());
  else
    spdlog::info("ring {} opened: {} slots at {} of region {}", ring->id(), slots, offset,
                 ring->region().name());
  return RingView{ring->id(), slots, ring->bytes(), options_.spin_us};
}

absl::StatusOr<RingView> RingManager::Close(Call& call, const std::string& id) {
  std::shared_ptr<Ring> ring;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rings_.find(id);
    if (it == rings_.end() || it->second->identity() != call.identity || it->second->stopped())
      return absl::NotFoundError(absl::StrCat("ring: no ring '", Sanitized(id),
                                              "' of this caller (never opened, or closed)"));
    ring = it->second;
    rings_.erase(it);
  }
  ring->Stop(kClosedByClient);
  ring->Join();
  return RingView{ring->id(), ring->slots(), ring->bytes(), options_.spin_us};
}

void RingManager::Shutdown() {
  std::map<std::string, std::shared_ptr<Ring>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    all.swap(rings_);
    cv_.notify_all();
  }
  for (auto& [id, r] : all) r->Stop(kClosedShutdown);
  for (auto& [id, r] : all) r->Join();
  if (watcher_.joinable()) watcher_.join();
  // Rings closed by their clients meanwhile are closed by their threads before these end.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : pools_) p->Quit();
  for (auto& p : pools_) p->Join();
  // No serving thread is left to hand a wake over; what was handed over is made first.
  for (auto& w : wakers_)
    if (w->Stop()) spdlog::info("ring waker {} made {} wakes", w->index(), w->woken());
}

int64_t RingManager::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(rings_.size());
}

int RingManager::serving_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int(pools_.size());
}

void RingManager::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto interval = std::chrono::microseconds(int64_t(options_.watch_interval_s * 1e6));
  while (!stopping_) {
    cv_.wait_for(lock, interval, [&] { return stopping_; });
    if (stopping_) break;
    std::vector<std::shared_ptr<Ring>> done;
    for (auto it = rings_.begin(); it != rings_.end();) {
      Ring& r = *it->second;
      if (r.ended()) {
        done.push_back(std::move(it->second));
        it = rings_.erase(it);
        continue;
      }
      if (!r.region().ObjectSpans("region").ok()) {
        r.Stop(kClosedBroken, /*touch=*/false);
      } else if (!core_->HoldsRegion(r.identity(), r.region().name(), &r.region())) {
        r.Stop(kClosedRegionGone);
      } else {
        r.Beat();
      }
      ++it;
    }
    lock.unlock();
    for (auto& r : done) r->Join();  // the mapping goes with the last reference
    done.clear();
    lock.lock();
  }
}

}  // namespace trisolve::server
