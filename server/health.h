// The backend's health as the server acts on it. A backend whose device is lost to the process
// (Backend::Health: a sticky CUDA error) cannot serve again, and nothing in the process can
// bring it back: from the first failed call that finds it lost, the server answers that call,
// the running ones (cancelled) and the queued ones UNAVAILABLE, refuses new ones, reports
// NOT_SERVING, drains and exits kExitBackendLost for its supervisor to restart it.
#pragma once

#include <atomic>
#include <functional>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trisolve/backend.h"

namespace trisolve::server {

// trisolved's exit status after its backend was lost (sysexits' EX_UNAVAILABLE); a restart
// gets a new context. docs/operations.md.
inline constexpr int kExitBackendLost = 69;

class BackendHealth {
 public:
  explicit BackendHealth(const Backend* backend) : backend_(backend) {}

  // After a backend call failed with `failure`: asks the backend; lost, the answer is its
  // UNAVAILABLE (the first time: logged, counted, the hooks run), otherwise `failure` as it is.
  absl::Status Check(const absl::Status& failure);
  bool lost() const { return lost_.load(std::memory_order_acquire); }
  // Whether running calls are to stop: once lost, after the hooks ran (so that a slot a
  // stopped call frees goes to no queued call: the hooks refuse those first).
  bool stop_running() const { return stop_running_.load(std::memory_order_acquire); }
  // OK, or the UNAVAILABLE that says why the backend is lost.
  absl::Status status() const;
  // Runs `hook` once the backend is found lost (at once if it is already).
  void OnLost(std::function<void()> hook);
  // trisolve_backend_up (1 serving, 0 lost), for /metrics.
  std::string RenderMetrics() const;

 private:
  const Backend* backend_;
  std::atomic<bool> lost_{false}, stop_running_{false};
  mutable std::mutex mu_;
  std::condition_variable hooks_done_;
  absl::Status status_;
  std::vector<std::function<void()>> hooks_;
};

}  // namespace trisolve::server
