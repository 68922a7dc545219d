// Operations, against the real trisolved: Prometheus metrics, bearer tokens, TLS and mutual
// TLS (certificates generated here with openssl), the job-size limit, JSON logs.
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/v1/trisolve.grpc.pb.h"
#include <grpcpp/grpcpp.h>

namespace trisolve {
namespace {

using testing::ServerProcess;
using testing::Shell;

Job SmallJob(examples::Arrays& keep) {
  keep = examples::RandomTridiagonal(10, 7, false, 1);
  Job job;
  job.kind = Kind::kTridiagonal;
  for (auto& [k, a] : keep) job.arrays[k] = a.view();
  return job;
}

Client::Options To(const ServerProcess& s) {
  Client::Options o;
  o.target = s.target();
  return o;
}

// The value of one exact series line of a Prometheus exposition (0 when absent).
double Series(const std::string& text, const std::string& series) {
  const std::string prefix = series + " ";
  size_t at = 0;
  while ((at = text.find(prefix, at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + prefix.size()));
    at += prefix.size();
  }
  return 0;
}

TEST(Ops, MetricsCountersMoveAsExpected) {
  ServerProcess s({"--metrics-listen", "127.0.0.1:0"});
  ASSERT_GT(s.port(), 0) << s.Log();
  // The metrics listener logs its port just after the gRPC listening line.
  const int metrics_port = s.MetricsPort();
  ASSERT_GT(metrics_port, 0) << s.Log();
  httplib::Client http("127.0.0.1", metrics_port);
  auto scrape = [&] {
    auto r = http.Get("/metrics");
    EXPECT_TRUE(r) << "no answer from /metrics";
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    return r->body;
  };
  const std::string bad_series =
      R"(trisolve_requests_total{rpc="SolveTridiagonal",family="tridiagonal",method="invalid",code="INVALID_ARGUMENT"})";
  const std::string unknowns = R"(trisolve_unknowns_solved_total{family="tridiagonal"})";
  const std::string computed = R"(trisolve_compute_seconds_count{family="tridiagonal"})";
  const std::string before = scrape();
  Client::Options grpc_only = To(s);
  grpc_only.transport = Transport::kGrpc;  // the RPC's series (rings carry transport="ring")
  Client c(grpc_only);
  examples::Arrays keep;
  Job job = SmallJob(keep);
  auto first = c.Solve(job);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(c.Solve(job).ok());
  // Labelled by the method run: the backend's name for it ("thomas" on the CPU, a kernel's
  // name behind CUDA), as the answer reports it.
  const std::string ok_series = R"(trisolve_requests_total{rpc="SolveTridiagonal",family="tridiagonal",method=")" +
                                first->summary.method + R"(",code="OK"})";
  job.options.method = "cholesky";
  EXPECT_EQ(c.Solve(job).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string after = scrape();
  EXPECT_EQ(Series(after, ok_series) - Series(before, ok_series), 2) << after;
  EXPECT_EQ(Series(after, bad_series) - Series(before, bad_series), 1) << after;
  EXPECT_EQ(Series(after, unknowns) - Series(before, unknowns), 140);
  EXPECT_EQ(Series(after, computed) - Series(before, computed), 2);
  EXPECT_EQ(Series(after, "trisolve_received_bytes_total") -
                Series(before, "trisolve_received_bytes_total"),
            2 * 4 * 70 * 8);
  EXPECT_EQ(Series(after, "trisolve_sent_bytes_total"), 2 * 70 * 8);
  EXPECT_EQ(Series(after, "trisolve_jobs_in_flight"), 0);
  EXPECT_GT(Series(after, "process_cpu_seconds_total"), Series(before, "process_cpu_seconds_total"));
  EXPECT_NE(after.find("# TYPE trisolve_queue_seconds histogram"), std::string::npos);
  EXPECT_NE(after.find(R"(trisolve_transfer_seconds_bucket{family="tridiagonal",le="+Inf"} 2)"),
            std::string::npos);
  const std::string ok_systems = R"(trisolve_systems_total{family="tridiagonal",outcome="ok"})";
  const std::string singular_systems =
      R"(trisolve_systems_total{family="tridiagonal",outcome="singular"})";
  EXPECT_EQ(Series(after, ok_systems) - Series(before, ok_systems), 2 * 10);
  // A call that succeeds with a singular system in it (a zero row): counted by its outcome.
  examples::Arrays zero_row = examples::RandomTridiagonal(2, 5, false, 3);
  zero_row["b"].as<double>()[5] = 0;
  zero_row["c"].as<double>()[5] = 0;
  Job singular{Kind::kTridiagonal};
  for (const auto& [name, a] : zero_row) singular.arrays[name] = a.view();
  auto rs = c.Solve(singular);
  ASSERT_TRUE(rs.ok()) << rs.status();
  EXPECT_EQ(rs->summary.singular, 1);
  const std::string last = scrape();
  EXPECT_EQ(Series(last, singular_systems) - Series(after, singular_systems), 1) << last;
  EXPECT_EQ(Series(last, ok_systems) - Series(after, ok_systems), 1);
  // An iteration stopped short of its tolerance: a successful call, a not_converged system.
  examples::Arrays block = examples::ThesisExperiment1(8, 8);
  Job short_of{Kind::kBlockTridiagonal};
  for (const auto& [name, a] : block) short_of.arrays[name] = a.view();
  short_of.options.method = "jacobi";
  short_of.options.max_iterations = 2;
  short_of.options.tol = 1e-12;
  auto rn = c.Solve(short_of);
  ASSERT_TRUE(rn.ok()) << rn.status();
  EXPECT_EQ(rn->summary.not_converged, 1);
  const std::string not_converged =
      R"(trisolve_systems_total{family="block-tridiagonal",outcome="not_converged"})";
  EXPECT_EQ(Series(scrape(), not_converged) - Series(last, not_converged), 1);
}

TEST(Ops, BearerTokensAcceptedAndRefusedHealthStaysOpen) {
  const std::string file = "/tmp/trisolve_tokens_" + std::to_string(getpid());
  std::ofstream(file) << "# operators\nfirst-token\nsecond-token\n";
  ServerProcess s({"--token-file", file});
  ASSERT_GT(s.port(), 0) << s.Log();
  examples::Arrays keep;
  Job job = SmallJob(keep);
  Client::Options o = To(s);
  {
    Client none(o);
    EXPECT_EQ(none.Solve(job).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(none.Info().status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(*none.Health(), "SERVING");  // the health service stays open
  }
  o.token = "first-tokenX";
  EXPECT_EQ(Client(o).Solve(job).status().code(), absl::StatusCode::kUnauthenticated);
  o.token = "second-token";
  EXPECT_TRUE(Client(o).Solve(job).ok());
  EXPECT_TRUE(Client(o).Info().ok());
  // The streaming RPC checks too.
  Client::Options so = To(s);
  so.stream_threshold_bytes = 0;
  EXPECT_EQ(Client(so).Solve(job).status().code(), absl::StatusCode::kUnauthenticated);
  so.token = "first-token";
  auto streamed = Client(so).Solve(job);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE(streamed->summary.streamed);
  // The CLI: --token-file, and without.
  const std::string cli = ServerProcess::CliBin() + " --server " + s.target();
  std::ofstream(file + ".client") << "first-token\n";
  EXPECT_EQ(Shell(cli + " --token-file " + file + ".client info").first, 0);
  auto [rc, out] = Shell(cli + " info");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("UNAUTHENTICATED"), std::string::npos) << out;
}

// Twelve 32 MiB requests without a token, at once: each is refused UNAUTHENTICATED on its
// headers, before gRPC reads its message, so the server's peak resident memory does not grow by
// the payloads (it grew by all of them, 211 -> 535 MB for 12 x 64 MB, when the handler checked).
TEST(Ops, UnauthenticatedLargeRequestsAreRefusedBeforeTheirBytesAreRead) {
  const std::string file = "/tmp/trisolve_tokens_large_" + std::to_string(getpid());
  std::ofstream(file) << "the-token\n";
  ServerProcess s({"--token-file", file, "--metrics-listen", "127.0.0.1:0"});
  ASSERT_GT(s.port(), 0) << s.Log();
  // One authenticated call first: what a first call allocates is in the baseline.
  examples::Arrays keep;
  Client::Options o = To(s);
  o.token = "the-token";
  ASSERT_TRUE(Client(o).Solve(SmallJob(keep)).ok());

  constexpr int64_t kN = int64_t{4} << 20;  // float64 values of d: 32 MiB
  v1::TridiagonalRequest req;
  req.set_dtype(v1::FLOAT64);
  for (auto* a : {req.mutable_a(), req.mutable_b(), req.mutable_c()}) {
    a->add_shape(kN);
  }
  req.mutable_d()->add_shape(kN);
  req.mutable_d()->mutable_data()->assign(size_t(kN) * 8, '\0');
  const int64_t payload = int64_t(req.ByteSizeLong());
  const int64_t peak_before = s.StatusBytes("VmHWM");
  ASSERT_GT(peak_before, 0);

  constexpr int kCalls = 12;
  std::vector<grpc::Status> got(kCalls);
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i)
    threads.emplace_back([&, i] {
      // A channel each: twelve connections, as twelve clients.
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetMaxSendMessageSize(-1);
      auto stub = v1::Solver::NewStub(
          grpc::CreateCustomChannel(s.target(), grpc::InsecureChannelCredentials(), args));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::SolveResponse resp;
      got[size_t(i)] = stub->SolveTridiagonal(&ctx, req, &resp);
    });
  for (auto& t : threads) t.join();
  for (const grpc::Status& st : got) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_NE(st.error_message().find("missing bearer token"), std::string::npos)
        << st.error_message();
  }
  const int64_t grown = s.StatusBytes("VmHWM") - peak_before;
  EXPECT_LT(grown, payload) << "peak resident memory grew by " << grown << " bytes for " << kCalls
                            << " refused requests of " << payload << " bytes";
  // Counted and logged (by the method's name, never the client's free text).
  EXPECT_NE(s.LogWith("rejected before its message was read").find(
                "/trisolve.v1.Solver/SolveTridiagonal rejected before its message was read: "
                "UNAUTHENTICATED missing bearer token"),
            std::string::npos)
      << s.Log();
  const int metrics_port = s.MetricsPort();
  ASSERT_GT(metrics_port, 0) << s.Log();
  auto scraped = httplib::Client("127.0.0.1", metrics_port).Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_EQ(Series(scraped->body, "trisolve_requests_total{rpc=\"SolveTridiagonal\",family=\"-\","
                                  "method=\"-\",code=\"UNAUTHENTICATED\"}"),
            kCalls)
      << scraped->body;
  std::remove(file.c_str());
}

// A CA, a server certificate for localhost / 127.0.0.1 and a client certificate.
std::string MakeCertificates() {
  const std::string d = "/tmp/trisolve_tls_" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  const std::string script = R"(set -e; cd )" + d + R"(
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=trisolve-test-ca -keyout ca.key -out ca.pem
for who in server client; do
  openssl req -newkey rsa:2048 -nodes -subj /CN=$who -keyout $who.key -out $who.csr
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > $who.ext
  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile $who.ext -out $who.pem
done)";
  auto [rc, out] = Shell("bash -c '" + std::regex_replace(script, std::regex("'"), "'\\''") + "'");
  EXPECT_EQ(rc, 0) << out;
  return d;
}

TEST(Ops, TlsAndMutualTls) {
  const std::string d = MakeCertificates();
  examples::Arrays keep;
  Job job = SmallJob(keep);
  {
    ServerProcess s({"--tls-cert", d + "/server.pem", "--tls-key", d + "/server.key"});
    ASSERT_GT(s.port(), 0) << s.Log();
    EXPECT_NE(s.LogWith("security: TLS").find("security: TLS"), std::string::npos);
    Client::Options o = To(s);
    o.tls_ca_file = d + "/ca.pem";
    auto r = Client(o).Solve(job);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*Client(o).Health(), "SERVING");
    // A plaintext client gets no answer.
    EXPECT_EQ(Client(To(s)).Solve(job).status().code(), absl::StatusCode::kUnavailable);
    // The CLI with the CA.
    auto [rc, out] = Shell(ServerProcess::CliBin() + " --server " + s.target() +
                           " --tls-ca " + d + "/ca.pem --timeout 5 health");
    EXPECT_EQ(rc, 0) << out;
  }
  {
    ServerProcess s({"--tls-cert", d + "/server.pem", "--tls-key", d + "/server.key",
                     "--tls-client-ca", d + "/ca.pem"});
    ASSERT_GT(s.port(), 0) << s.Log();
    EXPECT_NE(s.LogWith("security: mutual TLS").find("security: mutual TLS"), std::string::npos);
    Client::Options o = To(s);
    o.tls_ca_file = d + "/ca.pem";
    EXPECT_EQ(Client(o).Solve(job).status().code(), absl::StatusCode::kUnavailable)
        << "a client without a certificate must be refused";
    o.tls_cert_file = d + "/client.pem";
    o.tls_key_file = d + "/client.key";
    auto r = Client(o).Solve(job);
    EXPECT_TRUE(r.ok()) << r.status();
  }
  {
    // Mutual TLS and tokens together: the token is checked on the headers, over TLS too.
    const std::string tokens = d + "/tokens";
    std::ofstream(tokens) << "tls-token\n";
    ServerProcess s({"--tls-cert", d + "/server.pem", "--tls-key", d + "/server.key",
                     "--tls-client-ca", d + "/ca.pem", "--token-file", tokens});
    ASSERT_GT(s.port(), 0) << s.Log();
    Client::Options o = To(s);
    o.tls_ca_file = d + "/ca.pem";
    o.tls_cert_file = d + "/client.pem";
    o.tls_key_file = d + "/client.key";
    EXPECT_EQ(Client(o).Solve(job).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(*Client(o).Health(), "SERVING");
    o.token = "tls-token";
    auto r = Client(o).Solve(job);
    EXPECT_TRUE(r.ok()) << r.status();
  }
  Client::Options missing;
  missing.tls_ca_file = d + "/nope.pem";
  EXPECT_EQ(Client::Create(missing).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(d);
}

TEST(Ops, JobBytesLimitAndJsonLogs) {
  ServerProcess s({"--max-job-bytes", "1000", "--log-format", "json"});
  ASSERT_GT(s.port(), 0) << s.Log();
  examples::Arrays keep;
  Job job = SmallJob(keep);  // 4 arrays x 70 values x 8 bytes = 2240 bytes
  job.options.request_id = "json-check";
  auto r = Client(To(s)).Solve(job);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("max_job_bytes = 1000"), absl::string_view::npos)
      << r.status();
  auto small = examples::RandomTridiagonal(2, 4, false, 1);
  Job ok;
  ok.kind = Kind::kTridiagonal;
  for (auto& [k, a] : small) ok.arrays[k] = a.view();
  ok.options.request_id = "json-ok";
  EXPECT_TRUE(Client(To(s)).Solve(ok).ok());
  std::istringstream lines(s.Log());
  int parsed = 0, with_id = 0;
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    EXPECT_TRUE(j.contains("time") && j.contains("level") && j.contains("msg")) << line;
    ++parsed;
    if (j.contains("request_id")) {
      ++with_id;
      EXPECT_TRUE(j["request_id"] == "json-check" || j["request_id"] == "json-ok") << line;
    }
  }
  EXPECT_GE(parsed, 3);
  EXPECT_EQ(with_id, 2);
}

// --request-log errors: no line for an answered solve (the cost of a small request's line is its
// largest piece of trisolve's own, tests/bench/NOTES.md s32), a failed call's line as always.
TEST(Ops, RequestLogErrorsLogsFailuresOnly) {
  ServerProcess s({"--request-log", "errors"});
  ASSERT_GT(s.port(), 0) << s.Log();
  examples::Arrays keep;
  Job ok = SmallJob(keep);
  ok.options.request_id = "quiet-ok";
  auto r = Client(To(s)).Solve(ok);
  ASSERT_TRUE(r.ok()) << r.status();
  Job bad = SmallJob(keep);
  bad.options.request_id = "loud-bad";
  bad.options.method = "no-such-method";
  EXPECT_EQ(Client(To(s)).Solve(bad).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string log = s.LogWith("[req loud-bad]");
  EXPECT_NE(log.find("[req loud-bad] SolveTridiagonal rejected: INVALID_ARGUMENT"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("quiet-ok"), std::string::npos) << log;
  // The default logs the answered one.
  ServerProcess all({});
  ASSERT_GT(all.port(), 0) << all.Log();
  ASSERT_TRUE(Client(To(all)).Solve(ok).ok());
  EXPECT_NE(all.LogWith("[req quiet-ok]").find("[req quiet-ok] SolveTridiagonal tridiagonal"),
            std::string::npos)
      << all.Log();
}

TEST(Ops, EveryFlagAlsoFromTheEnvironment) {
  // A few flags of each kind, given only as TRISOLVE_* variables: they reach the server.
  setenv("TRISOLVE_MAX_CONCURRENT_JOBS", "3", 1);
  setenv("TRISOLVE_MAX_QUEUED_JOBS", "7", 1);
  setenv("TRISOLVE_MAX_JOB_UNKNOWNS", "12345", 1);
  setenv("TRISOLVE_LOG_FORMAT", "json", 1);
  ServerProcess s({});
  for (const char* v : {"TRISOLVE_MAX_CONCURRENT_JOBS", "TRISOLVE_MAX_QUEUED_JOBS",
                        "TRISOLVE_MAX_JOB_UNKNOWNS", "TRISOLVE_LOG_FORMAT"})
    unsetenv(v);
  ASSERT_GT(s.port(), 0) << s.Log();
  auto info = Client(To(s)).Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->max_concurrent_jobs, 3);
  EXPECT_EQ(info->max_queued_jobs, 7);
  EXPECT_EQ(info->max_job_unknowns, 12345);
  EXPECT_EQ(s.Log().rfind("{\"time\"", 0), 0u) << s.Log();
}

// --devices: device 0 listed twice (two workers on one GPU) where CUDA is, the CPU backend
// otherwise (auto); the default of concurrent jobs is 4 a CUDA device (2 on the CPU backend);
// each device's solves show in the metrics. A malformed list, and --device beside --devices,
// stop the server at start.
TEST(Ops, DevicesFlag) {
  {
    ServerProcess s({"--devices", "0,0", "--metrics-listen", "127.0.0.1:0"}, "auto");
    ASSERT_GT(s.port(), 0) << s.Log();
    auto info = Client(To(s)).Info();
    ASSERT_TRUE(info.ok()) << info.status();
    examples::Arrays keep = examples::RandomTridiagonal(64, 1024, false, 3);
    Job job;
    job.kind = Kind::kTridiagonal;
    for (auto& [k, a] : keep) job.arrays[k] = a.view();
    for (int i = 0; i < 4; ++i) {
      auto r = Client(To(s)).Solve(job);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_LT(r->summary.residual, 1e-12);
    }
    const int metrics_port = s.MetricsPort();
    ASSERT_GT(metrics_port, 0) << s.Log();
    auto metrics = httplib::Client("127.0.0.1", metrics_port).Get("/metrics");
    ASSERT_TRUE(metrics);
    if (info->backend == "cuda") {
      ASSERT_EQ(info->devices.size(), 2u);
      EXPECT_EQ(info->max_concurrent_jobs, 8);
      EXPECT_NE(info->devices[1].find("cuda:0 "), std::string::npos) << info->devices[1];
      EXPECT_EQ(info->pools.size(), 4u);
      // Four solves one after another: the two workers in turn.
      EXPECT_EQ(Series(metrics->body, R"(trisolve_device_jobs_total{device="0"})"), 2)
          << metrics->body;
      EXPECT_EQ(Series(metrics->body, R"(trisolve_device_jobs_total{device="1"})"), 2);
      // Their time on each device, and the device's account of it.
      for (const char* series :
           {R"(trisolve_device_job_seconds_total{device="0"})",
            R"(trisolve_device_kernel_seconds_total{device="1"})",
            R"(trisolve_device_h2d_seconds_total{device="1"})"})
        EXPECT_GT(Series(metrics->body, series), 0) << series << metrics->body;
      auto after = Client(To(s)).Info();
      ASSERT_TRUE(after.ok()) << after.status();
      EXPECT_NE(after->devices[0].find(" ms a job (h2d "), std::string::npos) << after->devices[0];
    } else {
      EXPECT_TRUE(info->devices.empty());
      EXPECT_EQ(info->max_concurrent_jobs, 2);
      EXPECT_NE(s.Log().find("using the cpu backend"), std::string::npos) << s.Log();
      EXPECT_EQ(metrics->body.find("trisolve_device_jobs_total"), std::string::npos);
      EXPECT_EQ(metrics->body.find("trisolve_device_job_seconds_total"), std::string::npos);
    }
  }
  {
    ServerProcess bad({"--devices", "0,x"}, "auto");
    EXPECT_EQ(bad.Wait(10), 2) << bad.Log();
    EXPECT_NE(bad.Log().find("expected all or device numbers"), std::string::npos) << bad.Log();
  }
  {
    ServerProcess both({"--device", "0", "--devices", "0"}, "auto");
    const int code = both.Wait(10);
    EXPECT_NE(code, 0);
    EXPECT_NE(code, -1);
    EXPECT_NE(both.Log().find("excludes"), std::string::npos) << both.Log();
  }
}

}  // namespace
}  // namespace trisolve
