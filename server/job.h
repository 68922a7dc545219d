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
#include "trisolve/system.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve::server {

using trisolve::Family;
using trisolve::FamilyName;

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
  bool absent = false;              // a right-hand side a CreateSystem left out: shape only
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
  // One matrix, many right-hand sides: the coefficients are one system's and the right-hand
  // side holds `batch` of them (batch = k).
  bool shared_matrix = false;
  // CreateSystem: the right-hand side may be absent (only its shape is declared).
  bool rhs_optional = false;
  int64_t unknowns() const { return batch * n; }
  int64_t total_bytes() const;
  // The system the coefficients describe (batch 1 when shared_matrix), pointing into the job.
  SystemSpec Spec() const;
  // The shapes of the coefficients (in CoefficientNames order) and of one right-hand side of
  // that system.
  std::vector<std::vector<int64_t>> CoefficientShapes() const;
  std::vector<int64_t> SystemRhsShape() const;
};

// The request forms the persistent systems take.
struct DeclareOptions {
  bool rhs_optional = false;  // CreateSystem: the right-hand side may be absent
};

// Unary form: the job borrows the request's bytes (the request must outlive the job).
absl::StatusOr<Job> JobFromRequest(const v1::TridiagonalRequest& r, const JobLimits& l,
                                   DeclareOptions o = {});
absl::StatusOr<Job> JobFromRequest(const v1::TreeRequest& r, const JobLimits& l,
                                   DeclareOptions o = {});
absl::StatusOr<Job> JobFromRequest(const v1::BlockTridiagonalRequest& r, const JobLimits& l,
                                   DeclareOptions o = {});
absl::StatusOr<Job> JobFromRequest(const v1::DenseRequest& r, const JobLimits& l,
                                   DeclareOptions o = {});
// The family request inside a CreateSystemRequest.
absl::StatusOr<Job> JobFromCreateSystem(const v1::CreateSystemRequest& r, const JobLimits& l);

// Checks `values` (the request's Array) against coefficient `name` of a system: its shape and
// byte count must be the system's, every value finite (parent: a valid tree). Returns the
// coefficient's index and the bytes to copy (aligned: `scratch` holds a copy when the message's
// bytes are not aligned for the type).
struct CheckedUpdate {
  int index = -1;
  const void* data = nullptr;
};
absl::StatusOr<CheckedUpdate> CheckUpdate(const SystemSpec& spec,
                                          const std::vector<std::vector<int64_t>>& shapes,
                                          const std::string& name, const v1::Array& values,
                                          std::string* scratch);
// Checks a right-hand side for a system: its shape is the system's right-hand-side shape, or
// that with one leading dimension k. Returns k, and the right-hand side's bytes (aligned).
struct CheckedRhs {
  int64_t k = 1;
  const void* data = nullptr;
  std::vector<int64_t> shape;
};
absl::StatusOr<CheckedRhs> CheckRhs(const SystemSpec& spec, const std::vector<int64_t>& rhs_shape,
                                    const v1::Array& rhs, const JobLimits& limits,
                                    std::string* scratch);
// A client-supplied name made safe for a message or a log line: printable ASCII, at most 64
// characters (longer ones end in "...").
std::string Sanitized(absl::string_view name);

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

// Solves k right-hand sides of a prepared system (SolveSystem, and unary jobs with one matrix
// and many right-hand sides); x in the right-hand sides' shape, k * batch statuses.
absl::StatusOr<JobResult> RunPrepared(Backend& backend, PreparedSystem& system, const void* rhs,
                                      int64_t k, Layout rhs_layout, bool skip_residual,
                                      const SolveControl& control);

}  // namespace trisolve::server
