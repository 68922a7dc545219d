#include "tree/cells.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "runtime/check.h"

namespace trisolve::cuda {
namespace {

// The removed-children list mark of the packed updates (cables_kernels.cuh, kListMark).
constexpr int32_t kListMark = 0xffff;

// Runs f(k) for k < count on `threads` host threads (the calling one among them), k handed
// out one at a time: the distinct structures' sizes differ by 100x.
template <typename F>
void ParallelFor(int64_t count, int threads, F f) {
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, count)));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t k; (k = next.fetch_add(1)) < count;) f(k);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

int HostThreads(int threads) {
  if (threads > 0) return threads;
  return int(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
}

}  // namespace

// Two int32 values a step, each step's word multiplied in and folded.
uint64_t HashParents(const int32_t* v, int64_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ uint64_t(n);
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    uint64_t w;
    std::memcpy(&w, v + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  if (i < n) h = ((h ^ uint32_t(v[i])) * 0xc4ceb9fe1a85ec53ull) ^ (h >> 29);
  return h;
}

TreeCellGroups GroupTreeCells(const int32_t* parent, const int64_t* offsets, int64_t cells) {
  TreeCellGroups g;
  g.structure_of.resize(size_t(cells));
  std::unordered_map<uint64_t, std::vector<int32_t>> by_hash;  // hash -> structures
  for (int64_t k = 0; k < cells; ++k) {
    const int64_t n = offsets[k + 1] - offsets[k];
    const int32_t* pk = parent + offsets[k];
    const uint64_t h = HashParents(pk, n);
    auto& candidates = by_hash[h];
    int32_t found = -1;
    for (int32_t s : candidates) {
      const int64_t f = g.first_cell[size_t(s)];
      if (offsets[f + 1] - offsets[f] == n &&
          std::memcmp(parent + offsets[f], pk, size_t(n) * sizeof(int32_t)) == 0) {
        found = s;
        break;
      }
    }
    if (found < 0) {
      found = int32_t(g.first_cell.size());
      g.first_cell.push_back(k);
      candidates.push_back(found);
    }
    g.structure_of[size_t(k)] = found;
  }
  return g;
}

int TreeCellsBlockThreads(int64_t max_n, int elem_bytes, TreeCellsKind kind,
                          TreeCellsThreads rule) {
  if (rule == TreeCellsThreads::kBySize) return max_n > 1024 ? 512 : max_n > 256 ? 256 : 128;
  // Both kernels hold 64 registers a thread in float64 (48 in float32): an SM runs 1,024 of
  // their threads, so 512 threads a block let only 2 blocks of 1,100 nodes run where their
  // shared memory would hold 6, and an SM held a third of the nodes it could. The shared
  // memory an SM gives blocks (228 KB on sm_90, 1 KB a block reserved), the contraction's
  // round offsets (2 KB) beside the cell's four arrays.
  constexpr int64_t kSmemPerSm = 228 * 1024, kReserved = 1024, kRoundOffsets = 2048;
  const int64_t per_block = int64_t(elem_bytes) * 4 * max_n + kReserved +
                            (kind == TreeCellsKind::kContraction ? kRoundOffsets : 0);
  const int64_t blocks = std::clamp<int64_t>(kSmemPerSm / per_block, 1, 8);
  int t = 512;
  while (t > 128 && t * blocks > 1024) t /= 2;
  return t;
}

TreeCellsSchedule ScheduleTreeCells(const int32_t* parent, const int64_t* offsets, int64_t cells,
                                    int elem_bytes, int threads, TreeCellsKind kind,
                                    TreeCellsThreads rule) {
  TreeCellsSchedule out;
  out.kind = kind;
  const bool cables = kind == TreeCellsKind::kCables;
  const TreeCellGroups g = GroupTreeCells(parent, offsets, cells);
  const int64_t S = int64_t(g.first_cell.size());
  out.structures = S;
  auto size_of = [&](int64_t s) {
    const int64_t f = g.first_cell[size_t(s)];
    return offsets[f + 1] - offsets[f];
  };
  // Each distinct structure's contraction, on host threads; none for cells too large for a
  // block in any precision (the 16-bit fields stop at 65,534 nodes).
  std::vector<TreeContraction> rc(static_cast<size_t>(cables ? 0 : S));
  std::vector<TreeCables> tc(static_cast<size_t>(cables ? S : 0));
  std::vector<char> fits(size_t(S), 0);
  ParallelFor(S, HostThreads(threads), [&](int64_t s) {
    const int64_t n = size_of(s);
    const int32_t* ps = parent + offsets[g.first_cell[size_t(s)]];
    if (cables) {
      if (!TreeCellFitsCablesBlock(n, 1, elem_bytes)) return;
      TreeCables& t = tc[size_t(s)];
      t = BuildTreeCables(ps, n);
      int64_t longest = 0;
      for (int64_t c = 0; c < t.cables(); ++c) longest = std::max<int64_t>(longest, t.length(c));
      fits[size_t(s)] = TreeCellFitsCablesBlock(n, longest, elem_bytes);
      return;
    }
    if (!TreeCellFitsBlock(n, 1, elem_bytes)) return;
    rc[size_t(s)] = BuildTreeContraction(ps, n);
    fits[size_t(s)] = TreeCellFitsBlock(n, rc[size_t(s)].rounds(), elem_bytes);
  });
  // The schedules end to end, each structure's offsets rebased to the whole arrays.
  std::vector<int2>& el = out.elim;
  std::vector<int2>& up = out.upd;
  std::vector<int2>& more = out.upd_more;
  std::vector<int32_t>& ptr_e = out.ptr_e;
  std::vector<int32_t>& ptr_u = out.ptr_u;
  std::vector<int32_t>& children = out.children;
  std::vector<int32_t> ptr_base(size_t(S), -1), rounds(size_t(S), 0);
  auto pack = [](int32_t lo, int32_t hi) { return int32_t(uint32_t(lo) | uint32_t(hi) << 16); };
  for (int64_t s = 0; s < S && cables; ++s) {
    if (!fits[size_t(s)]) continue;
    // As TreeCablesPlan::Make's one-block-a-cell part (every cable short: `order` as built),
    // the child lists' and the levels' offsets rebased.
    const TreeCables& t = tc[size_t(s)];
    const int64_t C = t.cables();
    const int32_t bk = int32_t(out.cinfo.size()), bt = int32_t(out.ctop.size());
    if (int64_t(bk) + C + int64_t(bt) + int64_t(t.child_list.size()) > (int64_t(1) << 31) - 1) {
      fits[size_t(s)] = 0;
      continue;
    }
    ptr_base[size_t(s)] = int32_t(out.level_ptr.size());
    rounds[size_t(s)] = int32_t(t.levels());
    for (int32_t v : t.level_ptr) out.level_ptr.push_back(bk + v);
    for (size_t q = 0; q < t.child_list.size(); ++q) out.ctop.push_back(t.start[t.child_list[q]]);
    for (int64_t k = 0; k < C; ++k) {
      const int32_t c = t.order[k];
      const int32_t cb = t.child_ptr[c], cc = t.child_ptr[c + 1] - cb;
      const uint32_t x = uint32_t(t.start[c]) | (uint32_t(t.length(c) - 1) << 16) |
                         (cc > 2 ? 1u << 31 : 0u);
      out.cinfo.push_back(int4{int32_t(x), t.anchor[c], cc > 0 ? out.ctop[size_t(bt + cb)] : -1,
                               cc > 1 ? out.ctop[size_t(bt + cb + 1)] : -1});
      out.cmore.push_back(cc > 2 ? int2{bt + cb + 2, cc - 2} : int2{0, 0});
    }
  }
  tc.clear();
  for (int64_t s = 0; s < S && !cables; ++s) {
    if (!fits[size_t(s)]) continue;
    const TreeContraction& c = rc[size_t(s)];
    const int32_t be = int32_t(el.size()), bu = int32_t(up.size()),
                  bc = int32_t(children.size());
    if (int64_t(el.size()) + int64_t(c.elim.size()) + int64_t(c.upd.size()) +
            int64_t(children.size()) + int64_t(c.children.size()) >
        (int64_t(1) << 31) - 1) {
      fits[size_t(s)] = 0;  // (int32 offsets: the structures past 2^31 entries go elsewhere)
      continue;
    }
    ptr_base[size_t(s)] = int32_t(ptr_e.size());
    rounds[size_t(s)] = int32_t(c.rounds());
    for (int32_t v : c.elim_ptr) ptr_e.push_back(be + v);
    for (int32_t v : c.upd_ptr) ptr_u.push_back(bu + v);
    for (const auto& e : c.elim) el.push_back(int2{pack(e.v, e.p + 1), e.c + 1});
    for (const auto& u : c.upd) {
      int32_t y;
      int2 m{0, 0};
      if (u.count > 2) {
        y = pack(0, kListMark);
        m = int2{bc + u.first, u.count};
      } else {
        y = pack(u.count > 0 ? c.children[size_t(u.first)] + 1 : 0,
                 u.count > 1 ? c.children[size_t(u.first) + 1] + 1 : 0);
      }
      up.push_back(int2{pack(u.u, u.from + 1), y});
      more.push_back(m);
    }
    children.insert(children.end(), c.children.begin(), c.children.end());
  }
  rc.clear();
  // Blocks largest cell first (the long ones start early, the short ones fill the end), cells
  // of one structure next to one another (its schedule read from L2 by all but the first),
  // cut into launches of similar sizes: shared memory sized for a launch's largest cell, and
  // threads for as many of its blocks an SM as that shared memory lets run.
  std::vector<int32_t> order;
  for (int64_t k = 0; k < cells; ++k) {
    if (fits[size_t(g.structure_of[size_t(k)])])
      order.push_back(int32_t(k));
    else
      out.rest.push_back(int32_t(k));
  }
  auto cell_n = [&](int32_t k) { return offsets[k + 1] - offsets[k]; };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int64_t na = cell_n(a), nb = cell_n(b);
    return na != nb ? na > nb : g.structure_of[size_t(a)] < g.structure_of[size_t(b)];
  });
  auto threads_for = [&](int64_t n) { return TreeCellsBlockThreads(n, elem_bytes, kind, rule); };
  for (size_t b = 0; b < order.size();) {
    const int64_t top = cell_n(order[b]);
    TreeCellsSchedule::Launch l{int32_t(b), 0, int32_t(top), threads_for(top)};
    size_t e = b;
    while (e < order.size() && cell_n(order[e]) * 2 > top &&
           threads_for(cell_n(order[e])) == l.threads && e - b < (size_t(1) << 30))
      ++e;
    l.blocks = int32_t(e - b);
    out.launches.push_back(l);
    b = e;
  }
  std::vector<int4>& info = out.info;
  info.resize(order.size());
  for (size_t b = 0; b < order.size(); ++b) {
    const int32_t k = order[b];
    const int32_t s = g.structure_of[size_t(k)];
    const uint64_t first = uint64_t(offsets[k]);
    info[b] = int4{int32_t(uint32_t(first)), int32_t(uint32_t(first >> 32)),
                   int32_t(cell_n(k)) | rounds[size_t(s)] << 16, ptr_base[size_t(s)]};
  }
  out.cell_of_block = std::move(order);
  return out;
}

TreeCellsLaunches TreeCellsLaunchesFromEnv() {
  static const TreeCellsLaunches launches = [] {
    const char* v = std::getenv("TRISOLVE_TREE_CELLS_SERIAL");
    return v != nullptr && std::atoi(v) == 1 ? TreeCellsLaunches::kSerial
                                             : TreeCellsLaunches::kOverlapped;
  }();
  return launches;
}

TreeCellsPlan::~TreeCellsPlan() {
  // (a stream destroyed with work queued is released once that work is done)
  for (cudaStream_t s : side_streams_) cudaStreamDestroy(s);
}

absl::StatusOr<std::unique_ptr<TreeCellsPlan>> TreeCellsPlan::Make(
    const int32_t* parent, const int64_t* offsets, int64_t cells, int elem_bytes, Pool& pool,
    cudaStream_t stream, int threads, TreeCellsKind kind, TreeCellsThreads rule) {
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = std::unique_ptr<TreeCellsPlan>(new TreeCellsPlan);
  plan->cells_ = cells;
  plan->elem_bytes_ = elem_bytes;
  plan->kind_ = kind;
  TreeCellsSchedule sc =
      ScheduleTreeCells(parent, offsets, cells, elem_bytes, threads, kind, rule);
  plan->structures_ = sc.structures;
  plan->rest_ = std::move(sc.rest);
  plan->launches_ = std::move(sc.launches);
  // Non-blocking: a caller on the legacy default stream must not serialise them again.
  for (size_t l = 1; l < plan->launches_.size(); ++l) {
    cudaStream_t s;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    plan->side_streams_.push_back(s);
  }
  std::vector<int2>& el = sc.elim;
  std::vector<int2>& up = sc.upd;
  std::vector<int2>& more = sc.upd_more;
  std::vector<int32_t>& ptr_e = sc.ptr_e;
  std::vector<int32_t>& ptr_u = sc.ptr_u;
  std::vector<int32_t>& children = sc.children;
  std::vector<int4>& info = sc.info;
  const std::vector<int32_t>& order = sc.cell_of_block;
  // One device buffer: the 16-byte entries first, then the 8-byte ones, then the ints.
  children.push_back(0);  // (never empty)
  if (up.empty()) {
    up.push_back(int2{0, 0});
    more.push_back(int2{0, 0});
  }
  if (el.empty()) el.push_back(int2{0, 0});
  if (ptr_e.empty()) {
    ptr_e.push_back(0);
    ptr_u.push_back(0);
  }
  if (sc.cinfo.empty()) {
    sc.cinfo.push_back(int4{0, -1, -1, -1});
    sc.cmore.push_back(int2{0, 0});
  }
  sc.ctop.push_back(0);
  if (sc.level_ptr.empty()) sc.level_ptr.push_back(0);
  std::vector<int32_t> cell_id(order.begin(), order.end());
  if (cell_id.empty()) cell_id.push_back(0);
  if (info.empty()) info.push_back(int4{0, 0, 0, 0});
  const int64_t bytes =
      int64_t(sizeof(int4)) * int64_t(info.size() + sc.cinfo.size()) +
      int64_t(sizeof(int2)) * int64_t(el.size() + up.size() + more.size() + sc.cmore.size()) +
      4 * int64_t(cell_id.size() + ptr_e.size() + ptr_u.size() + children.size() +
                  sc.ctop.size() + sc.level_ptr.size());
  auto buf = pool.Get(bytes);
  if (!buf.ok()) return buf.status();
  plan->buf_ = std::move(*buf);
  auto* d = static_cast<std::byte*>(plan->buf_.get());
  int64_t at = 0;
  auto put = [&](const auto& v, auto** dst) -> absl::Status {
    using E = typename std::decay_t<decltype(v)>::value_type;
    *dst = reinterpret_cast<E*>(d + at);
    const size_t n = v.size() * sizeof(E);
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(d + at, v.data(), n, cudaMemcpyHostToDevice, stream));
    at += int64_t(n);
    return absl::OkStatus();
  };
  const int4* ci = nullptr;
  const int2 *de = nullptr, *du = nullptr, *dm = nullptr;
  const int32_t *dc = nullptr, *dpe = nullptr, *dpu = nullptr, *dch = nullptr;
  const int4* dci = nullptr;
  const int2* dcm = nullptr;
  const int32_t *dct = nullptr, *dlp = nullptr;
  for (absl::Status st : {put(info, &ci), put(sc.cinfo, &dci), put(el, &de), put(up, &du),
                          put(more, &dm), put(sc.cmore, &dcm), put(cell_id, &dc),
                          put(ptr_e, &dpe), put(ptr_u, &dpu), put(children, &dch),
                          put(sc.ctop, &dct), put(sc.level_ptr, &dlp)})
    if (!st.ok()) return st;
  plan->cinfo_ = dci;
  plan->cmore_ = dcm;
  plan->ctop_ = dct;
  plan->level_ptr_ = dlp;
  plan->cell_info_ = ci;
  plan->elim_ = de;
  plan->upd_ = du;
  plan->upd_more_ = dm;
  plan->cell_id_ = dc;
  plan->ptr_e_ = dpe;
  plan->ptr_u_ = dpu;
  plan->children_ = dch;
  // The host vectors must outlive the copies.
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  plan->cell_of_block_ = order;
  plan->analysis_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

}  // namespace trisolve::cuda
