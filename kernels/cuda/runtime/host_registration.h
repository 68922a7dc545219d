// Host memory page-locked in place (cudaHostRegister, portable: every device's copies go
// straight from and into it) through a CUDA context of the process's own, never a device's
// primary context, which the solves' copies and launches use. Pinning takes the context that
// does it for the whole call (some 10 ms to register and unregister 58 MB), and every other
// thread's call on that context waits meanwhile: while memory was registered and unregistered
// through a device's context, that device's copies took 2.2 ms a job against 1.4 (the others'
// 1.4), tests/bench/NOTES.md, "Registering memory stalls a device". Through a context of its
// own, no device's copies waited.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace trisolve::cuda {

// cudaHostRegister(p, bytes, cudaHostRegisterPortable), and its undoing, through the
// registration context (made on `device` by the first call of the process). Where the driver
// makes no second context (a device in exclusive-process mode, or no driver entry points), on
// `device`'s primary context, as a plain cudaSetDevice would.
cudaError_t RegisterHostMemory(int device, void* p, size_t bytes);
cudaError_t UnregisterHostMemory(int device, void* p);

// Whether registrations go through a context of their own (false until the first one, and
// where the driver made none).
bool HostRegistrationHasOwnContext();

}  // namespace trisolve::cuda
