// Shared memory for clients on the server's host: arrays that lie in a registered SharedMemory
// travel as (region, offset, bytes) instead of bytes, and x can be written straight into it.
//
//   auto shm = trisolve::SharedMemory::Create(1 << 30);         // a POSIX object, mapped here
//   client.RegisterMemory(**shm);                               // the server maps it once
//   double* d = *(*shm)->Allocate<double>(n);                   // fill in place ...
//   job.arrays["d"] = {trisolve::DType::kFloat64, {n}, d};      // ... and pass views into it
//   job.options.x_out = *(*shm)->Allocate<double>(n);           // x lands here
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trisolve {

class SharedMemory {
 public:
  // A new object of `bytes` bytes (rounded up to the page size) under an unguessable key
  // ("/trisolve-<32 hex digits>"), mapped read-write. The object is unlinked when this goes:
  // the server's mapping, if any, stays valid until it unregisters it.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(int64_t bytes);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  std::byte* data() const { return base_; }
  int64_t size() const { return bytes_; }
  const std::string& key() const { return key_; }
  bool Contains(const void* p, int64_t bytes) const {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= base_ && bytes >= 0 && b + bytes <= base_ + bytes_;
  }

  // Pieces one after the other, each aligned to 64 bytes; RESOURCE_EXHAUSTED when it is full.
  absl::StatusOr<void*> Allocate(int64_t bytes);
  template <typename T>
  absl::StatusOr<T*> Allocate(int64_t count) {
    auto p = Allocate(count * int64_t(sizeof(T)));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  // Forgets every piece (their memory is reused by the next Allocate calls).
  void Reset() { used_ = 0; }
  int64_t used() const { return used_; }

 private:
  SharedMemory(std::string key, std::byte* base, int64_t bytes)
      : key_(std::move(key)), base_(base), bytes_(bytes) {}
  std::string key_;
  std::byte* base_;
  int64_t bytes_;
  int64_t used_ = 0;
};

}  // namespace trisolve
