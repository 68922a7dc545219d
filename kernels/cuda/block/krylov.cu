// Conjugate gradients and BiCGStab for the block family on the device: the device's step
// kernels for the iterations written once in trisolve/driver/block_krylov.h, and the setup each
// method needs first (its buffers, the multigrid hierarchy, the diagonals' sign).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "block/block.h"
#include "block/internal.h"
#include "block/multigrid.cuh"
#include "block/vector_kernels.cuh"
#include "runtime/check.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/driver/block_krylov.h"

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

std::atomic<uint8_t> block_launches{uint8_t(BlockLaunches::kDefault)};
std::atomic<int64_t> vcycle_graph_launches{0};
std::atomic<int64_t> vcycle_graph_captures{0};

bool GraphsFromEnv() {
  static const bool graphs = [] {
    const char* v = std::getenv("TRISOLVE_BLOCK_GRAPHS");
    return !(v != nullptr && std::atoi(v) == 0);
  }();
  return graphs;
}

// The V-cycle of one (in, out) pair as an executable graph (CaptureVCycle).
template <typename T>
struct PairGraph {
  const T* in;
  T* out;
  cudaGraphExec_t exec;
};

// What a Krylov solve works in besides y: one buffer (GridSum2's scratch, the method's vectors,
// the flags), for the V-cycle the hierarchy with coarse vectors of the work's own, and the
// V-cycle's graphs over those vectors. A prepared system keeps one for its next solve
// (BlockDeviceSetup::spare), so that a solve by handle after the first allocates and captures
// nothing.
template <typename T>
struct KrylovWork {
  explicit KrylovWork(BlockMethod m) : method(m) {}
  ~KrylovWork() {
    // (an executable graph still running is freed when it completes)
    for (const PairGraph<T>& g : graphs) cudaGraphExecDestroy(g.exec);
  }
  KrylovWork(const KrylovWork&) = delete;
  KrylovWork& operator=(const KrylovWork&) = delete;
  BlockMethod method;  // the layout of buf: multigrid-bicgstab's, else CG's
  Pool::Buffer buf;
  MgHierarchy<T> mg;
  std::vector<PairGraph<T>> graphs;
};

// The bytes of a work's buffer: kAccBytes, then r, z, d, q and N + 3 flag bytes (CG), or r, r0,
// p, v, y-hat, s, z, t and 16 (BiCGStab).
template <typename T>
int64_t WorkBytes(BlockMethod m, int64_t N, int64_t M) {
  const int64_t size = N * M;
  return m == BlockMethod::kMultigridBicgstab ? kAccBytes + int64_t(sizeof(T)) * 8 * size + 16
                                              : kAccBytes + int64_t(sizeof(T)) * 4 * size + N + 3;
}

template <typename T>
absl::StatusOr<std::unique_ptr<KrylovWork<T>>> NewWork(BlockMethod m, int64_t N, int64_t M,
                                                       Pool& pool) {
  auto w = std::make_unique<KrylovWork<T>>(m);
  auto buf = pool.Get(WorkBytes<T>(m, N, M));
  if (!buf.ok()) return buf.status();
  w->buf = std::move(*buf);
  return w;
}

// The step kernels of driver::Cg and driver::Bicgstab on the device, natural layout: one
// launch a step, the dots two at a time into acc (GridSum2's scratch) and read back with one
// wait. The preconditioner: the V-cycle of `mg`, else the line solves (one batched partitioned
// tridiagonal solve over all N block rows, its vanished pivots flagged in flags[0..N)).
// With graphs the V-cycle of each (in, out) pair the driver applies it to (CG: (r, z); BiCGStab:
// (p, y-hat) and (s, z)) is captured at the pair's first application and replayed by one
// cudaGraphLaunch after that; the graphs (in `graphs`, the work's) name the work's vectors, its
// coarse ones included, so they live and die with the work: two solves at once never share one.
template <typename T>
class DeviceSteps {
 public:
  DeviceSteps(const BlockTridiagonalProblem<T>& p, double* acc, uint8_t* flags,
              MgHierarchy<T>* mg, std::vector<PairGraph<T>>* graphs, Pool& pool,
              cudaStream_t stream)
      : p_(p), size_(p.N * p.M), acc_(acc), flags_(flags), mg_(mg), pool_(pool),
        stream_(stream), blocks_(Blocks(size_)),
        reduce_blocks_(unsigned(std::min<int64_t>(Blocks(size_), kReduceBlocks))),
        graphs_(mg != nullptr && BlockGraphsOn()), pairs_(graphs) {}
  const T* rhs() const { return p_.f; }
  absl::Status Residual(const T* y, T* r) {
    ApplyKernel<T><<<blocks_, kThreads, 0, stream_>>>(p_, y, r, true);
    return Launched();
  }
  absl::Status Apply(const T* v, T* out) {
    ApplyKernel<T><<<blocks_, kThreads, 0, stream_>>>(p_, v, out, false);
    return Launched();
  }
  absl::StatusOr<std::array<double, 2>> Dots(const T* u, const T* v, const T* w, const T* x) {
    DotKernel<T><<<reduce_blocks_, kThreads, 0, stream_>>>(size_, u, v, w, x, acc_);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    std::array<double, 2> h;
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h.data(), acc_, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    if (auto st = CudaStatus(cudaStreamSynchronize(stream_), "Krylov dot"); !st.ok()) return st;
    return h;
  }
  absl::StatusOr<bool> Precondition(const T* in, T* out) {
    if (mg_) {
      if (graphs_ && LaunchGraph(in, out)) return true;
      if (auto st = ApplyVCycle(*mg_, in, out, stream_); !st.ok()) return st;
      return true;
    }
    TridiagonalProblem<T> tp{p_.N, p_.M, Layout::kFlat, p_.aC, p_.cC, p_.bC, in};
    auto k = SolveTridiagonalDevice(tp, TridiagonalMethod::kPartitioned, out, flags_, pool_,
                                    stream_);
    if (!k.ok()) return k.status();
    return true;  // a vanished pivot is flagged, read by Final
  }
  absl::Status Copy(const T* src, T* dst) {
    return CudaStatus(
        cudaMemcpyAsync(dst, src, size_ * sizeof(T), cudaMemcpyDeviceToDevice, stream_), "copy");
  }
  absl::Status Zero(T* v) {
    return CudaStatus(cudaMemsetAsync(v, 0, size_ * sizeof(T), stream_), "zero");
  }
  absl::Status CgStep(T alpha, const T* d, const T* q, T* y, T* r) {
    UpdateYR<T><<<blocks_, kThreads, 0, stream_>>>(size_, alpha, d, q, y, r);
    return Launched();
  }
  absl::Status CgDirection(T beta, const T* z, T* d) {
    UpdateD<T><<<blocks_, kThreads, 0, stream_>>>(size_, beta, z, d);
    return Launched();
  }
  absl::Status BicgstabDirection(T beta, T omega, const T* r, const T* v, T* p) {
    BicgP<T><<<blocks_, kThreads, 0, stream_>>>(size_, beta, omega, r, v, p);
    return Launched();
  }
  absl::Status BicgstabStep(T a, const T* u, const T* in, const T* w, T* y, T* out) {
    BicgUpdate<T><<<blocks_, kThreads, 0, stream_>>>(size_, a, u, in, w, y, out);
    return Launched();
  }
  // The true residual from the original arrays; with the line solves, whether a line's pivot
  // vanished on the way (SINGULAR: the line solves could not run).
  absl::StatusOr<driver::FinalResidual> Final(const T* y) {
    ResidualKernel<T><<<reduce_blocks_, kThreads, 0, stream_>>>(p_, y, acc_, false);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    double h[2];
    std::vector<uint8_t> hf(mg_ ? 0 : static_cast<size_t>(p_.N));
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h, acc_, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    if (!mg_)
      TRISOLVE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(hf.data(), flags_, hf.size(), cudaMemcpyDeviceToHost, stream_));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    driver::FinalResidual f;
    f.residual = h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
    for (uint8_t v : hf) f.singular |= (v & kFlagVanished) != 0;  // (not dominance)
    return f;
  }

 private:
  static absl::Status Launched() { return CudaStatus(cudaGetLastError(), "Krylov step"); }
  // The V-cycle of (in, out) by its graph; false where none could be made or launched: the
  // caller launches the kernels instead, and this solve does from then on (a failure is never
  // the answer's error where the plain launches work; where they fail too, theirs is).
  bool LaunchGraph(const T* in, T* out) {
    cudaGraphExec_t exec = nullptr;
    for (const PairGraph<T>& g : *pairs_)
      if (g.in == in && g.out == out) exec = g.exec;
    if (exec == nullptr) {
      if (pairs_->size() == kMaxPairs) return false;  // (the driver applies P to at most 2)
      exec = CaptureVCycle(*mg_, in, out, stream_);
      if (exec == nullptr) {
        graphs_ = false;
        return false;
      }
      pairs_->push_back({in, out, exec});
      vcycle_graph_captures.fetch_add(1, std::memory_order_relaxed);
    }
    if (cudaGraphLaunch(exec, stream_) != cudaSuccess) {
      (void)cudaGetLastError();  // a sticky error is still there for the plain launches
      graphs_ = false;
      return false;
    }
    vcycle_graph_launches.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  static constexpr size_t kMaxPairs = 4;
  BlockTridiagonalProblem<T> p_;
  int64_t size_;
  double* acc_;
  uint8_t* flags_;
  MgHierarchy<T>* mg_;
  Pool& pool_;
  cudaStream_t stream_;
  unsigned blocks_, reduce_blocks_;
  bool graphs_;
  std::vector<PairGraph<T>>* pairs_;
};

absl::StatusOr<SolveInfo> Answer(absl::StatusOr<driver::KrylovResult> r, SystemStatus* status) {
  if (!r.ok()) return r.status();
  *status = r->status;
  return std::move(r->info);
}

// The fine diagonals' common sign (cg's definiteness test), through the device bytes
// flags[0..2], zeroed again after.
template <typename T>
absl::StatusOr<int> FineDiagonalSign(const BlockTridiagonalProblem<T>& p, uint8_t* flags,
                                     cudaStream_t stream) {
  const int64_t size = p.N * p.M;
  MgDiagonalCheck<T><<<Blocks(size), kThreads, 0, stream>>>(size, p.cC, flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  uint8_t bad[3] = {0, 0, 0};
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bad, flags, 3, cudaMemcpyDeviceToHost, stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, 3, stream));
  return SignsOf(bad).sign;
}

}  // namespace

void SetBlockLaunches(BlockLaunches launches) {
  block_launches.store(uint8_t(launches), std::memory_order_relaxed);
}

bool BlockGraphsOn() {
  const auto l = BlockLaunches(block_launches.load(std::memory_order_relaxed));
  return l == BlockLaunches::kDefault ? GraphsFromEnv() : l == BlockLaunches::kGraph;
}

int64_t VCycleGraphLaunches() { return vcycle_graph_launches.load(std::memory_order_relaxed); }
int64_t VCycleGraphCaptures() { return vcycle_graph_captures.load(std::memory_order_relaxed); }

template <typename T>
struct BlockDeviceSetup {
  std::optional<MgHierarchy<T>> mg;  // multigrid-cg, multigrid-bicgstab: levels without vectors
  std::optional<int> fine_sign;      // cg
  // With mg: one solve's work over these levels, kept for the next solve (its buffers, and the
  // V-cycle's graphs once a solve has captured them). A solve takes it, and gives it back when
  // it has ended well (its stream drained: nothing of it still runs); a solve that finds none
  // (another has it) makes its own, kept after only if none is. Made with the setup, so its
  // bytes are the setup's.
  BlockMethod method = BlockMethod::kAuto;
  int64_t work_bytes = 0;
  mutable std::mutex mu;
  mutable std::unique_ptr<KrylovWork<T>> spare;
  std::unique_ptr<KrylovWork<T>> Take(BlockMethod m) const {
    std::lock_guard<std::mutex> lock(mu);
    if (m != method) return nullptr;
    return std::move(spare);
  }
  void GiveBack(std::unique_ptr<KrylovWork<T>> w) const {
    std::unique_ptr<KrylovWork<T>> dropped;  // (destroyed outside the lock)
    std::lock_guard<std::mutex> lock(mu);
    if (w->method == method && !spare) spare = std::move(w);
    else dropped = std::move(w);
  }
};

template <typename T>
absl::StatusOr<std::shared_ptr<const BlockDeviceSetup<T>>> PrepareBlockDevice(
    const BlockTridiagonalProblem<T>& p, BlockMethod method, Pool& pool, cudaStream_t stream) {
  if (method != BlockMethod::kCg && method != BlockMethod::kMultigridCg &&
      method != BlockMethod::kMultigridBicgstab)
    return std::shared_ptr<const BlockDeviceSetup<T>>();
  auto flag_buf = pool.Get(256);
  if (!flag_buf.ok()) return flag_buf.status();
  auto* flags = flag_buf->template as<uint8_t>();
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, 3, stream));
  auto s = std::make_shared<BlockDeviceSetup<T>>();
  if (method == BlockMethod::kCg) {
    auto sign = FineDiagonalSign(p, flags, stream);
    if (!sign.ok()) return sign.status();
    s->fine_sign = *sign;
  } else {
    auto h = BuildMgDevice(p, pool, flags, stream, /*vectors=*/false);  // (synchronises)
    if (!h.ok()) return h.status();
    s->mg = std::move(*h);
    auto w = NewWork<T>(method, p.N, p.M, pool);
    if (!w.ok()) return w.status();
    auto own = WithOwnVectors(*s->mg, pool);
    if (!own.ok()) return own.status();
    (*w)->mg = std::move(*own);
    s->method = method;
    s->work_bytes = (*w)->buf.size() + (*w)->mg.buf.size();
    s->spare = std::move(*w);
  }
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return std::shared_ptr<const BlockDeviceSetup<T>>(std::move(s));
}

template <typename T>
int64_t BlockDeviceSetupBytes(const BlockDeviceSetup<T>& s) {
  return s.mg ? s.mg->buf.size() + s.work_bytes : 0;
}

template <typename T>
std::string DescribeBlockDeviceSetup(const BlockDeviceSetup<T>& s) {
  if (s.mg) return "multigrid hierarchy (" + std::to_string(s.mg->levels.size()) + " levels)";
  return s.fine_sign ? "the diagonals' sign" : "";
}

namespace {

// A solve's work for method m: the prepared system's spare where `kept` has one for m, else a
// new one (its hierarchy still to be given: mg.levels empty).
template <typename T>
absl::StatusOr<std::unique_ptr<KrylovWork<T>>> WorkOf(BlockMethod m,
                                                      const BlockTridiagonalProblem<T>& p,
                                                      const BlockDeviceSetup<T>* kept,
                                                      Pool& pool) {
  if (kept != nullptr)
    if (std::unique_ptr<KrylovWork<T>> w = kept->Take(m)) return w;
  return NewWork<T>(m, p.N, p.M, pool);
}

}  // namespace

// Conjugate gradients (driver::Cg) preconditioned by the line solves or by the multigrid
// V-cycle, natural layout; y in: the initial guess, out: the iterate. A negative definite
// matrix (every diagonal negative, on every level) runs as CG on -A with -P, "(negated:
// negative definite)"; a matrix whose diagonals have both signs is not run. Where CG meets
// indefiniteness it stops, "(stopped: indefinite)", NOT_CONVERGED: auto's caller falls back to
// the CPU reference's BiCGStab.
template <typename T>
absl::StatusOr<SolveInfo> CgDevice(const BlockTridiagonalProblem<T>& p, const BlockOptions& o,
                                   T* y, SystemStatus* status, Pool& pool,
                                   const SolveControl& control, BlockMonitor& mon,
                                   cudaStream_t stream, bool multigrid,
                                   const BlockDeviceSetup<T>* kept) {
  const int64_t N = p.N, M = p.M, size = N * M;
  const bool keeps = multigrid && kept && kept->mg;  // over a prepared system's levels
  auto made = WorkOf(multigrid ? BlockMethod::kMultigridCg : BlockMethod::kCg, p,
                     keeps ? kept : nullptr, pool);
  if (!made.ok()) return made.status();
  std::unique_ptr<KrylovWork<T>> work = *std::move(made);
  auto* acc = static_cast<double*>(work->buf.get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, kAccBytes, stream));
  T *r = reinterpret_cast<T*>(acc + kAccBytes / 8), *z = r + size, *d = z + size, *q = d + size;
  auto* flags = reinterpret_cast<uint8_t*>(q + size);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(N) + 3, stream));
  const char* name = multigrid ? "multigrid-cg" : "cg";
  int sign = 0;
  if (multigrid) {  // the kept levels with vectors of the work's own, else built here
    if (work->mg.levels.empty()) {
      auto h = keeps ? WithOwnVectors(*kept->mg, pool) : BuildMgDevice(p, pool, flags, stream);
      if (!h.ok()) return h.status();
      work->mg = std::move(*h);
    }
    sign = work->mg.signs.sign;
  } else if (kept && kept->fine_sign) {
    sign = *kept->fine_sign;
  } else {  // the line solves: the fine diagonals' sign
    auto s = FineDiagonalSign(p, flags, stream);
    if (!s.ok()) return s.status();
    sign = *s;
  }
  if (sign == 0)
    return NotRun(p, std::string(name) + " (not run: not definite: diagonals of both signs)", y,
                  acc, status, stream);
  DeviceSteps<T> steps(p, acc, flags, multigrid ? &work->mg : nullptr, &work->graphs, pool,
                       stream);
  auto result =
      driver::Cg(steps, driver::CgVectors<T>{r, z, d, q}, y, o, sign, name, control, mon);
  if (result.ok() && keeps) kept->GiveBack(std::move(work));  // (Final drained the stream)
  return Answer(std::move(result), status);
}

// BiCGStab (driver::Bicgstab) right-preconditioned by the V-cycle, natural layout; y in: the
// initial guess, out: the iterate. Any sign of diagonal: the point smoother needs only nonzero
// ones.
template <typename T>
absl::StatusOr<SolveInfo> BicgstabDevice(const BlockTridiagonalProblem<T>& p,
                                         const BlockOptions& o, T* y, SystemStatus* status,
                                         Pool& pool, const SolveControl& control,
                                         BlockMonitor& mon, cudaStream_t stream,
                                         const BlockDeviceSetup<T>* kept) {
  const int64_t size = p.N * p.M;
  const bool keeps = kept && kept->mg;  // over a prepared system's levels
  auto made = WorkOf(BlockMethod::kMultigridBicgstab, p, keeps ? kept : nullptr, pool);
  if (!made.ok()) return made.status();
  std::unique_ptr<KrylovWork<T>> work = *std::move(made);
  // r, r0, p, v, y-hat, s, z, t; the levels in their own buffer.
  auto* acc = static_cast<double*>(work->buf.get());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc, 0, kAccBytes, stream));
  T* w = reinterpret_cast<T*>(acc + kAccBytes / 8);
  driver::BicgstabVectors<T> v{w,            w + size,     w + 2 * size, w + 3 * size,
                               w + 4 * size, w + 5 * size, w + 6 * size, w + 7 * size};
  auto* flag = reinterpret_cast<uint8_t*>(w + 8 * size);
  if (work->mg.levels.empty()) {  // the kept levels with vectors of the work's own, else built
    auto mg = keeps ? WithOwnVectors(*kept->mg, pool) : BuildMgDevice(p, pool, flag, stream);
    if (!mg.ok()) return mg.status();
    work->mg = std::move(*mg);
  }
  if (!work->mg.signs.nonzero)
    return NotRun(p, "multigrid-bicgstab (not run: a zero diagonal on a multigrid level)", y,
                  acc, status, stream);
  DeviceSteps<T> steps(p, acc, flag, &work->mg, &work->graphs, pool, stream);
  auto result = driver::Bicgstab(steps, v, y, o, o.max_iterations, "multigrid-bicgstab",
                                 control, mon);
  if (result.ok() && keeps) kept->GiveBack(std::move(work));  // (Final drained the stream)
  return Answer(std::move(result), status);
}

#define TRISOLVE_BLOCK_KRYLOV(T)                                                            \
  template absl::StatusOr<SolveInfo> CgDevice(const BlockTridiagonalProblem<T>&,           \
                                              const BlockOptions&, T*, SystemStatus*, Pool&, \
                                              const SolveControl&, BlockMonitor&,            \
                                              cudaStream_t, bool, const BlockDeviceSetup<T>*); \
  template absl::StatusOr<SolveInfo> BicgstabDevice(                                       \
      const BlockTridiagonalProblem<T>&, const BlockOptions&, T*, SystemStatus*, Pool&,    \
      const SolveControl&, BlockMonitor&, cudaStream_t, const BlockDeviceSetup<T>*);       \
  template absl::StatusOr<std::shared_ptr<const BlockDeviceSetup<T>>> PrepareBlockDevice(  \
      const BlockTridiagonalProblem<T>&, BlockMethod, Pool&, cudaStream_t);                \
  template int64_t BlockDeviceSetupBytes(const BlockDeviceSetup<T>&);                      \
  template std::string DescribeBlockDeviceSetup(const BlockDeviceSetup<T>&);
TRISOLVE_BLOCK_KRYLOV(double)
TRISOLVE_BLOCK_KRYLOV(float)
#undef TRISOLVE_BLOCK_KRYLOV

}  // namespace trisolve::cuda
