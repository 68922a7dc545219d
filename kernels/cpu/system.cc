// Persistent systems on any backend: the host copy of the coefficients, their replication for
// many right-hand sides, and solves through the backend's one-shot calls.
#include "trisolve/system.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "trisolve/backend.h"
#include "trisolve/family.h"

namespace trisolve {
namespace {

template <typename T>
absl::StatusOr<SolveInfo> SolveOne(Backend& be, const SystemSpec& s, const T* rhs, T* x,
                                   SystemStatus* status, const SolveControl& control) {
  return Describe(s.family).ops<T>().solve(be, s, rhs, {}, x, status, control);
}

template <typename T>
double BackwardErrorOne(const SystemSpec& s, const T* rhs, const T* x, const SystemStatus* status) {
  const auto residual = Describe(s.family).ops<T>().backward_error;
  return residual != nullptr ? residual(s, rhs, {}, x, status)
                             : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

int64_t SystemSpec::coefficient_values(int i) const {
  const ArrayDescriptor& c = Describe(family).coefficient(i);
  if (c.role == ArrayRole::kParent) return parent_per_system ? batch * n : n;
  if (c.square) return batch * n * n;
  return rhs_values();
}

int64_t SystemSpec::coefficient_bytes(int i) const {
  return coefficient_values(i) * (Describe(family).coefficient(i).int32 ? 4 : elem_bytes());
}

int64_t SystemSpec::coefficient_total_bytes() const {
  int64_t t = 0;
  for (int i = 0; i < num_coefficients(); ++i) t += coefficient_bytes(i);
  return t;
}

PreparedSystem::PreparedSystem(const SystemSpec& spec) : spec_(spec) {
  host_.resize(size_t(spec.num_coefficients()));
  for (int i = 0; i < spec.num_coefficients(); ++i) {
    const auto* src = static_cast<const std::byte*>(spec.coefficients[size_t(i)]);
    host_[size_t(i)].assign(src, src + spec.coefficient_bytes(i));
    spec_.coefficients[size_t(i)] = host_[size_t(i)].data();
  }
  if (spec.variable()) {
    lengths_.assign(spec.lengths, spec.lengths + spec.batch);
    spec_.lengths = lengths_.data();
    spec_.longest = VariableOffsets(spec_.lengths, spec_.batch, &offsets_);
    spec_.offsets = offsets_.data();
  }
}

PreparedSystem::~PreparedSystem() {
  if (on_release_) on_release_();
}

int64_t PreparedSystem::bytes() const {
  int64_t t = 0;
  for (const auto& h : host_) t += int64_t(h.size());
  for (const auto& h : replicated_host_) t += int64_t(h.size());
  return t + int64_t(lengths_.size() * sizeof(int32_t) + offsets_.size() * sizeof(int64_t));
}

absl::Status PreparedSystem::Update(int i, const void* values) {
  if (i < 0 || i >= spec_.num_coefficients())
    return absl::InvalidArgumentError(absl::StrCat("no coefficient ", i));
  std::memcpy(host_[size_t(i)].data(), values, host_[size_t(i)].size());
  replicated_k_ = 0;
  replicated_host_.clear();
  return absl::OkStatus();
}

const SystemSpec& PreparedSystem::Replicated(int64_t k, Layout layout) {
  if (replicated_k_ == k && replicated_layout_ == layout) return replicated_;
  replicated_ = spec_;
  replicated_.batch = k;
  replicated_.layout = layout;
  replicated_host_.assign(size_t(spec_.num_coefficients()), {});
  const int64_t n = spec_.n, eb = spec_.elem_bytes();
  for (int i = 0; i < spec_.num_coefficients(); ++i) {
    if (Describe(spec_.family).coefficient(i).role == ArrayRole::kParent)
      continue;  // one tree for the batch
    auto& dst = replicated_host_[size_t(i)];
    dst.resize(size_t(k * n * eb));
    const std::byte* src = host_[size_t(i)].data();
    if (layout == Layout::kFlat) {
      for (int64_t j = 0; j < k; ++j) std::memcpy(dst.data() + j * n * eb, src, size_t(n * eb));
    } else {
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < k; ++j)
          std::memcpy(dst.data() + (r * k + j) * eb, src + r * eb, size_t(eb));
    }
    replicated_.coefficients[size_t(i)] = dst.data();
  }
  replicated_k_ = k;
  replicated_layout_ = layout;
  return replicated_;
}

absl::Status CheckSystemRange(const SystemSpec& s, int64_t first_system, int64_t systems) {
  if (first_system < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("first_system: ", first_system, " is negative"));
  if (systems < 0)
    return absl::InvalidArgumentError(absl::StrCat("systems: ", systems, " is negative"));
  if (systems == 0) {
    if (first_system != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "systems: 0 (the whole batch) with first_system ", first_system,
          "; give the number of systems of the range"));
    return absl::OkStatus();
  }
  if (s.family != Family::kTridiagonal && s.family != Family::kTree)
    return absl::InvalidArgumentError(
        absl::StrCat("first_system: a range of systems is solved for tridiagonal and tree "
                     "batches; this system is ",
                     FamilyName(s.family), " (solve it whole)"));
  if (s.variable())
    return absl::InvalidArgumentError(absl::StrCat(
        "first_system: a range of systems is solved for batches of one size; this batch's ",
        s.batch, " systems have different sizes (lengths): solve it whole"));
  if (s.layout != Layout::kFlat)
    return absl::InvalidArgumentError(
        "first_system: a range of systems needs a flat batch; this one is interleaved ([n, "
        "batch]: a range would be strided), solve it whole");
  if (first_system >= s.batch || systems > s.batch - first_system)
    return absl::InvalidArgumentError(absl::StrCat(
        first_system >= s.batch ? "first_system" : "systems", ": systems [", first_system, ", ",
        first_system + systems, ") lie outside the batch of ", s.batch, " systems"));
  return absl::OkStatus();
}

SystemSpec RangeOf(const SystemSpec& s, int64_t first, int64_t count) {
  SystemSpec r = s;
  r.batch = count;
  for (int i = 0; i < s.num_coefficients(); ++i) {
    const ArrayDescriptor& c = Describe(s.family).coefficient(i);
    if (c.role == ArrayRole::kParent && !s.parent_per_system) continue;
    const int64_t eb = c.int32 ? 4 : s.elem_bytes();
    r.coefficients[size_t(i)] =
        static_cast<const std::byte*>(s.coefficients[size_t(i)]) + first * s.n * eb;
  }
  return r;
}

template <typename T>
absl::StatusOr<SolveInfo> SolveThroughBackend(Backend& be, PreparedSystem& system, RhsBlock<T> rhs,
                                              T* x, SystemStatus* status,
                                              const SolveControl& control) {
  if (auto st = CheckSystemRange(system.spec(), rhs.first_system, rhs.systems); !st.ok())
    return st;
  const SystemSpec s = BlockSpec(system.spec(), rhs);
  if (rhs.k == 1) return SolveOne(be, s, rhs.rhs, x, status, control);
  if (Describe(s.family).replicates && system.spec().batch == 1 && !s.variable())
    return SolveOne(be, system.Replicated(rhs.k, rhs.layout), rhs.rhs, x, status, control);
  SolveInfo total;
  const int64_t block = s.rhs_values();
  for (int64_t j = 0; j < rhs.k; ++j) {
    auto info = SolveOne(be, s, rhs.rhs + j * block, x + j * block, status + j * s.batch, control);
    if (!info.ok()) return info.status();
    AccumulateSolveInfo(*info, j == 0, &total);
  }
  return total;
}

void AccumulateSolveInfo(const SolveInfo& block, bool first, SolveInfo* total) {
  if (first) {
    *total = block;
    return;
  }
  total->iterations = std::max(total->iterations, block.iterations);
  if (!(block.residual <= total->residual)) total->residual = block.residual;  // NaN stays
  total->h2d_us += block.h2d_us;
  total->kernel_us += block.kernel_us;
  total->d2h_us += block.d2h_us;
}

template <typename T>
double PreparedBackwardError(PreparedSystem& system, RhsBlock<T> rhs, const T* x,
                             const SystemStatus* status) {
  const SystemSpec s = BlockSpec(system.spec(), rhs);
  if (rhs.k == 1) return BackwardErrorOne(s, rhs.rhs, x, status);
  if (Describe(s.family).replicates && system.spec().batch == 1 && !s.variable())
    return BackwardErrorOne(system.Replicated(rhs.k, rhs.layout), rhs.rhs, x, status);
  double worst = std::numeric_limits<double>::quiet_NaN();  // NaN: no system was OK
  bool any = false;
  const int64_t block = s.rhs_values();
  for (int64_t j = 0; j < rhs.k; ++j) {
    bool any_ok = false;
    for (int64_t q = 0; q < s.batch; ++q) any_ok |= status[j * s.batch + q] == SystemStatus::kOk;
    if (!any_ok) continue;
    const double e = BackwardErrorOne(s, rhs.rhs + j * block, x + j * block, status + j * s.batch);
    // A NaN error (a non-finite answer) is kept: it must never read as a small one.
    if (!any || std::isnan(e) || e > worst) worst = std::isnan(worst) && any ? worst : e;
    any = true;
  }
  return worst;
}

#define TRISOLVE_INSTANTIATE(T)                                                               \
  template absl::StatusOr<SolveInfo> SolveThroughBackend<T>(Backend&, PreparedSystem&,        \
                                                            RhsBlock<T>, T*, SystemStatus*,   \
                                                            const SolveControl&);             \
  template double PreparedBackwardError<T>(PreparedSystem&, RhsBlock<T>, const T*,            \
                                           const SystemStatus*);
TRISOLVE_INSTANTIATE(double)
TRISOLVE_INSTANTIATE(float)
#undef TRISOLVE_INSTANTIATE

absl::StatusOr<std::unique_ptr<PreparedSystem>> Backend::Prepare(const SystemSpec& spec) {
  return std::make_unique<PreparedSystem>(spec);
}
absl::StatusOr<SolveInfo> Backend::SolvePrepared(PreparedSystem& system, RhsBlock<double> rhs,
                                                 double* x, SystemStatus* status,
                                                 const SolveControl& control) {
  return SolveThroughBackend(*this, system, rhs, x, status, control);
}
absl::StatusOr<SolveInfo> Backend::SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs,
                                                 float* x, SystemStatus* status,
                                                 const SolveControl& control) {
  return SolveThroughBackend(*this, system, rhs, x, status, control);
}
int64_t Backend::TridiagonalDeviceBytes(int64_t n, int64_t batch, Layout, int elem_bytes,
                                        TridiagonalMethod) const {
  return 5 * n * batch * elem_bytes;
}

absl::StatusOr<bool> Backend::PinHostMemory(void*, int64_t) { return false; }
void Backend::UnpinHostMemory(void*) {}
absl::StatusOr<void*> Backend::OpenDeviceMemory(const std::string&, int, int64_t, int64_t) {
  return absl::UnimplementedError(
      absl::StrCat("the ", Info().name, " backend has no CUDA device to map device memory on"));
}
void Backend::CloseDeviceMemory(void*) {}
absl::Status Backend::CopyFromDevice(void*, const void*, int64_t) {
  return absl::UnimplementedError(
      absl::StrCat("the ", Info().name, " backend holds no device memory"));
}

}  // namespace trisolve
