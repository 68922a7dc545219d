// Tridiagonal jobs whose arrays are in this process's CUDA memory (RegisterCudaMemory), against
// a running trisolved --backend cuda on the same host, beside Thomas on one local core for the
// same systems in the same run: the whole system (a, b, c, d in, x out) and by handle (the
// right-hand side in, x out). Every answer's backward error is checked on the first request.
//
//   bench_cuda_ipc --server 127.0.0.1:PORT [--batch 65536] [--n 256] [--requests 20]
//
// Prints one line per mode: p50 and min of the client's time, the server's own h2d, compute
// and d2h at the p50 request, and the local core's p50.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "trisolve/client.h"
#include "trisolve/cuda_ipc.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double BackwardError(const std::vector<double>& a, const std::vector<double>& b,
                     const std::vector<double>& c, const std::vector<double>& d,
                     const std::vector<double>& x, int64_t batch, int64_t n) {
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = s * n + k;
      double r = b[i] * x[i] - d[i], m = std::abs(b[i] * x[i]) + std::abs(d[i]);
      if (k > 0) r += a[i] * x[i - 1], m += std::abs(a[i] * x[i - 1]);
      if (k + 1 < n) r += c[i] * x[i + 1], m += std::abs(c[i] * x[i + 1]);
      const double e = std::abs(r) / (m > 0 ? m : 1);
      worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    }
  return worst;
}

struct Sample {
  double client_ms, h2d_ms, compute_ms, d2h_ms;
};

void Report(const char* mode, std::vector<Sample> s, double core_ms, double bytes) {
  std::sort(s.begin(), s.end(), [](const Sample& x, const Sample& y) { return x.client_ms < y.client_ms; });
  const Sample& p50 = s[s.size() / 2];
  std::printf("%-28s p50 %8.3f ms  min %8.3f ms  (server h2d %.3f, compute %.3f, d2h %.3f)  "
              "one local core %8.2f ms  -> %.1fx  payload %.1f GB/s\n",
              mode, p50.client_ms, s.front().client_ms, p50.h2d_ms, p50.compute_ms, p50.d2h_ms,
              core_ms, core_ms / p50.client_ms, bytes / (p50.client_ms * 1e6));
}

}  // namespace

int main(int argc, char** argv) {
  std::string server;
  int64_t batch = 65536, n = 256;
  int requests = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--server") server = v;
    else if (k == "--batch") batch = std::atoll(v.c_str());
    else if (k == "--n") n = std::atoll(v.c_str());
    else if (k == "--requests") requests = std::max(1, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (server.empty()) {
    std::fprintf(stderr, "usage: bench_cuda_ipc --server HOST:PORT [--batch B] [--n N] [--requests R]\n");
    return 2;
  }
  const int64_t e = batch * n;
  const size_t eb = size_t(e) * sizeof(double);
  const size_t ne = static_cast<size_t>(e);
  std::vector<double> a(ne), b(ne), c(ne), d(ne);
  std::mt19937_64 g(1);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < e; ++i) a[i] = u(g), c[i] = u(g), b[i] = 3 + u(g), d[i] = 10 * u(g);

  // One allocation: a, b, c, d, x.
  void* base = nullptr;
  if (cudaMalloc(&base, 5 * eb) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %zu bytes failed\n", 5 * eb);
    return 1;
  }
  auto* dev = static_cast<double*>(base);
  double *da = dev, *db = dev + e, *dc = dev + 2 * e, *dd = dev + 3 * e, *dx = dev + 4 * e;
  for (auto [dst, src] : {std::pair{da, &a}, {db, &b}, {dc, &c}, {dd, &d}})
    cudaMemcpy(dst, src->data(), eb, cudaMemcpyHostToDevice);
  auto mem = trisolve::DescribeCudaMemory(base, int64_t(5 * eb));
  if (!mem.ok()) {
    std::fprintf(stderr, "%s\n", std::string(mem.status().message()).c_str());
    return 1;
  }
  trisolve::Client::Options o;
  o.target = server;
  o.transport = trisolve::Transport::kGrpc;
  trisolve::Client client(o);
  if (auto st = client.RegisterCudaMemory(*mem, "bench"); !st.ok()) {
    std::fprintf(stderr, "RegisterCudaMemory: %s\n", st.ToString().c_str());
    return 1;
  }
  std::vector<double> x(ne);
  auto check = [&](const char* what) {
    cudaMemcpy(x.data(), dx, eb, cudaMemcpyDeviceToHost);
    const double be = BackwardError(a, b, c, d, x, batch, n);
    std::printf("%s: backward error %.2e\n", what, be);
    return be < 1e-12;
  };
  const std::vector<int64_t> shape = {batch, n};

  // One local core: Thomas over the same systems, from host memory, on this thread alone (the
  // CPU reference spreads a batch over the host's cores with OpenMP, which is not what a
  // simulation code's own serial solve costs).
  std::vector<double> hx(ne), cp(static_cast<size_t>(n));
  std::vector<double> core;
  for (int r = 0; r < std::max(3, requests / 4); ++r) {
    const auto t0 = Clock::now();
    for (int64_t q = 0; q < batch; ++q) {
      const double *as = a.data() + q * n, *bs = b.data() + q * n, *cs = c.data() + q * n,
                   *ds = d.data() + q * n;
      double* xs = hx.data() + q * n;
      double beta = bs[0];
      cp[0] = cs[0] / beta;
      xs[0] = ds[0] / beta;
      for (int64_t i = 1; i < n; ++i) {
        beta = bs[i] - as[i] * cp[size_t(i - 1)];
        cp[size_t(i)] = cs[i] / beta;
        xs[i] = (ds[i] - as[i] * xs[i - 1]) / beta;
      }
      for (int64_t i = n - 2; i >= 0; --i) xs[i] -= cp[size_t(i)] * xs[i + 1];
    }
    core.push_back(Ms(Clock::now() - t0));
  }
  std::sort(core.begin(), core.end());
  // (also keeps the loop from being optimized away)
  std::printf("one local core: backward error %.2e\n", BackwardError(a, b, c, d, hx, batch, n));
  const double core_ms = core[core.size() / 2];

  bool ok = true;
  // The whole system: four arrays in, x out, all in the device region.
  {
    trisolve::Job job{trisolve::Kind::kTridiagonal};
    job.arrays = {{"a", {trisolve::DType::kFloat64, shape, da}},
                  {"b", {trisolve::DType::kFloat64, shape, db}},
                  {"c", {trisolve::DType::kFloat64, shape, dc}},
                  {"d", {trisolve::DType::kFloat64, shape, dd}}};
    job.options.x_out = dx;
    std::vector<Sample> s;
    for (int r = 0; r <= requests; ++r) {
      cudaMemset(dx, 0, eb);
      const auto t0 = Clock::now();
      auto res = client.Solve(job);
      const double ms = Ms(Clock::now() - t0);
      if (!res.ok()) {
        std::fprintf(stderr, "Solve: %s\n", res.status().ToString().c_str());
        return 1;
      }
      if (r == 0) {  // the first: checked, and not timed (the server's first use of its pools)
        ok &= check("whole system");
        continue;
      }
      const auto& t = res->summary.timings;
      s.push_back({ms, t.h2d_us / 1e3, t.compute_us / 1e3, t.d2h_us / 1e3});
    }
    Report("whole system, device memory", s, core_ms, 5.0 * double(eb));
  }
  // By handle: the coefficients prepared once (from the device region: the server copies them
  // to its host once), the right-hand side in and x out in the device region.
  {
    trisolve::Job sys{trisolve::Kind::kTridiagonal};
    sys.arrays = {{"a", {trisolve::DType::kFloat64, shape, da}},
                  {"b", {trisolve::DType::kFloat64, shape, db}},
                  {"c", {trisolve::DType::kFloat64, shape, dc}}};
    auto created = client.CreateSystem(sys);
    if (!created.ok()) {
      std::fprintf(stderr, "CreateSystem: %s\n", created.status().ToString().c_str());
      return 1;
    }
    trisolve::JobOptions jo;
    jo.x_out = dx;
    std::vector<Sample> s;
    for (int r = 0; r <= requests; ++r) {
      cudaMemset(dx, 0, eb);
      const auto t0 = Clock::now();
      auto res = client.SolveSystem(created->handle, {trisolve::DType::kFloat64, shape, dd}, {}, jo);
      const double ms = Ms(Clock::now() - t0);
      if (!res.ok()) {
        std::fprintf(stderr, "SolveSystem: %s\n", res.status().ToString().c_str());
        return 1;
      }
      if (r == 0) {
        ok &= check("by handle");
        continue;
      }
      const auto& t = res->summary.timings;
      s.push_back({ms, t.h2d_us / 1e3, t.compute_us / 1e3, t.d2h_us / 1e3});
    }
    Report("by handle, device memory", s, core_ms, 2.0 * double(eb));
    (void)client.ReleaseSystem(created->handle);
  }
  (void)client.UnregisterCudaMemory(*mem);
  cudaFree(base);
  return ok ? 0 : 1;
}
