// Fault injection: a test-only switch, off unless TRISOLVE_FAULT_INJECTION is set, that makes a
// backend fail the way a device does, so that the server's handling of device faults is tested
// by causing them, not by hoping for them.
//
//   TRISOLVE_FAULT_INJECTION=alloc-fail:N[,sticky:M][,stall:K[,stall-ms:T]]
//
// alloc-fail:N  the N-th allocation fails as an out-of-memory does (once). CUDA: the N-th request
//               for a device-pool buffer (every device pool of the process counted together)
//               fails as cudaMalloc does, after the pool has evicted its idle buffers, whether or
//               not a cached buffer would have served it. CPU stand-in: the N-th solve call.
// sticky:M      the M-th solve turns into a sticky error: the device is lost to the process.
//               CUDA: after the M-th staged solve's kernels, a kernel that executes __trap() on
//               the same stream (cudaErrorLaunchFailure: the context is unusable from then on).
//               CPU stand-in: the M-th solve call runs, then the backend reports itself lost;
//               every call that ends after that fails UNAVAILABLE and Health() is UNAVAILABLE.
// stall:K       the K-th solve waits T milliseconds (stall-ms, default 1000) before it starts, as
//               a solve behind a busy device does, so that what the server does while a solve
//               holds its lane (batches forming behind it, callers leaving) is tested by holding
//               it, not by racing it. CPU stand-in only; the CUDA backend ignores it.
// Counts start at 1 and are taken in the order the calls start.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trisolve {

class Backend;

class FaultInjection {
 public:
  // The faults `spec` asks for (the variable's syntax above; empty: none). INVALID_ARGUMENT
  // naming the part it cannot read.
  static absl::StatusOr<FaultInjection> Parse(const std::string& spec);
  // The process's, read once from TRISOLVE_FAULT_INJECTION; a malformed value leaves every
  // fault off here (the backends' factories refuse it: ProcessStatus()).
  static FaultInjection& Process();
  static absl::Status ProcessStatus();

  FaultInjection() = default;
  FaultInjection(const FaultInjection& o)
      : alloc_fail_at_(o.alloc_fail_at_),
        sticky_at_(o.sticky_at_),
        stall_at_(o.stall_at_),
        stall_ms_(o.stall_ms_) {}
  FaultInjection& operator=(const FaultInjection& o) {
    alloc_fail_at_ = o.alloc_fail_at_;
    sticky_at_ = o.sticky_at_;
    stall_at_ = o.stall_at_;
    stall_ms_ = o.stall_ms_;
    return *this;
  }

  bool enabled() const { return alloc_fail_at_ > 0 || sticky_at_ > 0 || stall_at_ > 0; }
  // Counts one allocation, or one solve; true for the one that is to fail.
  bool NextAllocationFails() { return Hit(alloc_fail_at_, allocations_); }
  bool NextSolveIsSticky() { return Hit(sticky_at_, solves_); }
  // Counts one solve for stall:K; how long that solve is to wait (milliseconds), else 0.
  int64_t NextSolveStallMs() { return Hit(stall_at_, stalls_) ? stall_ms_ : 0; }
  std::string Describe() const;

 private:
  static bool Hit(int64_t at, std::atomic<int64_t>& count) {
    return at > 0 && count.fetch_add(1) + 1 == at;
  }
  int64_t alloc_fail_at_ = 0, sticky_at_ = 0, stall_at_ = 0, stall_ms_ = 1000;
  std::atomic<int64_t> allocations_{0}, solves_{0}, stalls_{0};
};

// The CPU stand-in: `backend` behind the faults of `faults` (alloc-fail: RESOURCE_EXHAUSTED
// before the solve; sticky: lost after it). The backend as it is where `faults` asks for none.
std::unique_ptr<Backend> WithInjectedFaults(std::unique_ptr<Backend> backend,
                                            FaultInjection* faults);

}  // namespace trisolve
