// The CPU reference backend: every family, both precisions, multithreaded over the systems
// of a batch (OpenMP).
#include <omp.h>

#include <memory>
#include <string>
#include <thread>
#include <variant>

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

  // A dense system keeps its elimination (Gauss-Jordan's or LU's): each right-hand side then
  // costs O(n^2), and gives the x a one-shot solve would, bit for bit.
  absl::StatusOr<std::unique_ptr<PreparedSystem>> Prepare(const SystemSpec& spec) override {
    if (spec.family == Family::kBlockTridiagonal) {
      auto system = std::make_unique<BlockPrepared>(spec, this);
      system->Setup();
      return std::unique_ptr<PreparedSystem>(std::move(system));
    }
    if (spec.family != Family::kDense || !cpu::Factorable(DenseMethod(spec.method)))
      return Backend::Prepare(spec);
    auto system = std::make_unique<DensePrepared>(spec, this);
    system->Factor();
    return std::unique_ptr<PreparedSystem>(std::move(system));
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<double> rhs,
                                          double* x, SystemStatus* status,
                                          const SolveControl& c) override {
    return SolvePreparedTyped(system, rhs, x, status, c);
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs, float* x,
                                          SystemStatus* status, const SolveControl& c) override {
    return SolvePreparedTyped(system, rhs, x, status, c);
  }

 private:
  class DensePrepared final : public PreparedSystem {
   public:
    DensePrepared(const SystemSpec& spec, CpuBackend* backend)
        : PreparedSystem(spec), backend_(backend) {}
    int64_t bytes() const override {
      const auto* d = std::get_if<cpu::DenseFactors<double>>(&factors);
      const auto* f = std::get_if<cpu::DenseFactors<float>>(&factors);
      const int64_t values = d ? int64_t(d->f.size() + d->inv.size())
                             : f ? int64_t(f->f.size() + f->inv.size()) : 0;
      return PreparedSystem::bytes() + values * spec_.elem_bytes() + spec_.batch * spec_.n * 8;
    }
    std::string prepared() const override {
      return DenseMethod(spec_.method) == DenseMethod::kLu ? "LU factors on the host"
                                                           : "Gauss-Jordan factors on the host";
    }
    absl::Status Update(int i, const void* values) override {
      if (auto st = PreparedSystem::Update(i, values); !st.ok()) return st;
      Factor();
      return absl::OkStatus();
    }
    void Factor() {
      Team team(*backend_, spec_.batch * spec_.n * spec_.n);
      const DenseMethod m = DenseMethod(spec_.method);
      if (spec_.precision == Precision::kFloat64)
        factors = cpu::FactorDense(spec_.batch, spec_.n,
                                   static_cast<const double*>(spec_.coefficients[0]), m);
      else
        factors = cpu::FactorDense(spec_.batch, spec_.n,
                                   static_cast<const float*>(spec_.coefficients[0]), m);
    }
    std::variant<std::monostate, cpu::DenseFactors<double>, cpu::DenseFactors<float>> factors;

   private:
    CpuBackend* backend_;
  };

  // A block-tridiagonal system keeps its method's setup (cpu::PrepareBlock: the multigrid
  // hierarchy, the line factors, auto's symmetry and the pivot tests), built when it is made and
  // again after an update: a solve by handle runs the iterations alone, x bit for bit the
  // one-shot call's. Solves only read it.
  class BlockPrepared final : public PreparedSystem {
   public:
    BlockPrepared(const SystemSpec& spec, CpuBackend* backend)
        : PreparedSystem(spec), backend_(backend) {}
    int64_t bytes() const override {
      return PreparedSystem::bytes() + (f64 ? cpu::BlockSetupBytes(*f64) : 0) +
             (f32 ? cpu::BlockSetupBytes(*f32) : 0);
    }
    std::string prepared() const override {
      const std::string kept = f64 ? cpu::DescribeBlockSetup(*f64)
                               : f32 ? cpu::DescribeBlockSetup(*f32) : std::string();
      return kept.empty() ? PreparedSystem::prepared() : kept + " on the host";
    }
    absl::Status Update(int i, const void* values) override {
      if (auto st = PreparedSystem::Update(i, values); !st.ok()) return st;
      Setup();
      return absl::OkStatus();
    }
    void Setup() {
      Team team(*backend_, spec_.n);
      const BlockMethod m = BlockMethod(spec_.method);
      f64.reset();
      f32.reset();
      if (spec_.precision == Precision::kFloat64)
        f64 = cpu::PrepareBlock(BlockOf<double>(spec_, nullptr), m, spec_.block_options);
      else
        f32 = cpu::PrepareBlock(BlockOf<float>(spec_, nullptr), m, spec_.block_options);
    }
    const cpu::BlockSetup<double>* Kept(double*) const { return f64.get(); }
    const cpu::BlockSetup<float>* Kept(float*) const { return f32.get(); }

   private:
    CpuBackend* backend_;
    std::shared_ptr<const cpu::BlockSetup<double>> f64;
    std::shared_ptr<const cpu::BlockSetup<float>> f32;
  };

  template <typename T>
  absl::StatusOr<SolveInfo> SolveKeptBlock(const BlockPrepared& system, RhsBlock<T> rhs, T* x,
                                           SystemStatus* status, const SolveControl& c) {
    const SystemSpec& s = system.spec();
    const cpu::BlockSetup<T>* kept = system.Kept(static_cast<T*>(nullptr));
    Team team(*this, s.n);
    SolveInfo total;
    for (int64_t j = 0; j < rhs.k; ++j) {
      auto info = cpu::SolveBlockTridiagonal(BlockOf(s, rhs.rhs + j * s.n), BlockMethod(s.method),
                                             s.block_options,
                                             BlockOutput<T>{x + j * s.n, status + j}, c, kept);
      if (!info.ok()) return info.status();
      AccumulateSolveInfo(*info, j == 0, &total);
    }
    return total;
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolvePreparedTyped(PreparedSystem& system, RhsBlock<T> rhs, T* x,
                                               SystemStatus* status, const SolveControl& c) {
    if (auto st = CheckSystemRange(system.spec(), rhs.first_system, rhs.systems); !st.ok())
      return st;
    if (const auto* block = dynamic_cast<const BlockPrepared*>(&system))
      return SolveKeptBlock(*block, rhs, x, status, c);
    auto* dense = dynamic_cast<DensePrepared*>(&system);
    const auto* f = dense ? std::get_if<cpu::DenseFactors<T>>(&dense->factors) : nullptr;
    if (f == nullptr) return SolveThroughBackend(*this, system, rhs, x, status, c);
    const SystemSpec& s = system.spec();
    Team team(*this, rhs.k * s.batch * s.n * s.n);
    for (int64_t j = 0; j < rhs.k; ++j) {
      if (c.Cancelled()) return absl::CancelledError("the call was cancelled");
      cpu::SolveFactored(*f, rhs.rhs + j * s.rhs_values(), x + j * s.rhs_values(),
                         status + j * s.batch);
    }
    SolveInfo info;
    info.method = std::string(MethodName(f->method));
    return info;
  }

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
