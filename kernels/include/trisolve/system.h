// A system of any family described without its right-hand side, and the form a backend keeps
// between solves (persistent systems; one matrix with many right-hand sides).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/dense.h"
#include "trisolve/tree.h"
#include "trisolve/tridiagonal.h"
#include "trisolve/types.h"

namespace trisolve {

enum class Family : uint8_t { kTridiagonal, kTree, kBlockTridiagonal, kDense };
absl::string_view FamilyName(Family f);

// The coefficient arrays of each family, in the order SystemSpec holds them:
//   tridiagonal a b c; tree lower upper diag parent; block-tridiagonal aC cC bC cA cB; dense a.
constexpr int kMaxCoefficients = 5;
absl::Span<const absl::string_view> CoefficientNames(Family f);
// The index of a coefficient array by its name (the block family's proto spellings a_c ... and
// dense "A" accepted); -1 when the family has no such coefficient.
int CoefficientIndex(Family f, absl::string_view name);
// The right-hand side's name: d, rhs, f, b.
absl::string_view RhsName(Family f);

struct SystemSpec {
  Family family = Family::kTridiagonal;
  Precision precision = Precision::kFloat64;
  Layout layout = Layout::kFlat;  // tridiagonal and tree; the others are flat
  int64_t batch = 1;              // systems (block-tridiagonal: 1)
  int64_t n = 0;                  // unknowns per system (block-tridiagonal: N * M)
  int64_t block_N = 0, block_M = 0;
  bool parent_per_system = false;  // tree: one parent array per system
  uint8_t method = 0;              // the family's method enum (0: auto)
  BlockOptions block_options;
  std::array<const void*, kMaxCoefficients> coefficients{};
  // Systems of different sizes (flat tridiagonal batches and tree cells): `batch` lengths
  // (int32, host), n their total, every coefficient [n] (a tree cell's parent values counted
  // from its own root). offsets (batch + 1, host) and longest (the largest length) where the
  // holder computed them once (a prepared system does); null: computed from lengths.
  const int32_t* lengths = nullptr;
  const int64_t* offsets = nullptr;
  int64_t longest = 0;

  bool variable() const { return lengths != nullptr; }

  int num_coefficients() const { return int(CoefficientNames(family).size()); }
  int64_t elem_bytes() const { return precision == Precision::kFloat64 ? 8 : 4; }
  // Values of coefficient i (int32 for the tree's parent) and its bytes.
  int64_t coefficient_values(int i) const;
  int64_t coefficient_bytes(int i) const;
  int64_t rhs_values() const { return variable() ? n : batch * n; }
  int64_t coefficient_total_bytes() const;
};

// The family's problem for a spec and a right-hand side (the spec's coefficients as they are:
// host or device pointers).
template <typename T>
TridiagonalProblem<T> TridiagonalOf(const SystemSpec& s, const T* rhs) {
  return {s.batch, s.n, s.layout, static_cast<const T*>(s.coefficients[0]),
          static_cast<const T*>(s.coefficients[1]), static_cast<const T*>(s.coefficients[2]), rhs};
}
template <typename T>
TreeProblem<T> TreeOf(const SystemSpec& s, const T* rhs) {
  TreeProblem<T> p;
  p.batch = s.batch;
  p.n = s.n;
  p.layout = s.layout;
  p.parent = static_cast<const int32_t*>(s.coefficients[3]);
  p.parent_per_system = s.parent_per_system;
  p.lower = static_cast<const T*>(s.coefficients[0]);
  p.upper = static_cast<const T*>(s.coefficients[1]);
  p.diag = static_cast<const T*>(s.coefficients[2]);
  p.rhs = rhs;
  return p;
}
template <typename T>
BlockTridiagonalProblem<T> BlockOf(const SystemSpec& s, const T* f) {
  auto c = [&](int i) { return static_cast<const T*>(s.coefficients[size_t(i)]); };
  return {s.block_N, s.block_M, c(0), c(1), c(2), c(3), c(4), f, nullptr};
}
template <typename T>
DenseProblem<T> DenseOf(const SystemSpec& s, const T* b) {
  return {s.batch, s.n, static_cast<const T*>(s.coefficients[0]), b};
}

// k right-hand sides for a system. For a system of one (batch == 1) they form a batch of k
// systems sharing its matrix, in `layout`: [k, n] flat or [n, k] interleaved. For a batch, they
// are k blocks one after the other, each in the system's own layout.
// A range of a batch's systems (systems > 0): systems [first_system, first_system + systems)
// alone are solved, each block then that range's right-hand sides (and x, and the statuses);
// for flat tridiagonal and tree batches, whose range is pointer offsets (RangeOf). A client
// pipelines a batch through it: one range solved while the next one's right-hand sides arrive.
template <typename T>
struct RhsBlock {
  const T* rhs = nullptr;
  int64_t k = 1;
  Layout layout = Layout::kFlat;
  int64_t first_system = 0;
  int64_t systems = 0;  // 0: the whole batch
};

// Whether a range of systems can be solved for `s` (OK), or why not (INVALID_ARGUMENT naming
// first_system or systems): flat tridiagonal and tree batches of one size, a range inside the
// batch.
absl::Status CheckSystemRange(const SystemSpec& s, int64_t first_system, int64_t systems);
// Systems [first, first + count) of a flat tridiagonal or tree batch as a batch of their own:
// the coefficients' pointers moved to the range (a tree's shared parent array stays), batch
// count. Checked by CheckSystemRange first.
SystemSpec RangeOf(const SystemSpec& s, int64_t first, int64_t count);
// The spec a block of `rhs` is solved against: RangeOf for a range, `s` otherwise.
template <typename T>
SystemSpec BlockSpec(const SystemSpec& s, const RhsBlock<T>& rhs) {
  return rhs.systems > 0 ? RangeOf(s, rhs.first_system, rhs.systems) : s;
}

class Backend;

// A system kept between solves. The base keeps a host copy of the coefficients (the residual and
// the host fall-backs read it); a backend's subclass keeps what it prepared from them (device
// copies, factors). Solves and updates of one system must not run at once: the caller orders
// them (the server holds one lock a system).
class PreparedSystem {
 public:
  explicit PreparedSystem(const SystemSpec& spec);
  virtual ~PreparedSystem();
  PreparedSystem(const PreparedSystem&) = delete;
  PreparedSystem& operator=(const PreparedSystem&) = delete;

  // Its coefficients point into the host copy.
  const SystemSpec& spec() const { return spec_; }
  // Bytes held: the host copy plus what the backend prepared.
  virtual int64_t bytes() const;
  // What the backend prepared and keeps, for the user ("coefficients on the device", ...).
  virtual std::string prepared() const { return "coefficients on the host"; }
  // The backend whose device holds what was prepared, which alone can solve it (nullptr: the
  // host copy only, which any backend can solve). The multi-device backend routes by it.
  virtual const Backend* holder() const { return nullptr; }

  // Replaces coefficient i (spec().coefficient_values(i) values) in the host copy and drops
  // whatever was derived from the old values.
  virtual absl::Status Update(int i, const void* values);

  // Runs once when the system is destroyed, after its subclass's members are gone (the
  // multi-device backend's account of what each device holds). One hook; a second replaces it.
  void OnRelease(std::function<void()> hook) { on_release_ = std::move(hook); }

  // The coefficients replicated for k right-hand sides of a system of one in `layout`
  // (tridiagonal and tree): spec() with batch k, kept until the next update or another k.
  const SystemSpec& Replicated(int64_t k, Layout layout);

 protected:
  SystemSpec spec_;
  std::vector<std::vector<std::byte>> host_;
  // A variable-size batch's lengths and their offsets (spec_.lengths, spec_.offsets).
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_;

 private:
  SystemSpec replicated_;
  int64_t replicated_k_ = 0;
  Layout replicated_layout_ = Layout::kFlat;
  std::vector<std::vector<std::byte>> replicated_host_;
  std::function<void()> on_release_;
};

// The family's method name for spec.method ("auto", "thomas", ...).
absl::string_view SpecMethodName(const SystemSpec& spec);

// Solves k right-hand sides of a prepared system through the backend's one-shot Solve calls:
// one call for a system of one in the tridiagonal and tree families (coefficients replicated,
// kept in the system), one call a right-hand side otherwise. x has the right-hand sides' shape;
// status has k * batch entries. What every backend does unless it keeps something better.
template <typename T>
absl::StatusOr<SolveInfo> SolveThroughBackend(Backend& backend, PreparedSystem& system,
                                              RhsBlock<T> rhs, T* x, SystemStatus* status,
                                              const SolveControl& control);

// Adds the report of one more right-hand side block to `total` (the first block's report is
// taken whole): times add up, the iterations and the residual are the worst.
void AccumulateSolveInfo(const SolveInfo& block, bool first, SolveInfo* total);

// The normwise backward error of k answers, from the host copy of the coefficients (direct
// families; NaN for the block family, whose solvers report their own residual).
template <typename T>
double PreparedBackwardError(PreparedSystem& system, RhsBlock<T> rhs, const T* x,
                             const SystemStatus* status);

}  // namespace trisolve
