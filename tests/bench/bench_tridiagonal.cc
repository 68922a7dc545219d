// Batched tridiagonal benchmark on the GPU: every trisolve kernel against cuSPARSE's
// gtsv2StridedBatch and gtsvInterleavedBatch (algorithms 0 and 1), on the same data, at a fixed
// number of unknowns (2^24 by default), float64 and float32. Effective bandwidth = the bytes
// that must move (a, b, c, d read once, x written once) / time, as a fraction of a large
// device-to-device copy measured in the same run. Median of `reps` timed runs (CUDA events)
// after a warm-up. Prints a table; --csv FILE writes the rows.
//
//   bench_tridiagonal [--unknowns 16777216] [--reps 15] [--csv FILE] [--sizes 32,1024,...]
//                     [--tune]   (sweeps the partitioned kernel's launch parameters instead)
//                     [--auto-only] [--wait] [--thomas-window|-windows|-stages|-halo|-mirror K]
//                     [--window 1|-1] [--window-halo ROWS]   (the tuning `auto` runs under)
//                     [--pivot-split] (only the rows of few, long systems not diagonally
//                                     dominant: pivoting-split, the sweep, the host;
//                                     TRISOLVE_BENCH_PIVOT_SHAPES=1x16777216,.. other shapes,
//                                     TRISOLVE_BENCH_PIVOT_FLOAT32=1 float32 too)
//                     [--variable]   (only the variable-size rows: n uniform in 32 .. 4096,
//                                     float64, as the backend runs them and by the per-system
//                                     kernels, beside uniform batches of 2048 and 4096)
//   --variable's knobs, in the environment: TRISOLVE_BENCH_STREAM_FROM=9,7,.. (the mix once a
//   streamed-class threshold), TRISOLVE_BENCH_VARIABLE_RANGES=lo-hi,.. (other size ranges),
//   TRISOLVE_BENCH_VARIABLE_UNIFORM=n,.. (uniform batches through the variable kernel).
#include <cuda_runtime.h>
#include <cusparse.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "runtime/memory_pool.h"
#include "runtime/pinned_word.h"
#include "trisolve/reference/tridiagonal.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/tridiagonal.h"
#include "tridiagonal/variable.h"
#include "trisolve/reference/tridiagonal.h"
#include "tuning_table.h"

namespace {

bool g_auto_only = false;
bool g_wait = false;  // --wait: time `auto` waiting for its kernel's answer in the call

using trisolve::bench::TimeIt;

#define CS(x)                                                                      \
  do {                                                                             \
    cusparseStatus_t s_ = (x);                                                     \
    if (s_ != CUSPARSE_STATUS_SUCCESS) {                                           \
      std::fprintf(stderr, "%s:%d %s: cusparse status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)


struct Row {
  std::string dtype, layout, kernel;
  int64_t n, batch;
  double ms, gbs, frac;
  double err;  // max |x - x_ref| / max |x_ref| against trisolve partitioned (or "-1")
};

template <typename T>
struct Bench {
  int64_t N;  // total unknowns
  int reps;
  double copy_gbs;
  cusparseHandle_t sp;
  trisolve::cuda::Pool& pool;
  std::vector<Row>& rows;
  T *a0, *b0, *c0, *d0;  // pristine, flat layout
  T *ai, *bi, *ci, *di;  // pristine, interleaved
  T *a, *b, *c, *d, *x, *xref;
  uint8_t* flags;

  void Record(const char* layout, const char* kernel, int64_t n, double ms, const T* result,
              int64_t batch, bool interleaved_result) {
    const double bytes = 5.0 * sizeof(T) * N;
    double err = -1;
    if (result) {
      std::vector<T> h(N), r(N);
      CK(cudaMemcpy(h.data(), result, N * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(r.data(), xref, N * sizeof(T), cudaMemcpyDeviceToHost));
      double dm = 0, xm = 0;
      for (int64_t s = 0; s < batch; ++s)
        for (int64_t k = 0; k < n; ++k) {
          const T v = interleaved_result ? h[k * batch + s] : h[s * n + k];
          const T ref = r[s * n + k];
          dm = std::max(dm, std::abs(double(v) - double(ref)));
          xm = std::max(xm, std::abs(double(ref)));
        }
      err = dm / xm;
    }
    rows.push_back({sizeof(T) == 8 ? "float64" : "float32", layout, kernel, n, batch, ms,
                    bytes / ms / 1e6, bytes / ms / 1e6 / copy_gbs, err});
    const Row& w = rows.back();
    std::printf("%-8s %8lld %8lld %-12s %-26s %9.3f ms %7.0f GB/s %5.1f%% err %.1e\n",
                w.dtype.c_str(), (long long)n, (long long)batch, layout, kernel, ms, w.gbs,
                100 * w.frac, err);
    std::fflush(stdout);
  }

  void Run(int64_t n) {
    const int64_t batch = N / n;
    const size_t bytes = sizeof(T) * N;
    auto restore = [&](bool inter) {
      CK(cudaMemcpyAsync(a, inter ? ai : a0, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(b, inter ? bi : b0, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(c, inter ? ci : c0, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(d, inter ? di : d0, bytes, cudaMemcpyDeviceToDevice));
    };
    // Reference: trisolve partitioned on the flat data, exact (no windows: theirs is the error
    // the column reports).
    restore(false);
    {
      trisolve::cuda::TuningTable exact = trisolve::cuda::ActiveTuning();
      exact.tridiagonal.window = -1;
      const trisolve::cuda::UseTuning use_exact(&exact);
      trisolve::TridiagonalProblem<T> p{batch, n, trisolve::Layout::kFlat, a, b, c, d};
      auto k = trisolve::cuda::SolveTridiagonalDevice(p, trisolve::TridiagonalMethod::kPartitioned,
                                                      xref, flags, pool, nullptr);
      if (!k.ok()) std::exit(2);
      CK(cudaDeviceSynchronize());
    }
    // auto as the service runs it: the systems its kernel flagged solved again by the pivoting
    // kernel (a launch that reads the flags; none flagged on this dominant data), timed beside
    // auto without it.
    auto pivot_scratch = pool.Get(trisolve::cuda::PivotingScratchBytes(n, batch, sizeof(T) == 4));
    auto pivot_word = trisolve::cuda::PinnedWord::Take();
    if (!pivot_scratch.ok() || !pivot_word.ok()) std::exit(2);
    const trisolve::cuda::PivotResolve resolve{pivot_scratch->get(), pivot_word->mapped(),
                                               pivot_word->get()};
    // (certified pivoting below a warp's worth of systems: the flags' copy back, page-locked)
    struct PinnedFlags {
      uint8_t* p = nullptr;
      ~PinnedFlags() { cudaFreeHost(p); }
    } pinned_flags;
    CK(cudaMallocHost(&pinned_flags.p, size_t(batch)));
    uint8_t* const host_flags = pinned_flags.p;
    for (bool inter : {false, true}) {
      const char* lay = inter ? "interleaved" : "flat";
      trisolve::TridiagonalProblem<T> p{batch, n,
                                        inter ? trisolve::Layout::kInterleaved : trisolve::Layout::kFlat,
                                        a, b, c, d};
      for (int mi = 0; mi < 7; ++mi) {
        const trisolve::TridiagonalMethod m =
            mi <= 1   ? trisolve::TridiagonalMethod::kAuto
            : mi == 2 ? trisolve::TridiagonalMethod::kPartitioned
            : mi == 3 ? trisolve::TridiagonalMethod::kThomas
            : mi == 4 ? trisolve::TridiagonalMethod::kPcr
                      : trisolve::TridiagonalMethod::kPivoting;
        const bool recheck = mi == 1;  // auto with its second solve on the device
        // mi 5: the pivoting sweep on every system (`pivoting sweep`, what `pivoting` ran
        // before it was certified); mi 6: `pivoting` as the service runs it, certified
        // (docs/kernels/tridiagonal.md, "Certified by dominance"): auto's kernel, then the
        // sweep over the flagged systems on the device, or below cuda::kPivotingDeviceBatch
        // the flags read back for the host's sweep (none flagged on this dominant data).
        const bool certified = mi == 6;
        const bool host_second = certified && batch < trisolve::cuda::kPivotingDeviceBatch;
        if (g_auto_only && m != trisolve::TridiagonalMethod::kAuto) continue;
        // `auto` where it runs another kernel than `partitioned` (thomas-window); always with
        // its second solve, the time `pivoting` is held to.
        if (!g_auto_only && m == trisolve::TridiagonalMethod::kAuto && !recheck &&
            trisolve::cuda::ChooseTridiagonalKernel(m, n, batch, p.layout, sizeof(T) == 4) ==
                trisolve::cuda::ChooseTridiagonalKernel(trisolve::TridiagonalMethod::kPartitioned,
                                                        n, batch, p.layout, sizeof(T) == 4))
          continue;
        if (m == trisolve::TridiagonalMethod::kThomas && batch < 2048) continue;  // too few threads
        if (mi == 5 && batch < trisolve::cuda::kPivotingDeviceBatch) {  // the host's sweep
          if (inter) continue;
          const size_t count = static_cast<size_t>(N);
          std::vector<T> ha(count), hb(count), hc(count), hd(count), hx(count);
          std::vector<trisolve::SystemStatus> hs(static_cast<size_t>(batch));
          CK(cudaMemcpy(ha.data(), a0, bytes, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hb.data(), b0, bytes, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hc.data(), c0, bytes, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hd.data(), d0, bytes, cudaMemcpyDeviceToHost));
          const trisolve::TridiagonalProblem<T> hp{batch, n, trisolve::Layout::kFlat, ha.data(),
                                                   hb.data(), hc.data(), hd.data()};
          std::vector<double> times;
          for (int r = 0; r < std::max(3, reps / 5); ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            trisolve::cpu::SolveTridiagonal(hp, m, trisolve::TridiagonalOutput<T>{hx.data(), hs.data()});
            times.push_back(std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - t0).count());
          }
          std::sort(times.begin(), times.end());
          CK(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
          Record(lay, "host pivoting (CPU; no copies)", n, times[times.size() / 2], x, batch,
                 false);
          continue;
        }
        if (m == trisolve::TridiagonalMethod::kPcr && n > 1024) continue;
        // The kernel that ran (a window that fails its check falls back to another). A call
        // is timed as cuSPARSE's are, queued on the stream: a kernel that answers later
        // (thomas-window: whether a window failed) is answered after the timed run's wait, as
        // a caller's copy back would wait (LaterAnswer). Where an answer of a timed run solved
        // the problem again, outside the timed part, the row is timed again with every call
        // waiting for its answer (as it also is with --wait). The warm-up is a shape's first
        // solve, which may try a shorter halo first (a time-stepping caller's first step).
        trisolve::cuda::TridiagonalKernel ran{};
        trisolve::cuda::LaterAnswer later;
        bool again = false;
        int answered = 0;
        auto finish = [&] {
          if (!later.pending()) return;
          bool a = false;
          auto k = later.Finish(&a);
          if (!k.ok()) std::exit(3);
          ran = *k;
          if (answered++ > 0) again |= a;  // (the first: the warm-up's)
        };
        auto time = [&](bool wait) {
          return TimeIt(
              reps,
              [&] {
                finish();
                restore(inter);
              },
              [&] {
                auto k = trisolve::cuda::SolveTridiagonalDevice(
                    p, host_second ? trisolve::TridiagonalMethod::kAuto : m, x, flags, pool,
                    nullptr, wait ? nullptr : &later,
                    recheck || (certified && !host_second) ? &resolve : nullptr);
                if (!k.ok()) std::exit(3);
                ran = *k;
                if (host_second)
                  CK(cudaMemcpyAsync(host_flags, flags, size_t(batch), cudaMemcpyDeviceToHost,
                                     nullptr));
              });
        };
        double ms = time(g_wait);
        finish();
        if (again) {
          std::printf("# %s n=%lld: a window failed; timed again waiting for each answer\n",
                      lay, static_cast<long long>(n));
          ms = time(true);
        }
        std::string label = std::string("trisolve ") + trisolve::cuda::KernelName(ran) +
                            (recheck ? " +recheck" : "");
        if (mi == 5) label = "trisolve pivoting sweep";
        if (certified)
          label = std::string("trisolve pivoting = ") + trisolve::cuda::KernelName(ran) +
                  (host_second ? " +flags" : " +recheck");
        Record(lay, label.c_str(), n, ms, x, batch, inter);
      }
      // cuSPARSE: the solution overwrites the right-hand side (here x, restored each run).
      if (g_auto_only) continue;
      if (!inter) {
        size_t buf_bytes = 0;
        if constexpr (sizeof(T) == 8)
          CS(cusparseDgtsv2StridedBatch_bufferSizeExt(sp, int(n), a, b, c, x, int(batch), int(n), &buf_bytes));
        else
          CS(cusparseSgtsv2StridedBatch_bufferSizeExt(sp, int(n), a, b, c, x, int(batch), int(n), &buf_bytes));
        void* buf;
        CK(cudaMalloc(&buf, std::max<size_t>(buf_bytes, 1)));
        const double ms = TimeIt(
            reps,
            [&] {
              restore(false);
              CK(cudaMemcpyAsync(x, d, bytes, cudaMemcpyDeviceToDevice));
            },
            [&] {
              if constexpr (sizeof(T) == 8)
                CS(cusparseDgtsv2StridedBatch(sp, int(n), a, b, c, x, int(batch), int(n), buf));
              else
                CS(cusparseSgtsv2StridedBatch(sp, int(n), a, b, c, x, int(batch), int(n), buf));
            });
        Record(lay, "cuSPARSE gtsv2StridedBatch", n, ms, x, batch, false);
        CK(cudaFree(buf));
      } else {
        for (int algo : {0, 1}) {
          size_t buf_bytes = 0;
          if constexpr (sizeof(T) == 8)
            CS(cusparseDgtsvInterleavedBatch_bufferSizeExt(sp, algo, int(n), a, b, c, x, int(batch), &buf_bytes));
          else
            CS(cusparseSgtsvInterleavedBatch_bufferSizeExt(sp, algo, int(n), a, b, c, x, int(batch), &buf_bytes));
          void* buf;
          CK(cudaMalloc(&buf, std::max<size_t>(buf_bytes, 1)));
          const double ms = TimeIt(
              reps,
              [&] {
                restore(true);
                CK(cudaMemcpyAsync(x, d, bytes, cudaMemcpyDeviceToDevice));
              },
              [&] {
                if constexpr (sizeof(T) == 8)
                  CS(cusparseDgtsvInterleavedBatch(sp, algo, int(n), a, b, c, x, int(batch), buf));
                else
                  CS(cusparseSgtsvInterleavedBatch(sp, algo, int(n), a, b, c, x, int(batch), buf));
              });
          Record(lay, algo == 0 ? "cuSPARSE gtsvInterleaved 0" : "cuSPARSE gtsvInterleaved 1", n,
                 ms, x, batch, true);
          CK(cudaFree(buf));
        }
      }
    }
  }
};

template <typename T>
void RunAll(int64_t N, int reps, double copy_gbs, cusparseHandle_t sp, trisolve::cuda::Pool& pool,
            std::vector<Row>& rows, const std::vector<int64_t>& sizes) {
  const size_t bytes = sizeof(T) * N;
  std::vector<T*> bufs(14);
  for (auto& p : bufs) CK(cudaMalloc(&p, bytes));
  uint8_t* flags;
  CK(cudaMalloc(&flags, N));
  Bench<T> bench{N, reps, copy_gbs, sp, pool, rows, bufs[0], bufs[1], bufs[2], bufs[3], bufs[4],
                 bufs[5], bufs[6], bufs[7], bufs[8], bufs[9], bufs[10], bufs[11], bufs[12],
                 bufs[13], flags};
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> ha(N), hb(N), hc(N), hd(N), t(N);
  for (int64_t n : sizes) {
    const int64_t batch = N / n;
    for (int64_t e = 0; e < N; ++e) {
      const int64_t k = e % n;
      ha[e] = k == 0 ? T(0) : T(u(rng));
      hc[e] = k == n - 1 ? T(0) : T(u(rng));
      hb[e] = T(std::abs(double(ha[e])) + std::abs(double(hc[e])) + 0.5 + std::abs(u(rng)));
      hd[e] = T(u(rng));
    }
    T* flat[4] = {bench.a0, bench.b0, bench.c0, bench.d0};
    T* inter[4] = {bench.ai, bench.bi, bench.ci, bench.di};
    std::vector<T>* src[4] = {&ha, &hb, &hc, &hd};
    for (int q = 0; q < 4; ++q) {
      CK(cudaMemcpy(flat[q], src[q]->data(), bytes, cudaMemcpyHostToDevice));
      for (int64_t s = 0; s < batch; ++s)
        for (int64_t k = 0; k < n; ++k) t[k * batch + s] = (*src[q])[s * n + k];
      CK(cudaMemcpy(inter[q], t.data(), bytes, cudaMemcpyHostToDevice));
    }
    bench.Run(n);
  }
  for (auto p : bufs) CK(cudaFree(p));
  CK(cudaFree(flags));
}

// A variable-size batch (issue 33): sizes uniform in [lo, hi] until N unknowns (the last one
// cut to fit), diagonally dominant rows, solved by the variable kernel (auto) on device arrays,
// its plan on the device, timed as the uniform rows are; then uniform batches of 2048 and 4096
// rows on the same memory by auto, for the comparison. The error column: the largest relative
// difference from the CPU reference (auto) over the batch.
template <typename T>
void RunVariable(int64_t N, int reps, double copy_gbs, trisolve::cuda::Pool& pool,
                 std::vector<Row>& rows, int64_t lo, int64_t hi) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> len(lo, hi);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<int64_t> offsets{0};
  while (offsets.back() < N) offsets.push_back(std::min(N, offsets.back() + len(rng)));
  const int64_t batch = int64_t(offsets.size()) - 1;
  std::vector<T> h[4];
  for (auto& v : h) v.resize(size_t(N));
  for (int64_t e = 0; e < N; ++e) {
    h[0][e] = T(u(rng));
    h[2][e] = T(u(rng));
    h[1][e] = T(std::abs(double(h[0][e])) + std::abs(double(h[2][e])) + 0.5 + std::abs(u(rng)));
    h[3][e] = T(u(rng));
  }
  T* dev[5];
  for (auto& p : dev) CK(cudaMalloc(&p, sizeof(T) * N));
  for (int q = 0; q < 4; ++q)
    CK(cudaMemcpy(dev[q], h[q].data(), sizeof(T) * N, cudaMemcpyHostToDevice));
  uint8_t* flags;  // for this batch and the uniform ones below
  CK(cudaMalloc(&flags, N));
  // A plan of the variable kernel timed as one row: these systems or a uniform batch (offs), flat
  // or in the unified-vector layout (abc: a, b, c of a row together, read in place).
  std::vector<T> habc(3 * size_t(N));
  for (int64_t e = 0; e < N; ++e)
    for (int q = 0; q < 3; ++q) habc[3 * e + q] = h[q][e];
  T* abc;
  CK(cudaMalloc(&abc, sizeof(T) * 3 * N));
  CK(cudaMemcpy(abc, habc.data(), sizeof(T) * 3 * N, cudaMemcpyHostToDevice));
  const double bytes = 5.0 * sizeof(T) * N;
  auto plan_row = [&](const trisolve::cuda::VariablePlan& pl, std::vector<int64_t>& offs,
                      bool unified, const std::string& lay, int64_t n, int64_t systems) {
    std::byte* m;
    CK(cudaMalloc(&m, pl.meta.size()));
    CK(cudaMemcpy(m, pl.meta.data(), pl.meta.size(), cudaMemcpyHostToDevice));
    trisolve::TridiagonalProblem<T> q{systems, n, trisolve::Layout::kFlat, dev[0], dev[1], dev[2],
                                      dev[3]};
    if (unified) {
      q.a = abc;
      q.b = abc + 1;
      q.c = abc + 2;
      q.coef_stride = 3;
    }
    q.offsets = offs.data();
    const double t = trisolve::bench::TimeIt(reps, [&] {
      CK(cudaMemsetAsync(flags, 0, systems));
      auto k = trisolve::cuda::SolveVariableDevice(q, pl, m, trisolve::TridiagonalMethod::kAuto,
                                                   dev[4], flags, pool, nullptr);
      if (!k.ok()) std::exit(2);
    });
    rows.push_back({sizeof(T) == 8 ? "float64" : "float32", lay, "partitioned-variable", n,
                    systems, t, bytes / t / 1e6, bytes / t / 1e6 / copy_gbs, -1});
    std::printf("%-8s %8lld %8lld %-12s %-26s %9.3f ms %7.0f GB/s %5.1f%%\n",
                rows.back().dtype.c_str(), (long long)n, (long long)systems, lay.c_str(),
                "partitioned-variable", t, rows.back().gbs, 100 * rows.back().frac);
    CK(cudaFree(m));
  };
  // TRISOLVE_BENCH_STREAM_FROM=a,b,..: first a row for each streamed-class threshold (9: none).
  if (const char* sf = std::getenv("TRISOLVE_BENCH_STREAM_FROM")) {
    std::string list(sf);
    for (char* t = std::strtok(list.data(), ","); t; t = std::strtok(nullptr, ","))
      plan_row(trisolve::cuda::PlanVariable(offsets.data(), batch, std::atoi(t)), offsets, false,
               std::string("stream_from ") + t, hi, batch);
  }
  const trisolve::cuda::VariablePlan plan = trisolve::cuda::PlanVariable(offsets.data(), batch);
  std::byte* meta;
  CK(cudaMalloc(&meta, plan.meta.size()));
  CK(cudaMemcpy(meta, plan.meta.data(), plan.meta.size(), cudaMemcpyHostToDevice));
  trisolve::TridiagonalProblem<T> p{batch, hi, trisolve::Layout::kFlat, dev[0], dev[1], dev[2],
                                    dev[3]};
  p.offsets = offsets.data();
  std::string name;
  // As the backend runs it (a and c its own copies): one block-diagonal system where the batch
  // is large enough (variable.h, kBlockDiagonalUnknowns), else the per-system kernels. Timed
  // as the uniform rows are: queued, its answer (whether it stands) after the timed run's wait,
  // as a caller's copy back would wait; timed again waiting in each call where the per-system
  // kernels had to answer.
  trisolve::cuda::LaterAnswer later;
  bool again = false;
  int answers = 0;
  auto finish = [&] {
    if (!later.pending()) return;
    bool a = false;
    auto answered = later.FinishNamed(&a);
    if (!answered.ok()) std::exit(2);
    name = *answered;
    if (answers++ > 0) again |= a;  // (the first: the warm-up's, which may try a shorter halo)
  };
  auto run = [&](bool wait) {
    return trisolve::bench::TimeIt(reps, finish, [&] {
      CK(cudaMemsetAsync(flags, 0, batch));
      auto k = trisolve::cuda::SolveVariableDevice(p, plan, meta,
                                                   trisolve::TridiagonalMethod::kAuto, dev[4],
                                                   flags, pool, nullptr, /*own_couplings=*/true,
                                                   wait ? nullptr : &later);
      if (!k.ok()) std::exit(2);
      name = *k;
    });
  };
  double ms = run(false);
  finish();
  if (again) {
    std::printf("# variable %lld-%lld: solved again per system; timed again waiting\n",
                (long long)lo, (long long)hi);
    ms = run(true);
  }
  std::vector<T> x(N), xr(N);
  std::vector<trisolve::SystemStatus> st(batch);
  CK(cudaMemcpy(x.data(), dev[4], sizeof(T) * N, cudaMemcpyDeviceToHost));
  trisolve::TridiagonalProblem<T> hp{batch, hi, trisolve::Layout::kFlat, h[0].data(),
                                     h[1].data(), h[2].data(), h[3].data()};
  hp.offsets = offsets.data();
  trisolve::cpu::SolveTridiagonal(hp, trisolve::TridiagonalMethod::kAuto,
                                  trisolve::TridiagonalOutput<T>{xr.data(), st.data()});
  double dm = 0, xm = 0;
  for (int64_t e = 0; e < N; ++e) {
    dm = std::max(dm, std::abs(double(x[e]) - double(xr[e])));
    xm = std::max(xm, std::abs(double(xr[e])));
  }
  const std::string label = "variable " + std::to_string(lo) + "-" + std::to_string(hi);
  rows.push_back({sizeof(T) == 8 ? "float64" : "float32", label, name, hi, batch, ms,
                  bytes / ms / 1e6, bytes / ms / 1e6 / copy_gbs, dm / xm});
  std::printf("%-8s %8lld %8lld %-12s %-26s %9.3f ms %7.0f GB/s %5.1f%% err %.1e\n",
              rows.back().dtype.c_str(), (long long)hi, (long long)batch, label.c_str(),
              name.c_str(), ms, rows.back().gbs, 100 * rows.back().frac, dm / xm);
  // The per-system kernels on the same batch (plan_row never takes the block-diagonal form),
  // then the unified layout (which never does).
  plan_row(plan, offsets, false, label + " per system", hi, batch);
  plan_row(plan, offsets, true, label + " unified", hi, batch);
  // TRISOLVE_BENCH_VARIABLE_UNIFORM=n,..: uniform batches of those n through the variable kernel.
  if (const char* u = std::getenv("TRISOLVE_BENCH_VARIABLE_UNIFORM")) {
    std::string list(u);
    for (char* t = std::strtok(list.data(), ","); t; t = std::strtok(nullptr, ",")) {
      const int64_t n = std::atoll(t), systems = N / n;
      std::vector<int64_t> uo(size_t(systems) + 1);
      for (size_t s = 0; s < uo.size(); ++s) uo[s] = int64_t(s) * n;
      const auto up = trisolve::cuda::PlanVariable(uo.data(), systems);
      plan_row(up, uo, false, "uniform " + std::to_string(n), n, systems);
    }
  }
  {
    std::vector<int64_t> uo(size_t(N / 2048) + 1);
    for (size_t s = 0; s < uo.size(); ++s) uo[s] = int64_t(s) * 2048;
    const auto up = trisolve::cuda::PlanVariable(uo.data(), N / 2048);
    plan_row(up, uo, false, "flat", 2048, N / 2048);
    plan_row(up, uo, true, "unified", 2048, N / 2048);
  }
  CK(cudaFree(abc));
  for (int64_t n : {int64_t(2048), int64_t(4096)}) {
    trisolve::TridiagonalProblem<T> up{N / n, n, trisolve::Layout::kFlat, dev[0], dev[1], dev[2],
                                       dev[3]};
    trisolve::cuda::TridiagonalKernel kernel{};
    const double ums = trisolve::bench::TimeIt(reps, [&] {
      auto k = trisolve::cuda::SolveTridiagonalDevice(up, trisolve::TridiagonalMethod::kAuto,
                                                      dev[4], flags, pool, nullptr);
      if (!k.ok()) std::exit(2);
      kernel = *k;
    });
    rows.push_back({sizeof(T) == 8 ? "float64" : "float32", "flat", trisolve::cuda::KernelName(kernel),
                    n, N / n, ums, bytes / ums / 1e6, bytes / ums / 1e6 / copy_gbs, -1});
    std::printf("%-8s %8lld %8lld %-12s %-26s %9.3f ms %7.0f GB/s %5.1f%%\n",
                rows.back().dtype.c_str(), (long long)n, (long long)(N / n), "flat",
                rows.back().kernel.c_str(), ums, rows.back().gbs, 100 * rows.back().frac);
  }
  std::fflush(stdout);
  for (auto q : dev) CK(cudaFree(q));
  CK(cudaFree(flags));
  CK(cudaFree(meta));
}

// Times the partitioned kernel for each launch-parameter choice (flat and interleaved).
template <typename T>
void Tune(int64_t N, int reps, double copy_gbs, trisolve::cuda::Pool& pool,
          const std::vector<int64_t>& sizes) {
  const size_t bytes = sizeof(T) * N;
  T *a, *b, *c, *d, *x;
  uint8_t* flags;
  for (T** p : {&a, &b, &c, &d, &x}) CK(cudaMalloc(p, bytes));
  CK(cudaMalloc(&flags, N));
  std::vector<T> h(N);
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> u(0.1, 1);
  for (T* p : {a, c, d}) {
    for (auto& v : h) v = T(u(rng));
    CK(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
  }
  for (auto& v : h) v = T(4 + u(rng));
  CK(cudaMemcpy(b, h.data(), bytes, cudaMemcpyHostToDevice));
  // A diagonal that is not dominant ((|a| + |c|) / |b| up to 1.8): the windows' check fails.
  T* weak;
  CK(cudaMalloc(&weak, bytes));
  for (auto& v : h) v = T(1 + u(rng));
  CK(cudaMemcpy(weak, h.data(), bytes, cudaMemcpyHostToDevice));
  trisolve::cuda::TuningTable table = trisolve::cuda::ActiveTuning();  // the sweep's, in use here
  const trisolve::cuda::UseTuning use_table(&table);
  const auto saved = table.tridiagonal;
  // Times the partitioned solve of the whole set as n-row systems under tuning t.
  // The windows only where an entry asks for them (window = 1).
  auto time_with = [&](trisolve::cuda::PartitionedTuning t, int64_t n, bool inter,
                       bool dominant = true) {
    t.window = t.window > 0 ? 1 : -1;
    table.tridiagonal = t;
    trisolve::TridiagonalProblem<T> p{
        N / n, n, inter ? trisolve::Layout::kInterleaved : trisolve::Layout::kFlat, a,
        dominant ? b : weak, c, d};
    trisolve::cuda::TridiagonalKernel ran{};
    const double ms = TimeIt(reps, [] {}, [&] {
      auto k = trisolve::cuda::SolveTridiagonalDevice(
          p, trisolve::TridiagonalMethod::kPartitioned, x, flags, pool, nullptr);
      if (!k.ok()) std::exit(4);
      ran = *k;
    });
    const double gbs = 5.0 * bytes / ms / 1e6;
    std::printf("%8.3f ms %6.0f GB/s %5.1f%%  %s\n", ms, gbs, 100 * gbs / copy_gbs,
                trisolve::cuda::KernelName(ran));
    std::fflush(stdout);
  };
  const char* dtype = sizeof(T) == 8 ? "float64" : "float32";
  for (int64_t n : sizes) {
    for (bool inter : {false, true}) {
      const char* layout = inter ? "interleaved" : "flat";
      // The cluster one-pass kernel (a system over Q blocks), where a shape holds n: Q blocks
      // of at most 256 threads, a thread's 2Q reduced rows in one block (n <= 8 * 256 * rows).
      for (int q : {2, 4, 8})
        for (int chunk : {8, 16})
          for (int threads : {64, 128, 256}) {
            const int64_t per_block = (n + q - 1) / q;
            int64_t pb = 1;
            while (pb < (per_block + chunk - 1) / chunk) pb *= 2;
            if (pb > 256 || pb < q || (pb > threads && threads < 256)) continue;
            std::printf("tune %-8s n=%-6lld %-12s cluster=%d chunk=%-2d threads>=%-4d ", dtype,
                        (long long)n, layout, q, chunk, threads);
            time_with({chunk, threads, 16, 0, q, -1, -1, -1}, n, inter);
          }
      // Flat float64: the block sweeps' streamed kernel, a system a task (SolveRowsStreamed).
      if (sizeof(T) == 8 && !inter && trisolve::cuda::RowsStreamCapacity(n) > 0) {
        std::printf("tune %-8s n=%-8lld %-12s rows_stream             ", dtype, (long long)n,
                    layout);
        time_with({0, 0, 16, 0, 0, 0, -1, 1}, n, inter);
      }
      // Overlapping windows of 4096 rows (flat, n whole 16-byte words), by halo.
      if (!inter && n > 4096 && n % (16 / int(sizeof(T))) == 0)
        for (int halo : {64, 128, 256, 512}) {
          std::printf("tune %-8s n=%-8lld %-12s window halo=%-4d        ", dtype, (long long)n,
                      layout, halo);
          trisolve::cuda::PartitionedTuning t;
          t.window = 1;
          t.window_halo = halo;
          time_with(t, n, inter);
        }
      // What a failed check costs: the windows tried, then the two-pass path, on a diagonal
      // that is not dominant; the two-pass path alone on the same systems.
      if (!inter && n > 4096 && n % (16 / int(sizeof(T))) == 0) {
        trisolve::cuda::PartitionedTuning t;
        t.window = 1;
        std::printf("tune %-8s n=%-8lld %-12s window, not dominant   ", dtype, (long long)n,
                    layout);
        time_with(t, n, inter, false);
        std::printf("tune %-8s n=%-8lld %-12s two-pass, not dominant ", dtype, (long long)n,
                    layout);
        time_with({0, 0, 16, 0, 1, -1, 1}, n, inter, false);
      }
      // The two-pass path (rows a thread of its level kernels), also where one block holds n.
      for (int level : {8, 16}) {
        std::printf("tune %-8s n=%-8lld %-12s level_chunk=%-2d ", dtype, (long long)n, layout,
                    level);
        time_with({0, 0, level, 0, 1, -1, 1}, n, inter);
      }
      if (n > 4096) continue;
      // The streamed one-pass kernel: persistent blocks prefetching their next systems (flat: n
      // whole 16-byte words; interleaved: a group of at least 16 bytes of systems a row).
      for (int chunk : {8, 16})
        for (int threads : {64, 128, 256}) {
          int64_t p = 1;  // threads a system
          while (p * chunk < n) p *= 2;
          const int64_t per_block = std::max<int64_t>(p, threads) / p;  // systems a block
          if (n > int64_t(chunk) * 256) continue;
          if (!inter && n % (16 / int(sizeof(T))) != 0) continue;
          if (inter && per_block * int64_t(sizeof(T)) < 16) continue;
          std::printf("tune %-8s n=%-6lld %-12s chunk=%d threads>=%-4d streamed ", dtype,
                      (long long)n, layout, chunk, threads);
          time_with({chunk, threads, 16, 1, 1, 1, -1, -1}, n, inter);
        }
      for (int chunk : {4, 8, 16})
        for (int threads : {64, 128, 256, 512})
          for (int direct : {-1, 1}) {  // flat: staged through shared memory, or direct loads
            // 16 rows a thread: 255 registers, 256 threads a block at most.
            const int max_threads = chunk == 16 ? 256 : 512;
            if (threads > max_threads || n > int64_t(chunk) * max_threads) continue;
            if (inter && direct > 0) continue;
            std::printf("tune %-8s n=%-6lld %-12s chunk=%d threads>=%-4d %-7s", dtype,
                        (long long)n, layout, chunk, threads,
                        inter ? "" : direct > 0 ? "direct" : "staged");
            time_with({chunk, threads, 16, direct, 1, -1, -1, -1}, n, inter);
          }
    }
  }
  table.tridiagonal = saved;
  for (T* p : {a, b, c, d, x, weak}) CK(cudaFree(p));
  CK(cudaFree(flags));
}


// --pivot-split: systems that are not diagonally dominant, few and long (issue 33), solved
// again after auto's fast kernel flagged them: by pivoting-split on the device (the service's
// path now), by the sweep of a thread a system on the device (before, at 32 systems or more),
// or on the host (before, below 32: the CPU reference's ResolveSingularWithPivoting over every
// core, timed by the host clock, no copies). Also the fast kernel alone and a dominant system
// for reference. Each row says how many systems the split answered (its check passed) and how
// many the sweep took after it; err: the largest backward error over the batch (residual in
// long double on the host), -1 where not measured.
template <typename T>
void RunPivotSplit(int reps, double copy_gbs, trisolve::cuda::Pool& pool, std::vector<Row>& rows,
                   const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  using trisolve::TridiagonalMethod;
  namespace tc = trisolve::cuda;
  const char* dtype = sizeof(T) == 8 ? "float64" : "float32";
  for (auto [batch, n] : shapes) {
    const int64_t N = batch * n;
    const size_t bytes = sizeof(T) * size_t(N);
    T *a, *b, *c, *d, *x;
    uint8_t* flags;
    for (T** q : {&a, &b, &c, &d, &x}) CK(cudaMalloc(q, bytes));
    CK(cudaMalloc(&flags, size_t(batch)));
    const int64_t split_bytes = tc::PivotingSplitScratchBytes(n, batch, sizeof(T) == 4);
    const int64_t sweep_bytes = tc::PivotingScratchBytes(n, batch, sizeof(T) == 4);
    auto scratch = pool.Get(std::max(split_bytes, sweep_bytes));
    auto word = tc::PinnedWord::Take();
    auto any_word = tc::PinnedWord::Take();
    if (!scratch.ok() || !word.ok() || !any_word.ok()) std::exit(2);
    int* host = word->get();
    int* mapped = word->mapped();
    const tc::SplitAny any{any_word->mapped(), any_word->get()};
    for (const char* kind : {"random", "zero diagonal", "dominant"}) {
      if (std::strcmp(kind, "zero diagonal") == 0 && n % 2 != 0) continue;
      std::mt19937_64 rng(5);
      std::uniform_real_distribution<double> u(-1, 1);
      std::vector<T> h[4];
      for (auto& v : h) v.resize(size_t(N));
      for (int64_t e = 0; e < N; ++e) {
        if (kind[0] == 'r') {
          h[0][e] = T(u(rng)), h[1][e] = T(u(rng)), h[2][e] = T(u(rng));
        } else if (kind[0] == 'z') {
          h[0][e] = T(1), h[1][e] = T(0), h[2][e] = T(1);
        } else {
          h[0][e] = T(u(rng)), h[2][e] = T(u(rng));
          h[1][e] = T(std::abs(double(h[0][e])) + std::abs(double(h[2][e])) + 0.5 + std::abs(u(rng)));
        }
        h[3][e] = T(u(rng));
      }
      T* dev[4] = {a, b, c, d};
      for (int q = 0; q < 4; ++q)
        CK(cudaMemcpy(dev[q], h[q].data(), bytes, cudaMemcpyHostToDevice));
      const trisolve::TridiagonalProblem<T> p{batch, n, trisolve::Layout::kFlat, a, b, c, d};
      const trisolve::TridiagonalProblem<T> hp{batch, n, trisolve::Layout::kFlat, h[0].data(),
                                               h[1].data(), h[2].data(), h[3].data()};
      // The largest backward error over the batch, of x on the device.
      auto worst = [&]() {
        std::vector<T> hx(static_cast<size_t>(N));
        CK(cudaMemcpy(hx.data(), x, bytes, cudaMemcpyDeviceToHost));
        double w = 0;
        for (int64_t s = 0; s < batch; ++s) {
          long double rm = 0, am = 0, xm = 0, dm = 0;
          for (int64_t k = 0; k < n; ++k) {
            const int64_t i = s * n + k;
            long double r = (long double)h[3][i] - (long double)h[1][i] * hx[i];
            long double row = std::abs((long double)h[1][i]);
            if (k > 0) r -= (long double)h[0][i] * hx[i - 1], row += std::abs((long double)h[0][i]);
            if (k + 1 < n)
              r -= (long double)h[2][i] * hx[i + 1], row += std::abs((long double)h[2][i]);
            if (!std::isfinite(double(hx[i]))) rm = INFINITY;
            rm = std::max(rm, std::abs(r));
            am = std::max(am, row);
            xm = std::max(xm, std::abs((long double)hx[i]));
            dm = std::max(dm, std::abs((long double)h[3][i]));
          }
          w = std::max(w, double(rm / (am * xm + dm)));
        }
        return w;
      };
      const double moved = 5.0 * double(bytes);
      auto record = [&](const std::string& label, double ms, double err) {
        rows.push_back({dtype, kind, label, n, batch, ms, moved / ms / 1e6,
                        moved / ms / 1e6 / copy_gbs, err});
        std::printf("%-8s %8lld %6lld %-13s %-48s %9.3f ms %6.0f GB/s %5.1f%% be %.1e\n", dtype,
                    (long long)n, (long long)batch, kind, label.c_str(), ms, rows.back().gbs,
                    100 * rows.back().frac, err);
        std::fflush(stdout);
      };
      const std::string fast =
          tc::KernelName(tc::ChooseTridiagonalKernel(TridiagonalMethod::kAuto, n, batch,
                                                     trisolve::Layout::kFlat, sizeof(T) == 4));
      auto prep = [&] {
        CK(cudaMemsetAsync(flags, 0, size_t(batch)));
        host[0] = host[1] = 0;
      };
      // The fast kernel alone (its flags, no second solve).
      double ms = trisolve::bench::TimeIt(reps, prep, [&] {
        if (!tc::SolveTridiagonalDevice(p, TridiagonalMethod::kAuto, x, flags, pool, nullptr).ok())
          std::exit(3);
      });
      std::vector<uint8_t> hf(static_cast<size_t>(batch));
      CK(cudaMemcpy(hf.data(), flags, size_t(batch), cudaMemcpyDeviceToHost));
      int64_t flagged = 0;
      for (uint8_t f : hf) flagged += f != 0;
      record(fast + " alone (" + std::to_string(flagged) + " flagged)", ms, -1);
      // The service's path: the fast kernel, the split on what it flagged (its launch asking
      // first whether anything is), then at 32 systems or more the sweep on what the split
      // left (below 32 the host takes what is left: counted, not timed).
      const bool device_sweep = batch >= tc::kPivotingDeviceBatch;
      ms = trisolve::bench::TimeIt(reps, prep, [&] {
        if (!tc::SolveTridiagonalDevice(p, TridiagonalMethod::kAuto, x, flags, pool, nullptr).ok())
          std::exit(3);
        if (!tc::LaunchPivotingSplit(p, x, flags, scratch->get(), nullptr, mapped + 1, &any).ok())
          std::exit(3);
        if (device_sweep && *any.host != 0 &&
            !tc::LaunchPivoting(p, x, flags, scratch->get(), nullptr, true, mapped).ok())
          std::exit(3);
      });
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hf.data(), flags, size_t(batch), cudaMemcpyDeviceToHost));
      int64_t left = 0;
      for (uint8_t f : hf) left += f != 0;
      record(fast + " + split (" + std::to_string(host[1]) + ")" +
                 (device_sweep ? " + sweep (" + std::to_string(host[0]) + ")"
                               : ", host " + std::to_string(left)),
             ms, device_sweep || left == 0 ? worst() : -1);
      // The split alone on every system (flags all set): its own cost, the parts staged whole
      // (the default) and 8 rows at a time.
      for (bool whole : {true, false}) {
        ms = trisolve::bench::TimeIt(
            reps,
            [&] {
              CK(cudaMemsetAsync(flags, tc::kFlagNotDominant, size_t(batch)));
              host[1] = 0;
            },
            [&] {
              if (!tc::LaunchPivotingSplit(p, x, flags, scratch->get(), nullptr, mapped + 1,
                                           nullptr, whole)
                       .ok())
                std::exit(3);
            });
        CK(cudaDeviceSynchronize());
        record(std::string("split alone") + (whole ? "" : " (8-row tiles)") + ", every system (" +
                   std::to_string(host[1]) + " answered)",
               ms, worst());
      }
      // (the flags as the fast kernel left them, for the rows below)
      CK(cudaMemsetAsync(flags, 0, size_t(batch)));
      if (!tc::SolveTridiagonalDevice(p, TridiagonalMethod::kAuto, x, flags, pool, nullptr).ok())
        std::exit(3);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hf.data(), flags, size_t(batch), cudaMemcpyDeviceToHost));
      if (batch >= tc::kPivotingDeviceBatch) {
        // Before: the sweep, a thread a system, on every flagged system.
        ms = trisolve::bench::TimeIt(std::min(reps, 3), prep, [&] {
          if (!tc::SolveTridiagonalDevice(p, TridiagonalMethod::kAuto, x, flags, pool, nullptr)
                   .ok())
            std::exit(3);
          if (!tc::LaunchPivoting(p, x, flags, scratch->get(), nullptr, true, mapped).ok())
            std::exit(3);
        });
        CK(cudaDeviceSynchronize());
        record(fast + " + sweep (" + std::to_string(host[0]) + ")", ms, worst());
      } else if (flagged > 0) {
        // Before: the flagged systems on the host (from the host arrays, no copies).
        std::vector<T> hx(static_cast<size_t>(N));
        std::vector<double> times;
        for (int r = 0; r < 3; ++r) {
          std::vector<trisolve::SystemStatus> st(size_t(batch), trisolve::SystemStatus::kOk);
          for (int64_t s = 0; s < batch; ++s)
            if (hf[size_t(s)] != 0) st[size_t(s)] = trisolve::SystemStatus::kSingular;
          const auto t0 = std::chrono::steady_clock::now();
          trisolve::cpu::ResolveSingularWithPivoting(
              hp, trisolve::TridiagonalOutput<T>{hx.data(), st.data()}, nullptr);
          times.push_back(std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(times.begin(), times.end());
        record("host re-solve of the flagged (CPU, no copies)", times[1], -1);
      }
    }
    for (T* q : {a, b, c, d, x}) CK(cudaFree(q));
    CK(cudaFree(flags));
  }
}
}  // namespace

int main(int argc, char** argv) {
  // --auto-only: `auto` alone, in both layouts (the tuning runs of thomas-window).
  // --wait: `auto` timed waiting for its kernel's answer in each call.
  bool variable = false, pivot_split = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--pivot-split")) pivot_split = true;
    if (!std::strcmp(argv[i], "--auto-only")) g_auto_only = true;
    if (!std::strcmp(argv[i], "--wait")) g_wait = true;
    if (!std::strcmp(argv[i], "--variable")) variable = true;
  }
  int64_t N = int64_t{1} << 24;
  int reps = 15;
  std::string csv;
  bool tune = false;
  std::vector<int64_t> only;
  // The knobs below change a table of the benchmark's own, in use for the rest of the run.
  trisolve::cuda::TuningTable tuning = trisolve::cuda::ActiveTuning();
  const trisolve::cuda::UseTuning use_tuning(&tuning);
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--tune")) tune = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tune") || !std::strcmp(argv[i], "--auto-only") ||
        !std::strcmp(argv[i], "--wait") || !std::strcmp(argv[i], "--variable") ||
        !std::strcmp(argv[i], "--pivot-split")) {
      --i;
      continue;
    }
    if (!std::strcmp(argv[i], "--sizes")) {
      for (char* t = std::strtok(argv[i + 1], ","); t; t = std::strtok(nullptr, ","))
        only.push_back(std::atoll(t));
    } else if (!std::strcmp(argv[i], "--unknowns")) N = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--csv")) csv = argv[i + 1];
    else {
      // thomas-window's tuning: auto by it (1 / -1), windows a system, copies in flight, halo,
      // mirrored; partitioned-window's: tried first (1) or never (-1), its halo.
      const std::pair<const char*, int trisolve::cuda::PartitionedTuning::*> knobs[] = {
          {"--thomas-window", &trisolve::cuda::PartitionedTuning::thomas_window},
          {"--thomas-windows", &trisolve::cuda::PartitionedTuning::thomas_windows},
          {"--thomas-stages", &trisolve::cuda::PartitionedTuning::thomas_stages},
          {"--thomas-halo", &trisolve::cuda::PartitionedTuning::thomas_halo},
          {"--thomas-mirror", &trisolve::cuda::PartitionedTuning::thomas_mirror},
          {"--window", &trisolve::cuda::PartitionedTuning::window},
          {"--window-halo", &trisolve::cuda::PartitionedTuning::window_halo}};
      for (const auto& [name, field] : knobs)
        if (!std::strcmp(argv[i], name)) {
          tuning.tridiagonal.*field = std::atoi(argv[i + 1]);
        }
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbs = trisolve::bench::CopyGBs(reps);  // the ceiling
  std::printf("device: %s, %d SMs; device-to-device copy: %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, copy_gbs);
  std::printf("%lld unknowns per shape; bytes that must move: 5 arrays (a, b, c, d, x)\n\n",
              (long long)N);
  std::printf("%-8s %8s %8s %-12s %-26s %12s %12s %6s\n", "dtype", "n", "batch", "layout", "kernel",
              "time", "bandwidth", "of copy");
  cusparseHandle_t sp;
  CS(cusparseCreate(&sp));
  trisolve::cuda::Pool pool(trisolve::cuda::Pool::Kind::kDevice, 0, int64_t{16} << 30);
  std::vector<Row> rows;
  const std::vector<int64_t> sizes = {32, 64, 128, 256, 1024, 4096, 16384, 1 << 20, 1 << 24};
  std::vector<int64_t> use;
  for (int64_t n : only.empty() ? sizes : only)
    if (n <= N) use.push_back(n);
  if (tune) {
    Tune<double>(N, reps, copy_gbs, pool, use);
    Tune<float>(N, reps, copy_gbs, pool, use);
    return 0;
  }
  if (pivot_split) {
    // TRISOLVE_BENCH_PIVOT_SHAPES=batch x n,..: other shapes (e.g. 256x65536).
    std::vector<std::pair<int64_t, int64_t>> shapes = {
        {1, int64_t(1) << 24}, {4, int64_t(1) << 22}, {64, int64_t(1) << 18}};
    if (const char* e = std::getenv("TRISOLVE_BENCH_PIVOT_SHAPES")) {
      shapes.clear();
      std::string list(e);
      for (char* t = std::strtok(list.data(), ","); t; t = std::strtok(nullptr, ","))
        shapes.push_back({std::atoll(t), std::atoll(std::strchr(t, 'x') + 1)});
    }
    RunPivotSplit<double>(reps, copy_gbs, pool, rows, shapes);
    if (std::getenv("TRISOLVE_BENCH_PIVOT_FLOAT32"))
      RunPivotSplit<float>(reps, copy_gbs, pool, rows, shapes);
  } else if (variable) {
    // TRISOLVE_BENCH_VARIABLE_RANGES=lo-hi,..: float64 batches of those size ranges first.
    if (const char* r = std::getenv("TRISOLVE_BENCH_VARIABLE_RANGES")) {
      std::string list(r);
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (char* t = std::strtok(list.data(), ","); t; t = std::strtok(nullptr, ","))
        ranges.push_back({std::atoll(t), std::atoll(std::strchr(t, '-') + 1)});
      for (auto [lo, hi] : ranges) RunVariable<double>(N, reps, copy_gbs, pool, rows, lo, hi);
    }
    RunVariable<double>(N, reps, copy_gbs, pool, rows, 32, 4096);
    RunVariable<double>(N, reps, copy_gbs, pool, rows, 1, 64);
    RunVariable<float>(N, reps, copy_gbs, pool, rows, 32, 4096);
  } else {
    RunAll<double>(N, reps, copy_gbs, sp, pool, rows, use);
    RunAll<float>(N, reps, copy_gbs, sp, pool, rows, use);
  }
  cusparseDestroy(sp);
  if (!csv.empty()) {
    FILE* f = std::fopen(csv.c_str(), "w");
    std::fprintf(f, "device,copy_gbs,dtype,n,batch,layout,kernel,ms,gbs,fraction_of_copy,max_rel_diff\n");
    for (const Row& r : rows)
      std::fprintf(f, "%s,%.0f,%s,%lld,%lld,%s,%s,%.4f,%.0f,%.3f,%.2e\n", prop.name, copy_gbs,
                   r.dtype.c_str(), (long long)r.n, (long long)r.batch, r.layout.c_str(),
                   r.kernel.c_str(), r.ms, r.gbs, r.frac, r.err);
    std::fclose(f);
  }
  return 0;
}
