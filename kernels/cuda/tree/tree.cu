// Batched Hines solves: one thread per cell of a shared morphology.
#include <cfloat>

#include "runtime/check.h"
#include "runtime/launch.h"
#include "tree/tree.h"

namespace trisolve::cuda {
namespace {

constexpr int kTreeThreads = 32;  // one warp a block: few cells spread evenly over the SMs
constexpr int kPrefetch = 16;     // nodes whose inputs are loaded ahead of the sweep
constexpr int64_t kMaxSmemBytes = 200 * 1024;

template <typename T>
__device__ __forceinline__ T TreeEps() { return sizeof(T) == 8 ? T(DBL_EPSILON) : T(FLT_EPSILON); }
template <typename T>
__device__ __forceinline__ T TreeMax() { return sizeof(T) == 8 ? T(DBL_MAX) : T(FLT_MAX); }

// kGlobalTree: the parent array and flags are read from global memory (one set per cell when
// p.parent_per_system, else one shared set too large for shared memory).
template <typename T, bool kInterleaved, bool kGlobalTree>
__global__ void __launch_bounds__(kTreeThreads)
    HinesBatchKernel(TreeProblem<T> p, const uint8_t* __restrict__ node_flags, T* __restrict__ x,
                     T* __restrict__ lnorm, T* __restrict__ accD, T* __restrict__ accR,
                     uint8_t* __restrict__ status) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int32_t* parent;
  const uint8_t* flags;
  if constexpr (kGlobalTree) {
    if (s >= p.batch) return;
    const int64_t o = p.parent_per_system ? s * p.n : 0;
    parent = p.parent + o;
    flags = node_flags + o;
  } else {
    int32_t* sp = reinterpret_cast<int32_t*>(smem_raw);
    uint8_t* sf = reinterpret_cast<uint8_t*>(sp + p.n);
    for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
      sp[i] = p.parent[i];
      sf[i] = node_flags[i];
    }
    __syncthreads();
    if (s >= p.batch) return;
    parent = sp;
    flags = sf;
  }
  auto at = [&](int64_t i) { return kInterleaved ? i * p.batch + s : s * p.n + i; };
  bool ok = true;
  // Backward sweep, leaves to root. The inputs of the next kPrefetch nodes are loaded before
  // any is used (they do not depend on the elimination), so one thread keeps many loads in
  // flight; the branch accumulators, which nodes of the same group may have just written, are
  // read in order.
  T carryD = T(0), carryR = T(0);
  for (int64_t i0 = p.n - 1; i0 >= 0; i0 -= kPrefetch) {
    T lo[kPrefetch], up[kPrefetch], dg[kPrefetch], rh[kPrefetch];
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int64_t i = i0 - u;
      if (i >= 0) {
        const int64_t e = at(i);
        dg[u] = __ldg(p.diag + e);
        rh[u] = __ldg(p.rhs + e);
        lo[u] = i > 0 ? __ldg(p.lower + e) : T(0);
        up[u] = i > 0 ? __ldg(p.upper + e) : T(0);
      }
    }
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int64_t i = i0 - u;
      if (i < 0) break;
      const int64_t e = at(i);
      const uint8_t f = flags[i];
      T D = dg[u] - carryD, R = rh[u] - carryR;
      T scale = fabs(dg[u]) + fabs(carryD);
      if (f & kHasBranchAcc) {
        const T ad = accD[e];
        D -= ad;
        R -= accR[e];
        scale += fabs(ad);
      }
      const T m = fabs(D);
      ok &= (m <= TreeMax<T>()) && !(m <= TreeEps<T>() * scale);
      const T inv = T(1) / D;
      x[e] = R * inv;  // R_i / D_i, until the forward sweep
      carryD = T(0);
      carryR = T(0);
      if (i > 0) {
        lnorm[e] = lo[u] * inv;
        const T g = up[u] * inv;  // the factor eliminating A[parent][i]
        const T cD = g * lo[u], cR = g * R;
        if (f & kCarryToParent) {
          carryD = cD;
          carryR = cR;
        } else {
          const int64_t ep = at(parent[i]);
          if (f & kFirstBranchChild) {
            accD[ep] = cD;
            accR[ep] = cR;
          } else {
            accD[ep] += cD;
            accR[ep] += cR;
          }
        }
      }
    }
  }
  // Forward sweep, root to leaves: x_i = R_i / D_i - (lower_i / D_i) x_parent. A group's
  // R/D and lower/D are loaded ahead; x of a branch's parent was written before the group.
  T xprev = x[at(0)];
  ok &= fabs(xprev) <= TreeMax<T>();
  for (int64_t i0 = 1; i0 < p.n; i0 += kPrefetch) {
    T q[kPrefetch], l[kPrefetch];
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int64_t i = i0 + u;
      if (i < p.n) {
        q[u] = x[at(i)];
        l[u] = lnorm[at(i)];
      }
    }
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int64_t i = i0 + u;
      if (i >= p.n) break;
      const T xp = (flags[i] & kCarryToParent) ? xprev : x[at(parent[i])];
      const T xi = q[u] - l[u] * xp;
      ok &= fabs(xi) <= TreeMax<T>();
      x[at(i)] = xi;
      xprev = xi;
    }
  }
  if (!ok) status[s] = 1;
}

}  // namespace

std::vector<uint8_t> TreeNodeFlags(const int32_t* parent, int64_t n) {
  std::vector<uint8_t> f(static_cast<size_t>(n), 0);
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t j = n - 1; j >= 1; --j) {
    const int32_t pj = parent[j];
    if (pj == j - 1) {
      f[j] |= kCarryToParent;
      continue;
    }
    f[pj] |= kHasBranchAcc;
    if (!seen[pj]) {
      f[j] |= kFirstBranchChild;
      seen[pj] = true;
    }
  }
  return f;
}

int64_t MaxTreeNodesOnChip() { return kMaxSmemBytes / 5; }

template <typename T>
absl::Status SolveTreeBatchDevice(const TreeProblem<T>& p, const uint8_t* node_flags, T* x,
                                  uint8_t* status_flags, Pool& pool, cudaStream_t stream) {
  auto scratch = pool.Get(int64_t(sizeof(T)) * 3 * p.n * p.batch);
  if (!scratch.ok()) return scratch.status();
  T* lnorm = static_cast<T*>(scratch->get());
  T* accD = lnorm + p.n * p.batch;
  T* accR = accD + p.n * p.batch;
  const bool global = p.parent_per_system || p.n > MaxTreeNodesOnChip();
  const size_t smem = global ? 0 : size_t(p.n) * 5;
  const unsigned blocks = unsigned((p.batch + kTreeThreads - 1) / kTreeThreads);
  const bool il = p.layout == Layout::kInterleaved;
  auto kernel = global ? (il ? HinesBatchKernel<T, true, true> : HinesBatchKernel<T, false, true>)
                       : (il ? HinesBatchKernel<T, true, false> : HinesBatchKernel<T, false, false>);
  if (!global)
    if (auto st = AllowSharedBytes(kernel, smem); !st.ok()) return st;
  kernel<<<blocks, kTreeThreads, smem, stream>>>(p, node_flags, x, lnorm, accD, accR,
                                                 status_flags);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  // The scratch returns to the pool when this function ends: the kernel must be done with it.
  return CudaStatus(cudaStreamSynchronize(stream), "HinesBatchKernel");
}

template absl::Status SolveTreeBatchDevice(const TreeProblem<double>&, const uint8_t*, double*,
                                           uint8_t*, Pool&, cudaStream_t);
template absl::Status SolveTreeBatchDevice(const TreeProblem<float>&, const uint8_t*, float*,
                                           uint8_t*, Pool&, cudaStream_t);

}  // namespace trisolve::cuda
