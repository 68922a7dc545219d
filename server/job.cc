#include "job.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trisolve::server {
namespace {

using v1::Array;

std::string ShapeStr(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

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

// Checks that `name` is present with a positive shape of rank in [min_rank, max_rank] whose
// element count fits; records it in the job.
absl::StatusOr<JobArray*> DeclareArray(Job& job, absl::string_view name, bool present,
                                       const Array& a, int min_rank, int max_rank,
                                       int elem_bytes, absl::string_view expect) {
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
  JobArray& ja = job.arrays[std::string(name)];
  ja.shape = std::move(shape);
  ja.elements = elements;
  ja.elem_bytes = elem_bytes;
  ja.expected_bytes = elements * elem_bytes;
  return &ja;
}

absl::Status SameShape(const Job& job, absl::string_view name, absl::string_view ref) {
  const auto& a = job.arrays.at(std::string(name));
  const auto& r = job.arrays.at(std::string(ref));
  if (a.shape != r.shape)
    return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr(a.shape), ", expected ",
                                      ShapeStr(r.shape), " (the shape of ", ref, ")"));
  return absl::OkStatus();
}

absl::Status CheckLimits(const Job& job, const JobLimits& l) {
  if (job.unknowns() > l.max_job_unknowns)
    return absl::ResourceExhaustedError(
        absl::StrCat("the job has ", job.unknowns(), " unknowns, over the limit max_job_unknowns = ",
                     l.max_job_unknowns));
  const int64_t bytes = job.total_bytes();
  if (bytes > l.max_job_bytes)
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job has ", bytes, " bytes of arrays, over the limit max_job_bytes = ",
        l.max_job_bytes));
  return absl::OkStatus();
}

// Borrows the request's bytes for `name`, checking their length.
absl::Status Borrow(Job& job, absl::string_view name, const Array& a) {
  JobArray& ja = job.arrays.at(std::string(name));
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

void Allocate(Job& job) {
  for (auto& [name, ja] : job.arrays) {
    ja.owned.reset(new std::byte[static_cast<size_t>(ja.expected_bytes)]);
    ja.data = ja.owned.get();
    ja.received = 0;
  }
}

std::string IndexStr(const std::vector<int64_t>& shape, int64_t e) {
  std::vector<int64_t> idx(shape.size());
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    idx[i] = e % shape[i];
    e /= shape[i];
  }
  std::string s;
  for (int64_t v : idx) absl::StrAppend(&s, "[", v, "]");
  return s;
}

template <typename T>
absl::Status CheckFinite(absl::string_view name, const JobArray& ja) {
  const T* v = reinterpret_cast<const T*>(ja.data);
  for (int64_t e = 0; e < ja.elements; ++e) {
    if (!std::isfinite(v[e]))
      return Invalid(name, absl::StrCat(name, IndexStr(ja.shape, e), " is ",
                                        std::isnan(v[e]) ? "NaN" : "Inf",
                                        "; every value must be finite"));
  }
  return absl::OkStatus();
}

// Contents checks, once every byte is there: finiteness, tree shape, symmetry.
absl::Status CheckContents(const Job& job) {
  for (const auto& [name, ja] : job.arrays) {
    if (name == "parent" || ja.absent) continue;
    absl::Status st = job.precision == Precision::kFloat64 ? CheckFinite<double>(name, ja)
                                                           : CheckFinite<float>(name, ja);
    if (!st.ok()) return st;
  }
  if (job.family == Family::kTree) {
    const JobArray& pa = job.arrays.at("parent");
    const auto* parent = reinterpret_cast<const int32_t*>(pa.data);
    const int64_t trees = job.parent_per_system ? job.batch : 1;
    for (int64_t s = 0; s < trees; ++s) {
      absl::Status st = ValidateParents(parent + s * job.n, job.n);
      if (!st.ok())
        return Invalid("parent", absl::StrCat(job.parent_per_system ? absl::StrCat("system ", s, ": ") : "",
                                              st.message()));
    }
  }
  if (job.family == Family::kDense && job.method == "householder-pcr") {
    const JobArray& A = job.arrays.at("a");
    const int64_t matrices = job.shared_matrix ? 1 : job.batch;
    int64_t bad;
    if (job.precision == Precision::kFloat64) {
      DenseProblem<double> p{matrices, job.n, reinterpret_cast<const double*>(A.data), nullptr};
      bad = FirstNonSymmetric(p);
    } else {
      DenseProblem<float> p{matrices, job.n, reinterpret_cast<const float*>(A.data), nullptr};
      bad = FirstNonSymmetric(p);
    }
    if (bad >= 0)
      return Invalid("a", absl::StrCat("matrix ", bad,
                                       " is not symmetric; householder-pcr needs symmetric A "
                                       "(use gauss-jordan)"));
  }
  return absl::OkStatus();
}

// ---- per family: declare shapes (header), then borrow data (unary) --------------------

// The right-hand side `name`: the request's array, or, for a CreateSystem that leaves it out,
// an absent array with the shape of `like` (a coefficient shaped as the right-hand side).
absl::StatusOr<JobArray*> DeclareRhs(Job& job, absl::string_view name, bool present,
                                     const Array& a, const Array& like, int min_rank,
                                     int max_rank, int elem_bytes, absl::string_view expect) {
  if ((!present || a.shape_size() == 0) && job.rhs_optional) {
    auto ja = DeclareArray(job, name, like.shape_size() > 0, like, min_rank, max_rank,
                           elem_bytes, expect);
    if (ja.ok()) (*ja)->absent = true;
    return ja;
  }
  return DeclareArray(job, name, present, a, min_rank, max_rank, elem_bytes, expect);
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
    std::initializer_list<std::tuple<const char*, bool, const Array*>> coefs, int eb) {
  const auto rs = job.arrays.at(std::string(rhs)).shape;
  bool all_1d = rs.size() == 2;
  for (auto [name, has, arr] : coefs) all_1d &= has && arr->shape_size() == 1;
  job.shared_matrix = all_1d && job.batch > 1;
  const std::string expect =
      job.shared_matrix ? absl::StrCat("[", job.n, "] (one matrix for ", job.batch,
                                       " right-hand sides)")
                        : ShapeStr(rs);
  for (auto [name, has, arr] : coefs) {
    auto st = DeclareArray(job, name, has, *arr, 1, 2, eb, expect);
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

absl::Status Declare(Job& job, const v1::TridiagonalRequest& r) {
  job.family = Family::kTridiagonal;
  auto prec = ParseDType(r.dtype());
  if (!prec.ok()) return prec.status();
  job.precision = *prec;
  auto layout = ParseLayout(r.layout());
  if (!layout.ok()) return layout.status();
  job.layout = *layout;
  auto m = ParseTridiagonalMethod(r.method());
  if (!m.ok()) return m.status();
  job.method = r.method();
  job.skip_residual = r.skip_residual();
  const int eb = job.precision == Precision::kFloat64 ? 8 : 4;
  const char* expect = job.layout == Layout::kFlat ? "[batch, n] or [n]" : "[n, batch] or [n]";
  auto d = DeclareRhs(job, "d", r.has_d(), r.d(), r.b(), 1, 2, eb, expect);
  if (!d.ok()) return d.status();
  BatchAndN(job, (*d)->shape);
  job.x_field = "d";
  return DeclareCoefficients(
      job, "d", {{"a", r.has_a(), &r.a()}, {"b", r.has_b(), &r.b()}, {"c", r.has_c(), &r.c()}},
      eb);
}

absl::Status Declare(Job& job, const v1::TreeRequest& r) {
  job.family = Family::kTree;
  auto prec = ParseDType(r.dtype());
  if (!prec.ok()) return prec.status();
  job.precision = *prec;
  auto layout = ParseLayout(r.layout());
  if (!layout.ok()) return layout.status();
  job.layout = *layout;
  auto m = ParseTreeMethod(r.method());
  if (!m.ok()) return m.status();
  job.method = r.method();
  job.skip_residual = r.skip_residual();
  const int eb = job.precision == Precision::kFloat64 ? 8 : 4;
  const char* expect = job.layout == Layout::kFlat ? "[batch, n] or [n]" : "[n, batch] or [n]";
  auto rhs = DeclareRhs(job, "rhs", r.has_rhs(), r.rhs(), r.diag(), 1, 2, eb, expect);
  if (!rhs.ok()) return rhs.status();
  BatchAndN(job, (*rhs)->shape);
  if (job.n > std::numeric_limits<int32_t>::max())
    return absl::InvalidArgumentError(absl::StrCat("rhs has ", job.n, " nodes a tree; at most 2^31 - 1"));
  job.x_field = "rhs";
  if (auto st = DeclareCoefficients(job, "rhs",
                                    {{"lower", r.has_lower(), &r.lower()},
                                     {"upper", r.has_upper(), &r.upper()},
                                     {"diag", r.has_diag(), &r.diag()}},
                                    eb);
      !st.ok())
    return st;
  const std::string pexpect =
      job.shared_matrix ? absl::StrCat("[", job.n, "]")
                        : absl::StrCat("[", job.n, "] or [", job.batch, ", ", job.n, "]");
  auto p = DeclareArray(job, "parent", r.has_parent(), r.parent(), 1, 2, 4, pexpect);
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
  job.family = Family::kBlockTridiagonal;
  auto prec = ParseDType(r.dtype());
  if (!prec.ok()) return prec.status();
  job.precision = *prec;
  auto m = ParseBlockMethod(r.method());
  if (!m.ok()) return m.status();
  job.method = r.method();
  const int eb = job.precision == Precision::kFloat64 ? 8 : 4;
  auto f = DeclareRhs(job, "f", r.has_f(), r.f(), r.c_c(), 1, 3, eb,
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
    auto st = DeclareArray(job, name, has, *arr, 1, 2, eb, expect);
    if (!st.ok()) return st.status();
    if ((*st)->shape != cs)
      return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", ShapeStr((*st)->shape),
                                                     ", expected ", expect, " (the shape of f",
                                                     job.shared_matrix ? "'s systems)" : ")"));
  }
  if (r.has_y0() && !job.rhs_optional) {
    auto st = DeclareArray(job, "y0", true, r.y0(), 1, 3, eb, ShapeStr(fs));
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
  job.x_field = "f";
  return absl::OkStatus();
}

absl::Status Declare(Job& job, const v1::DenseRequest& r) {
  job.family = Family::kDense;
  auto prec = ParseDType(r.dtype());
  if (!prec.ok()) return prec.status();
  job.precision = *prec;
  auto m = ParseDenseMethod(r.method());
  if (!m.ok()) return m.status();
  job.method = r.method();
  job.skip_residual = r.skip_residual();
  const int eb = job.precision == Precision::kFloat64 ? 8 : 4;
  if ((!r.has_b() || r.b().shape_size() == 0) && job.rhs_optional) {
    // CreateSystem without b: its shape from a ([n, n] -> [n], [batch, n, n] -> [batch, n]).
    auto a = DeclareArray(job, "a", r.has_a(), r.a(), 2, 3, eb, "[n, n] or [batch, n, n]");
    if (!a.ok()) return a.status();
    const auto as = (*a)->shape;
    if (as[as.size() - 2] != as.back())
      return absl::InvalidArgumentError(absl::StrCat("a has shape ", ShapeStr(as), ": the matrices are ",
                                                     as[as.size() - 2], " x ", as.back(), ", not square"));
    JobArray& b = job.arrays["b"];
    b.shape.assign(as.begin(), as.end() - 1);
    b.elements = 1;
    for (int64_t d : b.shape) b.elements *= d;
    b.elem_bytes = eb;
    b.expected_bytes = b.elements * eb;
    b.absent = true;
  }
  const bool b_declared = job.arrays.count("b") > 0;
  absl::StatusOr<JobArray*> b =
      b_declared ? absl::StatusOr<JobArray*>(&job.arrays.at("b"))
                 : DeclareArray(job, "b", r.has_b(), r.b(), 1, 2, eb, "[batch, n] or [n]");
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
      b_declared ? absl::StatusOr<JobArray*>(&job.arrays.at("a"))
                 : DeclareArray(job, "a", r.has_a(), r.a(), 2, 3, eb, expect);
  if (!a.ok()) return a.status();
  const auto& as = (*a)->shape;
  const int64_t rows = as[as.size() - 2], cols = as.back();
  if (rows != cols)
    return absl::InvalidArgumentError(absl::StrCat("a has shape ", ShapeStr(as), ": the matrices are ", rows,
                                     " x ", cols, ", not square"));
  const int64_t abatch = as.size() == 3 ? as[0] : 1;
  // One [n, n] matrix with b of shape [k, n]: k right-hand sides.
  job.shared_matrix = as.size() == 2 && bs.size() == 2 && rows == job.n;
  if (rows != job.n || (!job.shared_matrix && (abatch != job.batch || (as.size() == 3) != (bs.size() == 2))))
    return absl::InvalidArgumentError(absl::StrCat("a has shape ", ShapeStr(as), ", expected ", expect,
                                     " to match b ", ShapeStr(bs)));
  if (job.n > 65536)
    return Invalid("b", absl::StrCat("n = ", job.n, " is over 65536, the largest dense order"));
  job.x_field = "b";
  return absl::OkStatus();
}

// Borrows every declared array's bytes but an absent right-hand side's.
absl::Status BorrowNamed(Job& job, std::initializer_list<std::pair<const char*, const Array*>> l) {
  for (auto [n, a] : l) {
    auto it = job.arrays.find(n);
    if (it == job.arrays.end() || it->second.absent) continue;
    if (auto st = Borrow(job, n, *a); !st.ok()) return st;
  }
  return absl::OkStatus();
}
absl::Status BorrowAll(Job& job, const v1::TridiagonalRequest& r) {
  return BorrowNamed(job, {{"a", &r.a()}, {"b", &r.b()}, {"c", &r.c()}, {"d", &r.d()}});
}
absl::Status BorrowAll(Job& job, const v1::TreeRequest& r) {
  return BorrowNamed(job, {{"parent", &r.parent()}, {"lower", &r.lower()}, {"upper", &r.upper()},
                           {"diag", &r.diag()}, {"rhs", &r.rhs()}});
}
absl::Status BorrowAll(Job& job, const v1::BlockTridiagonalRequest& r) {
  return BorrowNamed(job, {{"aC", &r.a_c()}, {"cC", &r.c_c()}, {"bC", &r.b_c()}, {"cA", &r.c_a()},
                           {"cB", &r.c_b()}, {"f", &r.f()}, {"y0", &r.y0()}});
}
absl::Status BorrowAll(Job& job, const v1::DenseRequest& r) {
  return BorrowNamed(job, {{"a", &r.a()}, {"b", &r.b()}});
}

template <typename Req>
absl::StatusOr<Job> FromUnary(const Req& r, const JobLimits& l, DeclareOptions o) {
  Job job;
  job.rhs_optional = o.rhs_optional;
  if (auto st = Declare(job, r); !st.ok()) return st;
  if (auto st = CheckLimits(job, l); !st.ok()) return st;
  if (auto st = BorrowAll(job, r); !st.ok()) return st;
  if (auto st = CheckContents(job); !st.ok()) return st;
  return job;
}

// Chunk names: the request's field names; the thesis' names are accepted too.
std::string CanonicalName(const Job& job, const std::string& name) {
  if (job.family == Family::kBlockTridiagonal) {
    static const std::map<std::string, std::string> m = {
        {"a_c", "aC"}, {"c_c", "cC"}, {"b_c", "bC"}, {"c_a", "cA"}, {"c_b", "cB"}};
    if (auto it = m.find(name); it != m.end()) return it->second;
  }
  if (job.family == Family::kDense && name == "A") return "a";
  return name;
}

// ---- running -----------------------------------------------------------------------------

template <typename T>
const T* Ptr(const Job& job, const char* name) {
  auto it = job.arrays.find(name);
  return it == job.arrays.end() ? nullptr : reinterpret_cast<const T*>(it->second.data);
}

double Micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

uint8_t ParsedMethod(Family f, const std::string& m) {
  switch (f) {
    case Family::kTridiagonal: return uint8_t(*ParseTridiagonalMethod(m));
    case Family::kTree: return uint8_t(*ParseTreeMethod(m));
    case Family::kBlockTridiagonal: return uint8_t(*ParseBlockMethod(m));
    case Family::kDense: return uint8_t(*ParseDenseMethod(m));
  }
  return 0;
}

template <typename T>
absl::StatusOr<JobResult> RunPreparedTyped(Backend& be, PreparedSystem& system, const T* rhs,
                                           int64_t k, Layout rhs_layout, bool skip_residual,
                                           const SolveControl& control) {
  const SystemSpec& s = system.spec();
  JobResult res;
  res.x.resize(size_t(k * s.rhs_values()) * sizeof(T));
  T* x = reinterpret_cast<T*>(res.x.data());
  res.status.assign(size_t(k * s.batch), SystemStatus::kOk);
  res.backward_error = std::numeric_limits<double>::quiet_NaN();
  const RhsBlock<T> block{rhs, k, rhs_layout};
  const auto t0 = std::chrono::steady_clock::now();
  auto info = be.SolvePrepared(system, block, x, res.status.data(), control);
  const auto t1 = std::chrono::steady_clock::now();
  res.compute_us = Micros(t1 - t0);
  if (!info.ok()) return info.status();
  res.info = *std::move(info);
  if (!skip_residual && s.family != Family::kBlockTridiagonal) {
    res.backward_error = PreparedBackwardError(system, block, x, res.status.data());
    res.residual_us = Micros(std::chrono::steady_clock::now() - t1);
  }
  return res;
}

template <typename T>
absl::StatusOr<JobResult> RunTyped(Backend& be, const Job& job, const SolveControl& control) {
  if (job.shared_matrix) {
    const auto t0 = std::chrono::steady_clock::now();
    auto system = be.Prepare(job.Spec());
    if (!system.ok()) return system.status();
    const double prepare_us = Micros(std::chrono::steady_clock::now() - t0);
    const T* rhs = reinterpret_cast<const T*>(job.arrays.at(job.x_field).data);
    auto res = RunPreparedTyped(be, **system, rhs, job.batch, job.layout, job.skip_residual,
                                control);
    if (res.ok()) res->compute_us += prepare_us;
    return res;
  }
  JobResult res;
  const int64_t out_elems = job.arrays.at(job.x_field).elements;
  res.x.resize(static_cast<size_t>(out_elems) * sizeof(T));
  T* x = reinterpret_cast<T*>(res.x.data());
  res.status.assign(static_cast<size_t>(job.batch), SystemStatus::kOk);
  res.backward_error = std::numeric_limits<double>::quiet_NaN();
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<SolveInfo> info;
  std::function<double()> residual;
  switch (job.family) {
    case Family::kTridiagonal: {
      auto m = ParseTridiagonalMethod(job.method);
      TridiagonalProblem<T> p{job.batch, job.n, job.layout, Ptr<T>(job, "a"), Ptr<T>(job, "b"),
                              Ptr<T>(job, "c"), Ptr<T>(job, "d")};
      info = be.Solve(p, *m, TridiagonalOutput<T>{x, res.status.data()}, control);
      residual = [p, x, &res] { return TridiagonalBackwardError(p, x, res.status.data()); };
      break;
    }
    case Family::kTree: {
      auto m = ParseTreeMethod(job.method);
      TreeProblem<T> p;
      p.batch = job.batch;
      p.n = job.n;
      p.layout = job.layout;
      p.parent = reinterpret_cast<const int32_t*>(job.arrays.at("parent").data);
      p.parent_per_system = job.parent_per_system;
      p.lower = Ptr<T>(job, "lower");
      p.upper = Ptr<T>(job, "upper");
      p.diag = Ptr<T>(job, "diag");
      p.rhs = Ptr<T>(job, "rhs");
      info = be.Solve(p, *m, TreeOutput<T>{x, res.status.data()}, control);
      residual = [p, x, &res] { return TreeBackwardError(p, x, res.status.data()); };
      break;
    }
    case Family::kBlockTridiagonal: {
      auto m = ParseBlockMethod(job.method);
      BlockTridiagonalProblem<T> p{job.block_N,     job.block_M,     Ptr<T>(job, "aC"),
                                   Ptr<T>(job, "cC"), Ptr<T>(job, "bC"), Ptr<T>(job, "cA"),
                                   Ptr<T>(job, "cB"), Ptr<T>(job, "f"),  Ptr<T>(job, "y0")};
      info = be.Solve(p, *m, job.block_options, BlockOutput<T>{x, res.status.data()}, control);
      break;
    }
    case Family::kDense: {
      auto m = ParseDenseMethod(job.method);
      DenseProblem<T> p{job.batch, job.n, Ptr<T>(job, "a"), Ptr<T>(job, "b")};
      info = be.Solve(p, *m, DenseOutput<T>{x, res.status.data()}, control);
      residual = [p, x, &res] { return DenseBackwardError(p, x, res.status.data()); };
      break;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  res.compute_us = Micros(t1 - t0);
  if (!info.ok()) return info.status();
  res.info = *std::move(info);
  if (residual && !job.skip_residual) {
    res.backward_error = residual();
    res.residual_us = Micros(std::chrono::steady_clock::now() - t1);
  }
  return res;
}

}  // namespace

int64_t Job::total_bytes() const {
  int64_t t = 0;
  for (const auto& [name, a] : arrays)
    if (!a.absent) t += a.expected_bytes;
  return t;
}

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

absl::StatusOr<Job> JobFromStreamHeader(const v1::StreamRequest& h, const JobLimits& l) {
  Job job;
  absl::Status st;
  switch (h.part_case()) {
    case v1::StreamRequest::kTridiagonal: st = Declare(job, h.tridiagonal()); break;
    case v1::StreamRequest::kTree: st = Declare(job, h.tree()); break;
    case v1::StreamRequest::kBlockTridiagonal: st = Declare(job, h.block_tridiagonal()); break;
    case v1::StreamRequest::kDense: st = Declare(job, h.dense()); break;
    default:
      return absl::InvalidArgumentError(
          "part: the first message of a stream must be a header (tridiagonal, tree, "
          "block_tridiagonal or dense), not a chunk");
  }
  if (!st.ok()) return st;
  if (auto s2 = CheckLimits(job, l); !s2.ok()) return s2;
  Allocate(job);
  return job;
}

absl::Status AppendChunk(Job& job, const v1::Chunk& chunk) {
  const std::string name = CanonicalName(job, chunk.array());
  auto it = job.arrays.find(name);
  if (it == job.arrays.end())
    return Invalid("chunk.array", absl::StrCat("'", chunk.array(), "' is not an array of this ",
                                               FamilyName(job.family), " job"));
  JobArray& ja = it->second;
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
  for (const auto& [name, ja] : job.arrays)
    if (ja.received != ja.expected_bytes)
      return absl::InvalidArgumentError(absl::StrCat(name, " has ", ja.received, " bytes of data, expected ",
                                        ja.expected_bytes, " (shape ", ShapeStr(ja.shape), ")"));
  return CheckContents(job);
}

SystemSpec Job::Spec() const {
  SystemSpec s;
  s.family = family;
  s.precision = precision;
  s.layout = layout;
  s.batch = shared_matrix ? 1 : batch;
  s.n = n;
  s.block_N = block_N;
  s.block_M = block_M;
  s.parent_per_system = parent_per_system;
  s.method = ParsedMethod(family, method);
  s.block_options = block_options;
  const auto names = CoefficientNames(family);
  for (size_t i = 0; i < names.size(); ++i)
    s.coefficients[i] = arrays.at(std::string(names[i])).data;
  return s;
}

std::vector<std::vector<int64_t>> Job::CoefficientShapes() const {
  std::vector<std::vector<int64_t>> shapes;
  for (absl::string_view name : CoefficientNames(family))
    shapes.push_back(arrays.at(std::string(name)).shape);
  return shapes;
}

std::vector<int64_t> Job::SystemRhsShape() const {
  const std::vector<int64_t>& rs = arrays.at(x_field).shape;
  if (!shared_matrix) return rs;
  if (family == Family::kBlockTridiagonal) return {rs[1], rs[2]};
  return {n};
}

std::string Sanitized(absl::string_view name) {
  constexpr size_t kMax = 64;
  std::string out;
  for (char ch : name.substr(0, kMax)) out.push_back(ch >= 0x20 && ch < 0x7f ? ch : '?');
  if (name.size() > kMax) out += "...";
  return out;
}

namespace {

// The message's bytes, aligned for their type (a copy in *scratch when they are not).
const void* Aligned(const std::string& bytes, int elem_bytes, std::string* scratch) {
  if (reinterpret_cast<uintptr_t>(bytes.data()) % elem_bytes == 0) return bytes.data();
  scratch->assign(bytes);
  return scratch->data();
}

absl::Status CheckFiniteValues(absl::string_view name, Precision p, const void* data,
                               const std::vector<int64_t>& shape, int64_t elements) {
  JobArray ja;
  ja.shape = shape;
  ja.elements = elements;
  ja.data = static_cast<const std::byte*>(data);
  return p == Precision::kFloat64 ? CheckFinite<double>(name, ja) : CheckFinite<float>(name, ja);
}

}  // namespace

absl::StatusOr<CheckedUpdate> CheckUpdate(const SystemSpec& spec,
                                          const std::vector<std::vector<int64_t>>& shapes,
                                          const std::string& name, const v1::Array& values,
                                          std::string* scratch) {
  const int i = CoefficientIndex(spec.family, name);
  if (i < 0) {
    std::vector<std::string> names;
    for (absl::string_view n : CoefficientNames(spec.family)) names.emplace_back(n);
    return Invalid("update", absl::StrCat("'", Sanitized(name), "' is not a coefficient of a ",
                                          FamilyName(spec.family), " system (",
                                          absl::StrJoin(names, ", "), ")"));
  }
  const std::string canonical(CoefficientNames(spec.family)[size_t(i)]);
  const std::vector<int64_t> shape(values.shape().begin(), values.shape().end());
  if (shape != shapes[size_t(i)])
    return absl::InvalidArgumentError(absl::StrCat(canonical, " has shape ", ShapeStr(shape),
                                                   ", expected ", ShapeStr(shapes[size_t(i)]),
                                                   " (the system's)"));
  const int64_t bytes = spec.coefficient_bytes(i);
  if (int64_t(values.data().size()) != bytes)
    return absl::InvalidArgumentError(absl::StrCat(canonical, " has ", values.data().size(),
                                                   " bytes of data, expected ", bytes));
  const bool parent = spec.family == Family::kTree && canonical == "parent";
  CheckedUpdate u;
  u.index = i;
  u.data = Aligned(values.data(), parent ? 4 : int(spec.elem_bytes()), scratch);
  if (parent) {
    const auto* p = static_cast<const int32_t*>(u.data);
    const int64_t trees = spec.parent_per_system ? spec.batch : 1;
    for (int64_t s = 0; s < trees; ++s)
      if (auto st = ValidateParents(p + s * spec.n, spec.n); !st.ok())
        return Invalid("parent", st.message());
  } else if (auto st = CheckFiniteValues(canonical, spec.precision, u.data, shape,
                                         spec.coefficient_values(i));
             !st.ok()) {
    return st;
  }
  return u;
}

absl::StatusOr<CheckedRhs> CheckRhs(const SystemSpec& spec, const std::vector<int64_t>& rhs_shape,
                                    const v1::Array& rhs, const JobLimits& limits,
                                    std::string* scratch) {
  const std::string name(RhsName(spec.family));
  CheckedRhs r;
  r.shape.assign(rhs.shape().begin(), rhs.shape().end());
  const bool one = r.shape == rhs_shape;
  const bool many = r.shape.size() == rhs_shape.size() + 1 && r.shape[0] >= 1 &&
                    std::equal(rhs_shape.begin(), rhs_shape.end(), r.shape.begin() + 1);
  if (!one && !many)
    return absl::InvalidArgumentError(absl::StrCat(
        "rhs has shape ", ShapeStr(r.shape), ", expected ", ShapeStr(rhs_shape),
        " (the system's ", name, ") or [k, ", absl::StrJoin(rhs_shape, ", "),
        "] for k right-hand sides"));
  r.k = many ? r.shape[0] : 1;
  int64_t values = 0;
  if (__builtin_mul_overflow(r.k, spec.rhs_values(), &values) || values > limits.max_job_unknowns)
    return absl::ResourceExhaustedError(absl::StrCat(
        "rhs has ", r.k, " right-hand sides of ", spec.rhs_values(),
        " unknowns, over the limit max_job_unknowns = ", limits.max_job_unknowns));
  const int64_t bytes = values * spec.elem_bytes();
  if (int64_t(rhs.data().size()) != bytes)
    return absl::InvalidArgumentError(absl::StrCat("rhs has ", rhs.data().size(),
                                                   " bytes of data, expected ", bytes, " (shape ",
                                                   ShapeStr(r.shape), ")"));
  r.data = Aligned(rhs.data(), int(spec.elem_bytes()), scratch);
  if (auto st = CheckFiniteValues("rhs", spec.precision, r.data, r.shape, values); !st.ok())
    return st;
  return r;
}

absl::StatusOr<Job> JobFromCreateSystem(const v1::CreateSystemRequest& r, const JobLimits& l) {
  const DeclareOptions o{.rhs_optional = true};
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

absl::StatusOr<JobResult> RunPrepared(Backend& backend, PreparedSystem& system, const void* rhs,
                                      int64_t k, Layout rhs_layout, bool skip_residual,
                                      const SolveControl& control) {
  if (system.spec().precision == Precision::kFloat64)
    return RunPreparedTyped(backend, system, static_cast<const double*>(rhs), k, rhs_layout,
                            skip_residual, control);
  return RunPreparedTyped(backend, system, static_cast<const float*>(rhs), k, rhs_layout,
                          skip_residual, control);
}

absl::StatusOr<JobResult> RunJob(Backend& backend, const Job& job,
                                 const SolveControl& control) {
  return job.precision == Precision::kFloat64 ? RunTyped<double>(backend, job, control)
                                              : RunTyped<float>(backend, job, control);
}

}  // namespace trisolve::server
