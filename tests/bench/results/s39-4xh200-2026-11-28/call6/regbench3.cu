// Does registering (and unregistering) host memory stall the copies of the device whose
// context does it? Four devices copy jobs (6 x 8 MB in, 8 MB out) from registered regions for 3
// s while another thread registers and unregisters 58 MB regions through device X.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
static const size_t kArr = size_t(8) << 20, kRegion = 8 * kArr;
static void* Shm(int i) {
  std::string name = "/rb3-" + std::to_string(i);
  shm_unlink(name.c_str());
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (ftruncate(fd, kRegion) != 0) return nullptr;
  void* p = mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  memset(p, 1, kRegion);
  shm_unlink(name.c_str());
  return p;
}
int main() {
  int n = 0; cudaGetDeviceCount(&n);
  for (int d = 0; d < n; ++d) { cudaSetDevice(d); cudaFree(nullptr); }
  std::vector<void*> regs, churn;
  for (int i = 0; i < 16; ++i) regs.push_back(Shm(i));
  for (int i = 0; i < 8; ++i) churn.push_back(Shm(100 + i));
  cudaSetDevice(0);
  for (void* p : regs) cudaHostRegister(p, kRegion, cudaHostRegisterPortable);
  for (int rep = 0; rep < 2; ++rep)
  for (int x = -1; x <= n; ++x) {
    std::atomic<bool> stop{false};
    std::vector<double> ms(n); std::vector<int> jobs(n), worst(n);
    std::vector<std::thread> t;
    for (int d = 0; d < n; ++d) t.emplace_back([&, d] {
      cudaSetDevice(d);
      void* dev = nullptr; cudaMalloc(&dev, 7 * kArr);
      cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
      auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      double sum = 0, most = 0; int j = 0;
      while (std::chrono::steady_clock::now() < end) {
        auto* r = static_cast<char*>(regs[(j * 5 + d) % regs.size()]);
        auto t0 = std::chrono::steady_clock::now();
        cudaEventRecord(a, s);
        for (int q = 0; q < 6; ++q) cudaMemcpyAsync(static_cast<char*>(dev) + q * kArr, r + q * kArr, kArr, cudaMemcpyHostToDevice, s);
        cudaMemcpyAsync(r + 6 * kArr, static_cast<char*>(dev) + 6 * kArr, kArr, cudaMemcpyDeviceToHost, s);
        cudaEventRecord(b, s);
        cudaEventSynchronize(b);
        double w = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        sum += w; most = std::max(most, w); ++j;
      }
      ms[d] = sum / j; jobs[d] = j; worst[d] = int(most);
      stop = true;
      cudaFree(dev); cudaStreamDestroy(s);
    });
    int churned = 0;
    std::thread reg([&] {
      if (x < 0) return;
      CUcontext own = nullptr;
      if (x == n) {  // a context of its own on device 0, not the primary one the copies use
        CUdevice d0; cuDeviceGet(&d0, 0);
        CUresult r = cuCtxCreate(&own, nullptr, 0, d0);
        if (r != CUDA_SUCCESS) { printf("cuCtxCreate: %d\n", int(r)); return; }
      } else {
        cudaSetDevice(x);
      }
      for (int i = 0; !stop; ++i) {
        void* p = churn[size_t(i) % churn.size()];
        cudaHostRegister(p, kRegion, cudaHostRegisterPortable);
        cudaHostUnregister(p);
        ++churned;
      }
      if (own) { cuCtxPopCurrent(nullptr); cuCtxDestroy(own); }
    });
    for (auto& th : t) th.join();
    reg.join();
    printf("registrar %-4s (%4d register+unregister):", x < 0 ? "none" : x == n ? "own0" : std::to_string(x).c_str(), churned);
    for (int d = 0; d < n; ++d) printf("  dev%d %4d jobs %.3f ms (worst %d)", d, jobs[d], ms[d], worst[d]);
    printf("\n");
  }
}
