#include "job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trisolve::server {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
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

// The first non-finite value of v[0, n), or n: the exponent bits tested as integers in blocks
// (vectorized), the blocks spread over threads for large arrays (a 2^24-unknown job's four
// arrays are 537 MB: one thread reading them took longer than the rest of the request).
template <typename T>
int64_t FirstNonFinite(const T* values, int64_t n) {
  using U = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  typedef U __attribute__((may_alias)) Bits;
  constexpr U kExp = sizeof(T) == 8 ? U(0x7ff0000000000000ull) : U(0x7f800000u);
  const Bits* v = reinterpret_cast<const Bits*>(values);
  constexpr int64_t kBlock = int64_t{1} << 15;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  int64_t first = blocks;
  const auto scan = [&](int64_t b) {
    const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    U bad = 0;
    for (int64_t e = lo; e < hi; ++e) bad |= U((v[e] & kExp) == kExp);
    return bad != 0;
  };
  // Small arrays outside any parallel region: entering one, even one its `if` keeps to this
  // thread, cost futex calls and a team's allocation (tests/bench/NOTES.md, s34).
  if (n < (int64_t{1} << 21)) {
    for (int64_t b = 0; b < blocks && first == blocks; ++b)
      if (scan(b)) first = b;
  } else {
#pragma omp parallel for schedule(static) reduction(min : first)
    for (int64_t b = 0; b < blocks; ++b)
      if (scan(b)) first = std::min(first, b);
  }
  if (first == blocks) return n;
  for (int64_t e = first * kBlock;; ++e)
    if (!std::isfinite(values[e])) return e;
}

template <typename T>
absl::Status CheckFinite(absl::string_view name, const JobArray& ja) {
  const T* v = reinterpret_cast<const T*>(ja.data);
  const int64_t e = FirstNonFinite(v, ja.elements);
  if (e < ja.elements)
    return Invalid(name, absl::StrCat(name, IndexStr(ja.shape, e), " is ",
                                      std::isnan(v[e]) ? "NaN" : "Inf",
                                      "; every value must be finite"));
  return absl::OkStatus();
}

// Contents checks, once every byte is there: finiteness, tree shape, symmetry.
}  // namespace

absl::Status CheckValues(const Job& job, const DeviceReader& device) {
  const FamilyDescriptor& d = job.descriptor();
  for (size_t i = 0; i < d.arrays.size(); ++i) {
    const JobArray& ja = job.arrays[i];
    if (!ja.declared || ja.absent || d.arrays[i].int32) continue;
    const absl::string_view name = d.arrays[i].name;
    const JobArray* a = &ja;
    JobArray copy;  // a device array's values, on the host for the check
    if (ja.on_device) {
      if (!device) continue;
      copy.shape = ja.shape;
      copy.elements = ja.elements;
      copy.owned.reset(new (std::nothrow) std::byte[size_t(ja.expected_bytes)]);
      if (!copy.owned)
        return absl::ResourceExhaustedError(absl::StrCat(
            name, ": cannot allocate ", ja.expected_bytes, " bytes to check it on the host"));
      if (auto st = device(copy.owned.get(), ja.data, ja.expected_bytes); !st.ok()) return st;
      copy.data = copy.owned.get();
      a = &copy;
    }
    absl::Status st = job.precision == Precision::kFloat64 ? CheckFinite<double>(name, *a)
                                                           : CheckFinite<float>(name, *a);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status CheckContents(const Job& job) {
  if (auto st = CheckValues(job); !st.ok()) return st;
  return CheckStructure(job);
}

absl::Status CheckStructure(const Job& job) {
  return job.descriptor().check_structure(job.Spec(), job.Extra());
}

namespace {

// ---- running -----------------------------------------------------------------------------

double Micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

template <typename T>
absl::StatusOr<JobResult> RunPreparedTyped(Backend& be, PreparedSystem& system, const T* rhs,
                                           int64_t k, Layout rhs_layout, bool skip_residual,
                                           const SolveControl& control, void* x_out,
                                           SystemRange range = {}) {
  const RhsBlock<T> block{rhs, k, rhs_layout, range.first, range.systems};
  const SystemSpec s = BlockSpec(system.spec(), block);
  JobResult res;
  if (x_out == nullptr) res.x.resize(size_t(k * s.rhs_values()) * sizeof(T));
  T* x = x_out != nullptr ? static_cast<T*>(x_out) : reinterpret_cast<T*>(res.x.data());
  res.status.assign(size_t(k * s.batch), SystemStatus::kOk);
  res.backward_error = std::numeric_limits<double>::quiet_NaN();
  const auto t0 = std::chrono::steady_clock::now();
  auto info = be.SolvePrepared(system, block, x, res.status.data(), control);
  const auto t1 = std::chrono::steady_clock::now();
  res.compute_us = Micros(t1 - t0);
  if (!info.ok()) return info.status();
  res.info = *std::move(info);
  if (!skip_residual && Describe(s.family).ops<T>().backward_error != nullptr) {
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
    const T* rhs = reinterpret_cast<const T*>(job.rhs().data);
    auto res = RunPreparedTyped(be, **system, rhs, job.batch, job.layout,
                                job.skip_residual || job.device_arrays(), control, job.x_out);
    if (res.ok()) res->compute_us += prepare_us;
    return res;
  }
  JobResult res;
  const int64_t out_elems = job.rhs().elements;
  if (job.x_out == nullptr) res.x.resize(static_cast<size_t>(out_elems) * sizeof(T));
  T* x = job.x_out != nullptr ? reinterpret_cast<T*>(job.x_out) : reinterpret_cast<T*>(res.x.data());
  res.status.assign(static_cast<size_t>(job.batch), SystemStatus::kOk);
  res.backward_error = std::numeric_limits<double>::quiet_NaN();
  const FamilyOps<T>& ops = job.descriptor().ops<T>();
  const SystemSpec spec = job.Spec();
  const OneShotArrays extra = job.Extra();
  const T* rhs = reinterpret_cast<const T*>(job.rhs().data);
  SolveControl with_history;
  if (job.history_limit > 0) {
    with_history = control;
    with_history.history_limit = job.history_limit;
  }
  const SolveControl& c = job.history_limit > 0 ? with_history : control;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<SolveInfo> info = ops.solve(be, spec, rhs, extra, x, res.status.data(), c);
  const auto t1 = std::chrono::steady_clock::now();
  res.compute_us = Micros(t1 - t0);
  if (!info.ok()) return info.status();
  res.info = *std::move(info);
  // (Arrays in device memory: the residual would read them all back; the client has them.)
  if (ops.backward_error != nullptr && !job.skip_residual && !job.device_arrays()) {
    res.backward_error = ops.backward_error(spec, rhs, extra, x, res.status.data());
    res.residual_us = Micros(std::chrono::steady_clock::now() - t1);
  }
  return res;
}

}  // namespace

std::string ShapeStr(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
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

int64_t Job::total_bytes() const {
  int64_t t = 0;
  for (const JobArray& a : arrays)
    if (a.declared && !a.absent) t += a.expected_bytes;
  return t;
}

const JobArray* Job::Find(absl::string_view name) const {
  const int slot = descriptor().Find(name);
  if (slot < 0 || !arrays[size_t(slot)].declared) return nullptr;
  return &arrays[size_t(slot)];
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
  s.method = method;
  s.block_options = block_options;
  const auto slots = descriptor().coefficient_slots;
  for (size_t i = 0; i < slots.size(); ++i) s.coefficients[i] = arrays[size_t(slots[i])].data;
  if (variable) s.lengths = reinterpret_cast<const int32_t*>(Find("lengths")->data);
  return s;
}

OneShotArrays Job::Extra() const {
  OneShotArrays e;
  const FamilyDescriptor& d = descriptor();
  for (size_t i = 0; i < d.arrays.size(); ++i) {
    const JobArray& a = arrays[i];
    if (!a.declared || a.absent) continue;
    switch (d.arrays[i].role) {
      case ArrayRole::kInitialGuess: e.initial_guess = a.data; break;
      case ArrayRole::kLengths: e.lengths = reinterpret_cast<const int32_t*>(a.data); break;
      case ArrayRole::kUnified: e.unified = a.data; break;
      case ArrayRole::kCoefficient:
      case ArrayRole::kParent:
      case ArrayRole::kRhs: break;
    }
  }
  return e;
}

std::vector<std::vector<int64_t>> Job::CoefficientShapes() const {
  std::vector<std::vector<int64_t>> shapes;
  for (int slot : descriptor().coefficient_slots) shapes.push_back(arrays[size_t(slot)].shape);
  return shapes;
}

std::vector<int64_t> Job::SystemRhsShape() const {
  const std::vector<int64_t>& rs = rhs().shape;
  if (!shared_matrix) return rs;
  // k right-hand sides: [k, N, M] for a block system, [k, n] or [n, k] for the others.
  if (rs.size() == 3) return {rs[1], rs[2]};
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
                                          const std::string& name, const ArrayIn& values) {
  const int i = CoefficientIndex(spec.family, name);
  if (i < 0 && spec.variable() && Describe(spec.family).Find(name) >= 0 &&
      Describe(spec.family).arrays[size_t(Describe(spec.family).Find(name))].role ==
          ArrayRole::kLengths)
    return Invalid("update", absl::StrCat("'lengths' is fixed when the system is created (the ",
                                          spec.batch, " systems' sizes): create a new system "
                                          "for other sizes"));
  if (i < 0) {
    std::vector<std::string> names;
    for (absl::string_view n : CoefficientNames(spec.family)) names.emplace_back(n);
    return Invalid("update", absl::StrCat("'", Sanitized(name), "' is not a coefficient of a ",
                                          FamilyName(spec.family), " system (",
                                          absl::StrJoin(names, ", "), ")"));
  }
  const ArrayDescriptor& coefficient = Describe(spec.family).coefficient(i);
  const std::string canonical(coefficient.name);
  const std::vector<int64_t>& shape = values.shape;
  if (shape != shapes[size_t(i)])
    return absl::InvalidArgumentError(absl::StrCat(canonical, " has shape ", ShapeStr(shape),
                                                   ", expected ", ShapeStr(shapes[size_t(i)]),
                                                   " (the system's)"));
  const int64_t bytes = spec.coefficient_bytes(i);
  if (values.bytes != bytes)
    return absl::InvalidArgumentError(absl::StrCat(canonical, " has ", values.bytes,
                                                   " bytes of data, expected ", bytes));
  CheckedUpdate u;
  u.index = i;
  u.data = values.data;
  if (!coefficient.int32)
    if (auto st = CheckFiniteValues(canonical, spec.precision, u.data, shape,
                                    spec.coefficient_values(i));
        !st.ok())
      return st;
  if (auto st = Describe(spec.family).check_update(spec, i, u.data); !st.ok()) return st;
  return u;
}

namespace {

// A bad value of a range's right-hand side (CheckedRhs::first_system) also named by its system
// in the whole batch, which is how the caller counts them.
// (data: the values on the host.)
absl::Status InBatch(const SystemSpec& spec, const CheckedRhs& r, const void* data,
                     absl::Status st) {
  if (st.ok() || r.first_system == 0 || spec.n <= 0) return st;
  const int64_t values = r.k * spec.rhs_values();
  const int64_t e = spec.precision == Precision::kFloat64
                        ? FirstNonFinite(static_cast<const double*>(data), values)
                        : FirstNonFinite(static_cast<const float*>(data), values);
  if (e >= values) return st;
  const int64_t system = r.first_system + (e / spec.n) % spec.batch;
  return absl::Status(st.code(), absl::StrCat(st.message(), " (system ", system,
                                              " of the batch: this range starts at system ",
                                              r.first_system, ")"));
}

}  // namespace

absl::StatusOr<CheckedRhs> CheckRhs(const SystemSpec& spec, const std::vector<int64_t>& rhs_shape,
                                    const ArrayIn& rhs, const JobLimits& limits,
                                    bool check_finite) {
  const std::string name(RhsName(spec.family));
  CheckedRhs r;
  r.shape = rhs.shape;
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
  if (rhs.bytes != bytes)
    return absl::InvalidArgumentError(absl::StrCat("rhs has ", rhs.bytes,
                                                   " bytes of data, expected ", bytes, " (shape ",
                                                   ShapeStr(r.shape), ")"));
  r.data = rhs.data;
  if (check_finite)
    if (auto st = CheckRhsValues(spec, r); !st.ok()) return st;
  return r;
}

absl::Status CheckRhsValues(const SystemSpec& spec, const CheckedRhs& r, bool on_device,
                            const DeviceReader& device) {
  const int64_t values = r.k * spec.rhs_values();
  if (!on_device)
    return InBatch(spec, r, r.data,
                   CheckFiniteValues("rhs", spec.precision, r.data, r.shape, values));
  if (!device) return absl::OkStatus();
  const int64_t bytes = values * spec.elem_bytes();
  std::unique_ptr<std::byte[]> copy(new (std::nothrow) std::byte[size_t(bytes)]);
  if (!copy)
    return absl::ResourceExhaustedError(
        absl::StrCat("rhs: cannot allocate ", bytes, " bytes to check it on the host"));
  if (auto st = device(copy.get(), r.data, bytes); !st.ok()) return st;
  return InBatch(spec, r, copy.get(),
                 CheckFiniteValues("rhs", spec.precision, copy.get(), r.shape, values));
}

absl::Status AfterDeviceCheck(const absl::Status& solved, bool inputs_checked,
                              const std::function<absl::Status()>& check) {
  if (IsNonFiniteInput(solved)) {
    absl::Status st = check();
    // Found on the device, gone on the host: the caller's memory changed during the solve.
    return st.ok() ? absl::InvalidArgumentError(
                         "a NaN or Inf was read on the device and was no longer there on the "
                         "host: an array changed in shared memory while the job ran")
                   : st;
  }
  if (solved.ok() && !inputs_checked) return check();
  return absl::OkStatus();
}

absl::StatusOr<std::byte*> ResolveRegionRef(absl::string_view field, const RegionRef& ref,
                                            int64_t expected_bytes, int align,
                                            RegionResolver* regions, RegionUse use,
                                            bool* on_device) {
  if (on_device != nullptr) *on_device = false;
  if (regions == nullptr)
    return Invalid(field, "arrays in shared-memory regions are taken by the unary calls, "
                          "SolveSystem and SolveSystemStream only");
  return regions->Resolve(field, ref.region, ref.offset, ref.bytes, expected_bytes, align, use,
                          on_device);
}

absl::StatusOr<ArrayIn> ResolveArray(const ArrayArg& a, RegionResolver* regions,
                                     absl::string_view field, int elem_bytes, RegionUse use) {
  if (!a.error.ok()) return a.error;
  ArrayIn in;
  in.shape = a.shape;
  if (!a.in_region) {
    in.data = a.data;
    in.bytes = a.bytes;
    return in;
  }
  int64_t elements = 1;
  for (int64_t d : in.shape)
    if (d < 0 || __builtin_mul_overflow(elements, d, &elements) ||
        elements > std::numeric_limits<int64_t>::max() / 8)
      return Invalid(field, absl::StrCat("shape ", ShapeStr(in.shape), " is not a valid shape"));
  in.bytes = elements * elem_bytes;
  auto p = ResolveRegionRef(absl::StrCat(field, ".region"), a.region, in.bytes, elem_bytes,
                            regions, use, &in.on_device);
  if (!p.ok()) return p.status();
  in.data = *p;
  return in;
}

absl::StatusOr<JobResult> RunPrepared(Backend& backend, PreparedSystem& system, const void* rhs,
                                      int64_t k, Layout rhs_layout, bool skip_residual,
                                      const SolveControl& control, void* x_out,
                                      SystemRange range) {
  if (system.spec().precision == Precision::kFloat64)
    return RunPreparedTyped(backend, system, static_cast<const double*>(rhs), k, rhs_layout,
                            skip_residual, control, x_out, range);
  return RunPreparedTyped(backend, system, static_cast<const float*>(rhs), k, rhs_layout,
                          skip_residual, control, x_out, range);
}

absl::StatusOr<JobResult> RunJob(Backend& backend, const Job& job,
                                 const SolveControl& control) {
  return job.precision == Precision::kFloat64 ? RunTyped<double>(backend, job, control)
                                              : RunTyped<float>(backend, job, control);
}

}  // namespace trisolve::server
