// Conjugate gradients and BiCGStab for the block family on the device.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "block/internal.h"
#include "block/multigrid.cuh"
#include "block/vector_kernels.cuh"
#include "runtime/check.h"
#include "tridiagonal/tridiagonal.h"

namespace trisolve::cuda {
namespace {

// A method that cannot run on this matrix (CG on one that is not definite, the point smoother
// on a zero diagonal): the matrix may well be nonsingular, so never SINGULAR -- NOT_CONVERGED
// with the initial guess, its true residual, and the reason in the method string (as the CPU
// reference: "multigrid-cg (not run: ...)"). auto's caller falls back on the host.
template <typename T>
absl::StatusOr<SolveInfo> NotRun(const BlockTridiagonalProblem<T>& p, const std::string& method,
                                 const T* y, double* acc, SystemStatus* status,
                                 cudaStream_t stream) {
  const unsigned rb = unsigned(std::min<int64_t>(Blocks(p.N * p.M), kReduceBlocks));
  ResidualKernel<T><<<rb, kThreads, 0, stream>>>(p, y, acc, false);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  double h[2];
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  SolveInfo info;
  info.method = method;
  info.residual = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  *status = SystemStatus::kNotConverged;
  return info;
}

}  // namespace

// Conjugate gradients preconditioned by the line solves (one batched partitioned tridiagonal
// solve over all N block rows) or by the multigrid V-cycle, natural layout; y in: the initial
// guess, out: the iterate. A negative definite matrix (every diagonal negative, on every
// level) runs as CG on -A with -P (the CPU reference's BlockCg says why nothing is negated:
// only the definiteness tests read sign * (d, Ad) and sign * (r, z)); "(negated: negative
// definite)" in the method. Where those tests fail CG stops, "(stopped: indefinite)", status
// NOT_CONVERGED: auto's caller falls back to the CPU reference's BiCGStab.
template <typename T>
absl::StatusOr<SolveInfo> CgDevice(const BlockTridiagonalProblem<T>& p, const BlockOptions& o,
                                   T* y, SystemStatus* status, Pool& pool,
                                   const SolveControl& control, BlockMonitor& mon,
                                   cudaStream_t stream, bool multigrid) {
  const int64_t N = p.N, M = p.M, size = N * M;
  auto buf = pool.Get(kAccBytes + int64_t(sizeof(T)) * 4 * size + N + 3);
  if (!buf.ok()) return buf.status();
  auto* acc = static_cast<double*>(buf->get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, kAccBytes, stream));
  T *r = reinterpret_cast<T*>(acc + kAccBytes / 8), *z = r + size, *d = z + size, *q = d + size;
  auto* flags = reinterpret_cast<uint8_t*>(q + size);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(N) + 3, stream));
  const unsigned rb = unsigned(std::min<int64_t>(Blocks(size), kReduceBlocks));
  auto dots = [&](const T* u, const T* v, const T* w, const T* x, double* h) -> absl::Status {
    DotKernel<T><<<rb, kThreads, 0, stream>>>(size, u, v, w, x, acc);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
    return CudaStatus(cudaStreamSynchronize(stream), "CG dot");
  };
  MgHierarchy<T> mg;
  const char* name = multigrid ? "multigrid-cg" : "cg";
  int sign = 0;
  if (multigrid) {
    auto h = BuildMgDevice(p, pool, flags, stream);
    if (!h.ok()) return h.status();
    mg = std::move(*h);
    sign = mg.signs.sign;
  } else {  // the line solves: the fine diagonals' sign
    MgDiagonalCheck<T><<<Blocks(size), kThreads, 0, stream>>>(size, p.cC, flags);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    uint8_t bad[3] = {0, 0, 0};
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bad, flags, 3, cudaMemcpyDeviceToHost, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, 3, stream));
    sign = SignsOf(bad).sign;
  }
  if (sign == 0)
    return NotRun(p, std::string(name) + " (not run: not definite: diagonals of both signs)", y,
                  acc, status, stream);
  auto precondition = [&]() -> absl::Status {
    if (multigrid) return ApplyVCycle(mg, r, z, stream);
    TridiagonalProblem<T> tp{N, M, Layout::kFlat, p.aC, p.cC, p.bC, r};
    auto k = SolveTridiagonalDevice(tp, TridiagonalMethod::kPartitioned, z, flags, pool, stream);
    return k.ok() ? absl::OkStatus() : k.status();
  };
  ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, y, r, true);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (auto st = precondition(); !st.ok()) return st;
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d, z, size * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  double h[2];
  if (auto st = dots(p.f, p.f, nullptr, nullptr, h); !st.ok()) return st;
  const double scale = h[0] > 0 ? std::sqrt(h[0]) : 1;
  if (auto st = dots(r, r, r, z, h); !st.ok()) return st;
  double res = std::sqrt(h[0]) / scale, rz = h[1];
  bool indefinite = !(sign * rz > 0) && res > o.tol && res > 0;
  mon.Check(0, res);
  int64_t it = 0;
  for (; it < o.max_iterations && !indefinite; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, d, q, false);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (auto st = dots(d, q, nullptr, nullptr, h); !st.ok()) return st;
    if (!(sign * h[0] > 0) || !std::isfinite(h[0])) {  // not definite: stop
      indefinite = true;
      break;
    }
    UpdateYR<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(rz / h[0]), d, q, y, r);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (auto st = precondition(); !st.ok()) return st;
    if (auto st = dots(r, r, r, z, h); !st.ok()) return st;
    res = std::sqrt(h[0]) / scale;
    mon.Check(it + 1, res);
    if (!(sign * h[1] > 0) && res > o.tol && res > 0) {  // the preconditioner is not definite
      indefinite = true;
      ++it;
      break;
    }
    const double beta = h[1] / rz;
    rz = h[1];
    UpdateD<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(beta), z, d);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  // The true residual, from the original arrays.
  ResidualKernel<T><<<rb, kThreads, 0, stream>>>(p, y, acc, false);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  std::vector<uint8_t> hf(static_cast<size_t>(N));
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(hf.data(), flags, size_t(N), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  SolveInfo info;
  info.method = name;
  if (sign < 0) info.method += " (negated: negative definite)";
  if (indefinite) info.method += " (stopped: indefinite)";
  info.iterations = it;
  info.residual = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  bool singular = false;  // a line block's pivot vanished (cg): the line solves cannot run
  for (uint8_t v : hf) singular |= v != 0;
  if (singular)
    *status = SystemStatus::kSingular;
  else if (!std::isfinite(info.residual))
    *status = SystemStatus::kDiverged;
  else if ((o.tol > 0 || indefinite) && !(info.residual <= o.tol))
    *status = SystemStatus::kNotConverged;
  else
    *status = SystemStatus::kOk;
  return info;
}

namespace {

// p = r + beta (p - omega v).
template <typename T>
__global__ void BicgP(int64_t n, T beta, T omega, const T* __restrict__ r, const T* __restrict__ v,
                      T* __restrict__ p) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) p[e] = r[e] + beta * (p[e] - omega * v[e]);
}
// y += a u; out = in - a w.
template <typename T>
__global__ void BicgUpdate(int64_t n, T a, const T* __restrict__ u, const T* __restrict__ in,
                           const T* __restrict__ w, T* __restrict__ y, T* __restrict__ out) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  y[e] += a * u[e];
  out[e] = in[e] - a * w[e];
}

}  // namespace

// BiCGStab right-preconditioned by the V-cycle (the CPU reference's BlockBicgstab, step for
// step), natural layout; y in: the initial guess, out: the iterate. Any sign of diagonal: the
// point smoother needs only nonzero ones.
template <typename T>
absl::StatusOr<SolveInfo> BicgstabDevice(const BlockTridiagonalProblem<T>& p,
                                         const BlockOptions& o, T* y, SystemStatus* status,
                                         Pool& pool, const SolveControl& control,
                                         BlockMonitor& mon, cudaStream_t stream) {
  const int64_t N = p.N, M = p.M, size = N * M;
  // r, r0, p, v, y-hat, s, z, t; the levels in their own buffer.
  auto buf = pool.Get(kAccBytes + int64_t(sizeof(T)) * 8 * size + 16);
  if (!buf.ok()) return buf.status();
  auto* acc = static_cast<double*>(buf->get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, kAccBytes, stream));
  T* r = reinterpret_cast<T*>(acc + kAccBytes / 8);
  T *r0 = r + size, *pv = r0 + size, *v = pv + size, *yh = v + size, *sv = yh + size,
    *zv = sv + size, *tv = zv + size;
  auto* flag = reinterpret_cast<uint8_t*>(tv + size);
  auto mg = BuildMgDevice(p, pool, flag, stream);
  if (!mg.ok()) return mg.status();
  if (!mg->signs.nonzero)
    return NotRun(p, "multigrid-bicgstab (not run: a zero diagonal on a multigrid level)", y,
                  acc, status, stream);
  const unsigned rb = unsigned(std::min<int64_t>(Blocks(size), kReduceBlocks));
  double h[2];
  auto dots = [&](const T* u, const T* w, const T* u2, const T* w2) -> absl::Status {
    DotKernel<T><<<rb, kThreads, 0, stream>>>(size, u, w, u2, w2, acc);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
    return CudaStatus(cudaStreamSynchronize(stream), "BiCGStab dot");
  };
  auto precondition = [&](const T* in, T* out) { return ApplyVCycle(*mg, in, out, stream); };
  ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, y, r, true);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(r0, r, size * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pv, 0, size * sizeof(T), stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v, 0, size * sizeof(T), stream));
  if (auto st = dots(p.f, p.f, r, r); !st.ok()) return st;
  const double scale = h[0] > 0 ? std::sqrt(h[0]) : 1;
  double res = std::sqrt(h[1]) / scale;
  SolveInfo info;
  info.method = "multigrid-bicgstab";
  double rho = 1, alpha = 1, omega = 1;
  mon.Check(0, res);
  int64_t it = 0;
  for (; it < o.max_iterations; ++it) {
    if (res <= o.tol) break;
    if (control.Cancelled()) return absl::CancelledError("solve cancelled");
    if (auto st = dots(r0, r, nullptr, nullptr); !st.ok()) return st;
    const double rho_new = h[0];
    if (rho_new == 0 || !std::isfinite(rho_new)) break;
    const double beta = (rho_new / rho) * (alpha / omega);
    BicgP<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(beta), T(omega), r, v, pv);
    if (auto st = precondition(pv, yh); !st.ok()) return st;
    ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, yh, v, false);
    if (auto st = dots(r0, v, nullptr, nullptr); !st.ok()) return st;
    if (h[0] == 0 || !std::isfinite(h[0])) break;
    alpha = rho_new / h[0];
    BicgUpdate<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(alpha), yh, r, v, y, sv);
    if (auto st = dots(sv, sv, nullptr, nullptr); !st.ok()) return st;
    res = std::sqrt(h[0]) / scale;
    if (res <= o.tol) {
      ++it;
      mon.Check(it, res);
      break;
    }
    if (auto st = precondition(sv, zv); !st.ok()) return st;
    ApplyKernel<T><<<Blocks(size), kThreads, 0, stream>>>(p, zv, tv, false);
    if (auto st = dots(tv, tv, tv, sv); !st.ok()) return st;
    omega = h[0] > 0 ? h[1] / h[0] : 0;
    BicgUpdate<T><<<Blocks(size), kThreads, 0, stream>>>(size, T(omega), zv, sv, tv, y, r);
    if (auto st = dots(r, r, nullptr, nullptr); !st.ok()) return st;
    res = std::sqrt(h[0]) / scale;
    mon.Check(it + 1, res);
    rho = rho_new;
    if (omega == 0 || !std::isfinite(omega)) {
      ++it;
      break;
    }
  }
  ResidualKernel<T><<<rb, kThreads, 0, stream>>>(p, y, acc, false);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(h, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  info.iterations = it;
  info.residual = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  if (!std::isfinite(info.residual))
    *status = SystemStatus::kDiverged;
  else if (o.tol > 0 && info.residual > o.tol)
    *status = SystemStatus::kNotConverged;
  else
    *status = SystemStatus::kOk;
  return info;
}



template absl::StatusOr<SolveInfo> CgDevice(const BlockTridiagonalProblem<double>&,
                                            const BlockOptions&, double*, SystemStatus*, Pool&,
                                            const SolveControl&, BlockMonitor&, cudaStream_t,
                                            bool);
template absl::StatusOr<SolveInfo> CgDevice(const BlockTridiagonalProblem<float>&,
                                            const BlockOptions&, float*, SystemStatus*, Pool&,
                                            const SolveControl&, BlockMonitor&, cudaStream_t,
                                            bool);
template absl::StatusOr<SolveInfo> BicgstabDevice(const BlockTridiagonalProblem<double>&,
                                                  const BlockOptions&, double*, SystemStatus*,
                                                  Pool&, const SolveControl&, BlockMonitor&,
                                                  cudaStream_t);
template absl::StatusOr<SolveInfo> BicgstabDevice(const BlockTridiagonalProblem<float>&,
                                                  const BlockOptions&, float*, SystemStatus*,
                                                  Pool&, const SolveControl&, BlockMonitor&,
                                                  cudaStream_t);

}  // namespace trisolve::cuda
