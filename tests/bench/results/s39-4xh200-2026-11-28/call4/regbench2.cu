// With many registered regions: host time of cudaMemcpyAsync calls and the stream's time for a
// job's copies (6 x 8 MB in, 1 x 8 MB out), on each device, by which device registered them.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
static const size_t kArr = size_t(8) << 20, kRegion = 8 * kArr;
static const int kRegions = 64;
static void* Shm(int i) {
  std::string name = "/rb2-" + std::to_string(i);
  shm_unlink(name.c_str());
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (ftruncate(fd, kRegion) != 0) return nullptr;
  void* p = mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  memset(p, 1, kRegion);
  shm_unlink(name.c_str());
  return p;
}
struct Res { double call_us, job_ms; };
static Res Jobs(int d, std::vector<void*>& regs, int jobs, cudaMemcpyKind kin, cudaMemcpyKind kout) {
  cudaSetDevice(d);
  void* dev = nullptr; cudaMalloc(&dev, 7 * kArr);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  double call = 0, gpu = 0; int calls = 0;
  for (int j = 0; j < jobs + 2; ++j) {
    auto* r = static_cast<char*>(regs[(j * 7 + d) % regs.size()]);
    cudaEventRecord(a, s);
    auto t0 = std::chrono::steady_clock::now();
    for (int q = 0; q < 6; ++q) cudaMemcpyAsync(static_cast<char*>(dev) + q * kArr, r + q * kArr, kArr, kin, s);
    cudaMemcpyAsync(r + 6 * kArr, static_cast<char*>(dev) + 6 * kArr, kArr, kout, s);
    auto t1 = std::chrono::steady_clock::now();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0; cudaEventElapsedTime(&ms, a, b);
    if (j >= 2) { call += std::chrono::duration<double, std::micro>(t1 - t0).count(); gpu += ms; calls += 7; }
  }
  cudaFree(dev); cudaStreamDestroy(s); cudaEventDestroy(a); cudaEventDestroy(b);
  return {call / calls, gpu / jobs};
}
static void Run(const char* what, int owner, unsigned flags, cudaMemcpyKind kin, cudaMemcpyKind kout, int n) {
  std::vector<void*> regs;
  for (int i = 0; i < kRegions; ++i) regs.push_back(Shm(i));
  cudaSetDevice(owner);
  for (void* p : regs) if (cudaHostRegister(p, kRegion, flags) != cudaSuccess) { printf("register failed\n"); return; }
  printf("%-24s owner %d, one device at a time:", what, owner);
  for (int d = 0; d < n; ++d) { Res r = Jobs(d, regs, 40, kin, kout); printf("  dev%d %.1f us a call, %.3f ms a job", d, r.call_us, r.job_ms); }
  std::vector<Res> rr(n); std::vector<std::thread> t;
  for (int d = 0; d < n; ++d) t.emplace_back([&, d] { rr[d] = Jobs(d, regs, 80, kin, kout); });
  for (auto& x : t) x.join();
  printf("\n%-24s          all at once:", "");
  for (int d = 0; d < n; ++d) printf("  dev%d %.1f us a call, %.3f ms a job", d, rr[d].call_us, rr[d].job_ms);
  printf("\n");
  cudaSetDevice(owner);
  for (void* p : regs) { cudaHostUnregister(p); munmap(p, kRegion); }
}
int main() {
  int n = 0; cudaGetDeviceCount(&n);
  for (int d = 0; d < n; ++d) { cudaSetDevice(d); cudaFree(nullptr); }
  for (int rep = 0; rep < 2; ++rep) {
    Run("portable", 0, cudaHostRegisterPortable, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, n);
    Run("portable", 2, cudaHostRegisterPortable, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, n);
    Run("portable, kind default", 0, cudaHostRegisterPortable, cudaMemcpyDefault, cudaMemcpyDefault, n);
  }
}
