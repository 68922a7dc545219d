// Batched tridiagonal systems by Thomas' algorithm, one thread a system (or a window of one),
// the rows streamed through shared memory by the copy engine and x stored by a look-ahead back
// substitution: "thomas-window" (tridiagonal_cuda.h says when it runs). Made for the
// interleaved layout; the flat layout and one large system take the same warps (below).
//
// Why: the interleaved layout puts row k of 32 consecutive systems in 256 contiguous bytes
// (float64), so a warp of threads, one a system, reads every row coalesced -- the layout
// cuThomasBatch was made for. What cuThomasBatch cannot do is keep the forward sweep's c' and d'
// on chip: it writes them and reads them back (9 arrays of traffic, not 5). Here they stay in a
// ring of shared memory, and rows are stored before the forward sweep reaches the end of the
// system: chunk [out, out + 16) is substituted back from the forward sweep's front f with
// x[f + 1] taken as 0. The error that makes is exact to write down: x_k = d'_k - c'_k x_{k+1}
// carries it back multiplied by -c'_i a row, so at row k it is prod_{i=k..f} c'_i times
// x[f + 1]. The kernel carries that product (a bound of it, per chunk) along the sweep and
// stores a chunk once it is under 2^-(digits + 2) for every row of it in every system of the
// warp: bounded by
// the unit roundoff times max |x|, the accuracy of the overlapping windows (windows.h). It is
// measured, not assumed: diagonally dominant rows (|c'| <= rho) need about (digits + 2) /
// log2(1 / rho) rows of look-ahead, the benchmark's random rows ~32, an implicit diffusion step
// with r = D dt / dx^2 = 1 ~40 and r = 10 ~120. A chunk that needs more than the ring holds (48
// rows) runs the problem again with a longer ring (112), and past that by the exact paths.
//
// The left end is exact: the sweep starts at row 0 of the system. Where the batch has too few
// groups of 32 systems to fill the GPU, each system is also cut into windows (windows.h's plan:
// cores tiling the system, `halo` rows read before each core but the first); a window past the
// first starts its sweep `halo` rows early with the coupling a[lo] x[lo - 1] before it dropped.
// That error is bounded a posteriori too. The window solves the rows [lo, f] it has swept, so
// its x differs from the true one by A_[lo,f]^-1 (a[lo] x[lo - 1] e_lo + c[f] x[f + 1] e_f):
// the second term is the look-ahead's above; the first is x[lo - 1] times a[lo] z, z the first
// column of A_[lo,f]^-1, which Thomas on e_lo gives: its forward values are g_m with
// |a[lo] g_m| = P_m = prod_{i = lo..m} |a_i / den_i|, and z_k = g_k - c'_k z_{k+1}, so
// |a[lo] z_k| <= sum_{m = k..f} P_m prod_{i = k..m-1} |c'_i| <= sum_{m = c0..f} P_m for a core
// row k >= c0 where every |c'| of [c0, f] is at most 1. The kernel carries P (rounded up, never
// below 2^-(digits + 40) so that it cannot underflow) and that sum along the sweep, and a
// window whose sum at its last store exceeds 2^-(digits + 2) fails: the two ends together stay
// under the unit roundoff times max |x|, the windows' accuracy (windows.h), whatever the rows'
// dominance. The halo is measured, not assumed: the benchmark's rows need ~30 rows, a diffusion
// step with r = 1 ~40 and r = 10 ~120 in float64; windows start with a halo of 32 rows, each
// measures the halo it needed (HaloNeeded), and the problem runs again with that measure (at
// most 256 rows) where one was too short; a window with a |c'| over 1 in its core goes to the
// exact path.
//
// A batch of fewer than 32 systems (2^20 x 16) would leave lanes idle: there a warp sweeps two
// windows of 16 systems (or four of 8) side by side, each lane counting rows from its window's
// start so that the warp's rows, copies and chunks stay in step.
//
// The flat layout (float64 n > 8192, NOTES.md t36-t37) takes the same warps: a copy holds each
// system's rows as one 64-byte row, swizzled, and x goes back through shared memory and bulk
// tensor stores (a lane storing its own system's rows touched 32 lines an instruction). One
// system (n >= 2^24, t38) is a chain of windows, the lanes 32 consecutive ones: the maps view
// the arrays as (windows x core), so a copy is one box, the halo one window back and the
// look-ahead one on. The cores are as short as the warps that run at once allow, in two parts
// of equal cores where n needs them (PlanChain, t50: 2^24 as 15,872 windows of 992 rows and
// 1,024 of 1008, 528 warps, where windows of 1024 left 16 of the H100's 528 idle). A chain's
// windows are linked (t51): a window's x at its first row, stored early in its sweep, is the
// x past the window before's core, so that window's last rows are substituted back from it
// once its core is swept, where elsewhere the sweep goes on ~40 rows into the next core (read
// from DRAM a second time) for the look-ahead; the next lane gives it by a shuffle, the next
// task (the warp's last lane) through memory, once every task has counted its first chunk
// stored (not waited for: a warp without it looks ahead as before). Flat batches' windows are
// linked the same way, every lane through memory (t52).
//
// Mirrored windows (interleaved, t39): every window reads rows that a neighbour reads too (its
// halo, its look-ahead), at the other end of that neighbour's sweep, so from DRAM twice. Where
// the cores are whole the odd windows sweep the system reversed (row r is row n - 1 - r, a and
// c exchanged): neighbours then read their shared rows near the same time, at both starts or
// both ends, and the second read comes from the L2.
//
// Per system, as the CPU reference does: a vanishing pivot or a non-finite x flags the system
// (the caller zeroes its x), but in a window past the first, where it fails the problem.
//
// Where the time goes (H100, Nsight Compute, NOTES.md t34): a warp spends ~400 cycles a row
// alone on an SM, issuing one instruction every ~3.5 cycles (dependent float64 chains, one warp
// a scheduler); so rows whose lanes need no edge tests (before row 1, past row n - 2, the
// window's first) take a path without them. With four warps an SM the bytes then hold DRAM
// near the copy rate: 2^24 unknowns in 1024-row systems at 90% of it; systems cut into windows
// read their halos again, 25% more rows with halos of 256 (75%), 6% with 64 (83%, t35).
// A task's direction is a template constant, a flat copy's rows come as 16-byte units and a
// whole chunk is stored without row tests (t44: 114 -> 75 warp instructions a row, flat 16384 x
// 1024); the flat kernel then waits for its copies a third of the time, DRAM 2.7 TB/s busy.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>

#include "bulk_copy.cuh"
#include "check.h"
#include "launch.h"
#include "numerics.cuh"
#include "pinned_word.h"
#include "tridiagonal_cuda.h"
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
template <typename T, int kRing, int kSys, int kStages, bool kFlat>
__global__ void __launch_bounds__(kLanes)
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
      bool bad = false;  // a pivot vanished or x is not finite
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
            bad |= valid && Vanishes(den, fabs(b) + fabs(ac));
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

// `every`: a box takes every other system (the chain's mirrored tasks: even or odd windows).
template <typename T>
bool EncodeMaps(const TridiagonalProblem<T>& p, T* x, int sys, int every, Maps& maps) {
  const auto encode = TensorMapEncoder();
  if (!encode) return false;
  const T* arrays[4] = {p.a, p.b, p.c, p.d};
  for (int q = 0; q < 4; ++q) {
    const bool flat = p.layout == Layout::kFlat;
    const cuuint64_t dims[2] = {cuuint64_t(flat ? p.n : p.batch), cuuint64_t(flat ? p.batch : p.n)};
    const cuuint64_t strides[1] = {cuuint64_t(flat ? p.n : p.batch) * sizeof(T)};
    const cuuint32_t box[2] = {flat ? StageRows<T>() : cuuint32_t(sys),
                               flat ? cuuint32_t(sys * every) : StageRows<T>()};
    const cuuint32_t elem[2] = {1, cuuint32_t(flat ? every : 1)};
    if (encode(&maps.m[q],
               sizeof(T) == 8 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT64 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
               2, const_cast<T*>(arrays[q]), dims, strides, box, elem,
               CU_TENSOR_MAP_INTERLEAVE_NONE,
               flat ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  if (p.layout == Layout::kFlat) {
    const cuuint64_t dims[2] = {cuuint64_t(p.n), cuuint64_t(p.batch)};
    const cuuint64_t strides[1] = {cuuint64_t(p.n) * sizeof(T)};
    const cuuint32_t box[2] = {cuuint32_t(64 / sizeof(T)), cuuint32_t(sys * every)};
    const cuuint32_t elem[2] = {1, cuuint32_t(every)};
    if (encode(&maps.x,
               sizeof(T) == 8 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT64 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
               2, x, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_64B,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// The chain's maps of one part: the rows from `from` viewed as `count` windows of `core` rows.
template <typename T>
bool EncodeChainMaps(const TridiagonalProblem<T>& p, T* x, int64_t from, int64_t core,
                     int64_t count, int every, Maps& maps) {
  TridiagonalProblem<T> view = p;
  view.layout = Layout::kFlat;
  view.batch = count;
  view.n = core;
  view.a = p.a + from;
  view.b = p.b + from;
  view.c = p.c + from;
  view.d = p.d + from;
  return EncodeMaps(view, x + from, kLanes, every, maps);
}

std::atomic<int64_t> g_launches{0};   // ThomasWindowLaunches
std::atomic<int64_t> g_last_halo{0};  // ThomasWindowLastHalo

// One launch with a ring of kRing rows: kInWord (the answer, 0 or kFail*, comes in the word
// once the kernel is done), or an answer known without launching.
constexpr int kInWord = -1;
template <typename T, int kRing, int kSys, int kStages, bool kFlat>
absl::StatusOr<int> LaunchThomasWindow(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                       const Maps& maps, int64_t windows, int64_t halo,
                                       bool mirror, const PinnedWord& word, cudaStream_t stream) {
  constexpr int kPer = kLanes / kSys;
  Maps chain1{}, chain2{};  // one system: its parts' maps (PlanChain)
  auto kernel = ThomasWindowKernel<T, kRing, kSys, kStages, kFlat>;
  const size_t smem = sizeof(Smem<T, kRing, kSys, kStages, kFlat>) + 512;
  // The shared-memory attribute and the blocks that run at once: asked once a device.
  static PerDevice asked;
  const absl::StatusOr<int64_t> resident = asked.Get([&] {
    LaunchConfig launch(0, kLanes, smem, nullptr);
    return ResidentGroups(kernel, launch);
  });
  if (!resident.ok()) return resident.status();
  if (*resident < 1) return kFailRows;
  halo = (halo + StageRows<T>() - 1) / StageRows<T>() * StageRows<T>();
  Args args;
  args.plan.halo = halo;
  if (kFlat && p.batch == 1) {  // one system: its windows the lanes' (the chain)
    // Mirrored: one part (its maps take every other window).
    const ChainPlan plan = PlanChain(p.n, *resident, kSys, kOut, kChainMinCore, mirror);
    // (A halo reaches one window back only.)
    if (plan.parts == 0 || halo > plan.part[0].core) return kFailRows;
    const ChainPart &one = plan.part[0], &two = plan.part[1];
    args.chain = true;
    args.plan.core = one.core;
    args.plan.per_system = one.windows;
    args.mirror = mirror;
    args.tasks1 = INT64_MAX;  // (one part: every task the first's)
    if (mirror) {
      args.tasks = 2 * ((one.windows + 2 * kSys - 1) / (2 * kSys));
      if (!EncodeChainMaps(p, x, 0, one.core, one.windows, 2, chain1))
        return kFailRows;  // (the exact path)
    } else if (plan.parts == 1) {
      args.tasks = plan.tasks;
      if (!EncodeChainMaps(p, x, 0, one.core, one.windows, 1, chain1))
        return kFailRows;  // (the exact path)
    } else {
      // The first part's view ends a window late (the second's first rows), the second's
      // starts a window early (the first's last rows).
      args.tasks = plan.tasks;
      args.tasks1 = one.windows / kSys;
      args.start2 = int(two.start);
      args.core2 = int(two.core);
      args.wins2 = int(two.windows);
      if (!EncodeChainMaps(p, x, 0, one.core, one.windows + 1, 1, chain1) ||
          !EncodeChainMaps(p, x, two.start - two.core, two.core, two.windows + 1, 1, chain2))
        return kFailRows;  // (the exact path)
    }
  } else {
    // Windows a system: enough tasks (kPer windows of a group) for the blocks that run at once
    // in one wave (a second one for a few tasks costs a whole task's time), cores of 4 halos
    // or more.
    const int64_t groups = (p.batch + kSys - 1) / kSys;
    if (windows <= 0) windows = groups * kPer >= *resident ? 1 : *resident / groups * kPer;
    windows = std::max<int64_t>(1, std::min(windows, p.n / (4 * halo)));
    args.plan.core = (p.n + windows - 1) / windows;
    args.plan.core = (args.plan.core + kOut - 1) / kOut * kOut;
    // Mirrored: whole cores, a divisor of n up to a quarter longer (2^20: 1008 -> 1024 rows).
    int64_t whole = 0;
    for (int64_t c = args.plan.core; mirror && c <= args.plan.core * 5 / 4 && !whole; c += kOut)
      if (p.n % c == 0) whole = c;
    if (whole) args.plan.core = whole;
    args.plan.per_system = (p.n + args.plan.core - 1) / args.plan.core;
    const int64_t wins = args.plan.per_system;
    args.mirror = whole && wins >= 2;
    args.tasks = groups * (args.mirror ? 2 * (((wins + 1) / 2 + kPer - 1) / kPer)
                                       : (wins + kPer - 1) / kPer);
  }
  args.tau = std::ldexp(1.0, -(std::numeric_limits<T>::digits + 2));
  // The kernel counts its answer into the word's scratch and its last block writes it into the
  // host word: no device word to clear before the launch, no copy after it.
  args.fail = word.scratch();
  args.answer = word.mapped();
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (args.plan.per_system > 1) g_last_halo.store(halo, std::memory_order_relaxed);
  kernel<<<unsigned(std::min(args.tasks, *resident)), kLanes, smem, stream>>>(
      p, x, flags, args.chain ? chain1 : maps, chain2, args);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return kInWord;
}

// Systems a box: whole warps of systems where the batch has 32 or more, else two windows of
// 16 systems a warp (or four of 8); one (flat) system: 32 of its windows (the chain).
template <typename T>
int SystemsABox(const TridiagonalProblem<T>& p) {
  return p.batch >= 32 || p.batch == 1 ? 32 : p.batch >= 16 ? 16 : 8;
}

template <typename T, int kRing, int kStages, bool kFlat>
absl::StatusOr<int> LaunchBySystems(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                    const Maps& maps, int64_t windows, int64_t halo, bool mirror,
                                    const PinnedWord& word, cudaStream_t stream) {
  switch (SystemsABox(p)) {
    case 32:
      return LaunchThomasWindow<T, kRing, 32, kStages, kFlat>(p, x, flags, maps, windows, halo,
                                                              mirror, word, stream);
    case 16:
      return LaunchThomasWindow<T, kRing, 16, kStages, kFlat>(p, x, flags, maps, windows, halo,
                                                              mirror, word, stream);
    default:
      return LaunchThomasWindow<T, kRing, 8, kStages, kFlat>(p, x, flags, maps, windows, halo,
                                                             mirror, word, stream);
  }
}

// Copies in flight a warp: float64 2 (4 cost a block an SM: 1024 x 16384 0.251 -> 0.470 ms),
// float32 2 by default, or 1 or 4 (H100, 2^24 unknowns, 1024 / 4096 / 2^20 x 16: 2 copies
// 0.147 / 0.176 / 0.188 ms, 4 0.150 / 0.185 / 0.192, 1 0.156 / 0.187 / 0.194).
template <typename T, int kRing>
absl::StatusOr<int> LaunchByStages(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                   const Maps& maps, int64_t windows, int64_t halo, int stages,
                                   bool mirror, const PinnedWord& word, cudaStream_t stream) {
  if (p.layout == Layout::kFlat)  // (two copies in flight only)
    return LaunchBySystems<T, kRing, 2, true>(p, x, flags, maps, windows, halo, mirror, word,
                                                    stream);
  if constexpr (sizeof(T) == 4) {
    if (stages == 1)
      return LaunchBySystems<T, kRing, 1, false>(p, x, flags, maps, windows, halo, mirror, word,
                                                  stream);
    if (stages == 4)
      return LaunchBySystems<T, kRing, 4, false>(p, x, flags, maps, windows, halo, mirror, word,
                                                  stream);
  }
  return LaunchBySystems<T, kRing, 2, false>(p, x, flags, maps, windows, halo, mirror, word,
                                              stream);
}

// Where a shape's last solve started and succeeded: the ring, mirrored or forward, and the
// halo (the shorter one its windows measured, if so). A time-stepping caller solves the same
// shape with rows alike at every step, so the launches that failed at its first solve (up to
// three: a halo, a ring, the mirror) need not be paid at every step. A launch from the
// remembered start that fails goes on from there as a first solve would (and is forgotten if
// it ends on the exact path); every kFresh-th solve of a shape starts with the short ring and
// mirrored again, so that rows that became easier get them back (the halo follows the
// windows' measure at every solve).
struct Start {
  bool long_ring = false;
  int64_t halo = 0;
  bool mirror = false;
};
class StartMemory {
 public:
  static constexpr int kFresh = 64;
  static constexpr size_t kShapes = 8;
  struct Shape {
    int bytes;  // sizeof(T)
    int64_t n, batch;
    Layout layout;
    int64_t windows, halo;
    int stages, mirror;
    bool operator==(const Shape& o) const {
      return bytes == o.bytes && n == o.n && batch == o.batch && layout == o.layout &&
             windows == o.windows && halo == o.halo && stages == o.stages && mirror == o.mirror;
    }
  };
  // The remembered start (a fresh turn: its halo alone), unless none.
  std::optional<Start> Find(const Shape& k) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = Locate(k);
    if (it == entries_.end()) return std::nullopt;
    entries_.splice(entries_.begin(), entries_, it);  // most recent first (as the backend's plans)
    if (++it->solves % kFresh == 0) return Start{false, it->start.halo, true};
    return it->start;
  }
  // A solve of k succeeded from `s` (or, !ok, went to the exact path: forgotten).
  void Keep(const Shape& k, const Start& s, bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = Locate(k);
    if (!ok) {
      if (it != entries_.end()) entries_.erase(it);
      return;
    }
    if (it != entries_.end()) {
      it->start = s;
      return;
    }
    entries_.push_front(Entry{k, s, 0});
    if (entries_.size() > kShapes) entries_.pop_back();
  }

 private:
  struct Entry {
    Shape shape;
    Start start;
    int64_t solves;
  };
  std::list<Entry>::iterator Locate(const Shape& k) {
    return std::find_if(entries_.begin(), entries_.end(),
                        [&](const Entry& e) { return e.shape == k; });
  }
  std::mutex mu_;
  std::list<Entry> entries_;
};
StartMemory g_starts;

}  // namespace

int64_t ThomasWindowLaunches() { return g_launches.load(std::memory_order_relaxed); }
int64_t ThomasWindowLastHalo() { return g_last_halo.load(std::memory_order_relaxed); }

bool ThomasWindowApplies(int64_t n, int64_t batch, Layout layout, bool float32) {
  // The copies' row stride, whole 16-byte words: a row of the batch (interleaved), a system
  // (flat).
  const int64_t word = float32 ? 4 : 2;
  const bool strides = layout == Layout::kInterleaved && batch > 1 ? batch % word == 0
                                                                   : n % word == 0;
  // One system (either layout): a warp's 32 windows of kChainMinCore rows at least, cores of
  // whole chunks (where PlanChain has a plan: the one window a lane, at worst).
  const bool chain = batch == 1 && n % kOut == 0 && n >= kLanes * kChainMinCore;
  return (batch >= 2 || chain) && strides && n >= 1 && n < (int64_t(1) << 31) - kLongRing &&
         ClustersAvailable() && TensorMapEncoder() != nullptr;
}

// The halo to launch with for a measured need: an eighth and a copy over it (the rows of a
// time step's next solve are alike, not the same), whole copies, 16 to 256 rows.
template <typename T>
int64_t FitHalo(int need) {
  const int64_t k = int64_t(need) + need / 8 + StageRows<T>();
  return std::clamp<int64_t>((k + StageRows<T>() - 1) / StageRows<T>() * StageRows<T>(), 16,
                             kLongHalo);
}

// A thomas-window solve from its first launch to its answer: what a launch again (a longer
// halo or ring, forward only) needs, and the pinned word the launches answer in.
template <typename T>
struct WindowRun {
  TridiagonalProblem<T> p;
  T* x = nullptr;
  uint8_t* flags = nullptr;
  cudaStream_t stream = nullptr;
  int64_t windows = 0, halo = 0;  // the caller's (0: by shape, the default halo)
  int stages = 0;
  StartMemory::Shape shape{};
  bool long_ring = false;
  int64_t h = 0;  // the halo of the next launch
  bool mirror = false;
  Maps maps{};  // (a batch's: one system's chain maps its own at each launch)
  PinnedWord word;
  bool unread = false;  // a launch whose answer is not read yet (the word is the kernel's)

  WindowRun() = default;
  WindowRun(const WindowRun&) = delete;
  WindowRun& operator=(const WindowRun&) = delete;
  // Unfinished: the kernel may still write the word and count in its scratch, which go back
  // to be taken by other launches.
  ~WindowRun() {
    if (unread) (void)cudaStreamSynchronize(stream);
  }

  // Queues a launch from the current start; an answer known without launching comes back.
  absl::StatusOr<int> Launch() {
    absl::StatusOr<int> a =
        long_ring ? LaunchByStages<T, kLongRing>(p, x, flags, maps, windows, h, stages, mirror,
                                                  word, stream)
                  : LaunchByStages<T, kShortRing>(p, x, flags, maps, windows, h, stages, mirror,
                                                   word, stream);
    unread = a.ok() && *a == kInWord;
    return a;
  }

  // From a launch's answer (kInWord: in the word, after the kernel) to the problem's: true
  // where thomas-window solved it, false where the exact path must (the flags cleared).
  // *again: a launch after the first rewrote x and the flags.
  // A ring of 64 rows first; a longer ring where the look-ahead ran out, a longer halo (the
  // one the windows measured) where a halo was too short for the left end's bound (unless the
  // caller set it). Mirrored windows that fail past those run once more forward only: a
  // backward window sees the rows transposed (its look-ahead fades with a, its left end with
  // c), which rows far from symmetric may not allow where the forward windows do.
  absl::StatusOr<bool> Answer(int answer, bool* again) {
    int64_t next_h = h;  // the halo a shape's next solve starts with
    for (;;) {
      int need = 0;  // the halo the windows measured (0: none past a system's first ran)
      if (answer == kInWord) {
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        unread = false;
        answer = static_cast<volatile int*>(word.get())[0];
        need = static_cast<volatile int*>(word.get())[1];
      }
      const bool ring_again = answer == kFailLookAhead && !long_ring;
      const bool halo_again = answer == kFailHalo && halo <= 0 && h < kLongHalo;
      next_h = answer == 0 && halo <= 0 && need > 0 ? std::min(h, FitHalo<T>(need)) : h;
      if (answer == 0 || (!ring_again && !halo_again && !mirror)) break;
      if (!ring_again && !halo_again) mirror = false;
      long_ring |= ring_again;
      if (halo_again) h = std::min(kLongHalo, std::max(h + StageRows<T>(), FitHalo<T>(need)));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(p.batch), stream));
      *again = true;
      absl::StatusOr<int> a = Launch();
      if (!a.ok()) return a.status();
      answer = *a;
    }
    g_starts.Keep(shape, Start{long_ring, next_h, mirror}, answer == 0);
    if (answer == 0) return true;
    // Systems flagged before the failure: the exact path decides again.
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(p.batch), stream));
    *again = true;
    return false;
  }
};

template <typename T>
absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<T>& in, T* x, uint8_t* flags,
                                         cudaStream_t stream, int64_t windows, int64_t halo,
                                         int stages, int mirror_by, ThomasWindowRest* rest) {
  if (!ThomasWindowApplies(in.n, in.batch, in.layout, sizeof(T) == 4)) return false;
  auto run = std::make_unique<WindowRun<T>>();
  WindowRun<T>& r = *run;
  r.p = in;
  TridiagonalProblem<T>& p = r.p;
  if (p.batch == 1) p.layout = Layout::kFlat;  // (one system: the layouts are the same)
  // Mirrored windows by default in the interleaved layout alone: the flat layout read 9% fewer
  // bytes mirrored but ran no faster (NOTES.md t39, t41).
  r.mirror = mirror_by > 0 || (mirror_by == 0 && p.layout == Layout::kInterleaved);
  const T* arrays[4] = {p.a, p.b, p.c, p.d};
  for (const T* q : arrays)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  if (p.layout == Layout::kFlat && reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  r.x = x;
  r.flags = flags;
  r.stream = stream;
  r.windows = windows;
  r.halo = halo;
  r.stages = stages;
  r.h = halo > 0 ? halo : kFirstHalo;
  r.shape = StartMemory::Shape{int(sizeof(T)), p.n,  p.batch, p.layout,
                               windows,        halo, stages,  mirror_by};
  if (const std::optional<Start> start = g_starts.Find(r.shape)) {
    r.long_ring = start->long_ring;
    r.h = start->halo;
    r.mirror &= start->mirror;
  }
  // (One system: each launch maps the parts of its chain, PlanChain's for the blocks that run.)
  if (p.batch > 1 && !EncodeMaps(p, x, SystemsABox(p), 1, r.maps)) return false;
  auto word = PinnedWord::Take();
  if (!word.ok()) return word.status();
  r.word = std::move(*word);
  absl::StatusOr<int> first = r.Launch();
  if (!first.ok()) return first.status();
  if (rest != nullptr && *first == kInWord) {
    *rest = [run = std::move(run)](bool* again) { return run->Answer(kInWord, again); };
    return true;
  }
  bool again = false;
  return r.Answer(*first, &again);
}

template absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<double>&, double*,
                                                  uint8_t*, cudaStream_t, int64_t, int64_t, int,
                                                  int, ThomasWindowRest*);
template absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<float>&, float*,
                                                  uint8_t*, cudaStream_t, int64_t, int64_t, int,
                                                  int, ThomasWindowRest*);

}  // namespace trisolve::cuda
