// The threads that run unary calls too long for gRPC's callback threads (service.cc): a call
// that cannot be answered at once is posted here, and the worker finishes the call's reactor.
// gRPC's callback threads are few and shared by every connection; one blocked on a large solve
// or on an admission queue would stall the calls behind it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace trisolve::server {

class CallWorkers {
 public:
  // At most `max_threads` run at once (started as needed, kept); at most `max_waiting` tasks wait
  // for a thread beyond those.
  CallWorkers(int max_threads, int max_waiting)
      : max_threads_(max_threads < 1 ? 1 : max_threads), max_waiting_(max_waiting) {}
  CallWorkers(const CallWorkers&) = delete;
  CallWorkers& operator=(const CallWorkers&) = delete;
  // Runs what was posted, then joins.
  ~CallWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // False (the task dropped) when every thread is busy and `max_waiting` tasks already wait.
  bool Post(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) return false;
    const int waiting = static_cast<int>(tasks_.size());
    if (waiting < idle_) {
      tasks_.push_back(std::move(task));
      lock.unlock();
      cv_.notify_one();
      return true;
    }
    if (static_cast<int>(threads_.size()) < max_threads_) {
      tasks_.push_back(std::move(task));
      threads_.emplace_back([this] { Loop(); });
      return true;
    }
    if (waiting - idle_ >= max_waiting_) return false;
    tasks_.push_back(std::move(task));
    return true;
  }

  int threads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(threads_.size());
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;  // stopping, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // what it captured goes before the next wait
      lock.lock();
    }
  }

  const int max_threads_, max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stop_ = false;
};

}  // namespace trisolve::server
