// The CPU reference for batched tridiagonal systems
// (kernels/cpu/tridiagonal.cc): the solvers the CPU backend runs, the GPU tests compare with and
// the CUDA backend falls back on. Not part of the public API (trisolve/tridiagonal.h); reached
// through the trisolve_reference target.
#pragma once

#include "trisolve/tridiagonal.h"

namespace trisolve {

namespace cpu {
// The CPU reference: multithreaded over the systems of the batch.
template <typename T>
SolveInfo SolveTridiagonal(const TridiagonalProblem<T>& p, TridiagonalMethod method,
                           TridiagonalOutput<T> out);
// One system, in the seed's forms (used by the batch solver and by other families).
// x may alias nothing; work needs n values. Returns false when a pivot vanishes.
template <typename T>
bool ThomasStrided(int64_t n, int64_t stride, const T* a, const T* b, const T* c,
                   const T* d, T* x, T* work);
// Partitioned (chunks of `chunk` rows, chunk >= 2); work needs 7 * n + 16 values.
template <typename T>
bool PartitionedStrided(int64_t n, int64_t stride, int chunk, const T* a, const T* b,
                        const T* c, const T* d, T* x, T* work);
template <typename T>
bool PcrStrided(int64_t n, int64_t stride, const T* a, const T* b, const T* c, const T* d,
                T* x, T* work);  // work needs 8 * n values
// Partial pivoting (dgtsv); work needs 3 * n values. False only where a pivot is exactly zero
// or not finite after pivoting (the matrix is singular to working precision) or x overflows.
template <typename T>
bool PivotingStrided(int64_t n, int64_t stride, const T* a, const T* b, const T* c,
                     const T* d, T* x, T* work);
// One large system by partial pivoting on every core: about `parts` parts
// (SplitPivotingLayout), each part's interior eliminated once with dgtsv's interchanges for
// its right-hand side and its two spikes (the columns coupling it to the interfaces around
// it), a tridiagonal system of one interface row a part solved by the sweep, then x = y minus
// the spikes times the interfaces' values. The answer is kept only where its backward error
// (residual in long double) is at most kSplitPivotingTolerance eps, after up to
// kSplitPivotingRefineSteps steps of iterative refinement, and every part's block factored;
// otherwise, and where the parts would be under 3 rows, the serial sweep answers (split =
// false). ok as PivotingStrided's. Memory: the spikes, 2 n values (3 n with refinement), and
// 5 values a row of one part a thread.
struct SplitPivoting {
  bool ok = false;
  bool split = false;
  int64_t parts = 0;
  double backward_error = 0;
  int refinements = 0;         // refinement steps taken
  int64_t factorizations = 0;  // blocks factored, refinement included (tests read it)
};
constexpr double kSplitPivotingTolerance = 8;
constexpr int kSplitPivotingRefineSteps = 2;
// From 2 threads: on the H100 host's CPU, 2 threads split 2^16 rows or more 2.0-3.4x faster than
// the sweep (tests/bench/results/pivoting-split-cpu-h100host-2026-11-28-pivsplit2).
constexpr int kSplitPivotingMinThreads = 2;
constexpr int64_t kSplitPivotingMinRows = int64_t(1) << 16;
template <typename T>
SplitPivoting PivotingSplit(int64_t n, int64_t stride, const T* a, const T* b, const T* c,
                            const T* d, T* x, int64_t parts);
// The parts PivotingSplit makes of n rows asked for `parts`: rows a part (odd) for all but the
// last, which takes the rest (even where n is: every block of an even length); parts = 0
// where the parts would be under 3 rows.
struct SplitLayout {
  int64_t parts = 0;
  int64_t rows = 0;
};
SplitLayout SplitPivotingLayout(int64_t n, int64_t parts);
// The parts of the GPU's split (pivoting_split.cu), whose parts are short and many: `rows`
// rows a part (odd: interiors of even length), the last part holding the rest (rows to
// 3 rows - 1, an even count), at least 3 parts; parts = 0 where n has too few rows for that.
SplitLayout SplitPivotingLayoutOfRows(int64_t n, int64_t rows);
// The parts for PivotingSplit on this process's threads, or 0 where the serial sweep is the
// faster (fewer than kSplitPivotingMinThreads threads, or n under kSplitPivotingMinRows).
template <typename T>
int64_t SplitPivotingParts(int64_t n);
// The parts SplitPivotingParts asks for on `threads` threads, without its thresholds (the
// benchmark's, to time the split where the thresholds would not choose it).
int64_t SplitPivotingPartsFor(int64_t n, int threads);
// Solves again, by partial pivoting from the original arrays, every system of `out` whose
// status is kSingular (a fast path's pivot vanished), patching x and status in place: a
// nonsingular system never stays SINGULAR. Appends " + pivoting (k systems)" to info->method
// when k > 0 (info may be null). Returns k. The CUDA backend calls it after auto's device
// solve, on the host arrays.
template <typename T>
int64_t ResolveSingularWithPivoting(const TridiagonalProblem<T>& p, TridiagonalOutput<T> out,
                                    SolveInfo* info);
}  // namespace cpu

}  // namespace trisolve
