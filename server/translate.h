// The gRPC transport's half of a job: protobuf requests into checked, plain Jobs (job.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "job.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve::server {

// The request forms the persistent systems take.
struct DeclareOptions {
  bool rhs_optional = false;  // CreateSystem: the right-hand side may be absent
  // Resolves arrays given as regions of the caller's registered memory (Array.region) and
  // x_region; null: regions are refused (INVALID_ARGUMENT naming the field).
  RegionResolver* regions = nullptr;
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
absl::StatusOr<Job> JobFromCreateSystem(const v1::CreateSystemRequest& r, const JobLimits& l,
                                        RegionResolver* regions = nullptr);

// Streaming form: the header fixes shapes and limits and allocates the arrays; chunks fill
// them in order; FinishStreamedJob checks completeness and contents.
absl::StatusOr<Job> JobFromStreamHeader(const v1::StreamRequest& header, const JobLimits& l);
absl::Status AppendChunk(Job& job, const v1::Chunk& chunk);
absl::Status FinishStreamedJob(Job& job);

// A message's array as the checks take it (`scratch` holds a copy where the bytes are not
// aligned; it must outlive the result). An array in a region is resolved through `regions`
// (null: refused), its size taken from its shape at `elem_bytes` a value.
absl::StatusOr<ArrayIn> ArrayFromProto(const v1::Array& a, std::string* scratch,
                                       RegionResolver* regions, absl::string_view field,
                                       int elem_bytes);
// Resolves an x_region for an answer of `bytes` bytes.
absl::StatusOr<std::byte*> ResolveXRegion(const v1::RegionRef& ref, int64_t bytes, int elem_bytes,
                                          RegionResolver* regions);

}  // namespace trisolve::server
