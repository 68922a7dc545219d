// The region registry on its own (server/memory.h), without a server: lookups by identity, the
// caps, expiry and the counters, and lookups racing registration, unregistration and expiry.
// Regions here are the server's own memory (Allocate), which needs no shared-memory object.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "memory.h"

namespace trisolve::server {
namespace {

MemoryLimits Limits(int regions, int64_t bytes) {
  MemoryLimits l;
  l.max_regions_per_identity = regions;
  l.max_bytes_per_identity = bytes;
  return l;
}

const RegionInfo* Named(const std::vector<RegionInfo>& list, const std::string& name) {
  for (const auto& r : list)
    if (r.name == name) return &r;
  return nullptr;
}

TEST(MemoryRegistry, ARegionIsItsIdentitysAloneAndEveryLookupCounts) {
  MemoryRegistry reg(Limits(8, 1 << 20), nullptr);
  ASSERT_TRUE(reg.Allocate("token:1", "a", 4096, 0).ok());
  ASSERT_TRUE(reg.Allocate("token:2", "a", 8192, 0).ok());
  auto mine = reg.Find("token:1", "a", "x_region");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ((*mine)->bytes(), 4096);
  auto theirs = reg.Find("token:2", "a", "x_region");
  ASSERT_TRUE(theirs.ok());
  EXPECT_EQ((*theirs)->bytes(), 8192);
  // Another identity's name, an identity that is a prefix of one, a name never registered.
  for (const auto& [id, name] : std::vector<std::pair<std::string, std::string>>{
           {"token:3", "a"}, {"token:", "a"}, {"token:1", "b"}, {"token:1", ""}}) {
    auto r = reg.Find(id, name, "x_region");
    ASSERT_FALSE(r.ok()) << id << "/" << name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find("x_region: no region named"), std::string::npos)
        << r.status();
  }
  // Uses counted from many threads at once, none lost.
  constexpr int kThreads = 8, kFinds = 5000;
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < kFinds; ++i) ASSERT_TRUE(reg.Find("token:1", "a", "f").ok());
    });
  for (auto& th : pool) th.join();
  const auto list = reg.List("token:1");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].uses, 1 + kThreads * kFinds);
  EXPECT_EQ(Named(reg.List("token:2"), "a")->uses, 1);
  EXPECT_TRUE(reg.Holds("token:1", "a", mine->get()));
  EXPECT_FALSE(reg.Holds("token:2", "a", mine->get()));
  EXPECT_EQ(reg.count(), 2);
  EXPECT_EQ(reg.bytes(), 4096 + 8192);
}

TEST(MemoryRegistry, CapsCountAnIdentitysRegionsAndFreeWithThem) {
  MemoryRegistry reg(Limits(3, 10000), nullptr);
  ASSERT_TRUE(reg.Allocate("id", "r1", 4000, 0).ok());
  ASSERT_TRUE(reg.Allocate("id", "r2", 4000, 0).ok());
  auto dup = reg.Allocate("id", "r2", 10, 0);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  auto over_bytes = reg.Allocate("id", "r3", 2001, 0);
  EXPECT_EQ(over_bytes.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over_bytes.status().message().find("10001 bytes"), std::string::npos)
      << over_bytes.status();
  ASSERT_TRUE(reg.Allocate("id", "r3", 2000, 0).ok());
  auto over_count = reg.Allocate("id", "r4", 1, 0);
  EXPECT_EQ(over_count.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over_count.status().message().find("holds 3 regions"), std::string::npos)
      << over_count.status();
  // Another identity has room of its own.
  ASSERT_TRUE(reg.Allocate("other", "r1", 10000, 0).ok());
  // Unregistering gives the room back, in regions and in bytes.
  auto gone = reg.Unregister("id", "r1");
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->bytes, 4000);
  EXPECT_EQ(reg.Unregister("id", "r1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Find("id", "r1", "region").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(reg.Allocate("id", "r4", 4000, 0).ok());
  EXPECT_EQ(reg.Allocate("id", "r5", 1, 0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reg.count(), 4);
  EXPECT_EQ(reg.bytes(), 4000 + 2000 + 4000 + 10000);
  // List: the identity's alone, by name.
  const auto list = reg.List("id");
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].name, "r2");
  EXPECT_EQ(list[1].name, "r3");
  EXPECT_EQ(list[2].name, "r4");
  ASSERT_TRUE(reg.Unregister("id", "r2").ok());
  ASSERT_TRUE(reg.Unregister("id", "r3").ok());
  ASSERT_TRUE(reg.Unregister("id", "r4").ok());
  ASSERT_TRUE(reg.Unregister("other", "r1").ok());
  EXPECT_EQ(reg.count(), 0);
  EXPECT_EQ(reg.bytes(), 0);
  // An identity emptied starts from nothing again.
  ASSERT_TRUE(reg.Allocate("id", "big", 10000, 0).ok());
}

TEST(MemoryRegistry, ARegionInUseOutlivesItsTimeToLiveAndAnIdleOneExpires) {
  MemoryRegistry reg(MemoryLimits{}, nullptr);
  ASSERT_TRUE(reg.Allocate("id", "busy", 4096, 0.3).ok());
  ASSERT_TRUE(reg.Allocate("id", "idle", 4096, 0.3).ok());
  auto held = reg.Find("id", "idle", "region");
  ASSERT_TRUE(held.ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(700);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(reg.Find("id", "busy", "region").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  reg.ExpireIdle();  // the sweeper's, now, whether or not it ran meanwhile
  EXPECT_TRUE(reg.Find("id", "busy", "region").ok());
  EXPECT_EQ(reg.Find("id", "idle", "region").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(reg.Holds("id", "idle", held->get()));
  EXPECT_EQ(reg.count(), 1);
  EXPECT_EQ(reg.bytes(), 4096);
  // The expired region's memory stays valid for the request that held it.
  std::memset((*held)->base(), 7, 4096);
  const auto list = reg.List("id");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_LT(list[0].idle_s, 0.3);
}

// Lookups while the same names are registered, unregistered and expired: each answers the
// region then registered under the name or NOT_FOUND, never another's, and the counters end
// where the registrations left them.
TEST(MemoryRegistry, LookupsRacingRegistrationAnswerTheRegionOrNotFound) {
  MemoryRegistry reg(Limits(64, int64_t{1} << 30), nullptr);
  constexpr int kNames = 16;
  // Sizes tell the regions apart: name i is always 4096 * (i + 1) bytes.
  for (int i = 0; i < kNames; i += 2)
    ASSERT_TRUE(reg.Allocate("id", absl::StrCat("r", i), 4096 * (i + 1), 0).ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> found{0}, missing{0}, wrong{0};
  std::vector<std::thread> finders;
  for (int t = 0; t < 4; ++t)
    finders.emplace_back([&, t] {
      for (int k = t; !stop.load(); ++k) {
        const int i = k % kNames;
        auto r = reg.Find("id", absl::StrCat("r", i), "region");
        if (r.ok()) {
          ++found;
          if ((*r)->bytes() != 4096 * (i + 1) || (*r)->name() != absl::StrCat("r", i)) ++wrong;
        } else if (r.status().code() == absl::StatusCode::kNotFound) {
          ++missing;
        } else {
          ++wrong;
        }
        // Foreign lookups of the same names never find them.
        if (reg.Find("id2", absl::StrCat("r", i), "region").ok()) ++wrong;
      }
    });
  std::thread churn([&] {
    for (int round = 0; round < 300; ++round) {
      const int i = 1 + 2 * (round % (kNames / 2));
      const std::string name = absl::StrCat("r", i);
      EXPECT_TRUE(reg.Allocate("id", name, 4096 * (i + 1), 0).ok());
      EXPECT_TRUE(reg.Unregister("id", name).ok());
      reg.ExpireIdle();  // nothing is idle for an hour: drops nothing
    }
  });
  churn.join();
  stop = true;
  for (auto& th : finders) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(found.load(), 0);
  EXPECT_GT(missing.load(), 0);
  EXPECT_EQ(reg.count(), kNames / 2);
  int64_t want = 0;
  for (int i = 0; i < kNames; i += 2) want += 4096 * (i + 1);
  EXPECT_EQ(reg.bytes(), want);
  EXPECT_EQ(reg.List("id").size(), size_t(kNames / 2));
}

// Lookups without pause must not keep registration and the sweep out: a reader lock that lets
// new readers in past a waiting writer (glibc's rwlock) let one round of these through in about
// a second beside 16 such threads on two cores; here 100 rounds get 20 s.
TEST(MemoryRegistry, LookupsWithoutPauseDoNotStarveRegistrationOrTheSweep) {
  MemoryRegistry reg(MemoryLimits{}, nullptr);
  ASSERT_TRUE(reg.Allocate("id", "hot", 4096, 0).ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> finders;
  for (int t = 0; t < 16; ++t)
    finders.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) (void)reg.Find("id", "hot", "region");
    });
  const auto t0 = std::chrono::steady_clock::now();
  int rounds = 0;
  while (rounds < 100 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    ASSERT_TRUE(reg.Allocate("id", "cold", 4096, 0).ok());
    ASSERT_TRUE(reg.Unregister("id", "cold").ok());
    reg.ExpireIdle();
    ++rounds;
  }
  stop = true;
  for (auto& th : finders) th.join();
  EXPECT_EQ(rounds, 100) << "in 20 s";
}

}  // namespace
}  // namespace trisolve::server
