// Preloaded into a client process (LD_PRELOAD) by test_cli: reproduces the way libgrpc 1.51
// fails a connection to a server that listens. Its TCP client calls connect(), which answers
// EINPROGRESS, then other functions (grpc_fd_create: a mutex, whose first contention in the
// process makes Abseil read /sys/devices/system/cpu/cpu0/tsc_freq_khz, absent on many VMs),
// and only then reads errno: ENOENT there is taken for connect's own failure
// (grpc/grpc#35064 fixed it upstream). Here, for the connections of the process that
// TRISOLVE_TEST_CONNECT_ERRNO names, "COUNT" (the first COUNT) or "SKIP:COUNT" (the COUNT after
// the first SKIP), epoll_ctl, which grpc_fd_create calls last, leaves errno ENOENT after it
// succeeded, as any successful call may; each time it says so on stderr, so that a test can
// tell that the fault was met.
#include <dlfcn.h>
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace {

std::atomic<int> seen{0};  // connections begun (connect answered EINPROGRESS)
thread_local int armed_fd = -1;

bool Faulted(int connection) {
  static const std::pair<int, int> skip_count = [] {
    const char* v = std::getenv("TRISOLVE_TEST_CONNECT_ERRNO");
    if (v == nullptr) return std::make_pair(0, 0);
    const char* colon = std::strchr(v, ':');
    return colon == nullptr ? std::make_pair(0, std::atoi(v))
                            : std::make_pair(std::atoi(v), std::atoi(colon + 1));
  }();
  return connection >= skip_count.first && connection < skip_count.first + skip_count.second;
}

template <typename F>
F Next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" int connect(int fd, const sockaddr* addr, socklen_t len) {
  static const auto real = Next<int (*)(int, const sockaddr*, socklen_t)>("connect");
  const int r = real(fd, addr, len);
  if (r < 0 && errno == EINPROGRESS) {
    const int saved = errno;
    if (Faulted(seen++)) armed_fd = fd;
    errno = saved;
  }
  return r;
}

extern "C" int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
  static const auto real = Next<int (*)(int, int, int, epoll_event*)>("epoll_ctl");
  const int r = real(epfd, op, fd, event);
  if (r == 0 && op == EPOLL_CTL_ADD && fd == armed_fd) {
    armed_fd = -1;
    std::fprintf(stderr, "connect_errno_fault: errno ENOENT after the connect of fd %d\n", fd);
    errno = ENOENT;
  }
  return r;
}
