// The fault-injection switch (trisolve/fault_injection.h) and its CPU stand-in for a device's
// faults, which lets the server's handling of them be tested where there is no GPU.
#include "trisolve/fault_injection.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "trisolve/backend.h"

namespace trisolve {

absl::StatusOr<FaultInjection> FaultInjection::Parse(const std::string& spec) {
  FaultInjection f;
  // The value is an operator's or a test's, but bounded all the same in what is echoed.
  const std::string shown = spec.size() > 64 ? spec.substr(0, 64) + "..." : spec;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    const size_t colon = part.find(':');
    int64_t n = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(part.substr(colon + 1), &n) || n < 1)
      return absl::InvalidArgumentError(
          absl::StrCat("TRISOLVE_FAULT_INJECTION '", shown,
                       "': expected alloc-fail:N, sticky:N, stall:N, stall-ms:N (N >= 1), "
                       "separated by commas"));
    const absl::string_view kind = part.substr(0, colon);
    if (kind == "alloc-fail") {
      f.alloc_fail_at_ = n;
    } else if (kind == "sticky") {
      f.sticky_at_ = n;
    } else if (kind == "stall") {
      f.stall_at_ = n;
    } else if (kind == "stall-ms") {
      if (n > 600000)
        return absl::InvalidArgumentError(absl::StrCat("TRISOLVE_FAULT_INJECTION '", shown,
                                                       "': stall-ms is at most 600000"));
      f.stall_ms_ = n;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "TRISOLVE_FAULT_INJECTION '", shown,
          "': unknown fault (alloc-fail, sticky, stall, stall-ms)"));
    }
  }
  return f;
}

namespace {
struct ProcessFaults {
  FaultInjection faults;
  absl::Status status;
  ProcessFaults() {
    const char* v = std::getenv("TRISOLVE_FAULT_INJECTION");
    auto parsed = FaultInjection::Parse(v == nullptr ? "" : v);
    if (parsed.ok())
      faults = *parsed;
    else
      status = parsed.status();
  }
};
ProcessFaults& Faults() {
  static ProcessFaults* f = new ProcessFaults();  // never destroyed: read by exiting threads
  return *f;
}
}  // namespace

FaultInjection& FaultInjection::Process() { return Faults().faults; }
absl::Status FaultInjection::ProcessStatus() { return Faults().status; }

std::string FaultInjection::Describe() const {
  std::string s;
  if (alloc_fail_at_ > 0) absl::StrAppend(&s, "alloc-fail:", alloc_fail_at_);
  if (sticky_at_ > 0) absl::StrAppend(&s, s.empty() ? "" : ",", "sticky:", sticky_at_);
  if (stall_at_ > 0)
    absl::StrAppend(&s, s.empty() ? "" : ",", "stall:", stall_at_, ",stall-ms:", stall_ms_);
  return s.empty() ? "none" : s;
}

namespace {

// Every call goes to the wrapped backend; the faults are taken around the solves. Once "lost",
// it behaves as a CUDA backend whose context is gone: Health() is UNAVAILABLE and every call
// that ends from then on fails UNAVAILABLE, whatever it computed.
class FaultInjectingBackend final : public Backend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, FaultInjection* faults)
      : inner_(std::move(inner)), faults_(faults) {}

  BackendInfo Info() const override { return inner_->Info(); }
  absl::Status Health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return lost_;
  }

#define TRISOLVE_FAULTS_SOLVE(Problem, Method, Output)                                        \
  absl::StatusOr<SolveInfo> Solve(const Problem<double>& p, Method m, Output<double> out,    \
                                  const SolveControl& c) override {                          \
    return Run([&] { return inner_->Solve(p, m, out, c); });                                 \
  }                                                                                           \
  absl::StatusOr<SolveInfo> Solve(const Problem<float>& p, Method m, Output<float> out,      \
                                  const SolveControl& c) override {                          \
    return Run([&] { return inner_->Solve(p, m, out, c); });                                 \
  }
  TRISOLVE_FAULTS_SOLVE(TridiagonalProblem, TridiagonalMethod, TridiagonalOutput)
  TRISOLVE_FAULTS_SOLVE(TreeProblem, TreeMethod, TreeOutput)
  TRISOLVE_FAULTS_SOLVE(DenseProblem, DenseMethod, DenseOutput)
#undef TRISOLVE_FAULTS_SOLVE
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& c) override {
    return Run([&] { return inner_->Solve(p, m, o, out, c); });
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& c) override {
    return Run([&] { return inner_->Solve(p, m, o, out, c); });
  }
  // Prepare and SolvePrepared are Backend's own (the CPU backend keeps systems on the host):
  // a prepared solve comes back through Solve above, one call a right-hand-side block.
  absl::StatusOr<bool> PinHostMemory(void* p, int64_t bytes) override {
    return inner_->PinHostMemory(p, bytes);
  }
  void UnpinHostMemory(void* p) override { inner_->UnpinHostMemory(p); }

 private:
  template <typename F>
  absl::StatusOr<SolveInfo> Run(F solve) {
    if (auto st = Health(); !st.ok()) return st;
    const bool sticky = faults_->NextSolveIsSticky();
    if (const int64_t ms = faults_->NextSolveStallMs(); ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    if (faults_->NextAllocationFails())
      return absl::ResourceExhaustedError(
          "host allocation for the solve: out of memory (fault injection: alloc-fail)");
    absl::StatusOr<SolveInfo> r = solve();
    std::lock_guard<std::mutex> lock(mu_);
    if (sticky && lost_.ok())
      lost_ = absl::UnavailableError(
          "the device is lost to this process: a sticky error (fault injection: sticky, the CPU "
          "stand-in for a CUDA context lost to a kernel's trap)");
    if (!lost_.ok()) return lost_;
    return r;
  }

  std::unique_ptr<Backend> inner_;
  FaultInjection* faults_;
  mutable std::mutex mu_;
  absl::Status lost_;
};

}  // namespace

std::unique_ptr<Backend> WithInjectedFaults(std::unique_ptr<Backend> backend,
                                            FaultInjection* faults) {
  if (faults == nullptr || !faults->enabled()) return backend;
  return std::make_unique<FaultInjectingBackend>(std::move(backend), faults);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeServedCpuBackend(int threads) {
  if (auto st = FaultInjection::ProcessStatus(); !st.ok()) return st;
  return WithInjectedFaults(MakeCpuBackend(threads), &FaultInjection::Process());
}

}  // namespace trisolve
