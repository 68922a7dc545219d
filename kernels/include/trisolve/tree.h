// Tree (Hines) systems: nodes numbered depth-first from the root 0, parent[0] = -1 and
// parent[i] < i. A[i][i] = diag[i], A[i][parent[i]] = lower[i], A[parent[i]][i] = upper[i].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/types.h"

namespace trisolve {

// kHines: the sequential sweeps. kCables: the same elimination organised for one large tree
// across the GPU (TreeCables below); the CPU runs its sequential form. kContraction: the
// elimination reordered into O(log n) parallel rounds (TreeContraction below), for cells of
// one morphology solved one thread block a cell; the CPU runs the rounds in order.
enum class TreeMethod : uint8_t { kAuto, kHines, kCables, kContraction };
absl::StatusOr<TreeMethod> ParseTreeMethod(absl::string_view name);
absl::string_view MethodName(TreeMethod m);

template <typename T>
struct TreeProblem {
  int64_t batch = 0;
  int64_t n = 0;
  Layout layout = Layout::kFlat;
  // n values shared by every system, or batch * n (one array per system, always flat).
  const int32_t* parent = nullptr;
  bool parent_per_system = false;
  const T* lower = nullptr;
  const T* upper = nullptr;
  const T* diag = nullptr;
  const T* rhs = nullptr;
  // Cells of different sizes (layout kFlat, every array the cells' nodes concatenated, parent
  // too, each cell's parent values local to it: its node 0 is its root): cell s is nodes
  // offsets[s] .. offsets[s + 1] - 1, batch + 1 host values, every cell at least one node; n is
  // then the largest cell's size and parent_per_system false. nullptr: every cell has n nodes.
  const int64_t* offsets = nullptr;

  bool variable() const { return offsets != nullptr; }
  int64_t unknowns() const { return offsets != nullptr ? offsets[batch] : batch * n; }
  // Nodes of cell s, the index of its first element (flat: s * n; interleaved: s) and of its
  // parent array.
  int64_t nodes(int64_t s) const { return offsets != nullptr ? offsets[s + 1] - offsets[s] : n; }
  int64_t first(int64_t s) const {
    return offsets != nullptr ? offsets[s] : SystemOffset(layout, n, s);
  }
  const int32_t* parent_of(int64_t s) const {
    return parent + (offsets != nullptr ? offsets[s] : parent_per_system ? s * n : 0);
  }
};

template <typename T>
struct TreeOutput {
  T* x = nullptr;
  SystemStatus* status = nullptr;
};

// OK when parent[0] == -1 and 0 <= parent[i] < i for i > 0; otherwise names the first
// offending node.
absl::Status ValidateParents(const int32_t* parent, int64_t n);

// The cable decomposition of a tree, computed once per parent array (O(n)). A cable is a
// maximal run of consecutive nodes [start[c], start[c + 1]) in which each node is the only
// child of the one before (parent[j] == j - 1); with depth-first numbering these are the
// unbranched sections of the tree, and only a cable's last ("bottom") node can have children
// outside it. Cable c hangs from node anchor[c] = parent[start[c]] (-1 for the root cable),
// which is the bottom node of another cable.
//
// Elimination by cables: a cable whose child cables are done gathers their contributions into
// its bottom node, then eliminates itself bottom to top as the Hines sweep does and leaves
// x_j = q_j - w_j x_anchor for each of its nodes (q = the cable's solution with x_anchor = 0,
// w = the response to x_anchor) and one contribution (dD, dR) for its anchor. Cables of equal
// height (0 for leaves, 1 + the largest child height otherwise) are independent: the backward
// phase runs the heights upwards, the forward phase x_j = q_j - w_j x_anchor downwards.
struct TreeCables {
  int64_t n = 0;
  std::vector<int32_t> start;       // C + 1 values; cable c is [start[c], start[c + 1])
  std::vector<int32_t> anchor;      // C values: parent[start[c]]
  std::vector<int32_t> child_ptr;   // C + 1: the cables hanging from c's bottom node are
  std::vector<int32_t> child_list;  //        child_list[child_ptr[c] .. child_ptr[c + 1])
  std::vector<int32_t> order;       // cables by height, lowest first
  std::vector<int32_t> level_ptr;   // H + 2: order[level_ptr[h] .. level_ptr[h + 1]) have height h
  std::vector<int32_t> node_order;  // nodes of the cables in `order`, cable by cable
  std::vector<int32_t> node_level_ptr;  // H + 2: node_order[...] of height h
  int64_t cables() const { return int64_t(anchor.size()); }
  int64_t levels() const { return int64_t(level_ptr.size()) - 1; }
  int64_t length(int64_t c) const { return start[c + 1] - start[c]; }
};
// parent must be valid (ValidateParents).
TreeCables BuildTreeCables(const int32_t* parent, int64_t n);

// Tree contraction: Gaussian elimination of a tree in rounds, each removing an independent set
// of nodes (no two adjacent) that have at most one child at that time: every leaf ("rake")
// and, along each unbranched path, every other node with one child ("compress", which joins
// its child to its parent: the fill-in is one new edge, so the graph stays a tree). Each round
// removes about half the nodes left, so a tree of n nodes takes O(log n) rounds (12 for the
// 3,187-node cell of tests/data, against 27 cable heights and an 88-node longest path); the
// root goes last, alone. The nodes of a round are eliminated in parallel, then every survivor
// next to one of them takes its updates (it alone writes its row); back substitution runs the
// rounds in reverse: x_v = q_v - wp_v x_p - wc_v x_c, p and c being v's parent and child when
// it was removed (both removed later).
//
// A pivot vanishes when it is zero or not finite when its node is removed, or when a round's
// update cancels a diagonal below the rounding level of its terms: |D'| <= eps (|D| + sum of
// |terms|). (The Hines sweep compares with all terms a node ever took; here a node keeps only
// four values, so each round's update is checked on its own.)
struct TreeContraction {
  struct Elim {
    int32_t v, p, c;  // the node removed, its parent and only child then (-1: none)
  };
  struct Update {
    int32_t u;      // a survivor next to removed nodes
    int32_t from;   // its parent, if removed by compression this round (-1: not)
    int32_t first;  // its removed children: children[first .. first + count)
    int32_t count;
  };
  int64_t n = 0;
  std::vector<int32_t> elim_ptr;  // R + 1: round r removes elim[elim_ptr[r] .. elim_ptr[r + 1])
  std::vector<Elim> elim;         // n entries; the last round is the root alone
  std::vector<int32_t> upd_ptr;   // R + 1: after round r, upd[upd_ptr[r] .. upd_ptr[r + 1])
  std::vector<Update> upd;
  std::vector<int32_t> children;
  int64_t rounds() const { return int64_t(elim_ptr.size()) - 1; }
};
// parent must be valid (ValidateParents).
TreeContraction BuildTreeContraction(const int32_t* parent, int64_t n);

// Cells of different sizes (TreeProblem::offsets, `cells` of them, each parent array local to
// its cell) as the parent array of one tree of offsets[cells] nodes: cell k's nodes keep their
// places, its parent values move by offsets[k], and its root (k > 0) hangs from the root of
// cell (k - 1) / kForestFanout. With the roots' couplings (lower and upper at each root but the
// first) set to zero, that tree's matrix is the cells' block-diagonal matrix exactly: every
// elimination step across a root adds 0 * 0 / D and 0 * x, so each cell's pivots, their
// vanishing tests and x are those of the cell solved alone (while its pivots are finite). The
// fan-out keeps the roots' chain log_F(cells) deep, not `cells`: the cable elimination runs a
// launch a height of the cable tree (a chain of 10,240 roots would be 10,240 heights).
constexpr int64_t kForestFanout = 32;
std::vector<int32_t> ForestAsOneTree(const int32_t* parent, const int64_t* offsets,
                                     int64_t cells);

template <typename T>
double TreeBackwardError(const TreeProblem<T>& p, const T* x, const SystemStatus* status);

}  // namespace trisolve
