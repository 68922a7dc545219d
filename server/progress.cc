// SolveWithProgress: the unary solve of any family, with Progress messages while it runs.
// The core does the work as for the Solve* RPCs (the same admission, deadlines, cancellation
// and statuses); this transport only turns its ProgressEvents (Call::progress) into messages,
// sent by a reporter thread at most once an interval, so that a solver reporting every
// iteration never waits on the network and a slow reader never slows the solve.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "service.h"

namespace trisolve::server {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// The latest event, and the thread that sends it when it has changed and an interval has
// passed since the last message.
class Reporter {
 public:
  Reporter(grpc::ServerWriter<v1::ProgressResponse>* writer, Clock::time_point start,
           Clock::duration interval, const Job& job)
      : writer_(writer), start_(start), interval_(interval) {
    if (job.descriptor().iterative) {
      max_iterations_ = job.block_options.max_iterations;
      tol_ = job.block_options.tol;
    }
  }
  ~Reporter() { Stop(); }

  // The first message goes now, on the caller's thread; later ones from the reporter's.
  void Start(const ProgressEvent& first) {
    latest_ = first;
    Send(first);
    last_sent_ = Clock::now();
    thread_ = std::thread([this] { Run(); });
  }
  // Events that would move backwards (a phase before the current one, fewer iterations: a
  // fallback method restarting its count is reported by the kernels as a continuation
  // already) are dropped, so that what the client sees is monotone.
  void Post(const ProgressEvent& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (e.phase < latest_.phase) return;
    if (e.phase == latest_.phase && e.iteration < latest_.iteration) return;
    if (e.phase == latest_.phase && e.phase == ProgressEvent::kSolving &&
        e.iteration == latest_.iteration && std::isnan(e.residual))
      return;
    latest_ = e;
    changed_ = true;
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // After Stop: the last iteration the solver reported, where the interval held it back (a
  // solve shorter than the interval), so that every stream of an iterative solve that reported
  // one says how far it went before the answer.
  void Flush() {
    if (changed_ && latest_.phase == ProgressEvent::kSolving) Send(latest_);
    changed_ = false;
  }
  // After Stop: the writer is the caller's again.
  bool Send(const ProgressEvent& e) {
    if (broken_) return false;
    v1::ProgressResponse msg;
    v1::Progress* p = msg.mutable_progress();
    p->set_phase(static_cast<v1::Progress::Phase>(e.phase));
    p->set_bytes_done(e.bytes_done);
    p->set_bytes_total(e.bytes_total);
    if (e.phase == ProgressEvent::kSolving && max_iterations_ > 0) {
      p->set_iteration(e.iteration);
      if (!std::isnan(e.residual)) p->set_residual(e.residual);
      p->set_max_iterations(max_iterations_);
      p->set_tol(tol_);
    }
    p->set_elapsed_s(std::chrono::duration<double>(Clock::now() - start_).count());
    if (!writer_->Write(msg)) broken_ = true;  // the client went away: the solve notices
    return !broken_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_until(lock, last_sent_ + interval_, [this] { return stop_; });
      if (stop_) break;
      if (!changed_) {
        cv_.wait_for(lock, interval_, [this] { return stop_ || changed_; });
        continue;
      }
      const ProgressEvent e = latest_;
      changed_ = false;
      lock.unlock();
      Send(e);
      lock.lock();
      last_sent_ = Clock::now();
    }
  }

  grpc::ServerWriter<v1::ProgressResponse>* writer_;
  const Clock::time_point start_;
  const Clock::duration interval_;
  int64_t max_iterations_ = 0;
  double tol_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  ProgressEvent latest_;
  bool changed_ = false, stop_ = false, broken_ = false;
  Clock::time_point last_sent_;
  std::thread thread_;
};

}  // namespace

grpc::Status SolverService::SolveWithProgress(grpc::ServerContext* ctx,
                                              const v1::ProgressRequest* req,
                                              grpc::ServerWriter<v1::ProgressResponse>* writer) {
  Call call = Begin(ctx, "SolveWithProgress");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok())
    return Finish(call, st);
  if (!std::isfinite(req->interval_s()) || req->interval_s() < 0 ||
      (req->interval_s() > 0 && req->interval_s() < 0.01) || req->interval_s() > 3600)
    return Finish(call, absl::InvalidArgumentError(
                            "interval_s: expected 0 (0.1 s) or 0.01 .. 3600 seconds"));
  const double interval_s = req->interval_s() > 0 ? req->interval_s() : 0.1;
  RequestRegions regions = core_.Regions(call.identity);
  const DeclareOptions o{.regions = &regions, .defer_finite = true};
  absl::StatusOr<Job> job;
  switch (req->request_case()) {
    case v1::ProgressRequest::kTridiagonal:
      job = JobFromRequest(req->tridiagonal(), options_.limits, o);
      break;
    case v1::ProgressRequest::kTree: job = JobFromRequest(req->tree(), options_.limits, o); break;
    case v1::ProgressRequest::kBlockTridiagonal:
      job = JobFromRequest(req->block_tridiagonal(), options_.limits, o);
      break;
    case v1::ProgressRequest::kDense: job = JobFromRequest(req->dense(), options_.limits, o); break;
    case v1::ProgressRequest::REQUEST_NOT_SET:
      return Finish(call, absl::InvalidArgumentError(
                              "request: set one of tridiagonal, tree, block_tridiagonal, dense"));
  }
  call.receive_us = Micros(Clock::now() - call.start);
  if (!job.ok()) return Finish(call, job.status());
  call.sample.family = std::string(FamilyName(job->family));
  call.sample.method = std::string(job->method_name());

  Reporter reporter(writer, call.start,
                    std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(interval_s)),
                    *job);
  const int64_t bytes = job->total_bytes();
  reporter.Start({.phase = ProgressEvent::kReceived, .bytes_done = bytes, .bytes_total = bytes});
  call.progress = [&reporter](const ProgressEvent& e) { reporter.Post(e); };
  auto answer = core_.Solve(call, *job);
  reporter.Stop();
  call.progress = nullptr;
  if (!answer.ok()) return Finish(call, answer.status());
  if (auto st = regions.AfterUse(); !st.ok()) return Finish(call, st);
  reporter.Flush();
  v1::ProgressResponse last;
  const bool sparse = req->has_tridiagonal()         ? req->tridiagonal().sparse_status()
                      : req->has_tree()              ? req->tree().sparse_status()
                      : req->has_block_tridiagonal() ? req->block_tridiagonal().sparse_status()
                                                     : req->dense().sparse_status();
  AnswerToProto(*answer, last.mutable_answer(), sparse);
  const int64_t x_bytes = int64_t(last.answer().x().data().size());
  reporter.Send({.phase = ProgressEvent::kSending, .bytes_done = 0, .bytes_total = x_bytes});
  if (!writer->Write(last, grpc::WriteOptions().set_last_message()))
    return Finish(call, absl::CancelledError("the client went away before the answer"));
  return Finish(call, absl::OkStatus());
}

}  // namespace trisolve::server
