// Copy rate from registered host memory to each device, by which device registered it.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return; } } while (0)
static const size_t kBytes = size_t(56) << 20;
static void* ShmBuffer(const char* name) {
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  if (ftruncate(fd, kBytes) != 0) return nullptr;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  memset(p, 1, kBytes);
  return p;
}
// GB/s of `reps` copies on device d (h2d, or d2h).
static double Rate(int d, void* host, bool h2d, int reps) {
  cudaSetDevice(d);
  void* dev = nullptr; cudaMalloc(&dev, kBytes);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w = 0; w < 2; ++w) h2d ? cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, s) : cudaMemcpyAsync(host, dev, kBytes, cudaMemcpyDeviceToHost, s);
  cudaEventRecord(a, s);
  for (int r = 0; r < reps; ++r) h2d ? cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, s) : cudaMemcpyAsync(host, dev, kBytes, cudaMemcpyDeviceToHost, s);
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0; cudaEventElapsedTime(&ms, a, b);
  cudaFree(dev); cudaStreamDestroy(s); cudaEventDestroy(a); cudaEventDestroy(b);
  return double(kBytes) * reps / (ms * 1e-3) / 1e9;
}
static void Run(const char* what, int owner, unsigned flags, int n) {
  void* p = ShmBuffer("/regbench");
  cudaSetDevice(owner);
  CK(cudaHostRegister(p, kBytes, flags));
  printf("%-28s owner %d:", what, owner);
  for (int d = 0; d < n; ++d) printf("  dev%d h2d %5.1f d2h %5.1f", d, Rate(d, p, true, 10), Rate(d, p, false, 10));
  // all devices at once
  std::vector<double> r(n);
  std::vector<std::thread> t;
  for (int d = 0; d < n; ++d) t.emplace_back([&, d] { r[d] = Rate(d, p, true, 20); });
  for (auto& x : t) x.join();
  printf("  | together h2d:");
  for (int d = 0; d < n; ++d) printf(" %5.1f", r[d]);
  printf("\n");
  cudaSetDevice(owner);
  cudaHostUnregister(p);
  munmap(p, kBytes);
  shm_unlink("/regbench");
}
int main() {
  int n = 0; cudaGetDeviceCount(&n);
  for (int d = 0; d < n; ++d) { cudaSetDevice(d); cudaFree(nullptr); }
  for (int rep = 0; rep < 2; ++rep) {
    Run("portable", 0, cudaHostRegisterPortable, n);
    Run("portable", 1, cudaHostRegisterPortable, n);
    Run("portable|mapped", 0, cudaHostRegisterPortable | cudaHostRegisterMapped, n);
    Run("portable|mapped", 2, cudaHostRegisterPortable | cudaHostRegisterMapped, n);
  }
}
