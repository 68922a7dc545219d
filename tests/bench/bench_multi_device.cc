// Throughput of many threads calling the multi-device CUDA backend directly (no gRPC): the
// same work over device 0 alone and over 0..D-1, so that the devices' scaling shows apart from
// the server's host work (run_multi_gpu.sh measures through trisolved). Every answer is checked
// against the CPU reference's once.
//   bench_multi_device [--clients 16,64] [--calls 40] [--shapes 256x1024,2048x1024]
//                      [--devices 1,2] [--mode unary,prepared]
// unary: the whole system each call (arrays copied in, x out); prepared: a system a client kept
// on its device (right-hand side in, x out).
#include <algorithm>
#include <atomic>
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

#include "trisolve/backend.h"

namespace {

using namespace trisolve;
using Clock = std::chrono::steady_clock;

std::vector<std::string> Split(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == 0) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      if (*p == 0) break;
    } else {
      cur.push_back(*p);
    }
  }
  return out;
}

struct Case {
  int64_t batch, n;
  std::vector<double> a, b, c, d, want;
};

Case MakeCase(int64_t batch, int64_t n) {
  Case k{batch, n, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(uint64_t(batch * 31 + n));
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t e = batch * n;
  for (auto* v : {&k.a, &k.b, &k.c, &k.d}) v->resize(size_t(e));
  for (int64_t i = 0; i < e; ++i) {
    k.a[size_t(i)] = u(rng);
    k.c[size_t(i)] = u(rng);
    k.b[size_t(i)] = 4 + u(rng);
    k.d[size_t(i)] = u(rng);
  }
  k.want.resize(size_t(e));
  std::vector<SystemStatus> st(static_cast<size_t>(batch));
  auto cpu = MakeCpuBackend();
  const TridiagonalProblem<double> p{batch,      n,          Layout::kFlat, k.a.data(),
                                     k.b.data(), k.c.data(), k.d.data()};
  if (!cpu->Solve(p, TridiagonalMethod::kAuto, {k.want.data(), st.data()}, {}).ok()) std::exit(1);
  return k;
}

double Distance(const std::vector<double>& x, const std::vector<double>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    d = std::max(d, std::abs(x[i] - want[i]));
    m = std::max(m, std::abs(want[i]));
  }
  return d / m;
}

// Calls per second of `clients` threads each making `calls` calls; -1 where an answer was wrong
// or a call failed.
double Run(Backend& be, const Case& k, int clients, int calls, bool prepared) {
  const TridiagonalProblem<double> p{k.batch,    k.n,        Layout::kFlat, k.a.data(),
                                     k.b.data(), k.c.data(), k.d.data()};
  SystemSpec spec;
  spec.family = Family::kTridiagonal;
  spec.batch = k.batch;
  spec.n = k.n;
  spec.coefficients = {k.a.data(), k.b.data(), k.c.data()};
  std::vector<std::unique_ptr<PreparedSystem>> systems(static_cast<size_t>(clients));
  if (prepared)
    for (auto& s : systems) {
      auto made = be.Prepare(spec);
      if (!made.ok()) {
        std::fprintf(stderr, "Prepare: %s\n", std::string(made.status().message()).c_str());
        return -1;
      }
      s = *std::move(made);
    }
  std::atomic<int> bad{0};
  auto client = [&](int id, int n_calls) {
    std::vector<double> x(k.a.size());
    std::vector<SystemStatus> st(static_cast<size_t>(k.batch));
    for (int q = 0; q < n_calls; ++q) {
      auto r = prepared ? be.SolvePrepared(*systems[size_t(id)], RhsBlock<double>{k.d.data()},
                                           x.data(), st.data(), {})
                        : be.Solve(p, TridiagonalMethod::kAuto, {x.data(), st.data()}, {});
      if (!r.ok() || (q == 0 && !(Distance(x, k.want) <= 1e-12))) ++bad;
    }
  };
  {  // warm: every client's first call (pools, plans)
    std::vector<std::thread> t;
    for (int i = 0; i < clients; ++i) t.emplace_back(client, i, 1);
    for (auto& th : t) th.join();
  }
  const auto t0 = Clock::now();
  std::vector<std::thread> t;
  for (int i = 0; i < clients; ++i) t.emplace_back(client, i, calls);
  for (auto& th : t) th.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (bad > 0) return -1;
  return double(clients) * calls / s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> clients = {"16", "64"}, shapes = {"256x1024", "2048x1024"}, counts,
                           modes = {"unary", "prepared"};
  int calls = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--clients"))
      clients = Split(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--shapes"))
      shapes = Split(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--devices"))
      counts = Split(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--mode"))
      modes = Split(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--calls"))
      calls = std::atoi(argv[i + 1]);
  }
  const int present = CudaDeviceCount();
  if (present == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  if (counts.empty())
    for (int d = 1; d <= present; d *= 2) counts.push_back(std::to_string(d));
  std::printf("%d CUDA devices; calls/s of the backend, float64 flat, every first answer checked\n",
              present);
  std::printf("%-9s %-11s %8s %8s %12s %8s\n", "mode", "shape", "clients", "devices", "calls/s",
              "scaling");
  for (const std::string& mode : modes)
    for (const std::string& shape : shapes) {
      const int64_t batch = std::atoll(shape.c_str());
      const int64_t n = std::atoll(shape.c_str() + shape.find('x') + 1);
      const Case k = MakeCase(batch, n);
      for (const std::string& c : clients) {
        double one = 0;
        for (const std::string& dc : counts) {
          const int d = std::atoi(dc.c_str());
          if (d > present) continue;
          std::vector<int> list;
          for (int q = 0; q < d; ++q) list.push_back(q);
          auto be = MakeMultiDeviceCudaBackend(list);
          if (!be.ok()) {
            std::fprintf(stderr, "%s\n", std::string(be.status().message()).c_str());
            return 1;
          }
          const double rate = Run(**be, k, std::atoi(c.c_str()), calls, mode == "prepared");
          if (rate < 0) {
            std::printf("%-9s %-11s %8s %8d   WRONG OR FAILED\n", mode.c_str(), shape.c_str(),
                        c.c_str(), d);
            return 1;
          }
          if (d == 1) one = rate;
          std::printf("%-9s %-11s %8s %8d %12.1f %8s\n", mode.c_str(), shape.c_str(), c.c_str(), d,
                      rate, one > 0 ? std::to_string(rate / (d * one)).substr(0, 4).c_str() : "-");
          std::fflush(stdout);
        }
      }
    }
  return 0;
}
