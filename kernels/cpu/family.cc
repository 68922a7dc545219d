// The families' descriptors (trisolve/family.h), and the family-neutral names of system.h read
// from them.
#include "trisolve/family.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trisolve {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

template <typename Method, absl::StatusOr<Method> (*Parse)(absl::string_view)>
absl::StatusOr<uint8_t> ParseAs(absl::string_view name) {
  auto m = Parse(name);
  if (!m.ok()) return m.status();
  return uint8_t(*m);
}
template <typename Method>
absl::string_view NameOf(uint8_t m) {
  return MethodName(Method(m));
}

absl::Status NothingToCheck(const SystemSpec&, const OneShotArrays&) { return absl::OkStatus(); }
absl::Status NoUpdateCheck(const SystemSpec&, int, const void*) { return absl::OkStatus(); }

// ---- tridiagonal ------------------------------------------------------------------------------

// Shapes: d [batch, n] (flat) or [n, batch] (interleaved) or [n]; a, b, c as d, or [n] each for
// one matrix and d's batch of right-hand sides; abc d's shape and 3; a variable-size batch's d
// [total] and lengths [batch].
constexpr ArrayDescriptor kTridiagonalArrays[] = {
    {.name = "a", .field = "a", .role = ArrayRole::kCoefficient, .coefficient = 0},
    {.name = "abc", .field = "abc", .role = ArrayRole::kUnified, .min_rank = 2, .max_rank = 3},
    {.name = "b", .field = "b", .role = ArrayRole::kCoefficient, .coefficient = 1},
    {.name = "c", .field = "c", .role = ArrayRole::kCoefficient, .coefficient = 2},
    {.name = "d", .field = "d", .role = ArrayRole::kRhs},
    {.name = "lengths",
     .field = "lengths",
     .role = ArrayRole::kLengths,
     .int32 = true,
     .max_rank = 1},
};
constexpr int kTridiagonalCoefficients[] = {0, 2, 3};

absl::Status TridiagonalStructure(const SystemSpec& s, const OneShotArrays& e) {
  const int32_t* lengths = LengthsOf(s, e);
  if (lengths == nullptr) return absl::OkStatus();
  return CheckLengths(lengths, s.batch, s.n, "a, b, c and d",
                      "every system needs at least one row");
}

template <typename T>
absl::StatusOr<SolveInfo> TridiagonalSolve(Backend& be, const SystemSpec& s, const T* rhs,
                                           const OneShotArrays& e, T* x, SystemStatus* status,
                                           const SolveControl& control) {
  std::vector<int64_t> offsets;
  return be.Solve(TridiagonalOf(s, rhs, e, &offsets), TridiagonalMethod(s.method),
                  TridiagonalOutput<T>{x, status}, control);
}
template <typename T>
double TridiagonalResidual(const SystemSpec& s, const T* rhs, const OneShotArrays& e, const T* x,
                           const SystemStatus* status) {
  std::vector<int64_t> offsets;
  return TridiagonalBackwardError(TridiagonalOf(s, rhs, e, &offsets), x, status);
}

// ---- tree -------------------------------------------------------------------------------------

// Shapes: rhs as the tridiagonal d; lower, upper, diag as rhs (or [n] for one matrix); parent
// [n] (one tree for the batch) or [batch, n] (one a system); cells of different sizes: every
// array [total] and lengths [cells].
constexpr ArrayDescriptor kTreeArrays[] = {
    {.name = "diag", .field = "diag", .role = ArrayRole::kCoefficient, .coefficient = 2},
    {.name = "lengths",
     .field = "lengths",
     .role = ArrayRole::kLengths,
     .int32 = true,
     .max_rank = 1},
    {.name = "lower", .field = "lower", .role = ArrayRole::kCoefficient, .coefficient = 0},
    {.name = "parent",
     .field = "parent",
     .role = ArrayRole::kParent,
     .coefficient = 3,
     .int32 = true},
    {.name = "rhs", .field = "rhs", .role = ArrayRole::kRhs},
    {.name = "upper", .field = "upper", .role = ArrayRole::kCoefficient, .coefficient = 1},
};
constexpr int kTreeCoefficients[] = {2, 5, 0, 3};
constexpr int kTreeParent = 3;

// Cells of different sizes: each cell's parent array a tree of its own nodes (ValidateParents'
// rule, the values local to the cell). The error names the cell, its node and the element of
// the request's parent array.
absl::Status CellParents(const int32_t* parent, const int32_t* lengths, int64_t cells) {
  int64_t first = 0;
  for (int64_t q = 0; q < cells; first += lengths[q], ++q) {
    const int32_t* p = parent + first;
    if (p[0] != -1)
      return Invalid("parent", absl::StrCat("cell ", q, ": parent[", first, "] (its node 0) is ",
                                            p[0], ", expected -1 (a cell's first node is its "
                                            "root; parent values count from the cell's start)"));
    for (int64_t i = 1; i < lengths[q]; ++i)
      if (p[i] < 0 || p[i] >= i)
        return Invalid("parent",
                       absl::StrCat("cell ", q, ": parent[", first + i, "] (its node ", i,
                                    ") is ", p[i], ", expected 0 <= parent < ", i,
                                    " (parent values count from the cell's start)"));
  }
  return absl::OkStatus();
}

absl::Status TreeStructure(const SystemSpec& s, const OneShotArrays& e) {
  const auto* parent = static_cast<const int32_t*>(s.coefficients[kTreeParent]);
  if (const int32_t* lengths = LengthsOf(s, e); lengths != nullptr) {
    // Read before any solve: the offsets the solvers index by come from these.
    if (auto st = CheckLengths(lengths, s.batch, s.n, "parent, lower, upper, diag and rhs",
                               "every cell needs at least one node");
        !st.ok())
      return st;
    return CellParents(parent, lengths, s.batch);
  }
  const int64_t trees = s.parent_per_system ? s.batch : 1;
  for (int64_t q = 0; q < trees; ++q) {
    absl::Status st = ValidateParents(parent + q * s.n, s.n);
    if (!st.ok())
      return Invalid(
          "parent",
          absl::StrCat(s.parent_per_system ? absl::StrCat("system ", q, ": ") : "", st.message()));
  }
  return absl::OkStatus();
}
absl::Status TreeUpdate(const SystemSpec& s, int coefficient, const void* values) {
  if (coefficient != kTreeParent) return absl::OkStatus();
  const auto* parent = static_cast<const int32_t*>(values);
  // Cells of different sizes: each cell's parents a tree of its own nodes, as at creation.
  if (s.variable()) return CellParents(parent, s.lengths, s.batch);
  const int64_t trees = s.parent_per_system ? s.batch : 1;
  for (int64_t q = 0; q < trees; ++q)
    if (auto st = ValidateParents(parent + q * s.n, s.n); !st.ok())
      return Invalid("parent", st.message());
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<SolveInfo> TreeSolve(Backend& be, const SystemSpec& s, const T* rhs,
                                    const OneShotArrays& e, T* x, SystemStatus* status,
                                    const SolveControl& control) {
  std::vector<int64_t> offsets;
  return be.Solve(TreeOf(s, rhs, e, &offsets), TreeMethod(s.method), TreeOutput<T>{x, status},
                  control);
}
template <typename T>
double TreeResidual(const SystemSpec& s, const T* rhs, const OneShotArrays& e, const T* x,
                    const SystemStatus* status) {
  std::vector<int64_t> offsets;
  return TreeBackwardError(TreeOf(s, rhs, e, &offsets), x, status);
}

// ---- block-tridiagonal ------------------------------------------------------------------------

// Shapes: f [N, M] or [M] (N = 1), or [k, N, M] for k right-hand sides of one system; the five
// coefficients [N, M] (f's, or its systems'); y0 as f, one right-hand side only. The request's
// fields are a_c ... (proto style); the thesis' names are canonical.
constexpr ArrayDescriptor kBlockArrays[] = {
    {.name = "aC",
     .alias = "a_c",
     .field = "a_c",
     .role = ArrayRole::kCoefficient,
     .coefficient = 0},
    {.name = "bC",
     .alias = "b_c",
     .field = "b_c",
     .role = ArrayRole::kCoefficient,
     .coefficient = 2},
    {.name = "cA",
     .alias = "c_a",
     .field = "c_a",
     .role = ArrayRole::kCoefficient,
     .coefficient = 3},
    {.name = "cB",
     .alias = "c_b",
     .field = "c_b",
     .role = ArrayRole::kCoefficient,
     .coefficient = 4},
    {.name = "cC",
     .alias = "c_c",
     .field = "c_c",
     .role = ArrayRole::kCoefficient,
     .coefficient = 1},
    {.name = "f", .field = "f", .role = ArrayRole::kRhs, .max_rank = 3},
    {.name = "y0", .field = "y0", .role = ArrayRole::kInitialGuess, .max_rank = 3},
};
constexpr int kBlockCoefficients[] = {0, 4, 1, 2, 3};

template <typename T>
absl::StatusOr<SolveInfo> BlockSolve(Backend& be, const SystemSpec& s, const T* rhs,
                                     const OneShotArrays& e, T* x, SystemStatus* status,
                                     const SolveControl& control) {
  return be.Solve(BlockOf(s, rhs, e), BlockMethod(s.method), s.block_options,
                  BlockOutput<T>{x, status}, control);
}

// ---- dense ------------------------------------------------------------------------------------

// Shapes: b [batch, n] or [n]; a [batch, n, n] or [n, n] (also one matrix for b's batch of
// right-hand sides). "A" is accepted for a.
constexpr ArrayDescriptor kDenseArrays[] = {
    {.name = "a",
     .alias = "A",
     .field = "a",
     .role = ArrayRole::kCoefficient,
     .coefficient = 0,
     .square = true,
     .min_rank = 2,
     .max_rank = 3},
    {.name = "b", .field = "b", .role = ArrayRole::kRhs},
};
constexpr int kDenseCoefficients[] = {0};

template <typename T>
int64_t FirstNonSymmetricOf(const SystemSpec& s) {
  return FirstNonSymmetric(DenseOf<T>(s, nullptr));
}
absl::Status DenseStructure(const SystemSpec& s, const OneShotArrays&) {
  if (DenseMethod(s.method) != DenseMethod::kHouseholderPcr) return absl::OkStatus();
  const int64_t bad = s.precision == Precision::kFloat64 ? FirstNonSymmetricOf<double>(s)
                                                         : FirstNonSymmetricOf<float>(s);
  if (bad >= 0)
    return Invalid("a", absl::StrCat("matrix ", bad,
                                     " is not symmetric; householder-pcr needs symmetric A "
                                     "(use gauss-jordan)"));
  return absl::OkStatus();
}

// A persistent householder-pcr system's new A must be symmetric too: the factorization a
// replaced `a` is rebuilt from assumes it, and a non-symmetric one would be solved wrong.
absl::Status DenseUpdate(const SystemSpec& s, int coefficient, const void* values) {
  if (coefficient != 0) return absl::OkStatus();
  SystemSpec updated = s;
  updated.coefficients[0] = values;
  return DenseStructure(updated, {});
}

template <typename T>
absl::StatusOr<SolveInfo> DenseSolve(Backend& be, const SystemSpec& s, const T* rhs,
                                     const OneShotArrays&, T* x, SystemStatus* status,
                                     const SolveControl& control) {
  return be.Solve(DenseOf(s, rhs), DenseMethod(s.method), DenseOutput<T>{x, status}, control);
}
template <typename T>
double DenseResidual(const SystemSpec& s, const T* rhs, const OneShotArrays&, const T* x,
                     const SystemStatus* status) {
  return DenseBackwardError(DenseOf(s, rhs), x, status);
}

// ---- the table --------------------------------------------------------------------------------

const FamilyDescriptor kFamilies[] = {
    {.family = Family::kTridiagonal,
     .name = "tridiagonal",
     .arrays = kTridiagonalArrays,
     .coefficient_slots = kTridiagonalCoefficients,
     .rhs_slot = 4,
     .replicates = true,
     .parse_method = ParseAs<TridiagonalMethod, ParseTridiagonalMethod>,
     .method_name = NameOf<TridiagonalMethod>,
     .check_structure = TridiagonalStructure,
     .check_update = NoUpdateCheck,
     .f64 = {TridiagonalSolve<double>, TridiagonalResidual<double>},
     .f32 = {TridiagonalSolve<float>, TridiagonalResidual<float>}},
    {.family = Family::kTree,
     .name = "tree",
     .arrays = kTreeArrays,
     .coefficient_slots = kTreeCoefficients,
     .rhs_slot = 4,
     .replicates = true,
     .parse_method = ParseAs<TreeMethod, ParseTreeMethod>,
     .method_name = NameOf<TreeMethod>,
     .check_structure = TreeStructure,
     .check_update = TreeUpdate,
     .f64 = {TreeSolve<double>, TreeResidual<double>},
     .f32 = {TreeSolve<float>, TreeResidual<float>}},
    {.family = Family::kBlockTridiagonal,
     .name = "block-tridiagonal",
     .arrays = kBlockArrays,
     .coefficient_slots = kBlockCoefficients,
     .rhs_slot = 5,
     .iterative = true,
     .parse_method = ParseAs<BlockMethod, ParseBlockMethod>,
     .method_name = NameOf<BlockMethod>,
     .check_structure = NothingToCheck,
     .check_update = NoUpdateCheck,
     .f64 = {BlockSolve<double>, nullptr},
     .f32 = {BlockSolve<float>, nullptr}},
    {.family = Family::kDense,
     .name = "dense",
     .arrays = kDenseArrays,
     .coefficient_slots = kDenseCoefficients,
     .rhs_slot = 1,
     .parse_method = ParseAs<DenseMethod, ParseDenseMethod>,
     .method_name = NameOf<DenseMethod>,
     .check_structure = DenseStructure,
     .check_update = DenseUpdate,
     .f64 = {DenseSolve<double>, DenseResidual<double>},
     .f32 = {DenseSolve<float>, DenseResidual<float>}},
};

constexpr Family kAllFamilies[] = {Family::kTridiagonal, Family::kTree, Family::kBlockTridiagonal,
                                   Family::kDense};

}  // namespace

absl::Status CheckLengths(const int32_t* lengths, int64_t batch, int64_t total,
                          absl::string_view arrays, absl::string_view need) {
  int64_t sum = 0;
  for (int64_t q = 0; q < batch; ++q) {
    if (lengths[q] < 1)
      return Invalid("lengths", absl::StrCat("lengths[", q, "] is ", lengths[q], "; ", need));
    sum += lengths[q];
  }
  if (sum != total)
    return Invalid("lengths", absl::StrCat("the ", batch, " lengths sum to ", sum, ", but ",
                                           arrays, " hold ", total,
                                           " values (their sum must be the arrays' length)"));
  return absl::OkStatus();
}

const FamilyDescriptor& Describe(Family f) { return kFamilies[size_t(f)]; }

absl::Span<const Family> Families() { return kAllFamilies; }

int FamilyDescriptor::Find(absl::string_view n) const {
  for (size_t i = 0; i < arrays.size(); ++i)
    if (arrays[i].name == n || (!arrays[i].alias.empty() && arrays[i].alias == n)) return int(i);
  return -1;
}

// ---- system.h's names, from the table ---------------------------------------------------------

absl::string_view FamilyName(Family f) {
  if (size_t(f) >= std::size(kFamilies)) return "unknown";
  return Describe(f).name;
}

absl::Span<const absl::string_view> CoefficientNames(Family f) {
  static const auto* names = [] {
    auto* all = new std::vector<std::vector<absl::string_view>>;
    for (Family g : Families()) {
      all->emplace_back();
      for (int slot : Describe(g).coefficient_slots)
        all->back().push_back(Describe(g).arrays[size_t(slot)].name);
    }
    return all;
  }();
  if (size_t(f) >= names->size()) return {};
  return (*names)[size_t(f)];
}

int CoefficientIndex(Family f, absl::string_view name) {
  const FamilyDescriptor& d = Describe(f);
  const int slot = d.Find(name);
  return slot < 0 ? -1 : d.arrays[size_t(slot)].coefficient;
}

absl::string_view RhsName(Family f) {
  return Describe(f).arrays[size_t(Describe(f).rhs_slot)].name;
}

absl::string_view SpecMethodName(const SystemSpec& s) {
  return Describe(s.family).method_name(s.method);
}

}  // namespace trisolve
