// trisolved: the trisolve gRPC service.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <fstream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "auth.h"
#include "metrics.h"
#include "service.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"
#include "trisolve/backend.h"

namespace {

absl::StatusOr<std::unique_ptr<trisolve::Backend>> ChooseBackend(
    const std::string& which, const trisolve::CudaOptions& cuda_options, int threads) {
  if (which == "cpu") return trisolve::MakeCpuBackend(threads);
  auto cuda = trisolve::MakeCudaBackend(cuda_options);
  const int device = cuda_options.device;
  if (which == "cuda") return cuda;
  if (cuda.ok()) {
    spdlog::info("backend auto: CUDA device {} found, using the cuda backend", device);
    return cuda;
  }
  spdlog::info("backend auto: {}; using the cpu backend", std::string(cuda.status().message()));
  return trisolve::MakeCpuBackend(threads);
}

// JSON log lines: {"time", "level", "request_id" (when the line is about a request), "msg"}.
class JsonMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string_view text(msg.payload.data(), msg.payload.size());
    std::string out;
    if (text.rfind("[req ", 0) == 0) {
      const size_t end = text.find("] ");
      if (end != std::string_view::npos) {
        out += "\"request_id\":\"" + Escape(text.substr(5, end - 5)) + "\",";
        text = text.substr(end + 2);
      }
    }
    out += "\"msg\":\"" + Escape(text) + "\"";
    dest.append(out.data(), out.data() + out.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }

 private:
  static std::string Escape(std::string_view v) {
    std::string o;
    for (char c : v) {
      switch (c) {
        case '"': o += "\\\""; break;
        case '\\': o += "\\\\"; break;
        case '\n': o += "\\n"; break;
        case '\t': o += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            o += buf;
          } else {
            o.push_back(c);
          }
      }
    }
    return o;
  }
};

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trisolved: solves batches of structured linear systems over gRPC"};
  std::string listen = "127.0.0.1:50051";
  std::string backend = "auto";
  std::string log_level = "info", log_format = "text", metrics_listen;
  std::string tls_cert, tls_key, tls_client_ca, token_file;
  int device = 0, threads = 0;
  trisolve::CudaOptions cuda_options;
  trisolve::server::ServiceOptions opt;
  double grace_s = 30;
  app.add_option("--listen", listen, "address to listen on, HOST:PORT")
      ->envname("TRISOLVE_LISTEN")->capture_default_str();
  app.add_option("--backend", backend, "auto (CUDA where a device is present, else CPU), cpu, cuda")
      ->envname("TRISOLVE_BACKEND")->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--device", device, "CUDA device to use")->envname("TRISOLVE_DEVICE")
      ->capture_default_str();
  app.add_option("--pool-cap-bytes", cuda_options.device_pool_cap_bytes,
                 "cap on pooled device memory (0: 80% of the device)")
      ->envname("TRISOLVE_POOL_CAP_BYTES")->capture_default_str();
  app.add_option("--pinned-cap-bytes", cuda_options.pinned_pool_cap_bytes,
                 "cap on pooled pinned host staging memory")
      ->envname("TRISOLVE_PINNED_CAP_BYTES")->capture_default_str();
  app.add_option("--gpu-min-unknowns", cuda_options.host_below_unknowns,
                 "auto solves tridiagonal and tree requests of fewer unknowns on the host (0: never)")
      ->envname("TRISOLVE_GPU_MIN_UNKNOWNS")->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--streams", cuda_options.streams, "CUDA streams (requests in flight on the GPU)")
      ->envname("TRISOLVE_STREAMS")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--cpu-threads", threads, "threads of the CPU backend (0: one per core)")
      ->envname("TRISOLVE_CPU_THREADS")->capture_default_str();
  app.add_option("--max-message-bytes", opt.max_message_bytes,
                 "largest gRPC message accepted (bigger jobs use SolveStream)")
      ->envname("TRISOLVE_MAX_MESSAGE_BYTES")->capture_default_str();
  app.add_option("--max-job-bytes", opt.limits.max_job_bytes, "largest job, bytes of arrays")
      ->envname("TRISOLVE_MAX_JOB_BYTES")->capture_default_str();
  app.add_option("--max-job-unknowns", opt.limits.max_job_unknowns, "largest job, unknowns")
      ->envname("TRISOLVE_MAX_JOB_UNKNOWNS")->capture_default_str();
  app.add_option("--max-concurrent-jobs", opt.max_concurrent_jobs, "jobs solved at once")
      ->envname("TRISOLVE_MAX_CONCURRENT_JOBS")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--max-queued-jobs", opt.max_queued_jobs, "jobs waiting for a slot")
      ->envname("TRISOLVE_MAX_QUEUED_JOBS")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("--max-concurrent-small-jobs", opt.max_concurrent_small_jobs,
                 "small jobs (at most --small-job-unknowns) solved at once, in a pool of their own")
      ->envname("TRISOLVE_MAX_CONCURRENT_SMALL_JOBS")->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--small-job-unknowns", opt.small_job_unknowns,
                 "jobs of at most this many unknowns take the small jobs' slots (0: none)")
      ->envname("TRISOLVE_SMALL_JOB_UNKNOWNS")->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-receiving-bytes", opt.max_receiving_bytes,
                 "bytes the streamed requests being received may declare, together")
      ->envname("TRISOLVE_MAX_RECEIVING_BYTES")->check(CLI::Range(int64_t{1}, int64_t{1} << 50))
      ->capture_default_str();
  app.add_option("--max-receiving-streams", opt.max_receiving_streams,
                 "streamed requests received at once")
      ->envname("TRISOLVE_MAX_RECEIVING_STREAMS")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-systems-per-identity", opt.systems.max_per_identity,
                 "persistent systems one identity may hold")
      ->envname("TRISOLVE_MAX_SYSTEMS_PER_IDENTITY")->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-system-bytes", opt.systems.max_bytes,
                 "memory all persistent systems may hold; least recently used idle ones are "
                 "evicted past it")
      ->envname("TRISOLVE_MAX_SYSTEM_BYTES")->check(CLI::Range(int64_t{0}, int64_t{1} << 50))
      ->capture_default_str();
  app.add_option("--system-ttl", opt.systems.default_ttl_s,
                 "seconds a persistent system may stay unused before it is dropped (default)")
      ->envname("TRISOLVE_SYSTEM_TTL")->check(CLI::Range(0.001, 1e9))->capture_default_str();
  app.add_option("--max-system-ttl", opt.systems.max_ttl_s,
                 "cap on the time-to-live a client may ask for, seconds")
      ->envname("TRISOLVE_MAX_SYSTEM_TTL")->check(CLI::Range(0.001, 1e9))->capture_default_str();
  app.add_option("--default-deadline", opt.default_deadline_s,
                 "deadline in seconds for calls that carry none (0: none)")
      ->envname("TRISOLVE_DEFAULT_DEADLINE")->capture_default_str();
  app.add_option("--max-deadline", opt.max_deadline_s, "cap on any call's deadline, seconds (0: none)")
      ->envname("TRISOLVE_MAX_DEADLINE")->capture_default_str();
  app.add_option("--grace", grace_s, "seconds running jobs get to finish on SIGTERM/SIGINT")
      ->envname("TRISOLVE_GRACE")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->envname("TRISOLVE_LOG_LEVEL")->capture_default_str();
  app.add_option("--log-format", log_format, "text or json (one object a line)")
      ->envname("TRISOLVE_LOG_FORMAT")->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen,
                 "HOST:PORT for Prometheus /metrics (empty: off; port 0: any free port)")
      ->envname("TRISOLVE_METRICS_LISTEN");
  app.add_option("--tls-cert", tls_cert, "server certificate chain (PEM); with --tls-key: TLS")
      ->envname("TRISOLVE_TLS_CERT");
  app.add_option("--tls-key", tls_key, "server private key (PEM)")->envname("TRISOLVE_TLS_KEY");
  app.add_option("--tls-client-ca", tls_client_ca,
                 "CA (PEM) that client certificates must chain to: mutual TLS")
      ->envname("TRISOLVE_TLS_CLIENT_CA");
  app.add_option("--token-file", token_file,
                 "file of accepted bearer tokens, one a line (the health service stays open)")
      ->envname("TRISOLVE_TOKEN_FILE");
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  if (log_format == "json") {
    auto f = std::make_unique<spdlog::pattern_formatter>();
    f->add_flag<JsonMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e","level":"%l",%*})");
    spdlog::set_formatter(std::move(f));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  }

  if (!token_file.empty()) {
    auto text = ReadFile(token_file, "token file");
    if (!text.ok()) {
      spdlog::error("{}", std::string(text.status().message()));
      return 1;
    }
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') opt.tokens.push_back(line);
    }
    if (opt.tokens.empty()) {
      spdlog::error("token file {} holds no token", token_file);
      return 1;
    }
  }
  std::optional<grpc::SslServerCredentialsOptions> tls;
  if (!tls_cert.empty() || !tls_key.empty()) {
    auto cert = ReadFile(tls_cert, "--tls-cert");
    auto key = ReadFile(tls_key, "--tls-key");
    if (!cert.ok() || !key.ok()) {
      spdlog::error("TLS needs both --tls-cert and --tls-key: {}",
                    std::string((cert.ok() ? key : cert).status().message()));
      return 1;
    }
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!tls_client_ca.empty()) {
      auto ca = ReadFile(tls_client_ca, "--tls-client-ca");
      if (!ca.ok()) {
        spdlog::error("{}", std::string(ca.status().message()));
        return 1;
      }
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    tls = std::move(ssl);
  }

  // Signals are taken by one thread with sigwait, so every other thread runs undisturbed.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  cuda_options.device = device;
  cuda_options.cpu_threads = threads;
  auto be = ChooseBackend(backend, cuda_options, threads);
  if (!be.ok()) {
    spdlog::error("backend {}: {}", backend, std::string(be.status().message()));
    return 1;
  }
  auto service = std::make_unique<trisolve::server::SolverService>(*std::move(be), opt);
  const auto& info = service->backend_info();
  spdlog::info("trisolved {} backend={} cpu_threads={}", TRISOLVE_VERSION, info.name, info.threads);
  for (const auto& d : info.devices)
    spdlog::info("device {} ({} MiB, {} SMs, sm_{}{})", d.name, d.total_memory_bytes >> 20,
                 d.multiprocessors, d.compute_capability_major, d.compute_capability_minor);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  // With tokens, a call without a valid one is refused on its initial metadata, before gRPC
  // reads its message (auth.h); the health service stays open.
  trisolve::server::SolverService* svc = service.get();
  auto creds = trisolve::server::MakeServerCredentials(
      tls ? &*tls : nullptr, service->tokens(),
      [svc](absl::string_view path, absl::string_view message) {
        svc->RecordUnauthenticated(path, message);
      });
  builder.AddListeningPort(listen, creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(opt.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(-1);
  // Bulk arrays: large HTTP/2 frames and a deep receive window (gRPC's defaults, 16 KiB frames
  // and a window grown by probing, cap loopback streaming far below memory bandwidth).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("cannot listen on {}", listen);
    return 1;
  }
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus("trisolve.v1.Solver", true);
  spdlog::info("listening on {} (port {}); limits: message {} B, job {} B / {} unknowns, "
               "{} concurrent, {} queued",
               listen, port, opt.max_message_bytes, opt.limits.max_job_bytes,
               opt.limits.max_job_unknowns, opt.max_concurrent_jobs, opt.max_queued_jobs);

  spdlog::info("security: {}{}", tls_cert.empty() ? "plaintext" : (tls_client_ca.empty() ? "TLS" : "mutual TLS"),
               opt.tokens.empty() ? ", no authentication" : ", bearer tokens");
  trisolve::server::MetricsServer metrics;
  if (!metrics_listen.empty()) {
    auto mport = metrics.Start(metrics_listen, [&service] { return service->RenderMetrics(); });
    if (!mport.ok()) {
      spdlog::error("{}", std::string(mport.status().message()));
      return 1;
    }
    spdlog::info("metrics on http://{}:{}/metrics", metrics_listen.substr(0, metrics_listen.rfind(':')),
                 *mport);
  }

  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("signal {}: draining (grace {} s): health NOT_SERVING, new calls UNAVAILABLE",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", grace_s);
  health->SetServingStatus(false);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(int64_t(grace_s * 1000));
  const bool idle = service->Drain(deadline);
  server->Shutdown(deadline);
  metrics.Stop();
  spdlog::info("{}; exiting", idle ? "all jobs finished" : "grace period over");
  return 0;
}
