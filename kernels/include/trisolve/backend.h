// One interface, several backends (the Ginkgo way): the CPU reference runs everywhere, the
// CUDA backend plugs in behind the same calls. The server sees only this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/dense.h"
#include "trisolve/system.h"
#include "trisolve/tree.h"
#include "trisolve/tridiagonal.h"
#include "trisolve/types.h"

namespace trisolve {

struct DeviceInfo {
  std::string name;
  int64_t total_memory_bytes = 0;
  int64_t free_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessors = 0;
  int ordinal = -1;  // the CUDA device number
  // Calls placed on it (solves, prepared solves): counted by the multi-device backend, -1 where
  // the backend does not count them.
  int64_t jobs = -1;
  int64_t jobs_in_flight = -1;
  // Seconds summed over those calls, counted with them: each call's time on it (host work and
  // waits for a stream included), and the device's account of them (the copies in, the
  // kernels, the copies out: where they overlap, more than the call's time).
  double job_seconds = -1, h2d_seconds = -1, kernel_seconds = -1, d2h_seconds = -1;
};

struct MemoryPoolInfo {
  std::string name;  // "device", "pinned-host"; several devices: "device:1", "pinned-host:1"
  int64_t cap_bytes = 0, cached_bytes = 0, in_use_bytes = 0, peak_bytes = 0;
  int64_t hits = 0, misses = 0, evictions = 0;
};

struct BackendInfo {
  std::string name;  // "cpu" or "cuda"
  int threads = 0;   // CPU threads (the reference backend, and the CUDA backend's host side)
  std::vector<DeviceInfo> devices;
  std::vector<MemoryPoolInfo> pools;
  // Honours SolveControl::check_finite (checks the inputs on the device); the server then
  // leaves large requests' values to it.
  bool checks_finite = false;
};

// The failure of a call whose SolveControl::check_finite found a NaN or an Inf among the
// inputs. It names nothing: the caller runs its own check, which says which value it was.
absl::Status NonFiniteInputError();
bool IsNonFiniteInput(const absl::Status& s);

// A call refused for memory (a device pool's cap, the device itself, page-locked staging) while
// other calls may hold it: the same call can succeed once they end. `st` (RESOURCE_EXHAUSTED)
// with a payload that says so; the server runs such a call again when a job beside it ends.
absl::Status MemoryHeldByOthers(absl::Status st);
bool IsMemoryHeldByOthers(const absl::Status& s);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendInfo Info() const = 0;
  // OK while the backend can serve. UNAVAILABLE, for good, once its device is lost to this
  // process (a sticky CUDA error: an illegal address, a kernel's trap, an uncorrectable ECC
  // error): calls fail from then on, and only a new process can use the device again. Calls
  // that fail because of it fail UNAVAILABLE. The server asks when a call has failed.
  virtual absl::Status Health() const { return absl::OkStatus(); }

  // Each call solves one request. Inputs were validated by the caller (shapes, finiteness,
  // parent arrays); a vanishing pivot is reported in out.status, never as an error.
  virtual absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<double>& p,
                                          TridiagonalMethod m, TridiagonalOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const TridiagonalProblem<float>& p,
                                          TridiagonalMethod m, TridiagonalOutput<float> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const TreeProblem<double>& p, TreeMethod m,
                                          TreeOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const TreeProblem<float>& p, TreeMethod m,
                                          TreeOutput<float> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<double>& p,
                                          BlockMethod m, const BlockOptions& options,
                                          BlockOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const BlockTridiagonalProblem<float>& p,
                                          BlockMethod m, const BlockOptions& options,
                                          BlockOutput<float> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const DenseProblem<double>& p, DenseMethod m,
                                          DenseOutput<double> out,
                                          const SolveControl& control) = 0;
  virtual absl::StatusOr<SolveInfo> Solve(const DenseProblem<float>& p, DenseMethod m,
                                          DenseOutput<float> out,
                                          const SolveControl& control) = 0;

  // Persistent systems and many right-hand sides. Prepare copies the coefficients (the spec's
  // arrays are read during the call only, validated by the caller) and keeps what the backend
  // can prepare from them; SolvePrepared solves k right-hand sides (RhsBlock), x in their shape,
  // k * batch statuses. By default the system is kept on the host and solved through Solve.
  virtual absl::StatusOr<std::unique_ptr<PreparedSystem>> Prepare(const SystemSpec& spec);
  // Where the backend spreads calls over workers of their own (the multi-device backend: one a
  // device): how many, and the one a prepared system's solves run on (-1: any). The server
  // admits a system's solves against that worker's share of its slots, so that solves of the
  // systems one device holds never take the slots another device's solves could use.
  virtual int WorkerCount() const { return 1; }
  virtual int WorkerOf(const PreparedSystem&) const { return -1; }
  virtual absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<double> rhs,
                                                  double* x, SystemStatus* status,
                                                  const SolveControl& control);
  virtual absl::StatusOr<SolveInfo> SolvePrepared(PreparedSystem& system, RhsBlock<float> rhs,
                                                  float* x, SystemStatus* status,
                                                  const SolveControl& control);

  // Device memory a one-shot tridiagonal call of this shape takes at its peak (its arrays in, x
  // and the flags out, the method's scratch), as the device's pool counts it: what the
  // multi-device backend places calls by and cuts batches and systems by. The default, for a
  // backend without a device pool: the five arrays.
  virtual int64_t TridiagonalDeviceBytes(int64_t n, int64_t batch, Layout layout, int elem_bytes,
                                         TridiagonalMethod m) const;

  // Host memory that many requests will read and write in place (a client's shared-memory
  // region): page-locks it where the backend copies to a device, so that the copies run
  // straight from and into it at the link's rate. Returns whether it did (false: nothing to do
  // on this backend); the memory must stay mapped until UnpinHostMemory(p).
  virtual absl::StatusOr<bool> PinHostMemory(void* p, int64_t bytes);
  virtual void UnpinHostMemory(void* p);

  // Device memory of another process on this host (a client's CUDA IPC handle, the
  // kCudaIpcHandleBytes of cudaIpcMemHandle_t), mapped into this one for many requests:
  // [offset, offset + bytes) of the allocation the handle names, on CUDA device `device`.
  // Returns the range's address here. A handle already open is not opened again (the mapping
  // is shared, counted). UNIMPLEMENTED on a backend without a device; INVALID_ARGUMENT naming
  // the field for a handle that does not open, a device this backend does not drive, or a
  // range past the allocation. Until CloseDeviceMemory(p), the arrays and answers that calls
  // get inside the range are device memory: read and written on the device, never on the host
  // (a path that solves on the host copies them across first).
  virtual absl::StatusOr<void*> OpenDeviceMemory(const std::string& handle, int device,
                                                 int64_t offset, int64_t bytes);
  virtual void CloseDeviceMemory(void* p);
  // Copies bytes from memory OpenDeviceMemory opened to the host (the server's own checks of
  // such arrays: their structure, and naming a NaN the device found).
  virtual absl::Status CopyFromDevice(void* host, const void* device, int64_t bytes);
};

// The size of a CUDA IPC memory handle (cudaIpcMemHandle_t), in bytes.
inline constexpr int kCudaIpcHandleBytes = 64;

// The CPU reference backend; threads <= 0 means one per hardware thread.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);
// The CPU backend as trisolved runs it: MakeCpuBackend behind the test-only faults that
// TRISOLVE_FAULT_INJECTION asks for (trisolve/fault_injection.h), MakeCpuBackend's own where the
// variable is unset. INVALID_ARGUMENT for a malformed value.
absl::StatusOr<std::unique_ptr<Backend>> MakeServedCpuBackend(int threads = 0);

// Where MakePlacedBackend splits one system over its workers for speed (by memory, where it
// fits no one worker, always); the rules are above MakePlacedBackend.
struct PlacementOptions {
  int64_t split_system_unknowns = int64_t{1} << 22;
  // Trees: never for speed by default. Over the lent 2 x H200 (2026-11-27, bench_split_tree)
  // one tree of 2^24 nodes took 115 ms on one device and 699 ms split over two (preparing each
  // part on its device and its extra right-hand sides cost more than the whole tree's solve).
  int64_t split_tree_nodes = 0;
};

struct CudaOptions {
  int device = 0;
  int64_t device_pool_cap_bytes = 0;            // 0: 80% of the device's memory
  int64_t pinned_pool_cap_bytes = int64_t{2} << 30;
  int streams = 4;
  int cpu_threads = 0;  // for the families still solved on the host
  // auto solves tridiagonal and tree requests of fewer unknowns on the host, where they cost a
  // microsecond or so instead of the copies' and a launch's round trips (0: never).
  int64_t host_below_unknowns = 8192;
  // Load every kernel as the backend starts (CUDA_MODULE_LOADING=EAGER, unless the environment
  // already sets it), so that no request pays a kernel's loading: lazily, a fresh trisolved's
  // first thomas-window solve took 97 ms on the H100, eagerly 1.5 ms (NOTES.md t46).
  bool load_eagerly = true;
};

// The CUDA backend; UNAVAILABLE when built without CUDA or when no device is present (the
// message says which); INVALID_ARGUMENT for a malformed TRISOLVE_FAULT_INJECTION, whose faults
// it injects (trisolve/fault_injection.h).
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaOptions& options = {});
bool CudaBackendCompiledIn();
// The CUDA devices present (0 without CUDA, a driver or a device).
int CudaDeviceCount();

// Every listed device behind one Backend: a CUDA backend a device (its own pools, streams and
// host threads, options as given but for the device). A call goes to the device with the fewest
// calls in flight, among those with the memory for it, the one with more free memory at equal
// queues; a prepared system stays on the device that prepared it (the one with the most memory
// to spare then) and its solves go there. A tridiagonal or tree batch that fits no one device
// but fits them together is split by systems, its parts solved at once. A device listed twice
// is two workers sharing it (the device pool's cap split between them): a testing aid, to
// exercise the placement on one GPU.
// INVALID_ARGUMENT for an empty list or a device that does not exist; UNAVAILABLE as
// MakeCudaBackend.
absl::StatusOr<std::unique_ptr<Backend>> MakeMultiDeviceCudaBackend(
    std::vector<int> devices, const CudaOptions& options = {},
    const PlacementOptions& placement = {});

// The placement MakeMultiDeviceCudaBackend puts in front of its CUDA backends, over any
// backends, one a device: each worker's memory to spare is read from its Info() (its first
// pool's cap less what is in use, at most its first device's free memory plus the pool's idle
// buffers; none without a device), a prepared system routed by PreparedSystem::holder(). `tags`
// name the workers in the pool names ("device:<tag>"). nullptr for no worker. For the tests,
// with stand-in workers.
// One tridiagonal system (batch 1) that fits no one worker but fits them together is split
// over them by rows (kernels/cpu/split_system.h: the parts solved at once, joined at their
// interfaces on the host); so is one of at least `split_system_unknowns` unknowns
// under `auto`, over the workers with nothing in flight and room for an equal part, where two
// or more have (0: never for speed). A split whose parts cannot be joined (a part singular on
// its own, couplings that do not decay within the host's windows) is solved whole on one
// worker where it fits, else by the CPU reference on the host; the method string says which.
// One tree (batch 1) is split by the same rules (`split_tree_nodes` for speed), into parts of
// whole subtrees (kernels/cpu/tree_split.h: exact, no windows), with the same fall-backs.
std::unique_ptr<Backend> MakePlacedBackend(std::vector<std::unique_ptr<Backend>> workers,
                                           std::vector<std::string> tags,
                                           const PlacementOptions& options = {});

}  // namespace trisolve
