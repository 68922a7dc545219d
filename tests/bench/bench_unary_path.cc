// trisolve's own work on one small unary request, without gRPC: what SolverService::HandleUnary
// does between the parsed message and the message to send (translation and checks, admission,
// the solve on the CPU backend, the answer, metrics, the request's log line), in a loop on one
// thread, so that the figure holds still on a shared machine where a round trip's does not
// (tests/bench/NOTES.md, s32).
//   bench_unary_path [N] [REQUESTS] [--log]     (--log: the answered request's info line, to
//   stdout; redirect it)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core.h"
#include "spdlog/spdlog.h"
#include "translate.h"
#include "trisolve/backend.h"
#include "trisolve/v1/trisolve.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

void SetArray(trisolve::v1::Array* a, const std::vector<double>& v) {
  a->add_shape(int64_t(v.size()));
  a->set_data(v.data(), v.size() * sizeof(double));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as trisolved
  int64_t n = 64, requests = 20000;
  bool log = false;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--log") == 0)
      log = true;
    else
      pos.emplace_back(argv[i]);
  }
  if (pos.size() > 0) n = std::stoll(pos[0]);
  if (pos.size() > 1) requests = std::stoll(pos[1]);
  if (n < 2 || requests < 1000) {
    std::fprintf(stderr, "usage: bench_unary_path [N >= 2] [REQUESTS >= 1000] [--log]\n");
    return 2;
  }
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");  // as trisolved's text log

  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> a(static_cast<size_t>(n)), b(a), c(a), d(a);
  for (int64_t i = 0; i < n; ++i) {
    a[size_t(i)] = u(rng);
    c[size_t(i)] = u(rng);
    b[size_t(i)] = 4 + u(rng);
    d[size_t(i)] = u(rng);
  }
  trisolve::v1::TridiagonalRequest req;
  req.set_dtype(trisolve::v1::FLOAT64);
  req.set_skip_residual(true);  // as the bench's clients ask
  SetArray(req.mutable_a(), a);
  SetArray(req.mutable_b(), b);
  SetArray(req.mutable_c(), c);
  SetArray(req.mutable_d(), d);

  auto backend = trisolve::MakeServedCpuBackend(0);
  if (!backend.ok()) {
    std::fprintf(stderr, "cpu backend: %s\n", std::string(backend.status().message()).c_str());
    return 1;
  }
  trisolve::server::CoreOptions options;
  options.log_answers = log;
  trisolve::server::Core core(*std::move(backend), options);

  // Per request, as HandleUnary (less what needs a ServerContext: the request id's metadata,
  // the identity from the auth context).
  int64_t next_id = 0;
  auto one = [&]() -> bool {
    trisolve::server::Call call(std::to_string(next_id++), "SolveTridiagonal");
    call.identity = "shared";
    call.cancelled = [] { return false; };
    call.sample.rpc = "SolveTridiagonal";
    call.sample.family = "tridiagonal";
    call.sample.method = trisolve::server::MethodLabel(trisolve::Family::kTridiagonal,
                                                       req.method());
    trisolve::server::RequestRegions regions = core.Regions(call.identity);
    auto job = trisolve::server::JobFromRequest(
        req, options.limits,
        trisolve::server::DeclareOptions{.regions = &regions, .defer_finite = true});
    if (!job.ok()) return core.Finish(call, job.status()).ok();
    auto answer = core.Solve(call, *job);
    if (!answer.ok()) return core.Finish(call, answer.status()).ok();
    trisolve::v1::SolveResponse resp;
    trisolve::server::AnswerToProto(*answer, &resp);
    return core.Finish(call, absl::OkStatus()).ok() && resp.x().data().size() == size_t(n) * 8;
  };

  for (int i = 0; i < 1000; ++i)
    if (!one()) {
      std::fprintf(stderr, "a request failed\n");
      return 1;
    }
  // Batches of 1000: the median and the best batch's mean (the rest is the machine's noise).
  std::vector<double> per;
  for (int64_t done = 0; done + 1000 <= requests; done += 1000) {
    const auto t0 = Clock::now();
    for (int i = 0; i < 1000; ++i)
      if (!one()) return 1;
    per.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 1000);
  }
  std::sort(per.begin(), per.end());
  std::fprintf(stderr,
               "unary path without gRPC, n = %lld, log %s: %.2f us a request (median of %zu "
               "batches of 1000), best batch %.2f us\n",
               static_cast<long long>(n), log ? "on" : "off", per[per.size() / 2], per.size(),
               per.front());
  return 0;
}
