// Admission control: at most `max_concurrent` jobs run, at most `max_queued` wait; a caller
// waits for a slot until its deadline, its cancellation, or shutdown. Waiters are served in
// arrival order: a released slot passes straight to the oldest waiter, and only that waiter is
// woken (a broadcast woke every queued caller to race for one slot, in no order).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"

namespace trisolve::server {

class Admission {
 public:
  Admission(int max_concurrent, int max_queued)
      : max_concurrent_(max_concurrent), max_queued_(max_queued) {}

  // Holds a slot until destroyed.
  class Slot {
   public:
    Slot() = default;
    explicit Slot(Admission* a) : a_(a) {}
    Slot(Slot&& o) noexcept : a_(o.a_) { o.a_ = nullptr; }
    Slot& operator=(Slot&& o) noexcept {
      Release();
      a_ = o.a_;
      o.a_ = nullptr;
      return *this;
    }
    ~Slot() { Release(); }
    void Release();

   private:
    Admission* a_ = nullptr;
  };

  // gRPC cancels a call when its deadline passes, by its own timer: a cancellation seen this
  // close to the deadline is the deadline's (DEADLINE_EXCEEDED), not the caller's. Without it a
  // queued call whose deadline passed was reported CANCELLED now and then (CI, 2026-11-23).
  static constexpr std::chrono::milliseconds kDeadlineSkew{20};

  // OK with a slot; RESOURCE_EXHAUSTED when the queue is full, DEADLINE_EXCEEDED or
  // CANCELLED when the caller goes first, UNAVAILABLE when shutting down.
  absl::Status Acquire(std::chrono::system_clock::time_point deadline,
                       const std::function<bool()>& cancelled, Slot* slot);

  // New callers get UNAVAILABLE; queued ones are woken and refused; running jobs finish.
  void Shutdown();
  bool shutting_down() const;

  int64_t running() const;
  int64_t queued() const;
  int64_t done() const;
  int max_concurrent() const { return max_concurrent_; }
  int max_queued() const { return max_queued_; }
  // Blocks until no job runs or the deadline passes; true when idle.
  bool WaitIdle(std::chrono::system_clock::time_point deadline);
  // Blocks until a job ends after `done` had reached `seen` (true), or the deadline passes, the
  // caller goes or the server shuts down (false).
  bool AwaitDone(int64_t seen, std::chrono::system_clock::time_point deadline,
                 const std::function<bool()>& cancelled);

 private:
  // A queued caller; lives on its Acquire's stack, in waiters_ until granted or gone.
  struct Waiter {
    std::condition_variable cv;
    bool granted = false;  // the slot of a released job passed to it (running_ counts it)
  };
  void ReleaseOne();
  // Gives a slot that is being given up to the oldest waiter, or frees it. Holds mu_.
  void PassOnLocked();
  void NotifyIdleLocked();
  const int max_concurrent_;
  const int max_queued_;
  mutable std::mutex mu_;
  std::condition_variable idle_;  // WaitIdle
  std::condition_variable ended_;  // AwaitDone: a job ended
  std::list<Waiter*> waiters_;    // oldest first
  int64_t running_ = 0;
  int64_t done_ = 0;
  bool shutdown_ = false;
};

// Bytes held by streamed requests being received, and how many streams receive at once: a
// stream is admitted at its header against both (RESOURCE_EXHAUSTED naming the limit), so
// that streams trickling their chunks cannot hold memory past the budget.
class ReceiveBudget {
 public:
  ReceiveBudget(int64_t max_bytes, int max_streams)
      : max_bytes_(max_bytes), max_streams_(max_streams) {}

  // Holds a reservation until destroyed.
  class Hold {
   public:
    Hold() = default;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold();

   private:
    friend class ReceiveBudget;
    ReceiveBudget* b_ = nullptr;
    int64_t bytes_ = 0;
  };

  absl::Status Reserve(int64_t bytes, Hold* hold);
  int64_t bytes() const;
  int streams() const;

 private:
  void Release(int64_t bytes);
  const int64_t max_bytes_;
  const int max_streams_;
  mutable std::mutex mu_;
  int64_t bytes_ = 0;
  int streams_ = 0;
};

// Cancels calls whose deadline is the server's (--default-deadline, --max-deadline) rather than
// the client's, which gRPC enforces itself: a stream whose client goes silent is ended at it.
class DeadlineWatch {
 public:
  DeadlineWatch();
  ~DeadlineWatch();
  // Until the returned guard is destroyed, `cancel` runs once the deadline passes.
  class Guard {
   public:
    Guard(DeadlineWatch* w, uint64_t id) : w_(w), id_(id) {}
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard();

   private:
    DeadlineWatch* w_;
    uint64_t id_;
  };
  std::unique_ptr<Guard> Watch(std::chrono::system_clock::time_point deadline,
                               std::function<void()> cancel);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::pair<std::chrono::system_clock::time_point, std::function<void()>>>
      watched_;
  uint64_t next_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace trisolve::server
