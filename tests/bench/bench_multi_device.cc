// Throughput of many threads calling the multi-device CUDA backend directly (no gRPC): the
// same work over device 0 alone and over 0..D-1, so that the devices' scaling shows apart from
// the server's host work (run_multi_gpu.sh measures through trisolved). Every answer is checked
// against the CPU reference's once.
//   bench_multi_device [--clients 16,64] [--calls 40] [--shapes 256x1024,2048x1024]
//                      [--devices 1,2] [--mode unary,prepared,copies] [--pinned 0|1]
// unary: the whole system each call (arrays copied in, x out); prepared: a system a client kept
// on its device (right-hand side in, x out). --pinned 1: each client's arrays page-locked
// (Backend::PinHostMemory), as a client's registered shared memory is in trisolved, so the
// devices copy straight from and into them.
// copies: no solve, only what a prepared call moves -- the right-hand side in and x out, from
// and into page-locked memory, each client on its own stream of device (client mod D): the
// most prepared calls a second the host's memory and the devices' links allow, the roofline of
// tridiagonal requests by handle.
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

#include <cuda_runtime.h>

#include "trisolve/backend.h"
#include "tridiagonal_case.h"

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

using Case = bench::TridiagonalCase;
using bench::Distance;

// Calls per second of `clients` threads each running client(id, calls), after a warm-up of one
// call each (pools, plans, streams).
template <typename Client>
double Timed(int clients, int calls, const Client& client) {
  {
    std::vector<std::thread> t;
    for (int i = 0; i < clients; ++i) t.emplace_back(client, i, 1);
    for (auto& th : t) th.join();
  }
  const auto t0 = Clock::now();
  std::vector<std::thread> t;
  for (int i = 0; i < clients; ++i) t.emplace_back(client, i, calls);
  for (auto& th : t) th.join();
  return double(clients) * calls / std::chrono::duration<double>(Clock::now() - t0).count();
}

// Calls per second of `clients` threads each making `calls` calls; -1 where an answer was wrong
// or a call failed.
double Run(Backend& be, const Case& k, int clients, int calls, bool prepared, bool pinned) {
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
  // Each client's own arrays (d, x; unary also a, b, c), page-locked with --pinned.
  struct Own {
    std::vector<double> a, b, c, d, x;
  };
  std::vector<Own> own(static_cast<size_t>(clients));
  for (auto& o : own) {
    o.d = k.d;
    o.x.resize(k.a.size());
    if (!prepared) o.a = k.a, o.b = k.b, o.c = k.c;
    if (pinned)
      for (auto* v : {&o.a, &o.b, &o.c, &o.d, &o.x})
        if (!v->empty() && !be.PinHostMemory(v->data(), int64_t(v->size() * 8)).ok()) ++bad;
  }
  auto client = [&](int id, int n_calls) {
    Own& o = own[size_t(id)];
    const TridiagonalProblem<double> mine{k.batch,    k.n,        Layout::kFlat, o.a.data(),
                                          o.b.data(), o.c.data(), o.d.data()};
    std::vector<SystemStatus> st(static_cast<size_t>(k.batch));
    for (int q = 0; q < n_calls; ++q) {
      auto r = prepared ? be.SolvePrepared(*systems[size_t(id)], RhsBlock<double>{o.d.data()},
                                           o.x.data(), st.data(), {})
                        : be.Solve(mine, TridiagonalMethod::kAuto, {o.x.data(), st.data()}, {});
      if (!r.ok() || (q == 0 && !(Distance(o.x, k.want) <= 1e-12))) ++bad;
    }
  };
  const double rate = Timed(clients, calls, client);
  if (pinned)
    for (auto& o : own)
      for (auto* v : {&o.a, &o.b, &o.c, &o.d, &o.x})
        if (!v->empty()) be.UnpinHostMemory(v->data());
  return bad > 0 ? -1 : rate;
}

// The copies alone of `clients` threads each making `calls` prepared calls' worth of traffic
// (d in, x out, page-locked, a stream a client) over devices 0..devices-1; -1 on a CUDA error.
double Copies(const Case& k, int clients, int calls, int devices) {
  const size_t bytes = k.d.size() * sizeof(double);
  struct Lane {
    int device;
    cudaStream_t stream = nullptr;
    double *host_d = nullptr, *host_x = nullptr, *dev = nullptr;
  };
  std::vector<Lane> lanes(static_cast<size_t>(clients));
  std::atomic<int> bad{0};
  for (int i = 0; i < clients; ++i) {
    Lane& l = lanes[size_t(i)];
    l.device = i % devices;
    bool ok = cudaSetDevice(l.device) == cudaSuccess &&
              cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking) == cudaSuccess &&
              cudaHostAlloc(&l.host_d, bytes, cudaHostAllocPortable) == cudaSuccess &&
              cudaHostAlloc(&l.host_x, bytes, cudaHostAllocPortable) == cudaSuccess &&
              cudaMalloc(&l.dev, bytes) == cudaSuccess;
    if (ok) std::memcpy(l.host_d, k.d.data(), bytes);
    if (!ok) ++bad;
  }
  auto client = [&](int id, int n_calls) {
    Lane& l = lanes[size_t(id)];
    cudaSetDevice(l.device);
    for (int q = 0; q < n_calls; ++q)
      if (cudaMemcpyAsync(l.dev, l.host_d, bytes, cudaMemcpyHostToDevice, l.stream) !=
              cudaSuccess ||
          cudaMemcpyAsync(l.host_x, l.dev, bytes, cudaMemcpyDeviceToHost, l.stream) !=
              cudaSuccess ||
          cudaStreamSynchronize(l.stream) != cudaSuccess)
        ++bad;
  };
  double rate = -1;
  if (bad == 0) rate = Timed(clients, calls, client);
  if (bad > 0) rate = -1;
  for (auto& l : lanes) {
    cudaSetDevice(l.device);
    if (l.stream != nullptr) cudaStreamDestroy(l.stream);
    cudaFreeHost(l.host_d);
    cudaFreeHost(l.host_x);
    cudaFree(l.dev);
  }
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> clients = {"16", "64"}, shapes = {"256x1024", "2048x1024"}, counts,
                           modes = {"unary", "prepared"};
  int calls = 40;
  bool pinned = false;
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
    else if (!std::strcmp(argv[i], "--pinned"))
      pinned = std::atoi(argv[i + 1]) != 0;
  }
  const int present = CudaDeviceCount();
  if (present == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  if (counts.empty())
    for (int d = 1; d <= present; d *= 2) counts.push_back(std::to_string(d));
  std::printf(
      "%d CUDA devices; calls/s of the backend, float64 flat, every first answer checked, arrays "
      "%s; copies: d in and x out alone, page-locked, GB/s both ways together\n",
      present, pinned ? "page-locked" : "pageable");
  std::printf("%-9s %-11s %8s %8s %12s %8s\n", "mode", "shape", "clients", "devices", "calls/s",
              "scaling");
  for (const std::string& mode : modes)
    for (const std::string& shape : shapes) {
      const int64_t batch = std::atoll(shape.c_str());
      const int64_t n = std::atoll(shape.c_str() + shape.find('x') + 1);
      const Case k = bench::MakeTridiagonalCase(batch, n);
      for (const std::string& c : clients) {
        double one = 0;
        for (const std::string& dc : counts) {
          const int d = std::atoi(dc.c_str());
          if (d > present) continue;
          double rate;
          if (mode == "copies") {
            rate = Copies(k, std::atoi(c.c_str()), calls, d);
          } else {
            std::vector<int> list;
            for (int q = 0; q < d; ++q) list.push_back(q);
            auto be = MakeMultiDeviceCudaBackend(list);
            if (!be.ok()) {
              std::fprintf(stderr, "%s\n", std::string(be.status().message()).c_str());
              return 1;
            }
            rate = Run(**be, k, std::atoi(c.c_str()), calls, mode == "prepared", pinned);
          }
          if (rate < 0) {
            std::printf("%-9s %-11s %8s %8d   WRONG OR FAILED\n", mode.c_str(), shape.c_str(),
                        c.c_str(), d);
            return 1;
          }
          if (d == 1) one = rate;
          std::printf("%-9s %-11s %8s %8d %12.1f %8s", mode.c_str(), shape.c_str(), c.c_str(), d,
                      rate, one > 0 ? std::to_string(rate / (d * one)).substr(0, 4).c_str() : "-");
          if (mode == "copies") std::printf("  %6.1f GB/s", rate * 16.0 * double(batch * n) / 1e9);
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  return 0;
}
