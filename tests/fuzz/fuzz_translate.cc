// libFuzzer: request translation (server/translate.cc, server/job.cc) from protobuf messages as
// the server receives them: unary requests of every family, CreateSystem with SolveSystem steps
// (updates and right-hand sides checked against the system), and streamed requests (a header,
// then chunks assembled in order). With `solve`, what translated is solved on the CPU backend:
// a request the checks accept must not crash a kernel either.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "google/protobuf/stubs/logging.h"
#include "translate.h"
#include "translate_input.pb.h"
#include "trisolve/backend.h"

namespace {

namespace ts = trisolve::server;

// Small jobs: the fuzzer's time goes into many inputs, not into one large solve.
const ts::JobLimits kLimits{int64_t{1} << 20, int64_t{1} << 12};
constexpr int64_t kMaxIterations = 64;

trisolve::Backend& Cpu() {
  static const std::unique_ptr<trisolve::Backend> backend = trisolve::MakeCpuBackend(1);
  return *backend;
}

void Solve(ts::Job& job) {
  job.block_options.max_iterations = std::min(job.block_options.max_iterations, kMaxIterations);
  trisolve::SolveControl control;
  (void)ts::RunJob(Cpu(), job, control);
}

// CreateSystem, then SolveSystem steps, as SolverService::CreateSystem and SolveStep do them.
void System(const trisolve::fuzz::TranslateInput& in) {
  auto job = ts::JobFromCreateSystem(in.create_system(), kLimits);
  if (!job.ok() || !in.solve()) return;
  auto system = Cpu().Prepare(job->Spec());
  if (!system.ok()) return;
  const auto shapes = job->CoefficientShapes();
  const auto rhs_shape = job->SystemRhsShape();
  for (const trisolve::v1::SolveSystemRequest& step : in.steps()) {
    std::string scratch;
    const trisolve::SystemSpec& spec = (*system)->spec();
    for (const trisolve::v1::NamedArray& u : step.update()) {
      // Region references are refused here (no registry): their error path is what runs.
      const int eb = spec.family == trisolve::Family::kTree && u.name() == "parent"
                         ? 4
                         : spec.elem_bytes();
      auto in_array = ts::ArrayFromProto(u.array(), &scratch, nullptr, "update", eb);
      if (!in_array.ok()) return;
      auto checked = ts::CheckUpdate(spec, shapes, u.name(), *in_array);
      if (!checked.ok()) return;
      if (!(*system)->Update(checked->index, checked->data).ok()) return;
    }
    std::string rhs_scratch;
    auto rhs_in = ts::ArrayFromProto(step.rhs(), &rhs_scratch, nullptr, "rhs", spec.elem_bytes());
    if (!rhs_in.ok()) continue;
    auto rhs = ts::CheckRhs(spec, rhs_shape, *rhs_in, kLimits);
    if (!rhs.ok()) continue;
    trisolve::SolveControl control;
    (void)ts::RunPrepared(Cpu(), **system, rhs->data, rhs->k, trisolve::Layout::kFlat,
                          step.skip_residual(), control);
  }
}

void Streamed(const trisolve::fuzz::TranslateInput& in) {
  const auto& msgs = in.stream().messages();
  if (msgs.empty()) return;
  auto job = ts::JobFromStreamHeader(msgs[0], kLimits);
  if (!job.ok()) return;
  for (int i = 1; i < msgs.size(); ++i) {
    if (!msgs[i].has_chunk()) return;  // the server ends the call: only chunks follow the header
    if (!ts::AppendChunk(*job, msgs[i].chunk()).ok()) return;
  }
  if (!ts::FinishStreamedJob(*job).ok()) return;
  if (in.solve()) Solve(*job);
}

template <typename Req>
void Unary(const Req& req, bool solve) {
  auto job = ts::JobFromRequest(req, kLimits);
  if (job.ok() && solve) Solve(*job);
}

}  // namespace

// protobuf logs every string field that is not UTF-8 (most mutated inputs): silenced, so the
// time goes into inputs, not into log lines.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trisolve::fuzz::TranslateInput in;
  if (!in.ParseFromArray(data, int(std::min<size_t>(size, INT32_MAX)))) return -1;
  switch (in.request_case()) {
    case trisolve::fuzz::TranslateInput::kTridiagonal: Unary(in.tridiagonal(), in.solve()); break;
    case trisolve::fuzz::TranslateInput::kTree: Unary(in.tree(), in.solve()); break;
    case trisolve::fuzz::TranslateInput::kBlockTridiagonal:
      Unary(in.block_tridiagonal(), in.solve());
      break;
    case trisolve::fuzz::TranslateInput::kDense: Unary(in.dense(), in.solve()); break;
    case trisolve::fuzz::TranslateInput::kCreateSystem: System(in); break;
    case trisolve::fuzz::TranslateInput::kStream: Streamed(in); break;
    default: break;
  }
  return 0;
}
