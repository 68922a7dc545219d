#include "admission.h"

#include "absl/strings/str_cat.h"

namespace trisolve::server {

void Admission::Slot::Release() {
  if (a_) a_->ReleaseOne();
  a_ = nullptr;
}

void Admission::ReleaseOne() {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  ended_.notify_all();
  PassOnLocked();
}

void Admission::PassOnLocked() {
  if (!shutdown_ && !waiters_.empty()) {
    Waiter* w = waiters_.front();
    waiters_.pop_front();
    w->granted = true;
    // Under the lock: once it is released the waiter may return and its cv be gone.
    w->cv.notify_one();
    return;
  }
  --running_;
  NotifyIdleLocked();
}

void Admission::NotifyIdleLocked() {
  if (running_ == 0 && waiters_.empty()) idle_.notify_all();
}

absl::Status Admission::Acquire(std::chrono::system_clock::time_point deadline,
                                const std::function<bool()>& cancelled, Slot* slot) {
  std::unique_lock<std::mutex> lock(mu_);
  if (shutdown_) return absl::UnavailableError("the server is shutting down");
  if (std::chrono::system_clock::now() >= deadline)
    return absl::DeadlineExceededError("the deadline passed before the job could start");
  // (A free slot with callers waiting cannot be: a released slot passes to them.)
  if (running_ < max_concurrent_ && waiters_.empty()) {
    ++running_;
    *slot = Slot(this);
    return absl::OkStatus();
  }
  if (int64_t(waiters_.size()) >= max_queued_)
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full: ", running_, " jobs running (max_concurrent_jobs = ",
        max_concurrent_, ") and ", waiters_.size(), " waiting (max_queued_jobs = ", max_queued_,
        ")"));
  Waiter me;
  const auto it = waiters_.insert(waiters_.end(), &me);
  // Leaves the queue without the slot (the callers behind move up).
  const auto leave = [&](absl::Status st) {
    waiters_.erase(it);
    NotifyIdleLocked();
    return st;
  };
  while (true) {
    if (me.granted) {
      if (shutdown_) {  // granted just before the shutdown: refused as the others are
        --running_;
        NotifyIdleLocked();
        return absl::UnavailableError("the server is shutting down");
      }
      *slot = Slot(this);
      return absl::OkStatus();
    }
    if (shutdown_) return leave(absl::UnavailableError("the server is shutting down"));
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline)
      return leave(absl::DeadlineExceededError("the deadline passed while the job was queued"));
    if (cancelled && cancelled())
      return leave(now + kDeadlineSkew >= deadline
                       ? absl::DeadlineExceededError("the deadline passed while the job was queued")
                       : absl::CancelledError("the call was cancelled while the job was queued"));
    // Wake at least every 50 ms to notice a cancelled caller (gRPC does not tell).
    me.cv.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(50)));
  }
}

void Admission::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  for (Waiter* w : waiters_) w->cv.notify_one();
  idle_.notify_all();
  ended_.notify_all();
}

bool Admission::AwaitDone(int64_t seen, std::chrono::system_clock::time_point deadline,
                          const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  while (done_ <= seen) {
    const auto now = std::chrono::system_clock::now();
    if (shutdown_ || now >= deadline || (cancelled && cancelled())) return false;
    // Every 50 ms at least, to notice a cancelled caller (gRPC does not tell).
    ended_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(50)));
  }
  return true;
}

bool Admission::shutting_down() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_;
}
int64_t Admission::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}
int64_t Admission::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(waiters_.size());
}
int64_t Admission::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool Admission::WaitIdle(std::chrono::system_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_until(lock, deadline, [&] { return running_ == 0 && waiters_.empty(); });
}

ReceiveBudget::Hold::~Hold() {
  if (b_ != nullptr) b_->Release(bytes_);
}

absl::Status ReceiveBudget::Reserve(int64_t bytes, Hold* hold) {
  std::lock_guard<std::mutex> lock(mu_);
  if (streams_ >= max_streams_)
    return absl::ResourceExhaustedError(absl::StrCat(
        streams_, " streams are being received, the limit max_receiving_streams; try again later"));
  if (bytes > max_bytes_ - bytes_)
    return absl::ResourceExhaustedError(absl::StrCat(
        "the stream declares ", bytes, " bytes and ", bytes_,
        " are being received: over the limit max_receiving_bytes = ", max_bytes_));
  bytes_ += bytes;
  ++streams_;
  hold->b_ = this;
  hold->bytes_ = bytes;
  return absl::OkStatus();
}

void ReceiveBudget::Release(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_ -= bytes;
  --streams_;
}

int64_t ReceiveBudget::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int ReceiveBudget::streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_;
}

DeadlineWatch::DeadlineWatch() : thread_([this] { Loop(); }) {}

DeadlineWatch::~DeadlineWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

DeadlineWatch::Guard::~Guard() {
  std::lock_guard<std::mutex> lock(w_->mu_);
  w_->watched_.erase(id_);
}

std::unique_ptr<DeadlineWatch::Guard> DeadlineWatch::Watch(
    std::chrono::system_clock::time_point deadline, std::function<void()> cancel) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_++;
  watched_[id] = {deadline, std::move(cancel)};
  cv_.notify_all();
  return std::make_unique<Guard>(this, id);
}

void DeadlineWatch::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    auto earliest = std::chrono::system_clock::time_point::max();
    const auto now = std::chrono::system_clock::now();
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (it->second.first <= now) {
        // Cancelling under the lock: a Guard being destroyed waits, so the call it guards is
        // still there to cancel.
        it->second.second();
        it = watched_.erase(it);
      } else {
        earliest = std::min(earliest, it->second.first);
        ++it;
      }
    }
    if (earliest == std::chrono::system_clock::time_point::max())
      cv_.wait(lock);
    else
      cv_.wait_until(lock, earliest);
  }
}

}  // namespace trisolve::server
