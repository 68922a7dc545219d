// The block family's dispatch on the device: the one place where a BlockMethod (auto included)
// becomes the solver that runs it (krylov.cu, sweeps.cu).
#include "block/block.h"
#include "block/internal.h"

namespace trisolve::cuda {

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
