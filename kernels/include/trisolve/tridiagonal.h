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
  // A batch of systems of different sizes (layout kFlat, the arrays concatenated): system s is
  // rows offsets[s] .. offsets[s + 1] - 1, offsets[0] = 0, batch + 1 host values, every
  // system at least one row; n is then the longest system's size. nullptr: every system has n
  // rows. Backends that cannot take such a batch in one call solve it system by system.
  const int64_t* offsets = nullptr;
  // The unified-vector layout of the cuThomasBatch notes (layout kFlat): a, b, c of a row
  // stored together in one array abc, [batch, n, 3] (or the rows of a variable-size batch,
  // [total, 3]): a = abc, b = abc + 1, c = abc + 2 and coef_stride = 3, the coefficients of
  // the row whose d is d[i] at a[i * coef_stride]. 1: a, b, c are arrays of their own.
  int64_t coef_stride = 1;

  bool variable() const { return offsets != nullptr; }
  bool unified() const { return coef_stride != 1; }
  int64_t unknowns() const { return offsets != nullptr ? offsets[batch] : batch * n; }
  // Rows of system s and the index of its first element (flat: s * n; interleaved: s).
  int64_t rows(int64_t s) const { return offsets != nullptr ? offsets[s + 1] - offsets[s] : n; }
  int64_t first(int64_t s) const {
    return offsets != nullptr ? offsets[s] : SystemOffset(layout, n, s);
  }
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
