// One interface, several backends (the Ginkgo way): the CPU reference runs everywhere, the
// CUDA backend plugs in behind the same calls. The server sees only this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/dense.h"
#include "trisolve/tree.h"
#include "trisolve/tridiagonal.h"
#include "trisolve/types.h"

namespace trisolve {

struct DeviceInfo {
  std::string name;
  int64_t total_memory_bytes = 0;
  int64_t free_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessors = 0;
};

struct BackendInfo {
  std::string name;  // "cpu" or "cuda"
  int threads = 0;   // CPU threads the reference backend uses
  std::vector<DeviceInfo> devices;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendInfo Info() const = 0;

  // Each call solves one request. Inputs were validated by the caller (shapes, finiteness,
  // parent arrays); a vanishing pivot is reported in out.status, never as an error.
  virtual absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p,
                                          TridiagonalMethod m, TridiagonalOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p,
                                          TridiagonalMethod m, TridiagonalOutput<float> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                          TreeOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m,
                                          TreeOutput<float> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p,
                                          BlockMethod m, const BlockOptions& options,
                                          BlockOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p,
                                          BlockMethod m, const BlockOptions& options,
                                          BlockOutput<float> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                          DenseOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                          DenseOutput<float> out,
                                          const SolveControl& control) = 0;
};

// The CPU reference backend; threads <= 0 means one per hardware thread.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);

// The CUDA backend on `device`; UNAVAILABLE when built without CUDA or when no device is
// present (the message says which).
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device = 0);
bool CudaBackendCompiledIn();

}  // namespace trisolve
