// The server's admission control (server/admission.h) on its own: slots, the queue limit, the
// deadline and cancellation of a queued caller, shutdown, and the order waiters are served in.
#include "admission.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <random>
#include <vector>
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

// Waiters get slots in the order they came, one released slot to one waiter: the next in line
// gets it even when later callers are waiting too.
TEST(Admission, WaitersAreServedInArrivalOrder) {
  constexpr int kWaiters = 8;
  Admission a(2, kWaiters);
  Admission::Slot first, second;
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &first).ok());
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &second).ok());
  std::mutex mu;
  std::vector<int> order;  // who got a slot, in turn
  std::vector<Admission::Slot> slots(kWaiters);
  std::vector<std::future<absl::Status>> waiting;
  for (int i = 0; i < kWaiters; ++i) {
    waiting.push_back(std::async(std::launch::async, [&, i] {
      absl::Status st = a.Acquire(Clock::now() + milliseconds(20000), nullptr, &slots[size_t(i)]);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      return st;
    }));
    while (a.queued() < i + 1) std::this_thread::sleep_for(milliseconds(1));  // i queued, in turn
  }
  auto served = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return order.size();
  };
  // One slot released at a time: exactly one more waiter runs, the oldest.
  first.Release();
  while (served() < 1) std::this_thread::sleep_for(milliseconds(1));
  second.Release();
  for (int i = 0; i < kWaiters; ++i) {
    while (served() < size_t(i) + 2 && i + 2 <= kWaiters)
      std::this_thread::sleep_for(milliseconds(1));
    std::this_thread::sleep_for(milliseconds(5));  // time for a wrongly woken waiter to show
    EXPECT_EQ(a.running(), std::min(2, kWaiters - i));
    EXPECT_EQ(served(), size_t(std::min(kWaiters, i + 2)));
    slots[size_t(i)].Release();
  }
  for (auto& w : waiting) EXPECT_TRUE(w.get().ok());
  std::vector<int> want(kWaiters);
  for (int i = 0; i < kWaiters; ++i) want[size_t(i)] = i;
  EXPECT_EQ(order, want);
  EXPECT_EQ(a.running(), 0);
  EXPECT_EQ(a.queued(), 0);
  EXPECT_EQ(a.done(), kWaiters + 2);
  EXPECT_TRUE(a.WaitIdle(Clock::now() + milliseconds(1000)));
}

// A waiter that leaves (its deadline, its cancellation) leaves its place: the slot released after
// it goes to the one behind it, and a new caller does not pass the queue.
TEST(Admission, AWaiterThatLeavesGivesItsPlaceToTheNext) {
  Admission a(1, 4);
  Admission::Slot held;
  ASSERT_TRUE(a.Acquire(Clock::now() + milliseconds(5000), nullptr, &held).ok());
  std::atomic<bool> cancel{false};
  Admission::Slot gone, next;
  auto leaving = std::async(std::launch::async, [&] {
    return a.Acquire(Clock::now() + milliseconds(5000), [&] { return cancel.load(); }, &gone);
  });
  while (a.queued() < 1) std::this_thread::sleep_for(milliseconds(1));
  auto behind = std::async(std::launch::async, [&] {
    return a.Acquire(Clock::now() + milliseconds(5000), nullptr, &next);
  });
  while (a.queued() < 2) std::this_thread::sleep_for(milliseconds(1));
  cancel = true;
  EXPECT_EQ(leaving.get().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(a.queued(), 1);
  held.Release();
  EXPECT_TRUE(behind.get().ok());
  EXPECT_EQ(a.running(), 1);
  // The slot is taken and one caller may wait: a newcomer queues behind, then is served.
  Admission::Slot late;
  auto newcomer = std::async(std::launch::async, [&] {
    return a.Acquire(Clock::now() + milliseconds(5000), nullptr, &late);
  });
  while (a.queued() < 1) std::this_thread::sleep_for(milliseconds(1));
  next.Release();
  EXPECT_TRUE(newcomer.get().ok());
  late.Release();
  EXPECT_EQ(a.running(), 0);
  EXPECT_EQ(a.done(), 3);
}

// Many callers at once, some leaving by deadline or cancellation, some refused by the queue
// limit: never more running than the slots, and every slot given back (none lost to a waiter
// that left as it was granted one).
TEST(Admission, ManyCallersNeverExceedTheSlotsAndLoseNone) {
  constexpr int kSlots = 3, kThreads = 24, kEach = 150;
  Admission a(kSlots, 8);
  std::atomic<int> inside{0}, most{0};
  std::atomic<int64_t> granted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng{uint32_t(t)};
      for (int i = 0; i < kEach; ++i) {
        const int kind = int(rng() % 4);
        const auto deadline = Clock::now() + milliseconds(kind == 0 ? 1 : 2000);
        const auto cancel_at = std::chrono::steady_clock::now() + milliseconds(kind == 1 ? 2 : 5000);
        Admission::Slot slot;
        const absl::Status st = a.Acquire(
            deadline, [cancel_at] { return std::chrono::steady_clock::now() >= cancel_at; },
            &slot);
        if (!st.ok()) {
          EXPECT_TRUE(st.code() == absl::StatusCode::kDeadlineExceeded ||
                      st.code() == absl::StatusCode::kCancelled ||
                      st.code() == absl::StatusCode::kResourceExhausted)
              << st;
          ++refused;
          continue;
        }
        ++granted;
        const int now = ++inside;
        for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        --inside;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(most.load(), kSlots);
  EXPECT_EQ(granted + refused, int64_t(kThreads) * kEach);
  EXPECT_GT(granted.load(), 0);
  EXPECT_EQ(a.running(), 0);
  EXPECT_EQ(a.queued(), 0);
  EXPECT_EQ(a.done(), granted.load());
  EXPECT_TRUE(a.WaitIdle(Clock::now() + milliseconds(100)));
}

}  // namespace
}  // namespace trisolve::server
