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

}  // namespace trisolve::server
