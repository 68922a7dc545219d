#include "health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace trisolve::server {

absl::Status BackendHealth::Check(const absl::Status& failure) {
  if (!lost()) {
    absl::Status health = backend_->Health();
    if (health.ok()) return failure;
    std::vector<std::function<void()>> hooks;
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!lost_.load()) {
        status_ = health.code() == absl::StatusCode::kUnavailable
                      ? health
                      : absl::UnavailableError(health.message());
        lost_.store(true, std::memory_order_release);
        hooks.swap(hooks_);
        first = true;
      }
    }
    if (first) {
      spdlog::error("backend lost ({} failed): {}; health NOT_SERVING, every call UNAVAILABLE, "
                    "then exit {} for a restart",
                    absl::StatusCodeToString(failure.code()), std::string(health.message()),
                    kExitBackendLost);
      for (auto& h : hooks) h();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_running_.store(true, std::memory_order_release);
      }
      hooks_done_.notify_all();
      return status();
    }
  }
  // Lost: answered once the hooks have run. A running call failing beside the first would
  // otherwise free its slot to a queued call before the hooks refuse the queue, and that call
  // would reach the lost backend.
  std::unique_lock<std::mutex> lock(mu_);
  hooks_done_.wait(lock, [this] { return stop_running_.load(); });
  return status_;
}

absl::Status BackendHealth::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void BackendHealth::OnLost(std::function<void()> hook) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_.load()) {
      hooks_.push_back(std::move(hook));
      return;
    }
  }
  hook();
}

std::string BackendHealth::RenderMetrics() const {
  return absl::StrCat(
      "# HELP trisolve_backend_up 1 while the backend serves; 0 once its device is lost to the "
      "process (the server then drains and exits for a restart).\n"
      "# TYPE trisolve_backend_up gauge\ntrisolve_backend_up ",
      lost() ? 0 : 1, "\n");
}

}  // namespace trisolve::server
