// The block family's dispatch on the device: the one place where a BlockMethod (auto included)
// becomes the solver that runs it (krylov.cu, sweeps.cu).
#include <algorithm>
#include <cmath>
#include <limits>

#include "block/block.h"
#include "block/internal.h"
#include "block/vector_kernels.cuh"
#include "runtime/check.h"
#include "runtime/pinned_word.h"

namespace trisolve::cuda {
namespace {

// Whether any pair of p's couplings fails IsSymmetric's test (SymmetricPair, the host's own:
// the same answer): counted into scratch[0] by the blocks that find one, written into the host
// word by the last block (PublishAnswer).
template <typename T>
__global__ void AsymmetryKernel(int64_t N, int64_t M, const T* __restrict__ aC,
                                const T* __restrict__ bC, const T* __restrict__ cA,
                                const T* __restrict__ cB, int* scratch, int* answer) {
  bool differs = false;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, step = stride % M;
  int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, k = e % M;
  for (; e < N * M; e += stride) {
    if (k + 1 < M && !SymmetricPair(aC[e + 1], bC[e])) differs = true;
    if (e + M < N * M && !SymmetricPair(cA[e + M], cB[e])) differs = true;
    k += step;
    if (k >= M) k -= M;
  }
  if (__syncthreads_or(differs) && threadIdx.x == 0) atomicMax(&scratch[0], 1);
  if (threadIdx.x == 0) PublishAnswer(scratch, answer);
}

}  // namespace

template <typename T>
absl::StatusOr<bool> IsSymmetricDevice(const BlockTridiagonalProblem<T>& p, cudaStream_t stream) {
  if (p.N * p.M == 0) return true;
  auto word = PinnedWord::Take();
  if (!word.ok()) return word.status();
  const unsigned blocks = unsigned(std::min<int64_t>(Blocks(p.N * p.M), 8 * 1024));
  AsymmetryKernel<T><<<blocks, kThreads, 0, stream>>>(p.N, p.M, p.aC, p.bC, p.cA, p.cB,
                                                      word->scratch(), word->mapped());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return *static_cast<volatile int*>(word->get()) == 0;
}
template absl::StatusOr<bool> IsSymmetricDevice(const BlockTridiagonalProblem<double>&,
                                                cudaStream_t);
template absl::StatusOr<bool> IsSymmetricDevice(const BlockTridiagonalProblem<float>&,
                                                cudaStream_t);

template <typename T>
BlockMethod ResolveBlockMethod(const BlockTridiagonalProblem<T>& p, BlockMethod method,
                               const BlockOptions& o, std::optional<bool> symmetric) {
  if (method == BlockMethod::kAuto && o.tol > 0 &&
      (symmetric.has_value() ? *symmetric : IsSymmetric(p)))
    return BlockMethod::kMultigridCg;
  return method;
}

template <typename T>
absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(const BlockTridiagonalProblem<T>& p,
                                                      BlockMethod method,
                                                      const BlockOptions& o, T* y,
                                                      SystemStatus* status, Pool& pool,
                                                      const SolveControl& control,
                                                      cudaStream_t stream,
                                                      const BlockDeviceSetup<T>* kept) {
  if (method == BlockMethod::kAuto) method = BlockMethod::kRedBlack;  // (ResolveBlockMethod: cg)
  BlockMonitor mon(control);
  absl::StatusOr<SolveInfo> info = [&]() -> absl::StatusOr<SolveInfo> {
    if (method == BlockMethod::kMultigridBicgstab)
      return BicgstabDevice(p, o, y, status, pool, control, mon, stream, kept);
    if (method == BlockMethod::kCg || method == BlockMethod::kMultigridCg)
      return CgDevice(p, o, y, status, pool, control, mon, stream,
                      method == BlockMethod::kMultigridCg, kept);
    return SweepsDevice(p, method, o, y, status, pool, control, mon, stream);
  }();
  if (info.ok()) mon.Finish(&*info);
  return info;
}

template BlockMethod ResolveBlockMethod(const BlockTridiagonalProblem<double>&, BlockMethod,
                                        const BlockOptions&, std::optional<bool>);
template BlockMethod ResolveBlockMethod(const BlockTridiagonalProblem<float>&, BlockMethod,
                                        const BlockOptions&, std::optional<bool>);
template absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(
    const BlockTridiagonalProblem<double>&, BlockMethod, const BlockOptions&, double*,
    SystemStatus*, Pool&, const SolveControl&, cudaStream_t, const BlockDeviceSetup<double>*);
template absl::StatusOr<SolveInfo> SolveBlockTridiagonalDevice(
    const BlockTridiagonalProblem<float>&, BlockMethod, const BlockOptions&, float*,
    SystemStatus*, Pool&, const SolveControl&, cudaStream_t, const BlockDeviceSetup<float>*);

}  // namespace trisolve::cuda
