// Tree (Hines) systems on the GPU, on device arrays.
//
// "hines-batch": cells sharing one morphology, one thread per cell. The parent array and a
// byte of flags per node are staged once per block in shared memory (not read once per cell).
// Along an unbranched cable (parent[i] = i - 1, most nodes of a real morphology) the backward
// sweep hands node i's contribution to node i - 1 in registers; only contributions to branch
// points go through a scratch array, initialised by the first child to arrive (no memset). The
// backward sweep leaves R_i / D_i in x and lower_i / D_i in a scratch array; the forward sweep
// reads them back: about 9 arrays of traffic against the 5 that must move.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "memory_pool.h"
#include "trisolve/tree.h"

namespace trisolve::cuda {

// Per-node flags for a shared morphology, computed once on the host from a valid parent array.
enum TreeNodeFlag : uint8_t {
  kCarryToParent = 1,  // parent[i] == i - 1: the contribution travels in registers
  kHasBranchAcc = 2,   // some child j != i + 1 left a contribution in the scratch array
  kFirstBranchChild = 4,  // the first (highest) such child of its parent: initialises it
};
std::vector<uint8_t> TreeNodeFlags(const int32_t* parent, int64_t n);

// The largest n the batch kernel stages in shared memory (5 bytes a node).
int64_t MaxTreeNodesOnChip();

// Solves p (device arrays, one shared parent array, either layout) on `stream`; node_flags is
// a device copy of TreeNodeFlags(parent). status_flags as for the tridiagonal kernels.
template <typename T>
absl::Status SolveTreeBatchDevice(const TreeProblem<T>& p, const uint8_t* node_flags, T* x,
                                  uint8_t* status_flags, Pool& pool, cudaStream_t stream);

}  // namespace trisolve::cuda
