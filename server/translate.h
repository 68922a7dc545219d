// The gRPC transport's half of a call: protobuf requests into checked, plain Jobs (job.h) and
// the core's plain requests (core.h), and the core's answers back into protobuf.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core.h"
#include "job.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve::server {

// The request forms the persistent systems take.
struct DeclareOptions {
  bool rhs_optional = false;  // CreateSystem: the right-hand side may be absent
  // Resolves arrays given as regions of the caller's registered memory (Array.region) and
  // x_region; null: regions are refused (INVALID_ARGUMENT naming the field).
  RegionResolver* regions = nullptr;
  // A job of kDeviceCheckBytes or more leaves its values' finiteness to Core::Solve (the
  // device's check where the backend has one): Job::values_checked false. Only for jobs that
  // go to Core::Solve.
  bool defer_finite = false;
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
// The same before resolution: a region reference kept as such (the core resolves it).
absl::StatusOr<ArrayArg> ArrayArgFromProto(const v1::Array& a, std::string* scratch,
                                           absl::string_view field);
// A time step of a persistent system (SolveSystem), and the updates of UpdateSystem: a
// malformed array keeps its error in its ArrayArg, reported where the core reads it.
void StepFromProto(const v1::SolveSystemRequest& r, StepRequest* step);
void UpdatesFromProto(const google::protobuf::RepeatedPtrField<v1::NamedArray>& update,
                      StepRequest* step);

// The core's answers as messages (AnswerToProto moves x out of the answer).
void SummaryToProto(const AnswerSummary& a, v1::SolveSummary* s);
// sparse_status: the statuses in resp->sparse where at most a quarter are not OK (the request's
// sparse_status), in resp->status otherwise.
void AnswerToProto(Answer& a, v1::SolveResponse* resp, bool sparse_status = false);
void SystemInfoToProto(const SystemView& v, v1::SystemInfo* info);
void RegionToProto(const RegionInfo& r, v1::MemoryRegion* out);

// Resolves an x_region for an answer of `bytes` bytes.
absl::StatusOr<std::byte*> ResolveXRegion(const v1::RegionRef& ref, int64_t bytes, int elem_bytes,
                                          RegionResolver* regions);

}  // namespace trisolve::server
