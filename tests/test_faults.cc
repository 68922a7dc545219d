// Faults that fail one request, not the server (issue 35, items 5 and 6), against the real
// trisolved over loopback: faults injected with TRISOLVE_FAULT_INJECTION (a test-only switch,
// trisolve/fault_injection.h) into the backend the tests run (TRISOLVE_TEST_BACKEND: the CPU
// stand-in in CI; a real cudaMalloc failure path and a kernel's __trap on the GPU), and the
// server reflection switch.
#include <grpcpp/generic/generic_stub.h>
#include <httplib.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "client_test_util.h"
#include "raw_stub.h"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/fault_injection.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using testing::ServerProcess;

// The server started with TRISOLVE_FAULT_INJECTION=`faults` (it reads its environment at
// spawn); the variable is this test process's only meanwhile.
std::unique_ptr<ServerProcess> StartWithFaults(const std::string& faults,
                                               std::vector<std::string> args,
                                               const std::string& backend = "") {
  setenv("TRISOLVE_FAULT_INJECTION", faults.c_str(), 1);
  auto s = std::make_unique<ServerProcess>(std::move(args), backend);
  unsetenv("TRISOLVE_FAULT_INJECTION");
  return s;
}

Client::Options To(const ServerProcess& s) {
  Client::Options o;
  o.target = s.target();
  o.transport = Transport::kGrpc;  // arrays over the socket: no shared memory pinned
  return o;
}

absl::StatusOr<v1::ServerInfo> RawInfo(const ServerProcess& s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerInfo info;
  grpc::Status st =
      testing::DefaultStub(s.target())->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  if (!st.ok()) return absl::Status(absl::StatusCode(st.error_code()), st.error_message());
  return info;
}

// The device pool's figures (none on the CPU backend).
const v1::MemoryPool* DevicePool(const v1::ServerInfo& info) {
  for (const auto& p : info.pools())
    if (p.name() == "device") return &p;
  return nullptr;
}

using testing::MakeJob;
using testing::WaitForServer;

// The largest relative difference between the server's x and the CPU reference's.
double TridiagonalError(const examples::Arrays& ar, int64_t batch, int64_t n, const Result& r) {
  std::vector<double> x(size_t(batch * n));
  std::vector<SystemStatus> st(static_cast<size_t>(batch));
  TridiagonalProblem<double> p{batch, n, Layout::kFlat, ar.at("a").as<double>(),
                               ar.at("b").as<double>(), ar.at("c").as<double>(),
                               ar.at("d").as<double>()};
  cpu::SolveTridiagonal(p, TridiagonalMethod::kThomas, TridiagonalOutput<double>{x.data(), st.data()});
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = std::abs(r.x.as<double>()[i] - x[i]) / std::max(1.0, std::abs(x[i]));
    if (!(e <= worst)) worst = e;  // a NaN is the worst
  }
  return worst;
}

// Both kinds of fault, on each backend present: cuda is skipped, saying so, where trisolved
// cannot start it. --gpu-min-unknowns 0 sends even small jobs to the device.
class Faults : public ::testing::TestWithParam<const char*> {
 protected:
  std::unique_ptr<ServerProcess> Start(const std::string& faults, std::vector<std::string> args) {
    args.insert(args.end(), {"--gpu-min-unknowns", "0"});
    auto s = StartWithFaults(faults, std::move(args), GetParam());
    if (s->port() == 0 && std::string(GetParam()) == "cuda")
      skip_ = "no CUDA backend here: " + s->Log();
    return s;
  }
  std::string skip_;
};

TEST(FaultInjection, ParsesTheSwitchAndRefusesWhatItCannotRead) {
  EXPECT_FALSE(FaultInjection::Parse("")->enabled());
  auto both = FaultInjection::Parse("alloc-fail:3, sticky:2");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->Describe(), "alloc-fail:3,sticky:2");
  // Each fires once, at its count.
  EXPECT_FALSE(both->NextAllocationFails());
  EXPECT_FALSE(both->NextAllocationFails());
  EXPECT_TRUE(both->NextAllocationFails());
  EXPECT_FALSE(both->NextAllocationFails());
  EXPECT_FALSE(both->NextSolveIsSticky());
  EXPECT_TRUE(both->NextSolveIsSticky());
  EXPECT_FALSE(both->NextSolveIsSticky());
  auto stall = FaultInjection::Parse("stall:2,stall-ms:30");
  ASSERT_TRUE(stall.ok()) << stall.status();
  EXPECT_TRUE(stall->enabled());
  EXPECT_EQ(stall->Describe(), "stall:2,stall-ms:30");
  EXPECT_EQ(stall->NextSolveStallMs(), 0);
  EXPECT_EQ(stall->NextSolveStallMs(), 30);
  EXPECT_EQ(stall->NextSolveStallMs(), 0);
  EXPECT_EQ(FaultInjection::Parse("stall:1")->Describe(), "stall:1,stall-ms:1000");
  for (const char* bad : {"sticky", "sticky:0", "sticky:x", "oom:1", "alloc-fail:-2",
                          "stall-ms:0", "stall-ms:600001"})
    EXPECT_EQ(FaultInjection::Parse(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
}

TEST(FaultInjection, AMalformedSwitchStopsTheServerFromStarting) {
  auto s = StartWithFaults("sticky:soon", {}, "cpu");
  EXPECT_EQ(s->port(), 0);
  EXPECT_EQ(s->Wait(10), 1) << s->Log();
  EXPECT_NE(s->Log().find("TRISOLVE_FAULT_INJECTION 'sticky:soon'"), std::string::npos)
      << s->Log();
}

// A device allocation that fails fails its request with RESOURCE_EXHAUSTED, logged and counted,
// and gives back what the request took; the requests before and after are answered, and right.
TEST_P(Faults, AnAllocationFailureFailsThatRequestOnly) {
  auto ar = examples::RandomTridiagonal(64, 200, false, 7);
  const Job job = MakeJob(Kind::kTridiagonal, ar);
  // Which allocation to fail: the second of the second request (where it takes two). A server
  // without faults says how many device-pool buffers each request takes (the CPU stand-in
  // counts one a solve).
  std::vector<int64_t> gets = {0, 1, 1};  // before the first request; the first; the second
  {
    auto probe = Start("", {});
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_GT(probe->port(), 0) << probe->Log();
    for (size_t k = 0; k < gets.size(); ++k) {
      if (k > 0) {
        ASSERT_TRUE(Client(To(*probe)).Solve(job).ok());
      }
      auto info = RawInfo(*probe);
      ASSERT_TRUE(info.ok()) << info.status();
      if (const v1::MemoryPool* p = DevicePool(*info); p != nullptr)
        gets[k] = p->hits() + p->misses() - (k > 0 ? gets[0] + (k > 1 ? gets[1] : 0) : 0);
    }
    ASSERT_GE(gets[2], 1);
  }
  const int64_t fail_at = gets[0] + gets[1] + std::min<int64_t>(gets[2], 2);
  auto s = Start("alloc-fail:" + std::to_string(fail_at), {"--metrics-listen", "127.0.0.1:0"});
  ASSERT_GT(s->port(), 0) << s->Log();
  Client c(To(*s));
  auto first = c.Solve(job);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_LT(TridiagonalError(ar, 64, 200, *first), 1e-12);
  auto held = RawInfo(*s);
  ASSERT_TRUE(held.ok());
  Job tagged = job;
  tagged.options.request_id = "allocation-fails";
  auto failed = c.Solve(tagged);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_NE(failed.status().message().find("fault injection"), absl::string_view::npos)
      << failed.status();
  // What the failed request took went back: the device pool holds what it held before.
  auto after = RawInfo(*s);
  ASSERT_TRUE(after.ok());
  if (const v1::MemoryPool* p = DevicePool(*after); p != nullptr) {
    EXPECT_EQ(p->in_use_bytes(), DevicePool(*held)->in_use_bytes());
  }
  for (int k = 0; k < 4; ++k) {
    auto r = c.Solve(job);
    ASSERT_TRUE(r.ok()) << "request " << k << " after the failure: " << r.status();
    EXPECT_LT(TridiagonalError(ar, 64, 200, *r), 1e-12);
  }
  EXPECT_EQ(*c.Health(), "SERVING");
  const std::string log = s->Log();
  EXPECT_NE(log.find("[req allocation-fails] SolveTridiagonal failed: RESOURCE_EXHAUSTED"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("backend lost"), std::string::npos) << log;
  // Counted under its code.
  const int metrics_port = s->MetricsPort();
  ASSERT_GT(metrics_port, 0) << log;
  httplib::Client http("127.0.0.1", metrics_port);
  auto scraped = http.Get("/metrics");
  ASSERT_TRUE(scraped);
  const std::string metrics = scraped->body;
  EXPECT_NE(metrics.find("code=\"RESOURCE_EXHAUSTED\"} 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("trisolve_backend_up 1\n"), std::string::npos) << metrics;
  s->Signal(SIGTERM);
  EXPECT_EQ(s->Wait(30), 0) << s->Log();
}

// A sticky error (the device lost to the process): the failing call, the running ones and the
// queued one are answered UNAVAILABLE, health turns NOT_SERVING, new calls and an open
// time-step stream are refused UNAVAILABLE, and trisolved exits 69 once drained.
TEST_P(Faults, AStickyErrorTurnsHealthNotServingAndTheServerExits69) {
  // Solves counted: the stream's first step (1), two long jobs running (2, 3), then a small
  // job in the small jobs' pool while a third long job waits for a slot: the fourth solve.
  auto s = Start("sticky:4", {"--max-concurrent-jobs", "2", "--max-queued-jobs", "4",
                              "--small-job-unknowns", "1000", "--grace", "30",
                              "--metrics-listen", "127.0.0.1:0"});
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_GT(s->port(), 0) << s->Log();
  const Client::Options o = To(*s);
  Client c(o);

  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(s->target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto watch = health->Watch(&watch_ctx, grpc::health::v1::HealthCheckRequest());
  grpc::health::v1::HealthCheckResponse seen;
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  auto small = examples::RandomTridiagonal(2, 50, false, 3);
  auto system = c.CreateSystem(MakeJob(Kind::kTridiagonal, small));
  ASSERT_TRUE(system.ok()) << system.status();
  auto steps = c.OpenStepStream(system->handle);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_TRUE((*steps)->Send(small.at("d").view()).ok());
  auto step = (*steps)->Receive();
  ASSERT_TRUE(step.ok()) << step.status();

  // Long jobs: stopped only by the loss (they would run for minutes).
  auto grid = examples::ThesisExperiment2(48, 48);
  Job slow = MakeJob(Kind::kBlockTridiagonal, grid);
  slow.options.max_iterations = 100000000;
  slow.options.tol = 0;
  slow.options.timeout_s = 120;
  std::vector<std::future<absl::StatusOr<Result>>> long_jobs;
  for (int i = 0; i < 3; ++i) {
    long_jobs.push_back(std::async(std::launch::async, [&] { return Client(o).Solve(slow); }));
    ASSERT_TRUE(WaitForServer(c, [i](const ServerInfoSummary& info) {
      return i < 2 ? info.jobs_in_flight == i + 1 : info.jobs_queued == 1;
    })) << "long job " << i << "\n" << s->Log();
  }
  Job trigger = MakeJob(Kind::kTridiagonal, small);
  trigger.options.request_id = "meets-the-sticky-error";
  auto lost = c.Solve(trigger);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable) << lost.status();
  EXPECT_NE(lost.status().message().find("lost"), absl::string_view::npos) << lost.status();
  for (size_t i = 0; i < long_jobs.size(); ++i) {
    auto r = long_jobs[i].get();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable)
        << (i < 2 ? "running" : "queued") << " job: " << r.status();
    // The queued one never reached the backend: the server refused it.
    if (i == 2) {
      EXPECT_NE(r.status().message().find("shutting down"), absl::string_view::npos);
    }
  }
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  auto refused = Client(o).Solve(MakeJob(Kind::kTridiagonal, small));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_NE(refused.status().message().find("shutting down"), absl::string_view::npos);
  // While the stream below is open the server still answers: its metrics say it is down.
  const int metrics_port = s->MetricsPort();
  ASSERT_GT(metrics_port, 0) << s->Log();
  httplib::Client http("127.0.0.1", metrics_port);
  auto scraped = http.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_NE(scraped->body.find("trisolve_backend_up 0\n"), std::string::npos) << scraped->body;
  EXPECT_NE(scraped->body.find(R"(trisolve_requests_total{rpc="SolveBlockTridiagonal",)"
                               R"(family="block-tridiagonal",method="auto",code="UNAVAILABLE"} 3)"),
            std::string::npos)
      << scraped->body;
  // The time-step stream opened before is refused at its next step.
  absl::Status next = (*steps)->Send(small.at("d").view());
  if (next.ok()) next = (*steps)->Receive().status();
  if (next.ok()) next = (*steps)->Finish();
  EXPECT_EQ(next.code(), absl::StatusCode::kUnavailable) << next;
  (void)(*steps)->Finish();
  steps->reset();

  EXPECT_EQ(s->Wait(60), 69) << s->Log();  // server/health.h: kExitBackendLost
  const std::string log = s->Log();
  EXPECT_NE(log.find("backend lost"), std::string::npos) << log;
  EXPECT_NE(log.find("[req meets-the-sticky-error] SolveTridiagonal failed: UNAVAILABLE"),
            std::string::npos)
      << log;
  watch_ctx.TryCancel();
}

INSTANTIATE_TEST_SUITE_P(Present, Faults, ::testing::Values("cpu", "cuda"),
                         [](const auto& param_info) { return std::string(param_info.param); });

// ---- server reflection (--reflection, --no-reflection) ------------------------------------

// One ServerReflectionInfo exchange (list_services) as a unary call: the method is a stream
// both ways, and a server that serves it answers one request with one response.
grpc::Status ListServices(const ServerProcess& s, std::string* answer) {
  grpc::GenericStub stub(grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const std::string request("\x3a\x00", 2);  // ServerReflectionRequest{list_services: ""}
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                    in, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&out, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  std::vector<grpc::Slice> slices;
  if (status.ok() && out.Dump(&slices).ok())
    for (const auto& piece : slices)
      answer->append(reinterpret_cast<const char*>(piece.begin()), piece.size());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST(Reflection, OnByDefaultOffWhenSwitchedOff) {
  {
    ServerProcess s({});
    ASSERT_GT(s.port(), 0) << s.Log();
    std::string answer;
    grpc::Status st = ListServices(s, &answer);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    EXPECT_NE(answer.find("trisolve.v1.Solver"), std::string::npos);
  }
  for (const char* off : {"--no-reflection", "--reflection=false"}) {
    ServerProcess s({off});
    ASSERT_GT(s.port(), 0) << off << ": " << s.Log();
    std::string answer;
    EXPECT_EQ(ListServices(s, &answer).error_code(), grpc::StatusCode::UNIMPLEMENTED) << off;
    // The service itself is untouched.
    EXPECT_TRUE(Client(To(s)).Info().ok());
    EXPECT_NE(s.Log().find("server reflection off"), std::string::npos) << s.Log();
  }
  setenv("TRISOLVE_REFLECTION", "false", 1);
  ServerProcess s({});
  unsetenv("TRISOLVE_REFLECTION");
  ASSERT_GT(s.port(), 0) << s.Log();
  std::string answer;
  EXPECT_EQ(ListServices(s, &answer).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace trisolve
