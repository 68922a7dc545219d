// The cable elimination's device code (tree_cables.cu launches it): the per-height kernels, the
// tail kernel and the one-block forms. Included by tree_cables.cu only.
#pragma once

#include <cuda_pipeline.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "common/numerics.cuh"
#include "tree/tree.h"
#include "tridiagonal/flags.h"

namespace trisolve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTailThreads = 512;
constexpr int32_t kTailMaxCables = 2048;  // per level, for the levels the tail kernel takes
constexpr int32_t kTailMaxNodes = 8192;
constexpr int kAhead = 8;  // nodes of a cable whose inputs are loaded before they are used
constexpr int64_t kMaxGridY = 65535;

struct View {
  const int32_t* start;
  const int32_t* child_ptr;  // cable c's children left their contributions in slots
                             // child_ptr[c] .. child_ptr[c + 1]
  const int32_t* order;
  const int32_t* slot;       // slot[k]: where cable order[k] leaves its contribution (-1: root)
  const int32_t* node_order;
  const int32_t* node_anchor;
  int64_t slots;             // per system
};

template <typename T>
struct Pair {
  using type = double2;
};
template <>
struct Pair<float> {
  using type = float2;
};
template <typename T>
using P2 = typename Pair<T>::type;

// Element j of system s: st = 1 and off = s * n (flat), or st = batch and off = s.
struct Sys {
  int64_t st, off, s;
  __device__ int64_t operator()(int64_t j) const { return off + j * st; }
};
template <typename T>
__device__ __forceinline__ Sys SystemOf(const TreeProblem<T>& p, int64_t s) {
  return p.layout == Layout::kInterleaved ? Sys{p.batch, s, s} : Sys{1, s * p.n, s};
}

// Backward phase for the short cable order[k]: gather the child cables' contributions (one
// contiguous run of slots) into the bottom node, eliminate bottom to top (leaving R/D in x and
// lower/D in w), then run down the cable turning them into q (x with x_anchor = 0) and w (the
// response to x_anchor); the top's elimination is the contribution to the anchor.
template <typename T>
__device__ __forceinline__ bool BackwardCable(const TreeProblem<T>& p, const View& v, int64_t k,
                                              const Sys& at, T* x, T* w, P2<T>* contrib) {
  const int32_t c = v.order[k];
  const int64_t s0 = v.start[c], e0 = int64_t(v.start[c + 1]) - 1;
  const P2<T>* in = contrib + at.s * v.slots;
  T gD = 0, gR = 0, gS = 0;
  const int32_t q0 = v.child_ptr[c], q1 = v.child_ptr[c + 1];
#pragma unroll 4
  for (int32_t q = q0; q < q1; ++q) {
    const P2<T> g = in[q];
    gD += g.x;
    gR += g.y;
    gS += fabs(g.x);
  }
  bool ok = true;
  T carryD = gD, carryR = gR, carryS = gS;
  for (int64_t j0 = e0; j0 >= s0; j0 -= kAhead) {
    T lo_[kAhead], up_[kAhead], dg_[kAhead], rh_[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t j = j0 - u;
      if (j >= s0) {
        const int64_t e = at(j);
        dg_[u] = __ldg(p.diag + e);
        rh_[u] = __ldg(p.rhs + e);
        lo_[u] = j > 0 ? __ldg(p.lower + e) : T(0);
        up_[u] = j > 0 ? __ldg(p.upper + e) : T(0);
      }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t j = j0 - u;
      if (j < s0) break;
      const T D = dg_[u] - carryD, R = rh_[u] - carryR;
      ok &= !Vanishes(D, fabs(dg_[u]) + carryS);
      const T inv = Rcp(D);
      const int64_t e = at(j);
      x[e] = R * inv;
      w[e] = lo_[u] * inv;  // zero for the root (lower[0] and upper[0] are not read)
      const T g = up_[u] * inv;
      carryD = g * lo_[u];
      carryR = g * R;
      carryS = fabs(carryD);
    }
  }
  const int32_t slot = v.slot[k];
  if (slot >= 0) {
    P2<T> out;
    out.x = carryD;
    out.y = carryR;
    contrib[at.s * v.slots + slot] = out;
  }
  // Down the cable: q_j = R_j/D_j - (lower_j/D_j) q_{j-1}, w_j = -(lower_j/D_j) w_{j-1}.
  T qprev = x[at(s0)], wprev = w[at(s0)];
  ok &= Finite(qprev);
  for (int64_t j0 = s0 + 1; j0 <= e0; j0 += kAhead) {
    T q_[kAhead], l_[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t j = j0 + u;
      if (j <= e0) {
        q_[u] = x[at(j)];
        l_[u] = w[at(j)];
      }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int64_t j = j0 + u;
      if (j > e0) break;
      qprev = q_[u] - l_[u] * qprev;
      wprev = -l_[u] * wprev;
      ok &= Finite(qprev);
      x[at(j)] = qprev;
      w[at(j)] = wprev;
    }
  }
  return ok;
}

// Forward phase for node node_order[k]: x_j = q_j - w_j x_anchor.
template <typename T>
__device__ __forceinline__ bool ForwardNode(const View& v, int64_t k, const Sys& at, T* x,
                                            const T* w) {
  const int32_t a = v.node_anchor[k];
  if (a < 0) return true;
  const int64_t e = at(v.node_order[k]);
  const T xj = x[e] - w[e] * x[at(a)];
  x[e] = xj;
  return Finite(xj);
}

// One height of the backward phase: a thread per short cable.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    CablesBackward(TreeProblem<T> p, View v, int32_t lo, int32_t hi, int64_t s_base, T* x,
                   T* w, P2<T>* contrib, uint8_t* status) {
  const int64_t k = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= hi) return;
  const Sys at = SystemOf(p, s_base + blockIdx.y);
  if (!BackwardCable(p, v, k, at, x, w, contrib)) status[at.s] = 1;
}

// One height of the forward phase: a thread per node.
template <typename T>
__global__ void __launch_bounds__(256)
    CablesForward(TreeProblem<T> p, View v, int32_t lo, int32_t hi, int64_t s_base, T* x,
                  const T* w, uint8_t* status) {
  const int64_t k = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= hi) return;
  const Sys at = SystemOf(p, s_base + blockIdx.y);
  if (!ForwardNode(v, k, at, x, w)) status[at.s] = 1;
}

// The narrow top of the cable tree in one block a system: the backward phase of heights
// h0 .. H-1, then the forward phase back down to h0, levels apart by barriers instead of
// launches (each level there is a few cables, and a launch's latency would dominate).
template <typename T>
__global__ void __launch_bounds__(kTailThreads)
    CablesTail(TreeProblem<T> p, View v, const int32_t* level_ptr, const int32_t* node_level_ptr,
               int32_t h0, int32_t H, int64_t s_base, T* x, T* w, P2<T>* contrib,
               uint8_t* status) {
  const Sys at = SystemOf(p, s_base + blockIdx.y);
  bool ok = true;
  for (int32_t h = h0; h < H; ++h) {
    for (int64_t k = level_ptr[h] + threadIdx.x; k < level_ptr[h + 1]; k += blockDim.x)
      ok &= BackwardCable(p, v, k, at, x, w, contrib);
    __syncthreads();
  }
  for (int32_t h = H - 2; h >= h0; --h) {  // the root cable (height H - 1): x = q already
    for (int64_t k = node_level_ptr[h] + threadIdx.x; k < node_level_ptr[h + 1];
         k += blockDim.x)
      ok &= ForwardNode(v, k, at, x, w);
    __syncthreads();
  }
  if (!ok) status[at.s] = 1;
}

// A long cable as tridiagonal systems (flat, `sys` of them, length L): system 0 has the
// cable's right-hand side with the children's contributions, system 1 (when the cable hangs
// from a node) the right-hand side e_0.
template <typename T>
__global__ void LongCablePrepare(TreeProblem<T> p, View v, int32_t c, int64_t s, int sys,
                                 const P2<T>* contrib, T* a, T* b, T* cc, T* d) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s0 = v.start[c], L = int64_t(v.start[c + 1]) - s0;
  if (j >= L) return;
  const Sys at = SystemOf(p, s);
  const int64_t node = s0 + j;
  T bj = p.diag[at(node)], dj = p.rhs[at(node)];
  if (j == L - 1) {
    for (int32_t q = v.child_ptr[c]; q < v.child_ptr[c + 1]; ++q) {
      const P2<T> g = contrib[s * v.slots + q];
      bj -= g.x;
      dj -= g.y;
    }
  }
  const T aj = j > 0 ? p.lower[at(node)] : T(0);
  const T cj = j + 1 < L ? p.upper[at(node + 1)] : T(0);
  for (int q = 0; q < sys; ++q) {
    a[q * L + j] = aj;
    b[q * L + j] = bj;
    cc[q * L + j] = cj;
    d[q * L + j] = q == 0 ? dj : T(j == 0 ? 1 : 0);
  }
}

template <typename T>
__global__ void LongCableFinish(TreeProblem<T> p, View v, int32_t c, int32_t slot, int64_t s,
                                int sys, const T* y, const uint8_t* flags, T* x, T* w,
                                P2<T>* contrib, uint8_t* status) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s0 = v.start[c], L = int64_t(v.start[c + 1]) - s0;
  if (j >= L) return;
  const Sys at = SystemOf(p, s);
  const T lo0 = sys == 2 ? p.lower[at(s0)] : T(0);
  x[at(s0 + j)] = y[j];
  w[at(s0 + j)] = sys == 2 ? lo0 * y[L + j] : T(0);
  if (j == 0) {
    if (slot >= 0) {
      const T up0 = p.upper[at(s0)];
      P2<T> out;
      out.x = up0 * lo0 * y[L];
      out.y = up0 * y[0];
      contrib[s * v.slots + slot] = out;
    }
    if ((flags[0] | (sys == 2 ? flags[1] : 0)) & kFlagVanished) status[s] = 1;  // (not dominance)
  }
}

constexpr int kBlockThreads = 512;
constexpr int64_t kBlockMaxCable = 64;
constexpr int64_t kBlockMaxSmem = 227 * 1024;

// A cell's four arrays in shared memory (n values each: lower, upper, diag, rhs) for the
// one-block-a-cell kernels, element i of cell `cell` at at(i) in either layout.
template <typename T, bool kInterleaved>
struct CellArrays {
  T *lower, *upper, *diag, *rhs;
  const TreeProblem<T>& p;
  int64_t cell;
  __device__ CellArrays(const TreeProblem<T>& q, unsigned char* smem)
      : lower(reinterpret_cast<T*>(smem)), upper(lower + q.n), diag(upper + q.n),
        rhs(diag + q.n), p(q), cell(blockIdx.x) {}
  __device__ int64_t at(int i) const {
    return kInterleaved ? int64_t(i) * p.batch + cell : cell * p.n + i;
  }
  // Asynchronous copies (no registers held, all in flight at once), then a barrier.
  __device__ void CopyIn() {
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) {
      const int64_t e = at(i);
      __pipeline_memcpy_async(lower + i, p.lower + e, sizeof(T));
      __pipeline_memcpy_async(upper + i, p.upper + e, sizeof(T));
      __pipeline_memcpy_async(diag + i, p.diag + e, sizeof(T));
      __pipeline_memcpy_async(rhs + i, p.rhs + e, sizeof(T));
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
  }
  // x from rhs, and the cell's status.
  __device__ void CopyOut(T* x, uint8_t* status, bool ok) const {
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) x[at(i)] = rhs[i];
    if (!ok) status[cell] = 1;
  }
};

// One cell a block (either layout): the cell's lower, upper, diag and rhs are copied into
// shared memory by asynchronous copies (no registers held, all in flight at once), the cable
// elimination runs there level by level with barriers, and x is written once: the 5 arrays of
// the floor. Nothing else lives in shared memory, so two float64 cells of ~3,500 nodes fit an
// SM and one block's copies overlap the other's arithmetic. The backward phase leaves R/D in
// rhs and lower/D in lower; a cable's contribution to its anchor goes into its top node's diag
// and upper, which its own elimination has consumed; the forward phase runs a thread a cable
// down the levels, x_j = R_j/D_j - (lower_j/D_j) x_parent, x in place of R/D.
//
// A level's critical path is its longest cable, so everything else is taken off it: a
// thread's cable description for the next level is loaded while it works on this one (the
// descriptions stay in global memory: two cells' arrays fill shared memory), and a node's
// inputs are read before the previous node's results are stored.
//
// cinfo per cable in `order`: {first node | (length - 1) << 16 | more children << 31, anchor
// (-1: root), top node of the first child cable, of the second (-1: none)}; for a cable with
// more than two children, cmore[k] = {first ctop index, count} of the others.
struct BlockCable {
  int s0, e0, anchor, c0, c1;
  bool more;
};
__device__ __forceinline__ BlockCable Decode(int4 ci) {
  const unsigned x = unsigned(ci.x);
  return BlockCable{int(x & 0xffffu), int(x & 0xffffu) + int((x >> 16) & 0x7fffu), ci.y, ci.z,
                    ci.w, (x >> 31) != 0};
}
constexpr int4 kNoCable{0, -1, -1, -1};
__device__ __forceinline__ int4 CableAt(const int4* __restrict__ cinfo, int k, int kend) {
  return k < kend ? __ldg(cinfo + k) : kNoCable;
}

template <typename T>
__device__ __forceinline__ void BlockBackward(const BlockCable& c, int k,
                                              const int2* __restrict__ cmore,
                                              const int32_t* __restrict__ ctop, T* lower,
                                              T* upper, T* diag, T* rhs, bool& ok) {
  T carryD = 0, carryR = 0, carryS = 0;
  auto gather = [&](int top) {
    const T gD = diag[top];
    carryD += gD;
    carryR += upper[top];
    carryS += fabs(gD);
  };
  if (c.c0 >= 0) gather(c.c0);
  if (c.c1 >= 0) gather(c.c1);
  if (c.more) {
    const int2 m = __ldg(cmore + k);
    for (int q = m.x; q < m.x + m.y; ++q) gather(__ldg(ctop + q));
  }
  T dg = diag[c.e0], lo = lower[c.e0], up = upper[c.e0], rh = rhs[c.e0];
  for (int j = c.e0; j >= c.s0; --j) {
    T ndg = 0, nlo = 0, nup = 0, nrh = 0;
    if (j > c.s0) {
      ndg = diag[j - 1];
      nlo = lower[j - 1];
      nup = upper[j - 1];
      nrh = rhs[j - 1];
    }
    const T D = dg - carryD, R = rh - carryR;
    ok &= !Vanishes(D, fabs(dg) + carryS);
    const T inv = Rcp(D);
    rhs[j] = R * inv;
    lower[j] = j > 0 ? lo * inv : T(0);
    const T g = j > 0 ? up * inv : T(0);
    carryD = g * lo;
    carryR = g * R;
    carryS = fabs(carryD);
    dg = ndg;
    lo = nlo;
    up = nup;
    rh = nrh;
  }
  if (c.anchor >= 0) {  // the top's diag and upper are spent: they carry the contribution
    diag[c.s0] = carryD;
    upper[c.s0] = carryR;
  }
}

template <typename T>
__device__ __forceinline__ void BlockForward(const BlockCable& c, const T* lower, T* rhs,
                                             bool& ok) {
  T xp = c.anchor >= 0 ? rhs[c.anchor] : T(0);
  T q = rhs[c.s0], l = lower[c.s0];
  for (int j = c.s0; j <= c.e0; ++j) {
    T nq = 0, nl = 0;
    if (j < c.e0) {
      nq = rhs[j + 1];
      nl = lower[j + 1];
    }
    xp = q - l * xp;
    ok &= Finite(xp);
    rhs[j] = xp;
    q = nq;
    l = nl;
  }
}

template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kBlockThreads, 2)
    CablesBlockKernel(TreeProblem<T> p, const int4* __restrict__ cinfo,
                      const int2* __restrict__ cmore, const int32_t* __restrict__ ctop,
                      const int32_t* __restrict__ level_ptr, int H, T* x, uint8_t* status) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x;
  CellArrays<T, kInterleaved> a(p, smem_raw);
  T *lower = a.lower, *upper = a.upper, *diag = a.diag, *rhs = a.rhs;  // rhs: R/D, then x
  // The first level's descriptions are requested before the copies.
  int kb = __ldg(level_ptr), ke = __ldg(level_ptr + 1);
  int4 ci = CableAt(cinfo, kb + tid, ke);
  a.CopyIn();
  bool ok = true;
  for (int h = 0; h < H; ++h) {
    const int nkb = ke, nke = h + 1 < H ? __ldg(level_ptr + h + 2) : ke;
    const int4 nci = CableAt(cinfo, nkb + tid, nke);
    if (kb + tid < ke)
      BlockBackward(Decode(ci), kb + tid, cmore, ctop, lower, upper, diag, rhs, ok);
    for (int k = kb + tid + kBlockThreads; k < ke; k += kBlockThreads)
      BlockBackward(Decode(__ldg(cinfo + k)), k, cmore, ctop, lower, upper, diag, rhs, ok);
    __syncthreads();
    kb = nkb;
    ke = nke;
    ci = nci;
  }
  // Forward, from the root's level down.
  kb = __ldg(level_ptr + H - 1);
  ke = __ldg(level_ptr + H);
  ci = CableAt(cinfo, kb + tid, ke);
  for (int h = H - 1; h >= 0; --h) {
    const int nke = kb, nkb = h > 0 ? __ldg(level_ptr + h - 1) : kb;
    const int4 nci = CableAt(cinfo, nkb + tid, nke);
    if (kb + tid < ke) BlockForward(Decode(ci), lower, rhs, ok);
    for (int k = kb + tid + kBlockThreads; k < ke; k += kBlockThreads)
      BlockForward(Decode(__ldg(cinfo + k)), lower, rhs, ok);
    __syncthreads();
    kb = nkb;
    ke = nke;
    ci = nci;
  }
  a.CopyOut(x, status, ok);
}

// Tree contraction (trisolve/tree.h, TreeContraction), one cell a block, either layout: the
// cell's four arrays copied into shared memory as for cables-block, then each round's removals
// (a thread a node), a barrier, each round's updates (a thread a survivor: it alone writes its
// row), a barrier; back substitution runs the rounds in reverse. A removed node v keeps diag =
// upper_v (what its parent takes), upper = wc_v, lower = wp_v, rhs = q_v, then x_v. The
// arithmetic per node is the CPU reference's ContractionOne.
//
// The schedule stays in global memory (two cells' arrays fill shared memory), packed in 8-byte
// entries of 16-bit fields stored plus one (0: none) so that a round's entries are one load
// each: removal {v | (p + 1) << 16, c + 1}; update {u | (from + 1) << 16, (child0 + 1) |
// (child1 + 1) << 16}, child1 + 1 = 0xffff meaning the removed children are the list
// upd_more[k] = {first, count} of `children`. A thread's first entries of the next round are
// loaded during this one; the rounds' offsets are copied into shared memory at the start.
constexpr int kListMark = 0xffff;
constexpr int kMaxRounds = 255;  // O(log n) rounds: 12 for the 3,187-node cell, ~33 at 65,534
template <typename T>
__device__ __forceinline__ void ContractRemove(int2 e, T* lower, T* upper, T* diag, T* rhs,
                                               bool& ok) {
  const int v = e.x & 0xffff, p = (e.x >> 16) - 1, c = e.y - 1;
  const T D = diag[v], R = rhs[v], lo = lower[v], up = upper[v];
  const T uc = c >= 0 ? upper[c] : T(0);
  ok &= !Vanishes(D, T(0));
  const T inv = Rcp(D);
  rhs[v] = R * inv;
  lower[v] = p >= 0 ? lo * inv : T(0);
  upper[v] = c >= 0 ? uc * inv : T(0);
  diag[v] = p >= 0 ? up : T(0);
}

template <typename T>
__device__ __forceinline__ void ContractUpdate(int2 e, int k, const int2* __restrict__ upd_more,
                                               const int32_t* __restrict__ children,
                                               T* lower, T* upper, T* diag, T* rhs, bool& ok) {
  const int u = e.x & 0xffff, from = (e.x >> 16) - 1;
  const int c0 = (e.y & 0xffff) - 1, c1f = (e.y >> 16) & 0xffff;
  T D = diag[u], R = rhs[u], S = fabs(D);
  if (from >= 0) {
    const T lo = lower[u], wc = upper[from], d = lo * wc;
    D -= d;
    S += fabs(d);
    R -= lo * rhs[from];
    lower[u] = -lo * lower[from];
    upper[u] = -diag[from] * wc;
  }
  auto take = [&](int w) {
    const T up = diag[w], d = up * lower[w];
    D -= d;
    S += fabs(d);
    R -= up * rhs[w];
  };
  if (c1f == kListMark) {
    const int2 m = __ldg(upd_more + k);
    for (int q = m.x; q < m.x + m.y; ++q) take(__ldg(children + q));
  } else {
    if (c0 >= 0) take(c0);
    if (c1f > 0) take(c1f - 1);
  }
  ok &= !Vanishes(D, S);
  diag[u] = D;
  rhs[u] = R;
}

template <typename T>
__device__ __forceinline__ void ContractSubstitute(int2 e, const T* lower, const T* upper,
                                                   T* rhs, bool& ok) {
  const int v = e.x & 0xffff, p = (e.x >> 16) - 1, c = e.y - 1;
  T x = rhs[v];
  if (p >= 0) x -= lower[v] * rhs[p];
  if (c >= 0) x -= upper[v] * rhs[c];
  ok &= Finite(x);
  rhs[v] = x;
}

__device__ __forceinline__ int2 EntryAt(const int2* __restrict__ a, int k, int end) {
  return k < end ? __ldg(a + k) : int2{0, 0};
}

template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kBlockThreads, 2)
    ContractionBlockKernel(TreeProblem<T> p, const int2* __restrict__ elim,
                           const int2* __restrict__ upd, const int2* __restrict__ upd_more,
                           const int32_t* __restrict__ children,
                           const int32_t* __restrict__ elim_ptr,
                           const int32_t* __restrict__ upd_ptr, int R, T* x, uint8_t* status) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x;
  CellArrays<T, kInterleaved> a(p, smem_raw);
  T *lower = a.lower, *upper = a.upper, *diag = a.diag, *rhs = a.rhs;
  // The rounds' offsets in shared memory: a round's entry prefetch is then one load, not two.
  __shared__ int ptr_e[kMaxRounds + 1], ptr_u[kMaxRounds + 1];
  for (int r = tid; r <= R; r += kBlockThreads) {
    ptr_e[r] = __ldg(elim_ptr + r);
    ptr_u[r] = __ldg(upd_ptr + r);
  }
  int eb = __ldg(elim_ptr), ee = __ldg(elim_ptr + 1);
  int ub = __ldg(upd_ptr), ue = __ldg(upd_ptr + 1);
  int2 e = EntryAt(elim, eb + tid, ee), u = EntryAt(upd, ub + tid, ue);
  a.CopyIn();
  bool ok = true;
  for (int r = 0; r < R; ++r) {
    const int neb = ee, nee = r + 1 < R ? ptr_e[r + 2] : ee;
    const int nub = ue, nue = r + 1 < R ? ptr_u[r + 2] : ue;
    const int2 ne = EntryAt(elim, neb + tid, nee), nu = EntryAt(upd, nub + tid, nue);
    if (eb + tid < ee) ContractRemove(e, lower, upper, diag, rhs, ok);
    // Further entries two at a time: both loads in flight before either is used.
    for (int k = eb + tid + kBlockThreads; k < ee; k += 2 * kBlockThreads) {
      const int2 a = __ldg(elim + k), b = EntryAt(elim, k + kBlockThreads, ee);
      ContractRemove(a, lower, upper, diag, rhs, ok);
      if (k + kBlockThreads < ee) ContractRemove(b, lower, upper, diag, rhs, ok);
    }
    __syncthreads();
    if (ub < ue) {
      if (ub + tid < ue)
        ContractUpdate(u, ub + tid, upd_more, children, lower, upper, diag, rhs, ok);
      for (int k = ub + tid + kBlockThreads; k < ue; k += 2 * kBlockThreads) {
        const int2 a = __ldg(upd + k), b = EntryAt(upd, k + kBlockThreads, ue);
        ContractUpdate(a, k, upd_more, children, lower, upper, diag, rhs, ok);
        if (k + kBlockThreads < ue)
          ContractUpdate(b, k + kBlockThreads, upd_more, children, lower, upper, diag, rhs, ok);
      }
      __syncthreads();
    }
    eb = neb;
    ee = nee;
    ub = nub;
    ue = nue;
    e = ne;
    u = nu;
  }
  eb = ptr_e[R - 1];
  ee = ptr_e[R];
  e = EntryAt(elim, eb + tid, ee);
  for (int r = R - 1; r >= 0; --r) {
    const int nee = eb, neb = r > 0 ? ptr_e[r - 1] : eb;
    const int2 ne = EntryAt(elim, neb + tid, nee);
    if (eb + tid < ee) ContractSubstitute(e, lower, upper, rhs, ok);
    for (int k = eb + tid + kBlockThreads; k < ee; k += 2 * kBlockThreads) {
      const int2 a = __ldg(elim + k), b = EntryAt(elim, k + kBlockThreads, ee);
      ContractSubstitute(a, lower, upper, rhs, ok);
      if (k + kBlockThreads < ee) ContractSubstitute(b, lower, upper, rhs, ok);
    }
    __syncthreads();
    eb = neb;
    ee = nee;
    e = ne;
  }
  a.CopyOut(x, status, ok);
}


// Cells of different sizes one a block (tree/cells.h): the contraction-block kernel, flat,
// each block reading its cell's description first: {first node (two halves), n | rounds <<
// 16, where its structure's round offsets start in ptr_e / ptr_u}. The structures' schedules
// lie end to end (the offsets rebased to the whole arrays), so a round's entries are read as
// for one morphology; cells of one structure read the same entries. A launch covers blocks of
// similar sizes (dynamic shared memory for its largest); kThreads is what lets as many of its
// blocks run on an SM as that shared memory holds (TreeCellsBlockThreads; rounds halve the
// nodes left, so fewer threads a cell cost only the first rounds' removals).
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    ContractionCellsKernel(const T* __restrict__ g_lower, const T* __restrict__ g_upper,
                           const T* __restrict__ g_diag, const T* __restrict__ g_rhs,
                           const int4* __restrict__ cell_info, const int32_t* __restrict__ cell_id,
                           int32_t block0, const int2* __restrict__ elim,
                           const int2* __restrict__ upd, const int2* __restrict__ upd_more,
                           const int32_t* __restrict__ children,
                           const int32_t* __restrict__ elim_ptr,
                           const int32_t* __restrict__ upd_ptr, T* x, uint8_t* status) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x;
  const int b = block0 + int(blockIdx.x);
  const int4 info = __ldg(cell_info + b);
  const int64_t first = int64_t((uint64_t(uint32_t(info.y)) << 32) | uint32_t(info.x));
  const int n = info.z & 0xffff, R = (info.z >> 16) & 0xff, pb = info.w;
  T* lower = reinterpret_cast<T*>(smem_raw);
  T* upper = lower + n;
  T* diag = upper + n;
  T* rhs = diag + n;
  // The cell's values are asked for first: the round offsets' reads (which wait on the cell's
  // description too) then overlap them instead of delaying them.
  for (int i = tid; i < n; i += kThreads) {
    __pipeline_memcpy_async(lower + i, g_lower + first + i, sizeof(T));
    __pipeline_memcpy_async(upper + i, g_upper + first + i, sizeof(T));
    __pipeline_memcpy_async(diag + i, g_diag + first + i, sizeof(T));
    __pipeline_memcpy_async(rhs + i, g_rhs + first + i, sizeof(T));
  }
  __shared__ int ptr_e[kMaxRounds + 1], ptr_u[kMaxRounds + 1];
  for (int r = tid; r <= R; r += kThreads) {
    ptr_e[r] = __ldg(elim_ptr + pb + r);
    ptr_u[r] = __ldg(upd_ptr + pb + r);
  }
  int eb = __ldg(elim_ptr + pb), ee = __ldg(elim_ptr + pb + 1);
  int ub = __ldg(upd_ptr + pb), ue = __ldg(upd_ptr + pb + 1);
  int2 e = EntryAt(elim, eb + tid, ee), u = EntryAt(upd, ub + tid, ue);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  bool ok = true;
  for (int r = 0; r < R; ++r) {
    const int neb = ee, nee = r + 1 < R ? ptr_e[r + 2] : ee;
    const int nub = ue, nue = r + 1 < R ? ptr_u[r + 2] : ue;
    const int2 ne = EntryAt(elim, neb + tid, nee), nu = EntryAt(upd, nub + tid, nue);
    if (eb + tid < ee) ContractRemove(e, lower, upper, diag, rhs, ok);
    for (int k = eb + tid + kThreads; k < ee; k += 2 * kThreads) {
      const int2 a = __ldg(elim + k), c = EntryAt(elim, k + kThreads, ee);
      ContractRemove(a, lower, upper, diag, rhs, ok);
      if (k + kThreads < ee) ContractRemove(c, lower, upper, diag, rhs, ok);
    }
    __syncthreads();
    if (ub < ue) {
      if (ub + tid < ue)
        ContractUpdate(u, ub + tid, upd_more, children, lower, upper, diag, rhs, ok);
      for (int k = ub + tid + kThreads; k < ue; k += 2 * kThreads) {
        const int2 a = __ldg(upd + k), c = EntryAt(upd, k + kThreads, ue);
        ContractUpdate(a, k, upd_more, children, lower, upper, diag, rhs, ok);
        if (k + kThreads < ue)
          ContractUpdate(c, k + kThreads, upd_more, children, lower, upper, diag, rhs, ok);
      }
      __syncthreads();
    }
    eb = neb;
    ee = nee;
    ub = nub;
    ue = nue;
    e = ne;
    u = nu;
  }
  eb = ptr_e[R - 1];
  ee = ptr_e[R];
  e = EntryAt(elim, eb + tid, ee);
  for (int r = R - 1; r >= 0; --r) {
    const int nee = eb, neb = r > 0 ? ptr_e[r - 1] : eb;
    const int2 ne = EntryAt(elim, neb + tid, nee);
    if (eb + tid < ee) ContractSubstitute(e, lower, upper, rhs, ok);
    for (int k = eb + tid + kThreads; k < ee; k += 2 * kThreads) {
      const int2 a = __ldg(elim + k), c = EntryAt(elim, k + kThreads, ee);
      ContractSubstitute(a, lower, upper, rhs, ok);
      if (k + kThreads < ee) ContractSubstitute(c, lower, upper, rhs, ok);
    }
    __syncthreads();
    eb = neb;
    ee = nee;
    e = ne;
  }
  for (int i = tid; i < n; i += kThreads) x[first + i] = rhs[i];
  if (!ok) status[__ldg(cell_id + b)] = kFlagVanished;
}

// Cells of different sizes one a block by the cable heights (tree/cells.h): CablesBlockKernel,
// flat, each block reading its cell's description first: {first node (two halves), n |
// heights << 16, where its structure's level offsets start in level_ptr}. The structures'
// cable descriptions lie end to end (cmore's child-list offsets and the levels rebased).
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    CablesCellsKernel(const T* __restrict__ g_lower, const T* __restrict__ g_upper,
                      const T* __restrict__ g_diag, const T* __restrict__ g_rhs,
                      const int4* __restrict__ cell_info, const int32_t* __restrict__ cell_id,
                      int32_t block0, const int4* __restrict__ cinfo,
                      const int2* __restrict__ cmore, const int32_t* __restrict__ ctop,
                      const int32_t* __restrict__ level_ptr, T* x, uint8_t* status) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int tid = threadIdx.x;
  const int b = block0 + int(blockIdx.x);
  const int4 info = __ldg(cell_info + b);
  const int64_t first = int64_t((uint64_t(uint32_t(info.y)) << 32) | uint32_t(info.x));
  const int n = info.z & 0xffff, H = (info.z >> 16) & 0xffff;
  const int32_t* lp = level_ptr + info.w;
  T* lower = reinterpret_cast<T*>(smem_raw);
  T* upper = lower + n;
  T* diag = upper + n;
  T* rhs = diag + n;  // R/D, then x
  // (the cell's values asked for before its first cables, as ContractionCellsKernel)
  for (int i = tid; i < n; i += kThreads) {
    __pipeline_memcpy_async(lower + i, g_lower + first + i, sizeof(T));
    __pipeline_memcpy_async(upper + i, g_upper + first + i, sizeof(T));
    __pipeline_memcpy_async(diag + i, g_diag + first + i, sizeof(T));
    __pipeline_memcpy_async(rhs + i, g_rhs + first + i, sizeof(T));
  }
  int kb = __ldg(lp), ke = __ldg(lp + 1);
  int4 ci = CableAt(cinfo, kb + tid, ke);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  bool ok = true;
  for (int h = 0; h < H; ++h) {
    const int nkb = ke, nke = h + 1 < H ? __ldg(lp + h + 2) : ke;
    const int4 nci = CableAt(cinfo, nkb + tid, nke);
    if (kb + tid < ke)
      BlockBackward(Decode(ci), kb + tid, cmore, ctop, lower, upper, diag, rhs, ok);
    for (int k = kb + tid + kThreads; k < ke; k += kThreads)
      BlockBackward(Decode(__ldg(cinfo + k)), k, cmore, ctop, lower, upper, diag, rhs, ok);
    __syncthreads();
    kb = nkb;
    ke = nke;
    ci = nci;
  }
  kb = __ldg(lp + H - 1);
  ke = __ldg(lp + H);
  ci = CableAt(cinfo, kb + tid, ke);
  for (int h = H - 1; h >= 0; --h) {
    const int nke = kb, nkb = h > 0 ? __ldg(lp + h - 1) : kb;
    const int4 nci = CableAt(cinfo, nkb + tid, nke);
    if (kb + tid < ke) BlockForward(Decode(ci), lower, rhs, ok);
    for (int k = kb + tid + kThreads; k < ke; k += kThreads)
      BlockForward(Decode(__ldg(cinfo + k)), lower, rhs, ok);
    __syncthreads();
    kb = nkb;
    ke = nke;
    ci = nci;
  }
  for (int i = tid; i < n; i += kThreads) x[first + i] = rhs[i];
  if (!ok) status[__ldg(cell_id + b)] = kFlagVanished;
}

}  // namespace
}  // namespace trisolve::cuda
