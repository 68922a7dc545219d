// The request-ring transport: small solves of clients on the server's host, asked and answered
// through slots in their own shared memory (proto/ring_abi.h) instead of over the socket. Each
// ring is served by a thread of its own, as the identity that opened it; a request is copied out
// of shared memory, checked exactly as the gRPC path checks it (translate.h), and run through the
// core (admission, batching, metrics with transport="ring").
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

struct RingOptions {
  bool enabled = true;
  int max_rings = 1024;             // open at once, every identity together
  int max_rings_per_identity = 512;
  // How long a serving thread spins on its ring's doorbell before it sleeps on it (the futex):
  // the latency of the next request against a core kept busy. At most half the cores' worth of
  // rings spin at once; the others sleep at once.
  double spin_us = 20;
  // The longest a serving thread sleeps before it looks at its ring again (stop requests wake
  // it at once).
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
  RingManager(Core* core, RingOptions options);
  ~RingManager();
  RingManager(const RingManager&) = delete;
  RingManager& operator=(const RingManager&) = delete;

  const RingOptions& options() const { return options_; }
  // Opens a ring of `slots` slots at `offset` of the caller's region `region` (whose header the
  // client wrote) and starts its serving thread.
  absl::StatusOr<RingView> Open(Call& call, const std::string& region, int64_t offset, int slots);
  // Stops serving the caller's ring `id` (after the request it is answering); NOT_FOUND for a
  // ring that is not the caller's.
  absl::StatusOr<RingView> Close(Call& call, const std::string& id);
  // Every ring closed (kClosedShutdown): requests not yet taken answered UNAVAILABLE, the
  // threads joined. Later Opens are UNAVAILABLE.
  void Shutdown();
  int64_t count() const;

 private:
  class Ring;
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
  std::thread watcher_;
};

}  // namespace trisolve::server
