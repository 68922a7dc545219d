// Each device's solves while host memory is registered and unregistered beside them, as
// clients come and go (a client's shared memory, a request ring, a staging region: each is
// page-locked when registered, and unlocked when it goes). Threads call the multi-device CUDA
// backend over every device with unary tridiagonal solves from their own page-locked arrays,
// for --seconds each phase:
//   quiet:    nothing else;
//   backend:  another thread registers and unregisters 64 MB regions through the backend
//             (Backend::PinHostMemory: the registration context, runtime/host_registration.h);
//   device 0: the same through device 0's primary context (cudaSetDevice(0), cudaHostRegister):
//             where the backend registered until 2026-11-28.
// Per device: the jobs it ran and its mean time a job (Info: job_seconds / jobs). Every answer
// is checked against the CPU reference's once a thread a phase.
//   bench_registration [--clients 16] [--shape 1024x1024] [--seconds 3] [--rounds 2]
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "trisolve/backend.h"
#include "tridiagonal_case.h"

namespace {

using namespace trisolve;
using Clock = std::chrono::steady_clock;

using Case = bench::TridiagonalCase;
using bench::Distance;

struct Tally {
  std::vector<int64_t> jobs;
  std::vector<double> seconds;
};
Tally Read(const Backend& be) {
  Tally t;
  for (const DeviceInfo& d : be.Info().devices) {
    t.jobs.push_back(d.jobs);
    t.seconds.push_back(d.job_seconds);
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 16, rounds = 2;
  double seconds = 3;
  std::string shape = "1024x1024";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--clients")) clients = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--shape")) shape = argv[i + 1];
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  const int present = CudaDeviceCount();
  if (present == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  const int64_t batch = std::atoll(shape.c_str());
  const int64_t n = std::atoll(shape.c_str() + shape.find('x') + 1);
  const Case k = bench::MakeTridiagonalCase(batch, n);
  std::vector<int> list;
  for (int q = 0; q < present; ++q) list.push_back(q);
  auto made = MakeMultiDeviceCudaBackend(list);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  Backend& be = **made;
  // Each client's arrays, page-locked through the backend.
  struct Own {
    std::vector<double> a, b, c, d, x;
  };
  std::vector<Own> own(static_cast<size_t>(clients));
  for (auto& o : own) {
    o.a = k.a, o.b = k.b, o.c = k.c, o.d = k.d;
    o.x.resize(k.a.size());
    for (auto* v : {&o.a, &o.b, &o.c, &o.d, &o.x})
      if (!be.PinHostMemory(v->data(), int64_t(v->size() * 8)).ok()) return 1;
  }
  // The regions registered and unregistered meanwhile (64 MB each, touched once).
  constexpr size_t kRegion = size_t(64) << 20;
  std::vector<std::vector<char>> churn(4, std::vector<char>(kRegion, 1));

  std::printf(
      "%d CUDA devices, %d threads of unary tridiagonal %s float64 solves from page-locked "
      "arrays (%.0f MB a call), %.0f s a phase; beside them, 64 MB regions registered and "
      "unregistered by one more thread\n",
      present, clients, shape.c_str(), 5.0 * double(batch * n) * 8 / 1e6, seconds);
  std::printf("%-10s %9s %9s", "churn", "calls/s", "regions/s");
  for (int d = 0; d < present; ++d) std::printf("  %18s", ("cuda:" + std::to_string(d) + " jobs, ms").c_str());
  std::printf("\n");
  std::atomic<int> bad{0};
  for (int round = 0; round < rounds; ++round)
    for (const char* phase : {"quiet", "backend", "device 0"}) {
      const Tally before = Read(be);
      std::atomic<bool> stop{false};
      std::atomic<int64_t> calls{0}, regions{0};
      const auto t0 = Clock::now();
      std::vector<std::thread> threads;
      for (int id = 0; id < clients; ++id)
        threads.emplace_back([&, id] {
          Own& o = own[size_t(id)];
          const TridiagonalProblem<double> mine{k.batch,    k.n,        Layout::kFlat, o.a.data(),
                                                o.b.data(), o.c.data(), o.d.data()};
          std::vector<SystemStatus> st(static_cast<size_t>(k.batch));
          for (int q = 0; Clock::now() - t0 < std::chrono::duration<double>(seconds); ++q) {
            auto r = be.Solve(mine, TridiagonalMethod::kAuto, {o.x.data(), st.data()}, {});
            if (!r.ok() || (q == 0 && !(Distance(o.x, k.want) <= 1e-12))) ++bad;
            ++calls;
          }
        });
      std::thread registrar([&] {
        if (!std::strcmp(phase, "quiet")) return;
        const bool primary = !std::strcmp(phase, "device 0");
        for (size_t i = 0; !stop.load(); ++i) {
          void* p = churn[i % churn.size()].data();
          if (primary) {
            cudaSetDevice(0);
            if (cudaHostRegister(p, kRegion, cudaHostRegisterPortable) != cudaSuccess) ++bad;
            if (cudaHostUnregister(p) != cudaSuccess) ++bad;
          } else {
            if (!be.PinHostMemory(p, int64_t(kRegion)).ok()) ++bad;
            be.UnpinHostMemory(p);
          }
          ++regions;
        }
      });
      for (auto& t : threads) t.join();
      const double took = std::chrono::duration<double>(Clock::now() - t0).count();
      stop = true;
      registrar.join();
      const Tally after = Read(be);
      std::printf("%-10s %9.1f %9.1f", phase, double(calls) / took, double(regions) / took);
      for (size_t d = 0; d < after.jobs.size(); ++d) {
        const int64_t j = after.jobs[d] - before.jobs[d];
        const double s = after.seconds[d] - before.seconds[d];
        std::printf("  %9lld %8.3f", static_cast<long long>(j), j > 0 ? 1e3 * s / double(j) : 0.0);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  for (auto& o : own)
    for (auto* v : {&o.a, &o.b, &o.c, &o.d, &o.x}) be.UnpinHostMemory(v->data());
  if (bad > 0) {
    std::printf("WRONG OR FAILED: %d calls or registrations\n", bad.load());
    return 1;
  }
  return 0;
}
