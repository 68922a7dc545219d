// "pivoting": LAPACK dgtsv's Gaussian elimination with partial pivoting (the CPU reference's
// PivotingStrided, row interchanges and all), one thread a system, in both layouts.
//
// Why recomputation instead of storing U: the elimination's U (three values a row) and the
// modified right-hand side would be four arrays written and read again -- 13 arrays of traffic
// against the fast kernels' 5. Instead the forward sweep keeps only its state (the current
// pivot row: D, DU and the right-hand side) every kRows rows (3 values each kRows rows, in
// global scratch), and the backward sweep, block by block from the last, restarts the
// elimination at the block's checkpoint, holds the block's rows of U in registers and
// substitutes back through them: the coefficients are read twice and x written once, 9 arrays
// of traffic, with bitwise the same elimination both times.
//
// Layouts: in the interleaved layout a warp's loads of one row are one coalesced access. In the
// flat layout a warp stages a tile of kRows rows of its 32 systems through shared memory (each
// system's kRows rows are contiguous: whole sectors), and stores x the same way.
//
// Status as the reference decides it: a pivot that is exactly zero or not finite after taking
// the larger candidate (the column is zero below the diagonal: singular to working precision),
// or an x that is not finite, flags the system; its x is written as zeros.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/numerics.cuh"
#include "runtime/check.h"
#include "tridiagonal/pivoting_step.cuh"
#include "tridiagonal/tridiagonal.h"

namespace trisolve::cuda {
namespace {

constexpr int kRows = 8;             // rows a block of the recomputation (registers: ~8 kRows T)
constexpr int kInterThreads = 128;   // interleaved: threads a block
constexpr int kFlatWarps = 2;        // flat: warps a block, each with its own tile

template <typename T>
struct Tile {
  T v[4][kRows][33];  // a, b, c, d; rows; the warp's 32 systems (+1: no bank conflicts)
};

// Rows [k0, k0 + kRows) of the thread's system into A, B, C, Y (rows past n: zeros).
// Interleaved: straight loads. Flat: the warp's tile, loaded coalesced by all 32 lanes (every
// lane must call it).
template <typename T, bool kInter>
__device__ __forceinline__ void LoadRows(const TridiagonalProblem<T>& p, int64_t s, int64_t s0,
                                         int64_t k0, Tile<T>* tile, int lane, T (&A)[kRows],
                                         T (&B)[kRows], T (&C)[kRows], T (&Y)[kRows]) {
  if constexpr (kInter) {
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      const int64_t k = k0 + t;
      const bool in = k < p.n;
      const int64_t i = k * p.batch + s;
      A[t] = in ? p.a[i] : T(0);
      B[t] = in ? p.b[i] : T(0);
      C[t] = in ? p.c[i] : T(0);
      Y[t] = in ? p.d[i] : T(0);
    }
  } else {
    const T* arr[4] = {p.a, p.b, p.c, p.d};
    __syncwarp();  // the tile's previous reads are done
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int it = 0; it < kRows; ++it) {
        const int e = lane + 32 * it;  // element e: system e / kRows, row e % kRows
        const int j = e / kRows, t = e % kRows;
        const int64_t sys = s0 + j, k = k0 + t;
        tile->v[q][t][j] = sys < p.batch && k < p.n ? arr[q][sys * p.n + k] : T(0);
      }
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      A[t] = tile->v[0][t][lane];
      B[t] = tile->v[1][t][lane];
      C[t] = tile->v[2][t][lane];
      Y[t] = tile->v[3][t][lane];
    }
  }
}

// only_flagged: solve only the systems whose flag is set (auto's second solve of the systems
// the fast kernel flagged), clear the flag where pivoting solves one, and count them in
// *resolved (mapped host memory) -- the other systems' x and flags are not touched.
template <typename T, bool kInter>
__global__ void __launch_bounds__(kInter ? kInterThreads : 32 * kFlatWarps)
    PivotingKernel(TridiagonalProblem<T> p, T* __restrict__ x, uint8_t* flags,
                   T* __restrict__ ck, bool only_flagged, int* resolved) {
  const int lane = threadIdx.x & 31;
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s0 = s - lane;  // the warp's first system
  const bool live = s < p.batch;
  Tile<T>* tile = nullptr;
  if constexpr (!kInter) {
    __shared__ Tile<T> tiles[kFlatWarps];
    tile = &tiles[threadIdx.x / 32];
  }
  bool mine = live;  // whether this thread writes its system's answer
  if (only_flagged) mine = live && flags[s] != 0;
  unsigned owners = 0;  // flat: the warp's lanes that write (the tile's stores ask)
  if constexpr (kInter) {
    if (!mine) return;
  } else {
    owners = __ballot_sync(0xffffffffu, mine);
    if (owners == 0) return;  // the whole warp, so that the tiles' lanes stay together
  }
  const int64_t n = p.n;
  const int64_t nb = (n + kRows - 1) / kRows;
  const int64_t bs = p.batch;
  T A[kRows], B[kRows], C[kRows], Y[kRows];
  bool ok = true;
  T d = T(0), u = T(0), r = T(0);

  // Forward: the elimination, its state kept at the start of every block but the first.
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t k0 = j * kRows;
    LoadRows<T, kInter>(p, s, s0, k0, tile, lane, A, B, C, Y);
    if (j > 0 && live) {
      ck[(3 * j + 0) * bs + s] = d;
      ck[(3 * j + 1) * bs + s] = u;
      ck[(3 * j + 2) * bs + s] = r;
    }
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      const int64_t k = k0 + t;
      if (k >= n) break;
      if (k == 0) {
        d = B[0];
        u = n > 1 ? C[0] : T(0);
        r = Y[0];
        continue;
      }
      T oD, oU, oL, oY;
      Absorb(d, u, r, A[t], B[t], k + 1 < n ? C[t] : T(0), Y[t], ok, oD, oU, oL, oY);
    }
  }
  ok &= d != T(0) && Finite(d);
  T x1 = r / d, x2 = T(0);  // x_{n-1}; the row below it
  ok &= Finite(x1);

  // Backward: block by block from the last, the elimination again from its checkpoint, then
  // the block's rows of U substituted back. Block j consumes rows [k0, e) and yields U's rows
  // k0 - 1 .. e - 2; x's rows [k0, e) are stored with it (row e - 1 came from the block above,
  // row k0 - 1 goes with the block below).
  T xo[kRows];
  for (int64_t j = nb - 1; j >= 0; --j) {
    const int64_t k0 = j * kRows;
    const int64_t e = k0 + kRows < n ? k0 + kRows : n;
    LoadRows<T, kInter>(p, s, s0, k0, tile, lane, A, B, C, Y);
    if (j > 0) {
      d = live ? ck[(3 * j + 0) * bs + s] : T(0);
      u = live ? ck[(3 * j + 1) * bs + s] : T(0);
      r = live ? ck[(3 * j + 2) * bs + s] : T(0);
    }
    T UD[kRows], UU[kRows], UL[kRows], UY[kRows];
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      const int64_t k = k0 + t;
      UD[t] = T(1), UU[t] = T(0), UL[t] = T(0), UY[t] = T(0);
      if (k >= n) continue;
      if (k == 0) {
        d = B[0];
        u = n > 1 ? C[0] : T(0);
        r = Y[0];
        continue;
      }
      bool unused = true;  // (the forward sweep judged these pivots)
      Absorb(d, u, r, A[t], B[t], k + 1 < n ? C[t] : T(0), Y[t], unused, UD[t], UU[t], UL[t],
             UY[t]);
    }
#pragma unroll
    for (int t = kRows - 1; t >= 0; --t) {
      const int64_t k = k0 + t;
      if (k >= e) continue;
      if (k == e - 1) xo[t] = x1;
      if (k == 0) continue;  // row k yields U's row k - 1
      const T xi = (UY[t] - UU[t] * x1 - UL[t] * x2) / UD[t];
      ok &= Finite(xi);
      x2 = x1;
      x1 = xi;
      if (t >= 1) xo[t - 1] = xi;
    }
    // x's rows [k0, e): rows past e - 1 of xo are not stored.
    if constexpr (kInter) {
#pragma unroll
      for (int t = 0; t < kRows; ++t)
        if (k0 + t < e) x[(k0 + t) * bs + s] = xo[t];
    } else {
      __syncwarp();
#pragma unroll
      for (int t = 0; t < kRows; ++t) tile->v[0][t][lane] = xo[t];
      __syncwarp();
#pragma unroll
      for (int it = 0; it < kRows; ++it) {
        const int e2 = lane + 32 * it;
        const int jj = e2 / kRows, t = e2 % kRows;
        const int64_t sys = s0 + jj, k = k0 + t;
        if (((owners >> jj) & 1u) && k < e) x[sys * n + k] = tile->v[0][t][jj];
      }
    }
  }
  if (!mine) return;
  if (!ok) {  // zeros, never what the elimination left
    const int64_t st = kInter ? bs : 1, off = kInter ? s : s * n;
    for (int64_t k = 0; k < n; ++k) x[off + k * st] = T(0);
  }
  if (only_flagged) {
    flags[s] = ok ? 0 : 1;
    if (resolved != nullptr) atomicAdd_system(resolved, 1);
  } else if (!ok) {
    flags[s] = 1;
  }
}

}  // namespace

int64_t PivotingScratchBytes(int64_t n, int64_t batch, bool float32) {
  const int64_t nb = (n + kRows - 1) / kRows;
  return 3 * nb * batch * (float32 ? 4 : 8) + 256;
}

template <typename T>
absl::Status LaunchPivoting(const TridiagonalProblem<T>& p, T* x, uint8_t* flags, void* scratch,
                            cudaStream_t stream, bool only_flagged, int* resolved) {
  if (p.batch <= 0 || p.n <= 0) return absl::OkStatus();
  T* ck = static_cast<T*>(scratch);
  if (p.layout == Layout::kInterleaved && p.batch > 1) {
    const unsigned blocks = unsigned((p.batch + kInterThreads - 1) / kInterThreads);
    PivotingKernel<T, true>
        <<<blocks, kInterThreads, 0, stream>>>(p, x, flags, ck, only_flagged, resolved);
  } else {
    TridiagonalProblem<T> flat = p;
    flat.layout = Layout::kFlat;  // (one system: the same array in both layouts)
    const int threads = 32 * kFlatWarps;
    const unsigned blocks = unsigned((p.batch + threads - 1) / threads);
    PivotingKernel<T, false>
        <<<blocks, threads, 0, stream>>>(flat, x, flags, ck, only_flagged, resolved);
  }
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status SolvePivotingDevice(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                 Pool& pool, cudaStream_t stream) {
  auto ck = pool.Get(PivotingScratchBytes(p.n, p.batch, sizeof(T) == 4));
  if (!ck.ok()) return ck.status();
  if (auto st = LaunchPivoting(p, x, flags, ck->get(), stream, false, nullptr); !st.ok())
    return st;
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before the scratch returns
  return absl::OkStatus();
}

template absl::Status LaunchPivoting(const TridiagonalProblem<double>&, double*, uint8_t*,
                                     void*, cudaStream_t, bool, int*);
template absl::Status LaunchPivoting(const TridiagonalProblem<float>&, float*, uint8_t*, void*,
                                     cudaStream_t, bool, int*);
template absl::Status SolvePivotingDevice(const TridiagonalProblem<double>&, double*, uint8_t*,
                                          Pool&, cudaStream_t);
template absl::Status SolvePivotingDevice(const TridiagonalProblem<float>&, float*, uint8_t*,
                                          Pool&, cudaStream_t);

}  // namespace trisolve::cuda
