// One large tree across the GPU: the cable elimination of trisolve/tree.h (TreeCables), one
// launch per height of the cable tree in each phase; long cables by the partitioned
// tridiagonal kernel. The arithmetic of a short cable is the CPU reference's CablesOne.
#include <algorithm>
#include <cfloat>

#include "check.h"
#include "numerics.cuh"
#include "tree_cuda.h"
#include "tridiagonal_cuda.h"

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
      const T inv = T(1) / D;
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
    if (flags[0] || (sys == 2 && flags[1])) status[s] = 1;
  }
}

constexpr int kBlockThreads = 512;
constexpr int64_t kBlockMaxCable = 64;
constexpr int64_t kBlockMaxSmem = 227 * 1024;

// One cell a block, flat layout: the cable elimination in shared memory.
template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    CablesBlockKernel(TreeProblem<T> p, const int4* __restrict__ cinfo,
                      const int2* __restrict__ ninfo, const int32_t* __restrict__ level_ptr,
                      const int32_t* __restrict__ node_level_ptr, int H, int slots, T* x,
                      uint8_t* status) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int n = int(p.n);
  P2<T>* contrib = reinterpret_cast<P2<T>*>(smem_raw);
  T* lower = reinterpret_cast<T*>(contrib + slots);
  T* upper = lower + n;
  T* diag = upper + n;
  T* rhs = diag + n;  // R/D, then q, then x
  const int64_t base = int64_t(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    lower[i] = __ldg(p.lower + base + i);
    upper[i] = __ldg(p.upper + base + i);
    diag[i] = __ldg(p.diag + base + i);
    rhs[i] = __ldg(p.rhs + base + i);
  }
  __syncthreads();
  bool ok = true;
  for (int h = 0; h < H; ++h) {
    for (int k = level_ptr[h] + threadIdx.x; k < level_ptr[h + 1]; k += blockDim.x) {
      const int4 ci = cinfo[k];
      const int s0 = ci.x, e0 = ci.y, cb = ci.z, cc = ci.w >> 16, slot = (ci.w & 0xffff) - 1;
      T carryD = 0, carryR = 0, carryS = 0;
      for (int q = cb; q < cb + cc; ++q) {
        const P2<T> g = contrib[q];
        carryD += g.x;
        carryR += g.y;
        carryS += fabs(g.x);
      }
      for (int j = e0; j >= s0; --j) {
        const T dg = diag[j], lo = lower[j], up = upper[j];
        const T D = dg - carryD, R = rhs[j] - carryR;
        ok &= !Vanishes(D, fabs(dg) + carryS);
        const T inv = T(1) / D;
        rhs[j] = R * inv;
        lower[j] = j > 0 ? lo * inv : T(0);
        const T g = j > 0 ? up * inv : T(0);
        carryD = g * lo;
        carryR = g * R;
        carryS = fabs(carryD);
      }
      if (slot >= 0) {
        P2<T> out;
        out.x = carryD;
        out.y = carryR;
        contrib[slot] = out;
      }
      T qprev = rhs[s0], wprev = lower[s0];
      ok &= Finite(qprev);
      for (int j = s0 + 1; j <= e0; ++j) {
        const T l = lower[j];
        qprev = rhs[j] - l * qprev;
        wprev = -l * wprev;
        ok &= Finite(qprev);
        rhs[j] = qprev;
        lower[j] = wprev;
      }
    }
    __syncthreads();
  }
  for (int h = H - 2; h >= 0; --h) {  // the root cable (height H - 1): x = q already
    for (int k = node_level_ptr[h] + threadIdx.x; k < node_level_ptr[h + 1]; k += blockDim.x) {
      const int2 nj = ninfo[k];
      const T v = rhs[nj.x] - lower[nj.x] * rhs[nj.y];
      ok &= Finite(v);
      rhs[nj.x] = v;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[base + i] = rhs[i];
  if (!ok) status[blockIdx.x] = 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TreeCablesPlan>> TreeCablesPlan::Make(const int32_t* parent,
                                                                     int64_t n, Pool& pool,
                                                                     cudaStream_t stream) {
  auto plan = std::unique_ptr<TreeCablesPlan>(new TreeCablesPlan);
  TreeCables& t = plan->t_;
  t = BuildTreeCables(parent, n);
  const int64_t C = t.cables(), H = t.levels();
  // Long cables last within their level (a stable partition keeps the rest in order).
  plan->short_end_.resize(H);
  for (int64_t h = 0; h < H; ++h) {
    auto b = t.order.begin() + t.level_ptr[h], e = t.order.begin() + t.level_ptr[h + 1];
    auto mid = std::stable_partition(b, e, [&](int32_t c) { return t.length(c) <= kLongCable; });
    plan->short_end_[h] = int32_t(mid - t.order.begin());
  }
  for (int64_t c = 0; c < C; ++c) plan->longest_ = std::max<int64_t>(plan->longest_, t.length(c));
  // Each cable leaves its contribution in the slot its anchor's cable reads (child_list's
  // positions), so that a cable reads its children's as one contiguous run.
  plan->slot_of_cable_.assign(C, -1);
  for (int64_t q = 0; q < int64_t(t.child_list.size()); ++q)
    plan->slot_of_cable_[t.child_list[q]] = int32_t(q);
  std::vector<int32_t> slot(C);
  for (int64_t k = 0; k < C; ++k) slot[k] = plan->slot_of_cable_[t.order[k]];
  // node_order lists the nodes cable by cable; the forward phase needs each one's anchor.
  std::vector<int32_t> node_anchor(n);
  {
    std::vector<int32_t> anchor_of_node(n);
    for (int64_t c = 0; c < C; ++c)
      for (int32_t j = t.start[c]; j < t.start[c + 1]; ++j) anchor_of_node[j] = t.anchor[c];
    for (int64_t k = 0; k < n; ++k) node_anchor[k] = anchor_of_node[t.node_order[k]];
  }
  // The narrow top of the cable tree goes to the one-block tail kernel.
  plan->tail_begin_ = int32_t(H);
  while (plan->tail_begin_ > 0) {
    const int32_t h = plan->tail_begin_ - 1;
    if (plan->short_end_[h] != t.level_ptr[h + 1] ||
        t.level_ptr[h + 1] - t.level_ptr[h] > kTailMaxCables ||
        t.node_level_ptr[h + 1] - t.node_level_ptr[h] > kTailMaxNodes)
      break;
    plan->tail_begin_ = h;
  }
  const int64_t ints = 2 * (C + 1) + 2 * C + 2 * n + 2 * (H + 1);
  auto buf = pool.Get(ints * 4);
  if (!buf.ok()) return buf.status();
  plan->buf_ = std::move(*buf);
  int32_t* d = plan->buf_.as<int32_t>();
  std::vector<int32_t> all;
  all.reserve(ints);
  auto put = [&](const std::vector<int32_t>& v, const int32_t** dst) {
    *dst = d + all.size();
    all.insert(all.end(), v.begin(), v.end());
  };
  put(t.start, &plan->start_);
  put(t.child_ptr, &plan->child_ptr_);
  put(t.order, &plan->order_);
  put(slot, &plan->slot_);
  put(t.node_order, &plan->node_order_);
  put(node_anchor, &plan->node_anchor_);
  put(t.level_ptr, &plan->level_ptr_);
  put(t.node_level_ptr, &plan->node_level_ptr_);
  TRISOLVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d, all.data(), all.size() * 4, cudaMemcpyHostToDevice, stream));
  if (n < 65536) {
    std::vector<int4> ci(C);
    for (int64_t k = 0; k < C; ++k) {
      const int32_t c = t.order[k];
      const int32_t cc = t.child_ptr[c + 1] - t.child_ptr[c];
      ci[k] = int4{t.start[c], t.start[c + 1] - 1, t.child_ptr[c],
                   (slot[k] + 1) | (cc << 16)};
    }
    std::vector<int2> ni(n);
    for (int64_t k = 0; k < n; ++k) ni[k] = int2{t.node_order[k], node_anchor[k]};
    auto bb = pool.Get(int64_t(sizeof(int4)) * C + int64_t(sizeof(int2)) * n);
    if (!bb.ok()) return bb.status();
    plan->block_buf_ = std::move(*bb);
    auto* dci = plan->block_buf_.as<int4>();
    auto* dni = reinterpret_cast<int2*>(dci + C);
    plan->cinfo_ = dci;
    plan->ninfo_ = dni;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dci, ci.data(), sizeof(int4) * C,
                                                  cudaMemcpyHostToDevice, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dni, ni.data(), sizeof(int2) * n,
                                                  cudaMemcpyHostToDevice, stream));
  }
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return plan;
}

template <typename T>
bool CablesBlockFits(const TreeProblem<T>& p, const TreeCablesPlan& plan) {
  const int64_t slots = std::max<int64_t>(plan.t_.cables() - 1, 1);
  const int64_t smem = int64_t(sizeof(T)) * (4 * p.n + 2 * slots);
  return plan.cinfo_ != nullptr && p.layout == Layout::kFlat && !p.parent_per_system &&
         plan.longest_ <= kBlockMaxCable && smem <= kBlockMaxSmem;
}

template <typename T>
absl::Status SolveTreeCablesBlockDevice(const TreeProblem<T>& p, const TreeCablesPlan& plan,
                                        T* x, uint8_t* status_flags, cudaStream_t stream) {
  if (!CablesBlockFits(p, plan))
    return absl::InvalidArgumentError("the tree does not fit the one-block-a-cell kernel");
  const int slots = int(std::max<int64_t>(plan.t_.cables() - 1, 1));
  const size_t smem = sizeof(T) * (4 * size_t(p.n) + 2 * size_t(slots));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      CablesBlockKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  for (int64_t s0 = 0; s0 < p.batch; s0 += int64_t(1) << 30) {
    TreeProblem<T> q = p;
    const int64_t cells = std::min<int64_t>(p.batch - s0, int64_t(1) << 30);
    q.batch = cells;
    q.lower += s0 * p.n;
    q.upper += s0 * p.n;
    q.diag += s0 * p.n;
    q.rhs += s0 * p.n;
    CablesBlockKernel<T><<<unsigned(cells), kBlockThreads, smem, stream>>>(
        q, plan.cinfo_, plan.ninfo_, plan.level_ptr_, plan.node_level_ptr_,
        int(plan.t_.levels()), slots, x + s0 * p.n, status_flags + s0);
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

template bool CablesBlockFits(const TreeProblem<double>&, const TreeCablesPlan&);
template bool CablesBlockFits(const TreeProblem<float>&, const TreeCablesPlan&);
template absl::Status SolveTreeCablesBlockDevice(const TreeProblem<double>&,
                                                 const TreeCablesPlan&, double*, uint8_t*,
                                                 cudaStream_t);
template absl::Status SolveTreeCablesBlockDevice(const TreeProblem<float>&,
                                                 const TreeCablesPlan&, float*, uint8_t*,
                                                 cudaStream_t);

template <typename T>
absl::Status SolveTreeCablesDevice(const TreeProblem<T>& p, const TreeCablesPlan& plan, T* x,
                                   uint8_t* status_flags, Pool& pool, cudaStream_t stream) {
  if (p.parent_per_system && p.batch > 1)
    return absl::InvalidArgumentError("the cable solver takes one parent array for the batch");
  const TreeCables& t = plan.t_;
  if (t.n != p.n) return absl::InvalidArgumentError("tree plan and problem differ in n");
  const int64_t C = t.cables(), H = t.levels();
  auto scratch = pool.Get(int64_t(sizeof(T)) * (p.n + 2 * C) * p.batch);
  if (!scratch.ok()) return scratch.status();
  auto* contrib = scratch->as<P2<T>>();  // C pairs a system, first: aligned for pair loads
  T* w = reinterpret_cast<T*>(contrib + C * p.batch);
  const View v{plan.start_, plan.child_ptr_, plan.order_, plan.slot_,
               plan.node_order_, plan.node_anchor_, C};
  // Long cables: scratch for their tridiagonal systems, sized for the longest.
  Pool::Buffer lbuf;
  if (plan.longest_ > kLongCable) {
    const int64_t L = plan.longest_;
    auto b = pool.Get(int64_t(sizeof(T)) * 10 * L + 2);
    if (!b.ok()) return b.status();
    lbuf = std::move(*b);
  }
  const int32_t h0 = plan.tail_begin_;
  for (int64_t s_base = 0; s_base < p.batch; s_base += kMaxGridY) {
    const unsigned gy = unsigned(std::min(kMaxGridY, p.batch - s_base));
    for (int64_t h = 0; h < h0; ++h) {
      const int32_t lo = t.level_ptr[h], mid = plan.short_end_[h], hi = t.level_ptr[h + 1];
      if (mid > lo) {
        const dim3 grid(unsigned((mid - lo + kThreads - 1) / kThreads), gy);
        CablesBackward<T><<<grid, kThreads, 0, stream>>>(p, v, lo, mid, s_base, x, w, contrib,
                                                         status_flags);
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      }
      for (int32_t k = mid; k < hi; ++k) {
        const int32_t c = t.order[k];
        const int64_t L = t.length(c);
        const int sys = t.anchor[c] >= 0 ? 2 : 1;
        T* a = lbuf.as<T>();
        T* b = a + 2 * L;
        T* cc = b + 2 * L;
        T* d = cc + 2 * L;
        T* y = d + 2 * L;
        auto* fl = reinterpret_cast<uint8_t*>(y + 2 * L);
        const unsigned blocks = unsigned((L + 255) / 256);
        for (int64_t s = s_base; s < s_base + gy; ++s) {
          LongCablePrepare<T><<<blocks, 256, 0, stream>>>(p, v, c, s, sys, contrib, a, b, cc, d);
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(fl, 0, 2, stream));
          TridiagonalProblem<T> tp{sys, L, Layout::kFlat, a, b, cc, d};
          auto r = SolveTridiagonalDevice(tp, TridiagonalMethod::kAuto, y, fl, pool, stream);
          if (!r.ok()) return r.status();
          LongCableFinish<T><<<blocks, 256, 0, stream>>>(p, v, c, plan.slot_of_cable_[c], s, sys,
                                                         y, fl, x, w, contrib, status_flags);
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        }
      }
    }
    if (h0 < H) {
      CablesTail<T><<<dim3(1, gy), kTailThreads, 0, stream>>>(
          p, v, plan.level_ptr_, plan.node_level_ptr_, h0, int32_t(H), s_base, x, w, contrib,
          status_flags);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    for (int64_t h = std::min<int64_t>(h0, H - 1) - 1; h >= 0; --h) {
      const int32_t lo = t.node_level_ptr[h], hi = t.node_level_ptr[h + 1];
      const dim3 grid(unsigned((hi - lo + 255) / 256), gy);
      CablesForward<T><<<grid, 256, 0, stream>>>(p, v, lo, hi, s_base, x, w, status_flags);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
  }
  // The scratch returns to the pool when this function ends: the kernels must be done.
  return CudaStatus(cudaStreamSynchronize(stream), "cable tree solve");
}

template absl::Status SolveTreeCablesDevice(const TreeProblem<double>&, const TreeCablesPlan&,
                                            double*, uint8_t*, Pool&, cudaStream_t);
template absl::Status SolveTreeCablesDevice(const TreeProblem<float>&, const TreeCablesPlan&,
                                            float*, uint8_t*, Pool&, cudaStream_t);

}  // namespace trisolve::cuda
