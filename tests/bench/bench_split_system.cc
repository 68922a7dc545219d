// One tridiagonal system through the CUDA backend on one device, and through the multi-device
// backend split by rows over D devices (kernels/cpu/split_system.h), end to end from host memory
// (the arrays in, x out: what the server's backend call does), float64, diagonally dominant
// rows. Every answer's backward error is computed from the original arrays, and the two answers
// are compared. --huge solves one system larger than one device over the devices (and says
// what one device answers).
// --pinned 1: the arrays page-locked first (Backend::PinHostMemory), as a client's registered
// shared memory is in the server, so the copies run at the link's rate, not the host's.
// With --pinned, a row of the copies alone bounds the split: a, b, c, d in and x back between
// page-locked host memory and one device, then the halves to and from D devices at once.
//   bench_split_system [--log2n 24,26,28] [--reps 5] [--devices D] [--huge LOG2N] [--pinned 1]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "split_bench.h"
#include "trisolve/backend.h"

namespace {

using namespace trisolve;
using namespace trisolve::bench;

struct System {
  int64_t n;
  std::unique_ptr<double[]> a, b, c, d;
  TridiagonalProblem<double> P() const {
    return {1, n, Layout::kFlat, a.get(), b.get(), c.get(), d.get()};
  }
};

System Make(int64_t n) {
  System s{n, std::unique_ptr<double[]>(new double[size_t(n)]),
           std::unique_ptr<double[]>(new double[size_t(n)]),
           std::unique_ptr<double[]>(new double[size_t(n)]),
           std::unique_ptr<double[]>(new double[size_t(n)])};
  ParallelFor(n, [&](int64_t i0, int64_t i1, int k) {
    std::mt19937_64 rng(uint64_t(k) * 7919 + uint64_t(n));
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = i0; i < i1; ++i) {
      s.a[i] = u(rng);
      s.b[i] = 4 + u(rng);
      s.c[i] = u(rng);
      s.d[i] = u(rng);
    }
  });
  return s;
}

// ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf), threaded.
double BackwardError(const System& s, const double* x) {
  const int t = Threads();
  std::vector<double> r(size_t(t), 0), an(size_t(t), 0), xn(size_t(t), 0), dn(size_t(t), 0);
  ParallelFor(s.n, [&](int64_t i0, int64_t i1, int k) {
    for (int64_t i = i0; i < i1; ++i) {
      double ax = s.b[i] * x[i], row = std::abs(s.b[i]);
      if (i > 0) ax += s.a[i] * x[i - 1], row += std::abs(s.a[i]);
      if (i + 1 < s.n) ax += s.c[i] * x[i + 1], row += std::abs(s.c[i]);
      const double res = std::abs(s.d[i] - ax);
      r[size_t(k)] = std::max(r[size_t(k)], std::isfinite(res) ? res : INFINITY);
      an[size_t(k)] = std::max(an[size_t(k)], row);
      xn[size_t(k)] = std::max(xn[size_t(k)], std::abs(x[i]));
      dn[size_t(k)] = std::max(dn[size_t(k)], std::abs(s.d[i]));
    }
  });
  auto mx = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  return mx(r) / (mx(an) * mx(xn) + mx(dn));
}

Timed Time(Backend& be, const System& s, double* x, int reps) {
  return MedianSolve(reps, [&](SystemStatus* st) {
    return be.Solve(s.P(), TridiagonalMethod::kAuto, {x, st}, {});
  });
}

// The copies of one system of n rows alone (4 arrays in, x back), from page-locked memory,
// over `devices` devices at once in equal shares: the floor of a solve from such memory.
double CopyFloorMs(int64_t n, int devices, int reps) {
  const size_t in = size_t(4 * n * 8), out = size_t(n * 8);
  void *h_in = nullptr, *h_out = nullptr;
  if (cudaHostAlloc(&h_in, in, cudaHostAllocPortable) != cudaSuccess ||
      cudaHostAlloc(&h_out, out, cudaHostAllocPortable) != cudaSuccess)
    return NAN;
  std::memset(h_in, 0, in);
  std::vector<void*> d_in(static_cast<size_t>(devices)), d_out(static_cast<size_t>(devices));
  std::vector<cudaStream_t> st(static_cast<size_t>(devices));
  for (int g = 0; g < devices; ++g) {
    cudaSetDevice(g);
    if (cudaMalloc(&d_in[size_t(g)], in / size_t(devices)) != cudaSuccess ||
        cudaMalloc(&d_out[size_t(g)], out / size_t(devices)) != cudaSuccess)
      return NAN;
    cudaStreamCreate(&st[size_t(g)]);
  }
  std::vector<double> ms;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = Clock::now();
    for (int g = 0; g < devices; ++g) {
      cudaSetDevice(g);
      const size_t qi = in / size_t(devices), qo = out / size_t(devices);
      cudaMemcpyAsync(d_in[size_t(g)], static_cast<char*>(h_in) + size_t(g) * qi, qi,
                      cudaMemcpyHostToDevice, st[size_t(g)]);
      cudaMemcpyAsync(static_cast<char*>(h_out) + size_t(g) * qo, d_out[size_t(g)], qo,
                      cudaMemcpyDeviceToHost, st[size_t(g)]);
    }
    for (int g = 0; g < devices; ++g) cudaStreamSynchronize(st[size_t(g)]);
    if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  for (int g = 0; g < devices; ++g) {
    cudaSetDevice(g);
    cudaFree(d_in[size_t(g)]);
    cudaFree(d_out[size_t(g)]);
    cudaStreamDestroy(st[size_t(g)]);
  }
  cudaFreeHost(h_in);
  cudaFreeHost(h_out);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> log2n = {24, 26, 28};
  int reps = 5, devices = CudaDeviceCount(), huge = 0, pinned = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--log2n") log2n = Ints(argv[i + 1]);
    else if (k == "--reps") reps = std::atoi(argv[i + 1]);
    else if (k == "--devices") devices = std::atoi(argv[i + 1]);
    else if (k == "--huge") huge = std::atoi(argv[i + 1]);
    else if (k == "--pinned") pinned = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (devices < 2) {
    std::printf("bench_split_system: %d CUDA device(s); two or more are needed: skipped\n",
                devices);
    return 0;
  }
  std::vector<int> list;
  for (int d = 0; d < devices; ++d) list.push_back(d);
  auto one = MakeCudaBackend();
  auto many = MakeMultiDeviceCudaBackend(list);
  if (!one.ok() || !many.ok()) {
    std::fprintf(stderr, "backends: %s / %s\n", std::string(one.status().message()).c_str(),
                 std::string(many.status().message()).c_str());
    return 1;
  }
  const BackendInfo info = (*one)->Info();
  std::printf("%s x %d, %d host threads; float64, one system, diagonally dominant rows; end to "
              "end from %s host memory (arrays in, x out), median of %d after a warm-up\n\n",
              info.devices.empty() ? "?" : info.devices[0].name.c_str(), devices, Threads(),
              pinned ? "page-locked" : "pageable", reps);
  std::printf("| n | GB (a,b,c,d,x) | 1 device | %d devices | speed-up | backward error 1 / %d | "
              "max diff | method (%d devices) |\n|---|---|---|---|---|---|---|---|\n",
              devices, devices, devices);
  for (int l : log2n) {
    const int64_t n = int64_t{1} << l;
    const System s = Make(n);
    std::unique_ptr<double[]> x1(new double[size_t(n)]), x2(new double[size_t(n)]);
    std::vector<double*> arrays = {s.a.get(), s.b.get(), s.c.get(), s.d.get(), x1.get(),
                                   x2.get()};
    if (pinned)
      for (double* p : arrays)
        for (Backend* be : {one->get(), many->get()})
          if (auto st = be->PinHostMemory(p, n * 8); !st.ok()) {
            std::fprintf(stderr, "PinHostMemory: %s\n", std::string(st.status().message()).c_str());
            return 1;
          }
    const Timed t1 = Time(**one, s, x1.get(), reps);
    const Timed t2 = Time(**many, s, x2.get(), reps);
    if (pinned)
      for (double* p : arrays) {
        (*many)->UnpinHostMemory(p);  // the workers only recorded it; the first backend pinned it
        (*one)->UnpinHostMemory(p);
      }
    const double be1 = t1.ok ? BackwardError(s, x1.get()) : NAN;
    const double be2 = t2.ok ? BackwardError(s, x2.get()) : NAN;
    const double diff = t1.ok && t2.ok ? Distance(n, x2.get(), x1.get()) : NAN;
    std::printf("| 2^%d | %.1f | %s | %s | %.2fx | %.1e / %.1e | %.1e | %s |\n", l,
                40.0 * double(n) / 1e9,
                Cell(t1).c_str(), Cell(t2).c_str(),
                t1.ok && t2.ok ? t1.median_ms / t2.median_ms : NAN, be1, be2, diff,
                t2.what.c_str());
    if (pinned) {
      const double c1 = CopyFloorMs(n, 1, reps), cd = CopyFloorMs(n, devices, reps);
      std::printf("| 2^%d, the copies alone | | %.2f ms | %.2f ms | %.2fx | | | |\n", l, c1, cd,
                  c1 / cd);
    }
    std::fflush(stdout);
  }
  if (huge > 0) {
    const int64_t n = int64_t{1} << huge;
    std::printf("\nOne system of 2^%d unknowns (%.1f GB with x):\n", huge, 40.0 * double(n) / 1e9);
    std::fflush(stdout);
    const System s = Make(n);
    std::unique_ptr<double[]> x(new double[size_t(n)]);
    SystemStatus st;
    auto t0 = Clock::now();
    auto single = (*one)->Solve(s.P(), TridiagonalMethod::kAuto, {x.get(), &st}, {});
    std::printf("  1 device: %s (%.0f ms)\n",
                single.ok() ? single->method.c_str()
                            : std::string(single.status().message()).substr(0, 200).c_str(),
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    std::fflush(stdout);
    t0 = Clock::now();
    auto split = (*many)->Solve(s.P(), TridiagonalMethod::kAuto, {x.get(), &st}, {});
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!split.ok()) {
      std::printf("  %d devices: %s\n", devices,
                  std::string(split.status().message()).substr(0, 200).c_str());
      return 1;
    }
    std::printf("  %d devices: %.0f ms, status %s, backward error %.1e, %s\n", devices, ms,
                st == SystemStatus::kOk ? "OK" : "not OK", BackwardError(s, x.get()),
                split->method.c_str());
  }
  return 0;
}
