// The CUDA backend's tuning table: every launch choice a family's dispatch reads (rows a thread,
// block sizes, which kernel `auto` runs for a shape), as one object. Each CudaBackend owns one,
// made for its device (TuningTable::For: the row of the device's compute capability, else the
// default row), and puts it in use on the calling thread for the length
// of a solve; the kernels' entry points read the table in use (ActiveTuning) and keep no
// copy. Tests and benchmarks that compare launch forms build their own table and put it in use
// around their calls (UseTuning): a table a caller put in use outranks the backend's, so a
// white-box test can steer a solve through the backend too.
//
// Why a thread's table and not an argument: the tridiagonal solver is also called from inside
// the tree, dense and block families (a tridiagonal step of their algorithms); passing the
// table through every one of their entry points would thread a parameter through code that
// never reads it.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "tridiagonal/tuning.h"

namespace trisolve::cuda {

struct TuningTable {
  PartitionedTuning tridiagonal;  // tridiagonal/tuning.h
  SweepTuning sweeps;             // the row sweeps (tridiagonal/row_sweeps.h, block/sweeps.cu)
  // The row this table came from: the compute capability it was measured on (10 * major +
  // minor: 90 for sm_90), 0 for the default row.
  int compute_capability = 0;

  // The table for a device: the row of its compute capability (TuningRows), else the default
  // row.
  static TuningTable For(const cudaDeviceProp& prop);
  static TuningTable ForComputeCapability(int compute_capability);
};

// One row a measured architecture, with where its evidence is (docs/kernels/README.md, "Tuning
// evidence"). Every knob of a row is a launch choice (0: the dispatch's rule by shape, itself
// measured on that architecture). An architecture without a row runs the default row
// (DefaultTuningRow): the sm_90 knobs, until a benchmark there says otherwise.
struct TuningRow {
  int compute_capability;
  const char* evidence;
  TuningTable table;
};
const std::vector<TuningRow>& TuningRows();
const TuningRow& DefaultTuningRow();

// The table in use on this thread: the innermost UseTuning's, else the defaults (TuningTable{}).
const TuningTable& ActiveTuning();

// Puts `table` in use on this thread until destroyed (then the one before it is back). The
// table is read, not copied: a caller may change it while it is in use (a benchmark's sweep).
// With kUnlessSet (the backend's), a table already in use on this thread stays in use.
class UseTuning {
 public:
  enum Mode { kAlways, kUnlessSet };
  explicit UseTuning(const TuningTable* table, Mode mode = kAlways);
  ~UseTuning();
  UseTuning(const UseTuning&) = delete;
  UseTuning& operator=(const UseTuning&) = delete;

 private:
  const TuningTable* previous_;
};

}  // namespace trisolve::cuda
