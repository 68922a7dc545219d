// Protobuf in, plain jobs out: every field of a request checked and named in its error.
#include "translate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trisolve::server {
namespace {

using v1::Array;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::StatusOr<Precision> ParseDType(v1::DType d) {
  switch (d) {
    case v1::FLOAT64: return Precision::kFloat64;
    case v1::FLOAT32: return Precision::kFloat32;
    default:
      return Invalid("dtype", absl::StrCat("must be FLOAT64 or FLOAT32, got ",
                                           v1::DType_Name(d).empty() ? std::to_string(d)
                                                                     : v1::DType_Name(d)));
  }
}

absl::StatusOr<Layout> ParseLayout(v1::Layout l) {
  switch (l) {
    case v1::FLAT: return Layout::kFlat;
    case v1::INTERLEAVED: return Layout::kInterleaved;
    default: return Invalid("layout", absl::StrCat("unknown layout ", int(l)));
  }
}

// The slot of the family's array `name` (a name the descriptor lists).
JobArray& Slot(Job& job, absl::string_view name) {
  return job.arrays[size_t(job.descriptor().Find(name))];
}

// Checks that `name` is present with a positive shape of a rank the descriptor allows (at most
// max_rank where given) whose element count fits; records it in the job.
absl::StatusOr<JobArray*> DeclareArray(Job& job, absl::string_view name, bool present,
                                       const Array& a, absl::string_view expect,
                                       int max_rank = 0) {
  const ArrayDescriptor& d = job.descriptor().arrays[size_t(job.descriptor().Find(name))];
  const int min_rank = d.min_rank;
  if (max_rank == 0) max_rank = d.max_rank;
  const int elem_bytes = d.int32 || job.precision == Precision::kFloat32 ? 4 : 8;
  if (!present || a.shape_size() == 0)
    return Invalid(name, absl::StrCat("missing (expected shape ", expect, ")"));
  std::vector<int64_t> shape(a.shape().begin(), a.shape().end());
  if (int(shape.size()) < min_rank || int(shape.size()) > max_rank)
    return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr(shape), ", expected ", expect));
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0)
      return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr(shape), ": dimension ", i,
                                        " is ", shape[i], ", every dimension must be >= 1"));
    if (__builtin_mul_overflow(elements, shape[i], &elements) ||
        elements > std::numeric_limits<int64_t>::max() / 8)
      return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr(shape),
                                        ": the element count overflows"));
  }
  JobArray& ja = Slot(job, name);
  ja.declared = true;
  ja.shape = std::move(shape);
  ja.elements = elements;
  ja.elem_bytes = elem_bytes;
  ja.expected_bytes = elements * elem_bytes;
  return &ja;
}

absl::Status SameShape(const Job& job, absl::string_view name, absl::string_view ref) {
  const JobArray& a = *job.Find(name);
  const JobArray& r = *job.Find(ref);
  if (a.shape != r.shape)
    return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr(a.shape), ", expected ",
                                      ShapeStr(r.shape), " (the shape of ", ref, ")"));
  return absl::OkStatus();
}

RegionRef Plain(const v1::RegionRef& ref) { return {ref.region(), ref.offset(), ref.bytes()}; }

absl::StatusOr<std::byte*> ResolveRef(absl::string_view field, const v1::RegionRef& ref,
                                      int64_t expected_bytes, int elem_bytes,
                                      RegionResolver* regions, RegionUse use = RegionUse::kHost,
                                      bool* on_device = nullptr) {
  return ResolveRegionRef(field, Plain(ref), expected_bytes, elem_bytes, regions, use,
                          on_device);
}

// Whether the server reads array `slot` of `job` on the host whatever the call: the solvers'
// indices (parent, lengths) and householder-pcr's matrix, whose symmetry is checked first.
bool ReadOnHost(const Job& job, size_t slot) {
  const ArrayDescriptor& a = job.descriptor().arrays[slot];
  return !job.device_regions_ok || a.int32 ||
         (job.family == Family::kDense &&
          DenseMethod(job.method) == DenseMethod::kHouseholderPcr && a.name == "a");
}

// Borrows the request's bytes for `name`, checking their length (or resolves its region, for
// `use`).
absl::Status Borrow(absl::string_view name, JobArray& ja, const Array& a,
                    RegionResolver* regions, RegionUse use) {
  if (a.has_region()) {
    if (!a.data().empty())
      return Invalid(name, "has both data and a region: give one");
    auto p = ResolveRef(absl::StrCat(name, ".region"), a.region(), ja.expected_bytes,
                        ja.elem_bytes, regions, use, &ja.on_device);
    if (!p.ok()) return p.status();
    ja.data = *p;
    ja.received = ja.expected_bytes;
    return absl::OkStatus();
  }
  if (int64_t(a.data().size()) != ja.expected_bytes)
    return absl::InvalidArgumentError(absl::StrCat(name, " has ", a.data().size(), " bytes of data, expected ",
                                      ja.expected_bytes, " (shape ", ShapeStr(ja.shape), ", ",
                                      ja.elem_bytes == 8 ? "8" : "4", " bytes a value)"));
  const auto* p = reinterpret_cast<const std::byte*>(a.data().data());
  if (reinterpret_cast<uintptr_t>(p) % ja.elem_bytes != 0) {
    ja.aligned_copy.assign(a.data());
    p = reinterpret_cast<const std::byte*>(ja.aligned_copy.data());
  }
  ja.data = p;
  ja.received = ja.expected_bytes;
  return absl::OkStatus();
}

// An array's memory, taken when its first chunk arrives; RESOURCE_EXHAUSTED where the host
// has none to give.
absl::Status Allocate(absl::string_view name, JobArray& ja) {
  ja.owned.reset(new (std::nothrow) std::byte[static_cast<size_t>(ja.expected_bytes)]);
  if (!ja.owned)
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", ja.expected_bytes,
                                                     " bytes for ", name));
  ja.data = ja.owned.get();
  ja.received = 0;
  return absl::OkStatus();
}

// ---- per family: declare shapes (header), then borrow data (unary) --------------------

// The right-hand side `name`: the request's array, or, for a CreateSystem that leaves it out,
// an absent array with the shape of `like` (a coefficient shaped as the right-hand side).
absl::StatusOr<JobArray*> DeclareRhs(Job& job, absl::string_view name, bool present,
                                     const Array& a, const Array& like, absl::string_view expect) {
  if ((!present || a.shape_size() == 0) && job.rhs_optional) {
    auto ja = DeclareArray(job, name, like.shape_size() > 0, like, expect);
    if (ja.ok()) (*ja)->absent = true;
    return ja;
  }
  return DeclareArray(job, name, present, a, expect);
}

// batch and n from a [batch, n] / [n, batch] / [n] right-hand side.
void BatchAndN(Job& job, const std::vector<int64_t>& rs) {
  if (rs.size() == 1) {
    job.batch = 1;
    job.n = rs[0];
  } else if (job.layout == Layout::kFlat) {
    job.batch = rs[0];
    job.n = rs[1];
  } else {
    job.n = rs[0];
    job.batch = rs[1];
  }
}

// Coefficients of the same shape as the right-hand side, or (one matrix, many right-hand
// sides) every one of them 1-D with the system's n values.
absl::Status DeclareCoefficients(
    Job& job, absl::string_view rhs,
    std::initializer_list<std::tuple<const char*, bool, const Array*>> coefs) {
  const auto rs = job.Find(rhs)->shape;
  bool all_1d = rs.size() == 2;
  for (auto [name, has, arr] : coefs) all_1d &= has && arr->shape_size() == 1;
  job.shared_matrix = all_1d && job.batch > 1;
  const std::string expect =
      job.shared_matrix ? absl::StrCat("[", job.n, "] (one matrix for ", job.batch,
                                       " right-hand sides)")
                        : ShapeStr(rs);
  for (auto [name, has, arr] : coefs) {
    auto st = DeclareArray(job, name, has, *arr, expect);
    if (!st.ok()) return st.status();
    if (job.shared_matrix) {
      if ((*st)->shape != std::vector<int64_t>{job.n})
        return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr((*st)->shape),
                                                       ", expected ", expect));
    } else if (auto s2 = SameShape(job, name, rhs); !s2.ok()) {
      return s2;
    }
  }
  return absl::OkStatus();
}

// The unified layout's abc: d's shape + [3] (d declared).
absl::Status DeclareAbc(Job& job, const v1::TridiagonalRequest& r) {
  std::vector<int64_t> want = job.Find("d")->shape;
  want.push_back(3);
  auto abc = DeclareArray(job, "abc", true, r.abc(),
                          absl::StrCat(ShapeStr(want), " (d's shape and 3: a, b, c of a row)"));
  if (!abc.ok()) return abc.status();
  if ((*abc)->shape != want)
    return absl::InvalidArgumentError(absl::StrCat(
        "abc has shape ", ShapeStr((*abc)->shape), ", expected ", ShapeStr(want),
        " (d's shape and 3: a, b, c of a row)"));
  return absl::OkStatus();
}

// A family's words for its systems of different sizes, in the errors.
struct Concatenated {
  const char* count;   // "systems", "cells"
  const char* part;    // "row", "node"
  const char* layout;  // why layout FLAT
};
constexpr Concatenated kVariableSystems{
    "systems", "row",
    "a variable-size batch takes layout FLAT (each array the systems' rows one system after "
    "the other)"};
constexpr Concatenated kTreeCells{
    "cells", "node",
    "cells of different sizes take layout FLAT (each array the cells' nodes one cell after the "
    "other)"};

// Systems (or tree cells) of different sizes, in a one-shot call or CreateSystem: the right-hand
// side `rhs` [total] (a CreateSystem may leave it out: then `like`, a coefficient, gives its
// shape), lengths [count] (int32), and each of `coefficients` rhs's shape. The lengths' values
// are checked once they are there (CheckStructure).
absl::Status DeclareConcatenated(
    Job& job, const Concatenated& words, const Array& lengths, absl::string_view rhs,
    bool has_rhs, const Array& rhs_array, const Array& like,
    std::initializer_list<std::tuple<const char*, bool, const Array*>> coefficients) {
  if (job.layout != Layout::kFlat) return Invalid("lengths", words.layout);
  auto l = DeclareArray(job, "lengths", true, lengths, absl::StrCat("[", words.count, "]"));
  if (!l.ok()) return l.status();
  const std::string expect =
      absl::StrCat("[total] (the ", words.count, "' ", words.part, "s concatenated, as lengths says)");
  const bool absent = (!has_rhs || rhs_array.shape_size() == 0) && job.rhs_optional;
  auto r = absent ? DeclareArray(job, rhs, like.shape_size() > 0, like, expect, 1)
                  : DeclareArray(job, rhs, has_rhs, rhs_array, expect, 1);
  if (!r.ok()) return r.status();
  (*r)->absent = absent;
  job.variable = true;
  job.batch = (*l)->shape[0];
  job.n = (*r)->shape[0];
  if (job.batch > job.n)
    return Invalid("lengths", absl::StrCat("has ", job.batch, " ", words.count, " of at least one ",
                                           words.part, " each, but ", rhs, " holds ", job.n,
                                           " values"));
  for (auto [name, has, arr] : coefficients) {
    auto st = DeclareArray(job, name, has, *arr, ShapeStr((*r)->shape));
    if (!st.ok()) return st.status();
    if (auto s2 = SameShape(job, name, rhs); !s2.ok()) return s2;
  }
  return absl::OkStatus();
}

// Systems of different sizes: a, b, c, d concatenated ([total]), lengths [systems] (int32).
absl::Status DeclareVariable(Job& job, const v1::TridiagonalRequest& r) {
  if (job.unified) {
    if (auto st = DeclareConcatenated(job, kVariableSystems, r.lengths(), "d", r.has_d(), r.d(),
                                      r.b(), {});
        !st.ok())
      return st;
    return DeclareAbc(job, r);
  }
  return DeclareConcatenated(job, kVariableSystems, r.lengths(), "d", r.has_d(), r.d(), r.b(),
                             {{"a", r.has_a(), &r.a()}, {"b", r.has_b(), &r.b()},
                              {"c", r.has_c(), &r.c()}});
}

// What every request states first: its family, dtype, layout (where it has one), method and
// skip_residual (where it has one).
template <typename Req>
absl::Status DeclareCommon(Job& job, Family family, const Req& r) {
  job.family = family;
  auto prec = ParseDType(r.dtype());
  if (!prec.ok()) return prec.status();
  job.precision = *prec;
  if constexpr (requires { r.layout(); }) {
    auto layout = ParseLayout(r.layout());
    if (!layout.ok()) return layout.status();
    job.layout = *layout;
  }
  auto m = job.descriptor().parse_method(r.method());
  if (!m.ok()) return m.status();
  job.method = *m;
  if constexpr (requires { r.skip_residual(); }) job.skip_residual = r.skip_residual();
  return absl::OkStatus();
}

absl::Status Declare(Job& job, const v1::TridiagonalRequest& r) {
  if (auto st = DeclareCommon(job, Family::kTridiagonal, r); !st.ok()) return st;
  const char* expect = job.layout == Layout::kFlat ? "[batch, n] or [n]" : "[n, batch] or [n]";
  if (r.has_abc() || r.abc().shape_size() > 0) {
    if (job.rhs_optional)
      return Invalid("abc", "CreateSystem takes a, b and c as arrays of their own; the unified "
                            "layout is solved by Solve, SolveStream or SolveWithProgress");
    if (r.has_a() || r.has_b() || r.has_c())
      return Invalid("abc", "holds a, b and c: leave the arrays a, b and c unset");
    if (job.layout != Layout::kFlat)
      return Invalid("abc", "the unified layout takes layout FLAT (d [batch, n], abc "
                            "[batch, n, 3])");
    job.unified = true;
  }
  if (r.has_lengths() || r.lengths().shape_size() > 0) return DeclareVariable(job, r);
  auto d = DeclareRhs(job, "d", r.has_d(), r.d(), r.b(), expect);
  if (!d.ok()) return d.status();
  BatchAndN(job, (*d)->shape);
  if (job.unified) return DeclareAbc(job, r);
  return DeclareCoefficients(
      job, "d", {{"a", r.has_a(), &r.a()}, {"b", r.has_b(), &r.b()}, {"c", r.has_c(), &r.c()}});
}

// Cells of different sizes: parent, lower, upper, diag, rhs concatenated ([total]), lengths
// [cells] (int32). The parents' values are checked once they are there (CheckStructure).
absl::Status DeclareCells(Job& job, const v1::TreeRequest& r) {
  job.parent_per_system = false;
  if (auto st = DeclareConcatenated(
          job, kTreeCells, r.lengths(), "rhs", r.has_rhs(), r.rhs(), r.diag(),
          {{"parent", r.has_parent(), &r.parent()}, {"lower", r.has_lower(), &r.lower()},
           {"upper", r.has_upper(), &r.upper()}, {"diag", r.has_diag(), &r.diag()}});
      !st.ok())
    return st;
  if (job.n > std::numeric_limits<int32_t>::max())
    return Invalid("rhs", absl::StrCat("has ", job.n, " nodes in all; at most 2^31 - 1"));
  return absl::OkStatus();
}

absl::Status Declare(Job& job, const v1::TreeRequest& r) {
  if (auto st = DeclareCommon(job, Family::kTree, r); !st.ok()) return st;
  if (r.has_lengths() || r.lengths().shape_size() > 0) return DeclareCells(job, r);
  const char* expect = job.layout == Layout::kFlat ? "[batch, n] or [n]" : "[n, batch] or [n]";
  auto rhs = DeclareRhs(job, "rhs", r.has_rhs(), r.rhs(), r.diag(), expect);
  if (!rhs.ok()) return rhs.status();
  BatchAndN(job, (*rhs)->shape);
  if (job.n > std::numeric_limits<int32_t>::max())
    return absl::InvalidArgumentError(absl::StrCat("rhs has ", job.n, " nodes a tree; at most 2^31 - 1"));
  if (auto st = DeclareCoefficients(job, "rhs",
                                    {{"lower", r.has_lower(), &r.lower()},
                                     {"upper", r.has_upper(), &r.upper()},
                                     {"diag", r.has_diag(), &r.diag()}});
      !st.ok())
    return st;
  const std::string pexpect =
      job.shared_matrix ? absl::StrCat("[", job.n, "]")
                        : absl::StrCat("[", job.n, "] or [", job.batch, ", ", job.n, "]");
  auto p = DeclareArray(job, "parent", r.has_parent(), r.parent(), pexpect);
  if (!p.ok()) return p.status();
  const auto& ps = (*p)->shape;
  if (ps.size() == 1 && ps[0] == job.n) {
    job.parent_per_system = false;
  } else if (!job.shared_matrix && ps.size() == 2 && ps[0] == job.batch && ps[1] == job.n) {
    job.parent_per_system = job.batch > 1;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("parent has shape ", ShapeStr(ps), ", expected ", pexpect,
                                          job.shared_matrix ? " (one tree for one matrix)"
                                                            : " (one tree for the batch, or one per system)"));
  }
  return absl::OkStatus();
}

absl::Status Declare(Job& job, const v1::BlockTridiagonalRequest& r) {
  if (auto st = DeclareCommon(job, Family::kBlockTridiagonal, r); !st.ok()) return st;
  auto f = DeclareRhs(job, "f", r.has_f(), r.f(), r.c_c(),
                      "[N, M], [M], or [k, N, M] for k right-hand sides");
  if (!f.ok()) return f.status();
  const auto fs = (*f)->shape;
  // f of rank 3: k right-hand sides for the one system the [N, M] coefficients describe.
  job.shared_matrix = fs.size() == 3;
  job.batch = fs.size() == 3 ? fs[0] : 1;
  job.block_N = fs.size() == 1 ? 1 : fs[fs.size() - 2];
  job.block_M = fs.back();
  job.n = job.block_N * job.block_M;
  const std::vector<int64_t> cs = fs.size() == 3 ? std::vector<int64_t>{fs[1], fs[2]} : fs;
  const std::string expect = ShapeStr(cs);
  for (auto [name, has, arr] :
       {std::tuple{"aC", r.has_a_c(), &r.a_c()}, {"cC", r.has_c_c(), &r.c_c()},
        {"bC", r.has_b_c(), &r.b_c()}, {"cA", r.has_c_a(), &r.c_a()},
        {"cB", r.has_c_b(), &r.c_b()}}) {
    auto st = DeclareArray(job, name, has, *arr, expect);
    if (!st.ok()) return st.status();
    if ((*st)->shape != cs)
      return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr((*st)->shape),
                                                     ", expected ", expect, " (the shape of f",
                                                     job.shared_matrix ? "'s systems)" : ")"));
  }
  if (r.has_y0() && !job.rhs_optional) {
    auto st = DeclareArray(job, "y0", true, r.y0(), ShapeStr(fs));
    if (!st.ok()) return st.status();
    if (auto s2 = SameShape(job, "y0", "f"); !s2.ok()) return s2;
    if (job.shared_matrix)
      return Invalid("y0", "an initial guess is taken for one right-hand side only");
  }
  BlockOptions& o = job.block_options;
  o.max_iterations = r.has_max_iterations() ? r.max_iterations() : 1000;
  if (o.max_iterations < 1 || o.max_iterations > 100'000'000)
    return absl::InvalidArgumentError(
        absl::StrCat("max_iterations is ", o.max_iterations, ", expected 1 .. 100000000"));
  o.tol = r.has_tol() ? r.tol() : (job.precision == Precision::kFloat64 ? 1e-10 : 1e-5);
  if (!std::isfinite(o.tol) || o.tol < 0 || o.tol >= 1)
    return absl::InvalidArgumentError(absl::StrCat("tol is ", o.tol, ", expected 0 <= tol < 1 (0: run exactly "
                                       "max_iterations sweeps)"));
  o.scale_rows = r.scale_rows();
  if (r.residual_history()) {
    if (job.shared_matrix)
      return Invalid("residual_history", "kept for one right-hand side only (f of shape [N, M])");
    job.history_limit = kResidualHistoryPoints;
  }
  return absl::OkStatus();
}

absl::Status Declare(Job& job, const v1::DenseRequest& r) {
  if (auto st = DeclareCommon(job, Family::kDense, r); !st.ok()) return st;
  if ((!r.has_b() || r.b().shape_size() == 0) && job.rhs_optional) {
    // CreateSystem without b: its shape from a ([n, n] -> [n], [batch, n, n] -> [batch, n]).
    auto a = DeclareArray(job, "a", r.has_a(), r.a(), "[n, n] or [batch, n, n]");
    if (!a.ok()) return a.status();
    const auto as = (*a)->shape;
    if (as[as.size() - 2] != as.back())
      return absl::InvalidArgumentError(absl::StrCat("a has shape ", ShapeStr(as), ": the matrices are ",
                                                     as[as.size() - 2], " x ", as.back(), ", not square"));
    JobArray& b = Slot(job, "b");
    b.declared = true;
    b.shape.assign(as.begin(), as.end() - 1);
    b.elements = 1;
    for (int64_t d : b.shape) b.elements *= d;
    b.elem_bytes = job.precision == Precision::kFloat64 ? 8 : 4;
    b.expected_bytes = b.elements * b.elem_bytes;
    b.absent = true;
  }
  const bool b_declared = Slot(job, "b").declared;
  absl::StatusOr<JobArray*> b =
      b_declared ? absl::StatusOr<JobArray*>(&Slot(job, "b"))
                 : DeclareArray(job, "b", r.has_b(), r.b(), "[batch, n] or [n]");
  if (!b.ok()) return b.status();
  const auto bs = (*b)->shape;
  job.batch = bs.size() == 1 ? 1 : bs[0];
  job.n = bs.back();
  const std::string expect = bs.size() == 1 ? absl::StrCat("[", job.n, ", ", job.n, "]")
                                            : absl::StrCat("[", job.batch, ", ", job.n, ", ", job.n,
                                                           "] (or [", job.n, ", ", job.n,
                                                           "]: one matrix, ", job.batch,
                                                           " right-hand sides)");
  absl::StatusOr<JobArray*> a =
      b_declared ? absl::StatusOr<JobArray*>(&Slot(job, "a"))
                 : DeclareArray(job, "a", r.has_a(), r.a(), expect);
  if (!a.ok()) return a.status();
  const auto& as = (*a)->shape;
  const int64_t rows = as[as.size() - 2], cols = as.back();
  if (rows != cols)
    return absl::InvalidArgumentError(absl::StrCat("a has shape ", ShapeStr(as), ": the matrices are ", rows,
                                     " x ", cols, ", not square"));
  const int64_t abatch = as.size() == 3 ? as[0] : 1;
  // b as one column ([n, 1], NumPy's habit) beside an [n, n] matrix: b is what is off.
  if (bs.size() == 2 && bs[1] == 1 && bs[0] > 1 && as.size() == 2 && rows == bs[0])
    return Invalid("b", absl::StrCat("b has shape ", ShapeStr(bs), ", a column: send one right-hand "
                                     "side as [", rows, "], or k of them as [k, ", rows,
                                     "] (one a row)"));
  // One [n, n] matrix with b of shape [k, n]: k right-hand sides.
  job.shared_matrix = as.size() == 2 && bs.size() == 2 && rows == job.n;
  if (rows != job.n || (!job.shared_matrix && (abatch != job.batch || (as.size() == 3) != (bs.size() == 2))))
    return absl::InvalidArgumentError(absl::StrCat("a has shape ", ShapeStr(as), ", expected ", expect,
                                     " to match b ", ShapeStr(bs)));
  if (job.n > 65536)
    return Invalid("b", absl::StrCat("n = ", job.n, " is over 65536, the largest dense order"));
  return absl::OkStatus();
}

// Borrows every declared array's bytes but an absent right-hand side's, in the order of the
// message's fields (which of several bad arrays an error names).
absl::Status BorrowAll(Job& job, const google::protobuf::Message& r, RegionResolver* regions) {
  const google::protobuf::Descriptor* md = r.GetDescriptor();
  const google::protobuf::Reflection* reflection = r.GetReflection();
  const FamilyDescriptor& d = job.descriptor();
  for (int i = 0; i < md->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = md->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE || f->is_repeated() ||
        f->message_type() != Array::descriptor())
      continue;
    int slot = -1;
    for (size_t k = 0; k < d.arrays.size(); ++k)
      if (d.arrays[k].field == f->name()) slot = int(k);
    if (slot < 0) continue;
    JobArray& ja = job.arrays[size_t(slot)];
    if (!ja.declared || ja.absent) continue;
    const auto& a = static_cast<const Array&>(reflection->GetMessage(r, f));
    const RegionUse use = d.arrays[size_t(slot)].int32    ? RegionUse::kStructure
                          : ReadOnHost(job, size_t(slot)) ? RegionUse::kHost
                                                          : RegionUse::kBackend;
    if (auto st = Borrow(d.arrays[size_t(slot)].name, ja, a, regions, use);
        !st.ok())
      return st;
  }
  return absl::OkStatus();
}

// x in the caller's memory must not overlap an input: the solvers read them while writing x.
absl::Status CheckNoOverlap(const Job& job, const std::byte* x, int64_t bytes) {
  const FamilyDescriptor& d = job.descriptor();
  for (size_t i = 0; i < d.arrays.size(); ++i) {
    const JobArray& a = job.arrays[i];
    if (!a.declared || a.absent || a.data == nullptr) continue;
    if (x < a.data + a.expected_bytes && a.data < x + bytes)
      return Invalid("x_region",
                     absl::StrCat("overlaps ", d.arrays[i].name, " (x needs memory of its own)"));
  }
  return absl::OkStatus();
}

template <typename Req>
absl::StatusOr<Job> FromUnary(const Req& r, const JobLimits& l, DeclareOptions o) {
  Job job;
  job.rhs_optional = o.rhs_optional;
  if (auto st = Declare(job, r); !st.ok()) return st;
  if (auto st = CheckLimits(job, l); !st.ok()) return st;
  // Arrays in a client's device memory stay there for the calls whose values the device
  // checks (defer_finite); one matrix for many right-hand sides goes through Prepare's host
  // copy anyway, and so do its arrays.
  job.device_regions_ok = o.defer_finite && !o.rhs_optional && !job.shared_matrix;
  if (auto st = BorrowAll(job, r, o.regions); !st.ok()) return st;
  if (r.has_x_region()) {
    if (o.rhs_optional) return Invalid("x_region", "CreateSystem solves nothing: leave it unset");
    const JobArray& xa = job.rhs();
    // x is written by the backend only (the batcher copies into it: never for device x).
    auto x = ResolveRef("x_region", r.x_region(), xa.expected_bytes, xa.elem_bytes, o.regions,
                        RegionUse::kBackend, &job.x_on_device);
    if (!x.ok()) return x.status();
    if (auto st = CheckNoOverlap(job, *x, xa.expected_bytes); !st.ok()) return st;
    job.x_out = *x;
  }
  // (Not one matrix for many right-hand sides: its coefficients go to the device by another
  // path, Prepare, which checks nothing.) Arrays in device memory: always on the device (x
  // there changes nothing: the inputs are checked wherever they are).
  if (job.inputs_on_device() ||
      (o.defer_finite && !job.shared_matrix && job.total_bytes() >= kDeviceCheckBytes)) {
    job.values_checked = false;
    if (auto st = CheckStructure(job); !st.ok()) return st;
    return job;
  }
  if (auto st = CheckContents(job); !st.ok()) return st;
  return job;
}

}  // namespace

absl::StatusOr<Job> JobFromRequest(const v1::TridiagonalRequest& r, const JobLimits& l,
                                   DeclareOptions o) {
  return FromUnary(r, l, o);
}
absl::StatusOr<Job> JobFromRequest(const v1::TreeRequest& r, const JobLimits& l,
                                   DeclareOptions o) {
  return FromUnary(r, l, o);
}
absl::StatusOr<Job> JobFromRequest(const v1::BlockTridiagonalRequest& r, const JobLimits& l,
                                   DeclareOptions o) {
  return FromUnary(r, l, o);
}
absl::StatusOr<Job> JobFromRequest(const v1::DenseRequest& r, const JobLimits& l,
                                   DeclareOptions o) {
  return FromUnary(r, l, o);
}

// A streamed job carries bytes: no array in a region, no x_region.
static absl::Status NoRegions(const google::protobuf::Message& m) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE || f->is_repeated() ||
        !r->HasField(m, f))
      continue;
    if (f->message_type() == v1::RegionRef::descriptor())
      return Invalid(f->name(), "a streamed job's x comes back in chunks: leave it unset, or "
                                "use the unary call for shared memory");
    if (f->message_type() == v1::Array::descriptor() &&
        static_cast<const v1::Array&>(r->GetMessage(m, f)).has_region())
      return Invalid(absl::StrCat(f->name(), ".region"),
                     "a streamed job carries its arrays in chunks: use the unary call for "
                     "arrays in shared memory");
  }
  return absl::OkStatus();
}

absl::StatusOr<Job> JobFromStreamHeader(const v1::StreamRequest& h, const JobLimits& l) {
  Job job;
  absl::Status st;
  switch (h.part_case()) {
    case v1::StreamRequest::kTridiagonal:
      st = NoRegions(h.tridiagonal());
      if (st.ok()) st = Declare(job, h.tridiagonal());
      break;
    case v1::StreamRequest::kTree:
      st = NoRegions(h.tree());
      if (st.ok()) st = Declare(job, h.tree());
      break;
    case v1::StreamRequest::kBlockTridiagonal:
      st = NoRegions(h.block_tridiagonal());
      if (st.ok()) st = Declare(job, h.block_tridiagonal());
      break;
    case v1::StreamRequest::kDense:
      st = NoRegions(h.dense());
      if (st.ok()) st = Declare(job, h.dense());
      break;
    default:
      return absl::InvalidArgumentError(
          "part: the first message of a stream must be a header (tridiagonal, tree, "
          "block_tridiagonal or dense), not a chunk");
  }
  if (!st.ok()) return st;
  if (auto s2 = CheckLimits(job, l); !s2.ok()) return s2;
  // Nothing is allocated yet: each array when its first chunk arrives (AppendChunk).
  return job;
}

absl::Status AppendChunk(Job& job, const v1::Chunk& chunk) {
  // Chunk names: the request's field names; the thesis' names are accepted too.
  const int slot = job.descriptor().Find(chunk.array());
  if (slot < 0 || !job.arrays[size_t(slot)].declared)
    return Invalid("chunk.array", absl::StrCat("'", Sanitized(chunk.array()), "' is not an array of this ",
                                               FamilyName(job.family), " job"));
  const absl::string_view name = job.descriptor().arrays[size_t(slot)].name;
  JobArray& ja = job.arrays[size_t(slot)];
  if (!ja.owned)
    if (auto st = Allocate(name, ja); !st.ok()) return st;
  if (chunk.offset() != ja.received)
    return absl::InvalidArgumentError(absl::StrCat("chunk.offset is ", chunk.offset(), " for ", name,
                                                ", expected ", ja.received,
                                                " (chunks must arrive in order)"));
  const int64_t len = static_cast<int64_t>(chunk.data().size());
  if (len > ja.expected_bytes - ja.received)
    return Invalid("chunk.data", absl::StrCat(name, " would have ", ja.received + len,
                                              " bytes, more than its shape's ",
                                              ja.expected_bytes));
  std::memcpy(ja.owned.get() + ja.received, chunk.data().data(), static_cast<size_t>(len));
  ja.received += len;
  return absl::OkStatus();
}

absl::Status FinishStreamedJob(Job& job) {
  const FamilyDescriptor& d = job.descriptor();
  for (size_t i = 0; i < d.arrays.size(); ++i) {
    const JobArray& ja = job.arrays[i];
    if (ja.declared && ja.received != ja.expected_bytes)
      return absl::InvalidArgumentError(absl::StrCat(d.arrays[i].name, " has ", ja.received, " bytes of data, expected ",
                                        ja.expected_bytes, " (shape ", ShapeStr(ja.shape), ")"));
  }
  return CheckContents(job);
}

absl::StatusOr<Job> JobFromCreateSystem(const v1::CreateSystemRequest& r, const JobLimits& l,
                                        RegionResolver* regions) {
  const DeclareOptions o{.rhs_optional = true, .regions = regions};
  switch (r.system_case()) {
    case v1::CreateSystemRequest::kTridiagonal: return JobFromRequest(r.tridiagonal(), l, o);
    case v1::CreateSystemRequest::kTree: return JobFromRequest(r.tree(), l, o);
    case v1::CreateSystemRequest::kBlockTridiagonal:
      return JobFromRequest(r.block_tridiagonal(), l, o);
    case v1::CreateSystemRequest::kDense: return JobFromRequest(r.dense(), l, o);
    default: break;
  }
  return Invalid("system", "missing: one of tridiagonal, tree, block_tridiagonal, dense");
}

absl::StatusOr<std::byte*> ResolveXRegion(const v1::RegionRef& ref, int64_t bytes, int elem_bytes,
                                          RegionResolver* regions) {
  return ResolveRef("x_region", ref, bytes, elem_bytes, regions);
}

absl::StatusOr<ArrayArg> ArrayArgFromProto(const v1::Array& a, std::string* scratch,
                                           absl::string_view field) {
  ArrayArg out;
  out.shape.assign(a.shape().begin(), a.shape().end());
  if (a.has_region()) {
    if (!a.data().empty()) return Invalid(field, "has both data and a region: give one");
    out.in_region = true;
    out.region = Plain(a.region());
    return out;
  }
  out.bytes = int64_t(a.data().size());
  // Aligned for any element type (a copy in *scratch when the message's bytes are not).
  if (reinterpret_cast<uintptr_t>(a.data().data()) % 8 == 0) {
    out.data = a.data().data();
  } else {
    scratch->assign(a.data());
    out.data = scratch->data();
  }
  return out;
}

absl::StatusOr<ArrayIn> ArrayFromProto(const v1::Array& a, std::string* scratch,
                                       RegionResolver* regions, absl::string_view field,
                                       int elem_bytes) {
  auto arg = ArrayArgFromProto(a, scratch, field);
  if (!arg.ok()) return arg.status();
  return ResolveArray(*arg, regions, field, elem_bytes);
}

// A message's array as the core takes it; a malformed one carries its error, reported where
// the array is read (after the handle is found and the updates before it applied).
ArrayArg ArgOrError(const v1::Array& a, std::string* scratch, absl::string_view field) {
  auto arg = ArrayArgFromProto(a, scratch, field);
  if (arg.ok()) return *std::move(arg);
  ArrayArg bad;
  bad.error = arg.status();
  return bad;
}

void UpdatesFromProto(const google::protobuf::RepeatedPtrField<v1::NamedArray>& update,
                      StepRequest* step) {
  for (const v1::NamedArray& u : update)
    step->updates.push_back({u.name(), ArgOrError(u.array(), &step->scratch.emplace_back(),
                                                  "update")});
}

void StepFromProto(const v1::SolveSystemRequest& r, StepRequest* step) {
  step->handle = r.handle();
  step->skip_residual = r.skip_residual();
  step->first_system = r.first_system();
  step->systems = r.systems();
  UpdatesFromProto(r.update(), step);
  step->rhs = ArgOrError(r.rhs(), &step->scratch.emplace_back(), "rhs");
  if (r.has_x_region()) {
    step->has_x_region = true;
    step->x_region = Plain(r.x_region());
  }
}

void SummaryToProto(const AnswerSummary& a, v1::SolveSummary* s) {
  s->set_method(a.method);
  s->set_backend(a.backend);
  s->set_systems(a.systems);
  s->set_ok(a.outcomes[0]);
  s->set_singular(a.outcomes[1]);
  s->set_not_converged(a.outcomes[2]);
  s->set_diverged(a.outcomes[3]);
  s->set_iterations(a.iterations);
  s->set_residual(a.residual);
  s->set_request_id(a.request_id);
  v1::Timings* t = s->mutable_timings();
  t->set_receive_us(a.receive_us);
  t->set_queue_us(a.queue_us);
  t->set_h2d_us(a.h2d_us);
  t->set_compute_us(a.compute_us);
  t->set_d2h_us(a.d2h_us);
  t->set_residual_us(a.residual_us);
  t->set_total_us(a.total_us);
  if (a.batched_with > 0) s->set_batched_with(a.batched_with);
  if (a.batch_systems > 0) s->set_batch_systems(a.batch_systems);
  if (!a.handle.empty()) s->set_handle(a.handle);
  if (a.right_hand_sides > 0) s->set_right_hand_sides(a.right_hand_sides);
  for (const ResidualPoint& q : a.residual_history) {
    v1::ResidualPoint* out = s->add_residual_history();
    out->set_iteration(q.iteration);
    out->set_residual(q.residual);
  }
}

namespace {

// The statuses that are not OK, where they are at most a quarter of them; false otherwise.
bool SparseStatuses(const std::vector<SystemStatus>& all, v1::SparseStatus* out) {
  size_t found = all.size() - size_t(std::count(all.begin(), all.end(), SystemStatus::kOk));
  if (found > all.size() / 4) return false;
  out->set_systems(int64_t(all.size()));
  out->mutable_index()->Reserve(int(found));
  out->mutable_status()->Reserve(int(found));
  for (size_t s = 0; s < all.size() && found > 0; ++s)
    if (all[s] != SystemStatus::kOk) {
      out->add_index(int64_t(s));
      out->add_status(static_cast<v1::SystemStatus>(all[s]));
      --found;
    }
  return true;
}

}  // namespace

void AnswerToProto(Answer& a, v1::SolveResponse* resp, bool sparse_status) {
  resp->set_dtype(a.precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  for (int64_t d : a.x_shape) resp->mutable_x()->add_shape(d);
  resp->mutable_x()->mutable_data()->swap(a.result.x);
  if (!sparse_status || !SparseStatuses(a.result.status, resp->mutable_sparse())) {
    resp->clear_sparse();
    resp->mutable_status()->Reserve(static_cast<int>(a.result.status.size()));
    for (SystemStatus st : a.result.status)
      resp->add_status(static_cast<v1::SystemStatus>(st));
  }
  SummaryToProto(a.summary, resp->mutable_summary());
}

void SystemInfoToProto(const SystemView& v, v1::SystemInfo* info) {
  info->set_handle(v.handle);
  info->set_label(v.label);
  info->set_family(std::string(FamilyName(v.family)));
  info->set_dtype(v.precision == Precision::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  info->set_layout(v.layout == Layout::kFlat ? v1::FLAT : v1::INTERLEAVED);
  info->set_method(v.method);
  info->set_prepared(v.prepared);
  for (int64_t d : v.rhs_shape) info->add_rhs_shape(d);
  info->set_systems(v.systems);
  info->set_variable(v.variable);
  info->set_bytes(v.bytes);
  info->set_ttl_s(v.ttl_s);
  info->set_idle_s(v.idle_s);
  info->set_solves(v.solves);
  info->set_updates(v.updates);
}

void RegionToProto(const RegionInfo& r, v1::MemoryRegion* out) {
  out->set_name(r.name);
  out->set_key(r.key);
  out->set_bytes(r.bytes);
  out->set_pinned(r.pinned);
  out->set_ttl_s(r.ttl_s);
  out->set_idle_s(r.idle_s);
  out->set_uses(r.uses);
  out->set_server_owned(r.server_owned);
  if (r.device >= 0) {
    out->set_cuda(true);
    out->set_device(r.device);
  }
}

}  // namespace trisolve::server
