// MemoryRegistry::Find under concurrency: T threads each resolving a region of a registry of N
// (every RPC by reference and every ring request resolves at least one; a ring by handle its own
// region, for x), for a fixed time, then finds/s over all threads and per thread. What the
// lookup costs when callers do nothing else, so that a lock's serialisation shows where a
// round trip's noise would hide it (issue 31: ring throughput by handle falling from 16 to 256
// clients).
//   bench_memory_find [--threads 1,2,4,16] [--regions 256] [--seconds 1] [--same]
//   [--identities K] [--writer]
// --same: every thread finds region 0 (one entry's counters shared by all); otherwise thread i
// finds region i mod N. --identities K: the N regions spread over K identities (default 1: one
// shared identity, as a server without authentication has). --writer: one more thread
// registers and unregisters a region of the looked-up identity, then runs the expiry sweep
// (which takes every shard's writer lock), in a loop while the lookups run, and prints how
// long those took: the lookups must not starve them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "memory.h"
#include "spdlog/spdlog.h"

namespace {

using Clock = std::chrono::steady_clock;
using trisolve::server::MemoryLimits;
using trisolve::server::MemoryRegistry;

struct Options {
  std::vector<int> threads = {1, 2, 4, 16};
  int regions = 256;
  int identities = 1;
  double seconds = 1.0;
  bool same = false;
  bool writer = false;
};

int Fail(const std::string& why) {
  std::fprintf(stderr, "bench_memory_find: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as trisolved
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--same" || a == "--writer") {
      (a == "--same" ? o.same : o.writer) = true;
      continue;
    }
    bool ok = true;
    if (a == "--threads") {
      o.threads.clear();
      for (absl::string_view t : absl::StrSplit(v, ',')) {
        int k = 0;
        ok = ok && absl::SimpleAtoi(t, &k) && k > 0;
        o.threads.push_back(k);
      }
    } else if (a == "--regions") {
      ok = absl::SimpleAtoi(v, &o.regions) && o.regions > 0;
    } else if (a == "--identities") {
      ok = absl::SimpleAtoi(v, &o.identities) && o.identities > 0;
    } else if (a == "--seconds") {
      ok = absl::SimpleAtod(v, &o.seconds) && o.seconds > 0;
    } else {
      return Fail(absl::StrCat("unknown argument '", a, "'"));
    }
    if (!ok) return Fail(absl::StrCat(a, ": bad value '", v, "'"));
    ++i;
  }
  MemoryLimits limits;
  limits.max_regions_per_identity = o.regions + 1;  // room for --writer's
  MemoryRegistry registry(limits, nullptr);
  std::vector<std::string> identity(size_t(o.regions)), name(size_t(o.regions));
  for (int r = 0; r < o.regions; ++r) {
    // Names of the length the clients give their rings' regions.
    identity[size_t(r)] = absl::StrCat("token:", r % o.identities + 1);
    name[size_t(r)] = absl::StrCat("trisolve-ring-", 4096 + r, "-", 0x5eed0000 + r);
    auto info = registry.Allocate(identity[size_t(r)], name[size_t(r)], 4096, 0);
    if (!info.ok()) return Fail(std::string(info.status().message()));
  }
  std::printf("regions %d, identities %d, %s, %.1f s a point\n", o.regions, o.identities,
              o.same ? "every thread the same region" : "thread i region i mod N", o.seconds);
  std::printf("%8s %14s %14s %10s%s\n", "threads", "finds/s", "per thread/s", "ns a find",
              o.writer ? "   writes: count, median / max us (register + unregister + sweep)" : "");
  for (int t : o.threads) {
    std::atomic<bool> go{false}, stop{false};
    std::atomic<int> failed{0};
    std::vector<int64_t> counts(size_t(t) * 16, 0);  // a cache line a thread
    std::vector<std::thread> pool;
    for (int k = 0; k < t; ++k)
      pool.emplace_back([&, k] {
        const size_t r = o.same ? 0 : size_t(k % o.regions);
        int64_t n = 0;
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        while (!stop.load(std::memory_order_relaxed)) {
          for (int j = 0; j < 64; ++j) {
            auto found = registry.Find(identity[r], name[r], "region");
            if (!found.ok()) failed.fetch_add(1);
          }
          n += 64;
        }
        counts[size_t(k) * 16] = n;
      });
    std::vector<double> writes_us;
    std::thread writes;
    if (o.writer)
      writes = std::thread([&] {
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        while (!stop.load(std::memory_order_relaxed)) {
          const auto w0 = Clock::now();
          if (!registry.Allocate(identity[0], "bench-writer", 4096, 0).ok() ||
              !registry.Unregister(identity[0], "bench-writer").ok())
            failed.fetch_add(1);
          registry.ExpireIdle();
          writes_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - w0).count());
        }
      });
    const auto t0 = Clock::now();
    go.store(true, std::memory_order_release);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
    stop.store(true);
    for (auto& th : pool) th.join();
    if (writes.joinable()) writes.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t total = 0;
    for (int k = 0; k < t; ++k) total += counts[size_t(k) * 16];
    if (failed.load() != 0) return Fail(absl::StrCat(failed.load(), " finds failed"));
    std::printf("%8d %14.0f %14.0f %10.1f", t, double(total) / s, double(total) / s / t,
                1e9 * s * t / double(std::max<int64_t>(total, 1)));
    if (o.writer && !writes_us.empty()) {
      std::sort(writes_us.begin(), writes_us.end());
      std::printf("   %zu, %.1f / %.1f", writes_us.size(), writes_us[writes_us.size() / 2],
                  writes_us.back());
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
