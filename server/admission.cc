#include "admission.h"

#include "absl/strings/str_cat.h"

namespace trisolve::server {

void Admission::Slot::Release() {
  if (a_) a_->ReleaseOne();
  a_ = nullptr;
}

void Admission::ReleaseOne() {
  std::lock_guard<std::mutex> lock(mu_);
  --running_;
  ++done_;
  cv_.notify_all();
}

absl::Status Admission::Acquire(std::chrono::system_clock::time_point deadline,
                                const std::function<bool()>& cancelled, Slot* slot) {
  std::unique_lock<std::mutex> lock(mu_);
  if (shutdown_) return absl::UnavailableError("the server is shutting down");
  if (std::chrono::system_clock::now() >= deadline)
    return absl::DeadlineExceededError("the deadline passed before the job could start");
  if (running_ < max_concurrent_) {
    ++running_;
    *slot = Slot(this);
    return absl::OkStatus();
  }
  if (queued_ >= max_queued_)
    return absl::ResourceExhaustedError(
        absl::StrCat("the queue is full: ", running_, " jobs running (max_concurrent_jobs = ",
                     max_concurrent_, ") and ", queued_, " waiting (max_queued_jobs = ",
                     max_queued_, ")"));
  ++queued_;
  absl::Status result = absl::OkStatus();
  while (true) {
    if (shutdown_) {
      result = absl::UnavailableError("the server is shutting down");
      break;
    }
    if (running_ < max_concurrent_) {
      ++running_;
      *slot = Slot(this);
      break;
    }
    const auto now = std::chrono::system_clock::now();
    if (now >= deadline) {
      result = absl::DeadlineExceededError("the deadline passed while the job was queued");
      break;
    }
    if (cancelled && cancelled()) {
      result = now + kDeadlineSkew >= deadline
                   ? absl::DeadlineExceededError("the deadline passed while the job was queued")
                   : absl::CancelledError("the call was cancelled while the job was queued");
      break;
    }
    // Wake at least every 50 ms to notice a cancelled caller.
    cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(50)));
  }
  --queued_;
  return result;
}

void Admission::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_ = true;
  cv_.notify_all();
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
  return queued_;
}
int64_t Admission::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool Admission::WaitIdle(std::chrono::system_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return running_ == 0 && queued_ == 0; });
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
