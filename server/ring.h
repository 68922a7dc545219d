// The request-ring transport: small solves of clients on the server's host, asked and answered
// through slots in their own shared memory (proto/ring_abi.h) instead of over the socket. A
// fixed pool of serving threads shares the rings out (each ring served by one of them, as the
// identity that opened it; where the kernel lacks futex_waitv, or --ring-threads is 0, each ring
// gets a thread of its own); a request is copied out of shared memory, checked exactly as the
// gRPC path checks it (translate.h), and run through the core (admission, batching, metrics with
// transport="ring").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core.h"
#include "ring_abi.h"

namespace trisolve::server {

// The serving threads a server starts for its rings by default: half the cores it may run on
// (its affinity mask; at least one). The rings' clients run on the same host and need the other
// half to write their requests and read their answers; on the H100 host's 16 cores 8 threads
// served 1-256 clients faster than 4 or a thread a ring (docs/serving.md, "Ring threads").
int DefaultRingThreads();

struct RingOptions {
  bool enabled = true;
  // Serving threads shared by all rings (each owns at most kRingsPerThread; past threads x that,
  // more threads start). 0: a thread per ring, as where futex_waitv is missing (Linux < 5.16).
  int threads = DefaultRingThreads();
  int max_rings = 1024;             // open at once, every identity together
  int max_rings_per_identity = 512;
  // Threads that wake the rings' sleeping clients for the serving threads (FUTEX_WAKE on a
  // slot: a system call, and the scheduler's wake-up of the client), so that a serving thread
  // with other requests waiting goes back to them at once. A serving thread hands a wake over
  // only while it has more requests to answer or the waker is awake; else it wakes the client
  // itself (one hop, not two), as it does when a waker falls behind. 0: none, the default: on
  // the H100 host's 16 cores two wakers for eight serving threads made 0.8 M wakes a run and
  // bought nothing (16-256 clients 2-6% below none in five of six cells: docs/serving.md,
  // "Wakes off the ring threads"). -1: one for every four serving threads. Pooled threads only.
  int wakers = 0;
  // How long an idle serving thread spins on its rings' doorbells before it sleeps on them (the
  // futexes): the latency of the next request against a core kept busy. At most half the
  // cores' worth of serving threads spin at once; the others sleep at once.
  double spin_us = 20;
  // The longest a serving thread sleeps before it looks at every slot of its rings again (stop
  // requests and new rings wake it at once).
  double idle_wait_s = 0.1;
  // How often the rings' heartbeats advance and their regions are checked.
  double watch_interval_s = 0.1;
};

struct RingView {
  std::string id;
  int slots = 0;
  int64_t bytes = 0;
  double spin_us = 0;
};

class RingManager {
 public:
  // Rings one serving thread owns at most: futex_waitv waits on at most 128 words, and each
  // thread's own wake-up word is one of them.
  static constexpr int kRingsPerThread = 127;

  RingManager(Core* core, RingOptions options);
  ~RingManager();
  RingManager(const RingManager&) = delete;
  RingManager& operator=(const RingManager&) = delete;

  const RingOptions& options() const { return options_; }
  // Opens a ring of `slots` slots at `offset` of the caller's region `region` (whose header the
  // client wrote) and hands it to the least loaded serving thread (or starts its own thread).
  absl::StatusOr<RingView> Open(Call& call, const std::string& region, int64_t offset, int slots);
  // Stops serving the caller's ring `id` (after the request it is answering); NOT_FOUND for a
  // ring that is not the caller's.
  absl::StatusOr<RingView> Close(Call& call, const std::string& id);
  // Every ring closed (kClosedShutdown): requests not yet taken answered UNAVAILABLE, the
  // threads joined. Later Opens are UNAVAILABLE.
  void Shutdown();
  int64_t count() const;
  // Serving threads started so far (0 with a thread per ring).
  int serving_threads() const;
  // Waker threads (RingOptions::wakers, resolved).
  int waker_threads() const { return int(wakers_.size()); }

 private:
  class Ring;
  class Pool;
  class Waker;
  // Advances the heartbeats, closes rings whose regions went, forgets rings that ended.
  void Watch();

  Core* const core_;
  const RingOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::shared_ptr<Ring>> rings_;
  std::atomic<int64_t> next_ring_{1};
  std::atomic<int> spinners_{0};
  const int max_spinners_;
  // Rings go to pools_ (futex_waitv is there and options_.threads > 0), else a thread each.
  const bool pooled_;
  // Started with the manager, stopped after the last pool (each wakes what it was handed
  // before it ends).
  std::vector<std::unique_ptr<Waker>> wakers_;
  std::vector<std::unique_ptr<Pool>> pools_;  // under mu_; kept until the manager goes
  std::thread watcher_;
};

}  // namespace trisolve::server
