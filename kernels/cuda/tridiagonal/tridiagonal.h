// Batched tridiagonal solves on the GPU, on device arrays. No host transfers here: the backend
// (backend.cc) stages requests; the benchmark and the GPU tests call these directly.
//
// Algorithms (names as reported in SolveInfo::method):
//  - "partitioned": each thread owns M consecutive rows of a system in registers and reduces
//    them by the modified Thomas algorithm of Laszlo, Giles & Appleyard (2016) to two rows
//    coupling its first and last unknowns to the neighbouring chunks. For n <= 4096 one thread
//    block holds whole systems (8 or 16 rows a thread): the reduced system is solved by PCR in
//    shared memory and each thread substitutes back from its registers -- one pass over memory
//    (a, b, c, d read once, x written once). Larger n write the reduced rows (2 per 16 rows) to
//    global memory, solve that system the same way (recursively) and re-read a, b, c, d to
//    substitute back: about 11 arrays of traffic instead of 5; interleaved n > 2048 take this
//    two-pass path too (measured faster than one block a system). A single system is solved as
//    flat whatever its layout (the two are the same array).
//  - "partitioned-cluster" (compute capability 9.0+): the one-pass form with a system's rows
//    split over the blocks of a thread-block cluster (2 by default, 2-8 by tuning, 256 threads
//    x 16 rows at most a block); every block reads the whole reduced system from the cluster's
//    shared memory (distributed shared memory) and solves it redundantly. `auto` runs it for
//    interleaved 512 < n <= 2048 and flat 4096 < n <= 8192, where the H100 measured it fastest.
//  - "partitioned-stream": the one-pass form in the flat layout with persistent blocks, each
//    copying its next systems into shared memory (cp.async) while it solves the current ones;
//    `auto` runs it for float64 64 <= n < 128 and 512 < n <= 4096 (measured faster there).
//  - "partitioned-window": flat systems over 4096 rows cut into overlapping windows of 4096
//    rows (trisolve/windows.h), one a task of the streamed kernel's persistent blocks, each
//    solved alone with the couplings past it dropped and kept on its core: one pass, 14% more
//    rows read (a halo of 256 rows each side). Exact to rounding where every row of a window
//    has (|a| + |c|) / |b| under 0.864 (float64) / 0.935 (float32), the bound in windows.h,
//    which each window checks; if one does not, or meets a vanishing pivot, the whole problem
//    is solved again by the paths below and that path's name is reported. `auto` tries it for
//    flat n > 4096 but float64 7168 < n <= 8192 (the streamed rows are faster there).
//  - "thomas-window" (compute capability 9.0+, `auto` only): Thomas' algorithm, a warp's 32
//    threads on 32 consecutive systems, the rows streamed into shared memory by the copy
//    engine, c' and d' kept in a ring of 64 rows there and x stored 16 rows at a time by a back
//    substitution from the forward sweep's front once the product of |c'| over the look-ahead
//    bounds the error by the unit roundoff (thomas_window.cu): 5 arrays of traffic. Where the
//    batch has too few groups of 32 to fill the GPU, systems are also cut into windows
//    (windows.h) whose dropped left coupling is bounded a posteriori too (halos of 32 rows,
//    then the one the windows measured, up to 256); batches of 16-31 run two windows of 16 a
//    warp; flat batches take swizzled boxes and bulk stores; one system (rows a multiple of
//    16) is a chain of windows, 32 a warp, as short as the warps that run at once allow
//    (windows.h's PlanChain); in float64 a flat window's last rows take x from the next
//    window's first row rather than a look-ahead into it. A
//    chunk that needs more than 48 rows of look-ahead runs again with a ring of 128 rows; one
//    that needs more than 112, a window whose left end's bound fails at 256 rows or whose core
//    has a |c'| over 1, sends the whole problem to the paths below and that path's name is
//    reported; vanishing pivots are flagged per system as the CPU reference flags them (in a
//    window past a system's first they fail the problem). `auto` runs it where
//    ThomasWindowByShape says.
//  - "thomas": cuThomasBatch, one thread per system; c' kept in a scratch array of the same
//    layout (coalesced in the interleaved layout), d' in x.
//  - "pcr": the PCR notes' kernel, one thread per row and several systems of size d per block
//    (tidx = threadIdx.x % d, Qt = (threadIdx.x - tidx) / d), n <= 1024.
//  - "pivoting": LAPACK dgtsv's partial pivoting (the CPU reference's elimination, row
//    interchanges and all), one thread a system (pivoting.cu): the forward sweep keeps its
//    state every 8 rows, the backward sweep recomputes each block of 8 rows of U from there and
//    substitutes back (9 arrays of traffic); flat systems staged through shared memory. A pivot
//    exactly zero or not finite after the row choice flags the system (x written as zeros).
//  - "pivoting-split" (reported after the fast kernel's name: "thomas-window + pivoting-split
//    (1 system)"): `auto`'s and `pivoting`'s second solve of few or long flat systems
//    (pivoting_split.cu): partial pivoting inside parts of 33 rows, a thread a part, the
//    interfaces' system by the same method level by level, each answer kept only where its
//    backward error, computed on the device, is within 8 eps (after up to two steps of
//    iterative refinement); the others go to the sweep.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "runtime/memory_pool.h"
#include "tridiagonal/tuning.h"
#include "trisolve/tridiagonal.h"

namespace trisolve::cuda {

enum class TridiagonalKernel {
  kPartitioned,
  kPartitionedCluster,
  kPartitionedStream,
  kPartitionedClusterStream,
  kPartitionedWindow,
  kThomasWindow,
  kThomas,
  kPcr,
  kPivoting
};

// Whether the device runs thread-block clusters (compute capability 9.0 or newer); asked once.
bool ClustersAvailable();

// What `auto` and each method run for a shape.
TridiagonalKernel ChooseTridiagonalKernel(TridiagonalMethod m, int64_t n, int64_t batch,
                                          Layout layout, bool float32);
const char* KernelName(TridiagonalKernel k);

// Flat float64 systems of n rows, one a task of the block sweeps' streamed kernel
// (row_sweeps.cu: persistent blocks, or clusters of 2-8 blocks on sm_90, copying their
// next system into shared memory while they solve the current one), where that kernel takes
// n (RowsStreamCapacity: the rows its blocks hold, 0 where it does not take n; 2048 < n <=
// 16384, n > 4096 on clusters). Returns false (nothing launched) where it does not. Waits for
// the kernel (its task counter comes from `pool`).
int64_t RowsStreamCapacity(int64_t n);
absl::StatusOr<bool> SolveRowsStreamed(const TridiagonalProblem<double>& p, double* x,
                                       uint8_t* flags, Pool& pool, cudaStream_t stream);

// Whether thomas-window can run a shape (the interleaved layout, at least 2 systems, the batch
// whole 16-byte words, a device of compute capability 9.0+), and whether `auto` runs it.
bool ThomasWindowApplies(int64_t n, int64_t batch, Layout layout, bool float32);
bool ThomasWindowByShape(int64_t n, int64_t batch, Layout layout, bool float32);

// The rest of a solve whose kernel gives its answer later: thomas-window's kernels tell whether
// a window failed its checks through a word of pinned memory their last block writes, which
// the host can read only once the kernel is done. A call given a LaterAnswer returns when the
// kernel is queued (no wait: ~6 us a call on the H100, NOTES.md t48); the caller waits for the
// stream as it does anyway (its copy back), then calls Finish, which reads the answer and,
// where a window failed, solves the problem again as the waiting call would have (longer
// halo or ring, else the exact path), sets *again (x and the flags written again: copy them
// back again) and returns the kernel that solved it. The problem's arrays, x, the flags and
// the pool stay the caller's until then. Destroyed unfinished, it waits for the stream (the
// word goes back to be reused).
// A rest that names what solved the problem itself (Named): a variable-size batch's, whose
// answer is one block-diagonal system's or the per-system kernels' (variable.h); Finish is then
// refused (FAILED_PRECONDITION) and FinishNamed answers.
class LaterAnswer {
 public:
  using Rest = absl::AnyInvocable<absl::StatusOr<TridiagonalKernel>(bool* again)>;
  using NamedRest = absl::AnyInvocable<absl::StatusOr<std::string>(bool* again)>;
  LaterAnswer() = default;
  explicit LaterAnswer(Rest rest) : rest_(std::move(rest)) {}
  static LaterAnswer Named(NamedRest rest) {
    LaterAnswer l;
    l.named_ = std::move(rest);
    return l;
  }
  LaterAnswer(LaterAnswer&&) = default;
  LaterAnswer& operator=(LaterAnswer&&) = default;
  ~LaterAnswer() = default;  // (the rest's state waits for its stream when destroyed)
  bool pending() const { return static_cast<bool>(rest_) || static_cast<bool>(named_); }
  absl::StatusOr<TridiagonalKernel> Finish(bool* again = nullptr) {
    if (!rest_)
      return absl::FailedPreconditionError(named_ ? "LaterAnswer: a named answer (FinishNamed)"
                                                  : "LaterAnswer: no answer pending");
    bool a = false;
    Rest rest = std::move(rest_);
    rest_ = nullptr;
    auto k = rest(&a);
    if (again != nullptr) *again = a;
    return k;
  }
  // Either kind: the name of what solved the problem (KernelName of a kernel's rest).
  absl::StatusOr<std::string> FinishNamed(bool* again = nullptr);

 private:
  Rest rest_;
  NamedRest named_;
};

// thomas-window on p (device arrays 16-byte aligned, else false): `windows` a system (0 to fill
// the GPU), `halo` rows before the cores past a system's first (0: 32, then the one the windows
// measured, up to 256, where the left end's bound needs more; else that halo alone), `stages`
// copies in flight a warp (2; float32 also 1 or 4), `mirror` whether odd windows sweep backward
// (0: in the interleaved layout, 1 wherever cores are whole, -1 never). Returns false where it
// does not apply or where the problem failed its checks (then x is partly written, the flags
// are zero, and the caller solves p by the exact path). Waits for the kernel, unless `rest`:
// then true means launched, and *rest (after the caller's wait for the stream) answers as the
// waiting call would have, setting *again where a second launch rewrote x; destroyed
// unanswered, it waits for the stream.
using ThomasWindowRest = absl::AnyInvocable<absl::StatusOr<bool>(bool* again)>;
template <typename T>
absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                         cudaStream_t stream, int64_t windows = 0,
                                         int64_t halo = 0, int stages = 0, int mirror = 0,
                                         ThomasWindowRest* rest = nullptr);
// thomas-window's launches in this process (tests: a shape's solve after its first starts where
// the first succeeded, SolveThomasWindowed's StartMemory).
int64_t ThomasWindowLaunches();
// The halo of the last thomas-window launch whose windows had one (tests: the measured halo).
int64_t ThomasWindowLastHalo();

// The pivoting kernel (pivoting.cu) on p, queued: `scratch` holds PivotingScratchBytes (the
// forward sweep's checkpoints) until the kernel is done. only_flagged: solves only the systems
// whose flag is set, clears the flag of each it solves, leaves the others' x and flags alone
// and counts the systems it took in *resolved (a mapped host int, or nullptr) -- auto's second
// solve of what the fast kernels flagged, on the device.
int64_t PivotingScratchBytes(int64_t n, int64_t batch, bool float32);
// Below this many systems the backend runs `pivoting` (and auto's second solve) on the host:
// a thread a system leaves the GPU idle and runs each sweep at one thread's pace.
constexpr int64_t kPivotingDeviceBatch = 32;
template <typename T>
absl::Status LaunchPivoting(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, void* scratch,
                            cudaStream_t stream, bool only_flagged = false,
                            int* resolved = nullptr);
// The same with its scratch from `pool`; waits for the kernel.
template <typename T>
absl::Status SolvePivotingDevice(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                 Pool& pool, cudaStream_t stream);

// pivoting-split (pivoting_split.cu): the systems whose flag is set solved by a partition
// method with partial pivoting, a thread a part of kPivotingSplitPartRows rows, the interfaces'
// system by the same method a level down until it has kPivotingSplitSweepRows rows or fewer,
// then by the sweep. A system keeps the answer only where its backward error (from p's arrays)
// is within cpu::kSplitPivotingTolerance eps: then its flag is cleared and it is counted in
// *solved (a mapped host int, or nullptr); the others keep their flags (x partly written) for
// the caller's fallback. Flat layout (or one system) only, where PivotingSplitApplies;
// `scratch` holds PivotingSplitScratchBytes until the kernels are done. Queued; no wait.
constexpr int64_t kPivotingSplitPartRows = 33;
constexpr int64_t kPivotingSplitSweepRows = 64;
// Where the re-solve takes the split rather than the sweep (thread a system) at a batch of
// kPivotingDeviceBatch or more: systems of kPivotingSplitMinRows rows or more (2^24 unknowns on
// the H100, zero diagonal: n = 4096, split 2.4 ms against the sweep's 4.2; n = 1024: 2.6
// against 1.8); below kPivotingDeviceBatch wherever the split applies (it replaces the host's
// sweep). docs/kernels/tridiagonal.md, "Partial pivoting, split".
constexpr int64_t kPivotingSplitMinRows = 4096;
bool PivotingSplitApplies(int64_t n, int64_t batch, Layout layout);
bool PivotingSplitByShape(int64_t n, int64_t batch, Layout layout);
int64_t PivotingSplitScratchBytes(int64_t n, int64_t batch, bool float32);
// `any_flagged` (a mapped host int: `mapped` the device's pointer, `host` the caller's), where
// given: the launch waits for the stream once the flags are read and launches nothing more
// where no system is flagged. `whole_parts`: parts staged whole through shared memory (read
// once) rather than 8 rows at a time (read twice); the benchmark compares them.
struct SplitAny {
  int* mapped = nullptr;
  int* host = nullptr;
};
template <typename T>
absl::Status LaunchPivotingSplit(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                 void* scratch, cudaStream_t stream, int* solved = nullptr,
                                 const SplitAny* any_flagged = nullptr, bool whole_parts = true);

// Where `auto` (and `pivoting`) solve again, on the device, the systems the fast kernel flagged
// (a vanished pivot, a row not diagonally dominant: flags.h):
// the pivoting kernel's scratch (PivotingScratchBytes of the problem) and a host int mapped
// for the device (`mapped` the kernel's pointer, `host` the caller's), which counts the
// systems solved again; both the caller's until its wait for the stream.
// With split_bytes > 0 (the scratch's size, at least PivotingSplitScratchBytes of the problem
// for the split to run), the systems are first offered to pivoting-split where
// PivotingSplitByShape says, counted in split_mapped / split_host; `sweep` false leaves the
// ones it did not answer flagged (the caller solves them on the host) instead of the sweep.
// Where split_any is set and nothing was flagged, neither runs (the call waited for that).
struct PivotResolve {
  void* scratch = nullptr;
  int* mapped = nullptr;
  int* host = nullptr;
  int64_t split_bytes = 0;
  int* split_mapped = nullptr;
  int* split_host = nullptr;
  bool sweep = true;
  SplitAny split_any;  // (where set: the split's launch asks first whether any is flagged)
};

// Solves on `stream`. p's arrays and x are device pointers; status_flags (device, batch bytes,
// zeroed by the caller) get kFlagVanished for systems whose pivots vanished (x of those systems
// is then meaningless: the caller zeroes it) and, from the fast kernels, kFlagNotDominant for
// systems with a row that is not diagonally dominant (x stands: no status; flags.h). Scratch comes from `pool`. Returns the kernel that ran (for `auto`, what
// ChooseTridiagonalKernel predicts unless the windows' check failed and sent the problem on).
// With `later`, a kernel that answers later (thomas-window) is left to the caller's wait: the
// call returns the kernel it launched and *later is pending (LaterAnswer above). With
// `resolve` (auto and pivoting), the kernel auto chooses runs and every system it flagged is
// then solved again by the pivoting kernel on the device (after the later answer's, where it
// solves again), *resolve->host counting them once the caller has waited for the stream: the
// fast kernel's answer is kept only where every row is diagonally dominant (docs/kernels/
// tridiagonal.md, "Certified by dominance"). pivoting without `resolve` runs the pivoting
// sweep on every system.
template <typename T>
absl::StatusOr<TridiagonalKernel> SolveTridiagonalDevice(const TridiagonalProblem<T>& p,
                                                         TridiagonalMethod method, T* x,
                                                         uint8_t* status_flags, Pool& pool,
                                                         cudaStream_t stream,
                                                         LaterAnswer* later = nullptr,
                                                         const PivotResolve* resolve = nullptr);

}  // namespace trisolve::cuda
