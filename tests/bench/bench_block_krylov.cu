// The block family's Krylov paths on the device alone (multigrid-cg, multigrid-bicgstab, cg; the
// thesis' experiments, float64 and float32, to a tolerance), each with a fingerprint of its
// answer: iterations, status, the residual's bits and a hash of y's bits. Run on two builds of
// a change to the shared driver (trisolve/driver/block_krylov.h) or to a backend's steps: the
// columns after '|' must be identical (the device's sums are in a fixed order), the times
// within their run-to-run spread (alternate the builds: the second of a pair runs slower).
// Each case's second line times the solve again with the setup a prepared system keeps
// (cuda::PrepareBlockDevice: the hierarchy, cg's sign test) and the setup alone; its
// fingerprint must be the first line's ("same bits").
//   bench_block_krylov [REPS=5]   (median of REPS after a warm-up; of 3 where a solve > 50 ms)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "block/block.h"
#include "runtime/memory_pool.h"
#include "trisolve/examples.h"

using namespace trisolve;

template <typename T>
struct Dev {
  std::vector<T*> p;
  BlockTridiagonalProblem<T> prob;
  T* y;
  Dev(const examples::Arrays& ex, int64_t N, int64_t M) {
    const char* names[6] = {"aC", "cC", "bC", "cA", "cB", "f"};
    std::vector<T> h(N * M);
    for (const char* k : names) {
      const double* s = ex.at(k).as<double>();
      for (int64_t e = 0; e < N * M; ++e) h[e] = T(s[e]);
      T* d;
      CK(cudaMalloc(&d, N * M * sizeof(T)));
      CK(cudaMemcpy(d, h.data(), N * M * sizeof(T), cudaMemcpyHostToDevice));
      p.push_back(d);
    }
    CK(cudaMalloc(&y, N * M * sizeof(T)));
    prob = {N, M, p[0], p[1], p[2], p[3], p[4], p[5], nullptr};
  }
  ~Dev() {
    for (T* d : p) cudaFree(d);
    cudaFree(y);
  }
};

template <typename T>
void Case(cuda::Pool& pool, int which, int64_t NM, BlockMethod m, double tol, int reps) {
  auto ex = which == 1 ? examples::ThesisExperiment1(NM, NM) : examples::ThesisExperiment2(NM, NM);
  Dev<T> d(ex, NM, NM);
  BlockOptions o{which == 2 && m == BlockMethod::kCg ? 100000 : 1000, tol, false};
  SolveInfo last;
  SystemStatus st = SystemStatus::kOk;
  const double ms = bench::TimeIt(
      reps, [&] { CK(cudaMemset(d.y, 0, NM * NM * sizeof(T))); },
      [&] {
        auto info = cuda::SolveBlockTridiagonalDevice(d.prob, m, o, d.y, &st, pool, SolveControl{},
                                                      nullptr);
        if (!info.ok()) std::exit(2);
        last = *info;
      });
  auto hash = [&] {
    std::vector<T> h(NM * NM);
    CK(cudaMemcpy(h.data(), d.y, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    uint64_t x = 1469598103934665603ull;
    auto* b = reinterpret_cast<const unsigned char*>(h.data());
    for (size_t i = 0; i < h.size() * sizeof(T); ++i) x = (x ^ b[i]) * 1099511628211ull;
    return x;
  };
  const uint64_t x = hash();
  std::printf("exp%d f%zu %5lld %-20s %9.3f ms | %s it=%lld st=%d res=%a y=%016llx\n", which,
              8 * sizeof(T), (long long)NM, std::string(MethodName(m)).c_str(), ms,
              last.method.c_str(), (long long)last.iterations, int(st), last.residual,
              (unsigned long long)x);
  std::fflush(stdout);
  // The same solve with the setup kept (what a solve by handle runs), and the setup alone.
  const double setup_ms = bench::TimeIt(reps, [&] {
    if (!cuda::PrepareBlockDevice(d.prob, m, pool, nullptr).ok()) std::exit(2);
  });
  auto kept = cuda::PrepareBlockDevice(d.prob, m, pool, nullptr);
  if (!kept.ok()) std::exit(2);
  SolveInfo again;
  const double kept_ms = bench::TimeIt(
      reps, [&] { CK(cudaMemset(d.y, 0, NM * NM * sizeof(T))); },
      [&] {
        auto info = cuda::SolveBlockTridiagonalDevice(d.prob, m, o, d.y, &st, pool, SolveControl{},
                                                      nullptr, kept->get());
        if (!info.ok()) std::exit(2);
        again = *info;
      });
  const uint64_t xk = hash();
  std::printf("     kept setup %23.3f ms (setup alone %.3f ms) | it=%lld y=%016llx %s\n",
              kept_ms, setup_ms, (long long)again.iterations, (unsigned long long)xk,
              xk == x && again.iterations == last.iterations ? "same bits" : "DIFFERENT BITS");
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{40} << 30);
  for (int64_t NM : {128, 1024, 4096, 8192})
    Case<double>(pool, 2, NM, BlockMethod::kMultigridCg, 1e-10, reps);
  for (int64_t NM : {1024, 4096}) Case<float>(pool, 2, NM, BlockMethod::kMultigridCg, 1e-5, reps);
  for (int64_t NM : {1024, 4096})
    Case<double>(pool, 1, NM, BlockMethod::kMultigridBicgstab, 1e-10, reps);
  for (int64_t NM : {128, 1024}) Case<double>(pool, 2, NM, BlockMethod::kCg, 1e-10, reps);
  Case<float>(pool, 2, 512, BlockMethod::kCg, 1e-5, reps);
  return 0;
}
