// Batched tridiagonal systems: row k of system s reads
//   a[k] x[k-1] + b[k] x[k] + c[k] x[k+1] = d[k]   (a[0] and c[n-1] are not used).
#pragma once

#include "absl/strings/string_view.h"
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "trisolve/types.h"

namespace trisolve {

// kPartitioned: chunks of rows reduced by the modified Thomas algorithm (Laszlo, Giles &
// Appleyard 2016) to a system of two rows per chunk, solved, then substituted back -- the
// CUDA backend's main kernel; the CPU reference runs its sequential form.
// kPivoting: Gaussian elimination with partial pivoting, LAPACK dgtsv's algorithm (a row
// interchange gives U a second superdiagonal): stable for every nonsingular matrix, SINGULAR
// only where a pivot is exactly zero or not finite after pivoting. The CUDA backend runs it on
// the host for now ("pivoting (host)").
// kAuto (CPU): Thomas, with every system whose pivot vanished or whose elimination grew
// (|a_k c'_{k-1}| > kThomasGrowthLimit times the row's |a| + |b| + |c|: Thomas' backward error
// is bounded by about eps times that growth) solved again by pivoting; the method string says
// how many ("thomas + pivoting (3 systems)").
enum class TridiagonalMethod : uint8_t { kAuto, kThomas, kPcr, kPartitioned, kPivoting };
constexpr double kThomasGrowthLimit = 4.0;
absl::StatusOr<TridiagonalMethod> ParseTridiagonalMethod(absl::string_view name);
absl::string_view MethodName(TridiagonalMethod m);

template <typename T>
struct TridiagonalProblem {
  int64_t batch = 0;
  int64_t n = 0;
  Layout layout = Layout::kFlat;
  const T* a = nullptr;
  const T* b = nullptr;
  const T* c = nullptr;
  const T* d = nullptr;
};

template <typename T>
struct TridiagonalOutput {
  T* x = nullptr;                  // batch * n, same layout as the problem
  SystemStatus* status = nullptr;  // batch
};

// Largest normwise backward error over the systems whose status is kOk:
//   max_s ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf), computed from the original
// arrays in double precision.
template <typename T>
double TridiagonalBackwardError(const TridiagonalProblem<T>& p, const T* x,
                                const SystemStatus* status);

}  // namespace trisolve
