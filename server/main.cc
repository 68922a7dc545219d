// trisolved: the trisolve gRPC service.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fstream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "auth.h"
#include "health.h"
#include "metrics.h"
#include "reflection.h"
#include "service.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"
#include "trisolve/backend.h"

namespace {

// --devices: "all" (every device present; none is an empty list) or "0,1,...".
absl::StatusOr<std::vector<int>> ParseDevices(const std::string& text) {
  std::vector<int> devices;
  if (text == "all") {
    for (int d = 0; d < trisolve::CudaDeviceCount(); ++d) devices.push_back(d);
    return devices;
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices '", text, "': expected all or device numbers separated by commas"));
    devices.push_back(d);
  }
  return devices;
}

// One device (--device), or several behind the multi-device backend (--devices).
absl::StatusOr<std::unique_ptr<trisolve::Backend>> ChooseBackend(
    const std::string& which, const trisolve::CudaOptions& cuda_options, int threads,
    const std::optional<std::vector<int>>& devices) {
  if (which == "cpu") return trisolve::MakeServedCpuBackend(threads);
  absl::StatusOr<std::unique_ptr<trisolve::Backend>> cuda =
      devices ? (devices->empty() ? absl::UnavailableError("--devices all: no CUDA device present")
                                  : trisolve::MakeMultiDeviceCudaBackend(*devices, cuda_options))
              : trisolve::MakeCudaBackend(cuda_options);
  if (which == "cuda") return cuda;
  if (cuda.ok()) {
    spdlog::info("backend auto: CUDA device{} {} found, using the cuda backend",
                 devices && devices->size() > 1 ? "s" : "",
                 devices ? absl::StrJoin(*devices, ",") : absl::StrCat(cuda_options.device));
    return cuda;
  }
  spdlog::info("backend auto: {}; using the cpu backend", std::string(cuda.status().message()));
  return trisolve::MakeServedCpuBackend(threads);
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

// The address handles name (--advertise-address): HOST:PORT as given, or HOST with the port
// the server listens on (which --listen with port 0 only knows once listening).
absl::StatusOr<std::string> ReplicaAddress(const std::string& flag, int port) {
  if (flag.empty()) return std::string();
  if (flag.find_first_of("@/, ") != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("--advertise-address '", flag, "': expected HOST or HOST:PORT"));
  const size_t colon = flag.rfind(':');
  const bool bracketed = flag[0] == '[';
  // "host:port" or "[v6]:port" carry a port; "v6::addr" alone (two colons, no brackets) does not.
  const bool has_port = colon != std::string::npos &&
                        (bracketed ? flag.find("]:") == colon - 1
                                   : flag.find(':') == colon);
  if (has_port) {
    const std::string p = flag.substr(colon + 1);
    if (p.empty() || p.find_first_not_of("0123456789") != std::string::npos || p.size() > 5)
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise-address '", flag, "': the port is not a number"));
    return flag;
  }
  if (bracketed) return absl::StrCat(flag, ":", port);
  if (colon != std::string::npos) return absl::StrCat("[", flag, "]:", port);  // bare IPv6
  return absl::StrCat(flag, ":", port);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
  // Signals are taken by one thread with sigwait, so every other thread runs undisturbed. Blocked
  // first of all: a thread inherits its creator's mask, and gRPC starts threads of its own as
  // soon as anything initialises it (the credentials below do); one of those with SIGTERM
  // unblocked would take the signal and die of it (exit 143) instead of draining.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR2);  // the backend is lost: sent by this process (health.h)
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  // Debian's Abseil is built with its debug checks: every absl::Mutex that gRPC takes (several
  // a request) was entered into a graph of lock orders, about 2% of the server's time for a
  // small request (tests/bench/NOTES.md, s33). Release builds of Abseil skip it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"trisolved: solves batches of structured linear systems over gRPC"};
  std::string listen = "127.0.0.1:50051";
  std::string backend = "auto";
  std::string log_level = "info", log_format = "text", metrics_listen;
  std::string tls_cert, tls_key, tls_client_ca, token_file, advertise, devices_text;
  int device = 0, threads = 0;
  trisolve::CudaOptions cuda_options;
  trisolve::server::ServiceOptions opt;
  double grace_s = 30, max_connection_age_s = 0;
  app.add_option("--listen", listen, "address to listen on, HOST:PORT")
      ->envname("TRISOLVE_LISTEN")->capture_default_str();
  app.add_option("--advertise-address", advertise,
                 "HOST[:PORT] clients reach this replica at; handles end with it so that a client "
                 "balancing over replicas sends their calls here (no port: the one listened on)")
      ->envname("TRISOLVE_ADVERTISE_ADDRESS");
  app.add_option("--backend", backend, "auto (CUDA where a device is present, else CPU), cpu, cuda")
      ->envname("TRISOLVE_BACKEND")->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  auto* device_flag = app.add_option("--device", device, "the one CUDA device to use")
      ->envname("TRISOLVE_DEVICE")->capture_default_str();
  app.add_option("--devices", devices_text,
                 "CUDA devices to use, each with its own pools and streams: all, or 0,1,... "
                 "(a device listed twice is two workers on it: a testing aid)")
      ->envname("TRISOLVE_DEVICES")->excludes(device_flag);
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
  auto* concurrent_flag = app.add_option("--max-concurrent-jobs", opt.max_concurrent_jobs,
                 "jobs solved at once (default: 4 a CUDA device, 2 on the CPU backend)")
      ->envname("TRISOLVE_MAX_CONCURRENT_JOBS")->check(CLI::Range(1, 1024));
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
  app.add_option("--batch-window-us", opt.batching.window_us,
                 "microseconds a forming batch of small unary requests may wait for more while "
                 "one of its kind is being solved (0: natural batching only; a request with "
                 "nothing of its kind running never waits)")
      ->envname("TRISOLVE_BATCH_WINDOW_US")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--max-batch-systems", opt.batching.max_systems,
                 "systems solved in one batched backend call (1: no batching; try 256)")
      ->envname("TRISOLVE_MAX_BATCH_SYSTEMS")->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--max-batch-bytes", opt.batching.max_bytes,
                 "bytes of arrays in one batched backend call")
      ->envname("TRISOLVE_MAX_BATCH_BYTES")->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--max-batches-in-flight", opt.batching.max_in_flight,
                 "batched calls of one kind (family, dtype, size, method) solved at once; more "
                 "requests of that kind join the batch forming behind them")
      ->envname("TRISOLVE_MAX_BATCHES_IN_FLIGHT")->check(CLI::Range(1, 1024))
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
  bool reflection = true;
  app.add_flag("--reflection,!--no-reflection", reflection,
               "serve gRPC server reflection (grpcurl list/describe); --no-reflection or "
               "--reflection=false: off")
      ->envname("TRISOLVE_REFLECTION")->capture_default_str();
  bool no_shared_memory = false;
  app.add_flag("--no-shared-memory", no_shared_memory,
               "refuse RegisterSharedMemory and RegisterCudaMemory (clients on this host then "
               "send their arrays over the socket)")
      ->envname("TRISOLVE_NO_SHARED_MEMORY");
  std::string rings = "on";
  app.add_option("--rings", rings,
                 "serve request rings (small solves of clients on this host through their shared "
                 "memory, without the socket): on or off")
      ->envname("TRISOLVE_RINGS")->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--max-rings", opt.rings.max_rings,
                 "request rings open at once, every identity together")
      ->envname("TRISOLVE_MAX_RINGS")->check(CLI::Range(0, 1 << 16))->capture_default_str();
  app.add_option("--max-rings-per-identity", opt.rings.max_rings_per_identity,
                 "request rings one identity may hold open")
      ->envname("TRISOLVE_MAX_RINGS_PER_IDENTITY")->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  app.add_option("--ring-threads", opt.rings.threads,
                 "threads that serve the request rings, each ring on the least loaded (at most "
                 "127 a thread; more start past that); default half the usable cores; 0: a "
                 "thread per ring")
      ->envname("TRISOLVE_RING_THREADS")->check(CLI::Range(0, 1024))->capture_default_str();
  app.add_option("--ring-wakers", opt.rings.wakers,
                 "threads that wake the rings' sleeping clients for the serving threads while "
                 "those have more requests to answer; 0: none (each ring thread wakes its own "
                 "clients); -1: one for every four ring threads")
      ->envname("TRISOLVE_RING_WAKERS")->check(CLI::Range(-1, 1024))->capture_default_str();
  app.add_option("--ring-spin-us", opt.rings.spin_us,
                 "microseconds an idle ring thread spins for the next request before it sleeps")
      ->envname("TRISOLVE_RING_SPIN_US")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--max-region-bytes", opt.memory.max_bytes_per_identity,
                 "shared memory one identity may register, together")
      ->envname("TRISOLVE_MAX_REGION_BYTES")->check(CLI::Range(int64_t{1}, int64_t{1} << 50))
      ->capture_default_str();
  app.add_option("--max-regions-per-identity", opt.memory.max_regions_per_identity,
                 "shared-memory regions one identity may register")
      ->envname("TRISOLVE_MAX_REGIONS_PER_IDENTITY")->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--region-ttl", opt.memory.default_ttl_s,
                 "seconds a shared-memory region may stay unused before it is dropped (default; "
                 "a client that died leaves its regions until then)")
      ->envname("TRISOLVE_REGION_TTL")->check(CLI::Range(0.001, 1e9))->capture_default_str();
  app.add_option("--default-deadline", opt.default_deadline_s,
                 "deadline in seconds for calls that carry none (0: none)")
      ->envname("TRISOLVE_DEFAULT_DEADLINE")->capture_default_str();
  app.add_option("--max-deadline", opt.max_deadline_s, "cap on any call's deadline, seconds (0: none)")
      ->envname("TRISOLVE_MAX_DEADLINE")->capture_default_str();
  app.add_option("--max-connection-age", max_connection_age_s,
                 "seconds after which a connection is closed gracefully (calls on it finish), so "
                 "that balancing clients resolve the name again and find new replicas (0: never)")
      ->envname("TRISOLVE_MAX_CONNECTION_AGE")->check(CLI::Range(0.0, 1e7))->capture_default_str();
  app.add_option("--grace", grace_s, "seconds running jobs get to finish on SIGTERM/SIGINT")
      ->envname("TRISOLVE_GRACE")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->envname("TRISOLVE_LOG_LEVEL")->capture_default_str();
  app.add_option("--log-format", log_format, "text or json (one object a line)")
      ->envname("TRISOLVE_LOG_FORMAT")->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  std::string request_log = "all";
  app.add_option("--request-log", request_log,
                 "all: a line for every answered solve (info); errors: failed calls only (a "
                 "line is a write and tens of microseconds of CPU: at tens of thousands of small "
                 "requests a second, /metrics counts them instead)")
      ->envname("TRISOLVE_REQUEST_LOG")->check(CLI::IsMember({"all", "errors"}))
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
  opt.memory.enabled = !no_shared_memory;
  opt.rings.enabled = rings == "on";
  opt.log_answers = request_log == "all";

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


  cuda_options.device = device;
  cuda_options.cpu_threads = threads;
  std::optional<std::vector<int>> devices;
  if (!devices_text.empty() && backend != "cpu") {
    auto parsed = ParseDevices(devices_text);
    if (!parsed.ok()) {
      spdlog::error("{}", std::string(parsed.status().message()));
      return 2;
    }
    devices = *std::move(parsed);
  }
  auto be = ChooseBackend(backend, cuda_options, threads, devices);
  if (!be.ok()) {
    spdlog::error("backend {}: {}", backend, std::string(be.status().message()));
    return 1;
  }
  // Large jobs at once, unless given: 4 a CUDA device (a device idles between one job's copies
  // and kernels, which another job's fill; a job refused for memory the others hold runs again
  // when one of them ends), 2 on the CPU backend (a job takes every thread).
  if (concurrent_flag->count() == 0) {
    const trisolve::BackendInfo info = (*be)->Info();
    if (info.name == "cuda")
      opt.max_concurrent_jobs = std::min<int>(1024, 4 * std::max<int>(1, int(info.devices.size())));
  }
  auto service = std::make_unique<trisolve::server::SolverService>(*std::move(be), opt);
  const auto& info = service->backend_info();
  spdlog::info("trisolved {} backend={} cpu_threads={}", TRISOLVE_VERSION, info.name, info.threads);
  for (const auto& d : info.devices)
    spdlog::info("device cuda:{} {} ({} MiB, {} SMs, sm_{}{})", d.ordinal, d.name,
                 d.total_memory_bytes >> 20, d.multiprocessors, d.compute_capability_major,
                 d.compute_capability_minor);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!reflection) builder.SetOption(std::make_unique<trisolve::server::WithoutReflection>());
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
  // Balancing clients ping their connections to find replicas gone silent (every 30 s by
  // default); accept pings 1 s apart, and more, without answering GOAWAY (too many pings).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // GOAWAY after the age; no grace limit, so a time-step stream on the old connection ends
  // when its client ends it while new calls take a new connection.
  if (max_connection_age_s > 0)
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(std::min(max_connection_age_s * 1000, 2e9)));
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("cannot listen on {}", listen);
    return 1;
  }
  // Before the port is logged: a client that learns the port from the log (tests) or from
  // readiness (orchestrators) gets handles that name this replica.
  auto replica = ReplicaAddress(advertise, port);
  if (!replica.ok()) {
    spdlog::error("{}", std::string(replica.status().message()));
    server->Shutdown();
    return 1;
  }
  service->systems().SetReplicaAddress(*replica);
  if (!replica->empty()) spdlog::info("replica address {}: handles end with @{}", *replica, *replica);
  auto* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus("trisolve.v1.Solver", true);
  spdlog::info("listening on {} (port {}); limits: message {} B, job {} B / {} unknowns, "
               "{} concurrent, {} queued",
               listen, port, opt.max_message_bytes, opt.limits.max_job_bytes,
               opt.limits.max_job_unknowns, opt.max_concurrent_jobs, opt.max_queued_jobs);

  if (!reflection) spdlog::info("server reflection off");
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

  // A lost backend (health.h) stops the server as a signal does, and its exit status asks the
  // supervisor for a restart.
  service->health().OnLost([] { kill(getpid(), SIGUSR2); });
  int sig = 0;
  do sigwait(&sigs, &sig); while (sig == SIGUSR2 && !service->health().lost());
  if (sig == SIGUSR2)
    spdlog::error("backend lost: draining (grace {} s): health NOT_SERVING, calls UNAVAILABLE; "
                  "then exit {}", grace_s, trisolve::server::kExitBackendLost);
  else
    spdlog::info("signal {}: draining (grace {} s): health NOT_SERVING, new calls UNAVAILABLE",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", grace_s);
  health->SetServingStatus(false);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(int64_t(grace_s * 1000));
  const bool idle = service->Drain(deadline);
  service->ShutdownRings();
  if (service->health().lost()) {
    // Running and queued calls are answered. Calls still open (time-step streams) are refused
    // at their next message: while they last, new calls too are answered (UNAVAILABLE), where
    // a server shutting down leaves them unanswered until its deadline.
    while (service->open_calls() > 0 && std::chrono::system_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    server->Shutdown(std::min(deadline, std::chrono::system_clock::now() + std::chrono::seconds(1)));
    metrics.Stop();
    spdlog::error("{}; exiting {} for a restart", service->open_calls() == 0 && idle
                  ? "every call answered" : "grace period over", trisolve::server::kExitBackendLost);
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    // Not the destructors: they would release streams, events and memory of a context that is
    // gone, where the driver's calls are not known to return.
    std::_Exit(trisolve::server::kExitBackendLost);
  }
  server->Shutdown(deadline);
  metrics.Stop();
  spdlog::info("{}; exiting", idle ? "all jobs finished" : "grace period over");
  return 0;
}
