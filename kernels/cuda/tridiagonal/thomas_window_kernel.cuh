// thomas-window's device code: the shared-memory ring, the copies, the warps' sweep and the
// look-ahead back substitution (ThomasWindowKernel). Included by thomas_window.cu only; the
// design: docs/kernels/tridiagonal.md, "thomas-window: design notes".
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common/bulk_copy.cuh"
#include "common/numerics.cuh"
#include "runtime/pinned_word.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/windows.h"

namespace trisolve::cuda {
namespace {

constexpr int kLanes = 32;      // threads a block: one warp
constexpr int kOut = 16;        // rows a back substitution stores (a chunk)
// Windows past a system's first: the first halo of a shape (32 rows), at most 256. Each launch
// measures the halo its windows needed (HaloNeeded): where a window's left end's bound failed,
// the problem runs again with that measure (and a margin, FitHalo); where every window held,
// a shape's next solve starts with it if shorter. A halo's rows cost as much as a core's (one
// system of 2^24 in 1024-row windows: 0.281 ms with halos of 64, 0.276 with 32, NOTES.md t48);
// the benchmark's rows need ~30 rows, a diffusion step with r = 1 ~40, r = 10 ~120 (float64).
constexpr int64_t kFirstHalo = 32, kLongHalo = 256;
// Why these sizes (H100): one warp a block, and a warp's rows are one dependent chain (a
// division a row), so the SM's four schedulers need four warps or more: shared memory for 4
// blocks of float64 holds two copies in flight and a ring of 64 rows (48 of look-ahead, what
// the benchmark's rows and a diffusion step with r = 1 need); problems that need more are run
// again with a ring of 128 rows (2 blocks an SM) before the exact path.
constexpr int kShortRing = 64, kLongRing = 128;
// One flat system: its windows' cores at least (PlanChain: as short as the warps that run at
// once allow, 992 and 1008 rows for 2^24 on the H100), so that the longest halo (256) reaches
// one window back only.
constexpr int64_t kChainMinCore = 512;
// Rows a copy (a box of systems an array): float64 8, float32 16 (H100, 2^24 unknowns
// interleaved: float64 in copies of 16 rows fit 3 blocks an SM, n = 1024 0.263 -> 0.433 ms;
// float32 in copies of 8 rows 0.162 against 0.147; copies of 4 rows, 4 / 8 in flight, were
// slower in both, 0.299 / 0.208).
template <typename T>
constexpr int StageRows() {
  return sizeof(T) == 8 ? 8 : 16;
}
constexpr int Snaps(int ring) { return ring / kOut + 1; }  // chunks open at once at most

struct Maps {
  CUtensorMap m[4];  // a, b, c, d as (batch x n), boxes of kSys systems x StageRows rows
  CUtensorMap x;     // flat: x, boxes of kSys systems x kOut rows (a chunk)
};

// The answers in *fail: a window needed more look-ahead than the ring holds (worth a longer
// ring), its halo was too short for the left end's bound (worth a longer halo), or its rows
// fail otherwise (the exact path). The most severe one a launch met is its answer.
constexpr int kFailLookAhead = 1, kFailHalo = 2, kFailRows = 3;

struct Args {
  WindowPlan plan;      // windows of a system (per_system 1: whole systems)
  int64_t tasks = 0;    // groups of kSys systems x tasks a group (windows / (kLanes / kSys))
  double tau = 0;       // a chunk is stored once prod |c'| over its look-ahead is under tau
  int* fail = nullptr;    // kFail* where a window cannot be solved here, in fail[1] the halo
                          // the windows needed, in fail[3] the chain's tasks whose first
                          // chunk is stored (PinnedWord's scratch)
  int* answer = nullptr;  // both at the end, written by the last block (PinnedWord::mapped)
  // Flat, one system: its windows are the lanes, 32 consecutive ones a task, copied as one box
  // of the maps' (core x windows) view (the halo from the window before, the look-ahead from
  // the one after). The windows come in one or two parts (PlanChain), the first part's `plan`
  // and the kernel's `maps`, the second's below and `maps2`, whose view starts a window early
  // (coordinate 1 is its first window: its halo is the first part's last rows), where the first
  // part's ends a window late (its last window's look-ahead is the second part's first rows).
  bool chain = false;
  int64_t tasks1 = 0;  // the first part's tasks (the rest: the second's)
  int start2 = 0, core2 = 0, wins2 = 0;
  // Mirrored windows: the odd windows of a system sweep it backward (the system reversed: rows
  // n - 1 down to 0, a and c exchanged), so that the rows two neighbouring windows both read
  // (a halo, a look-ahead) are read by both near the same time, the second read from the L2.
  // Tasks alternate even and odd windows; every core is whole (n a multiple of the core).
  bool mirror = false;
};

// A warp sweeps kLanes / kSys windows of kSys systems at once, lane = window * kSys + system:
// batches of 16 systems fill a warp with two windows of each (kSys 16).
template <typename T, int kRing, int kSys, int kStages, bool kFlat>
struct Smem {
  T raw[kStages][4][kLanes / kSys][StageRows<T>()][kSys];  // the copies' boxes: a, b, c, d
  // Flat: a chunk of x, each system's kOut rows swizzled, for the copy engine to store.
  // (64-byte rows: float64 chunks as two boxes of 8 rows.)
  T xout[kFlat ? kLanes / kSys : 1][kFlat ? kOut * sizeof(T) / 64 : 1][kFlat ? kSys : 1]
        [kFlat ? 64 / sizeof(T) : 1];
  T ring[kRing][2][kLanes];        // c', d' of relative row k at (k - H) % kRing (below)
  T map[Snaps(kRing)][2][kLanes];      // swept chunks' alpha, beta (the kernel)
  float most[Snaps(kRing)][kLanes];    // and most
  float halo_p[kLanes];  // the left end's P at the halo's last copy where it is over 2^-80,
  int halo_rows[kLanes];  // and the rows it is a product of (HaloNeeded)
  uint64_t bar[kStages];
};

// Flat: element i of a system's 64-byte row in a box, swizzled as the copy engine places it
// (16-byte units XOR address bits 7-8), so that the lanes, one a system, meet 4 to a bank group.
template <typename T>
__device__ __forceinline__ int Swizzled64(int i, int sys) {
  constexpr int kUnit = 16 / int(sizeof(T));
  return ((i / kUnit) ^ ((sys >> 1) & 3)) * kUnit + i % kUnit;
}

// The halo a window past a system's first needed, measured: its left end's bound is
// left_sum = P S, P the product of |a / den| over its halo rows (P_m over the first m) and S
// the core's sum from its first row. At the halo's mean decay a row, lr = log2(P_m) / m
// (P_m the last over 2^-80: P is floored at 2^-(digits + 40)), k rows make it tau where
// k = log2(tau / S) / lr; S = left_sum / P_H where P_H is over 2^-80, else at most
// 1 / (1 - 2^lr) (a geometric series). An estimate (a shorter sweep's first pivots differ)
// that picks the next launch's halo, which checks it again; kHaloUnknown where the halo
// hardly decays.
constexpr int kHaloUnknown = 1 << 20;
template <typename T>
__device__ __forceinline__ int HaloNeeded(float p_m, int m, T left_sum, T tau, int H) {
  if (m == 0) return 8;  // (under 2^-80 in one copy: 10 bits a row)
  const float lr = log2f(p_m) / float(m);
  if (!(lr < -1.0f / 64)) return kHaloUnknown;
  const float ls = m == H ? log2f(float(left_sum)) - log2f(p_m) : -log2f(1 - exp2f(lr));
  const float k = (log2f(float(tau)) - ls) / lr;
  return !(k < float(kHaloUnknown)) ? kHaloUnknown : max(1, int(ceilf(k)));
}

// Every lane counts rows from lo = c0 - H, H the halo where the task has a window past a
// system's first (rows before a system's row 0 void), else 0: so the warp's windows stay in
// step, their copies, chunks and ring slots alike, and only the rows past a window's core
// differ (the last window of a system ends at n). The halo is whole copies and cores whole
// chunks, so that a copy never straddles a chunk's end (but at n) nor the ring's end.
// kFlat: the flat layout, a box holding kSys systems' rows (64 bytes each) with the copy
// engine's 64-byte swizzle (16-byte units of a row XOR bits 7-8 of its address), so that a
// warp's lanes, one a system, read their rows 4 to a bank group, not 16.
// Registers: at most 168 (__maxnreg__, in place of __launch_bounds__(kLanes), which made ptxas
// aim at 128: with the certificate's compare the float64 flat kernel spilled 24-44 bytes there,
// sm_90). It then takes 150 (float64 flat), 144 (interleaved), 147-157 (float32), no spills;
// the blocks an SM stay bound by the shared memory.
template <typename T, int kRing, int kSys, int kStages, bool kFlat>
__global__ void __maxnreg__(168)
    ThomasWindowKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags,
                       const __grid_constant__ Maps maps, const __grid_constant__ Maps maps2,
                       Args w) {
  constexpr int kPer = kLanes / kSys, kSnaps = Snaps(kRing), kStageRows = StageRows<T>();
  static_assert((kRing & (kRing - 1)) == 0 && kRing % kStageRows == 0 && kOut % kStageRows == 0);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  using S = Smem<T, kRing, kSys, kStages, kFlat>;
  // On 512 bytes: the swizzle is a function of the address.
  S& sm = *reinterpret_cast<S*>(smem_raw + ((512 - (SmemAddr(smem_raw) & 511)) & 511));
  const int lane = threadIdx.x, wl = lane / kSys, sl = lane % kSys;
  static_assert(!kFlat || kStageRows * sizeof(T) == 64, "a flat box row is 64 bytes");
  // Element i of this lane's rows in its box.
  auto at = [&](int i) { return kFlat ? sl * kStageRows + Swizzled64<T>(i, sl) : i * kSys + sl; };
  // Flat: this lane's 16-byte units of a box row (kUnit values each): unit u at unit_at[u].
  using V = typename Vec16<T>::type;
  constexpr int kUnit = 16 / int(sizeof(T));
  int unit_at[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) unit_at[u] = at(u * kUnit);
  if (lane == 0)
    for (int i = 0; i < kStages; ++i) BarInit(&sm.bar[i]);
  __syncwarp();
  constexpr uint32_t kBoxBytes = 4u * kStageRows * kSys * sizeof(T);
  const int n = int(p.n);
  // Tasks a group: kPer windows each (mirrored: the even windows' tasks and the odd ones'
  // alternate).
  const int64_t per_group = w.mirror ? 2 * (((w.plan.per_system + 1) / 2 + kPer - 1) / kPer)
                                     : (w.plan.per_system + kPer - 1) / kPer;
  uint32_t issued = 0, used = 0;  // copies issued and consumed by this block: slot and parity
  for (int64_t t = blockIdx.x; t < w.tasks; t += gridDim.x) {
    if (*static_cast<volatile int*>(w.fail)) break;
    // The chain's second part: its windows, cores and maps (its view's first window is
    // coordinate 1).
    const bool part2 = w.chain && t >= w.tasks1;
    const int64_t wins = part2 ? w.wins2 : w.plan.per_system;  // windows a system (a part)
    const int core = part2 ? w.core2 : int(w.plan.core);
    const int start = part2 ? w.start2 : 0;  // the part's first row
    const int coord = part2 ? 1 : 0;         // its first window's in its maps
    const Maps& mp = part2 ? maps2 : maps;
    const int64_t g = w.chain ? 0 : t / per_group;
    // The task's windows: w0 + step * b for its boxes b (the chain: its lanes b); mirrored,
    // the odd tasks' windows are odd and sweep backward (rev).
    const int tg = int(w.chain ? (part2 ? t - w.tasks1 : t) : t - g * per_group);
    const int step = w.mirror ? 2 : 1;
    const bool rev = w.mirror && (tg & 1);
    const int per_task = w.chain ? kSys : kPer;
    const int w0 = (w.mirror ? tg >> 1 : tg) * per_task * step + (rev ? 1 : 0);
    if (w0 >= wins) continue;  // (mirrored: an odd task past the last odd window)
    // The task with its direction a constant (kRev): a copy's rows in sweep order, a and c,
    // and x's places are then fixed offsets, not selections made at every row. Answers whether
    // the launch has failed.
    auto task = [&](auto rev_c) -> bool {
      constexpr bool kRev = decltype(rev_c)::value;
      const int boxes = w.chain ? 1 : int(std::min<int64_t>(kPer, (wins - 1 - w0) / step + 1));
      const int jl = w.chain ? int(wins) - 1 : w0 + step * (boxes - 1);
      // This lane's window (a lane past the windows shadows the last, idle).
      const int j = w.chain ? min(w0 + step * sl, jl) : w0 + step * min(wl, boxes - 1);
      // Windows past a system's first in the task: a halo for every lane, and their checks.
      const bool past_first = jl > 0 || start > 0;
      const int H = past_first ? int(w.plan.halo) : 0;
      // Its core [c0, c1) and relative row 0, counted along the sweep (kRev: row r is row
      // n - 1 - r of the system).
      const int c0m = start + j * core, c1m = min(n, c0m + core);
      const int c0 = kRev ? n - c1m : c0m, c1 = kRev ? n - c0m : c1m;
      const int lo = c0 - H;
      const int64_t s = w.chain ? 0 : g * kSys + sl;
      const bool live = w.chain ? w0 + step * sl < wins : wl < boxes && s < p.batch;
      // The sweep starts at row 0 (nothing dropped), and is the CPU reference's (its pivots).
      const bool first = c0 == 0, exact = first && !kRev;
      // The warp's ends, relative: of the longest core and of the rows it may read.
      const int core_end = __reduce_max_sync(~0u, c1 - lo);
      const int read_end = __reduce_max_sync(~0u, min(n, c1 + kRing) - lo);
      int next = 0;  // the next copy's relative row
      // Flat, forward (the chain and batches): a window's last rows are substituted back from
      // x at the next window's first row (linked, below), so its copies stop at the core's end
      // unless that x is not there to be had. (Float64, as `auto` runs the flat kernel: in the
      // float32 kernels its registers spilled, 16-24 bytes.)
      const bool link = kFlat && sizeof(T) == 8 && !w.mirror;
      int issue_end = link ? core_end : read_end;
      auto issue = [&] {
        while (next < issue_end && issued - used < kStages) {
          const int slot = int(issued % kStages);
          if (lane == 0) {
            // Boxes wholly before row 0 or past n are not copied (void rows); the bytes are
            // expected after the copies (the phase waits for this arrival either way).
            uint32_t bytes = 0;
            if (w.chain) {  // the window before, this one, or the one after (in memory)
              const int v = next - H;  // from the core's start along the sweep
              const int off = kRev ? core - kStageRows - v : v;
              const int seg = off < 0 ? -1 : off < core ? 0 : 1;
#pragma unroll
              for (int q = 0; q < 4; ++q)
                BulkLoad2D(&sm.raw[slot][q][0][0][0], &mp.m[q], off - seg * core,
                           coord + w0 + seg, &sm.bar[slot]);
              bytes = kBoxBytes;
            }
            for (int b = 0; b < (w.chain ? 0 : boxes); ++b) {
              const int jb = w0 + step * b;
              const int r0 = (kRev ? n - min(n, (jb + 1) * core) : jb * core) - H + next;
              if (r0 + kStageRows > 0 && r0 < n) {
                const int m0 = kRev ? n - kStageRows - r0 : r0;  // its first row in memory
#pragma unroll
                for (int q = 0; q < 4; ++q)
                  BulkLoad2D(&sm.raw[slot][q][b][0][0], &maps.m[q], kFlat ? m0 : int(g * kSys),
                             kFlat ? int(g * kSys) : m0, &sm.bar[slot]);
                bytes += kBoxBytes;
              }
            }
            BarExpect(&sm.bar[slot], bytes);
          }
          ++issued;
          next += kStageRows;
        }
      };
      issue();
      T cp = T(0), dp = T(0);  // the forward sweep's c', d' of the row before
      // The chunk being swept, as the back substitution will see it: x at its first row =
      // alpha + beta x[row] for the rows swept so far (beta = prod -c'), and
      // most = max over its rows k of prod_{i = k..row-1} |c'_i|.
      T alpha = T(0), beta = T(1);
      float most = 0;
      // Linked: x past the core is x_next, the next window's x at its first row (this lane's own
      // there is x_first), not 0 past a look-ahead.
      T x_first = T(0), x_next = T(0);
      bool linked = false;  // (uniform)
      bool bad = false;  // a pivot vanished, a |c'| is over 1 or x is not finite
      int failed = 0;    // kFail* (uniform)
      int rel = 0;                          // next row to sweep (relative, uniform)
      int fend = min(H + kOut, core_end);   // end of the chunk being swept
      int fchunk = 0;                       // its index
      int out = H;                          // the chunk to store next: index ochunk
      int ochunk = 0;
      const T tau = T(w.tau);
      // The left end's bound (windows past a system's first): P = prod |a_i / den_i| from lo,
      // at least p_floor; its sum over the core's rows swept; a core |c'| over 1.
      // (2^-(digits + 40) as a constant: std::ldexp was evaluated on the device, in a task.)
      constexpr T p_floor = sizeof(T) == 8 ? T(0x1p-93) : T(0x1p-64);
      static_assert(std::numeric_limits<T>::digits + 40 == (sizeof(T) == 8 ? 93 : 64));
      T left_p = T(1), left_sum = T(0);
      bool c_big = false;
      T* xs = x + s;  // (interleaved: flat chunks go out by bulk stores)
      [[maybe_unused]] const int64_t xstride = kRev ? -p.batch : p.batch;
      // Rows along the sweep are in memory order forward, reversed backward: a copy's row i is
      // row ri(i) of its box, and a is c.
      const int qa = kRev ? 2 : 0, qc = 2 - qa;
      auto ri = [&](int i) { return kRev ? kStageRows - 1 - i : i; };
      while (out < core_end) {
        // Row k goes to ring slot (k - H) % kRing, over row k - kRing: that must be stored.
        if (rel >= read_end || rel + kStageRows > out + kRing) {
          failed = kFailLookAhead;
          break;
        }
        const int slot = int(used % kStages);
        BarWait(&sm.bar[slot], (used / kStages) & 1);
        const int row = lo + rel;  // this lane's row at the copy's first
        // P along the halo, while well over its floor, for HaloNeeded (the halo is whole
        // copies).
        if (rel <= H && left_p >= T(0x1p-80)) {
          sm.halo_p[lane] = float(left_p);
          sm.halo_rows[lane] = rel;
        }
        const bool core_rows = rel >= H;
        const int base = (rel - H) & (kRing - 1);
        T av[kStageRows], bv[kStageRows], cv[kStageRows], dv[kStageRows];
        if constexpr (kFlat) {
          // The lane's 64-byte row of each box as its four 16-byte units, then in sweep order.
          T box[4][kStageRows];
#pragma unroll
          for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int u = 0; u < 4; ++u)
              Unpack(*reinterpret_cast<const V*>(&sm.raw[slot][q][wl][0][0] + unit_at[u]),
                     &box[q][u * kUnit]);
#pragma unroll
          for (int i = 0; i < kStageRows; ++i) {
            av[i] = box[qa][ri(i)];
            bv[i] = box[1][ri(i)];
            cv[i] = box[qc][ri(i)];
            dv[i] = box[3][ri(i)];
          }
        } else {
#pragma unroll
          for (int i = 0; i < kStageRows; ++i) {
            av[i] = sm.raw[slot][qa][wl][ri(i)][sl];
            bv[i] = sm.raw[slot][1][wl][ri(i)][sl];
            cv[i] = sm.raw[slot][qc][wl][ri(i)][sl];
            dv[i] = sm.raw[slot][3][wl][ri(i)][sl];
          }
        }
        // The rows of the copy: kEdge where a lane's may be before row 1 or past row n - 2 or
        // start the window (each row then tested), else all plain; kCore where they are the
        // core's (the chunk's map), kCheck where the task has windows past a system's first
        // (the left end's bound).
        auto sweep = [&](auto edge, auto in_core, auto check) {
          constexpr bool kEdge = decltype(edge)::value, kCore = decltype(in_core)::value,
                         kCheck = decltype(check)::value;
#pragma unroll
          for (int i = 0; i < kStageRows; ++i) {
            T a = av[i], b = bv[i], c = cv[i], d = dv[i];
            T a_in = a;  // the row's coupling to the row before, the dropped one's included
            bool valid = true;
            if constexpr (kEdge) {
              const int k = row + i;
              const bool before = k < 0;
              valid = !before && k < n;
              // Rows before row 0: c' = d' = 0 after them, as a sweep from row 0.
              b = before ? T(1) : b;
              c = before || k == n - 1 ? T(0) : c;  // c[n - 1]: unused by definition
              d = before ? T(0) : d;
              a_in = k <= 0 || !valid ? T(0) : a;  // a[0]: unused by definition
              if (k <= 0 || rel + i == 0) a = T(0);  // a[0], or the coupling dropped
            }
            const T ac = a * cp;
            const T den = b - ac;
            // A vanished pivot, or the certificate failing (partitioned.cuh's
            // kFlagNotDominant, in this sweep's terms): |den| < |c|, a |c'| over 1 (a NaN
            // fails too). Every row dominant keeps |c'| <= 1, and |c'| <= 1 on every row
            // bounds each row sum of |L||U| by 3 times that of |A| (the factors' entries are
            // a, a c' + den and c, with |den| <= |b| + |a c'|): Thomas' answer is then normwise
            // backward stable. Judged as a vanished pivot: thomas-window runs under `auto` and
            // `pivoting` only, which solve a flagged system again by the pivoting sweep; in a
            // window past a system's first the problem goes to the exact path, which flags it.
            // One compare more, in Vanishes' predicate (bitwise: branches cost the unrolled
            // sweep registers).
            {
              const T m = fabs(den);
              bad |= valid & !((m > Eps<T>() * (fabs(b) + fabs(ac))) & (m <= MaxFinite<T>()) &
                               (m >= fabs(c)));
            }
            const T rr = Rcp(den);
            cp = c * rr;
            dp = (d - a * dp) * rr;
            sm.ring[base + i][0][lane] = cp;
            sm.ring[base + i][1][lane] = dp;
            if constexpr (kCheck) {
              if constexpr (sizeof(T) == 8)
                left_p = __fma_ru(left_p, __dmul_ru(fabs(a_in), fabs(rr)), p_floor);
              else
                left_p = __fmaf_ru(left_p, __fmul_ru(fabsf(a_in), fabsf(rr)), p_floor);
              if (kCore && valid) {
                if constexpr (sizeof(T) == 8)
                  left_sum = __dadd_ru(left_sum, left_p);
                else
                  left_sum = __fadd_ru(left_sum, left_p);
                c_big |= !(fabs(cp) <= T(1));
              }
            }
            if (kCore && valid) {
              alpha = fma(beta, dp, alpha);
              beta *= -cp;
              // An upper bound in float (rounded up): it is compared with tau only.
              float m;
              if constexpr (sizeof(T) == 8)
                m = __double2float_ru(fabs(cp));
              else
                m = fabsf(cp);
              most = __fmul_ru(m, fmaxf(most, 1.0f));
            }
          }
        };
        using Yes = std::true_type;
        using No = std::false_type;
        const bool edge = !__all_sync(~0u, row >= 1 && row + kStageRows <= n - 1) || rel == 0;
        if (edge)
          core_rows ? sweep(Yes(), Yes(), Yes()) : sweep(Yes(), No(), Yes());
        else if (!past_first)  // whole systems or the first windows alone: no checks
          sweep(No(), Yes(), No());
        else
          core_rows ? sweep(No(), Yes(), Yes()) : sweep(No(), No(), Yes());
        FenceProxyAsync();  // the slot's reads before the copy engine's next writes into it
        __syncwarp();
        ++used;
        rel += kStageRows;
        issue();
        if (rel >= fend) {  // the chunk is swept (chunks end with a copy): keep its map
          const int q = fchunk % kSnaps;
          sm.map[q][0][lane] = alpha;
          sm.map[q][1][lane] = beta;
          sm.most[q][lane] = most;
          alpha = T(0);
          beta = T(1);
          most = 0;
          ++fchunk;
          fend = fend < core_end ? min(fend + kOut, core_end) : INT_MAX;
        }
        // The cores swept: x past each lane's core is the next window's x at its first row,
        // stored with that window's first chunk (the chain: in the next lane; else, and for
        // the chain's last lane, by another task, each of which counts its first chunk into
        // fail[3] once it is in memory; not waited for), exact but for that x's own error (the
        // windows' bounds, 2 tau max |x| at most: a failed window fails the launch); the last
        // rows then need no look-ahead, where every unstored chunk's factor on it is at most 1.
        // Where a lane lacks it, or a factor is over 1, the look-ahead goes on as elsewhere.
        if (link && rel == core_end) {  // (the first chunks are stored: the ring is shorter)
          x_next = __shfl_down_sync(~0u, x_first, 1);
          bool have = true;
          if (c1m >= n) {
            x_next = T(0);  // (the system's last window: c'[n - 1] = 0)
          } else if (live && !(w.chain && lane < kLanes - 1)) {
            have = AcquireLoad(&w.fail[3]) >= w.tasks;
            if (have) x_next = RelaxedLoad(x + (w.chain ? 0 : s * int64_t(n)) + c1m);
          }
          linked = __all_sync(~0u, !live || have) && ochunk > 0;
          if (!linked) {
            issue_end = read_end;
            issue();
          }
        }
        // Store each swept chunk whose look-ahead now suffices in every system of the warp:
        // x past it from the chunks after it (x[row] taken as 0), and the bound of the error
        // that makes at its rows, most * prod |beta| of the chunks after it (linked: x past
        // the core x_next, and that product at most 1).
        while (ochunk < fchunk) {
          T xn = linked ? x_next : alpha, bound = fabs(beta);
          for (int m = fchunk - 1; m > ochunk; --m) {
            const int q = m % kSnaps;
            xn = fma(sm.map[q][1][lane], xn, sm.map[q][0][lane]);
            bound *= fabs(sm.map[q][1][lane]);
          }
          bound *= sm.most[ochunk % kSnaps][lane];
          const bool enough = !live || bad || lo + rel >= n || bound <= (linked ? T(1) : tau);
          if (!__all_sync(~0u, enough)) {
            if (!linked) break;
            linked = false;  // (the look-ahead, from the chunk not stored)
            issue_end = read_end;
            issue();
            continue;
          }
          const int count = min(kOut, c1 - (lo + out));  // this lane's rows (<= 0 past its core)
          const int k0 = (out - H) & (kRing - 1);       // (chunks do not wrap the ring)
          T cs[kOut], ds[kOut];
#pragma unroll
          for (int i = 0; i < kOut; ++i) {
            cs[i] = sm.ring[k0 + i][0][lane];
            ds[i] = sm.ring[k0 + i][1][lane];
          }
          [[maybe_unused]] T* xo = xs + int64_t(kRev ? n - 1 - (lo + out) : lo + out) * p.batch;
          if constexpr (kFlat) {
            // The last chunk's store has read xout (one lane issued it).
            if (lane == 0) BulkWaitRead();
            __syncwarp();
          }
          // x from the chunk's last row down. A non-finite x carries down to the chunk's first
          // row (x_k = d'_k - c'_k x_k+1: inf - inf, 0 inf and NaN are all NaN), so that row's
          // test stands for the chunk's. Flat: x in 64-byte rows, swizzled (float64: two boxes
          // of 8 rows), as the copies' boxes are.
          constexpr int kRows = 64 / sizeof(T);
          auto x_at = [&](int i) -> T& {  // (a chunk row's place in the staging)
            return (&sm.xout[wl][i / kRows][0][0])[at(kRev ? kRows - 1 - i % kRows : i % kRows)];
          };
          if (__all_sync(~0u, count >= kOut)) {  // whole chunks: no row tests
#pragma unroll
            for (int i = kOut - 1; i >= 0; --i) ds[i] = xn = ds[i] - cs[i] * xn;
            bad |= !Finite(xn);
            if constexpr (kFlat) {
#pragma unroll
              for (int h = 0; h < kOut / kRows; ++h)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                  T unit[kUnit];
#pragma unroll
                  for (int e = 0; e < kUnit; ++e) {
                    const int r = u * kUnit + e;  // its row in the box
                    unit[e] = ds[h * kRows + (kRev ? kRows - 1 - r : r)];
                  }
                  *reinterpret_cast<V*>(&sm.xout[wl][h][0][0] + unit_at[u]) = Pack(unit);
                }
            } else if (live) {
#pragma unroll
              for (int i = 0; i < kOut; ++i) xo[i * xstride] = ds[i];
            }
          } else {
#pragma unroll
            for (int i = kOut - 1; i >= 0; --i) {
              if (i < count) {
                xn = ds[i] - cs[i] * xn;
                if constexpr (kFlat)
                  x_at(i) = xn;
                else if (live)
                  xo[i * xstride] = xn;
              }
            }
            if (count > 0) bad |= !Finite(xn);
          }
          if (ochunk == 0) x_first = xn;  // (x at the chunk's first row, the core's)
          if constexpr (kFlat) {
            FenceProxyAsync();  // the lanes' writes before the copy engine's reads
            __syncwarp();
            if (lane == 0) {
              constexpr int kRows = 64 / sizeof(T), kHalves = kOut / kRows;
              for (int b = 0; b < boxes; ++b)
#pragma unroll
                for (int h = 0; h < kHalves; ++h) {
                  const int v = out - H + h * kRows;  // from the core's start along the sweep
                  if (w.chain) {  // (core rows: this window's)
                    BulkStore2D(&mp.x, kRev ? core - kRows - v : v, coord + w0,
                                &sm.xout[b][h][0][0]);
                  } else {
                    const int jb = w0 + step * b;
                    const int r = (kRev ? n - min(n, (jb + 1) * core) : jb * core) + v;
                    BulkStore2D(&maps.x, kRev ? n - kRows - r : r, int(g * kSys),
                                &sm.xout[b][h][0][0]);
                  }
                }
              BulkCommit();
              // The first chunk in memory: count it (linked; a task of one chunk at once).
              if (link && (ochunk == 1 || (ochunk == 0 && out + kOut >= core_end))) {
                if (ochunk == 1)
                  BulkWaitAllButLast();
                else
                  BulkWaitAll();
                FenceProxyAsyncGlobal();
                __threadfence();
                atomicAdd(&w.fail[3], 1);
              }
            }
          }
          out += min(kOut, core_end - out);
          ++ochunk;
        }
      }
      // Copies issued past what the window used: wait for them before the slots are reused.
      for (; used < issued; ++used) BarWait(&sm.bar[used % kStages], (used / kStages) & 1);
      if constexpr (kFlat)
        if (lane == 0) BulkWaitAll();  // x stored before the flags and the next task
      __syncwarp();
      // A window past a system's first: a pivot, x or a core |c'| out of bounds fails the
      // problem, a left end's bound over tau (at the last store, the largest) its halo.
      // (A backward sweep's pivots are not the reference's: its failures go to the exact path.)
      if (!failed && __any_sync(~0u, live && ((!exact && bad) || (!first && c_big))))
        failed = kFailRows;
      if (!failed && __any_sync(~0u, live && !first && !(left_sum <= tau))) failed = kFailHalo;
      // The halo the windows needed, where they swept to their ends.
      if (past_first && (!failed || failed == kFailHalo)) {
        const int need =
            __reduce_max_sync(~0u, live && !first ? HaloNeeded(sm.halo_p[lane], sm.halo_rows[lane],
                                                                 left_sum, tau, H)
                                                      : 0);
        if (lane == 0 && need > 0) atomicMax(&w.fail[1], need);
      }
      if (failed) {
        if (lane == 0) atomicMax(w.fail, failed);
        return true;
      }
      if (live && bad) flags[s] = 1;
      return false;
    };
    if (rev ? task(std::true_type()) : task(std::false_type())) break;
  }
  if (lane == 0) PublishAnswer(w.fail, w.answer);
}

}  // namespace
}  // namespace trisolve::cuda
