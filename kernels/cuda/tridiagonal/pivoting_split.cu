// "pivoting-split": partial pivoting for few, long systems (one system of 2^24 rows, a handful
// of 2^22), where the sweep's thread a system (pivoting.cu) leaves the GPU idle. The partition
// method of the CPU's PivotingSplit (kernels/cpu/pivoting_split.cc) with parts of ~32 rows, a
// thread a part:
//
//  1. Ends: each part's interior (its rows but the last, the interface row) eliminated with
//     dgtsv's interchanges, the couplings to the interfaces on either side dropped, for three
//     right-hand sides at once: d, and the two coupling columns (w: a of the first row at row
//     0, v: c of the last row at the last). Only their first and last entries are needed, so no
//     back substitution: a forward elimination gives the last entries, the same elimination on
//     the block with its rows and columns reversed (a tridiagonal matrix too) gives the first.
//  2. The interfaces' tridiagonal system (a row a part), built from those ends as the CPU form
//     builds it; solved by this method again (a level down) until it is short, then by the
//     sweep (a thread a system, LaunchPivoting).
//  3. Each interior solved again, its right-hand side carrying the interfaces' values: the
//     sweep's elimination with its checkpoints (the forward sweep keeps its state every 8 rows,
//     the backward sweep recomputes U from there), x written, the interface rows too.
//  4. The check: each system's backward error ||d - A x|| / (||A|| ||x|| + ||d||) (max norms)
//     from the original arrays, the residual summed without rounding error in the terms
//     (float64: products split by fma, sums by TwoSum; float32: in float64), compared with
//     cpu::kSplitPivotingTolerance eps as the CPU form does.
//  5. Where it fails, a step of iterative refinement: r = d - A x (carried the same way,
//     rounded to T), the correction by steps 1-3 on r, x += it, and the check again (two steps
//     at most: float32 at 2^24 rows needs the second). Parts this
//     short leave random U(-1,1) matrices backward errors of 3e-15 (2^14 rows) to 9e-14 (2^16),
//     some block of 32 rows being nearly singular; one step takes them to 2e-17, under dgtsv's
//     4e-17 (Skeel: one step of fixed-precision refinement makes such an elimination
//     componentwise backward stable); test_pivoting_split's model of this method shows it.
//     Only a system that passes (and whose every block factored and whose interfaces solved)
//     has its flag cleared; the caller solves the others by the fallbacks (the sweep on the
//     device, or on the host).
//
// Parts: m rows (odd: interiors of even length, which keeps a zero diagonal's blocks
// nonsingular), the last part m + 1 to 3m - 1 rows, all interior, an even count
// (cpu::SplitPivotingLayoutOfRows). A warp (a block) runs 32 consecutive parts, read once,
// whole, into shared memory (a part's rows one coalesced run; read by its own thread they
// would be 32 loads 256 bytes apart); a warp holding a system's last part stages 8 rows a part
// at a time instead and reads its parts twice.
//
// Traffic: the ends read a, b, c, d once, the final solve once more and writes x; the check
// reads the five arrays once: ~14 arrays against 5 for the fast kernels (the reduced levels
// add 1/33 of that each); a refinement step about 20 more. Scratch about 1.8 n values.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <vector>

#include "common/numerics.cuh"
#include "runtime/check.h"
#include "trisolve/reference/tridiagonal.h"
#include "tridiagonal/pivoting_step.cuh"
#include "tridiagonal/tridiagonal.h"

namespace trisolve::cuda {
namespace {

constexpr int kRows = 8;       // rows a part staged at a time where a part is long
constexpr int kPartMax = 32;   // rows of a part staged whole (the 33-row parts' interiors)
constexpr int kThreads = 32;   // a warp a block, with its tile
constexpr unsigned kAll = 0xffffffffu;

template <typename T>
struct Tile {
  T v[4][kRows][33];  // a, b, c, d; rows; the warp's 32 parts (+1: no bank conflicts)
};

// The whole interiors of the warp's 32 parts, where none is longer than kPartMax (every warp
// but the one holding a system's last part): read once, coalesced, and both eliminations (or
// the elimination and the back substitution) run from it. 33.8 KB in float64.
template <typename T>
struct PartTile {
  T v[4][kPartMax][33];  // a, b, c, d (then U and x); rows; parts
};

// The tile of a warp: the whole parts, or (long parts) 8 rows at a time in the same memory.
template <typename T>
union WarpTile {
  PartTile<T> whole;
  Tile<T> rows;
};

// Every row of the warp's 32 parts (part j: `start` and `len` of lane j, len <= kPartMax; 0 for
// a part that reads nothing) into the tile: step j reads part j's rows, lane t its row t (one
// run of len values an array).
template <typename T>
__device__ __forceinline__ void LoadParts(const T* a, const T* b, const T* c, const T* d,
                                          int64_t start, int64_t len, PartTile<T>* tile,
                                          int lane) {
  const T* arr[4] = {a, b, c, d};
  __syncwarp();  // the tile's previous reads are done
#pragma unroll 4
  for (int j = 0; j < 32; ++j) {
    const int64_t sj = __shfl_sync(kAll, start, j), lj = __shfl_sync(kAll, len, j);
    const bool in = lane < lj;
#pragma unroll
    for (int q = 0; q < 4; ++q) tile->v[q][lane][j] = in ? arr[q][sj + lane] : T(0);
  }
  __syncwarp();
}

// The parts of a level: `batch` systems of n rows, `parts` a system of m rows but the last.
struct Parts {
  int64_t batch, n, parts, m;
  int64_t max_len;  // the longest interior (the last part's)
  __host__ __device__ __forceinline__ int64_t Count() const { return batch * parts; }
  // Part g: its system s, its index k in the system, its first row (flat index) and interior.
  __device__ __forceinline__ void Of(int64_t g, int64_t& s, int64_t& k, int64_t& start,
                                     int64_t& len) const {
    s = g / parts;
    k = g - s * parts;
    start = s * n + k * m;
    len = k + 1 < parts ? m - 1 : n - k * m;
  }
};

// Rows k0 .. k0 + kRows - 1 of the warp's 32 parts (part j: `start` and `len` of lane j; len 0
// for a part that reads nothing), counted from the interior's last row when kReverse, into
// R[q][t] (q: a, b, c, d; rows past a part's interior: zeros). Every lane calls it.
template <typename T, bool kReverse>
__device__ __forceinline__ void LoadPartRows(const T* a, const T* b, const T* c, const T* d,
                                             int64_t start, int64_t len, int64_t k0,
                                             Tile<T>* tile, int lane, T (&R)[4][kRows]) {
  const T* arr[4] = {a, b, c, d};
  __syncwarp();  // the tile's previous reads are done
#pragma unroll
  for (int it = 0; it < kRows; ++it) {
    const int e = lane + 32 * it;  // element e: part e / kRows, row e % kRows
    const int j = e / kRows, t = e % kRows;
    const int64_t sj = __shfl_sync(kAll, start, j), lj = __shfl_sync(kAll, len, j);
    const int64_t k = k0 + t;
    const bool in = k < lj;
    const int64_t row = kReverse ? sj + lj - 1 - k : sj + k;
#pragma unroll
    for (int q = 0; q < 4; ++q) tile->v[q][t][j] = in ? arr[q][row] : T(0);
  }
  __syncwarp();
#pragma unroll
  for (int t = 0; t < kRows; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) R[q][t] = tile->v[q][t][lane];
}

// Absorb (pivoting_step.cuh) for three right-hand sides (y, w, v), the rows of U not kept.
template <typename T>
__device__ __forceinline__ void Absorb3(T& d, T& u, T& ry, T& rw, T& rv, T a, T b, T c, T y,
                                        T w, T v, bool& ok) {
  if (fabs(d) >= fabs(a)) {
    ok &= d != T(0) && Finite(d);
    const T f = a / d;
    d = b - f * u;
    u = c;
    ry = y - f * ry;
    rw = w - f * rw;
    rv = v - f * rv;
  } else {
    ok &= Finite(a);
    const T f = d / a;
    d = u - f * b;
    u = -f * c;
    ry = ry - f * y;
    rw = rw - f * w;
    rv = rv - f * v;
  }
}

// One elimination of a part's interior for y, w and v (forward: the last entries; kReverse: the
// block reversed, the first entries). Every lane of the warp calls it.
template <typename T, bool kReverse>
__device__ __forceinline__ void EliminateEnds(const TridiagonalProblem<T>& p, const Parts& g,
                                              int64_t start, int64_t len, int64_t k_part,
                                              Tile<T>* tile, int lane, bool& ok, T& oy, T& ow,
                                              T& ov) {
  const int64_t nb = (g.max_len + kRows - 1) / kRows;
  T R[4][kRows];
  T d = T(0), u = T(0), ry = T(0), rw = T(0), rv = T(0);
  const bool left = k_part > 0, right = k_part + 1 < g.parts;  // couplings that exist
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t k0 = j * kRows;
    LoadPartRows<T, kReverse>(p.a, p.b, p.c, p.d, start, len, k0, tile, lane, R);
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      const int64_t k = k0 + t;  // row of the (possibly reversed) block
      if (k >= len) break;
      // The reversed block: its sub-diagonal is the original's c, its super-diagonal a.
      const T sub = kReverse ? R[2][t] : R[0][t], sup = kReverse ? R[0][t] : R[2][t];
      const bool last = k + 1 == len;
      // The coupling columns: w at original row 0, v at the interior's last original row.
      const bool at_first = kReverse ? last : k == 0, at_last = kReverse ? k == 0 : last;
      const T w = left && at_first ? R[0][t] : T(0);
      const T v = right && at_last ? R[2][t] : T(0);
      if (k == 0) {
        d = R[1][t];
        u = sup;  // (len >= 2: the row above exists)
        ry = R[3][t];
        rw = w;
        rv = v;
        continue;
      }
      Absorb3(d, u, ry, rw, rv, sub, R[1][t], last ? T(0) : sup, R[3][t], w, v, ok);
    }
  }
  ok &= d != T(0) && Finite(d);
  oy = ry / d;
  ow = rw / d;
  ov = rv / d;
}

// EliminateEnds from the whole-part tile (the lane's part in column `lane`).
template <typename T, bool kReverse>
__device__ __forceinline__ void EliminateEndsWhole(const PartTile<T>* tile, int64_t len,
                                                   bool left, bool right, int lane, bool& ok,
                                                   T& oy, T& ow, T& ov) {
  T d = T(0), u = T(0), ry = T(0), rw = T(0), rv = T(0);
  for (int k = 0; k < len; ++k) {
    const int row = kReverse ? int(len) - 1 - k : k;
    const T A = tile->v[0][row][lane], B = tile->v[1][row][lane], C = tile->v[2][row][lane],
            Y = tile->v[3][row][lane];
    const T sub = kReverse ? C : A, sup = kReverse ? A : C;
    const bool last = k + 1 == len;
    const bool at_first = kReverse ? last : k == 0, at_last = kReverse ? k == 0 : last;
    const T w = left && at_first ? A : T(0);
    const T v = right && at_last ? C : T(0);
    if (k == 0) {
      d = B;
      u = sup;
      ry = Y;
      rw = w;
      rv = v;
      continue;
    }
    Absorb3(d, u, ry, rw, rv, sub, B, last ? T(0) : sup, Y, w, v, ok);
  }
  ok &= d != T(0) && Finite(d);
  oy = ry / d;
  ow = rw / d;
  ov = rv / d;
}

// Warps a launch of the part kernels at most: grid-stride loops over the parts beyond it, so
// that a launch with nothing to do (no system flagged: dominant data) costs its launch alone.
constexpr int64_t kMaxBlocks = 132 * 32;

// Step 1: ends[q * count + part], q = yf, wf, vf, yl, wl, vl, for the parts of live systems
// not given up; a block that does not factor gives its system up (bad).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    EndsKernel(TridiagonalProblem<T> p, Parts g, const int* any, const uint8_t* live,
               uint8_t* bad, T* ends, bool whole) {
  if (*any == 0) return;
  __shared__ WarpTile<T> shared;
  Tile<T>* tile = &shared.rows;
  const int lane = threadIdx.x & 31;
  const int64_t count = g.Count();
  const int64_t first = int64_t(blockIdx.x) * blockDim.x;
  for (int64_t w0 = first; w0 < count; w0 += int64_t(gridDim.x) * blockDim.x) {
    const int64_t part = w0 + lane;
    int64_t s = 0, k = 0, start = 0, len = 0;
    bool mine = false;
    if (part < count) {
      g.Of(part, s, k, start, len);
      mine = live[s] != 0 && bad[s] == 0;
    }
    if (!mine) len = 0;  // (reads nothing)
    if (__ballot_sync(kAll, mine) == 0) continue;
    bool ok = true;
    T yl, wl, vl, yf, wf, vf;
    if (whole && __reduce_max_sync(kAll, unsigned(len)) <= unsigned(kPartMax)) {
      LoadParts(p.a, p.b, p.c, p.d, start, len, &shared.whole, lane);
      const bool left = k > 0, right = k + 1 < g.parts;
      EliminateEndsWhole<T, false>(&shared.whole, len, left, right, lane, ok, yl, wl, vl);
      EliminateEndsWhole<T, true>(&shared.whole, len, left, right, lane, ok, yf, wf, vf);
    } else {
      EliminateEnds<T, false>(p, g, start, len, k, tile, lane, ok, yl, wl, vl);
      EliminateEnds<T, true>(p, g, start, len, k, tile, lane, ok, yf, wf, vf);
    }
    if (!mine) continue;
    ok = ok && Finite(yl) && Finite(wl) && Finite(vl) && Finite(yf) && Finite(wf) && Finite(vf);
    if (!ok) bad[s] = 1;
    ends[0 * count + part] = yf;
    ends[1 * count + part] = wf;
    ends[2 * count + part] = vf;
    ends[3 * count + part] = yl;
    ends[4 * count + part] = wl;
    ends[5 * count + part] = vl;
  }
}

// Step 2: the interfaces' system (batch systems of parts - 1 rows, flat) of the live systems
// not given up; at the bottom level (`sweep`, else null) the sweep's flags: set for exactly
// those.
template <typename T>
__global__ void ReducedKernel(TridiagonalProblem<T> p, Parts g, const int* any,
                              const uint8_t* live, const uint8_t* bad, const T* ends, T* ra, T* rb,
                              T* rc, T* rd, uint8_t* sweep) {
  if (*any == 0) return;
  const int64_t R = g.parts - 1;
  const int64_t count = g.Count();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < g.batch * R;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / R, k = i - s * R;
    const bool go = live[s] != 0 && bad[s] == 0;
    if (k == 0 && sweep != nullptr) sweep[s] = go ? 1 : 0;
    if (!go) continue;
    const int64_t gk = s * g.parts + k;  // the part before interface k; gk + 1 the one after
    const int64_t e = s * g.n + (k + 1) * g.m - 1;
    const T ae = p.a[e], ce = p.c[e];
    const T yf1 = ends[0 * count + gk + 1], wf1 = ends[1 * count + gk + 1],
            vf1 = ends[2 * count + gk + 1];
    const T yl = ends[3 * count + gk], wl = ends[4 * count + gk], vl = ends[5 * count + gk];
    ra[i] = -ae * wl;
    rb[i] = p.b[e] - ae * vl - ce * wf1;
    rc[i] = -ce * vf1;
    rd[i] = p.d[e] - ae * yl - ce * yf1;
  }
}

// Row k's right-hand side in the final solve: the couplings' known values moved into it.
template <typename T>
__device__ __forceinline__ T Rhs(T a, T c, T y, int64_t k, int64_t len, bool left, bool right,
                                 T zl, T zr) {
  if (k == 0 && left) y -= a * zl;
  if (k + 1 == len && right) y -= c * zr;
  return y;
}

// Step 3: each part of a live system not given up (at the bottom level, whose interfaces the
// sweep solved: its flag back to 0), its interior solved with the interfaces' values z carried
// into its right-hand side: the sweep of pivoting.cu (checkpoints every kRows rows in ck, U
// recomputed block by block from the last), x of the interior and of the interface row after
// it written. A failure (or the sweep's) gives the system up.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    FinalKernel(TridiagonalProblem<T> p, Parts g, const int* any, const uint8_t* live,
                uint8_t* bad, const uint8_t* sweep, const T* z, T* x, T* ck, bool whole) {
  if (*any == 0) return;
  __shared__ WarpTile<T> shared;
  Tile<T>* tile = &shared.rows;
  const int lane = threadIdx.x & 31;
  const int64_t count = g.Count();
  const int64_t R = g.parts - 1;
  const int64_t nb = (g.max_len + kRows - 1) / kRows;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x;
  for (int64_t w0 = first; w0 < count; w0 += int64_t(gridDim.x) * blockDim.x) {
    const int64_t part = w0 + lane;
    int64_t s = 0, kp = 0, start = 0, len = 0;
    bool mine = false;
    if (part < count) {
      g.Of(part, s, kp, start, len);
      mine = live[s] != 0 && bad[s] == 0;
      if (mine && sweep != nullptr && sweep[s] != 0) {
        mine = false;
        bad[s] = 1;
      }
    }
    if (!mine) len = 0;
    const unsigned owners = __ballot_sync(kAll, mine);
    if (owners == 0) continue;
    const bool left = kp > 0, right = kp + 1 < g.parts;
    const T zl = mine && left ? z[s * R + kp - 1] : T(0);
    const T zr = mine && right ? z[s * R + kp] : T(0);
    if (whole && __reduce_max_sync(kAll, unsigned(len)) <= unsigned(kPartMax)) {
      // The whole parts in the tile: the elimination writes each row of U over the row it came
      // from (consumed by then), the back substitution reads it and writes x over its d.
      PartTile<T>* w = &shared.whole;
      LoadParts(p.a, p.b, p.c, p.d, start, len, w, lane);
      bool ok = true;
      T d = T(0), u = T(0), r = T(0);
      for (int k = 0; k < len; ++k) {
        const T A = w->v[0][k][lane], B = w->v[1][k][lane], C = w->v[2][k][lane];
        const T y = Rhs(A, C, w->v[3][k][lane], k, len, left, right, zl, zr);
        if (k == 0) {
          d = B;
          u = C;
          r = y;
          continue;
        }
        T oD, oU, oL, oY;
        Absorb(d, u, r, A, B, k + 1 < len ? C : T(0), y, ok, oD, oU, oL, oY);
        w->v[0][k - 1][lane] = oD;
        w->v[1][k - 1][lane] = oU;
        w->v[2][k - 1][lane] = oL;
        w->v[3][k - 1][lane] = oY;
      }
      ok &= d != T(0) && Finite(d);
      if (mine) {
        T x1 = r / d, x2 = T(0);
        ok &= Finite(x1);
        w->v[3][len - 1][lane] = x1;
        for (int i = int(len) - 2; i >= 0; --i) {
          const T xi = (w->v[3][i][lane] - w->v[1][i][lane] * x1 - w->v[2][i][lane] * x2) /
                       w->v[0][i][lane];
          ok &= Finite(xi);
          w->v[3][i][lane] = xi;
          x2 = x1;
          x1 = xi;
        }
      }
      __syncwarp();
      for (int j = 0; j < 32; ++j) {
        const int64_t sj = __shfl_sync(kAll, start, j), lj = __shfl_sync(kAll, len, j);
        if (((owners >> j) & 1u) && lane < lj) x[sj + lane] = w->v[3][lane][j];
      }
      if (!mine) continue;
      if (right) x[start + len] = zr;
      if (!ok) bad[s] = 1;
      continue;
    }
    T R4[4][kRows];
    bool ok = true;
    T d = T(0), u = T(0), r = T(0);
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t k0 = j * kRows;
      LoadPartRows<T, false>(p.a, p.b, p.c, p.d, start, len, k0, tile, lane, R4);
      if (j > 0 && mine && k0 < len) {
        ck[(3 * j + 0) * count + part] = d;
        ck[(3 * j + 1) * count + part] = u;
        ck[(3 * j + 2) * count + part] = r;
      }
#pragma unroll
      for (int t = 0; t < kRows; ++t) {
        const int64_t k = k0 + t;
        if (k >= len) break;
        const T y = Rhs(R4[0][t], R4[2][t], R4[3][t], k, len, left, right, zl, zr);
        if (k == 0) {
          d = R4[1][t];
          u = R4[2][t];
          r = y;
          continue;
        }
        T oD, oU, oL, oY;
        Absorb(d, u, r, R4[0][t], R4[1][t], k + 1 < len ? R4[2][t] : T(0), y, ok, oD, oU, oL,
               oY);
      }
    }
    ok &= d != T(0) && Finite(d);
    T x1 = mine ? r / d : T(0), x2 = T(0);
    ok &= Finite(x1);
    const int64_t nb_mine = (len + kRows - 1) / kRows;
    T xo[kRows];
    for (int64_t j = nb - 1; j >= 0; --j) {
      const int64_t k0 = j * kRows;
      const int64_t e = k0 + kRows < len ? k0 + kRows : len;
      LoadPartRows<T, false>(p.a, p.b, p.c, p.d, start, len, k0, tile, lane, R4);
      const bool here = j < nb_mine;  // the part has rows in this block
      if (j > 0 && here) {
        d = ck[(3 * j + 0) * count + part];
        u = ck[(3 * j + 1) * count + part];
        r = ck[(3 * j + 2) * count + part];
      }
      T UD[kRows], UU[kRows], UL[kRows], UY[kRows];
#pragma unroll
      for (int t = 0; t < kRows; ++t) {
        const int64_t k = k0 + t;
        UD[t] = T(1), UU[t] = T(0), UL[t] = T(0), UY[t] = T(0);
        if (!here || k >= len) continue;
        const T y = Rhs(R4[0][t], R4[2][t], R4[3][t], k, len, left, right, zl, zr);
        if (k == 0) {
          d = R4[1][t];
          u = R4[2][t];
          r = y;
          continue;
        }
        bool unused = true;  // (the forward sweep judged these pivots)
        Absorb(d, u, r, R4[0][t], R4[1][t], k + 1 < len ? R4[2][t] : T(0), y, unused, UD[t],
               UU[t], UL[t], UY[t]);
      }
#pragma unroll
      for (int t = 0; t < kRows; ++t) xo[t] = T(0);
      if (here) {
        // (row e - 1's x came from the block above, or is the interior's last)
#pragma unroll
        for (int t = kRows - 1; t >= 0; --t) {
          const int64_t k = k0 + t;
          if (k >= e) continue;
          if (k == e - 1) xo[t] = x1;
          if (k == 0) continue;
          const T xi = (UY[t] - UU[t] * x1 - UL[t] * x2) / UD[t];
          ok &= Finite(xi);
          x2 = x1;
          x1 = xi;
          if (t >= 1) xo[t - 1] = xi;
        }
      }
      // x's rows [k0, e) through the tile, coalesced.
      __syncwarp();
#pragma unroll
      for (int t = 0; t < kRows; ++t) tile->v[0][t][lane] = xo[t];
      __syncwarp();
#pragma unroll
      for (int it = 0; it < kRows; ++it) {
        const int e2 = lane + 32 * it;
        const int jj = e2 / kRows, t = e2 % kRows;
        const int64_t sj = __shfl_sync(kAll, start, jj), lj = __shfl_sync(kAll, len, jj);
        const int64_t k = k0 + t;
        if (((owners >> jj) & 1u) && k < lj) x[sj + k] = tile->v[0][t][jj];
      }
    }
    if (!mine) continue;
    if (right) x[start + len] = zr;
    if (!ok) bad[s] = 1;
  }
}

// ---- The check.

// a + b exactly as s + e (Knuth's TwoSum).
__device__ __forceinline__ void TwoSum(double a, double b, double& s, double& e) {
  s = a + b;
  const double bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}

// d - (a xl + b x + c xr), the products and sums carried to about eps^2 relative.
__device__ __forceinline__ double Residual(double a, double b, double c, double d, double xl,
                                          double x, double xr, bool wide) {
  if (!wide) return d - a * xl - b * x - c * xr;  // (float32 values: exact products)
  double s = d, err = 0;
  const double coef[3] = {a, b, c}, xv[3] = {xl, x, xr};
#pragma unroll
  for (int q = 0; q < 3; ++q) {
    const double pr = coef[q] * xv[q];
    const double pe = fma(coef[q], xv[q], -pr);  // coef x = pr + pe exactly
    double e;
    TwoSum(s, -pr, s, e);
    err += e - pe;
  }
  return s + err;
}

__device__ __forceinline__ void MaxInto(unsigned long long* at, double v) {
  // Non-negative doubles order as their bits; NaN counts as infinity.
  if (!(v <= DBL_MAX)) v = __builtin_huge_val();
  atomicMax(at, static_cast<unsigned long long>(__double_as_longlong(v)));
}

constexpr int kCheckThreads = 256;
constexpr double kInf = __builtin_huge_val();

// acc[4 s + q]: max |residual|, max row sum |a| + |b| + |c|, max |x|, max |d| of the live
// systems the split answered.
template <typename T>
__global__ void __launch_bounds__(kCheckThreads)
    CheckKernel(TridiagonalProblem<T> p, const T* x, const int* any, const uint8_t* live,
                const uint8_t* bad, unsigned long long* acc) {
  if (*any == 0) return;
  for (int64_t s = blockIdx.y; s < p.batch; s += gridDim.y) {
    if (live[s] == 0 || bad[s] != 0) continue;
    const int64_t base = s * p.n;
    double m[4] = {0, 0, 0, 0};
    for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < p.n;
         k += int64_t(gridDim.x) * blockDim.x) {
      const int64_t i = base + k;
      const double a = k > 0 ? double(p.a[i]) : 0.0, c = k + 1 < p.n ? double(p.c[i]) : 0.0;
      const double b = double(p.b[i]), d = double(p.d[i]);
      const double xk = double(x[i]);
      const double xl = k > 0 ? double(x[i - 1]) : 0.0, xr = k + 1 < p.n ? double(x[i + 1]) : 0.0;
      const double res = Residual(a, b, c, d, xl, xk, xr, sizeof(T) == 8);
      // (a non-finite x, or residual, counts as an infinite residual)
      const double rr = Finite(xk) && fabs(res) <= DBL_MAX ? fabs(res) : kInf;
      m[0] = fmax(m[0], rr);
      m[1] = fmax(m[1], fabs(a) + fabs(b) + fabs(c));
      m[2] = fmax(m[2], fabs(xk));
      m[3] = fmax(m[3], fabs(d));
    }
    __shared__ double part[4][kCheckThreads / 32];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      double v = m[q];
      // (fmax drops a NaN; the infinities above stand for every non-finite value)
      for (int off = 16; off > 0; off >>= 1) v = fmax(v, __shfl_xor_sync(kAll, v, off));
      if ((threadIdx.x & 31) == 0) part[q][threadIdx.x / 32] = v;
    }
    __syncthreads();
    if (threadIdx.x < 4) {
      double v = 0;
      for (int w = 0; w < kCheckThreads / 32; ++w) v = fmax(v, part[threadIdx.x][w]);
      MaxInto(&acc[4 * s + threadIdx.x], v);
    }
    __syncthreads();
  }
}

// The verdict: a system the split answered whose backward error is within tol keeps it, its
// flag cleared and counted in *solved (mapped host memory); every other keeps its flag. With
// `refine` (every verdict but the last), a system answered but not within tol stays live for a
// step of iterative refinement (its sums cleared, *refine set); every other leaves (live 0).
__global__ void VerdictKernel(int64_t batch, uint8_t* flags, const int* any, uint8_t* live,
                              const uint8_t* bad, unsigned long long* acc, double tol,
                              int* solved, int* refine) {
  if (*any == 0) return;
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < batch;
       s += int64_t(gridDim.x) * blockDim.x) {
    if (live[s] == 0) continue;
    if (bad[s] != 0) {
      live[s] = 0;
      continue;
    }
    const double rm = __longlong_as_double(static_cast<long long>(acc[4 * s + 0]));
    const double am = __longlong_as_double(static_cast<long long>(acc[4 * s + 1]));
    const double xm = __longlong_as_double(static_cast<long long>(acc[4 * s + 2]));
    const double dm = __longlong_as_double(static_cast<long long>(acc[4 * s + 3]));
    const double den = am * xm + dm;
    const double be = den > 0 ? rm / den : rm;
    if (!(be <= tol)) {
      if (refine != nullptr && Finite(be)) {  // (an x not finite is not refined)
        for (int q = 0; q < 4; ++q) acc[4 * s + q] = 0;
        *refine = 1;
      } else {
        live[s] = 0;
      }
      continue;
    }
    live[s] = 0;
    flags[s] = 0;
    if (solved != nullptr) atomicAdd_system(solved, 1);
  }
}

// The refinement's right-hand side, r = d - A x in T (each row's residual carried to about
// eps^2 before it is rounded), of the live systems.
template <typename T>
__global__ void ResidualKernel(TridiagonalProblem<T> p, const T* x, const int* any,
                               const uint8_t* live, T* r) {
  if (*any == 0) return;
  const int64_t total = p.batch * p.n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / p.n, k = i - s * p.n;
    if (live[s] == 0) continue;
    const double a = k > 0 ? double(p.a[i]) : 0.0, c = k + 1 < p.n ? double(p.c[i]) : 0.0;
    const double xl = k > 0 ? double(x[i - 1]) : 0.0, xr = k + 1 < p.n ? double(x[i + 1]) : 0.0;
    r[i] = T(Residual(a, double(p.b[i]), c, double(p.d[i]), xl, double(x[i]), xr,
                      sizeof(T) == 8));
  }
}

// x += dx for the live systems not given up by the refinement's solve.
template <typename T>
__global__ void UpdateKernel(int64_t batch, int64_t n, const int* any, const uint8_t* live,
                             const uint8_t* bad, const T* dx, T* x) {
  if (*any == 0) return;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < batch * n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / n;
    if (live[s] != 0 && bad[s] == 0) x[i] += dx[i];
  }
}

// The start, one block: live (the flagged systems), bad, the sweep's flags and the check's
// sums cleared, *refine too, and *any: whether any system is live (every later kernel returns
// at once where none is).
constexpr int kInitThreads = 1024;
// Steps of iterative refinement at most: float64 passes after one (random U(-1,1), 2^14-2^16
// rows: 9e-14 -> 2e-17); float32 at 2^24 rows needs two (the host model: 990 eps -> 28 -> 0.8).
constexpr int kRefineSteps = 2;
__global__ void __launch_bounds__(kInitThreads)
    InitKernel(int64_t batch, const uint8_t* flags, uint8_t* live, uint8_t* bad,
               uint8_t* sweep, unsigned long long* acc, int* any, int* refine, int* any_mapped) {
  int mine = 0;
  for (int64_t s = threadIdx.x; s < batch; s += blockDim.x) {
    live[s] = flags[s] != 0 ? 1 : 0;
    mine |= live[s];
    bad[s] = 0;
    sweep[s] = 0;
    for (int q = 0; q < 4; ++q) acc[4 * s + q] = 0;
  }
  const int all = __syncthreads_or(mine);
  if (threadIdx.x == 0) {
    *any = all;
    for (int q = 0; q < kRefineSteps; ++q) refine[q] = 0;
    if (any_mapped != nullptr) *any_mapped = all;
  }
}

// ---- The plan: levels down to a reduced system the sweep solves, and where each one's scratch
// lies (every offset a multiple of 256 bytes).

struct Level {
  Parts g;
  int64_t ends = 0, ra = 0, rb = 0, rc = 0, rd = 0, z = 0, ck = 0;
};

struct Plan {
  std::vector<Level> levels;
  // offsets: live, bad, the bottom sweep's flags (a byte a system each), *any, the check's
  // sums, the bottom sweep's checkpoints
  int64_t live = 0, bad = 0, sweep_flags = 0, any = 0, refine = 0, acc = 0, sweep = 0;
  int64_t residual = 0;  // the refinement's right-hand side, then its correction (n a system)
  int64_t bytes = 0;
};

int64_t Up(int64_t v) { return (v + 255) / 256 * 256; }

Plan MakePlan(int64_t n, int64_t batch, int64_t value_bytes) {
  Plan plan;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const int64_t o = at;
    at += Up(bytes);
    return o;
  };
  plan.live = take(batch);
  plan.bad = take(batch);
  plan.sweep_flags = take(batch);
  plan.any = take(int64_t(sizeof(int)));
  plan.refine = take(int64_t(kRefineSteps * sizeof(int)));
  plan.residual = take(n * batch * value_bytes);
  plan.acc = take(4 * batch * 8);
  int64_t rows = n;
  while (true) {
    const cpu::SplitLayout l = cpu::SplitPivotingLayoutOfRows(rows, kPivotingSplitPartRows);
    if (l.parts == 0) break;
    Level v;
    v.g = Parts{batch, rows, l.parts, l.rows, rows - (l.parts - 1) * l.rows};
    const int64_t count = batch * l.parts, R = l.parts - 1;
    v.ends = take(6 * count * value_bytes);
    v.ra = take(batch * R * value_bytes);
    v.rb = take(batch * R * value_bytes);
    v.rc = take(batch * R * value_bytes);
    v.rd = take(batch * R * value_bytes);
    v.z = take(batch * R * value_bytes);
    v.ck = take(3 * ((v.g.max_len + kRows - 1) / kRows) * count * value_bytes);
    plan.levels.push_back(v);
    rows = R;
    if (rows <= kPivotingSplitSweepRows) break;
  }
  plan.sweep = take(PivotingScratchBytes(rows, batch, value_bytes == 4));
  plan.bytes = at;
  return plan;
}

unsigned Blocks(int64_t threads, int per_block) {
  return unsigned(std::min<int64_t>((threads + per_block - 1) / per_block, kMaxBlocks));
}

// Level i on p (its arrays; x its answer): each live system not given up solved, or given up
// (bad).
template <typename T>
absl::Status SolveLevel(const Plan& plan, size_t i, const TridiagonalProblem<T>& p, T* x,
                        const int* any, bool whole, std::byte* scratch, cudaStream_t stream) {
  const Level& v = plan.levels[i];
  auto at = [&](int64_t off) { return reinterpret_cast<T*>(scratch + off); };
  const uint8_t* live = reinterpret_cast<uint8_t*>(scratch + plan.live);
  uint8_t* bad = reinterpret_cast<uint8_t*>(scratch + plan.bad);
  const bool bottom = i + 1 == plan.levels.size();
  uint8_t* sweep = bottom ? reinterpret_cast<uint8_t*>(scratch + plan.sweep_flags) : nullptr;
  const int64_t count = v.g.Count(), R = v.g.parts - 1;
  EndsKernel<T><<<Blocks(count, kThreads), kThreads, 0, stream>>>(p, v.g, any, live, bad,
                                                                  at(v.ends), whole);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const TridiagonalProblem<T> r{p.batch, R, Layout::kFlat, at(v.ra), at(v.rb), at(v.rc),
                                at(v.rd)};
  ReducedKernel<T><<<Blocks(p.batch * R, 256), 256, 0, stream>>>(
      p, v.g, any, live, bad, at(v.ends), at(v.ra), at(v.rb), at(v.rc), at(v.rd), sweep);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (!bottom) {
    if (auto st = SolveLevel(plan, i + 1, r, at(v.z), any, whole, scratch, stream); !st.ok())
      return st;
  } else {
    // (the sweep's kernel: a warp with no flagged system returns at once)
    if (auto st = LaunchPivoting(r, at(v.z), sweep, scratch + plan.sweep, stream, true, nullptr);
        !st.ok())
      return st;
  }
  FinalKernel<T><<<Blocks(count, kThreads), kThreads, 0, stream>>>(
      p, v.g, any, live, bad, sweep, at(v.z), x, at(v.ck), whole);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

bool PivotingSplitApplies(int64_t n, int64_t batch, Layout layout) {
  return (layout == Layout::kFlat || batch == 1) && batch >= 1 &&
         cpu::SplitPivotingLayoutOfRows(n, kPivotingSplitPartRows).parts > 0;
}

bool PivotingSplitByShape(int64_t n, int64_t batch, Layout layout) {
  if (!PivotingSplitApplies(n, batch, layout)) return false;
  if (batch < kPivotingDeviceBatch) return true;  // (else: the host's sweep)
  return n >= kPivotingSplitMinRows;
}

int64_t PivotingSplitScratchBytes(int64_t n, int64_t batch, bool float32) {
  if (!PivotingSplitApplies(n, batch, Layout::kFlat)) return 0;
  return MakePlan(n, batch, float32 ? 4 : 8).bytes;
}

template <typename T>
absl::Status LaunchPivotingSplit(const TridiagonalProblem<T>& p_in, T* x, uint8_t* flags,
                                 void* scratch, cudaStream_t stream, int* solved,
                                 const SplitAny* any_flagged, bool whole_parts) {
  if (p_in.batch <= 0 || p_in.n <= 0) return absl::OkStatus();
  TridiagonalProblem<T> p = p_in;
  if (p.batch == 1) p.layout = Layout::kFlat;
  if (!PivotingSplitApplies(p.n, p.batch, p.layout))
    return absl::InvalidArgumentError("pivoting-split: not a shape it solves");
  const Plan plan = MakePlan(p.n, p.batch, sizeof(T));
  auto* base = static_cast<std::byte*>(scratch);
  uint8_t* live = reinterpret_cast<uint8_t*>(base + plan.live);
  uint8_t* bad = reinterpret_cast<uint8_t*>(base + plan.bad);
  int* any = reinterpret_cast<int*>(base + plan.any);
  int* refine = reinterpret_cast<int*>(base + plan.refine);
  auto* acc = reinterpret_cast<unsigned long long*>(base + plan.acc);
  uint8_t* sweep = reinterpret_cast<uint8_t*>(base + plan.sweep_flags);
  T* r = reinterpret_cast<T*>(base + plan.residual);
  InitKernel<<<1, kInitThreads, 0, stream>>>(p.batch, flags, live, bad, sweep, acc, any, refine,
                                             any_flagged ? any_flagged->mapped : nullptr);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (any_flagged != nullptr) {
    // Nothing flagged (dominant data): none of the ~20 launches below, each of which would
    // cost its launch (65 us in all on the H100 for one system of 2^24 rows, 25% of auto).
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (*any_flagged->host == 0) return absl::OkStatus();
  }
  const int64_t per_system = std::min<int64_t>(
      std::max<int64_t>((p.n + 4 * kCheckThreads - 1) / (4 * kCheckThreads), 1),
      std::max<int64_t>(kMaxBlocks / p.batch, 1));
  const dim3 grid(unsigned(per_system), unsigned(std::min<int64_t>(p.batch, 65535)));
  const double tol = cpu::kSplitPivotingTolerance * (sizeof(T) == 4 ? double(FLT_EPSILON)
                                                                    : DBL_EPSILON);
  const unsigned rows_blocks = Blocks(p.batch * p.n, 256);
  // The split, its check; where the check fails, a step of iterative refinement (the residual
  // carried exactly, the correction by the split again: a random matrix's parts leave backward
  // errors of 1e-14..1e-13 that one step takes to 1e-17, test_pivoting_split's model), and the
  // check again; a second step where that fails (float32). Each step's kernels are gated by
  // the word the verdict before it sets where a system is still to refine.
  if (auto st = SolveLevel(plan, 0, p, x, any, whole_parts, base, stream); !st.ok()) return st;
  const int* gate = any;
  // (the correction overwrites its right-hand side: each part reads its rows before it writes
  // them, and the interface rows are read by the reduced system before any are written)
  const TridiagonalProblem<T> pr{p.batch, p.n, Layout::kFlat, p.a, p.b, p.c, r};
  for (int step = 0; step < kRefineSteps; ++step) {
    CheckKernel<T><<<grid, kCheckThreads, 0, stream>>>(p, x, gate, live, bad, acc);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    VerdictKernel<<<Blocks(p.batch, 256), 256, 0, stream>>>(p.batch, flags, gate, live, bad, acc,
                                                            tol, solved, refine + step);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    gate = refine + step;
    ResidualKernel<T><<<rows_blocks, 256, 0, stream>>>(p, x, gate, live, r);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (auto st = SolveLevel(plan, 0, pr, r, gate, whole_parts, base, stream); !st.ok())
      return st;
    UpdateKernel<T><<<rows_blocks, 256, 0, stream>>>(p.batch, p.n, gate, live, bad, r, x);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  CheckKernel<T><<<grid, kCheckThreads, 0, stream>>>(p, x, gate, live, bad, acc);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  VerdictKernel<<<Blocks(p.batch, 256), 256, 0, stream>>>(p.batch, flags, gate, live, bad, acc,
                                                          tol, solved, nullptr);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchPivotingSplit(const TridiagonalProblem<double>&, double*, uint8_t*,
                                          void*, cudaStream_t, int*, const SplitAny*, bool);
template absl::Status LaunchPivotingSplit(const TridiagonalProblem<float>&, float*, uint8_t*,
                                          void*, cudaStream_t, int*, const SplitAny*, bool);

}  // namespace trisolve::cuda
