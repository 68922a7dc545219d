// The tree family's dispatch on the device: the one place where a TreeMethod (auto included)
// becomes the path that runs it. The CUDA backend stages the arrays and runs the path.
#pragma once

#include <cstdint>

#include "tree/tree.h"
#include "trisolve/tree.h"

namespace trisolve::cuda {

enum class TreePath {
  kHost,              // the CPU reference on the host (the method has no device form here)
  kContractionBlock,  // "contraction-block": one block a cell, the tree contraction
  kCablesBlock,       // "cables-block": one block a cell, the cable elimination
  kCables,            // "cables": one tree across the GPU, a launch a height of the cable tree
  kHinesBatch,        // "hines-batch": one thread a cell
};

// Whether the path is chosen with the morphology's cable plan (the caller builds or finds it
// first): one morphology for every cell and a method other than hines.
template <typename T>
bool TreeWantsPlan(const TreeProblem<T>& p, TreeMethod m);

// The path for p and m; plan: the morphology's (null where TreeWantsPlan is false).
template <typename T>
TreePath ChooseTreePath(const TreeProblem<T>& p, TreeMethod m, const TreeCablesPlan* plan);

}  // namespace trisolve::cuda
