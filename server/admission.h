// Admission control: at most `max_concurrent` jobs run, at most `max_queued` wait; a caller
// waits for a slot until its deadline, its cancellation, or shutdown.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

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

 private:
  void ReleaseOne();
  const int max_concurrent_;
  const int max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t running_ = 0;
  int64_t queued_ = 0;
  int64_t done_ = 0;
  bool shutdown_ = false;
};

}  // namespace trisolve::server
