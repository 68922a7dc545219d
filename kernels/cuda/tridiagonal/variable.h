// Batches of tridiagonal systems of different sizes on the device (TridiagonalProblem::offsets):
// the systems' rows concatenated, flat; the same kernels read the unified-vector layout (a
// uniform unified batch comes here with offsets s * n). Systems of up to kVariableBlockRows rows
// are sorted by size class on the host (P = 2^lp threads of 16 rows a system). The classes from
// stream_from up are solved by a streamed kernel (persistent blocks of P threads copying the
// next system into shared memory while they solve the current one; one launch a class), the
// others by one launch a block size whose blocks each take the systems of one class
// (partitioned.cuh's one-block form); longer systems are solved one by one by the uniform path
// (SolveTridiagonalDevice).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/memory_pool.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve::cuda {

constexpr int kVariableThreads = 256, kVariableChunk = 16;
constexpr int64_t kVariableBlockRows = int64_t(kVariableThreads) * kVariableChunk;
// Threads a block for the class of P = 2^lp threads a system: 64 up to P = 64 (several blocks
// an SM, whose loads, reductions and stores overlap: blocks of 256 took one an SM and ran the
// batch at 40-43% of the copy rate on the H100), else P.
constexpr int VariableBlockThreads(int lp) { return lp <= 6 ? 64 : 1 << lp; }

// What the kernel reads, built on the host from a batch's offsets and copied to the device as
// one buffer (`meta`): the offsets (int64, batch + 1), the systems of at most
// kVariableBlockRows rows ordered by size class, largest first (int32), and a block table
// (two int32 a block: its first entry in that order, and log2 P << 16 | its systems), the
// blocks of 256 threads first, then 128, then 64.
// Classes of P = 2^lp threads a system from which the streamed kernel runs (persistent blocks
// of kVariableThreads copying their next systems in while they solve): the classes of more
// than 16 * 2^(lp - 1) rows. Evidence: tests/bench/NOTES.md, "Variable-size batches" (vb3-vb7:
// thresholds 5 to 8 within 2% of each other, 7 the best in float64 and float32).
constexpr int kVariableStreamFrom = 7;

struct VariablePlan {
  int64_t batch = 0;
  // Classes lp >= stream_from are solved by the streamed kernel, the others by the block table.
  int stream_from = kVariableStreamFrom;
  // Each class's systems in `order`: the first entry and the count (classes 0 .. 8).
  int64_t class_first[9] = {}, class_count[9] = {};
  int64_t blocks = 0;
  // Three launches (blocks of 256, 128 and 64 threads): their first entry and blocks.
  int64_t launch_first[3] = {0, 0, 0}, launch_blocks[3] = {0, 0, 0};
  std::vector<int64_t> long_systems;  // over kVariableBlockRows rows, solved one at a time
  std::vector<std::byte> meta;
  size_t order_offset = 0, table_offset = 0;  // in meta, bytes
};
VariablePlan PlanVariable(const int64_t* offsets, int64_t batch,
                          int stream_from = kVariableStreamFrom);

// Which methods the device runs for a variable-size batch (dispatch.cc): the others are solved
// by the CPU reference on the host.
bool VariableOnDevice(TridiagonalMethod method);
// Whether a flat variable-size batch of these many unknowns is first solved as one
// block-diagonal system (kBlockDiagonalUnknowns; the tuning's block_diagonal).
bool BlockDiagonalByShape(int64_t unknowns);

// A flat batch of at least this many unknowns is first solved as ONE tridiagonal system, its
// systems' rows one after the other with the couplings between them zero (each system's a[0]
// and c[n-1], which no system reads): a block-diagonal matrix, whose blocks the one-system
// kernels (thomas-window, partitioned-window) solve independently at their bandwidth, whatever
// the sizes. That answer stands where the one system's flags are clear (every row certified
// dominant under auto, no pivot vanished); otherwise every system is solved again by the
// per-system kernels below, which flag each system on its own. From 2^22, the smallest size
// it was measured faster at: docs/performance.md, "Variable-size batches and the unified
// layout"; tests/bench/NOTES.md, vb9.
constexpr int64_t kBlockDiagonalUnknowns = int64_t{1} << 22;

// p: device arrays a, b, c, d (p.offsets the host's; p.unified(): a = abc, b = abc + 1,
// c = abc + 2, coef_stride 3, the unified-vector layout read in place); meta: plan.meta on the device (8-byte
// aligned); x and flags (batch bytes, zeroed) on the device. Queues the kernel on `stream`;
// long systems (plan.long_systems) are solved by SolveTridiagonalDevice(method), which may
// wait. Returns the reported kernel name.
// own_couplings: a and c are this solve's own copies, so each system's a[0] and c[n-1] may be
// set to zero for the block-diagonal form (kBlockDiagonalUnknowns); false (a client's own
// device memory, read in place): never that form. That form learns whether its answer stands
// only once its kernel is done: given `later`, the call returns once it is queued and *later
// answers after the caller's wait (LaterAnswer::FinishNamed: the per-system kernels' name
// where they solved the batch again, *again then set); without, the call waits.
template <typename T>
absl::StatusOr<std::string> SolveVariableDevice(const TridiagonalProblem<T>& p,
                                                const VariablePlan& plan, const std::byte* meta,
                                                TridiagonalMethod method, T* x, uint8_t* flags,
                                                Pool& pool, cudaStream_t stream,
                                                bool own_couplings = false,
                                                LaterAnswer* later = nullptr);

}  // namespace trisolve::cuda
