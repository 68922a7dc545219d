#include "bus_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace trisolve::server {
namespace {

struct Slot {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<bool> faulted{false};
};
Slot slots[BusGuard::kSlots];
std::atomic<int> in_use{0};
struct sigaction previous_bus;
long page_bytes = 4096;

// Async-signal-safe: atomics, mmap and the previous handler only.
void OnBus(int sig, siginfo_t* info, void* context) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    if (b != 0 && b <= at && at < s.end.load(std::memory_order_acquire)) {
      void* page = reinterpret_cast<void*>(at & ~uintptr_t(page_bytes - 1));
      if (mmap(page, size_t(page_bytes), PROT_READ | PROT_WRITE,
               MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
        s.faulted.store(true, std::memory_order_release);
        return;  // the access is retried on the zero page
      }
      break;
    }
  }
  if ((previous_bus.sa_flags & SA_SIGINFO) != 0 && previous_bus.sa_sigaction != nullptr) {
    previous_bus.sa_sigaction(sig, info, context);
  } else if ((previous_bus.sa_flags & SA_SIGINFO) == 0 && previous_bus.sa_handler != SIG_DFL &&
             previous_bus.sa_handler != SIG_IGN) {
    previous_bus.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);  // the access faults again, with the default action
  }
}

std::mutex slots_mu;

int Take(const void* p, int64_t bytes) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    page_bytes = sysconf(_SC_PAGESIZE);
    struct sigaction sa {};
    sa.sa_sigaction = OnBus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous_bus);
  });
  if (p == nullptr || bytes <= 0) return -1;
  std::lock_guard<std::mutex> lock(slots_mu);
  for (int i = 0; i < BusGuard::kSlots; ++i) {
    if (slots[i].begin.load() != 0) continue;
    slots[i].faulted.store(false);
    slots[i].end.store(reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes));
    slots[i].begin.store(reinterpret_cast<uintptr_t>(p), std::memory_order_release);
    in_use.fetch_add(1);
    return i;
  }
  return -1;
}

}  // namespace

BusGuard::BusGuard(const void* p, int64_t bytes) : slot_(Take(p, bytes)) {}

BusGuard::~BusGuard() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(slots_mu);
  slots[slot_].begin.store(0, std::memory_order_release);
  slots[slot_].end.store(0);
  in_use.fetch_sub(1);
}

bool BusGuard::faulted() const {
  return slot_ >= 0 && slots[slot_].faulted.load(std::memory_order_acquire);
}

int BusGuard::InUse() { return in_use.load(); }

}  // namespace trisolve::server
