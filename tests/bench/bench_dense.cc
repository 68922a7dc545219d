// Batched small dense systems on the GPU: trisolve's warp Gauss-Jordan against cuBLAS
// getrfBatched + getrsBatched, on the same data (2^26 matrix entries per order), float64.
// cuBLAS reads the row-major matrices as column-major, i.e. solves A^T x = b: the same work.
//   bench_dense [--entries 67108864] [--reps 10]
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
#include "dense_cuda.h"

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
  for (int i = 1; i + 1 < argc; i += 2) {
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
      row(n <= trisolve::cuda::kDenseWarpMaxN ? "trisolve gauss-jordan-warp"
                                              : "trisolve gauss-jordan-smem",
          ms, cublas_ms);
    } else {
      std::printf("%5d %9lld %-34s %s\n", n, (long long)batch, "trisolve",
                  "no GPU kernel for n > 64 yet (host path)");
    }
    for (void* q : {(void*)A0, (void*)A, (void*)b0, (void*)b, (void*)x, (void*)flags, (void*)dpa,
                    (void*)dpb, (void*)piv, (void*)info})
      CK(cudaFree(q));
  }
  cublasDestroy(h);
  return 0;
}
