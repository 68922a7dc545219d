// The tridiagonal family's dispatch on the device: the one place where a TridiagonalMethod
// (`auto` included) and a shape become the kernel that runs them and its launch shape, read
// against the tuning table in use (cuda/tuning_table.h). The drivers (tridiagonal.cu,
// thomas_window.cu, row_sweeps.cu) launch what this file picks and choose nothing.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "tridiagonal/internal.h"
#include "tridiagonal/row_sweeps.h"
#include "tridiagonal/tridiagonal.h"
#include "tridiagonal/variable.h"
#include "trisolve/windows.h"
#include "tuning_table.h"

namespace trisolve::cuda {
namespace tridiagonal {
namespace {

// The partitioned kernels' tuning in the table in use (cuda/tuning_table.h).
const PartitionedTuning& Tuned() { return ActiveTuning().tridiagonal; }

// Whether the flat one-pass and level kernels load their rows directly (no staging tile): the
// tuning's, or always (0): the staging tile's shared-memory round trip only delays the loads.
// Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", FlatDirect.
bool FlatDirect() { return Tuned().flat_direct >= 0; }

// Rows read beyond a window's core on each side: the tuning's, else 256, so that rows with
// (|a| + |c|) / |b| up to 0.864 (float64) / 0.935 (float32) qualify, for 14% more rows read than
// the system (windows of 4096 rows). Evidence: docs/kernels/tridiagonal.md, "Tuning evidence",
// WindowHalo.
template <typename T>
int64_t WindowHalo() {
  return Tuned().window_halo > 0 ? Tuned().window_halo : 256;
}

// Cores of whole 128-byte lines (the halo too): each window's copies then start on a line
// (where n is whole lines too); cores of 16-byte words started most windows inside a line and
// multiplied the copies' L2 requests. Evidence: docs/kernels/tridiagonal.md, "Tuning evidence",
// PlanWindowsFor.
template <typename T>
WindowPlan PlanWindowsFor(int64_t n) {
  return PlanWindows(n, int64_t(kWindowThreads) * kWindowChunk, WindowHalo<T>(),
                     128 / int64_t(sizeof(T)));
}

// Whether `auto` tries the windows first: the tuning's (1: wherever they apply), else flat systems
// over 4096 rows but float64 systems of three windows or more that fill clusters of 4 streamed
// blocks (7168 < n <= 8192), which the streamed rows solve faster. Evidence:
// docs/kernels/tridiagonal.md, "Tuning evidence", WindowsByShape.
bool RowsStreamByShape(int64_t n, Layout layout, bool float32);
bool WindowsByShape(int64_t n, Layout layout, bool float32) {
  if (Tuned().window < 0 || layout != Layout::kFlat) return false;
  const WindowPlan plan = float32 ? PlanWindowsFor<float>(n) : PlanWindowsFor<double>(n);
  if (plan.per_system < 2 || n % (float32 ? 4 : 2) != 0 || plan.halo % (float32 ? 32 : 16) != 0)
    return false;
  if (Tuned().window > 0) return true;
  return float32 || !(plan.per_system >= 3 && RowsStreamCapacity(n) == 4 * 2048 &&
                      RowsStreamByShape(n, layout, false));
}

// Whether one block can hold whole systems of this size.
// Rows a thread of the one-pass kernel: the tuning's, or by shape (0): 16 where a thread's longer
// reduction pays for the fewer, larger PCR levels, 8 where the block's PCR is short anyway.
// Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", OnChipChunk.
template <typename T>
int OnChipChunk(int64_t n, Layout layout) {
  if (Tuned().chunk > 0) return Tuned().chunk;
  if (layout == Layout::kFlat) return n > (sizeof(T) == 8 ? 256 : 32) ? 16 : kChunk;
  if (sizeof(T) != 8) return n > 64 ? 16 : kChunk;
  if (n > 2048) return 16;
  if (n > 128 && n <= 512) return 16;
  return kChunk;
}

// Whether `auto` runs the streamed one-pass kernel (PartitionedStreamKernel) for this shape, its
// arrays 16-byte aligned (the service's pooled buffers are): flat float64 64 <= n < 128 and 512 < n
// <= 4096, where overlapping the next systems' copy with this one's arithmetic beat the one-block
// kernel; it lost or tied at the other n and in float32. Evidence: docs/kernels/tridiagonal.md,
// "Tuning evidence", StreamsByShape.
bool StreamsByShape(int64_t n, Layout layout, bool float32) {
  if (Tuned().stream != 0 || layout != Layout::kFlat || float32) return false;
  const int chunk = OnChipChunk<double>(n, layout);
  const bool wins = (n >= 64 && n < 128) || (n > 512 && n <= 4096);
  return wins && (chunk == 8 || chunk == 16) && n % 2 == 0 && n <= int64_t(chunk) * 256;
}

// Whether `auto` runs the streamed kernel on the interleaved layout (16 rows a thread, 256 threads
// a block: groups of 4 systems at n = 1024, 16 at n = 256): float64 128 < n <= 1024; at n <= 128
// and in float32 the one-pass or cluster kernels win. An odd batch (a group's row not whole 16-byte
// words) runs what ran before. Evidence: docs/kernels/tridiagonal.md, "Tuning evidence",
// StreamsInterleavedByShape.
bool StreamsInterleavedByShape(int64_t n, int64_t batch, Layout layout, bool float32) {
  if (Tuned().stream != 0 || layout != Layout::kInterleaved || float32) return false;
  return n > 128 && n <= 1024 && batch % 2 == 0;
}

template <typename T>
bool FitsOnChip(int64_t n) {
  const int chunk = Tuned().chunk > 0 ? Tuned().chunk : kChunk;
  return n <= int64_t(chunk) * MaxThreadsOnChip(chunk);
}

// The one-block kernels' launch for p: rows a thread (OnChipChunk), threads a block and whether
// the streamed kernel goes first.
template <typename T>
OnChipForm OnChipFormFor(const TridiagonalProblem<T>& p) {
  // Small blocks pack more systems an SM for the flat layout and small n; interleaved systems above
  // n = 128 want wider blocks (more systems a warp-load). Evidence: docs/kernels/tridiagonal.md,
  // "Tuning evidence", OnChipFormFor.
  const int chunk = OnChipChunk<T>(p.n, p.layout);
  const bool inter = p.layout == Layout::kInterleaved;
  // Flat blocks of 64 threads (float64 from n = 64, float32 from n = 128); above n = 1024 a
  // system's threads fill 128 or more anyway.
  const bool flat64 = !inter && p.n >= (sizeof(T) == 8 ? 64 : 128);
  // Interleaved n <= 128: 256 threads.
  const int auto_threads = flat64                            ? 64
                           : inter && p.n <= 128             ? 256
                           : chunk == 16                     ? (sizeof(T) == 4 && inter ? 256 : 128)
                           : inter                           ? 512
                                                             : 128;
  const int min_threads = std::min(
      std::max(Tuned().min_threads > 0 ? Tuned().min_threads : auto_threads, 32),
      kMaxThreadsOnChip);
  OnChipForm form;
  form.chunk = chunk;
  form.min_threads = min_threads;
  form.direct = FlatDirect();
  form.try_stream = (chunk == 8 || chunk == 16) &&
                    (Tuned().stream > 0 || StreamsByShape(p.n, p.layout, sizeof(T) == 4));
  // The streamed kernel: 128 threads a block at least by default (two systems a block at
  // n = 1024).
  form.stream_threads = Tuned().min_threads > 0 ? min_threads : std::max(min_threads, 128);
  return form;
}

// The shape of Q blocks a system, M rows a thread and at least `threads` threads a block for n,
// or Q == 1 (none) when that cannot hold n.
ClusterShape ChooseClusterShape(int64_t n, int M, int Q, int threads) {
  ClusterShape c;
  c.M = M;
  if (Q < 2 || Q > kMaxCluster) return c;
  const int Pb = NextPow2((n + int64_t(Q) * M - 1) / (int64_t(Q) * M));
  // Pb >= Q: a thread's K = 2Q reduced rows lie in one block; at most 256 threads a block.
  if (Pb < Q || Pb > 256) return c;
  c.Q = Q;
  c.Pb = Pb;
  c.S = std::max(1, std::min(threads, 256) / Pb);
  return c;
}

// The cluster shape for n, or Q == 1 (none): the tuning's, or by shape where the cluster kernel
// was the fastest: interleaved 512 < n <= 2048 and flat float32 4096 < n <= 8192, 2 blocks of
// 256 threads x 16 rows; elsewhere the one-block kernels, the streamed rows or the two-pass path
// were faster. Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", ClusterShapeFor.
ClusterShape ClusterShapeFor(int64_t n, Layout layout, bool float32) {
  if (Tuned().cluster == 1 || !ClustersAvailable() || n <= 1) return ClusterShape{};
  if (Tuned().cluster >= 2)
    return ChooseClusterShape(n, Tuned().chunk == 8 ? 8 : 16, Tuned().cluster,
                              Tuned().min_threads > 0 ? Tuned().min_threads : 256);
  const bool inter = layout == Layout::kInterleaved;
  // Flat float64 over 4096: slower than the two-pass path but at n = 8192, where the streamed
  // rows (RowsStreamByShape) are faster still.
  const bool wins = inter ? n > 512 && n <= 2048 : float32 && n > 4096 && n <= 8192;
  if (!wins) return ClusterShape{};
  return ChooseClusterShape(n, 16, 2, 256);
}

// Whether `auto` runs the two-pass path although one block holds n: interleaved n > 2048. The
// one-block kernel runs one system a block there, so a warp's interleaved loads use a quarter of
// each sector, where the level kernels' are coalesced across systems. Evidence:
// docs/kernels/tridiagonal.md, "Tuning evidence", TwoPassByShape.
bool TwoPassByShape(int64_t n, Layout layout) {
  return Tuned().two_pass == 0 && layout == Layout::kInterleaved && n > 2048;
}

// Whether `auto` solves flat float64 systems by the block sweeps' streamed kernel
// (SolveRowsStreamed: persistent clusters copying their next system while they solve this one):
// the tuning's, else for n over 4096 that fill at least 60% of the cluster's rows (70% for
// clusters of 8, n over 8192): below that, the idle rows of the cluster cost more than the two-pass
// path's second read. Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", RowsStreamByShape.
bool RowsStreamByShape(int64_t n, Layout layout, bool float32) {
  if (float32 || layout != Layout::kFlat || Tuned().rows_stream < 0) return false;
  const int64_t cap = RowsStreamCapacity(n);
  if (cap == 0 || Tuned().rows_stream > 0) return cap > 0;
  return n > 4096 && double(n) >= (n > 8192 ? 0.7 : 0.6) * double(cap);
}

}  // namespace

template <typename T>
absl::StatusOr<TridiagonalKernel> SolvePartitioned(const TridiagonalProblem<T>& p, T* x,
                                                   uint8_t* flags, Pool& pool,
                                                   cudaStream_t stream, bool top,
                                                   Scratch* arena) {
  const bool forced_two_pass = top && Tuned().two_pass == 1 && p.n > 2;
  if (top && !forced_two_pass && WindowsByShape(p.n, p.layout, sizeof(T) == 4)) {
    absl::StatusOr<bool> ran = SolveWindowed(p, x, flags, PlanWindowsFor<T>(p.n), stream);
    if (!ran.ok()) return ran.status();
    if (*ran) return TridiagonalKernel::kPartitionedWindow;
  }
  if constexpr (std::is_same_v<T, double>) {
    if (top && !forced_two_pass && RowsStreamByShape(p.n, p.layout, false)) {
      absl::StatusOr<bool> ran = SolveRowsStreamed(p, x, flags, pool, stream);
      if (!ran.ok()) return ran.status();
      if (*ran) return TridiagonalKernel::kPartitionedClusterStream;
    }
  }
  if (!forced_two_pass) {
    if (StreamsInterleavedByShape(p.n, p.batch, p.layout, sizeof(T) == 4)) {
      absl::StatusOr<bool> ran = LaunchStreamInterleaved16(p, x, flags, 256, stream);
      if (!ran.ok()) return ran.status();
      if (*ran) return TridiagonalKernel::kPartitionedStream;
    }
    if (const ClusterShape c = ClusterShapeFor(p.n, p.layout, sizeof(T) == 4); c.Q > 1) {
      if (auto st = LaunchCluster(p, x, flags, c, stream); !st.ok()) return st;
      return TridiagonalKernel::kPartitionedCluster;
    }
    if (FitsOnChip<T>(p.n) && !(top && TwoPassByShape(p.n, p.layout)))
      return LaunchOnChip(p, x, flags, OnChipFormFor(p), stream);
  }
  absl::Status st = SolveTwoPass(p, x, flags, pool, stream, arena,
                                 Tuned().level_chunk == 8 ? 8 : 16, FlatDirect());
  if (!st.ok()) return st;
  return TridiagonalKernel::kPartitioned;
}

template absl::StatusOr<TridiagonalKernel> SolvePartitioned(const TridiagonalProblem<double>&,
    double*, uint8_t*, Pool&, cudaStream_t, bool, Scratch*);
template absl::StatusOr<TridiagonalKernel> SolvePartitioned(const TridiagonalProblem<float>&,
    float*, uint8_t*, Pool&, cudaStream_t, bool, Scratch*);

}  // namespace tridiagonal

using namespace tridiagonal;  // this file's helpers above

// Whether `auto` runs thomas-window: the tuning's, else by shape (measured on the H100 against
// what `auto` ran before it; see ThomasWindowApplies for where it can run at all).
bool ThomasWindowByShape(int64_t n, int64_t batch, Layout layout, bool float32) {
  if (Tuned().thomas_window < 0 || !ThomasWindowApplies(n, batch, layout, float32))
    return false;
  if (Tuned().thomas_window > 0) return true;
  // Interleaved batches of 16 or more: n > 512 (float32 from 512); flat (and one system): float64 n
  // > 4096 with 16 systems or more, and one system of 2^24 or more, whose chain of windows fills
  // the GPU (below it the chain has fewer warps, each as slow). Evidence:
  // docs/kernels/tridiagonal.md, "Tuning evidence", ThomasWindowByShape.
  if (layout == Layout::kFlat || batch == 1)
    return !float32 && ((n > 4096 && batch >= 16) || (batch == 1 && n >= (int64_t(1) << 24)));
  return (float32 ? n >= 512 : n > 512) && batch >= 16;
}

const char* KernelName(TridiagonalKernel k) {
  switch (k) {
    case TridiagonalKernel::kPartitioned: return "partitioned";
    case TridiagonalKernel::kPartitionedCluster: return "partitioned-cluster";
    case TridiagonalKernel::kPartitionedStream: return "partitioned-stream";
    case TridiagonalKernel::kPartitionedClusterStream: return "partitioned-cluster-stream";
    case TridiagonalKernel::kPartitionedWindow: return "partitioned-window";
    case TridiagonalKernel::kThomasWindow: return "thomas-window";
    case TridiagonalKernel::kThomas: return "thomas";
    case TridiagonalKernel::kPcr: return "pcr";
    case TridiagonalKernel::kPivoting: return "pivoting";
  }
  return "?";
}

TridiagonalKernel ChooseTridiagonalKernel(TridiagonalMethod m, int64_t n, int64_t batch,
                                          Layout layout, bool float32) {
  if (batch == 1) layout = Layout::kFlat;  // as SolveTridiagonalDevice runs it
  const bool one_block =
      (float32 ? FitsOnChip<float>(n) : FitsOnChip<double>(n)) &&
      !TwoPassByShape(n, layout) && Tuned().two_pass != 1;
  const TridiagonalKernel partitioned =
      WindowsByShape(n, layout, float32) && Tuned().two_pass != 1
          ? TridiagonalKernel::kPartitionedWindow
      : RowsStreamByShape(n, layout, float32) && Tuned().two_pass != 1
          ? TridiagonalKernel::kPartitionedClusterStream
      : StreamsInterleavedByShape(n, batch, layout, float32) && Tuned().two_pass != 1
          ? TridiagonalKernel::kPartitionedStream
      : ClusterShapeFor(n, layout, float32).Q > 1 && Tuned().two_pass != 1
          ? TridiagonalKernel::kPartitionedCluster
      : one_block && (Tuned().stream > 0 || StreamsByShape(n, layout, float32))
          ? TridiagonalKernel::kPartitionedStream
          : TridiagonalKernel::kPartitioned;
  if (m == TridiagonalMethod::kAuto && ThomasWindowByShape(n, batch, layout, float32))
    return TridiagonalKernel::kThomasWindow;
  switch (m) {
    case TridiagonalMethod::kThomas: return TridiagonalKernel::kThomas;
    case TridiagonalMethod::kPivoting: return TridiagonalKernel::kPivoting;
    case TridiagonalMethod::kPcr: return n <= 1024 ? TridiagonalKernel::kPcr : partitioned;
    default: return partitioned;
  }
}

template <typename T>
absl::StatusOr<TridiagonalKernel> SolveTridiagonalDevice(const TridiagonalProblem<T>& p_in,
                                                         TridiagonalMethod method, T* x,
                                                         uint8_t* flags, Pool& pool,
                                                         cudaStream_t stream,
                                                         LaterAnswer* later,
                                                         const PivotResolve* resolve) {
  // One system is laid out the same way in both layouts (k * 1 + 0 = 0 * n + k): solve it as
  // flat, whose kernels read a system's rows coalesced.
  TridiagonalProblem<T> p = p_in;
  if (p.batch == 1) p.layout = Layout::kFlat;
  // Certified (auto, and pivoting given `resolve`): the fast kernel auto chooses, then the
  // pivoting sweep over every system it flagged, a vanished pivot or a row not diagonally
  // dominant (flags.h): queued after the kernel, so nothing waits for it; a later answer that
  // solves again resets the count and queues it again. pivoting without `resolve`: the sweep
  // over every system (the benchmark's `pivoting sweep`).
  const bool certified = method == TridiagonalMethod::kAuto ||
                         (method == TridiagonalMethod::kPivoting && resolve != nullptr);
  if (certified) method = TridiagonalMethod::kAuto;
  else resolve = nullptr;
  const TridiagonalKernel k =
      ChooseTridiagonalKernel(method, p.n, p.batch, p.layout, sizeof(T) == 4);
  // Few or long systems go to the split first (where its scratch was provided for them: a piece
  // of a pipelined batch may take it where the whole batch did not), then the sweep takes what
  // it left flagged, unless the caller solves that on the host.
  auto pivot_flagged = [p, x, flags, stream, resolve]() -> absl::Status {
    if (resolve == nullptr) return absl::OkStatus();
    if (resolve->split_bytes > 0 && PivotingSplitByShape(p.n, p.batch, p.layout) &&
        PivotingSplitScratchBytes(p.n, p.batch, sizeof(T) == 4) <= resolve->split_bytes) {
      const SplitAny* any = resolve->split_any.host != nullptr ? &resolve->split_any : nullptr;
      if (auto st = LaunchPivotingSplit(p, x, flags, resolve->scratch, stream,
                                        resolve->split_mapped, any);
          !st.ok())
        return st;
      if (any != nullptr && *any->host == 0) return absl::OkStatus();  // nothing flagged
    }
    if (!resolve->sweep) return absl::OkStatus();
    return LaunchPivoting(p, x, flags, resolve->scratch, stream, true, resolve->mapped);
  };
  switch (k) {
    case TridiagonalKernel::kThomasWindow: {
      ThomasWindowRest windows;
      auto ran = SolveThomasWindowed(p, x, flags, stream, Tuned().thomas_windows,
                                     Tuned().thomas_halo, Tuned().thomas_stages,
                                     Tuned().thomas_mirror, &windows);
      if (!ran.ok()) return ran.status();
      const bool pending = static_cast<bool>(windows);
      // The windows' answer (at once, or at the caller's wait); where they failed, or did not
      // apply, the exact path.
      LaterAnswer::Rest rest = [windows = std::move(windows), solved = *ran, p, x, flags, &pool,
                                stream](bool* again) mutable
          -> absl::StatusOr<TridiagonalKernel> {
        if (windows) {
          absl::StatusOr<bool> answered = windows(again);
          if (!answered.ok()) return answered.status();
          solved = *answered;
        }
        absl::StatusOr<TridiagonalKernel> kernel = TridiagonalKernel::kThomasWindow;
        if (!solved) {
          kernel = SolvePartitioned(p, x, flags, pool, stream);
          if (kernel.ok()) *again = true;
        }
        return kernel;
      };
      if (later != nullptr && pending) {
        if (auto st = pivot_flagged(); !st.ok()) return st;
        *later = LaterAnswer([rest = std::move(rest), pivot_flagged, resolve](
                                 bool* again) mutable -> absl::StatusOr<TridiagonalKernel> {
          auto kernel = rest(again);
          if (kernel.ok() && *again && resolve != nullptr) {
            *resolve->host = 0;  // (the stream was waited for: the first count is done)
            if (resolve->split_host != nullptr) *resolve->split_host = 0;
            if (auto st = pivot_flagged(); !st.ok()) return st;
          }
          return kernel;
        });
        return k;
      }
      bool again = false;
      auto kernel = rest(&again);
      if (kernel.ok())
        if (auto st = pivot_flagged(); !st.ok()) return st;
      return kernel;
    }
    case TridiagonalKernel::kPartitioned:
    case TridiagonalKernel::kPartitionedCluster:
    case TridiagonalKernel::kPartitionedStream:
    case TridiagonalKernel::kPartitionedClusterStream:
    case TridiagonalKernel::kPartitionedWindow: {
      auto ran = SolvePartitioned(p, x, flags, pool, stream);
      if (!ran.ok()) return ran.status();
      if (auto st = pivot_flagged(); !st.ok()) return st;
      return *ran;
    }
    case TridiagonalKernel::kThomas:
      if (auto st = LaunchThomas(p, x, flags, pool, stream); !st.ok()) return st;
      break;
    case TridiagonalKernel::kPcr:
      if (auto st = LaunchPcr(p, x, flags, stream); !st.ok()) return st;
      break;
    case TridiagonalKernel::kPivoting:
      if (auto st = SolvePivotingDevice(p, x, flags, pool, stream); !st.ok()) return st;
      break;
  }
  return k;
}

// Variable-size batches (variable.cu): auto and partitioned run the variable kernel, whose
// form is theirs; thomas, pcr and pivoting are answered by the CPU reference on the host.
bool VariableOnDevice(TridiagonalMethod method) {
  return method == TridiagonalMethod::kAuto || method == TridiagonalMethod::kPartitioned;
}

absl::StatusOr<std::string> LaterAnswer::FinishNamed(bool* again) {
  if (named_) {
    bool a = false;
    NamedRest rest = std::move(named_);
    named_ = nullptr;
    auto name = rest(&a);
    if (again != nullptr) *again = a;
    return name;
  }
  auto k = Finish(again);
  if (!k.ok()) return k.status();
  return std::string(KernelName(*k));
}

bool BlockDiagonalByShape(int64_t unknowns) {
  const int knob = tridiagonal::Tuned().block_diagonal;
  return knob > 0 || (knob == 0 && unknowns >= kBlockDiagonalUnknowns);
}

template absl::StatusOr<TridiagonalKernel> SolveTridiagonalDevice(
    const TridiagonalProblem<double>&, TridiagonalMethod, double*, uint8_t*, Pool&, cudaStream_t,
    LaterAnswer*, const PivotResolve*);
template absl::StatusOr<TridiagonalKernel> SolveTridiagonalDevice(
    const TridiagonalProblem<float>&, TridiagonalMethod, float*, uint8_t*, Pool&, cudaStream_t,
    LaterAnswer*, const PivotResolve*);

}  // namespace trisolve::cuda
