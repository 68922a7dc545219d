// The CUDA backend's transfers: the lanes (a stream and its events each) that requests take
// in turn, the pinned staging pieces that host arrays move through, the registry of client
// memory page-locked in place (shared-memory regions), and Staged, the copy-in, launch,
// copy-back frame of every family's solve. cuda/backend.cc owns one per device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/finite_scan.h"
#include "runtime/check.h"
#include "runtime/fault_injection.h"
#include "runtime/memory_pool.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/backend.h"
#include "trisolve/fault_injection.h"

namespace trisolve::cuda {

constexpr int64_t kStagingChunk = int64_t{16} << 20;  // bytes per pinned staging piece
// A solve whose arrays all lie in page-locked client memory moves in pieces of whole systems,
// the copy in of one piece beside the solve of the one before and the copy back of the one
// before that (docs/kernels/README.md, "Backends"): at least this many bytes to move in, and at
// most PipelinePieces() pieces of at least kMinPieceBytes each.
constexpr int64_t kPipelineBytes = int64_t{16} << 20;
constexpr int64_t kMinPieceBytes = int64_t{4} << 20;
constexpr int kMaxPieces = 32;  // the events a lane holds
// The most pieces: 8, or TRISOLVE_STAGING_PIECES (2 to kMaxPieces) where set, for benchmarks
// that weigh the last piece's copy back against the pieces' fixed costs.
int PipelinePieces();
// The pieces the last equal piece is cut into: 1, or TRISOLVE_STAGING_TAPER (1 to 8) where set.
int PipelineTaper();

// One input array of a solve: staged from the host, or already on the device (a prepared
// system's coefficients).
template <typename T>
struct StagedInput {
  const T* host = nullptr;
  int64_t values = 0;
  const T* device = nullptr;
  bool scanned = true;  // checked for NaN and Inf under check_finite (false: a plan's bytes)
  // `device` is a client's memory (OpenDeviceMemory), not a prepared system's: scanned under
  // check_finite as a staged input is.
  bool client_device = false;
};

// Copies the n values (eb bytes each) at src k times into dst on `stream`, by doubling
// device-to-device copies (log2 k of them): [k, n] flat, or [n, k] interleaved. Queues them.
absl::Status ReplicateOnDevice(const std::byte* src, std::byte* dst, int64_t n, int64_t eb,
                               int64_t k, Layout layout, cudaStream_t stream);

class Stager {
 public:
  struct Lane {
    cudaStream_t stream = nullptr;
    cudaEvent_t e0, e1, e2, e3;  // h2d start, kernel start, kernel end, d2h end
    cudaEvent_t staged[2];       // staging buffer i may be refilled
    // Pipelined solves: the copies in and back on streams of their own, and each piece's
    // events (copied in, solve started, solved).
    cudaStream_t in = nullptr, out = nullptr;
    cudaEvent_t piece_in[kMaxPieces], piece_start[kMaxPieces], piece_done[kMaxPieces];
  };

  // `streams` lanes on `device`; the pools are the backend's and outlive this.
  Stager(int device, int streams, Pool& device_pool, Pool& pinned_pool);
  ~Stager();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // The lanes' streams (the dense family's library handles are bound to them).
  const std::vector<Lane>& lanes() const { return lanes_; }

  // Page-locks [p, p + bytes) in place (Backend::PinHostMemory), and undoes it.
  absl::StatusOr<bool> Pin(void* p, int64_t bytes);
  void Unpin(void* p);
  // Whether [p, p + bytes) lies in memory Pin page-locked: the device copies straight from and
  // into it.
  bool Pinned(const void* p, int64_t bytes) const;

  // A client's device memory (Backend::OpenDeviceMemory): each CUDA IPC handle opened once,
  // its mapping shared by the regions that name it and closed with the last of them.
  absl::StatusOr<void*> OpenIpc(const std::string& handle, int64_t offset, int64_t bytes);
  void CloseIpc(void* p);
  // Whether [p, p + bytes) lies in a client's device memory that OpenIpc mapped: inputs there
  // are read in place, x is copied there on the device, and the host never touches them.
  bool OnDevice(const void* p, int64_t bytes) const;

  // Host to device through the pinned staging pieces, on a lane of its own; waits.
  absl::Status CopyToDevice(const void* host, void* dev, int64_t bytes);

  // A lane (stream and events) held until destroyed.
  class LaneLease {
   public:
    explicit LaneLease(Stager* b) : b_(b), i_(b->AcquireLane()) {}
    LaneLease(const LaneLease&) = delete;
    LaneLease& operator=(const LaneLease&) = delete;
    ~LaneLease() { b_->ReleaseLane(i_); }
    Lane& lane() const { return b_->lanes_[size_t(i_)]; }

   private:
    Stager* b_;
    int i_;
  };


  // Host -> device through two pinned pieces in turn: the memcpy into one overlaps the DMA of
  // the other (pageable copies run at a sixth of the pinned rate); and back.
  absl::Status StageIn(Lane& l, std::byte* pinned, const void* src, void* dst, int64_t bytes);
  absl::Status StageOut(Lane& l, std::byte* pinned, const void* src, void* dst, int64_t bytes);

  // Stages `inputs` (each elems values of T) into pooled device memory, runs `launch(device
  // inputs, x, flags, stream)`, copies x and the per-system flags back. Systems flagged by the
  // kernel get status singular and x = 0.
  // Inputs are (host pointer, values); x has batch * n values. A launch that leaves its answer
  // pending in *later (thomas-window) gets it after the copy back's wait, and x and the flags
  // are copied back again where that answer solved the problem again.
  // A launch that also takes a count of systems, `launch(inputs, x, flags, stream, systems)`,
  // can be run on pieces of the batch: where every array is flat, batch * n values long and in
  // page-locked memory, the pieces' copies in and back overlap the solves (Pipelined).
  // check_finite: the staged inputs are scanned for NaN and Inf on the device
  // (SolveControl::check_finite); one found fails the call with NonFiniteInputError().
  // `offsets` (host, batch + 1): a variable-size batch (TridiagonalProblem::offsets), x then
  // offsets[batch] values, system s at offsets[s].
  // Inputs in a client's device memory (OnDevice) are read where they lie; x there gets the
  // answer by a copy on the device, the flagged systems zeroed on the device first.
  // Only kFlagVanished makes a system singular (tridiagonal/flags.h); `flags_out` (batch bytes,
  // or null) gets the flags as the kernels left them, for a caller that solves again the
  // systems flagged otherwise.
  template <typename T, typename Launch>
  absl::StatusOr<SolveInfo> Staged(const std::vector<StagedInput<T>>& given,
                                   int64_t batch, int64_t n, Layout layout, T* out_x,
                                   SystemStatus* out_status, Launch launch,
                                   cuda::LaterAnswer* later = nullptr,
                                   bool check_finite = false,
                                   const int64_t* offsets = nullptr,
                                   uint8_t* flags_out = nullptr) {
    cudaSetDevice(device_);
    const bool trap = FaultInjection::Process().NextSolveIsSticky();  // test-only
    const int64_t elems = offsets != nullptr ? offsets[batch] : batch * n;
    const int64_t bytes = elems * int64_t(sizeof(T));
    const int64_t k = int64_t(given.size());
    std::vector<StagedInput<T>> inputs = given;
    for (auto& in : inputs)
      if (in.device == nullptr && in.host != nullptr &&
          OnDevice(in.host, in.values * int64_t(sizeof(T)))) {
        in.device = in.host;
        in.client_device = true;
      }
    const bool x_on_device = OnDevice(out_x, bytes);
    int64_t in_values = 0;  // those to stage: resident inputs are on the device already
    for (const auto& in : inputs) in_values += in.device ? 0 : in.values;
    // The per-system flags, then one byte the finiteness scan sets.
    const int64_t flag_bytes = batch + 1;
    auto dev = device_pool_.Get((in_values + elems) * int64_t(sizeof(T)) + flag_bytes);
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
    const bool one_copy = staged_bytes <= kStagingChunk && bytes + flag_bytes <= kStagingChunk &&
                          !(all_pinned && staged_bytes >= (int64_t{1} << 20));
    constexpr bool kPieceWise =
        std::is_invocable_v<Launch&, const std::vector<T*>&, T*, uint8_t*, cudaStream_t, int64_t>;
    if constexpr (kPieceWise) {
      bool in_pieces = layout == Layout::kFlat && all_pinned && !trap && batch >= 2 &&
                       staged_bytes >= kPipelineBytes;
      for (int64_t q = 0; q < k && in_pieces; ++q) in_pieces = inputs[q].values == elems;
      if (in_pieces)
        return Pipelined<T>(inputs, batch, n, static_cast<T*>(dev->get()), out_x, out_status,
                            launch, check_finite, flags_out);
    }
    auto pinned = pinned_pool_.Get(one_copy ? std::max(staged_bytes, bytes + flag_bytes)
                                            : 2 * kStagingChunk);
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
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(flag_bytes), l.stream));
    if (check_finite)
      for (int64_t q = 0; q < k; ++q)
        if (Scanned(inputs[q]))
          if (auto st = ScanNonFinite(din[q], inputs[q].values, flags + batch, l.stream);
              !st.ok())
            return st;
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e1, l.stream));
    // A pending answer left by an error return is dropped (its kernel waited for) before the
    // lane and the buffers go back.
    struct Settle {
      cuda::LaterAnswer* later;
      ~Settle() {
        if (later != nullptr && later->pending()) *later = cuda::LaterAnswer();
      }
    } settle{later};
    absl::StatusOr<std::string> method = [&] {
      if constexpr (kPieceWise) return launch(din, dx, flags, l.stream, batch);
      else return launch(din, dx, flags, l.stream);
    }();
    if (!method.ok()) return method.status();
    if (trap)
      if (auto st = cuda::LaunchTrap(l.stream); !st.ok()) return st;
    std::vector<uint8_t> f(static_cast<size_t>(flag_bytes));
    auto copy_back = [&]() -> absl::Status {
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e2, l.stream));
      if (x_on_device) {  // the flags only: x goes across on the device once it is final
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(f.data(), flags, size_t(flag_bytes),
                                                      cudaMemcpyDeviceToHost, l.stream));
        return cuda::CudaStatus(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
      }
      if (one_copy) {
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pin, dx, size_t(bytes + flag_bytes),
                                                      cudaMemcpyDeviceToHost, l.stream));
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e3, l.stream));
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(l.stream));
        std::memcpy(out_x, pin, size_t(bytes));
        std::memcpy(f.data(), pin + bytes, size_t(flag_bytes));
        return absl::OkStatus();
      }
      if (auto st = StageOut(l, pin, dx, out_x, bytes); !st.ok()) return st;
      TRISOLVE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(f.data(), flags, size_t(flag_bytes), cudaMemcpyDeviceToHost, l.stream));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e3, l.stream));
      return cuda::CudaStatus(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
    };
    if (auto st = copy_back(); !st.ok()) return st;
    if (check_finite && f[size_t(batch)] != 0) return NonFiniteInputError();
    if (later != nullptr && later->pending()) {
      // (kernel_us then counts from the first launch to the second copy back's start.)
      bool again = false;
      auto ran = later->FinishNamed(&again);
      if (!ran.ok()) return ran.status();
      *method = *std::move(ran);
      if (again)
        if (auto st = copy_back(); !st.ok()) return st;
    }
    if (flags_out != nullptr) std::memcpy(flags_out, f.data(), size_t(batch));
    if (x_on_device) {
      if (auto st = ZeroFlaggedOnDevice(f.data(), batch, n, layout, dx, offsets, l.stream);
          !st.ok())
        return st;
      TRISOLVE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(out_x, dx, size_t(bytes), cudaMemcpyDefault, l.stream));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e3, l.stream));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(l.stream));
      SetStatuses(f.data(), batch, n, layout, static_cast<T*>(nullptr), out_status, offsets);
    } else {
      SetStatuses(f.data(), batch, n, layout, out_x, out_status, offsets);
    }
    SolveInfo info;
    info.method = *method;
    info.h2d_us = Ms(l.e0, l.e1) * 1e3;
    info.kernel_us = Ms(l.e1, l.e2) * 1e3;
    info.d2h_us = Ms(l.e2, l.e3) * 1e3;
    info.inputs_checked = check_finite;
    return info;
  }

 private:
  // Systems flagged kFlagVanished by the kernel: status singular, and zeros, never what the
  // kernel left.
  // (offsets: a variable-size batch's, system s at offsets[s].)
  // (out_x null: the statuses only; x lies on the device, ZeroFlaggedOnDevice's.)
  template <typename T>
  static void SetStatuses(const uint8_t* f, int64_t batch, int64_t n, Layout layout, T* out_x,
                          SystemStatus* out_status, const int64_t* offsets = nullptr) {
    // A pass without branches first (it vectorizes: 65,536 systems a call by handle), then x
    // zeroed only where some system is singular.
    uint8_t any = 0;
    for (int64_t s = 0; s < batch; ++s) {
      const uint8_t singular = f[s] & cuda::kFlagVanished;
      any |= singular;
      out_status[s] = singular != 0 ? SystemStatus::kSingular : SystemStatus::kOk;
    }
    if (any == 0 || out_x == nullptr) return;
    const int64_t st = ElementStride(layout, batch);
    for (int64_t s = 0; s < batch; ++s) {
      const bool singular = (f[s] & cuda::kFlagVanished) != 0;
      if (singular && offsets != nullptr)
        std::fill(out_x + offsets[s], out_x + offsets[s + 1], T(0));
      else if (singular)
        for (int64_t i = 0; i < n; ++i) out_x[SystemOffset(layout, n, s) + i * st] = T(0);
    }
  }

  // The flagged systems of x on the device set to zero (a memset a system: flagged systems
  // are few, and this runs only for answers that stay on the device).
  template <typename T>
  static absl::Status ZeroFlaggedOnDevice(const uint8_t* f, int64_t batch, int64_t n,
                                          Layout layout, T* dx, const int64_t* offsets,
                                          cudaStream_t stream) {
    for (int64_t s = 0; s < batch; ++s) {
      if (!(f[s] & cuda::kFlagVanished)) continue;
      if (offsets != nullptr)
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
            dx + offsets[s], 0, size_t(offsets[s + 1] - offsets[s]) * sizeof(T), stream));
      else if (layout == Layout::kFlat)
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dx + s * n, 0, size_t(n) * sizeof(T), stream));
      else
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(dx + s, size_t(batch) * sizeof(T), 0,
                                                        sizeof(T), size_t(n), stream));
    }
    return absl::OkStatus();
  }
  // Whether check_finite scans this input: staged ones and a client's device memory; not a
  // prepared system's coefficients (checked when they came) nor a plan's bytes.
  template <typename T>
  static bool Scanned(const StagedInput<T>& in) {
    return in.scanned && (in.device == nullptr || in.client_device);
  }

  // Staged's pipelined form: every array flat, batch * n values, in page-locked memory (or on
  // the device already). The batch is cut into pieces of whole systems; piece i's copy in (on
  // the lane's `in` stream) runs beside piece i-1's solve (the lane's stream) and piece i-2's
  // copy back (`out`): the copies in and back use the link's two directions at once, and the
  // solve hides under them. Timings: h2d from the start to the last piece in, kernel the sum
  // of the pieces' solves, d2h what the last copy back added after the last solve.
  template <typename T, typename Launch>
  absl::StatusOr<SolveInfo> Pipelined(const std::vector<StagedInput<T>>& inputs, int64_t batch,
                                      int64_t n, T* base, T* out_x, SystemStatus* out_status,
                                      Launch& launch, bool check_finite,
                                      uint8_t* flags_out = nullptr) {
    const int64_t k = int64_t(inputs.size()), elems = batch * n, eb = int64_t(sizeof(T));
    int64_t staged_bytes = 0;
    for (const auto& in : inputs) staged_bytes += in.device ? 0 : in.values * eb;
    const int equal = int(std::clamp<int64_t>(staged_bytes / kMinPieceBytes, 2,
                                              std::min<int64_t>(PipelinePieces(), batch)));
    // The last of the equal pieces cut in PipelineTaper() (what follows the last byte in is
    // the last piece's solve and copy back): boundaries in systems, ascending, 0 to batch.
    std::vector<int64_t> bounds;
    for (int i = 0; i < equal - 1; ++i) bounds.push_back(batch * i / equal);
    const int64_t last0 = batch * (equal - 1) / equal;
    const int64_t taper = std::min<int64_t>({PipelineTaper(), batch - last0, kMaxPieces - equal + 1});
    for (int64_t j = 0; j < taper; ++j) bounds.push_back(last0 + (batch - last0) * j / taper);
    bounds.push_back(batch);
    const int pieces = int(bounds.size()) - 1;
    std::vector<T*> din(static_cast<size_t>(k));
    T* next = base;
    for (int64_t q = 0; q < k; ++q) {
      if (inputs[q].device) {
        din[q] = const_cast<T*>(inputs[q].device);
        continue;
      }
      din[q] = next;
      next += elems;
    }
    T* dx = next;
    auto* flags = reinterpret_cast<uint8_t*>(dx + elems);
    const LaneLease lease(this);
    Lane& l = lease.lane();
    // Whatever happens, nothing may still be copying into or out of the buffers once they go
    // back to their pools.
    struct Drain {
      Lane& l;
      ~Drain() {
        cudaStreamSynchronize(l.in);
        cudaStreamSynchronize(l.stream);
        cudaStreamSynchronize(l.out);
      }
    } drain{l};
    auto first = [&](int i) { return bounds[size_t(i)]; };
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e0, l.in));
    for (int i = 0; i < pieces; ++i) {
      const int64_t s0 = first(i), off = s0 * n, len = (first(i + 1) - s0) * n * eb;
      for (int64_t q = 0; q < k; ++q)
        if (!inputs[q].device)
          TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(din[q] + off, inputs[q].host + off,
                                                        size_t(len), cudaMemcpyHostToDevice,
                                                        l.in));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.piece_in[i], l.in));
    }
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(batch + 1), l.stream));
    std::string method;
    for (int i = 0; i < pieces; ++i) {
      const int64_t s0 = first(i), systems = first(i + 1) - s0, off = s0 * n;
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(l.stream, l.piece_in[i], 0));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.piece_start[i], l.stream));
      std::vector<T*> piece(din.size());
      for (int64_t q = 0; q < k; ++q) {
        piece[q] = din[q] + off;
        if (check_finite && Scanned(inputs[q]))
          if (auto st = ScanNonFinite(piece[q], systems * n, flags + batch, l.stream); !st.ok())
            return st;
      }
      absl::StatusOr<std::string> m = launch(piece, dx + off, flags + s0, l.stream, systems);
      if (!m.ok()) return m.status();
      if (i == 0) method = *std::move(m);
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.piece_done[i], l.stream));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(l.out, l.piece_done[i], 0));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out_x + off, dx + off,
                                                    size_t(systems * n * eb),
                                                    cudaMemcpyDeviceToHost, l.out));
    }
    std::vector<uint8_t> f(static_cast<size_t>(batch + 1));
    TRISOLVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(f.data(), flags, f.size(), cudaMemcpyDeviceToHost, l.out));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(l.e3, l.out));
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(l.out));
    if (check_finite && f[size_t(batch)] != 0) return NonFiniteInputError();
    if (flags_out != nullptr) std::memcpy(flags_out, f.data(), size_t(batch));
    SetStatuses(f.data(), batch, n, Layout::kFlat, out_x, out_status);
    SolveInfo info;
    info.method = method;
    info.h2d_us = Ms(l.e0, l.piece_in[pieces - 1]) * 1e3;
    for (int i = 0; i < pieces; ++i) info.kernel_us += Ms(l.piece_start[i], l.piece_done[i]) * 1e3;
    info.d2h_us = Ms(l.piece_done[pieces - 1], l.e3) * 1e3;
    info.inputs_checked = check_finite;
    return info;
  }

  static double Ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms;
  }
  int AcquireLane();
  void ReleaseLane(int i);

  const int device_;
  Pool& device_pool_;
  Pool& pinned_pool_;
  std::vector<Lane> lanes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_;
  mutable std::shared_mutex pinned_mu_;
  // Pin's: start -> (bytes, whether this backend registered it and unregisters it).
  std::map<const std::byte*, std::pair<int64_t, bool>> pinned_ranges_;
  // OpenIpc's mappings, by their start (under pinned_mu_): the whole allocation a handle names.
  struct IpcMapping {
    int64_t bytes = 0;
    int regions = 0;
    std::string handle;
  };
  std::map<const std::byte*, IpcMapping> ipc_;
};

}  // namespace trisolve::cuda
