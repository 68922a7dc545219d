// The CUDA backend: requests are staged through pooled pinned buffers into pooled device
// buffers on one of several streams, solved by the family's kernels, and copied back. Families
// without CUDA kernels yet are solved by the CPU reference on the host, and the method name
// says so ("... (host)").
#include <cuda_runtime.h>
#include <omp.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <array>
#include <list>
#include <map>
#include <shared_mutex>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "block/block.h"
#include "dense/dense.h"
#include "dense/dispatch.h"
#include "runtime/check.h"
#include "runtime/device_health.h"
#include "runtime/fault_injection.h"
#include "runtime/memory_pool.h"
#include "tree/dispatch.h"
#include "tree/tree.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/backend.h"
#include "trisolve/fault_injection.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/reference/dense.h"
#include "trisolve/reference/tree.h"
#include "trisolve/reference/tridiagonal.h"

namespace trisolve {
namespace {

using cuda::Pool;

constexpr int64_t kStagingChunk = int64_t{16} << 20;  // bytes per pinned staging piece

double Ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

class CudaBackend final : public Backend {
  // One input array of a solve: staged from the host, or already on the device (a prepared
  // system's coefficients).
  template <typename T>
  struct Input {
    const T* host = nullptr;
    int64_t values = 0;
    const T* device = nullptr;
  };
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
        device_pool_(Pool::Kind::kDevice, o.device, device_cap),
        pinned_pool_(Pool::Kind::kPinnedHost, o.device, o.pinned_pool_cap_bytes),
        cpu_(MakeCpuBackend(o.cpu_threads)) {
    cudaSetDevice(o.device);
    for (int i = 0; i < std::max(1, o.streams); ++i) {
      Lane lane;
      cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking);
      for (auto* e : {&lane.e0, &lane.e1, &lane.e2, &lane.e3}) cudaEventCreate(e);
      for (auto& e : lane.staged) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      lanes_.push_back(lane);
      free_.push_back(i);
    }
  }
  ~CudaBackend() override {
    dense_libs_.Reset();  // the handles use the lanes' streams
    for (auto& l : lanes_) {
      cudaStreamDestroy(l.stream);
      for (auto e : {l.e0, l.e1, l.e2, l.e3, l.staged[0], l.staged[1]}) cudaEventDestroy(e);
    }
  }

  BackendInfo Info() const override {
    BackendInfo info = cpu_->Info();
    info.name = "cuda";
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
    if (OnHost(m == TridiagonalMethod::kAuto, p.batch * p.n)) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    return SolveTri(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p, TridiagonalMethod m,
                                  TridiagonalOutput<float> out, const SolveControl& c) override {
    if (OnHost(m == TridiagonalMethod::kAuto, p.batch * p.n)) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
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
    if (OnHost(m == TreeMethod::kAuto, p.batch * p.n)) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    return SolveTreeOnDevice(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m,
                                  TreeOutput<float> out, const SolveControl& c) override {
    if (OnHost(m == TreeMethod::kAuto, p.batch * p.n)) return Host(cpu_->Solve(p, m, out, c));
    UseDevice();
    return SolveTreeOnDevice(p, m, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<double> out,
                                  const SolveControl& c) override {
    UseDevice();
    return SolveBlockOnDevice(p, m, o, out, c);
  }
  absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p, BlockMethod m,
                                  const BlockOptions& o, BlockOutput<float> out,
                                  const SolveControl& c) override {
    UseDevice();
    return SolveBlockOnDevice(p, m, o, out, c);
  }

  absl::StatusOr<bool> PinHostMemory(void* p, int64_t bytes) override {
    cudaSetDevice(options_.device);
    const cudaError_t e = cudaHostRegister(p, size_t(bytes), cudaHostRegisterPortable);
    // Registered already, portably, by another device's backend of this process: usable here.
    const bool owner = e == cudaSuccess;
    if (e == cudaErrorHostMemoryAlreadyRegistered) (void)cudaGetLastError();
    if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaHostRegister of ", bytes, " bytes: ", cudaGetErrorString(e)));
    }
    std::unique_lock<std::shared_mutex> lock(pinned_mu_);
    pinned_ranges_[static_cast<const std::byte*>(p)] = {bytes, owner};
    return true;
  }

  void UnpinHostMemory(void* p) override {
    {
      std::unique_lock<std::shared_mutex> lock(pinned_mu_);
      auto it = pinned_ranges_.find(static_cast<const std::byte*>(p));
      if (it == pinned_ranges_.end()) return;
      const bool owner = it->second.second;
      pinned_ranges_.erase(it);
      if (!owner) return;
    }
    cudaSetDevice(options_.device);
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
  }

  // Whether [p, p + bytes) lies in memory PinHostMemory page-locked: the device copies straight
  // from and into it.
  bool Pinned(const void* p, int64_t bytes) const {
    const auto* b = static_cast<const std::byte*>(p);
    std::shared_lock<std::shared_mutex> lock(pinned_mu_);
    auto it = pinned_ranges_.upper_bound(b);
    if (it == pinned_ranges_.begin()) return false;
    --it;
    return b >= it->first && b + bytes <= it->first + it->second.first;
  }

  absl::StatusOr<std::unique_ptr<PreparedSystem>> Prepare(const SystemSpec& spec) override {
    UseDevice();
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
    return SolvePreparedOnDevice(system, rhs, x, status, c);
  }
  absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs, float* x,
                                          SystemStatus* status, const SolveControl& c) override {
    UseDevice();
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
      if (auto st = PreparedSystem::Update(i, values); !st.ok()) return st;
      replicated.Release();
      replicated_k = 0;
      return Upload(i);
    }
    absl::Status Upload(int i) {
      if (IsTreeParent(spec_, i)) return absl::OkStatus();
      return backend_->CopyToDevice(host_[size_t(i)].data(), device.as<std::byte>() + offset[size_t(i)],
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

  // Host to device through the pinned staging pieces, on a lane of its own; waits.
  absl::Status CopyToDevice(const void* host, void* dev, int64_t bytes) {
    cudaSetDevice(options_.device);
    auto pinned = pinned_pool_.Get(2 * kStagingChunk);
    if (!pinned.ok()) return pinned.status();
    const LaneLease lease(this);
    Lane& l = lease.lane();
    if (auto st = StageIn(l, static_cast<std::byte*>(pinned->get()), host, dev, bytes); !st.ok())
      return st;
    return cuda::CudaStatus(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
  }

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
    const LaneLease lease(this);
    cudaStream_t stream = lease.lane().stream;
    for (int i = 0; i < spec.num_coefficients(); ++i) {
      if (IsTreeParent(spec, i)) continue;
      const auto* src = s.device.as<const std::byte>() + s.offset[size_t(i)];
      auto* dst = buf->as<std::byte>() + s.replicated_offset[size_t(i)];
      if (layout == Layout::kFlat) {
        TRISOLVE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst, src, size_t(n * eb), cudaMemcpyDeviceToDevice, stream));
        for (int64_t have = 1; have < k; have *= 2) {
          const int64_t copy = std::min(have, k - have);
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + have * n * eb, dst,
                                                        size_t(copy * n * eb),
                                                        cudaMemcpyDeviceToDevice, stream));
        }
      } else {
        // Column 0 of the [n, k] array, then columns [have, 2 have) from [0, have).
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, size_t(k * eb), src, size_t(eb),
                                                        size_t(eb), size_t(n),
                                                        cudaMemcpyDeviceToDevice, stream));
        for (int64_t have = 1; have < k; have *= 2) {
          const int64_t copy = std::min(have, k - have);
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
              dst + have * eb, size_t(k * eb), dst, size_t(k * eb), size_t(copy * eb), size_t(n),
              cudaMemcpyDeviceToDevice, stream));
        }
      }
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
  struct Lane {
    cudaStream_t stream = nullptr;
    cudaEvent_t e0, e1, e2, e3;  // h2d start, kernel start, kernel end, d2h end
    cudaEvent_t staged[2];       // staging buffer i may be refilled
  };

  // auto sends the linear-time families' smallest requests to the host: a system of 64
  // unknowns takes ~1 us there and 250-370 us through the copies and a launch (H100, issue 31).
  bool OnHost(bool is_auto, int64_t unknowns) const {
    return is_auto && unknowns < options_.host_below_unknowns;
  }
  static absl::StatusOr<SolveInfo> Host(absl::StatusOr<SolveInfo> r) {
    if (r.ok()) r->method += " (host)";
    return r;
  }

  int AcquireLane() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty(); });
    const int i = free_.back();
    free_.pop_back();
    return i;
  }
  void ReleaseLane(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(i);
    cv_.notify_one();
  }
  // A lane (stream and events) held until destroyed.
  class LaneLease {
   public:
    explicit LaneLease(CudaBackend* b) : b_(b), i_(b->AcquireLane()) {}
    LaneLease(const LaneLease&) = delete;
    LaneLease& operator=(const LaneLease&) = delete;
    ~LaneLease() { b_->ReleaseLane(i_); }
    Lane& lane() const { return b_->lanes_[size_t(i_)]; }

   private:
    CudaBackend* b_;
    int i_;
  };

  // Host -> device through two pinned pieces in turn: the memcpy into one overlaps the DMA of
  // the other (pageable copies run at a sixth of the pinned rate).
  absl::Status StageIn(Lane& l, std::byte* pinned, const void* src, void* dst, int64_t bytes) {
    if (Pinned(src, bytes))
      return cuda::CudaStatus(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice,
                                              l.stream),
                              "cudaMemcpyAsync");
    const auto* s = static_cast<const std::byte*>(src);
    auto* d = static_cast<std::byte*>(dst);
    int buf = 0;
    for (int64_t off = 0; off < bytes; off += kStagingChunk, buf ^= 1) {
      const int64_t len = std::min(kStagingChunk, bytes - off);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(l.staged[buf]));
      std::memcpy(pinned + buf * kStagingChunk, s + off, size_t(len));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d + off, pinned + buf * kStagingChunk,
                                                    size_t(len), cudaMemcpyHostToDevice,
                                                    l.stream));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.staged[buf], l.stream));
    }
    return absl::OkStatus();
  }

  absl::Status StageOut(Lane& l, std::byte* pinned, const void* src, void* dst, int64_t bytes) {
    if (Pinned(dst, bytes))
      return cuda::CudaStatus(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost,
                                              l.stream),
                              "cudaMemcpyAsync");
    const auto* s = static_cast<const std::byte*>(src);
    auto* d = static_cast<std::byte*>(dst);
    const int64_t pieces = (bytes + kStagingChunk - 1) / kStagingChunk;
    auto issue = [&](int64_t i) -> absl::Status {
      const int64_t off = i * kStagingChunk, len = std::min(kStagingChunk, bytes - off);
      const int buf = int(i & 1);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned + buf * kStagingChunk, s + off,
                                                    size_t(len), cudaMemcpyDeviceToHost,
                                                    l.stream));
      return cuda::CudaStatus(cudaEventRecord(l.staged[buf], l.stream), "cudaEventRecord");
    };
    if (pieces > 0)
      if (auto st = issue(0); !st.ok()) return st;
    for (int64_t i = 0; i < pieces; ++i) {
      if (i + 1 < pieces)
        if (auto st = issue(i + 1); !st.ok()) return st;
      const int buf = int(i & 1);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(l.staged[buf]));
      const int64_t off = i * kStagingChunk, len = std::min(kStagingChunk, bytes - off);
      std::memcpy(d + off, pinned + buf * kStagingChunk, size_t(len));
    }
    return absl::OkStatus();
  }

  // Stages `inputs` (each elems values of T) into pooled device memory, runs `launch(device
  // inputs, x, flags, stream)`, copies x and the per-system flags back. Systems flagged by the
  // kernel get status singular and x = 0.
  // Inputs are (host pointer, values); x has batch * n values. A launch that leaves its answer
  // pending in *later (thomas-window) gets it after the copy back's wait, and x and the flags
  // are copied back again where that answer solved the problem again.
  template <typename T, typename Launch>
  absl::StatusOr<SolveInfo> Staged(const std::vector<Input<T>>& inputs,
                                   int64_t batch, int64_t n, Layout layout, T* out_x,
                                   SystemStatus* out_status, Launch launch,
                                   cuda::LaterAnswer* later = nullptr) {
    cudaSetDevice(options_.device);
    const bool trap = FaultInjection::Process().NextSolveIsSticky();  // test-only
    const int64_t elems = batch * n, bytes = elems * int64_t(sizeof(T));
    const int64_t k = int64_t(inputs.size());
    int64_t in_values = 0;  // those to stage: resident inputs are on the device already
    for (const auto& in : inputs) in_values += in.device ? 0 : in.values;
    auto dev = device_pool_.Get((in_values + elems) * int64_t(sizeof(T)) + batch);
    if (!dev.ok()) return dev.status();
    // A small request moves in one copy each way (the staged inputs lie one after the other on
    // the device, x and the flags too): every separate copy costs a round trip. Its pinned
    // staging is its own size: two 16 MiB pieces for every small request in flight emptied
    // the pinned pool (2 GiB) at 64 concurrent requests and sent them to cudaHostAlloc.
    const int64_t staged_bytes = in_values * int64_t(sizeof(T));
    // Inputs and x in page-locked client memory (shared-memory regions) of a megabyte or more
    // move straight, without the staging copy.
    bool all_pinned = Pinned(out_x, bytes);
    for (int64_t q = 0; q < k && all_pinned; ++q)
      all_pinned = inputs[q].device != nullptr ||
                   Pinned(inputs[q].host, inputs[q].values * int64_t(sizeof(T)));
    const bool one_copy = staged_bytes <= kStagingChunk && bytes + batch <= kStagingChunk &&
                          !(all_pinned && staged_bytes >= (int64_t{1} << 20));
    auto pinned =
        pinned_pool_.Get(one_copy ? std::max(staged_bytes, bytes + batch) : 2 * kStagingChunk);
    if (!pinned.ok()) return pinned.status();
    const LaneLease lease(this);
    Lane& l = lease.lane();
    T* base = static_cast<T*>(dev->get());
    std::vector<T*> din(static_cast<size_t>(k));
    T* next = base;
    for (int64_t q = 0; q < k; ++q) {
      if (inputs[q].device) {
        din[q] = const_cast<T*>(inputs[q].device);  // read only by every kernel
        continue;
      }
      din[q] = next;
      next += inputs[q].values;
    }
    T* dx = next;
    auto* flags = reinterpret_cast<uint8_t*>(dx + elems);
    auto* pin = static_cast<std::byte*>(pinned->get());
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e0, l.stream));
    if (one_copy) {
      std::byte* p = pin;
      for (int64_t q = 0; q < k; ++q)
        if (!inputs[q].device) {
          const size_t b = size_t(inputs[q].values) * sizeof(T);
          std::memcpy(p, inputs[q].host, b);
          p += b;
        }
      if (staged_bytes > 0)
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base, pin, size_t(staged_bytes),
                                                      cudaMemcpyHostToDevice, l.stream));
    } else {
      for (int64_t q = 0; q < k; ++q)
        if (!inputs[q].device)
          if (auto st = StageIn(l, pin, inputs[q].host, din[q],
                                inputs[q].values * int64_t(sizeof(T)));
              !st.ok())
            return st;
    }
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(batch), l.stream));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e1, l.stream));
    // A pending answer left by an error return is dropped (its kernel waited for) before the
    // lane and the buffers go back.
    struct Settle {
      cuda::LaterAnswer* later;
      ~Settle() {
        if (later != nullptr && later->pending()) *later = cuda::LaterAnswer();
      }
    } settle{later};
    absl::StatusOr<std::string> method = launch(din, dx, flags, l.stream);
    if (!method.ok()) return method.status();
    if (trap)
      if (auto st = cuda::LaunchTrap(l.stream); !st.ok()) return st;
    std::vector<uint8_t> f(static_cast<size_t>(batch));
    auto copy_back = [&]() -> absl::Status {
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e2, l.stream));
      if (one_copy) {
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pin, dx, size_t(bytes + batch),
                                                      cudaMemcpyDeviceToHost, l.stream));
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e3, l.stream));
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(l.stream));
        std::memcpy(out_x, pin, size_t(bytes));
        std::memcpy(f.data(), pin + bytes, size_t(batch));
        return absl::OkStatus();
      }
      if (auto st = StageOut(l, pin, dx, out_x, bytes); !st.ok()) return st;
      TRISOLVE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(f.data(), flags, size_t(batch), cudaMemcpyDeviceToHost, l.stream));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e3, l.stream));
      return cuda::CudaStatus(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
    };
    if (auto st = copy_back(); !st.ok()) return st;
    if (later != nullptr && later->pending()) {
      // (kernel_us then counts from the first launch to the second copy back's start.)
      bool again = false;
      auto ran = later->Finish(&again);
      if (!ran.ok()) return ran.status();
      *method = cuda::KernelName(*ran);
      if (again)
        if (auto st = copy_back(); !st.ok()) return st;
    }
    const int64_t st = ElementStride(layout, batch);
    for (int64_t s = 0; s < batch; ++s) {
      out_status[s] = f[s] ? SystemStatus::kSingular : SystemStatus::kOk;
      if (f[s])  // a system whose pivot vanished: zeros, never what the kernel left
        for (int64_t i = 0; i < n; ++i) out_x[SystemOffset(layout, n, s) + i * st] = T(0);
    }
    SolveInfo info;
    info.method = *method;
    info.h2d_us = Ms(l.e0, l.e1) * 1e3;
    info.kernel_us = Ms(l.e1, l.e2) * 1e3;
    info.d2h_us = Ms(l.e2, l.e3) * 1e3;
    return info;
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveTri(const TridiagonalProblem<T>& p, TridiagonalMethod m,
                                     TridiagonalOutput<T> out, const SolveControl&,
                                     const Resident<T>* resident = nullptr) {
    // pivoting: the CPU reference's partial pivoting on the host (a GPU pivoting kernel at the
    // memory bandwidth is a later task, issue 33).
    if (m == TridiagonalMethod::kPivoting) return Host(cpu::SolveTridiagonal(p, m, out));
    const int64_t e = p.batch * p.n;
    cuda::LaterAnswer later;
    std::vector<Input<T>> in = {{p.a, e}, {p.b, e}, {p.c, e}, {p.d, e}};
    MarkResident(in, resident);
    auto solved = Staged<T>(in, p.batch, p.n, p.layout, out.x,
                     out.status,
                     [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
                         cudaStream_t stream) -> absl::StatusOr<std::string> {
                       TridiagonalProblem<T> dp{p.batch, p.n, p.layout, d[0], d[1], d[2], d[3]};
                       auto k = cuda::SolveTridiagonalDevice(dp, m, dx, flags, device_pool_,
                                                             stream, &later);
                       if (!k.ok()) return k.status();
                       return std::string(cuda::KernelName(*k));
                     },
                     &later);
    // auto: every system whose pivot vanished on the device is solved again by partial
    // pivoting on the host, from the host arrays (x and status patched in place), so a
    // nonsingular system never comes back SINGULAR.
    if (solved.ok() && m == TridiagonalMethod::kAuto)
      cpu::ResolveSingularWithPivoting(p, out, &*solved);
    return solved;
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveBlockOnDevice(const BlockTridiagonalProblem<T>& p, BlockMethod m,
                                               const BlockOptions& o, BlockOutput<T> out,
                                               const SolveControl& c,
                                               const Resident<T>* resident = nullptr) {
    const int64_t size = p.N * p.M;
    const bool automatic = m == BlockMethod::kAuto;
    m = cuda::ResolveBlockMethod(p, m, o);  // block/dispatch.cu
    std::vector<Input<T>> in = {{p.aC, size}, {p.cC, size}, {p.bC, size},
                                {p.cA, size}, {p.cB, size}, {p.f, size}};
    if (p.y0) in.push_back({p.y0, size});
    MarkResident(in, resident);
    SystemStatus st = SystemStatus::kOk;
    SolveInfo solved;
    auto info = Staged<T>(
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
        });
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
    const cuda::DensePath path = cuda::ChooseDensePath(p.n, m);  // dense/dispatch.cc
    std::vector<Input<T>> in = {{p.A, p.batch * p.n * p.n}, {p.b, p.batch * p.n}};
    MarkResident(in, resident);
    return Staged<T>(in, p.batch, p.n,
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
                     });
  }

  // The cable plan of a parent array, built once and kept for the next time steps (a small
  // cache of the most recent morphologies, compared by content).
  absl::StatusOr<std::shared_ptr<const cuda::TreeCablesPlan>> CablesPlan(const int32_t* parent,
                                                                          int64_t n,
                                                                          cudaStream_t stream) {
    {
      std::lock_guard<std::mutex> lock(plans_mu_);
      for (auto it = plans_.begin(); it != plans_.end(); ++it)
        if (int64_t(it->first.size()) == n &&
            std::memcmp(it->first.data(), parent, size_t(n) * 4) == 0) {
          auto plan = it->second;
          plans_.splice(plans_.begin(), plans_, it);  // most recent first
          return plan;
        }
    }
    auto made = cuda::TreeCablesPlan::Make(parent, n, device_pool_, stream);
    if (!made.ok()) return made.status();
    std::shared_ptr<const cuda::TreeCablesPlan> plan(std::move(*made));
    std::lock_guard<std::mutex> lock(plans_mu_);
    plans_.emplace_front(std::vector<int32_t>(parent, parent + n), plan);
    while (plans_.size() > kPlansKept) plans_.pop_back();
    return plan;
  }

  template <typename T>
  absl::StatusOr<SolveInfo> SolveTreeOnDevice(const TreeProblem<T>& p, TreeMethod m,
                                              TreeOutput<T> out, const SolveControl& c,
                                              const Resident<T>* resident = nullptr) {
    const bool per_cell = p.parent_per_system && p.batch > 1;
    // One morphology: its plan (cached), which the choice reads (tree/dispatch.cc).
    std::shared_ptr<const cuda::TreeCablesPlan> plan;
    if (cuda::TreeWantsPlan(p, m)) {
      auto made = CablesPlan(p.parent, p.n, nullptr);
      if (!made.ok()) return made.status();
      plan = *made;
    }
    const cuda::TreePath path = cuda::ChooseTreePath(p, m, plan.get());
    if (path == cuda::TreePath::kHost) return Host(cpu_->Solve(p, m, out, c));
    const bool contraction = path == cuda::TreePath::kContractionBlock;
    const bool block = path == cuda::TreePath::kCablesBlock;
    const bool cables = block || path == cuda::TreePath::kCables;
    const int64_t e = p.batch * p.n;
    std::vector<Input<T>> in = {{p.lower, e}, {p.upper, e}, {p.diag, e}, {p.rhs, e}};
    MarkResident(in, resident);
    if (contraction || cables) {
      return Staged<T>(in, p.batch, p.n, p.layout, out.x, out.status,
                       [&](const std::vector<T*>& d, T* dx, uint8_t* flags,
                           cudaStream_t stream) -> absl::StatusOr<std::string> {
                         TreeProblem<T> dp = p;
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
                       });
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
    return Staged<T>(in, p.batch, p.n, p.layout, out.x, out.status,
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
                     });
  }

  static constexpr size_t kPlansKept = 4;

  const CudaOptions options_;
  const cudaDeviceProp prop_;
  mutable Pool device_pool_;
  mutable Pool pinned_pool_;
  std::unique_ptr<Backend> cpu_;
  std::vector<Lane> lanes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_;
  cuda::DenseLibs dense_libs_;  // destroyed before the pools
  std::mutex plans_mu_;
  std::list<std::pair<std::vector<int32_t>, std::shared_ptr<const cuda::TreeCablesPlan>>> plans_;
  mutable std::shared_mutex pinned_mu_;
  // PinHostMemory's: start -> (bytes, whether this backend registered it and unregisters it).
  std::map<const std::byte*, std::pair<int64_t, bool>> pinned_ranges_;
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
  // of the same host (H100: 16 clients of 64-unknown requests, p90 18-22 ms).
  // (Set on the device's primary context, active or not; where it cannot be, they spin.)
  if (auto st = cuda::CudaStatus(cudaSetDevice(o.device), "cudaSetDevice"); !st.ok()) return st;
  (void)cudaSetDeviceFlags(cudaDeviceScheduleYield);
  (void)cudaGetLastError();
  const int64_t cap = o.device_pool_cap_bytes > 0 ? o.device_pool_cap_bytes
                                                  : int64_t(double(prop.totalGlobalMem) * 0.8);
  return std::unique_ptr<Backend>(new CudaBackend(o, prop, cap));
}

}  // namespace trisolve
