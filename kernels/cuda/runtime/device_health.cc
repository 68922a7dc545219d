#include "runtime/device_health.h"

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace trisolve::cuda {
namespace {

struct Lost {
  std::mutex mu;
  absl::Status status;
};
Lost& State() {
  static Lost* s = new Lost();  // never destroyed: read by threads still running at exit
  return *s;
}

}  // namespace

bool IsStickyError(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorExternalDevice:
#if CUDART_VERSION >= 12080
    case cudaErrorContained:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated:
#endif
      return true;
    default:
      return false;
  }
}

void NoteStickyError(cudaError_t e, const char* what) {
  int device = -1;
  (void)cudaGetDevice(&device);  // the thread's device, as the failing call used it
  Lost& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.status.ok()) return;
  s.status = absl::UnavailableError(absl::StrCat(
      "CUDA device ", device, " is lost to this process: ", what, " returned ",
      cudaGetErrorName(e), " (", cudaGetErrorString(e),
      "), a sticky error; a restarted process can use the device again"));
}

absl::Status ContextHealth() {
  Lost& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.status;
}

absl::Status ProbeDevice(int device) {
  if (absl::Status st = ContextHealth(); !st.ok()) return st;
  size_t free_b = 0, total_b = 0;
  (void)cudaSetDevice(device);
  if (const cudaError_t e = cudaMemGetInfo(&free_b, &total_b); IsStickyError(e))
    NoteStickyError(e, "cudaMemGetInfo");
  return ContextHealth();
}

}  // namespace trisolve::cuda
