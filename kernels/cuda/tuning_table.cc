#include "tuning_table.h"

#include "tridiagonal/row_sweeps.h"

namespace trisolve::cuda {
namespace {

const TuningTable kDefaults{};
thread_local const TuningTable* t_active = nullptr;

}  // namespace

const std::vector<TuningRow>& TuningRows() {
  static const std::vector<TuningRow> rows = [] {
    TuningTable sm90;  // every knob by shape: the dispatch's rules are the H100's
    sm90.compute_capability = 90;
    return std::vector<TuningRow>{
        {90,
         "NVIDIA H100 80GB HBM3: bench_tridiagonal --tune, bench_block, bench_tree "
         "(docs/kernels/README.md, Tuning evidence; tests/bench/results/)",
         sm90}};
  }();
  return rows;
}

const TuningRow& DefaultTuningRow() {
  static const TuningRow row{
      0, "none measured: the sm_90 row's knobs (docs/kernels/README.md, Tuning evidence)",
      kDefaults};
  return row;
}

TuningTable TuningTable::ForComputeCapability(int compute_capability) {
  for (const TuningRow& row : TuningRows())
    if (row.compute_capability == compute_capability) return row.table;
  return DefaultTuningRow().table;
}

TuningTable TuningTable::For(const cudaDeviceProp& prop) {
  return ForComputeCapability(10 * prop.major + prop.minor);
}

const TuningTable& ActiveTuning() { return t_active != nullptr ? *t_active : kDefaults; }

UseTuning::UseTuning(const TuningTable* table, Mode mode) : previous_(t_active) {
  if (mode == kAlways || t_active == nullptr) t_active = table;
}

UseTuning::~UseTuning() { t_active = previous_; }

SweepTuning GetSweepTuning() { return ActiveTuning().sweeps; }

}  // namespace trisolve::cuda
