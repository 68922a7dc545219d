// The CPU reference's step kernels for the block family's Krylov iterations
// (trisolve/driver/block_krylov.h: driver::Cg, driver::Bicgstab), as Ginkgo keeps a backend's
// kernels apart from the solver written once. Internal to cpu/ (block_tridiagonal.cc); the CUDA
// backend's are cuda/block/krylov.cu's DeviceSteps.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "block_multigrid.h"
#include "common.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/driver/block_krylov.h"
#include "trisolve/reference/tridiagonal.h"

namespace trisolve::cpu {

// q = A v (double accumulation, stored in T).
template <typename T>
void ApplyBlock(const BlockTridiagonalProblem<T>& p, const T* v, T* q) {
  const int64_t N = p.N, M = p.M;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      double s = double(p.cC[e]) * v[e];
      if (k > 0) s += double(p.aC[e]) * v[e - 1];
      if (k + 1 < M) s += double(p.bC[e]) * v[e + 1];
      if (i > 0) s += double(p.cA[e]) * v[e - M];
      if (i + 1 < N) s += double(p.cB[e]) * v[e + M];
      q[e] = T(s);
    }
}

template <typename T>
double Dot(int64_t n, const T* a, const T* b) {
  return OrderedSum<1>(n, 16384, [&](int64_t e, std::array<double, 1>& s) {
    s[0] += double(a[e]) * b[e];
  })[0];
}

// The preconditioners of the Krylov methods: the multigrid V-cycle (multigrid-cg,
// multigrid-bicgstab), the line solves C_i z_i = r_i (Thomas, every block row independently:
// cg, and bicgstab+lines for systems whose coarse levels are not fit for the point smoother) or
// nothing (bicgstab).
enum class Precond { kVCycle, kLines, kNone };
inline const char* BicgstabName(Precond k) {
  return k == Precond::kVCycle ? "multigrid-bicgstab"
         : k == Precond::kLines ? "bicgstab+lines"
                                : "bicgstab";
}

// The line solves' factors: Thomas' elimination of every C_i with ThomasStrided's arithmetic
// (the pivots' reciprocals and the normalised super-diagonals), so that applying the line
// preconditioner is the two substitutions alone and gives ThomasStrided's x bit for bit.
template <typename T>
struct LineFactors {
  std::vector<T> inv, cp;
};

// False where a pivot vanishes (ThomasStrided fails there for every right-hand side; the
// caller then keeps no factors and the solves run ThomasStrided, as without them).
template <typename T>
bool FactorLines(const BlockTridiagonalProblem<T>& p, LineFactors<T>& f) {
  const int64_t N = p.N, M = p.M;
  f.inv.resize(size_t(N * M));
  f.cp.resize(size_t(N * M));
  bool vanished = false;
#pragma omp parallel for schedule(static) reduction(|| : vanished)
  for (int64_t i = 0; i < N; ++i) {
    const T *a = p.aC + i * M, *b = p.cC + i * M, *c = p.bC + i * M;
    T *inv = f.inv.data() + i * M, *cp = f.cp.data() + i * M;
    if (PivotVanishes(b[0], std::abs(b[0]))) {
      vanished = true;
      continue;
    }
    inv[0] = T(1) / b[0];
    cp[0] = M > 1 ? c[0] * inv[0] : T(0);
    for (int64_t k = 1; k < M; ++k) {
      const T ac = a[k] * cp[k - 1];
      const T gamma = b[k] - ac;
      if (PivotVanishes(gamma, std::abs(b[k]) + std::abs(ac))) {
        vanished = true;
        break;
      }
      inv[k] = T(1) / gamma;
      cp[k] = k + 1 < M ? c[k] * inv[k] : T(0);
    }
  }
  return !vanished;
}

// Line i's solve from its factors; false where x is not finite (as ThomasStrided).
template <typename T>
bool SolveFactoredLine(int64_t M, const T* a, const T* inv, const T* cp, const T* d, T* x) {
  x[0] = d[0] * inv[0];
  for (int64_t k = 1; k < M; ++k) x[k] = (d[k] - a[k] * x[k - 1]) * inv[k];
  for (int64_t k = M - 2; k >= 0; --k) x[k] -= cp[k] * x[k + 1];
  return AllFinite(M, 1, x);
}

// The CPU reference's step kernels for driver::Cg and driver::Bicgstab
// (trisolve/driver/block_krylov.h): OpenMP loops, dots summed in a fixed order (Dot).
// lines: the line solves' factors where they were kept (kLines), else each application
// eliminates every line again.
template <typename T>
class CpuSteps {
 public:
  CpuSteps(const BlockTridiagonalProblem<T>& p, Precond kind,
           const std::vector<MgLevel<T>>* levels, const LineFactors<T>* lines = nullptr)
      : p_(p), size_(p.N * p.M), kind_(kind), levels_(levels), lines_(lines) {
    if (levels) tmp_.resize(2 * levels->size());
  }
  const T* rhs() const { return p_.f; }
  absl::Status Residual(const T* y, T* r) {
    ApplyBlock(p_, y, r);
    for (int64_t e = 0; e < size_; ++e) r[e] = p_.f[e] - r[e];
    return absl::OkStatus();
  }
  absl::Status Apply(const T* v, T* out) {
    ApplyBlock(p_, v, out);
    return absl::OkStatus();
  }
  absl::StatusOr<std::array<double, 2>> Dots(const T* u, const T* v, const T* w, const T* x) {
    return std::array<double, 2>{Dot(size_, u, v), w ? Dot(size_, w, x) : 0.0};
  }
  absl::StatusOr<bool> Precondition(const T* in, T* out) {
    if (kind_ == Precond::kVCycle) {
      VCycle(*levels_, 0, in, out, tmp_);
      return true;
    }
    if (kind_ == Precond::kNone) {
      std::copy(in, in + size_, out);
      return true;
    }
    const int64_t N = p_.N, M = p_.M;
    bool failed = false;
    if (lines_) {
#pragma omp parallel for schedule(static) reduction(|| : failed)
      for (int64_t i = 0; i < N; ++i)
        if (!SolveFactoredLine(M, p_.aC + i * M, lines_->inv.data() + i * M,
                               lines_->cp.data() + i * M, in + i * M, out + i * M))
          failed = true;
      return !failed;
    }
#pragma omp parallel reduction(|| : failed)
    {
      std::vector<T> work(M);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < N; ++i)
        if (!ThomasStrided<T>(M, 1, p_.aC + i * M, p_.cC + i * M, p_.bC + i * M, in + i * M,
                              out + i * M, work.data()))
          failed = true;
    }
    return !failed;
  }
  absl::Status Copy(const T* src, T* dst) {
    std::copy(src, src + size_, dst);
    return absl::OkStatus();
  }
  absl::Status Zero(T* v) {
    std::fill(v, v + size_, T(0));
    return absl::OkStatus();
  }
  absl::Status CgStep(T alpha, const T* d, const T* q, T* y, T* r) {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size_; ++e) {
      y[e] += alpha * d[e];
      r[e] -= alpha * q[e];
    }
    return absl::OkStatus();
  }
  absl::Status CgDirection(T beta, const T* z, T* d) {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size_; ++e) d[e] = z[e] + beta * d[e];
    return absl::OkStatus();
  }
  absl::Status BicgstabDirection(T beta, T omega, const T* r, const T* v, T* p) {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size_; ++e) p[e] = r[e] + beta * (p[e] - omega * v[e]);
    return absl::OkStatus();
  }
  absl::Status BicgstabStep(T a, const T* u, const T* in, const T* w, T* y, T* out) {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < size_; ++e) {
      y[e] += a * u[e];
      out[e] = in[e] - a * w[e];
    }
    return absl::OkStatus();
  }
  absl::StatusOr<driver::FinalResidual> Final(const T* y) {
    return driver::FinalResidual{BlockRelativeResidual(p_, y), false, AllFinite(size_, 1, y)};
  }

 private:
  const BlockTridiagonalProblem<T>& p_;
  int64_t size_;
  Precond kind_;
  const std::vector<MgLevel<T>>* levels_;
  const LineFactors<T>* lines_;
  std::vector<std::vector<T>> tmp_;  // the V-cycle's coarse vectors
};

}  // namespace trisolve::cpu
