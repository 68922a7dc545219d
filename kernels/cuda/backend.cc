// The CUDA backend: requests are staged through pooled pinned buffers into pooled device
// buffers on one of several streams, solved by the family's kernels, and copied back. Families
// without CUDA kernels yet are solved by the CPU reference on the host, and the method name
// says so ("... (host)").
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "block/block.h"
#include "dense/dense.h"
#include "dense/dispatch.h"
#include "runtime/check.h"
#include "runtime/device_health.h"
#include "runtime/memory_pool.h"
#include "runtime/pinned_word.h"
#include "staging.h"
#include "tree/dispatch.h"
#include "tree/plan_cache.h"
#include "tree/tree.h"
#include "tridiagonal/tridiagonal.h"
#include "tridiagonal/variable.h"
#include "tuning_table.h"
#include "trisolve/backend.h"
#include "trisolve/fault_injection.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/reference/dense.h"
#include "trisolve/reference/tree.h"
#include "trisolve/reference/tridiagonal.h"

namespace trisolve {
namespace {

using cuda::Pool;

class CudaBackend final : public Backend {
  // One input array of a solve: staged from the host, or already on the device (a prepared
  // system's coefficients).
  template <typename T>
  using Input = cuda::StagedInput<T>;
  // A prepared system's coefficients on the device, by SystemSpec index (nullptr: stage).
  template <typename T>
  using Resident = std::array<const T*, kMaxCoefficients>;
  template <typename T>
  static void MarkResident(std::vector<Input<T>>& in, const Resident<T>* resident) {
    if (resident == nullptr) return;
    for (size_t i = 0; i < in.size() && i < resident->size(); ++i) in[i].device = (*resident)[i];
  }

 public:
  CudaBackend(const CudaOptions& o, const cudaDeviceProp& prop, int64_t device_cap)
      : options_(o),
        prop_(prop),
        tuning_(cuda::TuningTable::For(prop)),
        device_pool_(Pool::Kind::kDevice, o.device, device_cap),
        pinned_pool_(Pool::Kind::kPinnedHost, o.device, o.pinned_pool_cap_bytes),
        cpu_(MakeCpuBackend(o.cpu_threads)),
        stager_(o.device, o.streams, device_pool_, pinned_pool_) {}
  ~CudaBackend() override {
    dense_libs_.Reset();  // the handles use the lanes' streams (stager_, destroyed after)
  }

  BackendInfo Info() const override {
    BackendInfo info = cpu_->Info();
    info.name = "cuda";
    info.checks_finite = true;
    DeviceInfo d;
    d.name = prop_.name;
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(options_.device);
    cudaMemGetInfo(&free_b, &total_b);
    d.total_memory_bytes = int64_t(total_b);
    d.free_memory_bytes = int64_t(free_b);
    d.compute_capability_major = prop_.major;
    d.compute_capability_minor = prop_.minor;
    d.multiprocessors = prop_.multiProcessorCount;
    d.ordinal = options_.device;
    info.devices.push_back(d);
    for (auto [name, pool] : {std::pair{"device", &device_pool_}, {"pinned-host", &pinned_pool_}}) {
      const cuda::PoolStats s = pool->Stats();
      info.pools.push_back({name, s.cap_bytes, s.cached_bytes, s.in_use_bytes, s.peak_bytes,
                            s.hits, s.misses, s.evictions});
    }
    return info;
  }

  absl::Status Health() const override { return cuda::ProbeDevice(options_.device); }

  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p, TridiagonalMethod m,
                                  TridiagonalOutput<double> out, const SolveControl& c) override {
    if (ClientDevice(p, out.x) && !TriOnDeviceOnly(p, m)) return ThroughHost(p, m, out, c);
    if (OnHost(m == TridiagonalMethod::kAuto, p.unknowns())) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    if (p.variable() || p.unified()) return SolveTriVariable(p, m, out, c);
    return SolveTri(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p, TridiagonalMethod m,
                                  TridiagonalOutput<float> out, const SolveControl& c) override {
    if (ClientDevice(p, out.x) && !TriOnDeviceOnly(p, m)) return ThroughHost(p, m, out, c);
    if (OnHost(m == TridiagonalMethod::kAuto, p.unknowns())) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    if (p.variable() || p.unified()) return SolveTriVariable(p, m, out, c);
    return SolveTri(p, m, out, c);
  }

  absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                  DenseOutput<double> out, const SolveControl& c) override {
    UseDevice();
    return SolveDenseOnDevice(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                  DenseOutput<float> out, const SolveControl& c) override {
    UseDevice();
    return SolveDenseOnDevice(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                  TreeOutput<double> out, const SolveControl& c) override {
    if (ClientDevice(p, out.x) && !TreeMayStayOnDevice(p, m)) return ThroughHost(p, m, out, c);
    if (OnHost(m == TreeMethod::kAuto, p.batch * p.n)) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    return SolveTreeOnDevice(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m,
                                  TreeOutput<float> out, const SolveControl& c) override {
    if (ClientDevice(p, out.x) && !TreeMayStayOnDevice(p, m)) return ThroughHost(p, m, out, c);
    if (OnHost(m == TreeMethod::kAuto, p.batch * p.n)) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    return SolveTreeOnDevice(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& c) override {
    if (ClientDevice(p, out.y)) return ThroughHost(p, m, o, out, c);
    UseDevice();
    return SolveBlockOnDevice(p, m, o, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& c) override {
    if (ClientDevice(p, out.y)) return ThroughHost(p, m, o, out, c);
    UseDevice();
    return SolveBlockOnDevice(p, m, o, out, c);
  }

  absl::StatusOr<bool> PinHostMemory(void* p, int64_t bytes) override {
    return stager_.Pin(p, bytes);
  }
  void UnpinHostMemory(void* p) override { stager_.Unpin(p); }

  absl::StatusOr<void*> OpenDeviceMemory(const std::string& handle, int device, int64_t offset,
                                         int64_t bytes) override {
    if (device != options_.device)
      return absl::InvalidArgumentError(absl::StrCat(
          "device: ", device, " is not a device this server drives (CUDA device ",
          options_.device, ")"));
    return stager_.OpenIpc(handle, offset, bytes);
  }
  void CloseDeviceMemory(void* p) override { stager_.CloseIpc(p); }
  absl::Status CopyFromDevice(void* host, const void* device, int64_t bytes) override {
    if (!stager_.OnDevice(device, bytes))
      return absl::InvalidArgumentError("CopyFromDevice: not memory OpenDeviceMemory opened");
    UseDevice();
    return cuda::CudaStatus(cudaMemcpy(host, device, size_t(bytes), cudaMemcpyDefault),
                            "cudaMemcpy (device region to host)");
  }

  absl::StatusOr<std::unique_ptr<PreparedSystem>> Prepare(const SystemSpec& given) override {
    UseDevice();
    // Coefficients in a client's device memory: the prepared system keeps a host copy of its
    // own (the base's), so they cross once here.
    SystemSpec spec = given;
    HostCopies copies(stager_);
    for (int i = 0; i < spec.num_coefficients(); ++i)
      if (auto st = copies.In(spec.coefficients[size_t(i)], spec.coefficient_bytes(i)); !st.ok())
        return st;
    auto system = std::make_unique<DevicePrepared>(spec, this);
    const SystemSpec& s = system->spec();
    int64_t total = 0;
    for (int i = 0; i < s.num_coefficients(); ++i) {
      system->offset[size_t(i)] = total;
      if (!IsTreeParent(s, i)) total += RoundUp(s.coefficient_bytes(i));
    }
    auto dev = device_pool_.Get(std::max<int64_t>(total, 256));
    if (!dev.ok()) return dev.status();
    system->device = *std::move(dev);
    for (int i = 0; i < s.num_coefficients(); ++i)
      if (auto st = system->Upload(i); !st.ok()) return st;
    return std::unique_ptr<PreparedSystem>(std::move(system));
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<double> rhs, double* x,
                                          SystemStatus* status, const SolveControl& c) override {
    UseDevice();
    if (ClientDeviceRhs(system, rhs, x) && !PreparedOnDeviceOnly(system, rhs.k))
      return PreparedThroughHost(system, rhs, x, status, c);
    return SolvePreparedOnDevice(system, rhs, x, status, c);
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs, float* x,
                                          SystemStatus* status, const SolveControl& c) override {
    UseDevice();
    if (ClientDeviceRhs(system, rhs, x) && !PreparedOnDeviceOnly(system, rhs.k))
      return PreparedThroughHost(system, rhs, x, status, c);
    return SolvePreparedOnDevice(system, rhs, x, status, c);
  }

 private:
  // Every call starts on this backend's device, whichever device the calling thread used last:
  // the kernels, the cable plans and the cuBLAS handles use the current device.
  void UseDevice() const { cudaSetDevice(options_.device); }
  static bool IsTreeParent(const SystemSpec& s, int i) { return s.family == Family::kTree && i == 3; }
  static int64_t RoundUp(int64_t bytes) { return (bytes + 255) / 256 * 256; }

  // A prepared system on the device: its coefficients in one pooled buffer (the tree's parent
  // array stays on the host: the cable plan, cached by content, is built from it), and for k
  // right-hand sides of a system of one, the coefficients replicated k times, kept until the
  // next update or another k.
  class DevicePrepared final : public PreparedSystem {
   public:
    DevicePrepared(const SystemSpec& spec, CudaBackend* backend)
        : PreparedSystem(spec), backend_(backend) {}
    int64_t bytes() const override {
      return PreparedSystem::bytes() + device.size() + replicated.size();
    }
    std::string prepared() const override {
      return absl::StrCat("coefficients on CUDA device ", backend_->options_.device);
    }
    const Backend* holder() const override { return backend_; }
    absl::Status Update(int i, const void* values) override {
      HostCopies copies(backend_->stager_);
      if (auto st = copies.In(values, spec_.coefficient_bytes(i)); !st.ok()) return st;
      if (auto st = PreparedSystem::Update(i, values); !st.ok()) return st;
      replicated.Release();
      replicated_k = 0;
      return Upload(i);
    }
    absl::Status Upload(int i) {
      if (IsTreeParent(spec_, i)) return absl::OkStatus();
      return backend_->stager_.CopyToDevice(host_[size_t(i)].data(), device.as<std::byte>() + offset[size_t(i)],
                                    int64_t(host_[size_t(i)].size()));
    }
    template <typename T>
    Resident<T> ResidentOf(const cuda::Pool::Buffer& buf, const std::array<int64_t, kMaxCoefficients>& off) const {
      Resident<T> r{};
      for (int i = 0; i < spec_.num_coefficients(); ++i)
        if (!IsTreeParent(spec_, i))
          r[size_t(i)] = reinterpret_cast<const T*>(buf.as<const std::byte>() + off[size_t(i)]);
      return r;
    }

    cuda::Pool::Buffer device;
    std::array<int64_t, kMaxCoefficients> offset{};
    cuda::Pool::Buffer replicated;
    std::array<int64_t, kMaxCoefficients> replicated_offset{};
    int64_t replicated_k = 0;
    Layout replicated_layout = Layout::kFlat;

   private:
    CudaBackend* backend_;
  };

  // The coefficients of a system of one replicated for k right-hand sides in `layout`, by
  // doubling device-to-device copies (log2 k of them): [k, n] flat, or [n, k] interleaved.
  absl::Status Replicate(DevicePrepared& s, int64_t k, Layout layout) {
    if (s.replicated_k == k && s.replicated_layout == layout) return absl::OkStatus();
    const SystemSpec& spec = s.spec();
    const int64_t n = spec.n, eb = spec.elem_bytes();
    int64_t total = 0;
    for (int i = 0; i < spec.num_coefficients(); ++i) {
      s.replicated_offset[size_t(i)] = total;
      if (!IsTreeParent(spec, i)) total += RoundUp(k * n * eb);
    }
    s.replicated.Release();
    s.replicated_k = 0;
    auto buf = device_pool_.Get(std::max<int64_t>(total, 256));
    if (!buf.ok()) return buf.status();
    cudaSetDevice(options_.device);
    const cuda::Stager::LaneLease lease(&stager_);
    cudaStream_t stream = lease.lane().stream;
    for (int i = 0; i < spec.num_coefficients(); ++i) {
      if (IsTreeParent(spec, i)) continue;
      const auto* src = s.device.as<const std::byte>() + s.offset[size_t(i)];
      auto* dst = buf->as<std::byte>() + s.replicated_offset[size_t(i)];
      if (auto st = cuda::ReplicateOnDevice(src, dst, n, eb, k, layout, stream); !st.ok())
        return st;
    }
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    s.replicated = *std::move(buf);
    s.replicated_k = k;
    s.replicated_layout = layout;
    return absl::OkStatus();
  }

  // One right-hand side block of a prepared system: the family's solve with the coefficients
  // read from the device (`resident`) and the host copy (`hs`) for the host paths.
  template <typename T>
  absl::StatusOr<SolveInfo> SolveResident(const SystemSpec& hs, const Resident<T>& resident,
                                          const T* rhs, T* x, SystemStatus* status,
                                          const SolveControl& c) {
    switch (hs.family) {
      case Family::kTridiagonal:
        return SolveTri(TridiagonalOf(hs, rhs), TridiagonalMethod(hs.method),
                        TridiagonalOutput<T>{x, status}, c, &resident);
      case Family::kTree:
        return SolveTreeOnDevice(TreeOf(hs, rhs), TreeMethod(hs.method), TreeOutput<T>{x, status},
                                 c, &resident);
      case Family::kBlockTridiagonal:
        return SolveBlockOnDevice(BlockOf(hs, rhs), BlockMethod(hs.method), hs.block_options,
                                  BlockOutput<T>{x, status}, c, &resident);
      case Family::kDense:
        return SolveDenseOnDevice(DenseOf(hs, rhs), DenseMethod(hs.method),
                                  DenseOutput<T>{x, status}, c, &resident);
    }
    return absl::InternalError("unknown family");
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolvePreparedOnDevice(PreparedSystem& system, RhsBlock<T> rhs, T* x,
                                                  SystemStatus* status, const SolveControl& c) {
    auto* dp = dynamic_cast<DevicePrepared*>(&system);
    if (system.holder() != nullptr && system.holder() != this)
      return absl::FailedPreconditionError(
          "the system was prepared by another backend: its coefficients are on another device");
    const SystemSpec& s = system.spec();
    // The smallest by handle go where the one-shot calls send them (Solve: the host for auto).
    const bool small = s.method == 0 && rhs.k * s.rhs_values() < options_.host_below_unknowns &&
                       (s.family == Family::kTridiagonal || s.family == Family::kTree);
    if (dp == nullptr || small) return SolveThroughBackend(*this, system, rhs, x, status, c);
    if (rhs.k == 1)
      return SolveResident(s, dp->ResidentOf<T>(dp->device, dp->offset), rhs.rhs, x, status, c);
    if ((s.family == Family::kTridiagonal || s.family == Family::kTree) && s.batch == 1) {
      if (auto st = Replicate(*dp, rhs.k, rhs.layout); !st.ok()) return st;
      return SolveResident(dp->Replicated(rhs.k, rhs.layout),
                           dp->ResidentOf<T>(dp->replicated, dp->replicated_offset), rhs.rhs, x,
                           status, c);
    }
    const Resident<T> resident = dp->ResidentOf<T>(dp->device, dp->offset);
    SolveInfo total;
    const int64_t block = s.rhs_values();
    for (int64_t j = 0; j < rhs.k; ++j) {
      auto info = SolveResident(s, resident, rhs.rhs + j * block, x + j * block,
                                status + j * s.batch, c);
      if (!info.ok()) return info.status();
      AccumulateSolveInfo(*info, j == 0, &total);
    }
    return total;
  }

  // ---- arrays in a client's device memory (OpenDeviceMemory) -------------------------------
  // Where every read and write of them happens on the device (Staged takes them in place),
  // a call goes as it would; a path that reads them on the host (auto's smallest requests,
  // the host's pivoting and second solves, the tree family's host paths, the block-tridiagonal
  // family and every prepared system but tridiagonal and dense ones) gets host copies instead,
  // and x is copied to the device after.
  class HostCopies {
   public:
    explicit HostCopies(const cuda::Stager& s) : s_(s) {}
    HostCopies(const HostCopies&) = delete;
    HostCopies& operator=(const HostCopies&) = delete;
    // Replaces p, if it lies in device memory, by a host copy of its `bytes`.
    template <typename P>
    absl::Status In(P*& p, int64_t bytes) {
      if (p == nullptr || !s_.OnDevice(p, bytes)) return absl::OkStatus();
      std::byte* h = Buffer(bytes);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(h, p, size_t(bytes), cudaMemcpyDefault));
      p = reinterpret_cast<P*>(h);
      return absl::OkStatus();
    }
    // Replaces x, if it lies in device memory, by host memory copied there by Finish.
    template <typename T>
    void Out(T*& x, int64_t bytes) {
      if (x == nullptr || !s_.OnDevice(x, bytes)) return;
      std::byte* h = Buffer(bytes);
      outs_.push_back({x, h, bytes});
      x = reinterpret_cast<T*>(h);
    }
    absl::Status Finish() {
      for (const auto& o : outs_)
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(o.device, o.host, size_t(o.bytes), cudaMemcpyDefault));
      return absl::OkStatus();
    }

   private:
    std::byte* Buffer(int64_t bytes) {
      bufs_.emplace_back(new std::byte[size_t(bytes)]);
      return bufs_.back().get();
    }
    struct OutCopy {
      void* device;
      const std::byte* host;
      int64_t bytes;
    };
    const cuda::Stager& s_;
    std::vector<std::unique_ptr<std::byte[]>> bufs_;
    std::vector<OutCopy> outs_;
  };

  template <typename T>
  bool OnDevice(const T* p, int64_t values) const {
    return p != nullptr && stager_.OnDevice(p, values * int64_t(sizeof(T)));
  }
  template <typename T>
  bool ClientDevice(const TridiagonalProblem<T>& p, const T* x) const {
    const int64_t e = p.unknowns();
    return OnDevice(p.a, p.unified() ? 3 * e : e) || (!p.unified() && (OnDevice(p.b, e) || OnDevice(p.c, e))) ||
           OnDevice(p.d, e) || OnDevice(x, e);
  }
  template <typename T>
  bool ClientDevice(const TreeProblem<T>& p, const T* x) const {
    const int64_t e = p.batch * p.n;
    return OnDevice(p.lower, e) || OnDevice(p.upper, e) || OnDevice(p.diag, e) ||
           OnDevice(p.rhs, e) || OnDevice(x, e) ||
           OnDevice(p.parent, p.parent_per_system ? e : p.n);
  }
  template <typename T>
  bool ClientDevice(const BlockTridiagonalProblem<T>& p, const T* y) const {
    const int64_t e = p.N * p.M;
    for (const T* q : {p.aC, p.cC, p.bC, p.cA, p.cB, p.f, p.y0, y})
      if (OnDevice(q, e)) return true;
    return false;
  }
  template <typename T>
  bool ClientDeviceRhs(const PreparedSystem& system, const RhsBlock<T>& rhs, const T* x) const {
    const int64_t values = rhs.k * system.spec().rhs_values();
    return OnDevice(rhs.rhs, values) || OnDevice(x, values);
  }
  // A tridiagonal call that reads and writes its arrays on the device only: not auto's
  // smallest (the host's), not the host's pivoting or auto's second solve below a warp's
  // worth of systems, not the variable-size or unified forms (their auto re-solves on the host).
  bool TriOnDeviceOnly(int64_t batch, int64_t unknowns, TridiagonalMethod m, bool variable) const {
    if (variable || OnHost(m == TridiagonalMethod::kAuto, unknowns)) return false;
    return batch >= cuda::kPivotingDeviceBatch ||
           (m != TridiagonalMethod::kAuto && m != TridiagonalMethod::kPivoting);
  }
  template <typename T>
  bool TriOnDeviceOnly(const TridiagonalProblem<T>& p, TridiagonalMethod m) const {
    return TriOnDeviceOnly(p.batch, p.unknowns(), m, p.variable() || p.unified());
  }
  // A tree call whose values the device paths read in place (the parent array, read on the
  // host for the plan, must be host memory); SolveTreeOnDevice sends a call whose path turns
  // out to be the host's through host copies.
  template <typename T>
  bool TreeMayStayOnDevice(const TreeProblem<T>& p, TreeMethod m) const {
    return !OnHost(m == TreeMethod::kAuto, p.batch * p.n) &&
           !OnDevice(p.parent, p.parent_per_system ? p.batch * p.n : p.n);
  }
  bool PreparedOnDeviceOnly(const PreparedSystem& system, int64_t k) const {
    const SystemSpec& s = system.spec();
    if (dynamic_cast<const DevicePrepared*>(&system) == nullptr) return false;
    if (s.family == Family::kDense) return true;
    if (s.family != Family::kTridiagonal) return false;
    const auto m = TridiagonalMethod(s.method);
    // (SolvePreparedOnDevice: k right-hand sides of one system are one batch of k; of several,
    // k calls of the system's batch. The smallest go through the host, as OnHost's.)
    const int64_t batch = s.batch == 1 && k > 1 ? k : s.batch;
    if (s.method == 0 && k * s.rhs_values() < options_.host_below_unknowns) return false;
    return batch >= cuda::kPivotingDeviceBatch ||
           (m != TridiagonalMethod::kAuto && m != TridiagonalMethod::kPivoting);
  }

  template <typename T>
  absl::StatusOr<SolveInfo> ThroughHost(TridiagonalProblem<T> p, TridiagonalMethod m,
                                        TridiagonalOutput<T> out, const SolveControl& c) {
    HostCopies h(stager_);
    const int64_t e = p.unknowns(), eb = int64_t(sizeof(T));
    if (p.unified()) {
      if (auto st = h.In(p.a, 3 * e * eb); !st.ok()) return st;
      p.b = p.a + 1;
      p.c = p.a + 2;
    } else {
      for (const T** q : {&p.a, &p.b, &p.c})
        if (auto st = h.In(*q, e * eb); !st.ok()) return st;
    }
    if (auto st = h.In(p.d, e * eb); !st.ok()) return st;
    h.Out(out.x, e * eb);
    auto r = Solve(p, m, out, c);
    if (r.ok())
      if (auto st = h.Finish(); !st.ok()) return st;
    return r;
  }
  template <typename T>
  absl::StatusOr<SolveInfo> ThroughHost(TreeProblem<T> p, TreeMethod m, TreeOutput<T> out,
                                        const SolveControl& c) {
    HostCopies h(stager_);
    const int64_t e = p.batch * p.n, eb = int64_t(sizeof(T));
    for (const T** q : {&p.lower, &p.upper, &p.diag, &p.rhs})
      if (auto st = h.In(*q, e * eb); !st.ok()) return st;
    if (auto st = h.In(p.parent, (p.parent_per_system ? e : p.n) * 4); !st.ok()) return st;
    h.Out(out.x, e * eb);
    auto r = Solve(p, m, out, c);
    if (r.ok())
      if (auto st = h.Finish(); !st.ok()) return st;
    return r;
  }
  template <typename T>
  absl::StatusOr<SolveInfo> ThroughHost(BlockTridiagonalProblem<T> p, BlockMethod m,
                                        const BlockOptions& o, BlockOutput<T> out,
                                        const SolveControl& c) {
    HostCopies h(stager_);
    const int64_t eb = p.N * p.M * int64_t(sizeof(T));
    for (const T** q : {&p.aC, &p.cC, &p.bC, &p.cA, &p.cB, &p.f, &p.y0})
      if (auto st = h.In(*q, eb); !st.ok()) return st;
    h.Out(out.y, eb);
    auto r = Solve(p, m, o, out, c);
    if (r.ok())
      if (auto st = h.Finish(); !st.ok()) return st;
    return r;
  }
  template <typename T>
  absl::StatusOr<SolveInfo> PreparedThroughHost(PreparedSystem& system, RhsBlock<T> rhs, T* x,
                                                SystemStatus* status, const SolveControl& c) {
    HostCopies h(stager_);
    const int64_t bytes = rhs.k * system.spec().rhs_values() * int64_t(sizeof(T));
    if (auto st = h.In(rhs.rhs, bytes); !st.ok()) return st;
    h.Out(x, bytes);
    auto r = SolvePreparedOnDevice(system, rhs, x, status, c);
    if (r.ok())
      if (auto st = h.Finish(); !st.ok()) return st;
    return r;
  }

  // auto sends the linear-time families' smallest requests to the host, where a system of 64
  // unknowns takes a microsecond against hundreds through the copies and a launch (issue 31;
  // docs/kernels/README.md, "Tuning evidence", OnHost).
  bool OnHost(bool is_auto, int64_t unknowns) const {
    return is_auto && unknowns < options_.host_below_unknowns;
  }
  static absl::StatusOr<SolveInfo> Host(absl::StatusOr<SolveInfo> r) {
    if (r.ok()) r->method += " (host)";
    return r;
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveTri(const TridiagonalProblem<T>& p, TridiagonalMethod m,
                                     TridiagonalOutput<T> out, const SolveControl& c,
                                     const Resident<T>* resident = nullptr) {
    const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
    // The pivoting kernel runs a thread a system: below a warp's worth of systems each system
    // is a sequential sweep at one GPU thread's pace, slower than the host's, so `pivoting`
    // and auto's second solve stay on the host there (docs/kernels/tridiagonal.md, "Partial
    // pivoting").
    const bool pivot_on_device = p.batch >= cuda::kPivotingDeviceBatch;
    if (m == TridiagonalMethod::kPivoting && !pivot_on_device)
      return Host(cpu::SolveTridiagonal(p, m, out));
    const int64_t e = p.batch * p.n;
    cuda::LaterAnswer later;
    // auto: every system whose pivot vanished on the device is solved again by partial
    // pivoting, on the device (its checkpoints and the mapped count held until Staged's wait),
    // so a nonsingular system never comes back SINGULAR.
    const bool resolve_on_device = m == TridiagonalMethod::kAuto && pivot_on_device;
    Pool::Buffer pivot_scratch;
    cuda::PinnedWord pivot_count;
    cuda::PivotResolve resolve;
    if (resolve_on_device) {
      auto scratch = device_pool_.Get(cuda::PivotingScratchBytes(p.n, p.batch, sizeof(T) == 4));
      if (!scratch.ok()) return scratch.status();
      pivot_scratch = *std::move(scratch);
      auto word = cuda::PinnedWord::Take();
      if (!word.ok()) return word.status();
      pivot_count = *std::move(word);
      pivot_count.get()[0] = 0;
      resolve = {pivot_scratch.get(), pivot_count.mapped(), pivot_count.get()};
    }
    std::vector<Input<T>> in = {{p.a, e}, {p.b, e}, {p.c, e}, {p.d, e}};
    MarkResident(in, resident);
    auto solved = stager_.Staged<T>(in, p.batch, p.n, p.layout, out.x,
                     out.status,
                     [&](const std::vector<T*>& d, T* dx, uint8_t* flags, cudaStream_t stream,
                         int64_t systems) -> absl::StatusOr<std::string> {
                       // systems < p.batch: a piece of a pipelined solve (staging.h), waited
                       // for here; the copy back of the piece before runs meanwhile. The
                       // pieces share the second solve's scratch (one after the other on the
                       // stream) and its count.
                       TridiagonalProblem<T> dp{systems, p.n, p.layout, d[0], d[1], d[2], d[3]};
                       auto k = cuda::SolveTridiagonalDevice(
                           dp, m, dx, flags, device_pool_, stream,
                           systems == p.batch ? &later : nullptr,
                           resolve_on_device ? &resolve : nullptr);
                       if (!k.ok()) return k.status();
                       return std::string(cuda::KernelName(*k));
                     },
                     &later, c.check_finite);
    if (solved.ok() && resolve_on_device && pivot_count.get()[0] > 0)
      solved->method += " + pivoting (" + std::to_string(pivot_count.get()[0]) + " systems)";
    // (below a warp's worth of systems: on the host, from the host arrays)
    if (solved.ok() && m == TridiagonalMethod::kAuto && !resolve_on_device)
      cpu::ResolveSingularWithPivoting(p, out, &*solved);
    return solved;
  }

  // A variable-size batch (p.offsets) or one in the unified-vector layout (p.unified(), a
  // uniform one given offsets s * n): the variable kernel for auto and partitioned, reading
  // the rows as they are staged (abc in place: no transpose anywhere), after its plan
  // (variable.h), which goes first so that its int64 offsets are aligned whatever the arrays'
  // length (16 bytes a unit, for a's loads).
  template <typename T>
  absl::StatusOr<SolveInfo> SolveTriVariable(const TridiagonalProblem<T>& given,
                                             TridiagonalMethod m, TridiagonalOutput<T> out,
                                             const SolveControl& c) {
    const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
    if (!cuda::VariableOnDevice(m)) return Host(cpu::SolveTridiagonal(given, m, out));
    TridiagonalProblem<T> p = given;
    std::vector<int64_t> uniform;
    if (!p.variable()) {
      uniform.resize(size_t(p.batch) + 1);
      for (int64_t s = 0; s <= p.batch; ++s) uniform[size_t(s)] = s * p.n;
      p.offsets = uniform.data();
    }
    const cuda::VariablePlan plan = cuda::PlanVariable(p.offsets, p.batch);
    std::vector<T> meta((plan.meta.size() + 15) / 16 * (16 / sizeof(T)));
    std::memcpy(meta.data(), plan.meta.data(), plan.meta.size());
    const int64_t e = p.unknowns();
    std::vector<Input<T>> in = {{meta.data(), int64_t(meta.size()), nullptr, /*scanned=*/false}};
    if (p.unified()) {
      in.push_back({p.a, 3 * e});
      in.push_back({p.d, e});
    } else {
      for (const T* q : {p.a, p.b, p.c, p.d}) in.push_back({q, e});
    }
    auto solved = stager_.Staged<T>(
        in, p.batch, p.n, Layout::kFlat, out.x, out.status,
        [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
            cudaStream_t stream) -> absl::StatusOr<std::string> {
          TridiagonalProblem<T> dp = p;
          if (p.unified()) {
            dp.a = d[1];
            dp.b = d[1] + 1;
            dp.c = d[1] + 2;
            dp.d = d[2];
          } else {
            dp.a = d[1];
            dp.b = d[2];
            dp.c = d[3];
            dp.d = d[4];
          }
          return cuda::SolveVariableDevice(dp, plan, reinterpret_cast<const std::byte*>(d[0]), m,
                                           dx, flags, device_pool_, stream);
        },
        nullptr, c.check_finite, p.offsets);
    if (solved.ok() && m == TridiagonalMethod::kAuto)
      cpu::ResolveSingularWithPivoting(p, out, &*solved);
    return solved;
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveBlockOnDevice(const BlockTridiagonalProblem<T>& p, BlockMethod m,
                                               const BlockOptions& o, BlockOutput<T> out,
                                               const SolveControl& c,
                                               const Resident<T>* resident = nullptr) {
    const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
    const int64_t size = p.N * p.M;
    const bool automatic = m == BlockMethod::kAuto;
    m = cuda::ResolveBlockMethod(p, m, o);  // block/dispatch.cu
    std::vector<Input<T>> in = {{p.aC, size}, {p.cC, size}, {p.bC, size},
                                {p.cA, size}, {p.cB, size}, {p.f, size}};
    if (p.y0) in.push_back({p.y0, size});
    MarkResident(in, resident);
    SystemStatus st = SystemStatus::kOk;
    SolveInfo solved;
    auto info = stager_.Staged<T>(
        in, 1, size, Layout::kFlat, out.y, out.status,
        [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
            cudaStream_t stream) -> absl::StatusOr<std::string> {
          if (p.y0)
            TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dx, d[6], size * sizeof(T),
                                                          cudaMemcpyDeviceToDevice, stream));
          else
            TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dx, 0, size * sizeof(T), stream));
          BlockTridiagonalProblem<T> dp{p.N, p.M, d[0], d[1], d[2], d[3], d[4], d[5], nullptr};
          auto r = cuda::SolveBlockTridiagonalDevice(dp, m, o, dx, &st, device_pool_, c, stream);
          if (!r.ok()) return r.status();
          solved = *r;
          // Singular or diverged: the answer is zeros (Staged zeroes flagged systems).
          if (st == SystemStatus::kSingular || st == SystemStatus::kDiverged)
            TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 1, 1, stream));
          return r->method;
        },
        nullptr, c.check_finite);
    if (!info.ok()) return info.status();
    out.status[0] = st;
    info->iterations = solved.iterations;
    info->residual = solved.residual;
    info->residual_history = std::move(solved.residual_history);
    // auto, where CG could not run or met indefiniteness on the device, or red-black's line
    // solves met a vanished pivot (a singular C_i, the matrix perhaps not): the CPU
    // reference's fallback on the host (BiCGStab with the V-cycle, the line solves or nothing,
    // from y0), never SINGULAR for a nonsingular matrix. The method says both: "multigrid-cg
    // (stopped: indefinite) -> multigrid-bicgstab (host)"; the iterations count both.
    const bool lines_singular = st == SystemStatus::kSingular;
    if (automatic && (lines_singular || (st == SystemStatus::kNotConverged &&
                                         (info->method.find("indefinite") != std::string::npos ||
                                          info->method.find("not run") != std::string::npos)))) {
      // Its progress and history continue the device's iteration count.
      SolveControl hc = c;
      const int64_t ran = info->iterations;
      if (c.progress) hc.progress = [&c, ran](int64_t it, double r) { c.progress(ran + it, r); };
      auto host = cpu::SolveBlockIndefinite(p, o, out, hc);
      if (!host.ok()) return host.status();
      host->method = info->method + (lines_singular ? " (a line block is singular)" : "") +
                     " -> " + host->method + " (host)";
      host->iterations += info->iterations;
      for (ResidualPoint& q : host->residual_history) q.iteration += ran;
      if (!info->residual_history.empty()) info->residual_history.pop_back();  // not the end
      host->residual_history.insert(host->residual_history.begin(),
                                    info->residual_history.begin(), info->residual_history.end());
      auto& hist = host->residual_history;  // within the limit still: every other point dropped
      while (c.history_limit > 1 && int64_t(hist.size()) > std::max<int64_t>(c.history_limit, 2)) {
        size_t kept = 0;
        for (size_t i = 0; i + 1 < hist.size(); i += 2) hist[kept++] = hist[i];
        hist[kept++] = hist.back();
        hist.resize(kept);
      }
      return host;
    }
    return info;
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveDenseOnDevice(const DenseProblem<T>& p, DenseMethod m,
                                               DenseOutput<T> out, const SolveControl& c,
                                               const Resident<T>* resident = nullptr) {
    const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
    const cuda::DensePath path = cuda::ChooseDensePath(p.n, m);  // dense/dispatch.cc
    std::vector<Input<T>> in = {{p.A, p.batch * p.n * p.n}, {p.b, p.batch * p.n}};
    MarkResident(in, resident);
    return stager_.Staged<T>(in, p.batch, p.n,
                     Layout::kFlat, out.x, out.status,
                     [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
                         cudaStream_t stream) -> absl::StatusOr<std::string> {
                       DenseProblem<T> dp{p.batch, p.n, d[0], d[1]};
                       if (path == cuda::DensePath::kHouseholderPcrBlock) {
                         auto st = cuda::SolveDenseHouseholderPcrBlockDevice(dp, dx, flags, stream);
                         if (!st.ok()) return st;
                         return std::string("householder-pcr-block");
                       }
                       if (path == cuda::DensePath::kHouseholderPcr) {
                         auto st = cuda::SolveDenseHouseholderPcrDevice(dp, dx, flags, dense_libs_,
                                                                        device_pool_, stream);
                         if (!st.ok()) return st;
                         return std::string("householder-pcr (cusolver sytrd)");
                       }
                       if (path == cuda::DensePath::kGaussJordanBlocked) {
                         auto st = cuda::SolveDenseGaussJordanBlockedDevice(
                             dp, dx, flags, dense_libs_, device_pool_, stream);
                         if (!st.ok()) return st;
                         return std::string("gauss-jordan-blocked");
                       }
                       if (path == cuda::DensePath::kLu)
                         return cuda::SolveDenseLuDevice(dp, dx, flags, dense_libs_, device_pool_,
                                                         stream);
                       auto st = cuda::SolveDenseWarpDevice(dp, dx, flags, stream);
                       if (!st.ok()) return st;
                       return std::string(p.n <= cuda::kDenseWarpMaxN       ? "gauss-jordan-warp"
                                          : p.n <= cuda::kDenseTwoWarpsMaxN ? "gauss-jordan-2warps"
                                                                           : "gauss-jordan-block");
                     },
                     nullptr, c.check_finite);
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveTreeOnDevice(const TreeProblem<T>& p, TreeMethod m,
                                              TreeOutput<T> out, const SolveControl& c,
                                              const Resident<T>* resident = nullptr) {
    const cuda::UseTuning tuned(&tuning_, cuda::UseTuning::kUnlessSet);
    const bool per_cell = p.parent_per_system && p.batch > 1;
    // One morphology: its plan (cached), which the choice reads (tree/dispatch.cc).
    std::shared_ptr<const cuda::TreeCablesPlan> plan;
    if (cuda::TreeWantsPlan(p, m)) {
      auto made = plans_.Get(p.parent, p.n, device_pool_, nullptr);
      if (!made.ok()) return made.status();
      plan = *made;
    }
    const cuda::TreePath path = cuda::ChooseTreePath(p, m, plan.get());
    if (path == cuda::TreePath::kHost) {
      if (resident == nullptr && ClientDevice(p, out.x)) return ThroughHost(p, m, out, c);
      return Host(cpu_->Solve(p, m, out, c));
    }
    const bool contraction = path == cuda::TreePath::kContractionBlock;
    const bool block = path == cuda::TreePath::kCablesBlock;
    const bool cables = block || path == cuda::TreePath::kCables;
    const int64_t e = p.batch * p.n;
    std::vector<Input<T>> in = {{p.lower, e}, {p.upper, e}, {p.diag, e}, {p.rhs, e}};
    MarkResident(in, resident);
    if (contraction || cables) {
      return stager_.Staged<T>(in, p.batch, p.n, p.layout, out.x, out.status,
                       [&](const std::vector<T*>& d, T* dx, uint8_t* flags, cudaStream_t stream,
                           int64_t systems) -> absl::StatusOr<std::string> {
                         TreeProblem<T> dp = p;
                         dp.batch = systems;  // a piece of a pipelined solve: cells of one tree
                         dp.parent = nullptr;  // the plan holds the tree
                         dp.parent_per_system = false;
                         dp.lower = d[0];
                         dp.upper = d[1];
                         dp.diag = d[2];
                         dp.rhs = d[3];
                         if (contraction) {
                           auto st = cuda::SolveTreeContractionBlockDevice(dp, *plan, dx, flags,
                                                                           stream);
                           if (!st.ok()) return st;
                           return std::string("contraction-block");
                         }
                         if (block) {
                           auto st = cuda::SolveTreeCablesBlockDevice(dp, *plan, dx, flags,
                                                                      stream);
                           if (!st.ok()) return st;
                           return std::string("cables-block");
                         }
                         auto st = cuda::SolveTreeCablesDevice(dp, *plan, dx, flags,
                                                               device_pool_, stream);
                         if (!st.ok()) return st;
                         return std::string("cables");
                       },
                       nullptr, c.check_finite);
    }
    const int64_t trees = per_cell ? p.batch : 1;
    std::vector<uint8_t> nf(static_cast<size_t>(trees * p.n));
    for (int64_t s = 0; s < trees; ++s) {
      const std::vector<uint8_t> f = cuda::TreeNodeFlags(p.parent + s * p.n, p.n);
      std::memcpy(nf.data() + s * p.n, f.data(), size_t(p.n));
    }
    auto meta = device_pool_.Get(trees * p.n * 5);
    if (!meta.ok()) return meta.status();
    auto* dparent = static_cast<int32_t*>(meta->get());
    auto* dflags = reinterpret_cast<uint8_t*>(dparent + trees * p.n);
    return stager_.Staged<T>(in, p.batch, p.n, p.layout, out.x, out.status,
                     [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
                         cudaStream_t stream) -> absl::StatusOr<std::string> {
                       TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                           dparent, p.parent, trees * p.n * 4, cudaMemcpyHostToDevice, stream));
                       TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                           dflags, nf.data(), trees * p.n, cudaMemcpyHostToDevice, stream));
                       TreeProblem<T> dp = p;
                       dp.parent = dparent;
                       dp.parent_per_system = per_cell;
                       dp.lower = d[0];
                       dp.upper = d[1];
                       dp.diag = d[2];
                       dp.rhs = d[3];
                       auto st = cuda::SolveTreeBatchDevice(dp, dflags, dx, flags, device_pool_,
                                                            stream);
                       if (!st.ok()) return st;
                       return std::string("hines-batch");
                     },
                     nullptr, c.check_finite);
  }

  const CudaOptions options_;
  const cudaDeviceProp prop_;
  // The launch choices of this device's kernels: put in use for each solve (SolveTri and the
  // other *OnDevice entries), unless the calling thread has a table of its own in use (a
  // white-box test's, a benchmark's).
  const cuda::TuningTable tuning_;
  mutable Pool device_pool_;
  mutable Pool pinned_pool_;
  std::unique_ptr<Backend> cpu_;
  cuda::Stager stager_;  // the lanes, the pinned staging and the pinned client memory
  cuda::DenseLibs dense_libs_;  // destroyed before the pools
  cuda::TreePlanCache plans_;  // the tree family's cable plans, by morphology
};

}  // namespace

bool CudaBackendCompiledIn() { return true; }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& o) {
  // Read when CUDA initializes, which the calls below do if nothing in the process has yet.
  if (o.load_eagerly) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  if (auto st = FaultInjection::ProcessStatus(); !st.ok()) return st;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device (", e == cudaSuccess ? "none present" : cudaGetErrorString(e), ")"));
  if (o.device < 0 || o.device >= count)
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", o.device, " does not exist (", count, " present)"));
  cudaDeviceProp prop;
  if (auto st = cuda::CudaStatus(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
      !st.ok())
    return st;
  // Threads waiting for the device yield their core: the server's waiting threads spin
  // otherwise (one context, many cores), taking cores from the gRPC threads and the clients
  // of the same host (docs/kernels/README.md, "Tuning evidence", cudaDeviceScheduleYield).
  // (Set on the device's primary context, active or not; where it cannot be, they spin.)
  if (auto st = cuda::CudaStatus(cudaSetDevice(o.device), "cudaSetDevice"); !st.ok()) return st;
  (void)cudaSetDeviceFlags(cudaDeviceScheduleYield);
  (void)cudaGetLastError();
  const int64_t cap = o.device_pool_cap_bytes > 0 ? o.device_pool_cap_bytes
                                                  : int64_t(double(prop.totalGlobalMem) * 0.8);
  return std::unique_ptr<Backend>(new CudaBackend(o, prop, cap));
}

}  // namespace trisolve
