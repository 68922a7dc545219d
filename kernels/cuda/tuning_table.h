// The CUDA backend's tuning table: every launch choice a family's dispatch reads (rows a thread,
// block sizes, which kernel `auto` runs for a shape), as one object. Each CudaBackend owns one,
// made for its device (TuningTable::For), and puts it in use on the calling thread for the length
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

#include "tridiagonal/tuning.h"

namespace trisolve::cuda {

struct TuningTable {
  PartitionedTuning tridiagonal;  // tridiagonal/tuning.h
  SweepTuning sweeps;             // the row sweeps (tridiagonal/row_sweeps.h, block/sweeps.cu)

  // The table for a device. Every row was measured on the H100 (sm_90); other architectures
  // run the same rows until a benchmark there says otherwise (docs/kernels.md, "Tuning").
  static TuningTable For(const cudaDeviceProp& prop);
};

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
