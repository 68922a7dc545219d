// The CUDA backend (MakeCudaBackend, backend.cc): one device, its pools, lanes and tuning. Its
// construction, prepared systems, client memory and host paths are here; each family's solve
// on the device is in backend_solve.cc. Internal to kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "block/block.h"
#include "dense/dense.h"
#include "dense/dispatch.h"
#include "dense/factors.h"
#include "runtime/check.h"
#include "runtime/device_health.h"
#include "runtime/memory_pool.h"
#include "runtime/pinned_word.h"
#include "staging.h"
#include "tree/dispatch.h"
#include "tree/forest.h"
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

namespace trisolve::cuda_backend {

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

  // As SolveTri allocates: the staged arrays, x and a flag byte a system in one buffer; the
  // kernel's own scratch (Thomas' one array, the partitioned solver's reduced systems: less than
  // one array); for auto and pivoting from a warp's worth of systems (or where pivoting-split
  // takes the shape) the second solve's scratch; each in the pool's size classes.
  int64_t TridiagonalDeviceBytes(int64_t n, int64_t batch, Layout layout, int elem_bytes,
                                 TridiagonalMethod m) const override {
    const int64_t e = n * batch;
    int64_t bytes = Pool::SizeClass(5 * e * elem_bytes + batch) + Pool::SizeClass(e * elem_bytes);
    const bool certified = m == TridiagonalMethod::kAuto || m == TridiagonalMethod::kPivoting;
    if (!certified) return bytes;
    const bool f32 = elem_bytes == 4;
    const bool pivot_on_device = batch >= cuda::kPivotingDeviceBatch;
    const bool split = cuda::PivotingSplitByShape(n, batch, layout);
    const int64_t scratch =
        std::max(split ? cuda::PivotingSplitScratchBytes(n, batch, f32) : 0,
                 pivot_on_device ? cuda::PivotingScratchBytes(n, batch, f32) : 0);
    if (scratch > 0) bytes += Pool::SizeClass(scratch);
    return bytes;
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

  // Each family's solve is one template (below, SolveFamily) behind the interface's float64 and
  // float32 overloads.
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p, TridiagonalMethod m,
                                  TridiagonalOutput<double> out, const SolveControl& c) override {
    return SolveFamily(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p, TridiagonalMethod m,
                                  TridiagonalOutput<float> out, const SolveControl& c) override {
    return SolveFamily(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                  DenseOutput<double> out, const SolveControl& c) override {
    return SolveFamily(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                  DenseOutput<float> out, const SolveControl& c) override {
    return SolveFamily(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                  TreeOutput<double> out, const SolveControl& c) override {
    return SolveFamily(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m,
                                  TreeOutput<float> out, const SolveControl& c) override {
    return SolveFamily(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& c) override {
    return SolveFamily(p, m, o, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& c) override {
    return SolveFamily(p, m, o, out, c);
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
    // A dense system whose method's elimination can be kept keeps it, not A.
    if (s.family == Family::kDense &&
        cuda::DenseKeepsFactors(cuda::ChooseDensePath(s.n, DenseMethod(s.method)))) {
      system->keeps_factors = true;
      if (auto st = KeepDenseFactors(*system); !st.ok()) return st;
      return std::unique_ptr<PreparedSystem>(std::move(system));
    }
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
    if (s.family == Family::kTree && s.variable())
      if (auto st = KeepCellPlan(*system); !st.ok()) return st;
    if (auto st = KeepBlockSetup(*system); !st.ok()) return st;
    return std::unique_ptr<PreparedSystem>(std::move(system));
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<double> rhs, double* x,
                                          SystemStatus* status, const SolveControl& c) override {
    UseDevice();
    if (ClientDeviceRhs(system, rhs, x) && !PreparedOnDeviceOnly(system, rhs.k, rhs.systems))
      return PreparedThroughHost(system, rhs, x, status, c);
    return SolvePreparedOnDevice(system, rhs, x, status, c);
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs, float* x,
                                          SystemStatus* status, const SolveControl& c) override {
    UseDevice();
    if (ClientDeviceRhs(system, rhs, x) && !PreparedOnDeviceOnly(system, rhs.k, rhs.systems))
      return PreparedThroughHost(system, rhs, x, status, c);
    return SolvePreparedOnDevice(system, rhs, x, status, c);
  }

 private:
  template <typename T>
  absl::StatusOr<SolveInfo> SolveFamily(const TridiagonalProblem<T>& p, TridiagonalMethod m,
                                        TridiagonalOutput<T> out, const SolveControl& c) {
    if (ClientDevice(p, out.x) && !TriOnDeviceOnly(p, m)) return ThroughHost(p, m, out, c);
    if (OnHost(m == TridiagonalMethod::kAuto, p.unknowns())) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    if (p.variable() || p.unified()) return SolveTriVariable(p, m, out, c);
    return SolveTri(p, m, out, c);
  }
  template <typename T>
  absl::StatusOr<SolveInfo> SolveFamily(const DenseProblem<T>& p, DenseMethod m,
                                        DenseOutput<T> out, const SolveControl& c) {
    UseDevice();
    return SolveDenseOnDevice(p, m, out, c);
  }
  template <typename T>
  absl::StatusOr<SolveInfo> SolveFamily(const TreeProblem<T>& p, TreeMethod m, TreeOutput<T> out,
                                        const SolveControl& c) {
    // (Cells of different sizes: their roots' couplings are zeroed on the device copy, which
    // must be the backend's own.)
    if (ClientDevice(p, out.x) && (p.variable() || !TreeMayStayOnDevice(p, m)))
      return ThroughHost(p, m, out, c);
    if (OnHost(m == TreeMethod::kAuto, p.unknowns())) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    if (p.variable()) return SolveTreeForest(p, m, out, c);
    return SolveTreeOnDevice(p, m, out, c);
  }
  template <typename T>
  absl::StatusOr<SolveInfo> SolveFamily(const BlockTridiagonalProblem<T>& p, BlockMethod m,
                                        const BlockOptions& o, BlockOutput<T> out,
                                        const SolveControl& c) {
    if (ClientDevice(p, out.y)) return ThroughHost(p, m, o, out, c);
    UseDevice();
    return SolveBlockOnDevice(p, m, o, out, c);
  }

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
      return PreparedSystem::bytes() + device.size() + replicated.size() + factors.size() +
             (block_f64 ? cuda::BlockDeviceSetupBytes(*block_f64) : 0) +
             (block_f32 ? cuda::BlockDeviceSetupBytes(*block_f32) : 0);
    }
    std::string prepared() const override {
      if (factors.size() > 0)
        return absl::StrCat(factors_kind == cuda::DenseFactorsKind::kLu ? "LU" : "Gauss-Jordan",
                            " factors on CUDA device ", backend_->options_.device);
      if (keeps_factors) return "the host copy (the factorisation failed at the last update)";
      const std::string block = block_f64   ? cuda::DescribeBlockDeviceSetup(*block_f64)
                                : block_f32 ? cuda::DescribeBlockDeviceSetup(*block_f32)
                                            : std::string();
      return absl::StrCat("coefficients", block.empty() ? "" : " and " + block,
                          " on CUDA device ", backend_->options_.device);
    }
    const Backend* holder() const override { return backend_; }
    absl::Status Update(int i, const void* values) override {
      HostCopies copies(backend_->stager_);
      if (auto st = copies.In(values, spec_.coefficient_bytes(i)); !st.ok()) return st;
      if (auto st = PreparedSystem::Update(i, values); !st.ok()) return st;
      replicated.Release();
      replicated_k = 0;
      symmetric_.store(kUnknown);
      if (keeps_factors) return backend_->KeepDenseFactors(*this);
      if (IsTreeParent(spec_, i) && spec_.variable()) return backend_->KeepCellPlan(*this);
      if (auto st = Upload(i); !st.ok()) return st;
      return backend_->KeepBlockSetup(*this);
    }
    std::shared_ptr<const cuda::TreeCellsPlan> CellPlan() const {
      std::lock_guard<std::mutex> lock(plan_mu_);
      return cell_plan_;
    }
    void SetCellPlan(std::shared_ptr<const cuda::TreeCellsPlan> plan) {
      std::lock_guard<std::mutex> lock(plan_mu_);
      cell_plan_ = std::move(plan);
    }
    // A block-tridiagonal system's symmetry (auto's choice of method, ResolveBlockMethod),
    // tested on the host copy at the first solve that needs it and again after an update.
    // Solves run concurrently (an update does not: the registry orders it), so the first few
    // may each test it.
    template <typename T>
    bool Symmetric(const BlockTridiagonalProblem<T>& p) {
      int known = symmetric_.load();
      if (known == kUnknown) {
        known = IsSymmetric(p) ? 1 : 0;
        symmetric_.store(known);
      }
      return known == 1;
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

    // A block system's method setup on the device (KeepBlockSetup), the one of its precision.
    std::shared_ptr<const cuda::BlockDeviceSetup<double>> block_f64;
    std::shared_ptr<const cuda::BlockDeviceSetup<float>> block_f32;
    template <typename T>
    const cuda::BlockDeviceSetup<T>* BlockKept() const {
      if constexpr (sizeof(T) == 8) return block_f64.get();
      else return block_f32.get();
    }

    cuda::Pool::Buffer device;
    std::array<int64_t, kMaxCoefficients> offset{};
    cuda::Pool::Buffer replicated;
    std::array<int64_t, kMaxCoefficients> replicated_offset{};
    int64_t replicated_k = 0;
    Layout replicated_layout = Layout::kFlat;
    // A dense system's kept elimination (cuda::DenseKeepsFactors) in place of its device copy:
    // made at Prepare and again at every update (empty after a failed one: the solves then
    // factor the host copy's A).
    bool keeps_factors = false;
    cuda::Pool::Buffer factors;
    cuda::DenseFactorsKind factors_kind = cuda::DenseFactorsKind::kGaussJordan;
    std::string factors_name;

   private:
    static constexpr int kUnknown = -1;
    CudaBackend* backend_;
    std::atomic<int> symmetric_{kUnknown};
    // Tree cells of different sizes: their per-cell plan (tree/cells.h), built at Prepare and
    // after an update of parent; null where the solves do not use it (hines, the host's sizes).
    mutable std::mutex plan_mu_;
    std::shared_ptr<const cuda::TreeCellsPlan> cell_plan_;
  };

  // A block system's method setup on the device (cuda::PrepareBlockDevice: the multigrid
  // hierarchy, cg's sign test), from its device copy, for the method a solve resolves auto to:
  // made when the system is prepared and again after every update, then only read by solves.
  absl::Status KeepBlockSetup(DevicePrepared& s) {
    if (s.spec().family != Family::kBlockTridiagonal) return absl::OkStatus();
    s.block_f64.reset();
    s.block_f32.reset();
    return s.spec().precision == Precision::kFloat64 ? KeepBlockSetup<double>(s, s.block_f64)
                                                     : KeepBlockSetup<float>(s, s.block_f32);
  }
  template <typename T>
  absl::Status KeepBlockSetup(DevicePrepared& s,
                              std::shared_ptr<const cuda::BlockDeviceSetup<T>>& kept) {
    const SystemSpec& spec = s.spec();
    const BlockTridiagonalProblem<T> host = BlockOf<T>(spec, nullptr);
    const BlockMethod m = BlockMethod(spec.method);
    std::optional<bool> symmetric;  // (as SolvePreparedOnDevice asks)
    if (m == BlockMethod::kAuto && spec.block_options.tol > 0) symmetric = s.Symmetric(host);
    const Resident<T> r = s.ResidentOf<T>(s.device, s.offset);
    const BlockTridiagonalProblem<T> dp{spec.block_N, spec.block_M, r[0], r[1], r[2], r[3],
                                        r[4], nullptr, nullptr};
    UseDevice();
    const cuda::Stager::LaneLease lease(&stager_);
    auto made = cuda::PrepareBlockDevice(
        dp, cuda::ResolveBlockMethod(host, m, spec.block_options, symmetric), device_pool_,
        lease.lane().stream);
    if (!made.ok()) return made.status();
    kept = *std::move(made);
    return absl::OkStatus();
  }

  // A prepared forest's per-cell plan, from the cache or built now, for the method's kernel;
  // none where the solves will not read one (hines, auto at the host's sizes).
  absl::Status KeepCellPlan(DevicePrepared& s) {
    const SystemSpec& spec = s.spec();
    s.SetCellPlan(nullptr);
    const TreeMethod m = TreeMethod(spec.method);
    if (m == TreeMethod::kHines || (m == TreeMethod::kAuto && OnHost(true, spec.n)))
      return absl::OkStatus();
    const cuda::TreeCellsKind kind = m == TreeMethod::kCables ? cuda::TreeCellsKind::kCables
                                                              : cuda::TreeCellsKind::kContraction;
    cudaSetDevice(options_.device);
    auto plan = cell_plans_.Get(static_cast<const int32_t*>(spec.coefficients[3]), spec.offsets,
                                spec.batch, int(spec.elem_bytes()), kind, device_pool_, nullptr);
    if (!plan.ok()) return plan.status();
    s.SetCellPlan(*std::move(plan));
    return absl::OkStatus();
  }

  // Factors a dense system's A (the host copy, moved to the device for the factorisation alone)
  // into s.factors.
  absl::Status KeepDenseFactors(DevicePrepared& s) {
    s.factors.Release();
    return s.spec().precision == Precision::kFloat64 ? KeepDenseFactors<double>(s)
                                                     : KeepDenseFactors<float>(s);
  }
  template <typename T>
  absl::Status KeepDenseFactors(DevicePrepared& s);
  template <typename T>
  absl::StatusOr<SolveInfo> SolveDenseFactored(DevicePrepared& s, RhsBlock<T> rhs, T* x,
                                               SystemStatus* status, const SolveControl& c);

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
                                          const SolveControl& c,
                                          std::optional<bool> symmetric = std::nullopt,
                                          const DevicePrepared* dp = nullptr) {
    switch (hs.family) {
      case Family::kTridiagonal:
        return SolveTri(TridiagonalOf(hs, rhs), TridiagonalMethod(hs.method),
                        TridiagonalOutput<T>{x, status}, c, &resident);
      case Family::kTree:
        return SolveTreeOnDevice(TreeOf(hs, rhs), TreeMethod(hs.method), TreeOutput<T>{x, status},
                                 c, &resident);
      case Family::kBlockTridiagonal:
        return SolveBlockOnDevice(BlockOf(hs, rhs), BlockMethod(hs.method), hs.block_options,
                                  BlockOutput<T>{x, status}, c, &resident, symmetric,
                                  dp ? dp->BlockKept<T>() : nullptr);
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
    if (auto st = CheckSystemRange(system.spec(), rhs.first_system, rhs.systems); !st.ok())
      return st;
    // A range of a flat batch's systems: the host copy's and the device copy's pointers moved
    // to it (RangeOf), the same kernels over a smaller batch.
    const SystemSpec s = BlockSpec(system.spec(), rhs);
    // The smallest by handle go where the one-shot calls send them (Solve: the host for auto).
    // (A variable batch's k right-hand sides are k solves, each judged as its one-shot call.)
    const int64_t solved_at_once = s.variable() ? s.rhs_values() : rhs.k * s.rhs_values();
    const bool small = s.method == 0 && solved_at_once < options_.host_below_unknowns &&
                       (s.family == Family::kTridiagonal || s.family == Family::kTree);
    if (dp == nullptr || small) return SolveThroughBackend(*this, system, rhs, x, status, c);
    if (dp->keeps_factors) {
      if (dp->factors.size() == 0) return SolveThroughBackend(*this, system, rhs, x, status, c);
      return SolveDenseFactored(*dp, rhs, x, status, c);
    }
    // Systems of different sizes, a right-hand side block at a time with the coefficients read
    // from the device copy (the offsets the host copy keeps): a tridiagonal batch by the
    // variable kernels, tree cells one thread block a cell with the system's own plan.
    if (s.variable()) {
      const Resident<T> resident = dp->ResidentOf<T>(dp->device, dp->offset);
      SolveInfo total;
      for (int64_t j = 0; j < rhs.k; ++j) {
        absl::StatusOr<SolveInfo> info;
        if (s.family == Family::kTridiagonal) {
          TridiagonalProblem<T> p = TridiagonalOf(s, rhs.rhs + j * s.n);
          p.n = s.longest;
          p.offsets = s.offsets;
          info = SolveTriVariable(p, TridiagonalMethod(s.method),
                                  TridiagonalOutput<T>{x + j * s.n, status + j * s.batch}, c,
                                  &resident);
        } else {
          TreeProblem<T> p = TreeOf(s, rhs.rhs + j * s.n);
          p.n = s.longest;
          p.offsets = s.offsets;
          info = SolveTreeForest(p, TreeMethod(s.method),
                                 TreeOutput<T>{x + j * s.n, status + j * s.batch}, c, &resident,
                                 dp->CellPlan());
        }
        if (!info.ok()) return info.status();
        AccumulateSolveInfo(*info, j == 0, &total);
      }
      return total;
    }
    Resident<T> resident = dp->ResidentOf<T>(dp->device, dp->offset);
    if (rhs.systems > 0)
      for (int i = 0; i < s.num_coefficients(); ++i)
        if (resident[size_t(i)] != nullptr) resident[size_t(i)] += rhs.first_system * s.n;
    // auto's method for a block system: its symmetry tested once, not at every solve.
    std::optional<bool> symmetric;
    if (s.family == Family::kBlockTridiagonal && BlockMethod(s.method) == BlockMethod::kAuto &&
        s.block_options.tol > 0)
      symmetric = dp->Symmetric(BlockOf(s, rhs.rhs));
    if (rhs.k == 1) return SolveResident(s, resident, rhs.rhs, x, status, c, symmetric, dp);
    if ((s.family == Family::kTridiagonal || s.family == Family::kTree) &&
        system.spec().batch == 1) {
      if (auto st = Replicate(*dp, rhs.k, rhs.layout); !st.ok()) return st;
      return SolveResident(dp->Replicated(rhs.k, rhs.layout),
                           dp->ResidentOf<T>(dp->replicated, dp->replicated_offset), rhs.rhs, x,
                           status, c);
    }
    SolveInfo total;
    const int64_t block = s.rhs_values();
    for (int64_t j = 0; j < rhs.k; ++j) {
      auto info = SolveResident(s, resident, rhs.rhs + j * block, x + j * block,
                                status + j * s.batch, c, symmetric, dp);
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
  static int64_t ParentValues(const TreeProblem<T>& p) {
    return p.variable() ? p.unknowns() : p.parent_per_system ? p.batch * p.n : p.n;
  }
  template <typename T>
  bool ClientDevice(const TreeProblem<T>& p, const T* x) const {
    const int64_t e = p.unknowns();
    return OnDevice(p.lower, e) || OnDevice(p.upper, e) || OnDevice(p.diag, e) ||
           OnDevice(p.rhs, e) || OnDevice(x, e) || OnDevice(p.parent, ParentValues(p));
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
    const int64_t values = rhs.k * BlockSpec(system.spec(), rhs).rhs_values();
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
    return !OnHost(m == TreeMethod::kAuto, p.unknowns()) && !OnDevice(p.parent, ParentValues(p));
  }
  // (range_systems: a range's systems, RhsBlock::systems; 0: the whole batch.)
  bool PreparedOnDeviceOnly(const PreparedSystem& system, int64_t k, int64_t range_systems) const {
    SystemSpec s = system.spec();
    if (range_systems > 0) s.batch = range_systems;
    if (dynamic_cast<const DevicePrepared*>(&system) == nullptr) return false;
    if (s.family == Family::kDense) return true;
    if (s.variable()) return false;  // (auto re-solves on the host, as the one-shot form does)
    if (s.family != Family::kTridiagonal) return false;
    const auto m = TridiagonalMethod(s.method);
    // (SolvePreparedOnDevice: k right-hand sides of one system are one batch of k; of several,
    // k calls of the system's batch. The smallest go through the host, as OnHost's.)
    const int64_t batch = system.spec().batch == 1 && k > 1 ? k : s.batch;
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
    const int64_t e = p.unknowns(), eb = int64_t(sizeof(T));
    for (const T** q : {&p.lower, &p.upper, &p.diag, &p.rhs})
      if (auto st = h.In(*q, e * eb); !st.ok()) return st;
    if (auto st = h.In(p.parent, ParentValues(p) * 4); !st.ok()) return st;
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
    const int64_t bytes = rhs.k * BlockSpec(system.spec(), rhs).rhs_values() * int64_t(sizeof(T));
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
                                     const Resident<T>* resident = nullptr);

  // A variable-size batch (p.offsets) or one in the unified-vector layout (p.unified(), a
  // uniform one given offsets s * n): the variable kernel for auto and partitioned, reading
  // the rows as they are staged (abc in place: no transpose anywhere), after its plan
  // (variable.h), which goes first so that its int64 offsets are aligned whatever the arrays'
  // length (16 bytes a unit, for a's loads). resident: a prepared system's a, b and c on the
  // device (its own copies: their couplings may be cut), `given`'s the host copy's.
  template <typename T>
  absl::StatusOr<SolveInfo> SolveTriVariable(const TridiagonalProblem<T>& given,
                                             TridiagonalMethod m, TridiagonalOutput<T> out,
                                             const SolveControl& c,
                                             const Resident<T>* resident = nullptr);

  template <typename T>
  absl::StatusOr<SolveInfo> SolveBlockOnDevice(const BlockTridiagonalProblem<T>& p, BlockMethod m,
                                               const BlockOptions& o, BlockOutput<T> out,
                                               const SolveControl& c,
                                               const Resident<T>* resident = nullptr,
                                               std::optional<bool> symmetric = std::nullopt,
                                               const cuda::BlockDeviceSetup<T>* kept = nullptr);

  template <typename T>
  absl::StatusOr<SolveInfo> SolveDenseOnDevice(const DenseProblem<T>& p, DenseMethod m,
                                               DenseOutput<T> out, const SolveControl& c,
                                               const Resident<T>* resident = nullptr);

  template <typename T>
  absl::StatusOr<SolveInfo> SolveTreeOnDevice(const TreeProblem<T>& p, TreeMethod m,
                                              TreeOutput<T> out, const SolveControl& c,
                                              const Resident<T>* resident = nullptr);
  // Cells of different sizes (p.offsets; host arrays): one thread block a cell, each cell with
  // its structure's plan (tree/cells.h; contraction-block for auto and contraction,
  // cables-block for cables); the cells too large for a block by SolveTreeForestJoined; a cell
  // whose pivot vanished solved again on the host (its status the CPU reference's).
  // By handle, `resident` holds the cells' lower, upper and diag on the device and `held` is
  // the prepared system's own plan (built at Prepare: no first sight on the host).
  template <typename T>
  absl::StatusOr<SolveInfo> SolveTreeForest(
      const TreeProblem<T>& p, TreeMethod m, TreeOutput<T> out, const SolveControl& c,
      const Resident<T>* resident = nullptr,
      std::shared_ptr<const cuda::TreeCellsPlan> held = nullptr);
  // The cells as one tree (tree/forest.h) by the one-tree paths; where a pivot vanished in it,
  // the cells solved again one by one on the host, which says which.
  // (prepared: a prepared system's cells, whose plan is built at the first sight.)
  template <typename T>
  absl::StatusOr<SolveInfo> SolveTreeForestJoined(const TreeProblem<T>& p, TreeMethod m,
                                                  TreeOutput<T> out, const SolveControl& c,
                                                  bool prepared = false);

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
  cuda::TreeCellsPlanCache cell_plans_;  // the per-cell plans of forests, by forest
};

}  // namespace trisolve::cuda_backend
