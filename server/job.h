// A solve request in plain arrays, whichever transport brought it: translate.h turns protobuf
// into a Job (checking every field), RunJob hands it to the backend. Nothing here knows
// protobuf or CUDA.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/backend.h"
#include "trisolve/family.h"
#include "trisolve/system.h"

namespace trisolve::server {

using trisolve::Family;
using trisolve::FamilyName;

// The most points of a residual history (the proto's SolveSummary.residual_history).
inline constexpr int64_t kResidualHistoryPoints = 1024;

struct JobLimits {
  int64_t max_job_bytes = int64_t{16} << 30;
  int64_t max_job_unknowns = int64_t{1} << 31;
};

// One array of a job: its shape, its element size, and its bytes, either borrowed from the
// request message (unary calls) or owned (filled chunk by chunk in the streaming form).
struct JobArray {
  bool declared = false;  // the request gives it (or, absent, declares its shape)
  std::vector<int64_t> shape;
  int64_t elements = 0;
  int elem_bytes = 8;
  int64_t expected_bytes = 0;
  const std::byte* data = nullptr;  // valid once complete
  bool absent = false;              // a right-hand side a CreateSystem left out: shape only
  int64_t received = 0;             // streaming: bytes appended so far
  std::unique_ptr<std::byte[]> owned;
  std::string aligned_copy;  // a borrowed array that was not aligned for its type
  // In a client's device memory (a CUDA region): the backend reads it there; the host never
  // does (its checks copy it across, CheckValues' reader).
  bool on_device = false;
};

// Who reads a resolved array: the server on the host (its checks, the residual, the batcher;
// a region of device memory is then copied to the host for it), or only the backend (device
// memory passes as it is, *on_device set). kStructure: an array whose values the server and
// the backend index memory by (a tree's parent, a batch's lengths), copied into the server's
// own memory from any region before it is checked: its client can write the region at any
// time, and a value changed between the check and the solve would send the solve outside its
// arrays.
enum class RegionUse : uint8_t { kHost, kBackend, kStructure };

// Arrays that lie in a caller's registered memory (shared-memory regions, CUDA regions)
// instead of in the message: resolves a (region, offset, bytes) reference to memory the job
// reads or writes, checked against the region, and keeps the region mapped while the resolver
// lives.
class RegionResolver {
 public:
  virtual ~RegionResolver() = default;
  // `field` names the array in errors; `bytes` is the client's count (0: expected_bytes);
  // offset must be a multiple of `align`. *on_device (when given): the memory returned is a
  // client's device memory (only with RegionUse::kBackend).
  virtual absl::StatusOr<std::byte*> Resolve(absl::string_view field, const std::string& region,
                                             int64_t offset, int64_t bytes,
                                             int64_t expected_bytes, int align, RegionUse use,
                                             bool* on_device) = 0;
};

// A reference to bytes in a caller's registered memory, as a request names them.
struct RegionRef {
  std::string region;
  int64_t offset = 0;
  int64_t bytes = 0;  // 0: the size the shape gives
};

// Resolves `ref` for `expected_bytes` at `align` (null `regions`: refused, naming `field`).
absl::StatusOr<std::byte*> ResolveRegionRef(absl::string_view field, const RegionRef& ref,
                                            int64_t expected_bytes, int align,
                                            RegionResolver* regions,
                                            RegionUse use = RegionUse::kHost,
                                            bool* on_device = nullptr);

struct Job {
  Family family = Family::kTridiagonal;
  Precision precision = Precision::kFloat64;
  Layout layout = Layout::kFlat;
  uint8_t method = 0;  // the family's method enum, parsed where the request was translated
  int64_t batch = 1;   // systems (block-tridiagonal: 1)
  int64_t n = 0;       // unknowns per system (block-tridiagonal: N * M)
  int64_t block_N = 0, block_M = 0;
  bool parent_per_system = false;
  bool skip_residual = false;
  BlockOptions block_options;
  // Block-tridiagonal: the residual history's most points (SolveControl::history_limit; 0: none).
  int64_t history_limit = 0;
  // By the family's slots (FamilyDescriptor::arrays); those the request did not give are not
  // declared.
  std::array<JobArray, kMaxArrays> arrays;
  // One matrix, many right-hand sides: the coefficients are one system's and the right-hand
  // side holds `batch` of them (batch = k).
  bool shared_matrix = false;
  // CreateSystem: the right-hand side may be absent (only its shape is declared).
  bool rhs_optional = false;
  // Where x goes when the caller asked for it in its own memory (x_region); else JobResult.x.
  std::byte* x_out = nullptr;
  // false: a large job's values were not yet checked for NaN and Inf (DeclareOptions::
  // defer_finite); the core has the backend check them on the device, or checks them itself.
  bool values_checked = true;
  // Tridiagonal systems or tree cells of different sizes (TridiagonalRequest.lengths,
  // TreeRequest.lengths; int32 "lengths"): the arrays are the systems concatenated, batch the
  // systems, n their total.
  bool variable = false;
  // Tridiagonal coefficients in the unified-vector layout (TridiagonalRequest.abc, array "abc":
  // a, b, c of a row together) instead of arrays a, b, c.
  bool unified = false;
  const FamilyDescriptor& descriptor() const { return Describe(family); }
  absl::string_view method_name() const { return descriptor().method_name(method); }
  // The right-hand side, whose shape x takes.
  const JobArray& rhs() const { return arrays[size_t(descriptor().rhs_slot)]; }
  // A declared array by its canonical name or alias; null if the job has none.
  const JobArray* Find(absl::string_view name) const;
  // Arrays may stay in a client's device memory (the unary calls: every host read of them is
  // avoided); otherwise a CUDA region's bytes are copied to the host as they are resolved.
  bool device_regions_ok = false;
  bool x_on_device = false;  // x_out is a client's device memory
  // Some array or x lies in a client's device memory: the job's values are checked on the
  // device, it is not batched, and no residual is computed on the host.
  bool device_arrays() const { return x_on_device || inputs_on_device(); }
  bool inputs_on_device() const {
    for (const JobArray& a : arrays)
      if (a.declared && a.on_device) return true;
    return false;
  }
  int64_t unknowns() const { return variable ? n : batch * n; }
  int64_t total_bytes() const;
  // The system the coefficients describe (batch 1 when shared_matrix), pointing into the job.
  SystemSpec Spec() const;
  // The arrays a one-shot solve of the job adds to Spec() (y0, lengths, abc).
  OneShotArrays Extra() const;
  // The shapes of the coefficients (in CoefficientNames order) and of one right-hand side of
  // that system.
  std::vector<std::vector<int64_t>> CoefficientShapes() const;
  std::vector<int64_t> SystemRhsShape() const;
};


// The checks every job passes, whatever brought it: the limits on its size, and its contents
// once every byte is there (finite values, a valid tree, symmetry where the method needs it).
absl::Status CheckLimits(const Job& job, const JobLimits& l);
absl::Status CheckContents(const Job& job);  // CheckValues, then CheckStructure
// Copies bytes of a client's device memory to the host (Backend::CopyFromDevice).
using DeviceReader = std::function<absl::Status(void* host, const void* device, int64_t bytes)>;
// Every value finite (the arrays but parent). Arrays in device memory are read through
// `device` (copied to the host), skipped without one.
absl::Status CheckValues(const Job& job, const DeviceReader& device = nullptr);
// What must hold before any solve reads the arrays: parent arrays that are trees (an index out
// of range would be read), symmetry where the method needs it.
absl::Status CheckStructure(const Job& job);
std::string ShapeStr(const std::vector<int64_t>& shape);

// An array as a transport hands it over: its shape and its bytes, aligned for any element type.
struct ArrayIn {
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t bytes = 0;
  bool on_device = false;  // a client's device memory (RegionUse::kBackend only)
};

// An array as a request names it, before its region (if any) is resolved: its bytes in the
// message (aligned for any element type) or a reference into the caller's registered memory.
struct ArrayArg {
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t bytes = 0;
  bool in_region = false;
  RegionRef region;
  absl::Status error;  // a malformed array, reported where it is read
};
// The array as the checks take it: a region resolved through `regions` (null: refused), its
// size taken from its shape at `elem_bytes` a value; `field` names it in errors.
absl::StatusOr<ArrayIn> ResolveArray(const ArrayArg& a, RegionResolver* regions,
                                     absl::string_view field, int elem_bytes,
                                     RegionUse use = RegionUse::kHost);

// Checks `values` against coefficient `name` of a system: its shape and byte count must be the
// system's, every value finite (parent: a valid tree). Returns the coefficient's index and the
// bytes to copy.
struct CheckedUpdate {
  int index = -1;
  const void* data = nullptr;
};
absl::StatusOr<CheckedUpdate> CheckUpdate(const SystemSpec& spec,
                                          const std::vector<std::vector<int64_t>>& shapes,
                                          const std::string& name, const ArrayIn& values);
// Checks a right-hand side for a system: its shape is the system's right-hand-side shape, or
// that with one leading dimension k. Returns k, and the right-hand side's bytes.
struct CheckedRhs {
  int64_t k = 1;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  // A range of the batch's systems (spec then RangeOf's): where it starts, for the messages
  // that name a bad value's system (the caller counts them in the whole batch).
  int64_t first_system = 0;
};
// check_finite false leaves its values to CheckRhsValues (or the backend's device check).
absl::StatusOr<CheckedRhs> CheckRhs(const SystemSpec& spec, const std::vector<int64_t>& rhs_shape,
                                    const ArrayIn& rhs, const JobLimits& limits,
                                    bool check_finite = true);
// (device: reads a right-hand side in device memory, as CheckValues'.)
absl::Status CheckRhsValues(const SystemSpec& spec, const CheckedRhs& rhs, bool on_device = false,
                            const DeviceReader& device = nullptr);
// Below this many bytes of arrays the host checks every value as the request arrives; above
// it, where the backend can check them on the device (BackendInfo::checks_finite), it does so
// there, after the copy in, at no measurable cost (a 2^24-unknown system's four arrays: a
// pass of several milliseconds on the host).
inline constexpr int64_t kDeviceCheckBytes = int64_t{1} << 20;
// After a solve that ran with SolveControl::check_finite: the precise INVALID_ARGUMENT where
// the backend found a NaN or an Inf (made by `check`, the host's pass), or where the backend
// checked nothing (info.inputs_checked false: its host paths) and `check` finds one.
absl::Status AfterDeviceCheck(const absl::Status& solved, bool inputs_checked,
                              const std::function<absl::Status()>& check);
// A client-supplied name made safe for a message or a log line: printable ASCII, at most 64
// characters (longer ones end in "...").
std::string Sanitized(absl::string_view name);

struct JobResult {
  // Bytes, the job's precision, the right-hand side's shape and layout; empty where x was
  // written into the caller's memory (Job::x_out, RunPrepared's x_out).
  std::string x;
  std::vector<SystemStatus> status;
  SolveInfo info;
  double backward_error = 0;  // direct methods (NaN when skipped)
  double compute_us = 0;
  double residual_us = 0;
  // Dynamic batching: the requests solved in the same backend call as this one (1: alone), and
  // the systems of that call.
  int batched_with = 1;
  int64_t batch_systems = 0;
};

absl::StatusOr<JobResult> RunJob(Backend& backend, const Job& job,
                                 const SolveControl& control);

// Solves k right-hand sides of a prepared system (SolveSystem, and unary jobs with one matrix
// and many right-hand sides); x in the right-hand sides' shape, k * batch statuses.
// A range of the batch's systems (RhsBlock::first_system, systems; systems 0: all).
struct SystemRange {
  int64_t first = 0, systems = 0;
};
absl::StatusOr<JobResult> RunPrepared(Backend& backend, PreparedSystem& system, const void* rhs,
                                      int64_t k, Layout rhs_layout, bool skip_residual,
                                      const SolveControl& control, void* x_out = nullptr,
                                      SystemRange range = {});

}  // namespace trisolve::server
