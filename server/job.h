// A solve request in plain arrays, whichever RPC brought it: the RPC layer turns protobuf
// into a Job (checking every field), RunJob hands it to the backend. Nothing here knows CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/backend.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve::server {

enum class Family { kTridiagonal, kTree, kBlockTridiagonal, kDense };
absl::string_view FamilyName(Family f);

struct JobLimits {
  int64_t max_job_bytes = int64_t{16} << 30;
  int64_t max_job_unknowns = int64_t{1} << 31;
};

// One named array of a job: its shape, its element size, and its bytes, either borrowed from
// the request message (unary calls) or owned (filled chunk by chunk in the streaming form).
struct JobArray {
  std::vector<int64_t> shape;
  int64_t elements = 0;
  int elem_bytes = 8;
  int64_t expected_bytes = 0;
  const std::byte* data = nullptr;  // valid once complete
  int64_t received = 0;             // streaming: bytes appended so far
  std::unique_ptr<std::byte[]> owned;
  std::string aligned_copy;  // a borrowed array that was not aligned for its type
};

struct Job {
  Family family = Family::kTridiagonal;
  Precision precision = Precision::kFloat64;
  Layout layout = Layout::kFlat;
  std::string method;  // as requested ("" = auto); parsed by the family
  int64_t batch = 1;   // systems (block-tridiagonal: 1)
  int64_t n = 0;       // unknowns per system (block-tridiagonal: N * M)
  int64_t block_N = 0, block_M = 0;
  bool parent_per_system = false;
  bool skip_residual = false;
  BlockOptions block_options;
  std::map<std::string, JobArray> arrays;  // by request field name
  std::string x_field;                     // the right-hand side whose shape x takes
  int64_t unknowns() const { return batch * n; }
  int64_t total_bytes() const;
};

// Unary form: the job borrows the request's bytes (the request must outlive the job).
absl::StatusOr<Job> JobFromRequest(const v1::TridiagonalRequest& r, const JobLimits& l);
absl::StatusOr<Job> JobFromRequest(const v1::TreeRequest& r, const JobLimits& l);
absl::StatusOr<Job> JobFromRequest(const v1::BlockTridiagonalRequest& r, const JobLimits& l);
absl::StatusOr<Job> JobFromRequest(const v1::DenseRequest& r, const JobLimits& l);

// Streaming form: the header fixes shapes and limits and allocates the arrays; chunks fill
// them in order; FinishStreamedJob checks completeness and contents.
absl::StatusOr<Job> JobFromStreamHeader(const v1::StreamRequest& header, const JobLimits& l);
absl::Status AppendChunk(Job& job, const v1::Chunk& chunk);
absl::Status FinishStreamedJob(Job& job);

struct JobResult {
  std::string x;  // bytes, the job's precision, the right-hand side's shape and layout
  std::vector<SystemStatus> status;
  SolveInfo info;
  double backward_error = 0;  // direct methods (NaN when skipped)
  double compute_us = 0;
  double residual_us = 0;
};

absl::StatusOr<JobResult> RunJob(Backend& backend, const Job& job,
                                 const SolveControl& control);

}  // namespace trisolve::server
