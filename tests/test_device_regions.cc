// CUDA memory regions through the server's core, without a GPU: a stand-in backend whose
// "device memory" is host memory kept PROT_NONE except while the backend itself reads or
// writes it, so that any read or write of it by the server on the host (a check, the
// residual, the batcher, a copy) kills the test. It checks what the core does with such
// regions: registration and its refusals, arrays and x left to the backend, the finiteness
// check left to the backend and a bad value still named by position (copied back), arrays the
// server must read copied to the host, other identities NOT_FOUND, and the mapping closed on
// unregister and on expiry. (The real CUDA IPC path: test_cuda_ipc on a GPU.)
#include <sys/mman.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "core.h"
#include "gtest/gtest.h"
#include "translate.h"
#include "trisolve/backend.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve::server {
namespace {

constexpr int64_t kDeviceBytes = int64_t{4} << 20;
const std::string kHandle(kCudaIpcHandleBytes, '\x42');

class StandInDevice final : public Backend {
 public:
  StandInDevice() : cpu_(MakeCpuBackend(1)) {
    mem_ = static_cast<std::byte*>(
        mmap(nullptr, kDeviceBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~StandInDevice() override { munmap(mem_, kDeviceBytes); }

  // The test's own access to the memory, as a client's kernels would have.
  struct Open {
    explicit Open(std::byte* m) : m_(m) { mprotect(m_, kDeviceBytes, PROT_READ | PROT_WRITE); }
    ~Open() { mprotect(m_, kDeviceBytes, PROT_NONE); }
    std::byte* m_;
  };
  std::byte* memory() const { return mem_; }
  bool Inside(const void* p) const {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= mem_ && b < mem_ + kDeviceBytes;
  }

  int opens = 0, closes = 0, device_solves = 0;

  BackendInfo Info() const override {
    BackendInfo info = cpu_->Info();
    info.name = "stand-in-device";
    info.checks_finite = true;
    return info;
  }
  absl::StatusOr<void*> OpenDeviceMemory(const std::string& handle, int device, int64_t offset,
                                         int64_t bytes) override {
    if (device != 0) return absl::InvalidArgumentError("device: not this backend's");
    if (handle != kHandle) return absl::InvalidArgumentError("handle: does not open");
    if (offset + bytes > kDeviceBytes) return absl::InvalidArgumentError("bytes: too many");
    ++opens;
    return mem_ + offset;
  }
  void CloseDeviceMemory(void* p) override {
    EXPECT_TRUE(Inside(p));
    ++closes;
  }
  absl::Status CopyFromDevice(void* host, const void* device, int64_t bytes) override {
    EXPECT_TRUE(Inside(device));
    Open o(mem_);
    std::memcpy(host, device, size_t(bytes));
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<SolveInfo> Tri(const TridiagonalProblem<T>& p, TridiagonalMethod m,
                                TridiagonalOutput<T> out, const SolveControl& c) {
    Open o(mem_);
    if (Inside(p.a) || Inside(p.d) || Inside(out.x)) ++device_solves;
    if (c.check_finite)
      for (const T* q : {p.a, p.b, p.c, p.d})
        for (int64_t i = 0; i < p.unknowns(); ++i)
          if (!std::isfinite(q[i])) return NonFiniteInputError();
    auto r = cpu_->Solve(p, m, out, c);
    if (r.ok()) r->inputs_checked = c.check_finite;
    return r;
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p, TridiagonalMethod m,
                                  TridiagonalOutput<double> out, const SolveControl& c) override {
    return Tri(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p, TridiagonalMethod m,
                                  TridiagonalOutput<float> out, const SolveControl& c) override {
    return Tri(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                  TreeOutput<double> out, const SolveControl& c) override {
    Open o(mem_);
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m,
                                  TreeOutput<float> out, const SolveControl& c) override {
    Open o(mem_);
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& bo, BlockOutput<double> out,
                                  const SolveControl& c) override {
    Open o(mem_);
    return cpu_->Solve(p, m, bo, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& bo, BlockOutput<float> out,
                                  const SolveControl& c) override {
    Open o(mem_);
    return cpu_->Solve(p, m, bo, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                  DenseOutput<double> out, const SolveControl& c) override {
    Open o(mem_);
    return cpu_->Solve(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                  DenseOutput<float> out, const SolveControl& c) override {
    Open o(mem_);
    return cpu_->Solve(p, m, out, c);
  }

 private:
  std::unique_ptr<Backend> cpu_;
  std::byte* mem_;
};

// batch x n float64 a, b, c, d in the region `region` from `offset`, one after the other.
v1::TridiagonalRequest InRegion(const std::string& region, int64_t offset, int64_t batch,
                                int64_t n, bool x_there) {
  v1::TridiagonalRequest r;
  r.set_dtype(v1::FLOAT64);
  int k = 0;
  for (v1::Array* a : {r.mutable_a(), r.mutable_b(), r.mutable_c(), r.mutable_d()}) {
    a->add_shape(batch);
    a->add_shape(n);
    a->mutable_region()->set_region(region);
    a->mutable_region()->set_offset(offset + k++ * batch * n * 8);
  }
  if (x_there) {
    r.mutable_x_region()->set_region(region);
    r.mutable_x_region()->set_offset(offset + 4 * batch * n * 8);
  }
  return r;
}

class DeviceRegions : public ::testing::Test {
 protected:
  static constexpr int64_t kBatch = 40, kN = 50, kE = kBatch * kN;
  DeviceRegions() {
    auto b = std::make_unique<StandInDevice>();
    dev_ = b.get();
    CoreOptions o;
    o.memory.default_ttl_s = 3600;
    core_ = std::make_unique<Core>(std::move(b), o);
    // a = c = -1, b = 4, d = 1 + the row's position in its system.
    StandInDevice::Open open(dev_->memory());
    auto* v = reinterpret_cast<double*>(dev_->memory());
    for (int64_t i = 0; i < kE; ++i) {
      v[i] = v[2 * kE + i] = -1;
      v[kE + i] = 4;
      v[3 * kE + i] = 1 + double(i % kN);
    }
  }
  Call MakeCall(const std::string& identity) {
    Call c("t", "Test");
    c.identity = identity;
    return c;
  }
  absl::StatusOr<RegionInfo> Register(const std::string& identity, const std::string& name,
                                      int64_t offset = 0, int64_t bytes = kDeviceBytes,
                                      const std::string& handle = kHandle, int device = 0,
                                      double ttl_s = 0) {
    Call c = MakeCall(identity);
    return core_->RegisterCudaMemory(c, name, handle, device, offset, bytes, ttl_s);
  }
  absl::StatusOr<Answer> Solve(const std::string& identity, const v1::TridiagonalRequest& r) {
    Call c = MakeCall(identity);
    RequestRegions regions = core_->Regions(identity);
    auto job = JobFromRequest(r, JobLimits(), DeclareOptions{.regions = &regions, .defer_finite = true});
    if (!job.ok()) return job.status();
    return core_->Solve(c, *job);
  }
  // x of the request InRegion(.., 0, kBatch, kN, true) wrote, read as the client would.
  std::vector<double> X(int64_t offset = 4 * kE * 8) {
    StandInDevice::Open open(dev_->memory());
    std::vector<double> x(static_cast<size_t>(kE));
    std::memcpy(x.data(), dev_->memory() + offset, size_t(kE) * 8);
    return x;
  }
  void Poke(int64_t index, double value) {
    StandInDevice::Open open(dev_->memory());
    reinterpret_cast<double*>(dev_->memory())[index] = value;
  }
  static double Residual(const std::vector<double>& x) {
    double worst = 0;
    for (int64_t s = 0; s < kBatch; ++s)
      for (int64_t k = 0; k < kN; ++k) {
        const double* xs = x.data() + s * kN;
        double r = 4 * xs[k] - (1 + double(k));
        if (k > 0) r -= xs[k - 1];
        if (k + 1 < kN) r -= xs[k + 1];
        worst = std::max(worst, std::abs(r));
      }
    return worst;
  }

  StandInDevice* dev_;
  std::unique_ptr<Core> core_;
};

TEST_F(DeviceRegions, RegistrationChecksEveryFieldAndTheBackendsAnswer) {
  auto bad = Register("alice", "r", 0, 4096, std::string(63, 'h'));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("handle: 63 bytes, expected 64"), std::string::npos);
  bad = Register("alice", "r", 0, 4096, kHandle, 1);  // the backend's own refusal
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("device"), std::string::npos);
  bad = Register("alice", "r", 0, 4096, std::string(64, 'x'));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  bad = Register("alice", "r", 0, -1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_EQ(dev_->opens, 0);
  auto ok = Register("alice", "r");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->device, 0);
  EXPECT_FALSE(ok->server_owned);
  EXPECT_FALSE(ok->pinned);
  EXPECT_EQ(Register("alice", "r").status().code(), absl::StatusCode::kAlreadyExists);
  // The transport's host reads and writes (ReadMemory, WriteMemory) refuse it.
  Call c = MakeCall("alice");
  auto found = core_->FindRegion(c, "r");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition) << found.status();
}

TEST_F(DeviceRegions, ArraysAndXStayWithTheBackendAndNoResidualIsComputedOnTheHost) {
  ASSERT_TRUE(Register("alice", "r").ok());
  auto a = Solve("alice", InRegion("r", 0, kBatch, kN, true));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(dev_->device_solves, 1);
  EXPECT_EQ(a->summary.outcomes[0], kBatch);
  EXPECT_TRUE(a->result.x.empty());
  EXPECT_TRUE(std::isnan(a->summary.residual));
  EXPECT_LT(Residual(X()), 1e-12);
  // x in host memory (the answer) from device arrays: the backend writes it, the host sends it.
  auto b = Solve("alice", InRegion("r", 0, kBatch, kN, false));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->result.x.size(), size_t(kE) * 8);
  std::vector<double> xb(static_cast<size_t>(kE));
  std::memcpy(xb.data(), b->result.x.data(), b->result.x.size());
  EXPECT_EQ(xb, X());
  // Another identity: NOT_FOUND, the region untouched.
  auto bob = Solve("bob", InRegion("r", 0, kBatch, kN, true));
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kNotFound) << bob.status();
  // Bounds and alignment as for host memory.
  auto odd = Solve("alice", InRegion("r", 4, kBatch, kN, true));
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument) << odd.status();
  auto past = Solve("alice", InRegion("r", kDeviceBytes - 1024, kBatch, kN, true));
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument) << past.status();
}

TEST_F(DeviceRegions, ANonFiniteValueInDeviceMemoryIsNamedByPosition) {
  ASSERT_TRUE(Register("alice", "r").ok());
  Poke(kE + 3 * kN + 7, std::numeric_limits<double>::quiet_NaN());  // b[3][7]
  auto a = Solve("alice", InRegion("r", 0, kBatch, kN, true));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_NE(a.status().message().find("b[3][7] is NaN"), std::string::npos) << a.status();
  Poke(kE + 3 * kN + 7, 4);
  EXPECT_TRUE(Solve("alice", InRegion("r", 0, kBatch, kN, true)).ok());
}

TEST_F(DeviceRegions, OneMatrixForManyRightHandSidesIsCheckedOnTheHostWithXOnTheDevice) {
  ASSERT_TRUE(Register("alice", "r").ok());
  // a, b, c of one system (the first kN values of each array), d of kBatch systems.
  v1::TridiagonalRequest r = InRegion("r", 0, kBatch, kN, true);
  for (v1::Array* a : {r.mutable_a(), r.mutable_b(), r.mutable_c()}) {
    a->clear_shape();
    a->add_shape(kN);
  }
  auto a = Solve("alice", r);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->summary.right_hand_sides, kBatch);
  EXPECT_LT(Residual(X()), 1e-12);
  // Its coefficients go through Prepare, which checks nothing: a NaN there is found on the
  // host, x in device memory or not.
  Poke(kE + 7, std::numeric_limits<double>::quiet_NaN());
  auto bad = Solve("alice", r);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("b[7] is NaN"), std::string::npos) << bad.status();
}

TEST_F(DeviceRegions, PersistentSystemsCopyTheCoefficientsAndSolveTheRightHandSideInPlace) {
  ASSERT_TRUE(Register("alice", "r").ok());
  Call c = MakeCall("alice");
  RequestRegions regions = core_->Regions("alice");
  v1::CreateSystemRequest cr;
  *cr.mutable_tridiagonal() = InRegion("r", 0, kBatch, kN, false);
  cr.mutable_tridiagonal()->clear_d();
  auto job = JobFromCreateSystem(cr, JobLimits(), &regions);
  ASSERT_TRUE(job.ok()) << job.status();
  auto sys = core_->CreateSystem(c, *job, "", 0);  // the base Prepare copies on the host
  ASSERT_TRUE(sys.ok()) << sys.status();

  StepRequest step;
  step.handle = sys->handle;
  step.rhs.shape = {kBatch, kN};
  step.rhs.in_region = true;
  step.rhs.region = {"r", 3 * kE * 8, 0};
  step.has_x_region = true;
  step.x_region = {"r", 4 * kE * 8, 0};
  // An update of b in device memory (copied to the host to be checked): b = 4 again.
  ArrayArg upd;
  upd.shape = {kBatch, kN};
  upd.in_region = true;
  upd.region = {"r", kE * 8, 0};
  step.updates.push_back({"b", upd});
  Call s = MakeCall("alice");
  auto a = core_->SolveSystem(s, step);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(std::isnan(a->summary.residual));
  EXPECT_LT(Residual(X()), 1e-12);
  // A NaN in the device right-hand side: named.
  Poke(3 * kE + 2 * kN + 1, std::numeric_limits<double>::infinity());
  Call s2 = MakeCall("alice");
  StepRequest step2;
  step2.handle = sys->handle;
  step2.rhs = step.rhs;
  step2.has_x_region = true;
  step2.x_region = step.x_region;
  auto bad = core_->SolveSystem(s2, step2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("rhs[2][1] is Inf"), std::string::npos) << bad.status();
}

TEST_F(DeviceRegions, TheMappingClosesOnUnregisterAndOnExpiry) {
  ASSERT_TRUE(Register("alice", "r").ok());
  ASSERT_TRUE(Register("alice", "short", 0, 4096, kHandle, 0, 0.01).ok());
  EXPECT_EQ(dev_->opens, 2);
  Call c = MakeCall("alice");
  ASSERT_TRUE(core_->UnregisterMemory(c, "r").ok());
  EXPECT_EQ(dev_->closes, 1);
  auto gone = Solve("alice", InRegion("r", 0, kBatch, kN, true));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  // The sweeper runs every second.
  for (int i = 0; i < 50 && dev_->closes < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(dev_->closes, 2);
  EXPECT_TRUE(core_->ListMemory(c).empty());
}

}  // namespace
}  // namespace trisolve::server
