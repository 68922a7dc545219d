// Batched Hines benchmark on the GPU: cells of the real morphology (tests/data), trisolve's
// hines-batch kernel (interleaved and flat) against a plain one-thread-per-cell kernel over the
// interleaved layout and the sequential CPU sweep (one core), on the same data, in the same run.
// Effective bandwidth = 40 bytes a node (lower, upper, diag, rhs read, x written; 20 in float32)
// over the time, as a fraction of a device-to-device copy measured in the same run.
//   bench_tree [--swc FILE] [--cells 1024,10240,40960] [--reps 10]
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "memory_pool.h"
#include "tree_cuda.h"
#include "trisolve/examples.h"
#include "trisolve/swc.h"
#include "trisolve/tree.h"


namespace {
using trisolve::bench::TimeIt;

// The plain version: one thread per cell, the eliminated diagonal and right-hand side kept in
// global scratch (interleaved, so coalesced), the parent array read from global memory by
// every cell.
__global__ void PlainHines(int64_t n, int64_t batch, const int32_t* parent, const double* lower,
                           const double* upper, const double* diag, const double* rhs, double* x,
                           double* D) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= batch) return;
  for (int64_t i = 0; i < n; ++i) {
    D[i * batch + s] = diag[i * batch + s];
    x[i * batch + s] = rhs[i * batch + s];
  }
  for (int64_t i = n - 1; i >= 1; --i) {
    const int64_t e = i * batch + s, ep = int64_t(parent[i]) * batch + s;
    const double f = upper[e] / D[e];
    D[ep] -= f * lower[e];
    x[ep] -= f * x[e];
  }
  x[s] /= D[s];
  for (int64_t i = 1; i < n; ++i) {
    const int64_t e = i * batch + s;
    x[e] = (x[e] - lower[e] * x[int64_t(parent[i]) * batch + s]) / D[e];
  }
}


}  // namespace

int main(int argc, char** argv) {
  std::string swc = std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc";
  std::vector<int64_t> cell_counts = {1024, 10240, 40960};
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--swc")) swc = argv[i + 1];
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--cells")) {
      cell_counts.clear();
      for (char* t = std::strtok(argv[i + 1], ","); t; t = std::strtok(nullptr, ","))
        cell_counts.push_back(std::atoll(t));
    }
  }
  auto m = trisolve::ReadSwc(swc);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
    return 1;
  }
  const int64_t n = m->size();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbs = trisolve::bench::CopyGBs(reps);
  std::printf("device: %s; device-to-device copy %.0f GB/s; morphology %s: %lld nodes\n\n",
              prop.name, copy_gbs, swc.c_str(), (long long)n);
  std::printf("%8s %11s %-34s %10s %9s %7s %9s\n", "cells", "nodes", "solver", "time", "GB/s",
              "of copy", "max diff");
  trisolve::cuda::Pool pool(trisolve::cuda::Pool::Kind::kDevice, 0, int64_t{40} << 30);
  const std::vector<uint8_t> nf = trisolve::cuda::TreeNodeFlags(m->parent.data(), n);
  int32_t* dparent;
  uint8_t* dnf;
  CK(cudaMalloc(&dparent, n * 4));
  CK(cudaMalloc(&dnf, n));
  CK(cudaMemcpy(dparent, m->parent.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dnf, nf.data(), n, cudaMemcpyHostToDevice));
  for (int64_t cells : cell_counts) {
    auto ar = trisolve::examples::CableTree(*m, cells, 3);  // [cells, n], flat
    const int64_t N = cells * n;
    const size_t bytes = N * sizeof(double);
    const char* names[4] = {"lower", "upper", "diag", "rhs"};
    std::vector<double> inter(N);
    double *dflat[4], *dint[4], *x, *D;
    uint8_t* flags;
    for (int q = 0; q < 4; ++q) {
      const double* h = ar[names[q]].as<double>();
      CK(cudaMalloc(&dflat[q], bytes));
      CK(cudaMalloc(&dint[q], bytes));
      CK(cudaMemcpy(dflat[q], h, bytes, cudaMemcpyHostToDevice));
      for (int64_t s = 0; s < cells; ++s)
        for (int64_t i = 0; i < n; ++i) inter[i * cells + s] = h[s * n + i];
      CK(cudaMemcpy(dint[q], inter.data(), bytes, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&D, bytes));
    CK(cudaMalloc(&flags, cells));
    // The reference: the CPU sweep, one core, flat.
    std::vector<double> xc(N), xg(N);
    std::vector<trisolve::SystemStatus> st(cells);
    trisolve::TreeProblem<double> hp;
    hp.batch = cells;
    hp.n = n;
    hp.parent = m->parent.data();
    hp.lower = ar["lower"].as<double>();
    hp.upper = ar["upper"].as<double>();
    hp.diag = ar["diag"].as<double>();
    hp.rhs = ar["rhs"].as<double>();
    omp_set_num_threads(1);
    const auto t0 = std::chrono::steady_clock::now();
    trisolve::cpu::SolveTree(hp, trisolve::TreeMethod::kHines,
                             trisolve::TreeOutput<double>{xc.data(), st.data()});
    const double cpu_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto report = [&](const char* name, double ms, bool interleaved_result, bool check) {
      double diff = -1;
      if (check) {
        CK(cudaMemcpy(xg.data(), x, bytes, cudaMemcpyDeviceToHost));
        double dm = 0, xm = 0;
        for (int64_t s = 0; s < cells; ++s)
          for (int64_t i = 0; i < n; ++i) {
            const double v = interleaved_result ? xg[i * cells + s] : xg[s * n + i];
            dm = std::max(dm, std::abs(v - xc[s * n + i]));
            xm = std::max(xm, std::abs(xc[s * n + i]));
          }
        diff = dm / xm;
      }
      const double gbs = 40.0 * N / ms / 1e6;
      std::printf("%8lld %11lld %-34s %7.3f ms %9.0f %6.1f%% %9.1e\n", (long long)cells,
                  (long long)N, name, ms, gbs, 100 * gbs / copy_gbs, diff);
      std::fflush(stdout);
    };
    for (bool il : {true, false}) {
      trisolve::TreeProblem<double> p;
      p.batch = cells;
      p.n = n;
      p.layout = il ? trisolve::Layout::kInterleaved : trisolve::Layout::kFlat;
      p.parent = dparent;
      double** d = il ? dint : dflat;
      p.lower = d[0];
      p.upper = d[1];
      p.diag = d[2];
      p.rhs = d[3];
      const double ms = TimeIt(reps, [&] {
        auto s2 = trisolve::cuda::SolveTreeBatchDevice(p, dnf, x, flags, pool, nullptr);
        if (!s2.ok()) std::exit(2);
      });
      report(il ? "trisolve hines-batch (interleaved)" : "trisolve hines-batch (flat)", ms, il, true);
    }
    const double plain = TimeIt(reps, [&] {
      PlainHines<<<unsigned((cells + 127) / 128), 128>>>(n, cells, dparent, dint[0], dint[1],
                                                          dint[2], dint[3], x, D);
    });
    report("plain one thread a cell (interl.)", plain, true, true);
    report("CPU sweep, one core", cpu_ms, false, false);
    for (int q = 0; q < 4; ++q) {
      CK(cudaFree(dflat[q]));
      CK(cudaFree(dint[q]));
    }
    CK(cudaFree(x));
    CK(cudaFree(D));
    CK(cudaFree(flags));
  }
  return 0;
}
