// Prometheus metrics, text exposition format, served on their own port by cpp-httplib.
#pragma once

#include <array>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "absl/status/statusor.h"
#include "trisolve/backend.h"

namespace httplib {
class Server;
}

namespace trisolve::server {

// Everything one finished call contributes.
struct CallSample {
  std::string rpc, family, method, code;
  // The transport that brought the call ("ring"); empty: gRPC, whose series carry no label.
  std::string transport;
  double queue_s = 0, transfer_s = 0, compute_s = 0;
  int64_t bytes_in = 0, bytes_out = 0, unknowns = 0;
  bool solved = false;  // the solve ran (queue/transfer/compute observed)
  // Systems of the answer by outcome: ok, singular, not_converged, diverged.
  std::array<int64_t, 4> outcomes{};
};

class Metrics {
 public:
  static constexpr std::array<double, 14> kBuckets = {1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2,
                                                       5e-2, 0.1,  0.5,  1,    5,    10,   60};
  void Record(const CallSample& s);
  // One backend call of the batcher: how many requests it solved, and their systems.
  void ObserveBatch(const std::string& family, int requests, int64_t systems);
  static constexpr std::array<double, 11> kBatchBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256,
                                                           512, 1024};
  // The exposition: counters and histograms, plus gauges read now (jobs, pools, device memory).
  std::string Render(const BackendInfo& backend, int64_t in_flight, int64_t queued) const;

 private:
  struct Histogram {
    std::array<int64_t, kBuckets.size()> counts{};
    int64_t count = 0;
    double sum = 0;
    void Observe(double v);
  };
  mutable std::mutex mu_;
  // (rpc, family, method, code, transport) -> calls
  std::map<std::tuple<std::string, std::string, std::string, std::string, std::string>, int64_t>
      requests_;
  std::map<std::string, Histogram> queue_, transfer_, compute_;  // by family
  std::map<std::string, int64_t> unknowns_;                      // by family
  struct BatchHistogram {
    std::array<int64_t, kBatchBuckets.size()> counts{};
    int64_t count = 0, requests = 0, systems = 0;
  };
  std::map<std::string, BatchHistogram> batches_;  // by family
  std::map<std::pair<std::string, int>, int64_t> outcomes_;      // (family, outcome) -> systems
  int64_t bytes_in_ = 0, bytes_out_ = 0;
};

// GET /metrics on its own listener.
class MetricsServer {
 public:
  using Renderer = std::function<std::string()>;
  MetricsServer();
  ~MetricsServer();
  // host:port (port 0: any free one); returns the port bound.
  absl::StatusOr<int> Start(const std::string& address, Renderer render);
  void Stop();

 private:
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
};

}  // namespace trisolve::server
