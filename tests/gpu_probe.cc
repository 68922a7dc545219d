// Exit status 0 where a CUDA device is present, 1 where none is (no driver, no device): read
// once a ctest run by gpu_tests.cmake (tests/CMakeLists.txt) to register the GPU tests case by
// case or one test a binary. Links the CUDA runtime only, so it starts in milliseconds.
#include <cuda_runtime.h>

int main() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1;
}
