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
// across the GPU (TreeCables below); the CPU runs its sequential form.
enum class TreeMethod : uint8_t { kAuto, kHines, kCables };
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

namespace cpu {
template <typename T>
SolveInfo SolveTree(const TreeProblem<T>& p, TreeMethod method, TreeOutput<T> out);
}  // namespace cpu

template <typename T>
double TreeBackwardError(const TreeProblem<T>& p, const T* x, const SystemStatus* status);

}  // namespace trisolve
