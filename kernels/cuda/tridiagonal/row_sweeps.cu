// The row kernels' launches and their form (row_sweeps.h): the fused sweeps for the block
// iterations and SolveRowsStreamed for flat tridiagonal batches.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/check.h"
#include "runtime/launch.h"
#include "tridiagonal/row_stream_kernel.cuh"
#include "tridiagonal/row_sweeps.h"
#include "tridiagonal/tridiagonal.h"
#include "tuning_table.h"

namespace trisolve::cuda {
namespace {

// The sweeps' tuning in the table in use (cuda/tuning_table.h).
const SweepTuning& Sweeps() { return ActiveTuning().sweeps; }
constexpr int kMaxSweepCluster = 4;  // blocks a row at most: rows of 16384

// Whether the fused sweeps stage rows through shared memory: the tuning's, else for rows over
// 2048 at 16 rows a thread, where a thread's 16 rows straight from global memory came too late.
// Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", SweepStaged.
bool SweepStaged(int64_t M, int chunk) {
  return Sweeps().staged != 0 ? Sweeps().staged > 0 : M > 2048 && chunk == 16;
}

template <int CH, int Q, bool kStaged, typename T>
absl::Status LaunchFusedSweeps(SweepArgs<T> g, cudaStream_t stream) {
  int P = Q > 1 ? kClusterTwoLevelMin / Q : 1;  // the last blocks' rows past M: identity rows
  while (int64_t(P) * CH * Q < g.M) P *= 2;
  const size_t smem = sizeof(T) * size_t(SweepSharedValues(P, CH, Q, kStaged));
  // float32 reads the PCR neighbours lazily, float64 eagerly (as the tridiagonal kernel, t6b).
  auto kernel = FusedSweepKernel<CH, Q, T, sizeof(T) == 4, kStaged>;
  if (auto st = AllowSharedBytes(kernel, smem); !st.ok()) return st;
  const int64_t total = int64_t(g.sweeps) * g.N;
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.done, 0, sizeof(int) * size_t(g.N), stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.next, 0, sizeof(unsigned), stream));
  LaunchConfig launch(total * Q, P, smem, stream, Q);
  return CudaStatus(cudaLaunchKernelEx(&launch.cfg, kernel, g), "FusedSweepKernel launch");
}

template <int Q, int P, int kQB, typename T, bool kBulk, bool kWin = false>
absl::Status LaunchFusedStreamKernel(SweepArgs<T> g, const StreamMaps& maps,
                                     cudaStream_t stream) {
  constexpr int CH = 16;
  using L = StreamLayout<CH, Q, kBulk, P>;
  const size_t smem = sizeof(T) * size_t(L::kTotal) + L::kAlignSlack;
  auto kernel = FusedSweepStreamKernel<CH, Q, kQB, T, sizeof(T) == 4, kBulk, P, kWin>;
  LaunchConfig launch(0, P, smem, stream, Q);
  // The shared-memory attribute and the blocks (clusters) that run at once: asked once a
  // kernel, not at every launch (a solve to a tolerance launches one sweep at a time). One
  // device a process, as ClustersAvailable assumes.
  static PerDevice asked;  // (once a device: the attribute is the current device's)
  const absl::StatusOr<int64_t> groups = asked.Get([&] { return ResidentGroups(kernel, launch); });
  if (!groups.ok()) return groups.status();
  if (!g.uncoupled)
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(g.done, 0, sizeof(int) * size_t(g.N), stream));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.next, 0, sizeof(unsigned), stream));
  if (*groups < 1) return absl::ResourceExhaustedError("the streamed sweep kernel cannot run");
  const int64_t tasks = int64_t(g.sweeps) * g.N * std::max<int64_t>(g.win.per_system, 1);
  launch.cfg.gridDim = dim3(unsigned(std::min<int64_t>(*groups, tasks) * Q));
  return CudaStatus(cudaLaunchKernelEx(&launch.cfg, kernel, g, maps),
                    "FusedSweepStreamKernel launch");
}

// The streamed kernel's tensor maps (StreamMaps): aC, cC, bC and F as N M / 16 rows of 16
// float64 values, boxes of 16 x `box_rows` (P: a block's part of a row; the windowed form's
// kWinBoxRows), 128-byte swizzle. False where they cannot be made (the caller then copies by
// cp.async).
bool EncodeStreamMaps(const SweepArgs<double>& g, int box_rows, StreamMaps& maps) {
  const auto encode = TensorMapEncoder();
  if (!encode || g.M % 16 != 0 || !ClustersAvailable()) return false;  // sm_90+
  const double* arrays[4] = {g.aC, g.cC, g.bC, g.f};
  for (int a = 0; a < 4; ++a) {
    if (reinterpret_cast<uintptr_t>(arrays[a]) % 16 != 0) return false;
    const cuuint64_t dims[2] = {16, cuuint64_t(g.N * g.M / 16)};
    const cuuint64_t strides[1] = {16 * sizeof(double)};
    const cuuint32_t box[2] = {16, cuuint32_t(box_rows)};
    const cuuint32_t elem[2] = {1, 1};
    if (encode(&maps.m[a], CU_TENSOR_MAP_DATA_TYPE_FLOAT64, 2, const_cast<double*>(arrays[a]),
               dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// The streamed form: as many persistent blocks (clusters) of P threads as run at once; float64
// rows of a multiple of 16 values by bulk tensor copies (unless the tuning says bulk = -1). The
// neighbours' loads 8 rows a thread at a time with the bulk copies (unless the tuning says
// group = 4), else 4: with the copies' registers free, 8 in flight hide more latency; all 16 at
// once spill. Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", LaunchFusedStream.
template <int Q, int P, typename T>
absl::Status LaunchFusedStream(SweepArgs<T> g, cudaStream_t stream) {
  StreamMaps maps{};
  if constexpr (Q == 1 && P == kStreamThreads) {  // the windowed form
    if (g.win.per_system > 1) {
      if constexpr (std::is_same_v<T, double>) {
        if (Sweeps().bulk >= 0 && EncodeStreamMaps(g, kWinBoxRows, maps))
          return LaunchFusedStreamKernel<Q, P, 8, T, true, true>(g, maps, stream);
      }
      return LaunchFusedStreamKernel<Q, P, 4, T, false, true>(g, maps, stream);
    }
  }
  if constexpr (std::is_same_v<T, double>) {
    if (Sweeps().bulk >= 0 && EncodeStreamMaps(g, P, maps))
      return g.uncoupled            ? LaunchFusedStreamKernel<Q, P, 0, T, true>(g, maps, stream)
             : Sweeps().group == 4 ? LaunchFusedStreamKernel<Q, P, 4, T, true>(g, maps, stream)
                                  : LaunchFusedStreamKernel<Q, P, 8, T, true>(g, maps, stream);
  }
  if constexpr (std::is_same_v<T, double>) {
    if (g.uncoupled) return LaunchFusedStreamKernel<Q, P, 0, T, false>(g, maps, stream);
  }
  return LaunchFusedStreamKernel<Q, P, 4, T, false>(g, maps, stream);
}

template <typename T>
absl::Status LaunchStreamForm(const SweepForm& form, const SweepArgs<T>& g, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    if (form.threads == 128)
      return form.Q == 2   ? LaunchFusedStream<2, 128>(g, stream)
             : form.Q == 4 ? LaunchFusedStream<4, 128>(g, stream)
                           : LaunchFusedStream<8, 128>(g, stream);
  }
  return form.Q == 1   ? LaunchFusedStream<1, kStreamThreads>(g, stream)
         : form.Q == 2 ? LaunchFusedStream<2, kStreamThreads>(g, stream)
                       : LaunchFusedStream<4, kStreamThreads>(g, stream);
}

template <int CH, typename T>
absl::Status LaunchFusedForm(int Q, bool staged, const SweepArgs<T>& g, cudaStream_t stream) {
  switch (Q) {
    case 1:
      return staged ? LaunchFusedSweeps<CH, 1, true>(g, stream)
                    : LaunchFusedSweeps<CH, 1, false>(g, stream);
    case 2:
      return staged ? LaunchFusedSweeps<CH, 2, true>(g, stream)
                    : LaunchFusedSweeps<CH, 2, false>(g, stream);
    default:
      return staged ? LaunchFusedSweeps<CH, 4, true>(g, stream)
                    : LaunchFusedSweeps<CH, 4, false>(g, stream);
  }
}

}  // namespace

// The fused sweeps' form for rows of M: rows a thread (the tuning's, else 8, or 16 for rows over
// 2048; NOTES.md b5-b6), blocks a row (the tuning's, else the fewest that hold the row: 1, 2 or 4
// of 256 x 16, 2 to 8 of the streamed 128 x 16; more than 1 only on sm_90) and whether streamed
// (the tuning's, else float64 red-black and jacobi with 2048 < M <= 16384 and gauss-seidel with
// 4096 < M <= 16384, where copying the next row under this one's arithmetic won). chunk 0: no fused
// form holds the row. Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", SweepFormFor.
SweepForm SweepFormFor(int64_t M, bool float64, SweepKind kind) {
  // gauss-seidel keeps 8 rows a thread (512 threads) up to 4096 (NOTES.md t26).
  const bool gs = kind == SweepKind::kGaussSeidel;
  const int ch = Sweeps().chunk != 0 ? Sweeps().chunk : M > (gs ? 4096 : 2048) ? 16 : 8;
  const bool stream =
      ch == 16 && (Sweeps().stream != 0 ? Sweeps().stream > 0 : float64 && M > (gs ? 4096 : 2048));
  // Streamed blocks of 128 threads (two an SM, clusters of 2 to 8; float64 on sm_90): the
  // tuning's, else for rows over 4096, where two blocks an SM hide one another's waits.
  const bool small = Sweeps().stream_threads != 0 ? Sweeps().stream_threads == 128 : M > 4096;
  const int threads = stream && float64 && ClustersAvailable() && small ? 128
                      : stream                                          ? kStreamThreads
                                                                        : SweepMaxThreads(ch);
  const int64_t per_block = int64_t(ch) * threads;
  const int max_q = threads < kStreamThreads ? 2 * kMaxSweepCluster : kMaxSweepCluster;
  int Q = Sweeps().cluster;
  if (Q == 0 || (threads < kStreamThreads && Q == 1))
    for (Q = threads < kStreamThreads ? 2 : 1; Q < max_q && Q * per_block < M;) Q *= 2;
  Q = std::min(Q, max_q);  // a tuning's larger cluster: the largest this form has
  if (Q > 1 && !ClustersAvailable()) Q = 1;
  if (Q * per_block < M) return SweepForm{};
  return SweepForm{ch, Q, stream, threads};
}

template <typename T>
absl::Status LaunchRowSweeps(const SweepForm& form, const SweepArgs<T>& g, cudaStream_t stream) {
  const bool staged = SweepStaged(g.M, form.chunk);
  return form.stream        ? LaunchStreamForm(form, g, stream)
         : form.chunk == 16 ? LaunchFusedForm<16>(form.Q, staged, g, stream)
                            : LaunchFusedForm<8>(form.Q, staged, g, stream);
}
template absl::Status LaunchRowSweeps(const SweepForm&, const SweepArgs<double>&, cudaStream_t);
template absl::Status LaunchRowSweeps(const SweepForm&, const SweepArgs<float>&, cudaStream_t);

int64_t RowsStreamCapacity(int64_t n) {
  const SweepForm form = SweepFormFor(n, true, SweepKind::kJacobi);
  return form.stream ? int64_t(form.Q) * form.threads * form.chunk : 0;
}

absl::StatusOr<bool> SolveRowsStreamed(const TridiagonalProblem<double>& p, double* x,
                                       uint8_t* flags, Pool& pool, cudaStream_t stream) {
  if (p.layout != Layout::kFlat && p.batch > 1) return false;
  const SweepForm form = SweepFormFor(p.n, true, SweepKind::kJacobi);
  if (!form.stream || p.batch < 1 || p.batch > (int64_t{1} << 30)) return false;
  auto buf = pool.Get(16);  // the task counter
  if (!buf.ok()) return buf.status();
  bool vec = p.n % 2 == 0;
  for (const double* q : {p.a, p.b, p.c, p.d, static_cast<const double*>(x)})
    vec &= reinterpret_cast<uintptr_t>(q) % 16 == 0;
  // The sweep's arrays: aC the sub-diagonal, cC the diagonal, bC the super-diagonal (as the
  // fused kernels read them, LoadChunkDirect(aC, cC, bC, f)); system s is the colour-major row
  // Perm(i) of the task i that solves it, read and written there.
  SweepArgs<double> g{p.batch, p.n,     p.a,   p.b,     p.c, nullptr, nullptr, p.d, nullptr,
                      x,       nullptr, buf->as<unsigned>(), flags, nullptr, 0,       1,
                      SweepKind::kJacobi, vec};
  g.uncoupled = true;
  if (auto st = LaunchStreamForm(form, g, stream); !st.ok()) return st;
  // The counter goes back to the pool now: wait for the kernel first.
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return true;
}

std::vector<SweepPhaseTime> TakeSweepProfile() {
  std::vector<SweepPhaseTime> out;
#ifdef TRISOLVE_SWEEP_PROFILE
  unsigned long long h[kPhaseCount + 2];
  if (cudaMemcpyFromSymbol(h, g_sweep_profile, sizeof(h)) != cudaSuccess) return out;
  const unsigned long long zero[kPhaseCount + 2] = {};
  if (cudaMemcpyToSymbol(g_sweep_profile, zero, sizeof(zero)) != cudaSuccess) return out;
  const double tasks = h[kPhaseCount] > 0 ? double(h[kPhaseCount]) : 1.0;
  for (int k = 0; k < kPhaseCount; ++k) out.push_back({kSweepPhaseNames[k], double(h[k]) / tasks});
  out.push_back({"blocks", double(h[kPhaseCount + 1])});
#endif
  return out;
}

}  // namespace trisolve::cuda
