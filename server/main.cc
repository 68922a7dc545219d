// trisolved: the trisolve gRPC service.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "service.h"
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trisolved: solves batches of structured linear systems over gRPC"};
  std::string listen = "127.0.0.1:50051";
  std::string backend = "auto";
  std::string log_level = "info";
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
  app.add_option("--default-deadline", opt.default_deadline_s,
                 "deadline in seconds for calls that carry none (0: none)")
      ->envname("TRISOLVE_DEFAULT_DEADLINE")->capture_default_str();
  app.add_option("--max-deadline", opt.max_deadline_s, "cap on any call's deadline, seconds (0: none)")
      ->envname("TRISOLVE_MAX_DEADLINE")->capture_default_str();
  app.add_option("--grace", grace_s, "seconds running jobs get to finish on SIGTERM/SIGINT")
      ->envname("TRISOLVE_GRACE")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->envname("TRISOLVE_LOG_LEVEL")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

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
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
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

  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("signal {}: draining (grace {} s): health NOT_SERVING, new calls UNAVAILABLE",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", grace_s);
  health->SetServingStatus(false);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(int64_t(grace_s * 1000));
  const bool idle = service->Drain(deadline);
  server->Shutdown(deadline);
  spdlog::info("{}; exiting", idle ? "all jobs finished" : "grace period over");
  return 0;
}
