// The server's admission control (server/admission.h) on its own: slots, the queue limit, the
// deadline and cancellation of a queued caller, and shutdown.
#include "admission.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "gtest/gtest.h"

namespace trisolve::server {
namespace {

using Clock = std::chrono::system_clock;
using std::chrono::milliseconds;

TEST(Admission, SlotsQueueAndRefuseBeyondTheLimit) {
  Admission a(1, 1);
  Admission::Slot held;
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &held).ok());
  EXPECT_EQ(a.running(), 1);
  // One caller may wait; it gets the slot when the first is released.
  Admission::Slot second;
  auto waiting = std::async(std::launch::async, [&] {
    return a.Acquire(Clock::now() + milliseconds(5000), nullptr, &second);
  });
  while (a.queued() < 1) std::this_thread::sleep_for(milliseconds(1));
  Admission::Slot third;
  const absl::Status full = a.Acquire(Clock::now() + milliseconds(5000), nullptr, &third);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("max_queued_jobs = 1"), absl::string_view::npos) << full;
  held.Release();
  EXPECT_TRUE(waiting.get().ok());
  EXPECT_EQ(a.running(), 1);
  EXPECT_EQ(a.queued(), 0);
  second.Release();
  EXPECT_EQ(a.running(), 0);
  EXPECT_EQ(a.done(), 2);
}

TEST(Admission, AQueuedCallerCancelledEarlyIsCancelled) {
  Admission a(1, 4);
  Admission::Slot held;
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &held).ok());
  std::atomic<bool> cancel{false};
  Admission::Slot slot;
  auto waiting = std::async(std::launch::async, [&] {
    return a.Acquire(Clock::now() + milliseconds(5000), [&] { return cancel.load(); }, &slot);
  });
  while (a.queued() < 1) std::this_thread::sleep_for(milliseconds(1));  // queued, then cancelled
  cancel = true;
  const absl::Status st = waiting.get();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_EQ(a.queued(), 0);
}

TEST(Admission, AQueuedCallerPastItsDeadlineIsDeadlineExceeded) {
  Admission a(1, 4);
  Admission::Slot held;
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &held).ok());
  Admission::Slot slot;
  const absl::Status st = a.Acquire(Clock::now() + milliseconds(80), nullptr, &slot);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("while the job was queued"), absl::string_view::npos) << st;
  // Already past: refused before queueing.
  const absl::Status late = a.Acquire(Clock::now() - milliseconds(1), nullptr, &slot);
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
}

// gRPC cancels a call when its deadline passes, by its own timer, which can fire a little before
// the system clock reaches the deadline the server was given: that cancellation is the
// deadline's (the flake this mends: Service.ExpiredDeadlinesAndQueueLimits saw CANCELLED).
TEST(Admission, ACancellationAtTheDeadlineIsTheDeadlines) {
  Admission a(1, 4);
  Admission::Slot held;
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &held).ok());
  // The waiter looks every 50 ms: with the deadline 110 ms on, its look at ~100 ms falls where
  // the call is already cancelled (from 15 ms before the deadline, as gRPC's timer may) and the
  // deadline has not yet passed by the system clock -- what was reported CANCELLED before.
  const auto deadline = Clock::now() + milliseconds(110);
  auto cancelled = [deadline] { return Clock::now() + milliseconds(15) >= deadline; };
  Admission::Slot slot;
  const absl::Status st = a.Acquire(deadline, cancelled, &slot);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_LT(Admission::kDeadlineSkew, milliseconds(100));  // a real cancellation stays one
}

TEST(Admission, ShutdownRefusesNewAndQueuedCallers) {
  Admission a(1, 4);
  Admission::Slot held;
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &held).ok());
  Admission::Slot slot;
  auto waiting = std::async(std::launch::async, [&] {
    return a.Acquire(Clock::now() + milliseconds(5000), nullptr, &slot);
  });
  while (a.queued() < 1) std::this_thread::sleep_for(milliseconds(1));
  a.Shutdown();
  EXPECT_EQ(waiting.get().code(), absl::StatusCode::kUnavailable);
  Admission::Slot late;
  EXPECT_EQ(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &late).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(a.shutting_down());
  held.Release();
  EXPECT_TRUE(a.WaitIdle(Clock::now() + milliseconds(1000)));
}

}  // namespace
}  // namespace trisolve::server
