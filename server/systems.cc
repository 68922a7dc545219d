#include "systems.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace trisolve::server {
namespace {

// 128 random bits from the OS: a handle cannot be guessed from another. The replica's address
// after "@" routes it home; the random part alone keeps a restarted replica at the same address
// from taking another process's handle for its own.
std::string NewHandle(const std::string& replica) {
  std::random_device rd;
  std::string h = "sys-";
  for (int i = 0; i < 4; ++i) absl::StrAppend(&h, absl::Hex(rd(), absl::kZeroPad8));
  if (!replica.empty()) absl::StrAppend(&h, "@", replica);
  return h;
}

absl::Status NotFound() {
  return absl::NotFoundError(
      "no such system: the handle was never issued to this identity, or it was released, "
      "expired or evicted");
}

}  // namespace

SystemRegistry::Use::~Use() {
  if (r_ != nullptr && e_) r_->Release(*e_);
}

SystemRegistry::SystemRegistry(SystemLimits limits)
    : limits_(limits), sweeper_(std::chrono::seconds(1), [this] { ExpireIdle(); }) {}

SystemRegistry::~SystemRegistry() = default;

void SystemRegistry::SetReplicaAddress(std::string address) {
  absl::MutexLock lock(&mu_);
  replica_ = std::move(address);
}

std::string SystemRegistry::replica_address() const {
  absl::ReaderMutexLock lock(&mu_);
  return replica_;
}

void SystemRegistry::EraseLocked(std::map<std::string, std::shared_ptr<Entry>>::iterator it,
                                 const char* why) {
  Entry& e = *it->second;
  e.gone.store(true);
  bytes_ -= e.bytes;
  spdlog::info("system {} ({}) {}: {} bytes returned", e.handle, e.label.empty() ? "-" : e.label,
               why, e.bytes);
  by_handle_.erase(it);
}

absl::Status SystemRegistry::Reserve(const std::string& identity, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  int mine = 0;
  for (const auto& [h, e] : by_handle_) mine += e->identity == identity;
  if (mine >= limits_.max_per_identity)
    return absl::ResourceExhaustedError(absl::StrCat(
        "this identity holds ", mine, " systems, the limit max_systems_per_identity; release one "
        "first"));
  if (bytes > limits_.max_bytes)
    return absl::ResourceExhaustedError(absl::StrCat("the system needs ", bytes,
                                                     " bytes, over the limit max_system_bytes = ",
                                                     limits_.max_bytes));
  // Least recently used first, skipping systems in use.
  while (bytes_ + bytes > limits_.max_bytes) {
    auto victim = by_handle_.end();
    for (auto it = by_handle_.begin(); it != by_handle_.end(); ++it)
      if (it->second->busy.load() == 0 &&
          (victim == by_handle_.end() || it->second->LastUsed() < victim->second->LastUsed()))
        victim = it;
    if (victim == by_handle_.end())
      return absl::ResourceExhaustedError(absl::StrCat(
          "persistent systems hold ", bytes_, " bytes, all in use; ", bytes,
          " more would pass max_system_bytes = ", limits_.max_bytes));
    EraseLocked(victim, "evicted (least recently used, over max_system_bytes)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SystemRegistry::Entry>> SystemRegistry::Add(
    const std::string& identity, std::string label, double ttl_s,
    std::unique_ptr<PreparedSystem> system, std::vector<std::vector<int64_t>> coefficient_shapes,
    std::vector<int64_t> rhs_shape) {
  auto e = std::make_shared<Entry>();
  e->identity = identity;
  e->label = std::move(label);
  e->ttl_s = ttl_s > 0 ? std::min(ttl_s, limits_.max_ttl_s) : limits_.default_ttl_s;
  e->bytes = system->bytes();
  e->system = std::move(system);
  e->coefficient_shapes = std::move(coefficient_shapes);
  e->rhs_shape = std::move(rhs_shape);
  e->Used();
  // The prepared system may hold more than the estimate Reserve made room for.
  if (auto st = Reserve(identity, e->bytes); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  do e->handle = NewHandle(replica_);
  while (by_handle_.count(e->handle) > 0);
  by_handle_[e->handle] = e;
  bytes_ += e->bytes;
  return e;
}

absl::StatusOr<SystemRegistry::Use> SystemRegistry::Acquire(const std::string& identity,
                                                            const std::string& handle) {
  // Under the reader lock: eviction and expiry, which read busy, hold the writer lock.
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end() || it->second->identity != identity) return NotFound();
  it->second->busy.fetch_add(1);
  it->second->Used();
  return Use(this, it->second);
}

void SystemRegistry::Release(Entry& e) {
  e.Used();
  e.busy.fetch_sub(1);
}

void SystemRegistry::Touch(Entry& e, bool solved, bool updated) {
  const int64_t now_bytes = e.system ? e.system->bytes() : 0;  // the caller holds e.mu
  e.solves.fetch_add(solved, std::memory_order_relaxed);
  e.updates.fetch_add(updated, std::memory_order_relaxed);
  if (now_bytes == e.bytes) return;  // (e.bytes is written only here, under e.mu)
  absl::MutexLock lock(&mu_);
  if (!e.gone.load()) bytes_ += now_bytes - e.bytes;
  e.bytes = now_bytes;
}

absl::StatusOr<std::shared_ptr<SystemRegistry::Entry>> SystemRegistry::Remove(
    const std::string& identity, const std::string& handle) {
  absl::MutexLock lock(&mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end() || it->second->identity != identity) return NotFound();
  auto e = it->second;
  EraseLocked(it, "released");
  return e;
}

std::vector<std::shared_ptr<SystemRegistry::Entry>> SystemRegistry::List(
    const std::string& identity) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::shared_ptr<Entry>> out;
  for (const auto& [h, e] : by_handle_)
    if (e->identity == identity) out.push_back(e);
  return out;
}

SystemRegistry::Usage SystemRegistry::UsageOf(const Entry& e) const {
  absl::ReaderMutexLock lock(&mu_);
  return {e.bytes, e.solves.load(), e.updates.load(),
          std::chrono::duration<double>(Clock::now() - e.LastUsed()).count()};
}

int64_t SystemRegistry::count() const {
  absl::ReaderMutexLock lock(&mu_);
  return int64_t(by_handle_.size());
}

int64_t SystemRegistry::bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  return bytes_;
}

int SystemRegistry::ExpireIdle() {
  std::vector<std::shared_ptr<Entry>> dropped;  // freed outside the lock
  int n = 0;
  {
    absl::MutexLock lock(&mu_);
    const auto now = Clock::now();
    for (auto it = by_handle_.begin(); it != by_handle_.end();) {
      auto next = std::next(it);
      Entry& e = *it->second;
      if (e.busy.load() == 0 && now - e.LastUsed() > std::chrono::duration<double>(e.ttl_s)) {
        dropped.push_back(it->second);
        EraseLocked(it, "expired (idle past its time-to-live)");
        ++n;
      }
      it = next;
    }
  }
  return n;
}

}  // namespace trisolve::server
