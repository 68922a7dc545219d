// The block family's Krylov paths on the device alone (multigrid-cg, multigrid-bicgstab, cg; the
// thesis' experiments, float64 and float32, to a tolerance), each with a fingerprint of its
// answer: iterations, status, the residual's bits and a hash of y's bits. Run on two builds of
// a change to the shared driver (trisolve/driver/block_krylov.h) or to a backend's steps: the
// columns after '|' must be identical (the device's sums are in a fixed order), the times
// within their run-to-run spread (alternate the builds: the second of a pair runs slower).
// Each case's second line times the solve again with the setup a prepared system keeps
// (cuda::PrepareBlockDevice: the hierarchy, cg's sign test) and the setup alone; its
// fingerprint must be the first line's ("same bits"). The solves run on a stream of the
// bench's own (as the server's, one the V-cycle's graphs can be captured from); the header says
// whether they launch the V-cycle as a graph (TRISOLVE_BLOCK_GRAPHS=0: plain launches).
// `parts` times the pieces of an iteration instead: one V-cycle launched plainly and replayed as
// a graph, its capture and instantiation, and a dot product read back through pageable memory
// (as DeviceSteps::Dots) against a page-locked mailbox, waited on the stream or on an event.
//   bench_block_krylov [REPS=5] [parts]   (median of REPS after a warm-up; of 3 where a solve
//                                          > 50 ms)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "block/block.h"
#include "block/multigrid.cuh"
#include "block/vector_kernels.cuh"
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
void Case(cuda::Pool& pool, cudaStream_t stream, int which, int64_t NM, BlockMethod m,
          double tol, int reps) {
  auto ex = which == 1 ? examples::ThesisExperiment1(NM, NM) : examples::ThesisExperiment2(NM, NM);
  Dev<T> d(ex, NM, NM);
  BlockOptions o{which == 2 && m == BlockMethod::kCg ? 100000 : 1000, tol, false};
  SolveInfo last;
  SystemStatus st = SystemStatus::kOk;
  auto zero_y = [&] {
    CK(cudaMemsetAsync(d.y, 0, NM * NM * sizeof(T), stream));
    CK(cudaStreamSynchronize(stream));
  };
  const double ms = bench::TimeIt(
      reps, zero_y,
      [&] {
        auto info = cuda::SolveBlockTridiagonalDevice(d.prob, m, o, d.y, &st, pool, SolveControl{},
                                                      stream);
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
    if (!cuda::PrepareBlockDevice(d.prob, m, pool, stream).ok()) std::exit(2);
  });
  auto kept = cuda::PrepareBlockDevice(d.prob, m, pool, stream);
  if (!kept.ok()) std::exit(2);
  SolveInfo again;
  const double kept_ms = bench::TimeIt(
      reps, zero_y,
      [&] {
        auto info = cuda::SolveBlockTridiagonalDevice(d.prob, m, o, d.y, &st, pool, SolveControl{},
                                                      stream, kept->get());
        if (!info.ok()) std::exit(2);
        again = *info;
      });
  const uint64_t xk = hash();
  std::printf("     kept setup %23.3f ms (setup alone %.3f ms) | it=%lld y=%016llx %s\n",
              kept_ms, setup_ms, (long long)again.iterations, (unsigned long long)xk,
              xk == x && again.iterations == last.iterations ? "same bits" : "DIFFERENT BITS");
  std::fflush(stdout);
}

// Microseconds per call of fn, averaged over n calls after 3 warm-ups, the stream drained after
// each call where `each` (a call's latency) and else only after all (the launch rate).
double MeanUs(cudaStream_t stream, int n, bool each, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  CK(cudaStreamSynchronize(stream));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    fn();
    if (each) CK(cudaStreamSynchronize(stream));
  }
  CK(cudaStreamSynchronize(stream));
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
             .count() /
         n;
}

// The pieces of an iteration on experiment 2 (float64) at NM x NM: the V-cycle plainly and as
// a graph (same bits: checked), its capture, and a dot product's read-back three ways.
void Parts(cuda::Pool& pool, cudaStream_t stream, int64_t NM) {
  using T = double;
  auto ex = examples::ThesisExperiment2(NM, NM);
  Dev<T> d(ex, NM, NM);
  const int64_t n = NM * NM;
  auto scratch = pool.Get(cuda::kAccBytes + 256 + 2 * n * int64_t(sizeof(T)));
  if (!scratch.ok()) std::exit(2);
  auto* acc = static_cast<double*>(scratch->get());
  auto* flag = reinterpret_cast<uint8_t*>(acc + cuda::kAccBytes / 8);
  T* z1 = reinterpret_cast<T*>(flag + 256);
  T* z2 = z1 + n;
  CK(cudaMemsetAsync(acc, 0, cuda::kAccBytes + 256, stream));
  auto h = cuda::BuildMgDevice(d.prob, pool, flag, stream);
  if (!h.ok()) std::exit(2);
  const int calls = NM >= 4096 ? 50 : 400;
  auto plain = [&] {
    if (!cuda::ApplyVCycle(*h, d.prob.f, z1, stream).ok()) std::exit(2);
  };
  double capture_us = 0;
  cudaGraphExec_t exec = nullptr;
  for (int i = 0; i < 20; ++i) {  // capture, instantiate, destroy: what each solve pays a pair
    const auto t0 = std::chrono::steady_clock::now();
    if (exec) CK(cudaGraphExecDestroy(exec));
    exec = cuda::CaptureVCycle(*h, d.prob.f, z2, stream);
    if (!exec) {
      std::printf("parts %5lld: the V-cycle could not be captured\n", (long long)NM);
      std::exit(2);
    }
    capture_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                      .count();
  }
  capture_us /= 20;
  auto graph = [&] { CK(cudaGraphLaunch(exec, stream)); };
  const double plain_rate = MeanUs(stream, calls, false, plain);
  const double graph_rate = MeanUs(stream, calls, false, graph);
  const double plain_lat = MeanUs(stream, calls, true, plain);
  const double graph_lat = MeanUs(stream, calls, true, graph);
  std::vector<T> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  CK(cudaMemcpy(a.data(), z1, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), z2, n * sizeof(T), cudaMemcpyDeviceToHost));
  const bool same = std::memcmp(a.data(), b.data(), n * sizeof(T)) == 0;
  CK(cudaGraphExecDestroy(exec));
  std::printf("parts %5lld: %zu levels; V-cycle back to back %8.2f us plain, %8.2f us graph; "
              "each waited %8.2f us plain, %8.2f us graph; capture+instantiate %7.2f us; %s\n",
              (long long)NM, h->levels.size(), plain_rate, graph_rate, plain_lat, graph_lat,
              capture_us, same ? "same bits" : "DIFFERENT BITS");
  // A dot's read-back: as Dots does now (pageable stack memory, the stream waited on), into a
  // page-locked mailbox waited on the stream, and into the mailbox waited on an event.
  const unsigned rb = unsigned(std::min<int64_t>(cuda::Blocks(n), cuda::kReduceBlocks));
  double* box;
  CK(cudaHostAlloc(&box, 2 * sizeof(double), cudaHostAllocPortable));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  double sink = 0;
  auto pageable = [&] {
    cuda::DotKernel<T><<<rb, cuda::kThreads, 0, stream>>>(n, z1, z1, z1, z2, acc);
    double hh[2];
    CK(cudaMemcpyAsync(hh, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    sink += hh[0];
  };
  auto pinned = [&] {
    cuda::DotKernel<T><<<rb, cuda::kThreads, 0, stream>>>(n, z1, z1, z1, z2, acc);
    CK(cudaMemcpyAsync(box, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    sink += box[0];
  };
  auto event = [&] {
    cuda::DotKernel<T><<<rb, cuda::kThreads, 0, stream>>>(n, z1, z1, z1, z2, acc);
    CK(cudaMemcpyAsync(box, acc, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream));
    CK(cudaEventRecord(ev, stream));
    CK(cudaEventSynchronize(ev));
    sink += box[0];
  };
  double us[3] = {0, 0, 0};
  for (int round = 0; round < 3; ++round) {  // interleaved: no order favours one
    us[0] += MeanUs(stream, calls, false, pageable) / 3;
    us[1] += MeanUs(stream, calls, false, pinned) / 3;
    us[2] += MeanUs(stream, calls, false, event) / 3;
  }
  CK(cudaEventDestroy(ev));
  CK(cudaFreeHost(box));
  std::printf("parts %5lld: dot read back %6.2f us pageable + stream wait, %6.2f us pinned + "
              "stream wait, %6.2f us pinned + event wait%s\n",
              (long long)NM, us[0], us[1], us[2], sink == sink ? "" : " (NaN)");
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const bool parts = argc > 2 && std::strcmp(argv[2], "parts") == 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; V-cycle launched %s\n", prop.name,
              cuda::BlockGraphsOn() ? "as a graph (TRISOLVE_BLOCK_GRAPHS unset or 1)"
                                    : "plainly (TRISOLVE_BLOCK_GRAPHS=0)");
  cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{40} << 30);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (parts) {
    for (int64_t NM : {128, 512, 1024, 4096}) Parts(pool, stream, NM);
    return 0;
  }
  for (int64_t NM : {128, 512, 1024, 4096, 8192})
    Case<double>(pool, stream, 2, NM, BlockMethod::kMultigridCg, 1e-10, reps);
  for (int64_t NM : {1024, 4096})
    Case<float>(pool, stream, 2, NM, BlockMethod::kMultigridCg, 1e-5, reps);
  for (int64_t NM : {1024, 4096})
    Case<double>(pool, stream, 1, NM, BlockMethod::kMultigridBicgstab, 1e-10, reps);
  for (int64_t NM : {128, 1024})
    Case<double>(pool, stream, 2, NM, BlockMethod::kCg, 1e-10, reps);
  Case<float>(pool, stream, 2, 512, BlockMethod::kCg, 1e-5, reps);
  return 0;
}
