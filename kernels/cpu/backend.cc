// The CPU reference backend: every family, both precisions, multithreaded over the systems
// of a batch (OpenMP).
#include <omp.h>

#include <memory>
#include <thread>

#include "trisolve/backend.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/reference/dense.h"
#include "trisolve/reference/tree.h"
#include "trisolve/reference/tridiagonal.h"

namespace trisolve {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) { omp_set_num_threads(threads_); }

  BackendInfo Info() const override {
    BackendInfo info;
    info.name = "cpu";
    info.threads = threads_;
    return info;
  }

#define TRISOLVE_CPU_SOLVE(Problem, Method, Output, fn)                          \
  absl::StatusOr<SolveInfo> Solve(const Problem<double>& p, Method m,            \
                                  Output<double> out, const SolveControl&) override { \
    Team team(*this, p.batch * p.n);                                              \
    return cpu::fn(p, m, out);                                                   \
  }                                                                              \
  absl::StatusOr<SolveInfo> Solve(const Problem<float>& p, Method m, Output<float> out, \
                                  const SolveControl&) override {                \
    Team team(*this, p.batch * p.n);                                              \
    return cpu::fn(p, m, out);                                                   \
  }
  TRISOLVE_CPU_SOLVE(TridiagonalProblem, TridiagonalMethod, TridiagonalOutput,
                     SolveTridiagonal)
  TRISOLVE_CPU_SOLVE(TreeProblem, TreeMethod, TreeOutput, SolveTree)
  TRISOLVE_CPU_SOLVE(DenseProblem, DenseMethod, DenseOutput, SolveDense)
#undef TRISOLVE_CPU_SOLVE

  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& control) override {
    Team team(*this, p.N * p.M);
    return cpu::SolveBlockTridiagonal(p, m, o, out, control);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& control) override {
    Team team(*this, p.N * p.M);
    return cpu::SolveBlockTridiagonal(p, m, o, out, control);
  }

 private:
  // The calling thread's OpenMP team for one solve: one thread for small ones, where raising
  // a team costs more than the solve (a system of 64 unknowns: 445 us with 16 threads against
  // 150 us with 2, issue 31), every thread otherwise. The setting is the calling thread's own.
  static constexpr int64_t kOneThreadBelow = 1 << 14;  // unknowns
  struct Team {
    Team(const CpuBackend& b, int64_t unknowns) {
      omp_set_num_threads(unknowns < kOneThreadBelow ? 1 : b.threads_);
    }
  };
  int threads_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace trisolve
