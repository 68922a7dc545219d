// A family described once: its arrays, its methods, the checks its arrays must pass before a
// solve reads them, how a solve of it runs and its residual. The server's jobs, the prepared
// systems and the batcher read this table instead of spelling each family out; adding a family
// is a row here (docs/contributing.md, "Adding a family").
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trisolve/backend.h"
#include "trisolve/system.h"

namespace trisolve {

// What an array is to its family.
enum class ArrayRole : uint8_t {
  kCoefficient,   // matrix values (SystemSpec::coefficients[coefficient])
  kParent,        // the tree's parent indices: a coefficient too, int32
  kRhs,           // the right-hand side; x takes its shape
  kInitialGuess,  // the iteration's start (block-tridiagonal y0); one-shot solves only
  kLengths,       // the sizes of a variable-size batch (int32); one-shot solves only
  kUnified,       // a, b, c of a row together (tridiagonal abc); one-shot solves only
};

// The most arrays a family has (tridiagonal: a, abc, b, c, d, lengths).
inline constexpr int kMaxArrays = 7;

struct ArrayDescriptor {
  // The canonical name: errors, logs, coefficient updates and chunks use it (the thesis' name
  // where it differs from the request field: aC for a_c).
  absl::string_view name;
  // Another name a chunk or an update may give ("a_c" for aC, dense "A" for a); "" none.
  absl::string_view alias;
  // The request message's field ("a_c" for the block family's aC; else the name).
  absl::string_view field;
  ArrayRole role;
  int coefficient = -1;  // its index in SystemSpec::coefficients, -1: not a coefficient
  bool int32 = false;    // int32 values; otherwise the job's precision
  bool square = false;   // n * n values a system (a dense matrix); otherwise n
  // The ranks a request may give it (its full shape rule, which relates it to the others, is
  // the family's Declare in server/translate.cc).
  int min_rank = 1, max_rank = 2;
};

// A one-shot solve's arrays beyond the system SystemSpec describes (a prepared system takes
// none of them). Null: not given.
struct OneShotArrays {
  const void* initial_guess = nullptr;  // block-tridiagonal y0 (as f)
  // Tridiagonal systems or tree cells of these sizes (`batch` of them; n their sum).
  const int32_t* lengths = nullptr;
  const void* unified = nullptr;        // tridiagonal abc (then coefficients[0..2] are unset)
};

// One precision's operations of a family. The spec's coefficients and the right-hand side are
// host or device pointers as the backend takes them; x and status as its Output types say.
template <typename T>
struct FamilyOps {
  absl::StatusOr<SolveInfo> (*solve)(Backend& backend, const SystemSpec& spec, const T* rhs,
                                     const OneShotArrays& extra, T* x, SystemStatus* status,
                                     const SolveControl& control);
  // The largest normwise backward error of the systems whose status is kOk, from the host
  // arrays (NaN when none is). Null for a family whose solvers report their own residual
  // (SolveInfo::residual).
  double (*backward_error)(const SystemSpec& spec, const T* rhs, const OneShotArrays& extra,
                           const T* x, const SystemStatus* status);
};

struct FamilyDescriptor {
  Family family;
  absl::string_view name;  // "tridiagonal", "tree", "block-tridiagonal", "dense"
  // Every array, in the byte order of their names: the checks visit them in this order, and of
  // several bad arrays the error names the first, as the wire's messages expect. A job keeps
  // its arrays in slots of this order.
  absl::Span<const ArrayDescriptor> arrays;
  // The coefficients' slots in SystemSpec order, and the right-hand side's slot.
  absl::Span<const int> coefficient_slots;
  int rhs_slot = -1;
  // A system of one solved for k right-hand sides at once as k systems of its coefficients
  // replicated (PreparedSystem::Replicated); otherwise one solve a right-hand side.
  bool replicates = false;
  // Iterates to a tolerance (BlockOptions, a residual history, SolveInfo::residual the
  // answer's residual): one system a job, never batched with others, no backward error.
  bool iterative = false;

  // Its methods: the spelling users type ("" and "auto" are kAuto, 0), the enum as uint8_t.
  // Unknown: INVALID_ARGUMENT naming the field `method`, the names known listed.
  absl::StatusOr<uint8_t> (*parse_method)(absl::string_view name);
  absl::string_view (*method_name)(uint8_t method);

  // What must hold before a solve reads the arrays, the error naming the array: a parent
  // array that is a tree (an index out of range would be read), a variable-size batch's
  // lengths, symmetry where spec.method needs it. spec describes the system the coefficients
  // are (batch 1 for one matrix and many right-hand sides), on the host.
  absl::Status (*check_structure)(const SystemSpec& spec, const OneShotArrays& extra);
  // The same for one coefficient a system's update replaces (values on the host); OK where
  // nothing but finiteness matters.
  absl::Status (*check_update)(const SystemSpec& spec, int coefficient, const void* values);

  FamilyOps<double> f64;
  FamilyOps<float> f32;

  template <typename T>
  const FamilyOps<T>& ops() const {
    if constexpr (std::is_same_v<T, double>) {
      return f64;
    } else {
      return f32;
    }
  }
  // The slot of an array by its canonical name or alias, -1 if the family has none.
  int Find(absl::string_view name) const;
  const ArrayDescriptor& coefficient(int i) const {
    return arrays[size_t(coefficient_slots[size_t(i)])];
  }
};

const FamilyDescriptor& Describe(Family f);
// Every family, in Family's order.
absl::Span<const Family> Families();

// A variable-size batch's offsets from its lengths (checked: every one >= 1): batch + 1 values
// in *offsets, offsets[s] the first element of system s. Returns the largest length.
inline int64_t VariableOffsets(const int32_t* lengths, int64_t batch,
                               std::vector<int64_t>* offsets) {
  offsets->assign(size_t(batch) + 1, 0);
  int64_t longest = 0;
  for (int64_t q = 0; q < batch; ++q) {
    (*offsets)[size_t(q) + 1] = (*offsets)[size_t(q)] + lengths[q];
    longest = std::max<int64_t>(longest, lengths[q]);
  }
  return longest;
}

// What must hold of a variable-size batch's lengths before its offsets are used: every one
// >= 1 (`need` says why: "every system needs at least one row"), their sum `total`, the length
// of `arrays` ("a, b, c and d"). INVALID_ARGUMENT naming the field `lengths`.
absl::Status CheckLengths(const int32_t* lengths, int64_t batch, int64_t total,
                          absl::string_view arrays, absl::string_view need);

// A variable-size batch's lengths: the one-shot call's (extra) or the spec's; null for a batch
// of one size.
inline const int32_t* LengthsOf(const SystemSpec& s, const OneShotArrays& e) {
  return e.lengths != nullptr ? e.lengths : s.lengths;
}
// A variable-size batch's offsets and its longest system: the spec's where its holder keeps
// them (a prepared system), else computed into *offsets. Returns the longest.
inline int64_t OffsetsOf(const SystemSpec& s, const int32_t* lengths, const int64_t** out,
                         std::vector<int64_t>* offsets) {
  if (lengths == s.lengths && s.offsets != nullptr) {
    *out = s.offsets;
    return s.longest;
  }
  const int64_t longest = VariableOffsets(lengths, s.batch, offsets);
  *out = offsets->data();
  return longest;
}

// The typed problems of a one-shot solve: the spec's system with its extra arrays. A
// variable-size batch's offsets are kept in *offsets (unless the spec has them).
template <typename T>
TridiagonalProblem<T> TridiagonalOf(const SystemSpec& s, const T* rhs, const OneShotArrays& e,
                                    std::vector<int64_t>* offsets) {
  TridiagonalProblem<T> p = TridiagonalOf(s, rhs);
  if (e.unified != nullptr) {
    const T* abc = static_cast<const T*>(e.unified);
    p.a = abc;
    p.b = abc + 1;
    p.c = abc + 2;
    p.coef_stride = 3;
  }
  if (const int32_t* lengths = LengthsOf(s, e); lengths != nullptr)
    p.n = OffsetsOf(s, lengths, &p.offsets, offsets);
  return p;
}
// (Cells of different sizes: s.n is their total, s.parent_per_system false.)
template <typename T>
TreeProblem<T> TreeOf(const SystemSpec& s, const T* rhs, const OneShotArrays& e,
                      std::vector<int64_t>* offsets) {
  TreeProblem<T> p = TreeOf(s, rhs);
  if (const int32_t* lengths = LengthsOf(s, e); lengths != nullptr) {
    p.n = OffsetsOf(s, lengths, &p.offsets, offsets);
    p.parent_per_system = false;
  }
  return p;
}
template <typename T>
BlockTridiagonalProblem<T> BlockOf(const SystemSpec& s, const T* f, const OneShotArrays& e) {
  BlockTridiagonalProblem<T> p = BlockOf(s, f);
  p.y0 = static_cast<const T*>(e.initial_guess);
  return p;
}

}  // namespace trisolve
