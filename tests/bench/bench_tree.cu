// Hines benchmark on the GPU, float64. Part 1: cells of the real morphology (tests/data),
// trisolve's hines-batch kernel (interleaved and flat), its cable elimination and the
// one-block-a-cell kernels (cables-block, contraction-block; both layouts) against a
// plain one-thread-per-cell kernel over the interleaved layout and the sequential CPU sweep
// (one core), on the same data, in the same run; and cells of different sizes (subtrees of the
// morphology), as many nodes, solved as one tree (cables for TreeRequest.lengths) and one
// block a cell with per-cell plans (auto and contraction), and the uniform cells sent with
// lengths (the per-cell path, one structure).
// Part 2: one random tree (a random recursive
// tree, numbered depth-first) of 2^16 .. 2^24 nodes, and one chain: the cables against the
// plain kernel (one thread: run once, up to 2^20 nodes) and the CPU sweep.
// Effective bandwidth = 40 bytes a node (lower, upper, diag, rhs read, x written) over the
// time, as a fraction of a device-to-device copy measured in the same run.
//   bench_tree [--swc FILE] [--cells 1,64,256,1024,4096,10240,40960] [--trees 16,18,20,22,24]
//              [--reps 10]
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "runtime/memory_pool.h"
#include "tree/cells.h"
#include "tree/dispatch.h"
#include "tree/forest.h"
#include "tree/tree.h"
#include "trisolve/examples.h"
#include "trisolve/reference/tree.h"
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


std::vector<int32_t> ChainTree(int64_t n) {
  std::vector<int32_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = int32_t(i - 1);
  return p;
}

// A random recursive tree (node i hangs from a uniform node below it), renumbered depth-first.
std::vector<int32_t> RandomTreeDfs(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n), ptr(n + 1, 0), kids(n > 0 ? n - 1 : 0), label(n), stack;
  p[0] = -1;
  for (int64_t i = 1; i < n; ++i) {
    p[i] = int32_t(std::uniform_int_distribution<int64_t>(0, i - 1)(rng));
    ++ptr[p[i] + 1];
  }
  for (int64_t i = 0; i < n; ++i) ptr[i + 1] += ptr[i];
  std::vector<int32_t> fill(ptr.begin(), ptr.end() - 1);
  for (int64_t i = 1; i < n; ++i) kids[fill[p[i]]++] = int32_t(i);
  int32_t next = 0;
  stack.push_back(0);
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    label[v] = next++;
    for (int32_t k = ptr[v + 1] - 1; k >= ptr[v]; --k) stack.push_back(kids[k]);
  }
  std::vector<int32_t> q(n);
  for (int64_t i = 0; i < n; ++i) q[label[i]] = i == 0 ? -1 : label[p[i]];
  return q;
}

}  // namespace

int main(int argc, char** argv) {
  std::string swc = std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc";
  std::vector<int64_t> cell_counts = {1, 64, 256, 1024, 4096, 10240, 40960};
  std::vector<int> tree_logs = {16, 18, 20, 22, 24};
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--swc")) swc = argv[i + 1];
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--trees")) {
      tree_logs.clear();
      for (char* t = std::strtok(argv[i + 1], ","); t; t = std::strtok(nullptr, ","))
        tree_logs.push_back(std::atoi(t));
    } else if (!std::strcmp(argv[i], "--cells")) {
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
  auto mplan = trisolve::cuda::TreeCablesPlan::Make(m->parent.data(), n, pool, nullptr);
  if (!mplan.ok()) return 2;
  std::printf("(morphology: %lld cables in %lld heights, the longest %lld nodes)\n",
              (long long)(*mplan)->cables().cables(), (long long)(*mplan)->levels(),
              (long long)(*mplan)->longest_cable());
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
      const double cms = TimeIt(reps, [&] {
        auto s2 = trisolve::cuda::SolveTreeCablesDevice(p, **mplan, x, flags, pool, nullptr);
        if (!s2.ok()) std::exit(2);
      });
      report(il ? "trisolve cables (interleaved)" : "trisolve cables (flat)", cms, il, true);
      if (trisolve::cuda::CablesBlockFits(p, **mplan)) {
        const double bms = TimeIt(reps, [&] {
          auto s2 = trisolve::cuda::SolveTreeCablesBlockDevice(p, **mplan, x, flags, nullptr);
          if (!s2.ok()) std::exit(2);
        });
        report(il ? "trisolve cables-block (interleaved)" : "trisolve cables-block (flat)", bms, il,
               true);
      }
      if (trisolve::cuda::ContractionBlockFits(p, **mplan)) {
        const double tms = TimeIt(reps, [&] {
          auto s2 = trisolve::cuda::SolveTreeContractionBlockDevice(p, **mplan, x, flags, nullptr);
          if (!s2.ok()) std::exit(2);
        });
        report(il ? "trisolve contraction-block (interl.)" : "trisolve contraction-block (flat)",
               tms, il, true);
      }
    }
    const double plain = TimeIt(reps, [&] {
      PlainHines<<<unsigned((cells + 127) / 128), 128>>>(n, cells, dparent, dint[0], dint[1],
                                                          dint[2], dint[3], x, D);
    });
    report("plain one thread a cell (interl.)", plain, true, true);
    // The same cells sent with lengths (every cell the whole morphology): the per-cell path
    // (tree/cells.h), one structure, beside the uniform contraction-block above.
    {
      std::vector<int64_t> off(cells + 1);
      for (int64_t c = 0; c <= cells; ++c) off[c] = c * n;
      std::vector<int32_t> local(N);
      for (int64_t c = 0; c < cells; ++c)
        std::copy(m->parent.begin(), m->parent.end(), local.begin() + c * n);
      auto cplan = trisolve::cuda::TreeCellsPlan::Make(local.data(), off.data(), cells, 8, pool,
                                                       nullptr);
      if (!cplan.ok()) std::exit(2);
      trisolve::TreeProblem<double> cp;
      cp.batch = cells;
      cp.n = n;
      cp.offsets = off.data();
      cp.lower = dflat[0];
      cp.upper = dflat[1];
      cp.diag = dflat[2];
      cp.rhs = dflat[3];
      const double cms = TimeIt(reps, [&] {
        if (!trisolve::cuda::SolveTreeCellsBlockDevice(cp, **cplan, x, flags, nullptr).ok())
          std::exit(2);
      });
      report("lengths, one morphology, per-cell", cms, false, true);
      std::printf("%8s %11s (%lld structure, %lld cells one a block; analysis %.1f ms, host)\n",
                  "", "", (long long)(*cplan)->structures(), (long long)(*cplan)->block_cells(),
                  (*cplan)->analysis_ms());
    }
    // Cells of different sizes, as many nodes in all: subtrees of the morphology (its first k
    // nodes, k uniform in 32 .. n; the last cut to the total), each node's values those of the
    // same node of a uniform cell (a subtree drops children, so its diagonal stays dominant),
    // solved as the backend solves TreeRequest.lengths: one tree of them all, the roots joined
    // by couplings zeroed on the device (ZeroForestCouplings, timed with the solve).
    {
      std::mt19937_64 vr(cells);
      std::vector<int64_t> off = {0};
      std::vector<int32_t> local;
      while (off.back() < N) {
        const int64_t k = std::min<int64_t>(std::uniform_int_distribution<int64_t>(32, n)(vr),
                                            N - off.back());
        local.insert(local.end(), m->parent.begin(), m->parent.begin() + k);
        off.push_back(off.back() + k);
      }
      const int64_t vcells = int64_t(off.size()) - 1;
      std::vector<double> vv[4];
      for (int q = 0; q < 4; ++q) {
        const double* h = ar[names[q]].as<double>();
        vv[q].resize(N);
        for (int64_t c = 0; c < vcells; ++c)
          std::copy(h + (c % cells) * n, h + (c % cells) * n + (off[c + 1] - off[c]),
                    vv[q].begin() + off[c]);
        CK(cudaMemcpy(dflat[q], vv[q].data(), bytes, cudaMemcpyHostToDevice));
      }
      const std::vector<int32_t> one = trisolve::ForestAsOneTree(local.data(), off.data(), vcells);
      const auto v0 = std::chrono::steady_clock::now();
      auto vplan = trisolve::cuda::TreeCablesPlan::Make(one.data(), N, pool, nullptr);
      if (!vplan.ok()) std::exit(2);
      const double vplan_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - v0).count();
      std::vector<int32_t> roots(off.begin() + 1, off.end() - 1);
      int32_t* droots;
      CK(cudaMalloc(&droots, std::max<size_t>(roots.size(), 1) * 4));
      CK(cudaMemcpy(droots, roots.data(), roots.size() * 4, cudaMemcpyHostToDevice));
      trisolve::TreeProblem<double> vp;
      vp.batch = 1;
      vp.n = N;
      vp.lower = dflat[0];
      vp.upper = dflat[1];
      vp.diag = dflat[2];
      vp.rhs = dflat[3];
      trisolve::TreeProblem<double> vh = hp;  // the cells on the host, for the reference
      vh.batch = vcells;
      vh.n = n;
      vh.parent = local.data();
      vh.offsets = off.data();
      vh.lower = vv[0].data();
      vh.upper = vv[1].data();
      vh.diag = vv[2].data();
      vh.rhs = vv[3].data();
      std::vector<double> vx(N);
      std::vector<trisolve::SystemStatus> vst(vcells);
      trisolve::cpu::SolveTree(vh, trisolve::TreeMethod::kHines,
                               trisolve::TreeOutput<double>{vx.data(), vst.data()});
      trisolve::TreeProblem<double> vchoose = vp;
      const trisolve::cuda::TreePath path =
          trisolve::cuda::ChooseTreePath(vchoose, trisolve::TreeMethod::kAuto, vplan->get());
      const char* vname = path == trisolve::cuda::TreePath::kContractionBlock
                              ? "variable cells, contraction-block"
                          : path == trisolve::cuda::TreePath::kCablesBlock
                              ? "variable cells, cables-block"
                              : "variable cells, cables";
      const double vms = TimeIt(reps, [&] {
        CK(cudaMemset(flags, 0, 1));
        if (!trisolve::cuda::ZeroForestCouplings(dflat[0], dflat[1], droots,
                                                 int64_t(roots.size()), nullptr)
                 .ok())
          std::exit(2);
        const auto solve = [&]() -> absl::Status {
          if (path == trisolve::cuda::TreePath::kContractionBlock)
            return trisolve::cuda::SolveTreeContractionBlockDevice(vp, **vplan, x, flags, nullptr);
          if (path == trisolve::cuda::TreePath::kCablesBlock)
            return trisolve::cuda::SolveTreeCablesBlockDevice(vp, **vplan, x, flags, nullptr);
          return trisolve::cuda::SolveTreeCablesDevice(vp, **vplan, x, flags, pool, nullptr);
        };
        if (!solve().ok()) std::exit(2);
      });
      CK(cudaMemcpy(xg.data(), x, bytes, cudaMemcpyDeviceToHost));
      double dm = 0, xm = 0;
      for (int64_t i = 0; i < N; ++i) {
        dm = std::max(dm, std::abs(xg[i] - vx[i]));
        xm = std::max(xm, std::abs(vx[i]));
      }
      int64_t vsingular = 0;
      for (auto st2 : vst) vsingular += st2 != trisolve::SystemStatus::kOk;
      if (vsingular > 0) std::printf("(variable cells: %lld singular on the CPU)\n", (long long)vsingular);
      const double gbs = 40.0 * N / vms / 1e6;
      std::printf("%8lld %11lld %-34s %7.3f ms %9.0f %6.1f%% %9.1e  (%lld cells of 32..%lld "
                  "nodes, %lld heights; analysis %.0f ms, host, once)\n",
                  (long long)cells, (long long)N, vname, vms, gbs, 100 * gbs / copy_gbs, dm / xm,
                  (long long)vcells, (long long)n, (long long)(*vplan)->levels(), vplan_ms);
      std::fflush(stdout);
      CK(cudaFree(droots));
      // The same cells one block a cell, each with its structure's plan (tree/cells.h): what
      // the backend runs for auto and contraction (contraction-block) and for cables
      // (cables-block). The flags are a byte a cell here.
      // Each with the launches' threads chosen for occupancy (the backend's) and by size.
      for (const auto kind : {trisolve::cuda::TreeCellsKind::kContraction,
                              trisolve::cuda::TreeCellsKind::kCables})
      for (const auto rule : {trisolve::cuda::TreeCellsThreads::kOccupancy,
                              trisolve::cuda::TreeCellsThreads::kBySize}) {
        const bool cab = kind == trisolve::cuda::TreeCellsKind::kCables;
        const bool by_size = rule == trisolve::cuda::TreeCellsThreads::kBySize;
        auto cplan = trisolve::cuda::TreeCellsPlan::Make(local.data(), off.data(), vcells, 8,
                                                         pool, nullptr, 0, kind, rule);
        if (!cplan.ok()) std::exit(2);
        uint8_t* cflags;
        CK(cudaMalloc(&cflags, vcells));
        CK(cudaMemset(cflags, 0, vcells));
        trisolve::TreeProblem<double> cp;
        cp.batch = vcells;
        cp.n = n;
        cp.offsets = off.data();
        cp.lower = dflat[0];
        cp.upper = dflat[1];
        cp.diag = dflat[2];
        cp.rhs = dflat[3];
        // (the joined solve above zeroed the roots' couplings: the per-cell kernels read none)
        // The size classes' launches overlapped (the backend's default), then one after the
        // other on one stream (TRISOLVE_TREE_CELLS_SERIAL=1), on the same data.
        for (const auto order : {trisolve::cuda::TreeCellsLaunches::kOverlapped,
                                 trisolve::cuda::TreeCellsLaunches::kSerial}) {
          const bool serial = order == trisolve::cuda::TreeCellsLaunches::kSerial;
          CK(cudaMemset(x, 0, bytes));
          CK(cudaMemset(cflags, 0, vcells));
          const double cms = TimeIt(reps, [&] {
            if (!trisolve::cuda::SolveTreeCellsBlockDevice(cp, **cplan, x, cflags, nullptr, order)
                     .ok())
              std::exit(2);
          });
          CK(cudaMemcpy(xg.data(), x, bytes, cudaMemcpyDeviceToHost));
          std::vector<uint8_t> hf(vcells);
          CK(cudaMemcpy(hf.data(), cflags, vcells, cudaMemcpyDeviceToHost));
          int64_t flagged = 0;
          for (uint8_t f : hf) flagged += f != 0;
          double cdm = 0;
          for (int64_t i = 0; i < N; ++i) cdm = std::max(cdm, std::abs(xg[i] - vx[i]));
          const double cgbs = 40.0 * N / cms / 1e6;
          // The backend's way keeps the row's name (perf_tables.py reads it); the others say
          // how they differ.
          const std::string name =
              std::string(cab ? "variable cells, per-cell cables-block"
                              : "variable cells, per-cell contr.-block") +
              (serial ? ", serial" : "") + (by_size ? ", size threads" : "");
          std::printf("%8lld %11lld %-34s %7.3f ms %9.0f %6.1f%% %9.1e  (%lld structures, %lld "
                      "cells one a block, %lld flagged, %lld launches%s, threads by %s; "
                      "analysis %.1f ms, host threads, once)\n",
                      (long long)cells, (long long)N, name.c_str(), cms, cgbs, 100 * cgbs / copy_gbs, cdm / xm,
                      (long long)(*cplan)->structures(), (long long)(*cplan)->block_cells(),
                      (long long)flagged, (long long)(*cplan)->launches(),
                      serial ? " one after the other" : " overlapped",
                      by_size ? "size" : "occupancy", (*cplan)->analysis_ms());
          std::fflush(stdout);
        }
        CK(cudaFree(cflags));
      }
    }
    report("CPU sweep, one core", cpu_ms, false, false);
    for (int q = 0; q < 4; ++q) {
      CK(cudaFree(dflat[q]));
      CK(cudaFree(dint[q]));
    }
    CK(cudaFree(x));
    CK(cudaFree(D));
    CK(cudaFree(flags));
  }

  std::printf("\n%-22s %10s %7s %8s %-26s %10s %9s %7s %9s\n", "tree", "nodes", "heights",
              "cables", "solver", "time", "GB/s", "of copy", "max diff");
  for (int lg : tree_logs)
    for (bool chain : {false, true}) {
      if (chain && lg != 22) continue;
      const int64_t N = int64_t(1) << lg;
      const std::vector<int32_t> parent = chain ? ChainTree(N) : RandomTreeDfs(N, 1000 + lg);
      std::mt19937_64 rng(lg);
      std::uniform_real_distribution<double> u(0.1, 1.0), r(-1, 1);
      std::vector<double> h[4];  // lower, upper, diag, rhs
      for (auto& v : h) v.assign(N, 0.0);
      for (int64_t i = 0; i < N; ++i) {
        h[0][i] = i > 0 ? -u(rng) : 0;
        h[1][i] = i > 0 ? -u(rng) : 0;
        h[3][i] = r(rng);
        h[2][i] += 0.01 + std::abs(h[0][i]);
        if (i > 0) h[2][parent[i]] += std::abs(h[1][i]);
      }
      const auto a0 = std::chrono::steady_clock::now();
      auto plan = trisolve::cuda::TreeCablesPlan::Make(parent.data(), N, pool, nullptr);
      if (!plan.ok()) return 2;
      const double plan_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a0).count();
      const size_t bytes = N * sizeof(double);
      double* d[4];
      double *x, *D;
      int32_t* dpar;
      uint8_t* flags;
      for (int q = 0; q < 4; ++q) {
        CK(cudaMalloc(&d[q], bytes));
        CK(cudaMemcpy(d[q], h[q].data(), bytes, cudaMemcpyHostToDevice));
      }
      CK(cudaMalloc(&x, bytes));
      CK(cudaMalloc(&D, bytes));
      CK(cudaMalloc(&dpar, N * 4));
      CK(cudaMalloc(&flags, 1));
      CK(cudaMemcpy(dpar, parent.data(), N * 4, cudaMemcpyHostToDevice));
      std::vector<double> xc(N), xg(N);
      std::vector<trisolve::SystemStatus> st(1);
      trisolve::TreeProblem<double> hp;
      hp.batch = 1;
      hp.n = N;
      hp.parent = parent.data();
      hp.lower = h[0].data();
      hp.upper = h[1].data();
      hp.diag = h[2].data();
      hp.rhs = h[3].data();
      omp_set_num_threads(1);
      double cpu_ms = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        trisolve::cpu::SolveTree(hp, trisolve::TreeMethod::kHines,
                                 trisolve::TreeOutput<double>{xc.data(), st.data()});
        cpu_ms = std::min(cpu_ms, std::chrono::duration<double, std::milli>(
                                      std::chrono::steady_clock::now() - t0).count());
      }
      char label[64];
      std::snprintf(label, sizeof label, chain ? "chain 2^%d" : "random 2^%d", lg);
      auto row = [&](const char* name, double ms, bool check) {
        double diff = -1;
        if (check) {
          CK(cudaMemcpy(xg.data(), x, bytes, cudaMemcpyDeviceToHost));
          double dm = 0, xm = 0;
          for (int64_t i = 0; i < N; ++i) {
            dm = std::max(dm, std::abs(xg[i] - xc[i]));
            xm = std::max(xm, std::abs(xc[i]));
          }
          diff = dm / xm;
        }
        const double gbs = 40.0 * N / ms / 1e6;
        std::printf("%-22s %10lld %7lld %8lld %-26s %7.3f ms %9.0f %6.1f%% %9.1e\n", label,
                    (long long)N, (long long)(*plan)->levels(),
                    (long long)(*plan)->cables().cables(), name, ms, gbs,
                    100 * gbs / copy_gbs, diff);
        std::fflush(stdout);
      };
      trisolve::TreeProblem<double> p = hp;
      p.parent = nullptr;
      p.lower = d[0];
      p.upper = d[1];
      p.diag = d[2];
      p.rhs = d[3];
      const double ms = TimeIt(reps, [&] {
        CK(cudaMemset(flags, 0, 1));
        auto s2 = trisolve::cuda::SolveTreeCablesDevice(p, **plan, x, flags, pool, nullptr);
        if (!s2.ok()) std::exit(2);
      });
      row("trisolve cables", ms, true);
      if (lg <= 20) {
        const double plain = TimeIt(1, [&] {
          PlainHines<<<1, 1>>>(N, 1, dpar, d[0], d[1], d[2], d[3], x, D);
        });
        row("plain, one thread", plain, true);
      }
      row("CPU sweep, one core", cpu_ms, false);
      row("analysis (host, once)", plan_ms, false);
      for (int q = 0; q < 4; ++q) CK(cudaFree(d[q]));
      CK(cudaFree(x));
      CK(cudaFree(D));
      CK(cudaFree(dpar));
      CK(cudaFree(flags));
    }
  return 0;
}
