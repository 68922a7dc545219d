// Dense systems on the GPU, float64. Part 1, batches of small systems: trisolve's warp
// Gauss-Jordan (n <= 64) and its lu path (n > 64) against cuBLAS getrfBatched +
// getrsBatched, on the same data (2^26 matrix entries per order). cuBLAS reads the row-major
// matrices as column-major, i.e. solves A^T x = b: the same work. Part 2, one large system:
// trisolve's lu (transpose, cuSOLVER getrf + getrs, pivot check) against cuSOLVER getrf +
// getrs alone, trisolve's gauss-jordan-blocked (panel widths 128, 256, 512; * the default) against
// the same, and trisolve's householder-pcr (sytrd, ormtr, PCR, ormtr) against cuSOLVER
// sytrd alone and sytrd + ormtr + the tridiagonal solve, n = 2048 .. 16384.
//   bench_dense [--entries 67108864] [--large 2048,4096,8192,16384] [--reps 10]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench_util.h"
#include "dense/dense.h"
#include "runtime/memory_pool.h"

#define CB(x)                                                                            \
  do {                                                                                   \
    if ((x) != CUBLAS_STATUS_SUCCESS) {                                                  \
      std::fprintf(stderr, "%s:%d %s failed\n", __FILE__, __LINE__, #x);                 \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {
using trisolve::bench::TimeIt;
}  // namespace

int main(int argc, char** argv) {
  int64_t entries = int64_t{1} << 26;
  int reps = 10;
  std::vector<int> large = {2048, 4096, 8192, 16384};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--large")) {
      large.clear();
      for (char* t = std::strtok(argv[i + 1], ","); t; t = std::strtok(nullptr, ","))
        large.push_back(std::atoi(t));
    }
    if (!std::strcmp(argv[i], "--entries")) entries = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; %lld matrix entries per order, float64\n\n", prop.name,
              (long long)entries);
  std::printf("%5s %9s %-34s %10s %14s %9s\n", "n", "systems", "solver", "time", "systems/s",
              "vs cuBLAS");
  cublasHandle_t h;
  CB(cublasCreate(&h));
  trisolve::cuda::Pool pool(trisolve::cuda::Pool::Kind::kDevice, 0, int64_t{60} << 30);
  trisolve::cuda::DenseLibs libs;
  for (int n : {8, 16, 32, 64, 128}) {
    const int64_t batch = entries / (int64_t(n) * n);
    const size_t abytes = sizeof(double) * entries, bbytes = sizeof(double) * batch * n;
    std::vector<double> hA(entries), hb(batch * n);
    std::mt19937_64 rng(n);
    std::uniform_real_distribution<double> u(-1, 1);
    for (auto& v : hA) v = u(rng);
    for (int64_t s = 0; s < batch; ++s)
      for (int i = 0; i < n; ++i) hA[s * n * n + i * n + i] += n;  // well conditioned
    for (auto& v : hb) v = u(rng);
    double *A0, *b0, *A, *b, *x;
    uint8_t* flags;
    CK(cudaMalloc(&A0, abytes));
    CK(cudaMalloc(&A, abytes));
    CK(cudaMalloc(&b0, bbytes));
    CK(cudaMalloc(&b, bbytes));
    CK(cudaMalloc(&x, bbytes));
    CK(cudaMalloc(&flags, batch));
    CK(cudaMemcpy(A0, hA.data(), abytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b0, hb.data(), bbytes, cudaMemcpyHostToDevice));
    // cuBLAS: pointer arrays, pivots, infos.
    std::vector<double*> pa(batch), pb(batch);
    for (int64_t s = 0; s < batch; ++s) {
      pa[s] = A + s * n * n;
      pb[s] = b + s * n;
    }
    double **dpa, **dpb;
    int *piv, *info;
    CK(cudaMalloc(&dpa, batch * sizeof(double*)));
    CK(cudaMalloc(&dpb, batch * sizeof(double*)));
    CK(cudaMalloc(&piv, batch * n * sizeof(int)));
    CK(cudaMalloc(&info, batch * sizeof(int)));
    CK(cudaMemcpy(dpa, pa.data(), batch * sizeof(double*), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpb, pb.data(), batch * sizeof(double*), cudaMemcpyHostToDevice));
    auto restore = [&] {
      CK(cudaMemcpyAsync(A, A0, abytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(b, b0, bbytes, cudaMemcpyDeviceToDevice));
    };
    const double cublas_ms = TimeIt(reps, restore, [&] {
      CB(cublasDgetrfBatched(h, n, dpa, n, piv, info, int(batch)));
      int hinfo = 0;
      CB(cublasDgetrsBatched(h, CUBLAS_OP_N, n, 1, dpa, n, piv, dpb, n, &hinfo, int(batch)));
    });
    auto row = [&](const char* name, double ms, double ref) {
      std::printf("%5d %9lld %-34s %7.3f ms %14.3e %8.2fx\n", n, (long long)batch, name, ms,
                  batch / (ms * 1e-3), ref / ms);
      std::fflush(stdout);
    };
    row("cuBLAS getrfBatched + getrsBatched", cublas_ms, cublas_ms);
    if (n <= trisolve::cuda::kDenseGpuMaxN) {
      trisolve::DenseProblem<double> p{batch, n, A0, b0};
      const double ms = TimeIt(reps, [] {}, [&] {
        auto st = trisolve::cuda::SolveDenseWarpDevice(p, x, flags, nullptr);
        if (!st.ok()) std::exit(2);
      });
      row(n <= trisolve::cuda::kDenseWarpMaxN       ? "trisolve gauss-jordan-warp"
          : n <= trisolve::cuda::kDenseTwoWarpsMaxN ? "trisolve gauss-jordan-2warps"
                                                    : "trisolve gauss-jordan-block",
          ms, cublas_ms);
      std::vector<double> hx(batch * n);
      CK(cudaMemcpy(hx.data(), x, bbytes, cudaMemcpyDeviceToHost));
      trisolve::DenseProblem<double> hp{batch, n, hA.data(), hb.data()};
      std::printf("      (its backward error, from the original arrays: %.1e)\n",
                  trisolve::DenseBackwardError(hp, hx.data(), nullptr));
    }
    if (n <= trisolve::cuda::kHouseholderBlockMaxN) {
      // The same matrices made symmetric: householder-pcr-block (one block a system).
      std::vector<double> hs(hA);
      for (int64_t q = 0; q < batch; ++q)
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < i; ++j)
            hs[q * n * n + i * n + j] = hs[q * n * n + j * n + i];
      CK(cudaMemcpy(A, hs.data(), abytes, cudaMemcpyHostToDevice));
      trisolve::DenseProblem<double> ps{batch, n, A, b0};
      const double hms = TimeIt(reps, [] {}, [&] {
        auto st = trisolve::cuda::SolveDenseHouseholderPcrBlockDevice(ps, x, flags, nullptr);
        if (!st.ok()) std::exit(2);
      });
      row("trisolve householder-pcr-block (sym.)", hms, cublas_ms);
    }
    if (n > trisolve::cuda::kDenseTwoWarpsMaxN) {
      trisolve::DenseProblem<double> p{batch, n, A0, b0};
      const double ms = TimeIt(reps, [] {}, [&] {
        auto st = trisolve::cuda::SolveDenseLuDevice(p, x, flags, libs, pool, nullptr);
        if (!st.ok()) std::exit(2);
      });
      row("trisolve lu (transpose + cuBLAS)", ms, cublas_ms);
    }
    for (void* q : {(void*)A0, (void*)A, (void*)b0, (void*)b, (void*)x, (void*)flags, (void*)dpa,
                    (void*)dpb, (void*)piv, (void*)info})
      CK(cudaFree(q));
  }
  cublasDestroy(h);

  std::printf("\n%6s %-44s %10s %9s %14s\n", "n", "solver", "time", "vs ref", "backward err");
  cusolverDnHandle_t sh;
  if (cusolverDnCreate(&sh) != CUSOLVER_STATUS_SUCCESS) return 1;
  for (int n : large) {
    const int64_t nn = int64_t(n) * n;
    std::vector<double> hA(nn), hb(n), hx(n);
    std::mt19937_64 rng(n);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) hA[int64_t(i) * n + j] = hA[int64_t(j) * n + i] = u(rng);
    for (int i = 0; i < n; ++i) hA[int64_t(i) * n + i] += (i % 2 ? -2 : 2) * std::sqrt(double(n));
    for (auto& v : hb) v = u(rng);
    double *A0, *A, *b0, *b, *x, *d, *e, *tau, *work;
    int *piv, *info;
    uint8_t* flags;
    for (double** q : {&A0, &A}) CK(cudaMalloc(q, nn * sizeof(double)));
    for (double** q : {&b0, &b, &x, &d, &e, &tau}) CK(cudaMalloc(q, n * sizeof(double)));
    CK(cudaMalloc(&piv, n * sizeof(int)));
    CK(cudaMalloc(&info, sizeof(int)));
    CK(cudaMalloc(&flags, 1));
    CK(cudaMemcpy(A0, hA.data(), nn * sizeof(double), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b0, hb.data(), n * sizeof(double), cudaMemcpyHostToDevice));
    int lw1 = 0, lw2 = 0, lw3 = 0;
    cusolverDnDgetrf_bufferSize(sh, n, n, A, n, &lw1);
    cusolverDnDsytrd_bufferSize(sh, CUBLAS_FILL_MODE_LOWER, n, A, n, d, e, tau, &lw2);
    cusolverDnDormtr_bufferSize(sh, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, n, 1,
                                A, n, tau, b, n, &lw3);
    CK(cudaMalloc(&work, sizeof(double) * std::max({lw1, lw2, lw3, 1})));
    auto restore = [&] {
      CK(cudaMemcpyAsync(A, A0, nn * sizeof(double), cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(b, b0, n * sizeof(double), cudaMemcpyDeviceToDevice));
    };
    // The normwise backward error of x (on the device) from the original arrays, on the host.
    auto backward = [&](const double* dx) {
      CK(cudaMemcpy(hx.data(), dx, n * sizeof(double), cudaMemcpyDeviceToHost));
      trisolve::DenseProblem<double> hp{1, n, hA.data(), hb.data()};
      return trisolve::DenseBackwardError(hp, hx.data(), nullptr);
    };
    auto row = [&](const char* name, double ms, double ref, double be) {
      std::printf("%6d %-44s %7.2f ms %8.2fx %14.1e\n", n, name, ms, ms / ref, be);
      std::fflush(stdout);
    };
    const double getrf_ms = TimeIt(reps, restore, [&] {
      cusolverDnDgetrf(sh, n, n, A, n, work, piv, info);
      cusolverDnDgetrs(sh, CUBLAS_OP_T, n, 1, A, n, piv, b, n, info);  // A^T: row-major A
    });
    row("cuSOLVER getrf + getrs", getrf_ms, getrf_ms, backward(b));
    trisolve::DenseProblem<double> p{1, n, A0, b0};
    const double lu_ms = TimeIt(reps, [] {}, [&] {
      CK(cudaMemsetAsync(flags, 0, 1));
      auto st = trisolve::cuda::SolveDenseLuDevice(p, x, flags, libs, pool, nullptr);
      if (!st.ok()) std::exit(2);
    });
    row("trisolve lu", lu_ms, getrf_ms, backward(x));
    for (int panel : {128, 256, 512}) {
      const double gj_ms = TimeIt(reps, [] {}, [&] {
        CK(cudaMemsetAsync(flags, 0, 1));
        auto st = trisolve::cuda::SolveDenseGaussJordanBlockedDevice(p, x, flags, libs, pool,
                                                                     nullptr, panel);
        if (!st.ok()) std::exit(2);
      });
      char name[64];
      std::snprintf(name, sizeof name, "trisolve gauss-jordan-blocked (panel %d)%s", panel,
                    panel == trisolve::cuda::kGaussJordanPanel ? " *" : "");
      row(name, gj_ms, getrf_ms, backward(x));
    }
    const double sytrd_ms = TimeIt(reps, restore, [&] {
      cusolverDnDsytrd(sh, CUBLAS_FILL_MODE_LOWER, n, A, n, d, e, tau, work, lw2, info);
    });
    row("cuSOLVER sytrd (reduction only)", sytrd_ms, sytrd_ms, -1);
    const double hp_ms = TimeIt(reps, [] {}, [&] {
      CK(cudaMemsetAsync(flags, 0, 1));
      auto st = trisolve::cuda::SolveDenseHouseholderPcrDevice(p, x, flags, libs, pool, nullptr);
      if (!st.ok()) std::exit(2);
    });
    row("trisolve householder-pcr (+1 refinement)", hp_ms, sytrd_ms, backward(x));
    for (void* q : {(void*)A0, (void*)A, (void*)b0, (void*)b, (void*)x, (void*)d, (void*)e,
                    (void*)tau, (void*)work, (void*)piv, (void*)info, (void*)flags})
      CK(cudaFree(q));
  }
  cusolverDnDestroy(sh);
  return 0;
}
