// Persistent systems: what each identity keeps on the server between solves. Handles,
// time-to-live, LRU eviction under a byte cap and a cap per identity. Nothing here knows gRPC or
// protobuf; the backend's PreparedSystem holds the memory.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "sweeper.h"
#include "trisolve/system.h"

namespace trisolve::server {

struct SystemLimits {
  int max_per_identity = 64;
  int64_t max_bytes = int64_t{4} << 30;  // every system's memory together
  double default_ttl_s = 600;
  double max_ttl_s = 24 * 3600;
};

class SystemRegistry {
 public:
  using Clock = std::chrono::steady_clock;

  struct Entry {
    std::string handle, identity, label;
    std::vector<std::vector<int64_t>> coefficient_shapes;
    std::vector<int64_t> rhs_shape;
    double ttl_s = 0;
    // Held while a solve or an update runs: the calls on one system run in arrival order.
    std::mutex mu;
    std::unique_ptr<PreparedSystem> system;  // guarded by mu
    // Every by-handle call counts itself here (Acquire, Touch, the Use's end) without the
    // registry's writer lock: atomics, read by eviction and expiry under that lock.
    std::atomic<Clock::rep> last_used{0};  // Clock ticks
    std::atomic<int64_t> solves{0}, updates{0};
    std::atomic<int> busy{0};      // calls holding or waiting for mu: not evicted meanwhile
    std::atomic<bool> gone{false};  // released, expired or evicted: later calls get NOT_FOUND
    int64_t bytes = 0;  // written under mu and the registry's writer lock; read under either
    void Used() { last_used.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
    Clock::time_point LastUsed() const {
      return Clock::time_point(Clock::duration(last_used.load(std::memory_order_relaxed)));
    }
  };

  // A system in use: counts as busy until destroyed.
  class Use {
   public:
    Use() = default;
    Use(SystemRegistry* r, std::shared_ptr<Entry> e) : r_(r), e_(std::move(e)) {}
    Use(Use&& o) noexcept : r_(o.r_), e_(std::move(o.e_)) { o.r_ = nullptr; }
    Use& operator=(Use&&) = delete;
    ~Use();
    Entry& operator*() const { return *e_; }
    Entry* operator->() const { return e_.get(); }

   private:
    SystemRegistry* r_ = nullptr;
    std::shared_ptr<Entry> e_;
  };

  explicit SystemRegistry(SystemLimits limits);
  ~SystemRegistry();

  const SystemLimits& limits() const { return limits_; }
  // Handles made from now on end with "@" + address (empty: nothing): the replica a client
  // balancing over several servers sends the handle's calls back to.
  void SetReplicaAddress(std::string address);
  std::string replica_address() const;

  // Makes room for a new system of about `bytes` for `identity`: RESOURCE_EXHAUSTED over the
  // identity's cap, or when the system alone exceeds the byte cap; evicts the least recently
  // used idle systems (of any identity) until it fits.
  absl::Status Reserve(const std::string& identity, int64_t bytes);
  // Keeps a prepared system; ttl_s 0 means the default. Returns its entry.
  absl::StatusOr<std::shared_ptr<Entry>> Add(const std::string& identity, std::string label,
                                             double ttl_s, std::unique_ptr<PreparedSystem> system,
                                             std::vector<std::vector<int64_t>> coefficient_shapes,
                                             std::vector<int64_t> rhs_shape);
  // The identity's system by handle, marked busy and used now; NOT_FOUND for a handle that
  // does not exist, is gone, or belongs to another identity (the same message for each).
  absl::StatusOr<Use> Acquire(const std::string& identity, const std::string& handle);
  // Drops the system (its memory is returned once no call uses it). NOT_FOUND as Acquire.
  absl::StatusOr<std::shared_ptr<Entry>> Remove(const std::string& identity,
                                               const std::string& handle);
  std::vector<std::shared_ptr<Entry>> List(const std::string& identity) const;
  // Re-counts the bytes of a system after an update (a backend may derive more or less).
  void Touch(Entry& e, bool solved, bool updated);

  // The registry's counts of a system, read under its lock.
  struct Usage {
    int64_t bytes = 0, solves = 0, updates = 0;
    double idle_s = 0;
  };
  Usage UsageOf(const Entry& e) const;

  int64_t count() const;
  int64_t bytes() const;
  // Drops every system idle past its time-to-live (the sweeper does this every second).
  int ExpireIdle();

 private:
  void EraseLocked(std::map<std::string, std::shared_ptr<Entry>>::iterator it, const char* why);
  void Release(Entry& e);

  const SystemLimits limits_;
  // Readers: the lookups of every by-handle call (Acquire) and the listings; writers: adding,
  // removing, evicting, expiring and a change of a system's bytes. (absl::Mutex: lookups without
  // pause do not starve its writers.)
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> by_handle_;
  int64_t bytes_ = 0;
  std::string replica_;
  Sweeper sweeper_;  // last: stops first
};

}  // namespace trisolve::server
