// The thesis' experiments on the GPU, side by side with its tables 5.2-5.5 (RTX 3060, CUDA 12.8;
// sequential = its CPU program, GPU = its one-thread-per-block-row kernels, best thread count),
// then the time of one sweep against the memory floor (8 arrays of N*M values: aC cC bC cA cB f
// and Y read, Y written) at N = M = 1024, 4096 and 8192, and the sweeps' two paths (fused, two kernels
// a half-sweep) side by side. Times include the colour-major copies and the
// final residual of a solve. float64.
//   bench_block [--reps 5] [--sweeps 4096,8192] [--path TEXT] [--method NAME]
// --sweeps: only the sweep paths at those sizes, each streamed one followed (in a build with
// -DTRISOLVE_SWEEP_PROFILE=ON) by the cycles a task spent in each phase and the blocks that ran;
// --path / --method: only the paths whose name contains TEXT (or one of TEXT's '|'-separated
// parts) / that method.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "block/block.h"
#include "runtime/memory_pool.h"
#include "tridiagonal/tridiagonal.h"
#include "tuning_table.h"
#include "trisolve/examples.h"

namespace {

struct Device {
  std::vector<double*> p;
  trisolve::BlockTridiagonalProblem<double> prob;
  double* y;
  Device(const trisolve::examples::Arrays& ex, int64_t N, int64_t M) {
    const char* names[6] = {"aC", "cC", "bC", "cA", "cB", "f"};
    for (const char* k : names) {
      double* d;
      CK(cudaMalloc(&d, N * M * 8));
      CK(cudaMemcpy(d, ex.at(k).as<double>(), N * M * 8, cudaMemcpyHostToDevice));
      p.push_back(d);
    }
    CK(cudaMalloc(&y, N * M * 8));
    prob = {N, M, p[0], p[1], p[2], p[3], p[4], p[5], nullptr};
  }
  ~Device() {
    for (double* d : p) cudaFree(d);
    cudaFree(y);
  }
};

double Solve(Device& d, trisolve::cuda::Pool& pool, trisolve::BlockMethod m, int64_t L,
             double tol, bool scale, int reps, int64_t* iterations = nullptr,
             double* residual = nullptr) {
  trisolve::BlockOptions o{L, tol, scale};
  return trisolve::bench::TimeIt(
      reps, [&] { CK(cudaMemset(d.y, 0, d.prob.N * d.prob.M * 8)); },
      [&] {
        trisolve::SystemStatus st;
        auto info = trisolve::cuda::SolveBlockTridiagonalDevice(d.prob, m, o, d.y, &st, pool,
                                                                trisolve::SolveControl{}, nullptr);
        if (!info.ok()) std::exit(2);
        if (iterations) *iterations = info->iterations;
        if (residual) *residual = info->residual;
      });
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  std::vector<int64_t> only;  // --sweeps: these sizes' sweep paths alone
  std::string path_filter, method_filter;  // --path, --method
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) {
      reps = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--sweeps")) {
      for (const char* q = argv[i + 1]; *q;) {
        char* end;
        const long long v = std::strtoll(q, &end, 10);
        if (end == q) break;
        only.push_back(v);
        q = *end == ',' ? end + 1 : end;
      }
    } else if (!std::strcmp(argv[i], "--path")) {
      path_filter = argv[i + 1];
    } else if (!std::strcmp(argv[i], "--method")) {
      method_filter = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy = trisolve::bench::CopyGBs(reps);
  std::printf("device: %s; device-to-device copy %.0f GB/s\n\n", prop.name, copy);
  trisolve::cuda::Pool pool(trisolve::cuda::Pool::Kind::kDevice, 0, int64_t{40} << 30);

  if (only.empty()) {
  // Experiment 1, fixed L, red-black (the thesis' CUDA ordering).
  struct Row { int64_t NM, L; double seq_s, gpu_s; };
  const Row table[] = {{128, 8, 0.0071064, 0.020672},  {128, 16, 0.0184338, 0.038556},
                       {128, 32, 0.0386533, 0.065165}, {512, 16, 0.205872, 0.129723},
                       {512, 32, 0.416178, 0.214211},  {512, 64, 1.39038, 0.390137},
                       {1024, 16, 0.79605, 0.235103},  {1024, 32, 2.65437, 0.428167},
                       {1024, 64, 5.41033, 0.771089}};
  std::printf("experiment 1 (tables 5.2-5.4), red-black, exactly L sweeps\n");
  std::printf("%6s %4s %14s %14s %14s %10s\n", "N=M", "L", "thesis seq", "thesis GPU",
              "trisolve", "vs its GPU");
  for (const Row& r : table) {
    auto ex = trisolve::examples::ThesisExperiment1(r.NM, r.NM);
    Device d(ex, r.NM, r.NM);
    const double ms = Solve(d, pool, trisolve::BlockMethod::kRedBlack, r.L, 0, false, reps);
    std::printf("%6lld %4lld %11.4f s %11.4f s %11.3f ms %9.0fx\n", (long long)r.NM,
                (long long)r.L, r.seq_s, r.gpu_s, ms, r.gpu_s * 1e3 / ms);
    std::fflush(stdout);
  }

  std::printf("\none sweep against the memory floor (8 arrays of N*M doubles at %.0f GB/s)\n", copy);
  std::printf("%6s %-14s %12s %12s %8s\n", "N=M", "method", "per sweep", "floor", "ratio");
  for (int64_t NM : {1024, 4096, 8192, 16384, 20480}) {
    auto ex = trisolve::examples::ThesisExperiment1(NM, NM);
    Device d(ex, NM, NM);
    const double floor_ms = 8.0 * NM * NM * 8 / (copy * 1e6);
    for (auto m : {trisolve::BlockMethod::kRedBlack, trisolve::BlockMethod::kJacobi}) {
      const double t1 = Solve(d, pool, m, 1, 0, false, reps);
      const double t65 = Solve(d, pool, m, 65, 0, false, reps);
      const double sweep = (t65 - t1) / 64;
      std::printf("%6lld %-14s %9.3f ms %9.3f ms %7.2fx\n", (long long)NM,
                  std::string(trisolve::MethodName(m)).c_str(), sweep, floor_ms, sweep / floor_ms);
      std::fflush(stdout);
    }
  }
  }  // only.empty()

  // The sweeps' two paths side by side: the fused sweeps (one launch for up to 64 sweeps, a
  // block -- or a cluster of 2 or 4 blocks -- a row and sweep, 8 or 16 rows a thread, the row
  // loaded straight into registers or staged through shared memory) and the two-kernel
  // half-sweeps (right-hand side, then the batched one-pass partitioned solve; what ran before
  // the fused sweeps and still runs rows over 16384). Gauss-Seidel on the two-kernel path is
  // one launch pair a row, so its sweep is timed as L = 2 less L = 1. Clusters and the streamed
  // form (persistent blocks of 256 or 128 threads x 16 rows prefetching the next row) are timed
  // where rows are long (4096 and over), and not where half a cluster or more would hold only
  // identity rows.
  std::printf("\nsweep paths: per sweep ((L=65 - L=1) / 64), the whole solve of L = 1, and of "
              "L = 64 at N = M = 1024\n");
  std::printf("%6s %-14s %-44s %12s %12s %12s\n", "N=M", "method", "path", "per sweep", "L=1",
              "L=64");
  // The paths' tuning: a table of the benchmark's own, in use on this thread.
  trisolve::cuda::TuningTable table = trisolve::cuda::ActiveTuning();
  const trisolve::cuda::UseTuning use_table(&table);
  const auto sweep0 = table.sweeps;
  struct Path { std::string name; trisolve::cuda::SweepTuning t; };
  std::vector<Path> paths = {{"auto (the default form)", {}}};
  for (int q : {1, 2, 4}) {
    const std::string blocks = q > 1 ? ", " + std::to_string(q) + " blocks" : "";
    for (int chunk : {8, 16})
      for (int staged : {-1, 1})
        paths.push_back({"fused, " + std::to_string(chunk) + " rows, " +
                             (staged > 0 ? "staged" : "direct") + blocks,
                         {true, chunk, staged, q, -1}});
    paths.push_back({"fused, 16 rows, streamed" + blocks, {true, 16, 0, q, 1, 0, 256}});
    paths.push_back(
        {"fused, 16 rows, streamed, cp.async" + blocks, {true, 16, 0, q, 1, -1, 256}});
    paths.push_back({"fused, 16 rows, streamed, groups of 4" + blocks,
                     {true, 16, 0, q, 1, 0, 256, 4}});
  }
  // Blocks of 128 threads, two an SM, in clusters of 2 to 8.
  for (int q : {2, 4, 8}) {
    const std::string blocks = ", " + std::to_string(q) + " blocks";
    paths.push_back(
        {"fused, 16 rows, streamed, 128 threads" + blocks, {true, 16, 0, q, 1, 0, 128}});
    paths.push_back({"fused, 16 rows, streamed, 128 threads, groups of 4" + blocks,
                     {true, 16, 0, q, 1, 0, 128, 4}});
  }
  // Rows as overlapping windows of 4096 (a block of 256 x 16 a window; what auto runs over
  // 16384), at every size over 4096: the least halo the rows allow (experiment 1: 64), and 256.
  for (int halo : {0, 256}) {
    trisolve::cuda::SweepTuning t;
    t.window = 1;
    t.window_halo = halo;
    paths.push_back({"fused, 16 rows, streamed, windows" +
                         (halo > 0 ? ", halo " + std::to_string(halo) : std::string()),
                     t});
  }
  paths.push_back({"rhs + partitioned", {false, 0, 0, 0, 0}});
  const std::vector<int64_t> sizes = only.empty() ? std::vector<int64_t>{1024, 4096, 8192} : only;
  for (int64_t NM : sizes) {
    auto ex = trisolve::examples::ThesisExperiment1(NM, NM);
    Device d(ex, NM, NM);
    for (auto m : {trisolve::BlockMethod::kRedBlack, trisolve::BlockMethod::kJacobi,
                   trisolve::BlockMethod::kGaussSeidel}) {
      if (!method_filter.empty() && trisolve::MethodName(m) != method_filter) continue;
      for (const Path& path : paths) {
        bool wanted = false;  // --path: any of its '|'-separated parts
        for (size_t at = 0; at <= path_filter.size();) {
          size_t bar = path_filter.find('|', at);
          if (bar == std::string::npos) bar = path_filter.size();
          wanted |= path.name.find(path_filter.substr(at, bar - at)) != std::string::npos;
          at = bar + 1;
        }
        if (!wanted) continue;
        const int q = path.t.cluster;
        const int threads = path.t.stream_threads ? path.t.stream_threads
                            : path.t.chunk >= 16        ? 256
                                                        : 512;
        if (path.t.window > 0 && (NM <= 4096 || m == trisolve::BlockMethod::kGaussSeidel))
          continue;  // (gauss-seidel is never windowed)
        if (path.t.fused && path.t.chunk != 0 &&
            (int64_t(path.t.chunk) * threads * q < NM ||
             (q > 1 && int64_t(path.t.chunk) * threads * q >= 2 * NM) ||  // blocks left idle
             ((q > 1 || path.t.stream > 0) && NM < 4096)))
          continue;
        table.sweeps = path.t;
        trisolve::cuda::TakeSweepProfile();  // cleared
        double sweep = 0, t1 = 0, t64 = 0;
        if (!path.t.fused && m == trisolve::BlockMethod::kGaussSeidel) {
          if (NM > 1024) continue;
          t1 = Solve(d, pool, m, 1, 0, false, 1);
          sweep = Solve(d, pool, m, 2, 0, false, 1) - t1;
        } else {
          t1 = Solve(d, pool, m, 1, 0, false, reps);
          sweep = (Solve(d, pool, m, 65, 0, false, reps) - t1) / 64;
          if (NM == 1024) t64 = Solve(d, pool, m, 64, 0, false, reps);
        }
        std::printf("%6lld %-14s %-44s %9.4f ms %9.3f ms %9.3f ms\n", (long long)NM,
                    std::string(trisolve::MethodName(m)).c_str(), path.name.c_str(), sweep, t1,
                    t64);
        const auto phases = trisolve::cuda::TakeSweepProfile();
        if (!phases.empty() && path.t.stream > 0) {
          double total = 0, blocks = 0;
          for (const auto& ph : phases)
            if (std::string(ph.phase) == "blocks") blocks = ph.cycles; else total += ph.cycles;
          std::printf("       cycles a task: %.0f =", total);
          for (const auto& ph : phases)
            if (std::string(ph.phase) != "blocks") std::printf(" %s %.0f,", ph.phase, ph.cycles);
          std::printf(" (%.0f blocks)\n", blocks);
        }
        std::fflush(stdout);
      }
    }
  }
  table.sweeps = sweep0;
  if (!only.empty()) return 0;

  // Experiment 2 (table 5.5): the thesis ran 8192-16384 sweeps at N = M = 128 (7.3-14.5 s
  // sequential, 9.6-19.2 s on its GPU). Here: to a relative residual of 1e-10 with its method.
  std::printf("\nexperiment 2 (table 5.5), red-black with the thesis' row scaling, to 1e-10\n");
  {
    auto ex = trisolve::examples::ThesisExperiment2(128, 128);
    Device d(ex, 128, 128);
    int64_t its = 0;
    double res = 0;
    const double ms = Solve(d, pool, trisolve::BlockMethod::kRedBlack, 100000, 1e-10, true, 1,
                            &its, &res);
    std::printf("N=M=128: %lld sweeps, residual %.2e, %.1f ms (thesis: 16384 sweeps 14.5 s "
                "sequential, 19.2 s GPU)\n",
                (long long)its, res, ms);
  }
  // Larger grids need ~N^2 sweeps to 1e-10 (~1.8 million at 1024): the thesis' method is run
  // here as the thesis ran it, a fixed 16384 sweeps, and the residual it reaches printed.
  std::printf("\nexperiment 2, the thesis' method as it ran it (16384 sweeps, red-black with its "
              "row scaling)\n");
  for (int64_t NM : {1024, 4096}) {
    auto ex = trisolve::examples::ThesisExperiment2(NM, NM);
    Device d(ex, NM, NM);
    int64_t its = 0;
    double res = 0;
    const double ms =
        Solve(d, pool, trisolve::BlockMethod::kRedBlack, 16384, 0, true, 1, &its, &res);
    std::printf("N=M=%lld: %lld sweeps, residual %.2e, %.1f ms\n", (long long)NM,
                (long long)its, res, ms);
    std::fflush(stdout);
  }
  std::printf("\nexperiment 2 to 1e-10 with multigrid-cg (what auto runs; median of 3 runs)\n");
  for (int64_t NM : {128, 1024, 4096, 8192}) {
    auto ex = trisolve::examples::ThesisExperiment2(NM, NM);
    Device d(ex, NM, NM);
    int64_t its = 0;
    double res = 0;
    const double ms =
        Solve(d, pool, trisolve::BlockMethod::kMultigridCg, 1000, 1e-10, false, 3, &its, &res);
    std::printf("N=M=%lld: %lld iterations, residual %.2e, %.1f ms\n", (long long)NM,
                (long long)its, res, ms);
    std::fflush(stdout);
  }
  std::printf("\nexperiment 1 (not symmetric) to 1e-10: red-black against multigrid-bicgstab\n");
  for (int64_t NM : {1024, 4096}) {
    auto ex = trisolve::examples::ThesisExperiment1(NM, NM);
    Device d(ex, NM, NM);
    int64_t its = 0, its2 = 0;
    double res = 0, res2 = 0;
    const double rb =
        Solve(d, pool, trisolve::BlockMethod::kRedBlack, 100000, 1e-10, false, 3, &its, &res);
    const double bi = Solve(d, pool, trisolve::BlockMethod::kMultigridBicgstab, 1000, 1e-10,
                            false, 3, &its2, &res2);
    std::printf("N=M=%lld: red-black %lld sweeps %.1f ms; multigrid-bicgstab %lld iterations "
                "%.1f ms (residuals %.1e, %.1e)\n",
                (long long)NM, (long long)its, rb, (long long)its2, bi, res, res2);
    std::fflush(stdout);
  }
  std::printf("\nexperiment 2 to 1e-10 with cg (preconditioned by the line solves)\n");
  for (int64_t NM : {128, 1024, 4096}) {
    auto ex = trisolve::examples::ThesisExperiment2(NM, NM);
    Device d(ex, NM, NM);
    int64_t its = 0;
    double res = 0;
    const double ms =
        Solve(d, pool, trisolve::BlockMethod::kCg, 100000, 1e-10, false, 1, &its, &res);
    std::printf("N=M=%lld: %lld iterations, residual %.2e, %.1f ms\n", (long long)NM,
                (long long)its, res, ms);
    std::fflush(stdout);
  }
  return 0;
}
