// One large tree across the GPU: the cable elimination of trisolve/tree.h (TreeCables), one
// launch per height of the cable tree in each phase; long cables by the partitioned
// tridiagonal kernel. The arithmetic of a short cable is the CPU reference's CablesOne.
#include <algorithm>
#include <cfloat>

#include <cuda_pipeline.h>

#include "runtime/check.h"
#include "runtime/launch.h"
#include "common/numerics.cuh"
#include "tree/cells.h"
#include "tree/tree.h"
#include "tridiagonal/tridiagonal.h"
#include "tree/cables_kernels.cuh"

namespace trisolve::cuda {

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
  if (n < 65536 && plan->longest_ <= kBlockMaxCable) {
    std::vector<int4> ci(C);
    std::vector<int2> more(C, int2{0, 0});
    std::vector<int32_t> ctop(std::max<size_t>(t.child_list.size(), 1), 0);
    for (size_t q = 0; q < t.child_list.size(); ++q) ctop[q] = t.start[t.child_list[q]];
    for (int64_t k = 0; k < C; ++k) {
      const int32_t c = t.order[k];
      const int32_t cb = t.child_ptr[c], cc = t.child_ptr[c + 1] - cb;
      const uint32_t x = uint32_t(t.start[c]) | (uint32_t(t.length(c) - 1) << 16) |
                         (cc > 2 ? 1u << 31 : 0u);
      ci[k] = int4{int32_t(x), t.anchor[c], cc > 0 ? ctop[cb] : -1, cc > 1 ? ctop[cb + 1] : -1};
      if (cc > 2) more[k] = int2{cb + 2, cc - 2};
    }
    auto bb = pool.Get(int64_t(sizeof(int4) + sizeof(int2)) * C +
                       int64_t(sizeof(int32_t)) * int64_t(ctop.size()));
    if (!bb.ok()) return bb.status();
    plan->block_buf_ = std::move(*bb);
    auto* dci = plan->block_buf_.as<int4>();
    auto* dmo = reinterpret_cast<int2*>(dci + C);
    auto* dct = reinterpret_cast<int32_t*>(dmo + C);
    plan->cinfo_ = dci;
    plan->cmore_ = dmo;
    plan->ctop_ = dct;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dci, ci.data(), sizeof(int4) * C,
                                                  cudaMemcpyHostToDevice, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dmo, more.data(), sizeof(int2) * C,
                                                  cudaMemcpyHostToDevice, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dct, ctop.data(), 4 * ctop.size(),
                                                  cudaMemcpyHostToDevice, stream));
  }
  if (n < 65535) {  // 16-bit fields stored plus one, 0xffff kept as a mark
    const TreeContraction rc = BuildTreeContraction(parent, n);
    const int64_t R = rc.rounds(), E = int64_t(rc.elim.size()), U = int64_t(rc.upd.size());
    auto pack = [](int32_t lo, int32_t hi) { return int32_t(uint32_t(lo) | uint32_t(hi) << 16); };
    std::vector<int2> el(E), up(std::max<int64_t>(U, 1), int2{0, 0}), more(up.size(), int2{0, 0});
    for (int64_t k = 0; k < E; ++k) {
      const auto& e = rc.elim[k];
      el[k] = int2{pack(e.v, e.p + 1), e.c + 1};
    }
    for (int64_t k = 0; k < U; ++k) {
      const auto& u = rc.upd[k];
      int32_t y;
      if (u.count > 2) {
        y = pack(0, kListMark);
        more[k] = int2{u.first, u.count};
      } else {
        y = pack(u.count > 0 ? rc.children[u.first] + 1 : 0,
                 u.count > 1 ? rc.children[u.first + 1] + 1 : 0);
      }
      up[k] = int2{pack(u.u, u.from + 1), y};
    }
    std::vector<int32_t> ints(rc.elim_ptr);
    ints.insert(ints.end(), rc.upd_ptr.begin(), rc.upd_ptr.end());
    ints.insert(ints.end(), rc.children.begin(), rc.children.end());
    ints.push_back(0);
    const int64_t pairs = E + 2 * int64_t(up.size());
    auto cb = pool.Get(int64_t(sizeof(int2)) * pairs + 4 * int64_t(ints.size()));
    if (!cb.ok()) return cb.status();
    plan->contraction_buf_ = std::move(*cb);
    auto* de = plan->contraction_buf_.as<int2>();
    auto* du = de + E;
    auto* dm = du + up.size();
    auto* di = reinterpret_cast<int32_t*>(dm + up.size());
    plan->elim_ = de;
    plan->upd_ = du;
    plan->upd_more_ = dm;
    plan->elim_ptr_ = di;
    plan->upd_ptr_ = di + R + 1;
    plan->children_ = di + 2 * (R + 1);
    plan->rounds_ = int32_t(R);
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(de, el.data(), sizeof(int2) * E, cudaMemcpyHostToDevice, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(du, up.data(), sizeof(int2) * up.size(),
                                                  cudaMemcpyHostToDevice, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dm, more.data(), sizeof(int2) * more.size(),
                                                  cudaMemcpyHostToDevice, stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(di, ints.data(), 4 * ints.size(),
                                                  cudaMemcpyHostToDevice, stream));
    // The host vectors must outlive the copies.
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return plan;
}

template <typename T>
bool CablesBlockFits(const TreeProblem<T>& p, const TreeCablesPlan& plan) {
  const int64_t smem = int64_t(sizeof(T)) * 4 * p.n;
  return plan.cinfo_ != nullptr && !p.parent_per_system && plan.longest_ <= kBlockMaxCable &&
         smem <= kBlockMaxSmem;
}

// The launches of a one-block-a-cell kernel: `launch(q, x, status, cells)` runs it on cells
// of q (flat: at most 2^30 cells a launch, the pointers offset; interleaved: one grid).
template <typename T, typename Kernel, typename Launch>
absl::Status LaunchCellBlocks(const TreeProblem<T>& p, Kernel kernel, size_t smem, T* x,
                              uint8_t* status_flags, Launch launch) {
  if (auto st = AllowSharedBytes(kernel, smem); !st.ok()) return st;
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const bool il = p.layout == Layout::kInterleaved;
  const int64_t step = il ? p.batch : int64_t(1) << 30;
  if (il && p.batch > (int64_t(1) << 31) - 1)
    return absl::InvalidArgumentError("too many cells for one launch");
  for (int64_t s0 = 0; s0 < p.batch; s0 += step) {
    TreeProblem<T> q = p;
    const int64_t cells = std::min<int64_t>(p.batch - s0, step);
    if (!il) {
      q.batch = cells;
      q.lower += s0 * p.n;
      q.upper += s0 * p.n;
      q.diag += s0 * p.n;
      q.rhs += s0 * p.n;
    }
    launch(q, x + (il ? 0 : s0 * p.n), status_flags + s0, unsigned(cells));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SolveTreeCablesBlockDevice(const TreeProblem<T>& p, const TreeCablesPlan& plan,
                                        T* x, uint8_t* status_flags, cudaStream_t stream) {
  if (!CablesBlockFits(p, plan))
    return absl::InvalidArgumentError("the tree does not fit the one-block-a-cell kernel");
  const size_t smem = sizeof(T) * 4 * size_t(p.n);
  auto kernel = p.layout == Layout::kInterleaved ? CablesBlockKernel<T, true>
                                                 : CablesBlockKernel<T, false>;
  return LaunchCellBlocks(p, kernel, smem, x, status_flags,
                          [&](const TreeProblem<T>& q, T* xq, uint8_t* sq, unsigned cells) {
                            kernel<<<cells, kBlockThreads, smem, stream>>>(
                                q, plan.cinfo_, plan.cmore_, plan.ctop_, plan.level_ptr_,
                                int(plan.t_.levels()), xq, sq);
                          });
}

template <typename T>
bool ContractionBlockFits(const TreeProblem<T>& p, const TreeCablesPlan& plan) {
  return plan.elim_ != nullptr && plan.rounds_ <= kMaxRounds && !p.parent_per_system &&
         int64_t(sizeof(T)) * 4 * p.n + 8 * (kMaxRounds + 1) <= kBlockMaxSmem;
}

template <typename T>
absl::Status SolveTreeContractionBlockDevice(const TreeProblem<T>& p, const TreeCablesPlan& plan,
                                             T* x, uint8_t* status_flags, cudaStream_t stream) {
  if (!ContractionBlockFits(p, plan))
    return absl::InvalidArgumentError("the tree does not fit the one-block-a-cell kernel");
  const size_t smem = sizeof(T) * 4 * size_t(p.n);
  auto kernel = p.layout == Layout::kInterleaved ? ContractionBlockKernel<T, true>
                                                 : ContractionBlockKernel<T, false>;
  return LaunchCellBlocks(p, kernel, smem, x, status_flags,
                          [&](const TreeProblem<T>& q, T* xq, uint8_t* sq, unsigned cells) {
                            kernel<<<cells, kBlockThreads, smem, stream>>>(
                                q, plan.elim_, plan.upd_, plan.upd_more_, plan.children_,
                                plan.elim_ptr_, plan.upd_ptr_, plan.rounds_, xq, sq);
                          });
}

template bool ContractionBlockFits(const TreeProblem<double>&, const TreeCablesPlan&);
template bool ContractionBlockFits(const TreeProblem<float>&, const TreeCablesPlan&);
template absl::Status SolveTreeContractionBlockDevice(const TreeProblem<double>&,
                                                      const TreeCablesPlan&, double*, uint8_t*,
                                                      cudaStream_t);
template absl::Status SolveTreeContractionBlockDevice(const TreeProblem<float>&,
                                                      const TreeCablesPlan&, float*, uint8_t*,
                                                      cudaStream_t);

bool TreeCellFitsBlock(int64_t n, int64_t rounds, int elem_bytes) {
  return n < 65535 && rounds >= 1 && rounds <= kMaxRounds &&
         int64_t(elem_bytes) * 4 * n + 8 * (kMaxRounds + 1) <= kBlockMaxSmem;
}

bool TreeCellFitsCablesBlock(int64_t n, int64_t longest_cable, int elem_bytes) {
  return n < 65535 && longest_cable <= kBlockMaxCable &&
         int64_t(elem_bytes) * 4 * n <= kBlockMaxSmem;
}

template <typename T>
absl::Status SolveTreeCellsBlockDevice(const TreeProblem<T>& p, const TreeCellsPlan& plan, T* x,
                                       uint8_t* status_flags, cudaStream_t stream,
                                       TreeCellsLaunches launches) {
  if (plan.elem_bytes() != int(sizeof(T)) || p.layout != Layout::kFlat || p.batch != plan.cells())
    return absl::InvalidArgumentError("the cells' plan was built for other cells or precision");
  if (launches == TreeCellsLaunches::kDefault) launches = TreeCellsLaunchesFromEnv();
  // Each kernel may take this plan's largest launch's shared memory (AllowSharedBytes: never
  // lowered by a smaller launch running at once).
  int64_t largest = 0;
  for (const TreeCellsPlan::Launch& l : plan.launches_)
    largest = std::max<int64_t>(largest, int64_t(sizeof(T)) * 4 * l.max_n);
  auto shared = [&](auto kernel) -> absl::Status {
    if (auto st = AllowSharedBytes(kernel, size_t(largest)); !st.ok()) return st;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    return absl::OkStatus();
  };
  auto launch = [&](const TreeCellsPlan::Launch& l, cudaStream_t s) -> absl::Status {
    const size_t smem = sizeof(T) * 4 * size_t(l.max_n);
    if (plan.kind() == TreeCellsKind::kCables) {
      auto kernel = l.threads == 128   ? CablesCellsKernel<T, 128>
                    : l.threads == 256 ? CablesCellsKernel<T, 256>
                                       : CablesCellsKernel<T, 512>;
      if (auto st = shared(kernel); !st.ok()) return st;
      kernel<<<unsigned(l.blocks), unsigned(l.threads), smem, s>>>(
          p.lower, p.upper, p.diag, p.rhs, plan.cell_info_, plan.cell_id_, l.block0, plan.cinfo_,
          plan.cmore_, plan.ctop_, plan.level_ptr_, x, status_flags);
    } else {
      auto kernel = l.threads == 128   ? ContractionCellsKernel<T, 128>
                    : l.threads == 256 ? ContractionCellsKernel<T, 256>
                                       : ContractionCellsKernel<T, 512>;
      if (auto st = shared(kernel); !st.ok()) return st;
      kernel<<<unsigned(l.blocks), unsigned(l.threads), smem, s>>>(
          p.lower, p.upper, p.diag, p.rhs, plan.cell_info_, plan.cell_id_, l.block0, plan.elim_,
          plan.upd_, plan.upd_more_, plan.children_, plan.ptr_e_, plan.ptr_u_, x, status_flags);
    }
    return CudaStatus(cudaGetLastError(), "cells' launch");
  };
  const size_t L = plan.launches_.size();
  if (launches == TreeCellsLaunches::kSerial || L < 2 || plan.side_streams_.size() + 1 < L) {
    for (const TreeCellsPlan::Launch& l : plan.launches_)
      if (auto st = launch(l, stream); !st.ok()) return st;
    return absl::OkStatus();
  }
  // Events of this call only: a plan's streams may carry two calls at once, and an event
  // re-recorded by the other would move what this call waits for.
  std::vector<cudaEvent_t> ev(L, nullptr);  // [0] the fork, [i] launch i done
  struct Destroy {
    std::vector<cudaEvent_t>& ev;
    ~Destroy() {
      for (cudaEvent_t e : ev)
        if (e != nullptr) cudaEventDestroy(e);  // (a recorded one is released once it fires)
    }
  } destroy{ev};
  for (cudaEvent_t& e : ev)
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[0], stream));
  // The largest cells' launch first, on the caller's stream: the longest blocks start first,
  // and the smaller launches, enqueued after it in falling size, take the SMs its tail frees.
  absl::Status st = launch(plan.launches_[0], stream);
  size_t forked = 1;
  for (; st.ok() && forked < L; ++forked) {
    cudaStream_t s = plan.side_streams_[forked - 1];
    st.Update(CudaStatus(cudaStreamWaitEvent(s, ev[0], 0), "fork the cells' launches"));
    if (st.ok()) st.Update(launch(plan.launches_[forked], s));
    // Recorded even after a failed launch: the join below must cover what was enqueued.
    if (auto r = CudaStatus(cudaEventRecord(ev[forked], s), "cells' launch done"); !r.ok()) {
      st.Update(r);
      break;
    }
  }
  // Joined whatever happened: the caller frees x and the flags after its stream's work.
  for (size_t i = 1; i < forked; ++i)
    st.Update(CudaStatus(cudaStreamWaitEvent(stream, ev[i], 0), "join the cells' launches"));
  return st;
}

template absl::Status SolveTreeCellsBlockDevice(const TreeProblem<double>&, const TreeCellsPlan&,
                                                double*, uint8_t*, cudaStream_t,
                                                TreeCellsLaunches);
template absl::Status SolveTreeCellsBlockDevice(const TreeProblem<float>&, const TreeCellsPlan&,
                                                float*, uint8_t*, cudaStream_t,
                                                TreeCellsLaunches);

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
