// One tree (Hines) system solved in parts, each part by a backend of its own (the devices of
// the multi-device backend), joined exactly on the host. Internal to trisolve_kernels
// (placed_backend.cc); the tests reach it through MakePlacedBackend.
//
// The cut: every part but part 0 is a union of whole subtrees of what the parts after it left;
// part 0 keeps the root. A "link" is a node p with children in parts other than its own (a
// cut parent). Part Q's rows read
//   A_QQ x_Q + sum over its links' nodes p of G_p e_p + sum over the outside parents p of its
//   subtree roots r of lower_r x_p e_r = d_Q,    G_p = sum of upper_r x_r over p's cut children,
// so x_Q = y - sum X_p u_p - sum G_p w_p with A_QQ y = d_Q, A_QQ u_p = sum lower_r e_r (the
// roots hanging from p) and A_QQ w_p = e_p. The unknowns X_p = x_p and G_p of every link (two
// a link, however many children it lost) solve a dense system on the host in long double; each
// part's x is then y less its extra solutions times them. Nothing is dropped: the answer is the
// whole tree's to rounding, nonsingular where A and every part are.
//
// A part goes to its backend as one tree of m + 1 nodes (a node 0 of its own, diag 1 and rhs 0,
// from which its subtrees hang with zero couplings: a valid tree however many subtrees it
// holds, renumbered in the original order so parent[i] < i holds) with 1 + (its links)
// right-hand sides ([k, m + 1]): the caller prepares it on its device, so that the
// coefficients cross once, and solves them there (placed_backend.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "split_system.h"
#include "trisolve/tree.h"
#include "trisolve/types.h"

namespace trisolve {

struct TreeCut {
  int parts = 0;                 // 0: no cut
  std::vector<uint8_t> part_of;  // n values
  std::vector<int64_t> nodes;    // per part, without its node 0
  std::vector<int64_t> rhs;      // per part: 1 + its up and down links
  std::vector<int32_t> link_node;  // the links' nodes, ascending
  // Per part, indices into link_node: up, the outside parents of its subtree roots; down, its
  // own nodes with children elsewhere. Its right-hand sides: d, then one an up link, then one a
  // down link.
  std::vector<std::vector<int32_t>> up, down;
  // Each node's number in its part (1-based: 0 is the part's own root), the parts' nodes in
  // order, and the nodes whose parent is in another part.
  std::vector<int32_t> local;
  std::vector<std::vector<int32_t>> members;
  std::vector<int32_t> cut_children;
  // Per part, its tree's parent array (m + 1 values; 0 for its subtree roots), and its
  // subtree roots' (node number in the part, right-hand side they couple into): what a solve
  // needs of the structure, made once with the cut, so that a solve only gathers values.
  std::vector<std::vector<int32_t>> part_parent;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> root_rhs;
};

// At most this many links a part takes from the tree (each adds a right-hand side to two parts
// and two unknowns to the host's system); past it, parts are left less even.
constexpr int kTreeMaxLinksPerPart = 4;

// Parts in proportion to `weights`, each within `tolerance` of its share (a fraction) where a
// few links reach it: a link more costs its two parts a right-hand side each (two more arrays
// to move), so where the parts are for speed a part some 20% short beats one more link.
// parent: valid (else no cut). No cut where a part would be empty or parts exceed 255. O(n) a
// part.
constexpr double kTreeCutForSpeed = 0.2;
constexpr double kTreeCutForMemory = 0.001;
TreeCut CutTree(const int32_t* parent, int64_t n, const std::vector<double>& weights,
                double tolerance);

// Solves part `k`: `part` is one tree whose rhs holds `rhs` right-hand sides ([rhs, n], flat);
// x has as many solutions and status as many entries.
template <typename T>
using SolveTreePartFn = std::function<absl::StatusOr<SolveInfo>(
    size_t k, const TreeProblem<T>& part, int64_t rhs, TreeOutput<T> out)>;

// p: one tree (batch 1). Runs solve_part for every part at once (part 0 on the calling thread).
// A part's error that is the caller's (non-finite input, deadline, cancelled) is returned as it
// is; any other, a part singular on its own, or a singular system of the links leaves `solved`
// false with `why` (the caller solves the tree another way).
template <typename T>
absl::StatusOr<SplitOutcome> SolveTreeSplit(const TreeProblem<T>& p, const TreeCut& cut,
                                            const SolveTreePartFn<T>& solve_part, T* x);

}  // namespace trisolve
