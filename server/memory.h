// Shared-memory regions: what clients on the server's host register once so that their arrays
// (and the answers) never cross the socket. A region is a POSIX shared-memory object mapped
// once, page-locked through the backend where it allows, or a client's CUDA memory opened once
// through the backend (an IPC handle); owned by the identity that registered it, dropped on
// request or when idle past its time-to-live. Nothing here knows gRPC, protobuf or CUDA.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "bus_guard.h"
#include "sweeper.h"
#include "job.h"
#include "trisolve/backend.h"

namespace trisolve::server {

struct MemoryLimits {
  bool enabled = true;
  int64_t max_bytes_per_identity = int64_t{64} << 30;
  int max_regions_per_identity = 64;
  double default_ttl_s = 3600;
  double max_ttl_s = 7 * 24 * 3600;
};

// One mapped region. Destroyed (unpinned, unmapped, its descriptor closed) once it is
// unregistered or expired and no request holds it any more.
class Region {
 public:
  Region(Backend* backend, std::string name, std::string key, int fd, void* map, int64_t map_bytes,
         std::byte* base, int64_t bytes, int64_t object_end, bool pinned, double ttl_s);
  // A client's device memory, opened by backend->OpenDeviceMemory (closed when destroyed).
  Region(Backend* backend, std::string name, std::byte* device_base, int64_t bytes, int device,
         double ttl_s);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }  // empty: the server's own memory
  bool server_owned() const { return fd_ < 0 && device_ < 0; }
  // The CUDA device of a client's device memory; -1: host memory. The server never reads or
  // writes device memory on the host.
  int device() const { return device_; }
  bool on_device() const { return device_ >= 0; }
  std::byte* base() const { return base_; }
  int64_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }
  double ttl_s() const { return ttl_s_; }
  // The region still shows the client's object: FAILED_PRECONDITION naming `field` where an
  // access to it faulted (the client shrank the object under the server: bus_guard.h), or, for
  // a region left unguarded, where the object no longer spans it (an fstat). Cheap where
  // guarded (a flag): checked before a request's arrays are read and again once its work is
  // done, so that work which met a missing page is failed, not answered.
  absl::Status StillMapped(absl::string_view field) const;
  // The same, and the object's size read now (an fstat) whether or not an access faulted: for
  // the checks that run once (registering, opening a ring) or on a timer (a ring's watcher).
  absl::Status ObjectSpans(absl::string_view field) const;

 private:
  Backend* backend_;
  const std::string name_, key_;
  const int fd_;
  void* const map_;
  const int64_t map_bytes_;
  std::byte* const base_;
  const int64_t bytes_, object_end_;
  const bool pinned_;
  const double ttl_s_;
  const int device_ = -1;
  std::unique_ptr<BusGuard> guard_;  // a client's shared memory: its mapping guarded
};

struct RegionInfo {
  std::string name, key;
  int64_t bytes = 0, uses = 0;
  bool pinned = false, server_owned = false;
  double ttl_s = 0, idle_s = 0;
  int device = -1;  // a CUDA region's device (-1: host memory)
};

class MemoryRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  // `backend` page-locks regions (Backend::PinHostMemory); it must outlive the registry.
  MemoryRegistry(MemoryLimits limits, Backend* backend);
  ~MemoryRegistry();

  const MemoryLimits& limits() const { return limits_; }
  Backend* backend() const { return backend_; }
  // Maps `key` [offset, offset + bytes) for `identity` under `name`. INVALID_ARGUMENT for a bad
  // name, key, offset or size; ALREADY_EXISTS for a name the identity holds; RESOURCE_EXHAUSTED
  // over the identity's caps; FAILED_PRECONDITION when disabled or the key cannot be opened
  // here (another host, or a container that does not share /dev/shm).
  absl::StatusOr<RegionInfo> Register(const std::string& identity, const std::string& name,
                                      const std::string& key, int64_t offset, int64_t bytes,
                                      double ttl_s);
  // A client's CUDA memory (a CUDA IPC handle of kCudaIpcHandleBytes, its device, the range
  // [offset, offset + bytes) of the allocation), opened through the backend once and kept while
  // registered. The same name rules, caps and time-to-live as shared memory; INVALID_ARGUMENT
  // naming the field for a bad handle, device, offset or size; FAILED_PRECONDITION when
  // disabled or the backend has no device (the CPU backend).
  absl::StatusOr<RegionInfo> RegisterCuda(const std::string& identity, const std::string& name,
                                          const std::string& handle, int device, int64_t offset,
                                          int64_t bytes, double ttl_s);
  // A region of the server's own memory (page-locked where the backend can), for clients that
  // fill it over the network (WriteMemory); the same caps as shared memory.
  absl::StatusOr<RegionInfo> Allocate(const std::string& identity, const std::string& name,
                                      int64_t bytes, double ttl_s);
  absl::StatusOr<RegionInfo> Unregister(const std::string& identity, const std::string& name);
  std::vector<RegionInfo> List(const std::string& identity) const;
  // The identity's region, marked used now; NOT_FOUND (naming `field`) for a name that is not
  // the identity's.
  absl::StatusOr<std::shared_ptr<Region>> Find(const std::string& identity,
                                               const std::string& name, absl::string_view field);
  // Whether `region` is still registered as the identity's `name` (not unregistered, expired
  // or replaced), without counting as a use of it.
  bool Holds(const std::string& identity, const std::string& name, const Region* region) const;
  int64_t count() const;
  int64_t bytes() const;
  // Drops regions idle past their time-to-live (the sweeper does this every second).
  int ExpireIdle();

 private:
  struct Entry {
    Entry(std::shared_ptr<Region> r, Clock::time_point now)
        : region(std::move(r)), last_used_ns(now.time_since_epoch().count()) {}
    std::shared_ptr<Region> region;
    // Written by Find under its shard's reader lock, by any number of threads at once; read by
    // the expiry sweep (which removes an entry only under the writer lock) and List. A cache
    // line of their own, so that lookups of neighbouring entries do not take it from each
    // other.
    alignas(64) std::atomic<Clock::rep> last_used_ns;
    std::atomic<int64_t> uses{0};
    char pad[64 - sizeof(std::atomic<Clock::rep>) - sizeof(std::atomic<int64_t>)];
  };
  struct Key {
    std::string identity, name;
  };
  // Lookups by the caller's strings, without building a Key (two allocations) for each.
  struct KeyView {
    absl::string_view identity, name;
  };
  struct KeyLess {
    using is_transparent = void;
    static KeyView View(const Key& k) { return {k.identity, k.name}; }
    static KeyView View(const KeyView& k) { return k; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      const KeyView x = View(a), y = View(b);
      return x.identity != y.identity ? x.identity < y.identity : x.name < y.name;
    }
  };
  using Map = std::map<Key, Entry, KeyLess>;
  // The regions by a hash of (identity, name): a lookup takes one shard's reader lock, so that
  // requests of different regions share no lock word and those of one region do not wait for
  // each other (every RPC by reference and every ring request resolves one or more). An
  // absl::Mutex, not std::shared_mutex: glibc's rwlock lets new readers in past a waiting
  // writer, and lookups without pause (a reader descheduled inside one, on a loaded host) kept
  // registration and the expiry sweep out for up to a second (bench_memory_find --writer);
  // absl::Mutex holds new readers back once a writer waits.
  struct alignas(64) Shard {
    mutable absl::Mutex mu;
    Map regions;
  };
  static constexpr size_t kShards = 64;
  // What an identity holds, for its caps without a walk over every shard.
  struct Account {
    int count = 0;
    int64_t bytes = 0;
  };
  Shard& ShardOf(absl::string_view identity, absl::string_view name) const;
  static double IdleSeconds(const Entry& e, Clock::time_point now);
  static RegionInfo Info(const Entry& e, Clock::time_point now);
  // Refuses a name taken or caps exceeded for one more region of `bytes` (admin_mu_ held).
  absl::Status CheckRoomLocked(const std::string& identity, const std::string& name,
                               int64_t bytes) const;
  absl::StatusOr<RegionInfo> Keep(const std::string& identity, std::shared_ptr<Region> region);
  // One region of `bytes` gone from the identity's account and the totals (admin_mu_ held).
  void Forget(const std::string& identity, int64_t bytes);

  const MemoryLimits limits_;
  Backend* const backend_;
  // Taken by whatever adds or removes regions (registering, unregistering, expiry), before the
  // shard's writer lock; never by Find or Holds.
  mutable std::mutex admin_mu_;
  std::map<std::string, Account, std::less<>> accounts_;
  int64_t count_ = 0, bytes_ = 0;
  mutable std::array<Shard, kShards> shards_;
  Sweeper sweeper_;  // last: stops first
};

// Resolves the region references of one request for its caller: checks each against its
// region (bounds, alignment, still mapped) and keeps the regions alive until destroyed.
class RequestRegions final : public RegionResolver {
 public:
  RequestRegions(MemoryRegistry* registry, std::string identity)
      : registry_(registry), identity_(std::move(identity)) {}
  absl::StatusOr<std::byte*> Resolve(absl::string_view field, const std::string& region,
                                     int64_t offset, int64_t bytes, int64_t expected_bytes,
                                     int align, RegionUse use, bool* on_device) override;
  // Once the request's work is done, before it is answered: every region it used still shows
  // its client's object (StillMapped), else that region's FAILED_PRECONDITION.
  absl::Status AfterUse() const;

 private:
  MemoryRegistry* registry_;
  std::string identity_;
  std::vector<std::shared_ptr<Region>> held_;
  std::vector<std::unique_ptr<std::byte[]>> host_copies_;  // device arrays the host reads
};

}  // namespace trisolve::server
