#include "tuning_table.h"

#include "tridiagonal/row_sweeps.h"

namespace trisolve::cuda {
namespace {

const TuningTable kDefaults{};
thread_local const TuningTable* t_active = nullptr;

}  // namespace

TuningTable TuningTable::For(const cudaDeviceProp&) { return TuningTable{}; }

const TuningTable& ActiveTuning() { return t_active != nullptr ? *t_active : kDefaults; }

UseTuning::UseTuning(const TuningTable* table, Mode mode) : previous_(t_active) {
  if (mode == kAlways || t_active == nullptr) t_active = table;
}

UseTuning::~UseTuning() { t_active = previous_; }

SweepTuning GetSweepTuning() { return ActiveTuning().sweeps; }

}  // namespace trisolve::cuda
