#include "tree/dispatch.h"

namespace trisolve::cuda {
namespace {

// Below this many cells of one morphology the cables beat one thread a cell: too few cells to
// fill the GPU one a thread. Evidence: docs/kernels/tree.md, "Tuning evidence", kCablesBelowBatch.
constexpr int64_t kCablesBelowBatch = 2048;
// Below this many cells of one morphology in the interleaved layout, contraction-block beats
// hines-batch. Evidence: docs/kernels/tree.md, "Tuning evidence", kContractionBelowBatch.
constexpr int64_t kContractionBelowBatch = 4608;

template <typename T>
bool PerCell(const TreeProblem<T>& p) {
  return p.parent_per_system && p.batch > 1;
}

}  // namespace

template <typename T>
bool TreeWantsPlan(const TreeProblem<T>& p, TreeMethod m) {
  return !PerCell(p) && m != TreeMethod::kHines;
}

// Cells of their own morphologies: one thread a cell (hines-batch reading each cell's parent
// array); the cable and contraction plans are per morphology, so "cables" and "contraction"
// for them run on the host. One morphology: cells that fit in shared memory (n <= ~7,200 in
// float64) run one block a cell: auto takes the tree contraction (contraction-block: the
// fastest path for cells at every batch measured in the flat layout, and below
// kContractionBelowBatch cells in the interleaved one, bench_tree); larger interleaved batches
// take hines-batch (one thread a cell: the interleaved layout's strided rows cost the block
// kernels 4x their sectors); larger trees or few cells the cables.
template <typename T>
TreePath ChooseTreePath(const TreeProblem<T>& p, TreeMethod m, const TreeCablesPlan* plan) {
  if (PerCell(p) && (m == TreeMethod::kCables || m == TreeMethod::kContraction))
    return TreePath::kHost;
  const bool il = p.layout == Layout::kInterleaved;
  const bool contraction_fits = plan != nullptr && ContractionBlockFits(p, *plan);
  if (m == TreeMethod::kContraction && !contraction_fits) return TreePath::kHost;
  const bool contraction =
      contraction_fits && (m == TreeMethod::kContraction ||
                           (m == TreeMethod::kAuto &&
                            (!il || p.batch < kContractionBelowBatch ||
                             p.n > MaxTreeNodesOnChip())));
  if (contraction) return TreePath::kContractionBlock;
  const bool block = m == TreeMethod::kCables && CablesBlockFits(p, *plan);
  const bool cables = plan != nullptr && (m == TreeMethod::kCables ||
                                          p.batch < kCablesBelowBatch ||
                                          p.n > MaxTreeNodesOnChip());
  if (cables) return block ? TreePath::kCablesBlock : TreePath::kCables;
  return TreePath::kHinesBatch;
}

template bool TreeWantsPlan(const TreeProblem<double>&, TreeMethod);
template bool TreeWantsPlan(const TreeProblem<float>&, TreeMethod);
template TreePath ChooseTreePath(const TreeProblem<double>&, TreeMethod, const TreeCablesPlan*);
template TreePath ChooseTreePath(const TreeProblem<float>&, TreeMethod, const TreeCablesPlan*);

}  // namespace trisolve::cuda
