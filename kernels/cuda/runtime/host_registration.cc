#include "runtime/host_registration.h"

#include <cuda.h>

#include <atomic>
#include <mutex>

namespace trisolve::cuda {
namespace {

// The driver's calls, through the runtime's entry points: linking the driver library itself
// would stop the binaries loading on hosts without one. The version (CUDA 11.0) names the
// signatures used here: cuCtxCreate_v2 (context, flags, device; 11.4 added a v3).
using CtxCreate = CUresult(CUDAAPI*)(CUcontext*, unsigned int, CUdevice);
using CtxPush = CUresult(CUDAAPI*)(CUcontext);
using CtxPop = CUresult(CUDAAPI*)(CUcontext*);
using DeviceGet = CUresult(CUDAAPI*)(CUdevice*, int);

constexpr int kVersion = 11000;

template <typename Fn>
Fn Entry(const char* name, int version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(f);
}

struct Registrar {
  CUcontext context = nullptr;  // null: the device's primary context
  CtxPush push = nullptr;
  CtxPop pop = nullptr;
};

std::atomic<bool> own_context{false};

const Registrar& For(int device) {
  static const Registrar r = [device] {
    Registrar made;
    const auto create = Entry<CtxCreate>("cuCtxCreate", kVersion);
    const auto get = Entry<DeviceGet>("cuDeviceGet", kVersion);
    made.push = Entry<CtxPush>("cuCtxPushCurrent", kVersion);
    made.pop = Entry<CtxPop>("cuCtxPopCurrent", kVersion);
    if (create == nullptr || get == nullptr || made.push == nullptr || made.pop == nullptr)
      return made;
    // (The runtime initialises the driver first: the device's primary context is current.)
    if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
      (void)cudaGetLastError();
      return made;
    }
    CUdevice d = 0;
    CUcontext ctx = nullptr;
    if (get(&d, device) != CUDA_SUCCESS || create(&ctx, 0, d) != CUDA_SUCCESS) return made;
    CUcontext popped = nullptr;
    made.pop(&popped);  // cuCtxCreate made it current: the thread's own context again
    made.context = ctx;
    own_context.store(true);
    return made;
  }();
  return r;
}

// Runs `call` with the registration context current on this thread.
template <typename Call>
cudaError_t InRegistrationContext(int device, Call call) {
  const Registrar& r = For(device);
  if (r.context == nullptr || r.push(r.context) != CUDA_SUCCESS) {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return e;
    return call();
  }
  const cudaError_t e = call();
  CUcontext popped = nullptr;
  r.pop(&popped);
  return e;
}

}  // namespace

cudaError_t RegisterHostMemory(int device, void* p, size_t bytes) {
  return InRegistrationContext(device,
                               [&] { return cudaHostRegister(p, bytes, cudaHostRegisterPortable); });
}

cudaError_t UnregisterHostMemory(int device, void* p) {
  return InRegistrationContext(device, [&] { return cudaHostUnregister(p); });
}

bool HostRegistrationHasOwnContext() { return own_context.load(); }

}  // namespace trisolve::cuda
