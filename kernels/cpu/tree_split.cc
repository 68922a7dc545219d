#include "tree_split.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trisolve/backend.h"

namespace trisolve {
namespace {

// The index of `node` among the links' nodes (present by construction).
int32_t LinkIndex(const std::vector<int32_t>& link_node, int32_t node) {
  return int32_t(std::lower_bound(link_node.begin(), link_node.end(), node) - link_node.begin());
}
int32_t IndexIn(const std::vector<int32_t>& sorted, int32_t v) {
  return int32_t(std::lower_bound(sorted.begin(), sorted.end(), v) - sorted.begin());
}

// Children sorted by size up to this many (CutTree).
constexpr size_t kSortedChildren = 4096;

// f(begin, end) over [0, count) in `threads` pieces at once (one, on the calling thread, for
// fewer than 2^15).
template <typename F>
void Chunks(int64_t count, int threads, const F& f) {
  if (threads <= 1 || count < (int64_t{1} << 15)) {
    f(int64_t{0}, count);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&f, count, t, threads] {
      f(count * t / threads, count * (t + 1) / threads);
    });
  f(int64_t{0}, count / threads);
  for (auto& th : pool) th.join();
}

}  // namespace

TreeCut CutTree(const int32_t* parent, int64_t n, const std::vector<double>& weights,
                double tolerance) {
  const size_t P = weights.size();
  if (P < 2 || P > 255 || n < 2 * int64_t(P) || !ValidateParents(parent, n).ok()) return {};
  double total = 0;
  for (double w : weights) total += std::max(w, 0.0);
  if (!(total > 0)) return {};
  std::vector<int64_t> child_ptr(size_t(n) + 1, 0);
  for (int64_t i = 1; i < n; ++i) ++child_ptr[size_t(parent[i]) + 1];
  for (int64_t i = 0; i < n; ++i) child_ptr[size_t(i) + 1] += child_ptr[size_t(i)];
  std::vector<int32_t> child_list(size_t(n - 1));
  {
    std::vector<int64_t> fill(child_ptr.begin(), child_ptr.end() - 1);
    for (int64_t i = 1; i < n; ++i) child_list[size_t(fill[size_t(parent[i])]++)] = int32_t(i);
  }
  TreeCut cut;
  cut.part_of.assign(size_t(n), 0);
  std::vector<uint8_t>& part_of = cut.part_of;
  std::vector<int64_t> size(static_cast<size_t>(n));
  std::vector<int32_t> kids;
  auto children = [&](int64_t v, auto f) {
    for (int64_t q = child_ptr[size_t(v)]; q < child_ptr[size_t(v) + 1]; ++q) {
      const int32_t c = child_list[size_t(q)];
      if (part_of[size_t(c)] == 0) f(c);
    }
  };
  // Subtree sizes once; a round that takes T nodes below v takes T from v and its ancestors
  // (one walk a round, not a subtree: a deep node's many children share it).
  std::fill(size.begin(), size.end(), 1);
  for (int64_t i = n - 1; i >= 1; --i) size[size_t(parent[i])] += size[size_t(i)];
  // The last parts first, each from what the later ones left (part 0 keeps the rest).
  for (size_t k = P - 1; k >= 1; --k) {
    int64_t need = std::llround(double(n) * std::max(weights[k], 0.0) / total);
    if (need < 1 || need > size[0] - 1) return {};
    const int64_t tol = int64_t(double(need) * std::clamp(tolerance, 0.0, 1.0));
    int64_t v = 0;
    for (int links = 0; need > tol && links < kTreeMaxLinksPerPart; ++links) {
      // Down to the node whose children each hold `need` or fewer (its size is above need).
      for (;;) {
        int32_t best = -1;
        children(v, [&](int32_t c) {
          if (size[size_t(c)] > need && (best < 0 || size[size_t(c)] > size[size_t(best)]))
            best = c;
        });
        if (best < 0) break;
        v = best;
      }
      // Its children whole, largest first, each that fits; the rest, if any is still wanted,
      // from within the smallest that did not fit (a link more). Past kSortedChildren children
      // (a star's root), in order: they are small beside the share, and the sort would cost
      // more than the solve.
      kids.clear();
      children(v, [&](int32_t c) { kids.push_back(c); });
      if (kids.size() <= kSortedChildren)
        std::stable_sort(kids.begin(), kids.end(), [&](int32_t a, int32_t b) {
          return size[size_t(a)] > size[size_t(b)];
        });
      int32_t next = -1;
      int64_t taken = 0;
      for (int32_t c : kids) {
        if (size[size_t(c)] <= need) {
          need -= size[size_t(c)];
          taken += size[size_t(c)];
          part_of[size_t(c)] = uint8_t(k);  // its subtree follows it below
        } else if (next < 0 || size[size_t(c)] < size[size_t(next)]) {
          next = c;
        }
      }
      for (int64_t u = v; u >= 0; u = parent[u]) size[size_t(u)] -= taken;
      if (next < 0) break;
      v = next;
    }
    // The subtrees of the roots taken, in one pass in order (a parent before its children):
    // streamed, where a walk of each subtree would wait on a cache miss a node.
    for (int64_t i = 1; i < n; ++i)
      if (part_of[size_t(i)] == 0 && part_of[size_t(parent[i])] == k)
        part_of[size_t(i)] = uint8_t(k);
  }
  cut.parts = int(P);
  cut.nodes.assign(P, 0);
  for (int64_t i = 0; i < n; ++i) ++cut.nodes[part_of[size_t(i)]];
  for (int64_t m : cut.nodes)
    if (m == 0) return {};
  cut.local.resize(size_t(n));
  cut.members.assign(P, {});
  for (size_t k = 0; k < P; ++k) cut.members[k].reserve(size_t(cut.nodes[k]));
  // The links: every node with a child in another part.
  std::vector<std::pair<int32_t, int32_t>> ups;  // (part, outside parent)
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t>& m = cut.members[part_of[size_t(i)]];
    m.push_back(int32_t(i));
    cut.local[size_t(i)] = int32_t(m.size());
    if (i == 0) continue;
    const int32_t pi = parent[i];
    if (part_of[size_t(pi)] == part_of[size_t(i)]) continue;
    cut.cut_children.push_back(int32_t(i));
    // (A node's children elsewhere are often many, and in a row: one entry for the run.)
    if (ups.empty() || ups.back() != std::make_pair(int32_t(part_of[size_t(i)]), pi)) {
      cut.link_node.push_back(pi);
      ups.emplace_back(part_of[size_t(i)], pi);
    }
  }
  std::sort(cut.link_node.begin(), cut.link_node.end());
  cut.link_node.erase(std::unique(cut.link_node.begin(), cut.link_node.end()),
                      cut.link_node.end());
  std::sort(ups.begin(), ups.end());
  ups.erase(std::unique(ups.begin(), ups.end()), ups.end());
  cut.up.assign(P, {});
  cut.down.assign(P, {});
  for (const auto& [k, node] : ups) cut.up[size_t(k)].push_back(LinkIndex(cut.link_node, node));
  for (size_t l = 0; l < cut.link_node.size(); ++l)
    cut.down[part_of[size_t(cut.link_node[l])]].push_back(int32_t(l));
  cut.rhs.assign(P, 1);
  for (size_t k = 0; k < P; ++k)
    cut.rhs[k] += int64_t(cut.up[k].size() + cut.down[k].size());
  cut.part_parent.assign(P, {});
  cut.root_rhs.assign(P, {});
  for (size_t k = 0; k < P; ++k) {
    const std::vector<int32_t>& mem = cut.members[k];
    std::vector<int32_t>& pp = cut.part_parent[k];
    pp.resize(mem.size() + 1);
    pp[0] = -1;
    for (size_t j = 1; j < pp.size(); ++j) {
      const int32_t i = mem[j - 1];
      const int32_t pi = i > 0 ? parent[i] : -1;
      pp[j] = pi >= 0 && part_of[size_t(pi)] == k ? cut.local[size_t(pi)] : 0;
    }
  }
  for (int32_t r : cut.cut_children) {
    const size_t k = part_of[size_t(r)];
    const int32_t col = 1 + IndexIn(cut.up[k], LinkIndex(cut.link_node, parent[r]));
    cut.root_rhs[k].emplace_back(cut.local[size_t(r)], col);
  }
  return cut;
}

template <typename T>
absl::StatusOr<SplitOutcome> SolveTreeSplit(const TreeProblem<T>& p, const TreeCut& cut,
                                            const SolveTreePartFn<T>& solve_part, T* x) {
  const size_t P = size_t(cut.parts);
  if (P < 2 || p.batch != 1 || cut.part_of.size() != size_t(p.n))
    return absl::InternalError("SolveTreeSplit: one tree and its cut");
  const std::vector<uint8_t>& part_of = cut.part_of;
  const std::vector<int32_t>& local = cut.local;
  const std::vector<std::vector<int32_t>>& members = cut.members;

  // (Arrays left uninitialised where every value is written, in chunks over the host's
  // threads: a part of 2^25 nodes is a few hundred MB to fill, as long as its copy to the
  // device.)
  struct Part {
    int64_t m = 0, K = 0;
    std::unique_ptr<T[]> lower, upper, diag, rhs, x;
    std::vector<SystemStatus> status;
    T at(int64_t col, int64_t j) const { return x[size_t(col * m + j)]; }
  };
  // (Two at least, so that the pieces' seams are exercised on any host.)
  const int per_part = std::max(2, int(std::thread::hardware_concurrency()) / int(P));
  std::vector<Part> parts(P);
  std::vector<absl::StatusOr<SolveInfo>> solved(P, absl::InternalError("part not solved"));
  auto run = [&](size_t k) {
    Part& q = parts[k];
    const std::vector<int32_t>& mem = members[k];
    const std::vector<int32_t>& up = cut.up[k];
    q.m = int64_t(mem.size()) + 1;
    q.K = cut.rhs[k];
    const size_t m = size_t(q.m), K = size_t(q.K);
    const std::vector<int32_t>& pp = cut.part_parent[k];
    q.lower.reset(new T[m]);
    q.upper.reset(new T[m]);
    q.diag.reset(new T[m]);
    q.rhs.reset(new T[K * m]);
    q.x.reset(new T[K * m]);
    q.status.assign(K, SystemStatus::kSingular);
    q.lower[0] = q.upper[0] = T(0);
    q.diag[0] = T(1);
    for (size_t c = 0; c < K; ++c) q.rhs[c * m] = T(0);
    // (The structure is the cut's: a gather of values in the part's order, streamed.)
    Chunks(q.m - 1, per_part, [&](int64_t b, int64_t e) {
      for (size_t c = 1; c < K; ++c) std::fill_n(&q.rhs[c * m + size_t(b) + 1], e - b, T(0));
      for (size_t j = size_t(b) + 1; j < size_t(e) + 1; ++j) {
        const int32_t i = mem[j - 1];
        const bool inside = pp[j] != 0;
        q.lower[j] = inside ? p.lower[i] : T(0);
        q.upper[j] = inside ? p.upper[i] : T(0);
        q.diag[j] = p.diag[i];
        q.rhs[j] = p.rhs[i];
      }
    });
    for (const auto& [j, col] : cut.root_rhs[k])  // a subtree root's coupling, for X_parent
      q.rhs[size_t(col) * m + size_t(j)] = p.lower[mem[size_t(j) - 1]];
    for (size_t b = 0; b < cut.down[k].size(); ++b) {  // e_p, for G_p
      const int32_t node = cut.link_node[size_t(cut.down[k][b])];
      q.rhs[(1 + up.size() + b) * m + size_t(local[size_t(node)])] = T(1);
    }
    TreeProblem<T> tp;
    tp.batch = 1;
    tp.n = q.m;
    tp.layout = Layout::kFlat;
    tp.parent = pp.data();
    tp.lower = q.lower.get();
    tp.upper = q.upper.get();
    tp.diag = q.diag.get();
    tp.rhs = q.rhs.get();
    solved[k] = solve_part(k, tp, q.K, TreeOutput<T>{q.x.get(), q.status.data()});
    // The coefficients are no longer needed: give their memory back before the join.
    q.lower.reset();
    q.upper.reset();
    q.diag.reset();
    q.rhs.reset();
  };
  {
    std::vector<std::thread> threads;
    for (size_t k = 1; k < P; ++k) threads.emplace_back(run, k);
    run(0);
    for (auto& t : threads) t.join();
  }
  SplitOutcome outcome;
  for (size_t k = 0; k < P; ++k) {
    if (!solved[k].ok()) {
      const absl::Status& st = solved[k].status();
      if (IsNonFiniteInput(st) || st.code() == absl::StatusCode::kDeadlineExceeded ||
          st.code() == absl::StatusCode::kCancelled)
        return st;
      outcome.why = absl::StrCat("part ", k, " failed: ", st.message().substr(0, 200));
      return outcome;
    }
    const SolveInfo& r = *solved[k];
    if (k == 0) {
      outcome.info = r;
    } else {
      outcome.info.inputs_checked &= r.inputs_checked;  // every part read its own
      if (outcome.info.method.find(r.method) == std::string::npos)
        absl::StrAppend(&outcome.info.method, " + ", r.method);
      outcome.info.h2d_us = std::max(outcome.info.h2d_us, r.h2d_us);
      outcome.info.kernel_us = std::max(outcome.info.kernel_us, r.kernel_us);
      outcome.info.d2h_us = std::max(outcome.info.d2h_us, r.d2h_us);
    }
    for (SystemStatus s : parts[k].status)
      if (s != SystemStatus::kOk) {
        outcome.why = absl::StrCat("part ", k, " (", cut.nodes[k], " nodes) is singular on its own");
        return outcome;
      }
  }
  absl::StrAppend(&outcome.info.method, " (one tree split over ", P, " devices)");

  // The links' system: X_l = x at link l's node (unknown 2l), G_l = the sum of upper_r x_r
  // over its cut children r (unknown 2l + 1). A node j of part k reads
  //   x_j = y_j - sum over k's up links of X u_j - sum over k's down links of G w_j;
  // `add` puts scale times that (less its y_j) on the left of row `row`, scale y_j on the right.
  const int dim = int(2 * cut.link_node.size());
  std::vector<long double> A(size_t(dim) * size_t(dim), 0.0L), X(size_t(dim), 0.0L);
  auto add = [&](int row, size_t k, int64_t j, long double scale) {
    const Part& q = parts[k];
    const std::vector<int32_t>& up = cut.up[k];
    const std::vector<int32_t>& down = cut.down[k];
    X[size_t(row)] += scale * q.at(0, j);
    long double* a = &A[size_t(row) * size_t(dim)];
    for (size_t u = 0; u < up.size(); ++u) a[2 * up[u]] += scale * q.at(int64_t(1 + u), j);
    for (size_t b = 0; b < down.size(); ++b)
      a[2 * down[b] + 1] += scale * q.at(int64_t(1 + up.size() + b), j);
  };
  for (int l = 0; l < dim / 2; ++l) {
    const int32_t node = cut.link_node[size_t(l)];
    A[size_t(2 * l) * size_t(dim) + size_t(2 * l)] += 1;
    add(2 * l, part_of[size_t(node)], local[size_t(node)], 1);
    A[size_t(2 * l + 1) * size_t(dim) + size_t(2 * l + 1)] += 1;
  }
  for (int32_t r : cut.cut_children)
    add(2 * LinkIndex(cut.link_node, p.parent[r]) + 1, part_of[size_t(r)], local[size_t(r)],
        (long double)p.upper[r]);
  if (!SolveSmallDense(dim, A, X)) {
    outcome.why = "the system of the links is singular";
    return outcome;
  }

  // x: each part's y less its extra solutions times the links' values.
  auto write = [&](size_t k) {
    const Part& q = parts[k];
    std::vector<double> f;  // the factors of columns 1..K-1
    for (int32_t l : cut.up[k]) f.push_back(double(X[size_t(2 * l)]));
    for (int32_t l : cut.down[k]) f.push_back(double(X[size_t(2 * l + 1)]));
    const std::vector<int32_t>& mem = members[k];
    Chunks(q.m - 1, per_part, [&](int64_t b, int64_t e) {
      for (int64_t j = b + 1; j < e + 1; ++j) {
        double v = double(q.at(0, j));
        for (size_t c = 0; c < f.size(); ++c) v -= f[c] * double(q.at(int64_t(c + 1), j));
        x[mem[size_t(j - 1)]] = T(v);
      }
    });
  };
  {
    std::vector<std::thread> threads;
    for (size_t k = 1; k < P; ++k) threads.emplace_back(write, k);
    write(0);
    for (auto& t : threads) t.join();
  }
  outcome.solved = true;
  return outcome;
}

template absl::StatusOr<SplitOutcome> SolveTreeSplit(const TreeProblem<double>&, const TreeCut&,
                                                     const SolveTreePartFn<double>&, double*);
template absl::StatusOr<SplitOutcome> SolveTreeSplit(const TreeProblem<float>&, const TreeCut&,
                                                     const SolveTreePartFn<float>&, float*);

}  // namespace trisolve
