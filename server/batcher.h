// Dynamic batching of small unary requests: requests of one kind (family, precision, unknowns a
// system, method; a tree's shared structure) that meet while another of their kind is being
// solved are solved together in one backend call, and each caller gets its own x, statuses and
// residual. A request that finds nothing of its kind running is solved at once: a lone client
// pays nothing. Nothing here knows a transport.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "job.h"

namespace trisolve::server {

class Metrics;

struct BatchOptions {
  // How long, at most, the first request of a forming batch waits for others once another
  // batch of its kind is being solved (0: it runs as soon as a lane is free: natural batching
  // only). A request that finds nothing of its kind running never waits.
  double window_us = 0;
  // A backend call's largest batch: systems and bytes of arrays (max_systems <= 1: off, the
  // default: on the H100 batching measured no faster than solving each request alone, since
  // gRPC's per-request cost, not the solve, bounds small requests; docs/serving.md).
  int64_t max_systems = 1;
  int64_t max_bytes = int64_t{4} << 20;
  // Batches of one kind solved at once; a request that finds all of them busy joins the batch
  // forming behind them.
  int max_in_flight = 2;
};

class Batcher {
 public:
  using Run = std::function<absl::StatusOr<JobResult>(const Job&, const SolveControl&)>;
  // `run` solves a job (the combined one); `metrics` (may be null) observes each call's size.
  Batcher(BatchOptions options, Run run, Metrics* metrics);
  ~Batcher();

  // Tridiagonal, tree and dense jobs of flat systems (or one system), one matrix a system,
  // within the caps.
  bool Eligible(const Job& job) const;
  // Solves an eligible, validated job with whatever joins it. `cancelled` tells that its caller
  // went away (or its deadline passed): it leaves a batch still forming; once the batch runs it
  // waits for it (the batch reads its arrays), and the batch stops early only when every member
  // has gone.
  absl::StatusOr<JobResult> Solve(const Job& job, std::chrono::system_clock::time_point deadline,
                                  const std::function<bool()>& cancelled);

 private:
  struct Member;
  struct Batch;
  // What must match for two jobs to be solved in one call.
  using Key = std::tuple<int, int, int64_t, int, bool, uint64_t>;
  struct Lane {
    std::deque<std::shared_ptr<Batch>> forming;
    int running = 0;
  };
  static Key KeyOf(const Job& job);
  bool Fits(const Batch& b, const Job& job) const;
  void Execute(Batch& b);
  absl::StatusOr<JobResult> Extract(const Batch& b, const Member& m) const;

  const BatchOptions options_;
  const Run run_;
  Metrics* const metrics_;
  std::mutex mu_;
  std::map<Key, Lane> lanes_;
};

// The normwise backward error of a job's answer x (direct families; NaN for the block family).
double JobBackwardError(const Job& job, const void* x, const SystemStatus* status);

}  // namespace trisolve::server
