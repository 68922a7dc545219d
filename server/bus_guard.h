// Guards for memory that a client maps too. A client can shrink a shared-memory object the
// server has mapped at any time; the server's next access to a page past the object's new end
// faults (SIGBUS), which would take the process down with every other client's calls. An access
// that faults inside a guarded range gets a private page of zeros mapped in place of the
// missing one (the access is retried on it) and marks the guard: the work that read or wrote
// there is failed afterwards (faulted()), never answered from the zeros. A fault outside every
// guard goes to the handler installed before, or takes the default action.
#pragma once

#include <cstdint>

namespace trisolve::server {

class BusGuard {
 public:
  // The process-wide number of guards; past it a range is left unguarded (active() false) and
  // its owner checks the object's size instead.
  static constexpr int kSlots = 4096;

  // Guards [p, p + bytes).
  BusGuard(const void* p, int64_t bytes);
  ~BusGuard();
  BusGuard(const BusGuard&) = delete;
  BusGuard& operator=(const BusGuard&) = delete;

  bool active() const { return slot_ >= 0; }
  // An access in the range has faulted since the guard was made: the range no longer shows
  // the client's object (zeros where pages were missing, writes kept from it).
  bool faulted() const;
  // Guards in use in the process (metrics, tests).
  static int InUse();

 private:
  const int slot_;
};

}  // namespace trisolve::server
