// CPU reference for tree (Hines) systems: the backward sweep (leaves to root) eliminates
// each node's coupling into its parent, the forward sweep (root to leaves) substitutes back.
#include "trisolve/reference/tree.h"
#include "trisolve/tree.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common.h"

namespace trisolve {

absl::Status ValidateParents(const int32_t* parent, int64_t n) {
  if (n <= 0) return absl::InvalidArgumentError("parent: empty tree");
  if (parent[0] != -1)
    return absl::InvalidArgumentError(
        absl::StrCat("parent[0] is ", parent[0], ", expected -1 (node 0 is the root)"));
  for (int64_t i = 1; i < n; ++i) {
    if (parent[i] < 0 || parent[i] >= i)
      return absl::InvalidArgumentError(absl::StrCat(
          "parent[", i, "] is ", parent[i], ", expected 0 <= parent[i] < ", i,
          " (nodes must be numbered depth-first from the root 0)"));
  }
  return absl::OkStatus();
}

std::vector<int32_t> ForestAsOneTree(const int32_t* parent, const int64_t* offsets,
                                     int64_t cells) {
  std::vector<int32_t> one(static_cast<size_t>(offsets[cells]));
  for (int64_t k = 0; k < cells; ++k) {
    const int64_t first = offsets[k];
    one[size_t(first)] = k == 0 ? -1 : int32_t(offsets[(k - 1) / kForestFanout]);
    for (int64_t i = first + 1; i < offsets[k + 1]; ++i)
      one[size_t(i)] = int32_t(first + parent[i]);
  }
  return one;
}

TreeCables BuildTreeCables(const int32_t* parent, int64_t n) {
  TreeCables t;
  t.n = n;
  std::vector<int32_t> nchild(n, 0), cable_of(n);
  for (int64_t i = 1; i < n; ++i) ++nchild[parent[i]];
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || parent[i] != i - 1 || nchild[i - 1] != 1) {
      t.start.push_back(int32_t(i));
      t.anchor.push_back(parent[i]);
    }
    cable_of[i] = int32_t(t.start.size()) - 1;
  }
  const int64_t C = int64_t(t.anchor.size());
  t.start.push_back(int32_t(n));
  // A child cable starts after its anchor, so it has the larger index: one pass downwards
  // finishes every cable's children before the cable itself.
  std::vector<int32_t> height(C, 0);
  t.child_ptr.assign(C + 1, 0);
  for (int64_t c = C - 1; c >= 1; --c) {
    const int32_t pc = cable_of[t.anchor[c]];
    height[pc] = std::max(height[pc], height[c] + 1);
    ++t.child_ptr[pc + 1];
  }
  for (int64_t c = 0; c < C; ++c) t.child_ptr[c + 1] += t.child_ptr[c];
  t.child_list.resize(std::max<int64_t>(C - 1, 0));
  std::vector<int32_t> fill(t.child_ptr.begin(), t.child_ptr.end() - 1);
  for (int64_t c = 1; c < C; ++c) t.child_list[fill[cable_of[t.anchor[c]]]++] = int32_t(c);
  const int32_t H = C > 0 ? height[0] : 0;  // the root cable is the highest
  t.level_ptr.assign(H + 2, 0);
  t.node_level_ptr.assign(H + 2, 0);
  for (int64_t c = 0; c < C; ++c) {
    ++t.level_ptr[height[c] + 1];
    t.node_level_ptr[height[c] + 1] += t.start[c + 1] - t.start[c];
  }
  for (int32_t h = 0; h <= H; ++h) {
    t.level_ptr[h + 1] += t.level_ptr[h];
    t.node_level_ptr[h + 1] += t.node_level_ptr[h];
  }
  t.order.resize(C);
  t.node_order.resize(n);
  std::vector<int32_t> at(t.level_ptr.begin(), t.level_ptr.end() - 1);
  for (int64_t c = 0; c < C; ++c) t.order[at[height[c]]++] = int32_t(c);
  int64_t k = 0;
  for (int32_t c : t.order)
    for (int32_t j = t.start[c]; j < t.start[c + 1]; ++j) t.node_order[k++] = j;
  return t;
}

TreeContraction BuildTreeContraction(const int32_t* parent, int64_t n) {
  TreeContraction t;
  t.n = n;
  // The current tree: parent, number of children and the sum of their indices (which is the
  // child itself when there is one).
  std::vector<int32_t> par(parent, parent + n), nch(n, 0), stamp(n, -1), from(n, -1);
  std::vector<int64_t> sumch(n, 0);
  std::vector<std::pair<int32_t, int32_t>> removed;  // (parent, child) of a round's removals
  for (int64_t i = 1; i < n; ++i) {
    ++nch[par[i]];
    sumch[par[i]] += i;
  }
  std::vector<int32_t> alive(n), next, in_round, touched;
  for (int64_t i = 0; i < n; ++i) alive[i] = int32_t(i);
  t.elim_ptr.push_back(0);
  t.upd_ptr.push_back(0);
  for (int32_t r = 0; alive.size() > 1; ++r) {
    // Ancestors have smaller indices, so in increasing order a node's parent is decided
    // before it and its child after it (the child checks its parent).
    in_round.clear();
    for (int32_t v : alive)
      if (v != 0 && nch[v] == 0) stamp[v] = r;
    for (int32_t v : alive) {
      if (v == 0 || nch[v] > 1) continue;
      if (nch[v] == 1 && stamp[v] != r) {
        const int32_t c = int32_t(sumch[v]);
        if (stamp[c] == r || stamp[par[v]] == r) continue;
        stamp[v] = r;
      }
      if (stamp[v] == r) in_round.push_back(v);
    }
    touched.clear();
    removed.clear();
    for (int32_t v : in_round) {
      const int32_t p = par[v], c = nch[v] == 1 ? int32_t(sumch[v]) : -1;
      t.elim.push_back({v, p, c});
      removed.emplace_back(p, v);
      touched.push_back(p);
      if (c >= 0) {
        from[c] = v;
        touched.push_back(c);
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    std::sort(removed.begin(), removed.end());  // by parent, then child
    size_t q = 0;
    for (int32_t u : touched) {
      const int32_t first = int32_t(t.children.size());
      for (; q < removed.size() && removed[q].first == u; ++q)
        t.children.push_back(removed[q].second);
      t.upd.push_back({u, from[u], first, int32_t(t.children.size()) - first});
      from[u] = -1;
    }
    for (int32_t v : in_round) {
      const int32_t p = par[v];
      --nch[p];
      sumch[p] -= v;
      if (nch[v] == 1) {
        const int32_t c = int32_t(sumch[v]);
        par[c] = p;
        ++nch[p];
        sumch[p] += c;
      }
    }
    next.clear();
    for (int32_t v : alive)
      if (stamp[v] != r) next.push_back(v);
    alive.swap(next);
    t.elim_ptr.push_back(int32_t(t.elim.size()));
    t.upd_ptr.push_back(int32_t(t.upd.size()));
  }
  if (n > 0) {  // the root, alone
    t.elim.push_back({0, -1, -1});
    t.elim_ptr.push_back(int32_t(t.elim.size()));
    t.upd_ptr.push_back(int32_t(t.upd.size()));
  }
  return t;
}

namespace cpu {
namespace {

// The rounds of TreeContraction in order, each node's arithmetic as one GPU thread does it.
// Per node four values, as the GPU's shared memory holds them: Dg/Lo/Up/x start as diag,
// lower, upper, rhs; a removed node v keeps Dg = upper_v (what its parent takes), Up = wc_v,
// Lo = wp_v, x = q_v, then x_v.
template <typename T>
bool ContractionOne(const TreeContraction& t, int64_t s, const T* lower, const T* upper,
                    const T* diag, const T* rhs, T* x, T* Dg, T* Lo, T* Up) {
  const int64_t n = t.n;
  for (int64_t i = 0; i < n; ++i) {
    Dg[i] = diag[i * s];
    Lo[i] = lower[i * s];
    Up[i] = upper[i * s];
    x[i * s] = rhs[i * s];
  }
  const int64_t R = t.rounds();
  for (int64_t r = 0; r < R; ++r) {
    for (int32_t k = t.elim_ptr[r]; k < t.elim_ptr[r + 1]; ++k) {
      const TreeContraction::Elim& e = t.elim[k];
      const T D = Dg[e.v];
      if (PivotVanishes(D, T(0))) return false;
      const T inv = T(1) / D;
      const T up = e.p >= 0 ? Up[e.v] : T(0);
      x[e.v * s] = x[e.v * s] * inv;
      Lo[e.v] = e.p >= 0 ? Lo[e.v] * inv : T(0);
      Up[e.v] = e.c >= 0 ? Up[e.c] * inv : T(0);
      Dg[e.v] = up;
    }
    for (int32_t k = t.upd_ptr[r]; k < t.upd_ptr[r + 1]; ++k) {
      const TreeContraction::Update& u = t.upd[k];
      T D = Dg[u.u], Rh = x[u.u * s], S = std::abs(D);
      if (u.from >= 0) {
        const T lo = Lo[u.u], wc = Up[u.from], d = lo * wc;
        D -= d;
        S += std::abs(d);
        Rh -= lo * x[u.from * s];
        Lo[u.u] = -lo * Lo[u.from];
        Up[u.u] = -Dg[u.from] * wc;
      }
      for (int32_t q = u.first; q < u.first + u.count; ++q) {
        const int32_t w = t.children[q];
        const T up = Dg[w], d = up * Lo[w];
        D -= d;
        S += std::abs(d);
        Rh -= up * x[w * s];
      }
      if (PivotVanishes(D, S)) return false;
      Dg[u.u] = D;
      x[u.u * s] = Rh;
    }
  }
  for (int64_t k = int64_t(t.elim.size()) - 1; k >= 0; --k) {
    const TreeContraction::Elim& e = t.elim[k];
    T v = x[e.v * s];
    if (e.p >= 0) v -= Lo[e.v] * x[e.p * s];
    if (e.c >= 0) v -= Up[e.v] * x[e.c * s];
    x[e.v * s] = v;
  }
  return AllFinite(n, s, x);
}

// The sequential form of the GPU's cable elimination (TreeCables): the same arithmetic in the
// same order per cable as one GPU thread does. w is scratch of n values.
template <typename T>
bool CablesOne(const TreeCables& t, int64_t s, const int32_t* parent, const T* lower,
               const T* upper, const T* diag, const T* rhs, T* x, T* w, T* cD, T* cR) {
  (void)parent;
  for (int32_t c : t.order) {
    const int64_t s0 = t.start[c], e0 = t.start[c + 1] - 1;
    T D = diag[e0 * s], R = rhs[e0 * s], S = std::abs(D);
    for (int32_t k = t.child_ptr[c]; k < t.child_ptr[c + 1]; ++k) {
      const int32_t cc = t.child_list[k];
      D -= cD[cc];
      R -= cR[cc];
      S += std::abs(cD[cc]);
    }
    T carryD = 0, carryR = 0;
    for (int64_t j = e0; j >= s0; --j) {
      if (j < e0) {
        D = diag[j * s] - carryD;
        R = rhs[j * s] - carryR;
        S = std::abs(diag[j * s]) + std::abs(carryD);
      }
      if (PivotVanishes(D, S)) return false;
      const T inv = T(1) / D;
      x[j * s] = R * inv;
      if (j > 0) {
        w[j] = lower[j * s] * inv;
        const T g = upper[j * s] * inv;
        carryD = g * lower[j * s];
        carryR = g * R;
      } else {
        w[j] = 0;
      }
    }
    cD[c] = carryD;  // the contribution to the anchor (unused for the root cable)
    cR[c] = carryR;
    for (int64_t j = s0 + 1; j <= e0; ++j) {
      const T l = w[j];
      x[j * s] -= l * x[(j - 1) * s];
      w[j] = -l * w[j - 1];
    }
  }
  for (int64_t k = t.cables() - 1; k >= 0; --k) {
    const int32_t c = t.order[k], a = t.anchor[c];
    if (a < 0) continue;
    const T xa = x[int64_t(a) * s];
    for (int64_t j = t.start[c]; j < t.start[c + 1]; ++j) x[j * s] -= w[j] * xa;
  }
  return AllFinite(t.n, s, x);
}

template <typename T>
bool HinesOne(int64_t n, int64_t s, const int32_t* parent, const T* lower, const T* upper,
              const T* diag, const T* rhs, T* x, T* D, T* S) {
  // D holds the eliminated diagonal, S the magnitude of the terms it was formed from (for
  // the vanishing-pivot test), x the eliminated right-hand side until the forward sweep.
  for (int64_t i = 0; i < n; ++i) {
    D[i] = diag[i * s];
    S[i] = std::abs(D[i]);
    x[i * s] = rhs[i * s];
  }
  for (int64_t i = n - 1; i >= 1; --i) {
    if (PivotVanishes(D[i], S[i])) return false;
    const T f = upper[i * s] / D[i];
    const int64_t p = parent[i];
    const T fl = f * lower[i * s];
    D[p] -= fl;
    S[p] += std::abs(fl);
    x[p * s] -= f * x[i * s];
  }
  if (PivotVanishes(D[0], S[0])) return false;
  x[0] = x[0] / D[0];
  for (int64_t i = 1; i < n; ++i)
    x[i * s] = (x[i * s] - lower[i * s] * x[int64_t(parent[i]) * s]) / D[i];
  return AllFinite(n, s, x);
}

}  // namespace

template <typename T>
SolveInfo SolveTree(const TreeProblem<T>& p, TreeMethod method, TreeOutput<T> out) {
  const int64_t stride = ElementStride(p.layout, p.batch);
  const bool cables = method == TreeMethod::kCables;
  const bool contraction = method == TreeMethod::kContraction;
  // A plan a cell where the cells' trees differ (per-system parent arrays, cells of different
  // sizes), else one for the batch.
  const bool own_plans = p.parent_per_system || p.variable();
  TreeCables shared;
  if (cables && !own_plans) shared = BuildTreeCables(p.parent, p.n);
  TreeContraction shared_rounds;
  if (contraction && !own_plans) shared_rounds = BuildTreeContraction(p.parent, p.n);
#pragma omp parallel
  {
    std::vector<T> D(p.n), S(p.n), U, cD, cR;
    TreeCables own;
    TreeContraction own_rounds;
    const auto solve_cell = [&](int64_t s) {
      const int64_t off = p.first(s), n = p.nodes(s);
      const int32_t* parent = p.parent_of(s);
      bool ok;
      if (contraction) {
        if (own_plans) own_rounds = BuildTreeContraction(parent, n);
        U.resize(p.n);
        ok = ContractionOne(own_plans ? own_rounds : shared_rounds, stride, p.lower + off,
                            p.upper + off, p.diag + off, p.rhs + off, out.x + off, D.data(),
                            S.data(), U.data());
      } else if (cables) {
        if (own_plans) own = BuildTreeCables(parent, n);
        const TreeCables& t = own_plans ? own : shared;
        cD.resize(t.cables());
        cR.resize(t.cables());
        ok = CablesOne(t, stride, parent, p.lower + off, p.upper + off, p.diag + off,
                       p.rhs + off, out.x + off, D.data(), cD.data(), cR.data());
      } else {
        ok = HinesOne(n, stride, parent, p.lower + off, p.upper + off, p.diag + off,
                      p.rhs + off, out.x + off, D.data(), S.data());
      }
      if (!ok) ZeroStrided(n, stride, out.x + off);
      out.status[s] = ok ? SystemStatus::kOk : SystemStatus::kSingular;
    };
    // Cells of different sizes take different times: handed out a few at a time.
    if (p.variable()) {
#pragma omp for schedule(dynamic, 16)
      for (int64_t s = 0; s < p.batch; ++s) solve_cell(s);
    } else {
#pragma omp for schedule(static)
      for (int64_t s = 0; s < p.batch; ++s) solve_cell(s);
    }
  }
  SolveInfo info;
  info.method = std::string(MethodName(contraction ? TreeMethod::kContraction
                                       : cables     ? TreeMethod::kCables
                                                    : TreeMethod::kHines));
  return info;
}
template SolveInfo SolveTree(const TreeProblem<double>&, TreeMethod, TreeOutput<double>);
template SolveInfo SolveTree(const TreeProblem<float>&, TreeMethod, TreeOutput<float>);

}  // namespace cpu

template <typename T>
double TreeBackwardError(const TreeProblem<T>& p, const T* x, const SystemStatus* status) {
  const int64_t st = ElementStride(p.layout, p.batch);
  double worst = 0;
#pragma omp parallel reduction(max : worst)
  {
    std::vector<double> ax(p.n), rowabs(p.n);
#pragma omp for schedule(static)
    for (int64_t s = 0; s < p.batch; ++s) {
      if (status && status[s] != SystemStatus::kOk) continue;
      const int64_t off = p.first(s), n = p.nodes(s);
      const int32_t* parent = p.parent_of(s);
      for (int64_t i = 0; i < n; ++i) {
        ax[i] = double(p.diag[off + i * st]) * x[off + i * st];
        rowabs[i] = std::abs(double(p.diag[off + i * st]));
      }
      double xmax = 0, bmax = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t e = off + i * st;
        xmax = std::max(xmax, std::abs(double(x[e])));
        bmax = std::max(bmax, std::abs(double(p.rhs[e])));
        if (i == 0) continue;
        const int64_t q = parent[i], eq = off + q * st;
        ax[i] += double(p.lower[e]) * x[eq];
        rowabs[i] += std::abs(double(p.lower[e]));
        ax[q] += double(p.upper[e]) * x[e];
        rowabs[q] += std::abs(double(p.upper[e]));
      }
      double rmax = 0, amax = 0;
      for (int64_t i = 0; i < n; ++i) {
        rmax = std::max(rmax, std::abs(double(p.rhs[off + i * st]) - ax[i]));
        amax = std::max(amax, rowabs[i]);
      }
      const double denom = amax * xmax + bmax;
      // A non-finite x is the worst error there is (std::max would drop a NaN).
      const double e = !cpu::AllFinite(n, st, x + off) ? std::numeric_limits<double>::infinity()
                       : denom > 0                      ? rmax / denom
                                                        : 0.0;
      worst = std::max(worst, e);
    }
  }
  return worst;
}
template double TreeBackwardError(const TreeProblem<double>&, const double*,
                                  const SystemStatus*);
template double TreeBackwardError(const TreeProblem<float>&, const float*,
                                  const SystemStatus*);

}  // namespace trisolve
