// Tree cells of different sizes for the tests (TreeProblem::offsets, TreeRequest.lengths): a
// hand-worked forest with a known x, random small trees, subtrees of a real morphology, and a
// singular cell placed among good ones.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "trisolve/tree.h"

namespace trisolve::testing {

// The cells concatenated, each cell's parent values local to it (its node 0 its root).
struct Cells {
  std::vector<int32_t> lengths;
  std::vector<int64_t> offsets{0};
  std::vector<int32_t> parent;
  std::vector<double> lower, upper, diag, rhs;
  int64_t cells() const { return int64_t(lengths.size()); }
  int64_t total() const { return offsets.back(); }

  // Appends a cell (its parent array local) with the given coefficients.
  void Add(const std::vector<int32_t>& p, const std::vector<double>& lo,
           const std::vector<double>& up, const std::vector<double>& dg,
           const std::vector<double>& r) {
    lengths.push_back(int32_t(p.size()));
    offsets.push_back(offsets.back() + int64_t(p.size()));
    parent.insert(parent.end(), p.begin(), p.end());
    lower.insert(lower.end(), lo.begin(), lo.end());
    upper.insert(upper.end(), up.begin(), up.end());
    diag.insert(diag.end(), dg.begin(), dg.end());
    rhs.insert(rhs.end(), r.begin(), r.end());
  }
  // A cell on parent array p with random couplings in [-1, -0.1] and a diagonal that dominates
  // them by 0.01 .. 1.01 (the cable equation's form): well conditioned, never singular.
  void AddRandom(const std::vector<int32_t>& p, std::mt19937_64& rng) {
    const int64_t n = int64_t(p.size());
    std::uniform_real_distribution<double> u(0.1, 1.0), r(-1, 1), extra(0.01, 1.01);
    std::vector<double> lo(n), up(n), dg(n), rh(n);
    for (int64_t i = 0; i < n; ++i) {
      // The root's lower and upper are not part of the matrix: values there must be ignored.
      lo[i] = i > 0 ? -u(rng) : 77.0;
      up[i] = i > 0 ? -u(rng) : -55.0;
      rh[i] = r(rng);
      dg[i] += extra(rng) + (i > 0 ? std::abs(lo[i]) : 0.0);
      if (i > 0) dg[p[i]] += std::abs(up[i]);
    }
    Add(p, lo, up, dg, rh);
  }
  // Two nodes, [[1, 1], [1, 1]]: exactly singular (the root's pivot cancels to 0).
  void AddSingular() { Add({-1, 0}, {5.0, 1.0}, {5.0, 1.0}, {1.0, 1.0}, {1.0, 2.0}); }

  template <typename T>
  struct Typed {
    std::vector<T> lower, upper, diag, rhs;
  };
  template <typename T>
  Typed<T> As() const {
    return {std::vector<T>(lower.begin(), lower.end()), std::vector<T>(upper.begin(), upper.end()),
            std::vector<T>(diag.begin(), diag.end()), std::vector<T>(rhs.begin(), rhs.end())};
  }
  // The problem over arrays of type T (kept by the caller: `typed`).
  template <typename T>
  TreeProblem<T> Problem(const Typed<T>& typed) const {
    TreeProblem<T> p;
    p.batch = cells();
    p.n = 0;
    for (int32_t l : lengths) p.n = std::max<int64_t>(p.n, l);
    p.parent = parent.data();
    p.offsets = offsets.data();
    p.lower = typed.lower.data();
    p.upper = typed.upper.data();
    p.diag = typed.diag.data();
    p.rhs = typed.rhs.data();
    return p;
  }
  // Cell s alone as a tree of its own (batch 1).
  template <typename T>
  TreeProblem<T> CellAlone(const Typed<T>& typed, int64_t s) const {
    TreeProblem<T> p;
    p.batch = 1;
    p.n = lengths[size_t(s)];
    const int64_t o = offsets[size_t(s)];
    p.parent = parent.data() + o;
    p.lower = typed.lower.data() + o;
    p.upper = typed.upper.data() + o;
    p.diag = typed.diag.data() + o;
    p.rhs = typed.rhs.data() + o;
    return p;
  }
};

// A random recursive tree of n nodes (node i hangs from a uniform node below it).
inline std::vector<int32_t> RandomParents(int64_t n, std::mt19937_64& rng) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  p[0] = -1;
  for (int64_t i = 1; i < n; ++i)
    p[size_t(i)] = int32_t(std::uniform_int_distribution<int64_t>(0, i - 1)(rng));
  return p;
}

// Cells 1, 2 and 5 nodes, x = [2 | 1 -1 | 1 2 3 -1 2] (hand-worked below). The roots' lower and
// upper hold values that are not part of the matrix.
//   cell 0: [4] x = [8]
//   cell 1: parent [-1 0], A = [[3 1] [1 2]] (upper[1] = 1 at (0, 1), lower[1] = 1 at (1, 0)):
//           row 0: 3*1 + 1*(-1) = 2; row 1: 1*1 + 2*(-1) = -1
//   cell 2: parent [-1 0 1 0 3], diag [5 4 3 4 2], lower [. 1 -1 0.5 1], upper [. 2 1 -1 0.5]:
//           row 0: 5*1 + 2*2 + (-1)(-1) = 10      row 1: 1*1 + 4*2 + 1*3 = 12
//           row 2: -1*2 + 3*3 = 7                 row 3: 0.5*1 + 4*(-1) + 0.5*2 = -2.5
//           row 4: 1*(-1) + 2*2 = 3
inline Cells HandWorkedCells() {
  Cells c;
  c.Add({-1}, {9.0}, {-9.0}, {4.0}, {8.0});
  c.Add({-1, 0}, {3.5, 1.0}, {-2.5, 1.0}, {3.0, 2.0}, {2.0, -1.0});
  c.Add({-1, 0, 1, 0, 3}, {6.0, 1.0, -1.0, 0.5, 1.0}, {-6.0, 2.0, 1.0, -1.0, 0.5},
        {5.0, 4.0, 3.0, 4.0, 2.0}, {10.0, 12.0, 7.0, -2.5, 3.0});
  return c;
}
inline std::vector<double> HandWorkedX() { return {2, 1, -1, 1, 2, 3, -1, 2}; }

}  // namespace trisolve::testing
