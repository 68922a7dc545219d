// The tridiagonal module's launch choices: plain structs of knobs, 0 meaning "by shape" (the
// shapes' rules and their evidence: dispatch.cc, row_sweeps.cu and docs/kernels/tridiagonal.md).
// They are read through the table in use (cuda/tuning_table.h), never through globals.
#pragma once

namespace trisolve::cuda {

// Launch parameters of the partitioned kernels. The defaults were picked by the benchmark's --tune
// sweep (docs/kernels/tridiagonal.md, "Tuning evidence"); tests and the benchmark set others.
struct PartitionedTuning {
  int chunk = 0;        // rows per thread: 2, 4, 8 or 16; 0: by shape (8, or 16 where the
                        // sweep measured it faster: flat n > 256 (float64) / n > 32 (float32);
                        // interleaved float64 n > 2048 and 128 < n <= 512, float32 n > 64)
  int min_threads = 0;  // threads per block at least; 0: 128, or for interleaved n > 128 512
                        // (256 in float32 with 16 rows a thread), flat n >= 64 64 (float32:
                        // n >= 128)
  int level_chunk = 16;  // rows a thread of the two-pass path (n > 4096): 8 or 16 (16: fewer
                         // levels; NOTES.md t7)
  int flat_direct = 0;   // flat one-pass and two-pass level kernels: 1 (and 0, the default)
                         // load a thread's rows straight from global memory, -1 stage them
                         // through a shared-memory tile (the earlier form, kept to compare;
                         // NOTES.md t9, t18)
  int cluster = 0;       // blocks a system of the cluster one-pass kernel (sm_90): 0 by shape,
                         // 1 never, 2, 4 or 8 where that holds n (chunk 8 or 16 rows a thread,
                         // min_threads threads a block)
  int stream = 0;        // the streamed one-pass kernel (flat: n a multiple of 16 bytes;
                         // interleaved: a group's row whole 16-byte words): 0 by shape (float64
                         // flat 64 <= n < 128 and 512 < n <= 4096, interleaved 128 < n <= 1024),
                         // 1 wherever it applies, -1 never
  int two_pass = 0;      // the two-pass path where one block holds n: 0 by shape (interleaved
                         // n > 2048), 1 always (benchmark), -1 never
  int rows_stream = 0;   // flat float64 systems by the block sweeps' streamed kernel (one
                         // system a task of persistent clusters, SolveRowsStreamed): 0 by
                         // shape (n > 4096 filling 60% of the cluster's rows, 70% over 8192),
                         // 1 wherever it takes n, -1 never
  int window = 0;        // flat systems by overlapping windows (trisolve/windows.h), falling
                         // back to the exact path where a window is not dominant enough: 0 by
                         // shape (n > 4096 but float64 7168 < n <= 8192), 1 wherever they
                         // apply (n > 4096), -1 never
  int window_halo = 0;   // rows a window reads past its core each side (a multiple of 128
                         // bytes, 16 / 32 rows): 0 for 256
  int thomas_window = 0;   // `auto` by thomas-window: 0 by shape
                           // (ThomasWindowByShape), 1 wherever it applies, -1 never
  int thomas_windows = 0;  // its windows a system: 0 enough to fill the GPU
  int thomas_halo = 0;     // rows its windows past a system's first sweep before their core:
                           // 0 for 32, then the measured one (up to 256) where a
                           // window's left end's bound needs more; else that halo alone
  int thomas_stages = 0;   // its copies in flight a warp: 0 for 2 (float32 also 1 or 4)
  int thomas_mirror = 0;   // its odd windows sweep backward (NOTES.md t39): 0 by layout
                           // (interleaved), 1 wherever they can (whole cores), -1 never
  int block_diagonal = 0;  // a flat variable-size batch (variable.h) solved as one system
                           // whose couplings between systems are zero: 0 by size (at least
                           // kBlockDiagonalUnknowns), 1 wherever it applies, -1 never
};

// The sweeps' launch choices (the benchmark compares them). fused = false: the two-kernel
// half-sweeps always. chunk: rows a thread of the fused kernel, 8 or 16; 0: 16 for rows over
// 2048 (gauss-seidel: over 4096), else 8. staged: 1 the fused kernel stages a row through shared
// memory, -1 loads it straight into registers; 0: staged for rows over 2048 at 16 rows a
// thread. cluster: blocks a row, 1, 2 or 4 (a
// thread-block cluster, sm_90); 0: the fewest that hold the row. stream (16 rows a thread
// only): 1 persistent blocks copy the next task's row into shared memory while they solve the
// current one, -1 a block a task; 0: streamed for red-black and jacobi, float64 rows of 2049 to
// 16384. bulk (streamed float64 rows of a multiple of 16 values): 0 the rows' copies by the copy
// engine's bulk tensor copies (sm_90), -1 by each thread's cp.async. stream_threads (streamed
// float64 on sm_90): 128 blocks of 128 threads, two an SM, in clusters of 2 to 8 blocks a row;
// 256 blocks of 256 threads, clusters of 1 to 4; 0: 128 for rows over 4096. group (streamed,
// bulk copies): the neighbours' loads 4 or 8 rows a thread at a time; 0: 8. window: 1 red-black
// and jacobi run the streamed form over overlapping windows of 4096 values of each row
// (trisolve/windows.h; a task a window) for any M over 4096, -1 never; 0: for float64 rows too
// long for the other fused forms (over 16384). Either way only where every row of the line
// systems has (|a| + |c|) / |b| under the limit of a halo of 256 (0.864 float64, 0.935
// float32), checked once a solve (not for a solve of one sweep, unless window is 1); else the
// two-kernel half-sweeps. window_halo: the rows each
// window reads past its core on each side, rounded up to a multiple of 16 (at most 1024), where
// the rows' ratios allow it (else no windows); 0: the least multiple of 16 they allow (64 for
// ratios up to 0.562 in float64, 256 up to 0.864). The method reported names the halo:
// "red-black+fused+windows(halo 64)".
struct SweepTuning {
  bool fused = true;
  int chunk = 0;
  int staged = 0;
  int cluster = 0;
  int stream = 0;
  int bulk = 0;
  int stream_threads = 0;
  int group = 0;
  int window = 0;
  int window_halo = 0;
};

}  // namespace trisolve::cuda
