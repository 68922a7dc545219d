// Batches of dense systems A x = b: A is batch x n x n (row-major), b is batch x n.
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "trisolve/types.h"

namespace trisolve {

// kLu: LU with partial pivoting (getrf/getrs), what `auto` runs on the GPU for n > 64, where
// Gauss-Jordan's 1.5 times the flops of LU buys nothing.
enum class DenseMethod : uint8_t { kAuto, kGaussJordan, kHouseholderPcr, kLu };
absl::StatusOr<DenseMethod> ParseDenseMethod(absl::string_view name);
absl::string_view MethodName(DenseMethod m);

template <typename T>
struct DenseProblem {
  int64_t batch = 0;
  int64_t n = 0;
  const T* A = nullptr;
  const T* b = nullptr;
};

template <typename T>
struct DenseOutput {
  T* x = nullptr;
  SystemStatus* status = nullptr;
};

// Whether every matrix of the batch is symmetric to rounding: |A_ij - A_ji| <= 64 eps max|A|.
// Returns the first system that is not, or -1.
template <typename T>
int64_t FirstNonSymmetric(const DenseProblem<T>& p);

// max_s ||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf) over systems with status kOk.
template <typename T>
double DenseBackwardError(const DenseProblem<T>& p, const T* x, const SystemStatus* status);

}  // namespace trisolve
