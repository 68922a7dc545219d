#include "memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace trisolve::server {
namespace {

bool PlainName(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
  });
}

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 64 || !PlainName(name))
    return absl::InvalidArgumentError(
        absl::StrCat("name: 1 to 64 characters of [A-Za-z0-9._-] (got ", name.size(),
                     " characters", name.size() <= 64 ? ", some not allowed" : "", ")"));
  return absl::OkStatus();
}

absl::Status CheckNameAndKey(const std::string& name, const std::string& key) {
  if (auto st = CheckName(name); !st.ok()) return st;
  if (key.size() < 2 || key.size() > 200 || key[0] != '/' || !PlainName(key.substr(1)))
    return absl::InvalidArgumentError(
        absl::StrCat("key: '/' then 1 to 199 characters of [A-Za-z0-9._-] (got ", key.size(),
                     " characters)"));
  return absl::OkStatus();
}

// What every registration is checked for past its offset's own rule: a size, no overflow of
// offset + bytes, a time-to-live.
absl::Status CheckBytesAndTtl(int64_t offset, int64_t bytes, double ttl_s) {
  if (bytes <= 0)
    return absl::InvalidArgumentError(absl::StrCat("bytes is ", bytes, ", expected >= 1"));
  if (offset > std::numeric_limits<int64_t>::max() - bytes)
    return absl::InvalidArgumentError("offset + bytes overflows");
  if (!std::isfinite(ttl_s) || ttl_s < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("ttl_s is ", ttl_s, ", expected >= 0 (0: the default)"));
  return absl::OkStatus();
}

}  // namespace

Region::Region(Backend* backend, std::string name, std::string key, int fd, void* map,
               int64_t map_bytes, std::byte* base, int64_t bytes, int64_t object_end,
               bool pinned, double ttl_s)
    : backend_(backend),
      name_(std::move(name)),
      key_(std::move(key)),
      fd_(fd),
      map_(map),
      map_bytes_(map_bytes),
      base_(base),
      bytes_(bytes),
      object_end_(object_end),
      pinned_(pinned),
      ttl_s_(ttl_s),
      guard_(fd >= 0 ? std::make_unique<BusGuard>(map, map_bytes) : nullptr) {
  if (guard_ && !guard_->active())
    spdlog::warn("region {}: all {} guards are taken; its size is checked by fstat a request",
                 name_, BusGuard::kSlots);
}

Region::Region(Backend* backend, std::string name, std::byte* device_base, int64_t bytes,
               int device, double ttl_s)
    : backend_(backend),
      name_(std::move(name)),
      fd_(-1),
      map_(nullptr),
      map_bytes_(0),
      base_(device_base),
      bytes_(bytes),
      object_end_(bytes),
      pinned_(false),
      ttl_s_(ttl_s),
      device_(device) {}

Region::~Region() {
  if (device_ >= 0) {
    if (backend_ != nullptr) backend_->CloseDeviceMemory(base_);
    return;
  }
  if (pinned_ && backend_ != nullptr) backend_->UnpinHostMemory(map_);
  guard_.reset();  // before the range can be mapped again by anyone else
  munmap(map_, size_t(map_bytes_));
  if (fd_ >= 0) close(fd_);
}

absl::Status Region::StillMapped(absl::string_view field) const {
  if (fd_ < 0) return absl::OkStatus();  // the server's own memory
  if (guard_ && guard_->faulted())
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": region '", name_,
        "' shrank under the server: an access found pages of its object missing (what was "
        "read or written there did not reach the object); register the memory again"));
  if (guard_ && guard_->active()) return absl::OkStatus();
  return ObjectSpans(field);
}

absl::Status Region::ObjectSpans(absl::string_view field) const {
  if (fd_ < 0) return absl::OkStatus();
  if (guard_ && guard_->faulted()) return StillMapped(field);
  struct stat st {};
  if (fstat(fd_, &st) != 0 || int64_t(st.st_size) < object_end_)
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": region '", name_, "' shrank under the server (its object now has ",
        int64_t(st.st_size), " bytes, the region ends at ", object_end_, ")"));
  return absl::OkStatus();
}

MemoryRegistry::MemoryRegistry(MemoryLimits limits, Backend* backend)
    : limits_(limits),
      backend_(backend),
      sweeper_(std::chrono::seconds(1), [this] { ExpireIdle(); }) {}

MemoryRegistry::~MemoryRegistry() = default;

MemoryRegistry::Shard& MemoryRegistry::ShardOf(absl::string_view identity,
                                                absl::string_view name) const {
  return shards_[absl::HashOf(identity, name) % kShards];
}

double MemoryRegistry::IdleSeconds(const Entry& e, Clock::time_point now) {
  const Clock::time_point last(Clock::duration(e.last_used_ns.load(std::memory_order_relaxed)));
  return std::chrono::duration<double>(now - last).count();
}

RegionInfo MemoryRegistry::Info(const Entry& e, Clock::time_point now) {
  RegionInfo info;
  info.name = e.region->name();
  info.key = e.region->key();
  info.bytes = e.region->bytes();
  info.pinned = e.region->pinned();
  info.server_owned = e.region->server_owned();
  info.ttl_s = e.region->ttl_s();
  info.device = e.region->device();
  info.idle_s = std::max(0.0, IdleSeconds(e, now));
  info.uses = e.uses.load(std::memory_order_relaxed);
  return info;
}

absl::StatusOr<RegionInfo> MemoryRegistry::Register(const std::string& identity,
                                                    const std::string& name,
                                                    const std::string& key, int64_t offset,
                                                    int64_t bytes, double ttl_s) {
  if (!limits_.enabled)
    return absl::FailedPreconditionError(
        "this server does not accept shared memory (started with --no-shared-memory)");
  if (auto st = CheckNameAndKey(name, key); !st.ok()) return st;
  const int64_t page = sysconf(_SC_PAGESIZE);
  if (offset < 0 || offset % page != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("offset is ", offset, ", expected a multiple of the page size (", page, ")"));
  if (auto st = CheckBytesAndTtl(offset, bytes, ttl_s); !st.ok()) return st;
  {
    std::lock_guard<std::mutex> lock(admin_mu_);
    if (auto st = CheckRoomLocked(identity, name, bytes); !st.ok()) return st;
  }
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  if (fd < 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open shared memory '", key, "' on the server's host: ", std::strerror(errno),
        " (the client must run on the same host, in the same IPC namespace)"));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", key, "' is not a shared-memory object"));
  }
  if (int64_t(st.st_size) < offset + bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("the object '", key, "' has ",
                                                   int64_t(st.st_size), " bytes, the region [",
                                                   offset, ", ", offset + bytes,
                                                   ") does not fit in it"));
  }
  void* map = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(offset));
  if (map == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map '", key, "': ", std::strerror(err)));
  }
  bool pinned = false;
  if (backend_ != nullptr) {
    auto p = backend_->PinHostMemory(map, bytes);
    if (p.ok()) {
      pinned = *p;
    } else {
      spdlog::warn("region {}: not page-locked ({}); the device copies from it through staging",
                   name, std::string(p.status().message()));
    }
  }
  const double ttl = std::min(ttl_s > 0 ? ttl_s : limits_.default_ttl_s, limits_.max_ttl_s);
  spdlog::info("region {} registered: {} bytes of {}{}", name, bytes, key,
               pinned ? ", page-locked" : "");
  return Keep(identity, std::make_shared<Region>(backend_, name, key, fd, map, bytes,
                                                 static_cast<std::byte*>(map), bytes,
                                                 offset + bytes, pinned, ttl));
}

absl::Status MemoryRegistry::CheckRoomLocked(const std::string& identity, const std::string& name,
                                             int64_t bytes) const {
  if (bytes > limits_.max_bytes_per_identity)
    return absl::ResourceExhaustedError(
        absl::StrCat("the region has ", bytes, " bytes, over the limit max_region_bytes = ",
                     limits_.max_bytes_per_identity));
  {
    const Shard& shard = ShardOf(identity, name);
    absl::ReaderMutexLock lock(&shard.mu);
    if (shard.regions.count(KeyView{identity, name}))
      return absl::AlreadyExistsError(absl::StrCat("a region named '", name,
                                                   "' is registered already"));
  }
  int count = 0;
  int64_t held = 0;
  if (auto a = accounts_.find(identity); a != accounts_.end()) {
    count = a->second.count;
    held = a->second.bytes;
  }
  if (count >= limits_.max_regions_per_identity)
    return absl::ResourceExhaustedError(
        absl::StrCat("the caller holds ", count, " regions, the limit max_regions_per_identity = ",
                     limits_.max_regions_per_identity));
  if (held + bytes > limits_.max_bytes_per_identity)
    return absl::ResourceExhaustedError(
        absl::StrCat("the caller's regions would hold ", held + bytes,
                     " bytes, over the limit max_region_bytes = ", limits_.max_bytes_per_identity));
  return absl::OkStatus();
}

absl::StatusOr<RegionInfo> MemoryRegistry::Keep(const std::string& identity,
                                                std::shared_ptr<Region> region) {
  std::lock_guard<std::mutex> lock(admin_mu_);
  // Checked again: a concurrent call of the same identity may have taken the room meanwhile.
  if (auto st = CheckRoomLocked(identity, region->name(), region->bytes()); !st.ok()) return st;
  const auto now = Clock::now();
  const int64_t bytes = region->bytes();
  Account& account = accounts_[identity];
  ++account.count;
  account.bytes += bytes;
  ++count_;
  bytes_ += bytes;
  Shard& shard = ShardOf(identity, region->name());
  absl::WriterMutexLock write(&shard.mu);
  auto [it, added] =
      shard.regions.try_emplace(Key{identity, region->name()}, std::move(region), now);
  return Info(it->second, now);
}

absl::StatusOr<RegionInfo> MemoryRegistry::RegisterCuda(const std::string& identity,
                                                        const std::string& name,
                                                        const std::string& handle, int device,
                                                        int64_t offset, int64_t bytes,
                                                        double ttl_s) {
  if (!limits_.enabled)
    return absl::FailedPreconditionError(
        "this server does not accept shared memory (started with --no-shared-memory)");
  if (auto st = CheckName(name); !st.ok()) return st;
  if (handle.size() != size_t(kCudaIpcHandleBytes))
    return absl::InvalidArgumentError(absl::StrCat("handle: ", handle.size(), " bytes, expected ",
                                                   kCudaIpcHandleBytes,
                                                   " (a cudaIpcMemHandle_t, as cudaIpcGetMemHandle "
                                                   "gives it)"));
  if (device < 0)
    return absl::InvalidArgumentError(absl::StrCat("device: ", device, ", expected >= 0"));
  if (offset < 0)
    return absl::InvalidArgumentError(absl::StrCat("offset is ", offset, ", expected >= 0"));
  if (auto st = CheckBytesAndTtl(offset, bytes, ttl_s); !st.ok()) return st;
  {
    std::lock_guard<std::mutex> lock(admin_mu_);
    if (auto st = CheckRoomLocked(identity, name, bytes); !st.ok()) return st;
  }
  if (backend_ == nullptr)
    return absl::FailedPreconditionError("this server has no backend to open device memory with");
  auto p = backend_->OpenDeviceMemory(handle, device, offset, bytes);
  if (!p.ok()) {
    if (p.status().code() == absl::StatusCode::kUnimplemented)
      return absl::FailedPreconditionError(absl::StrCat(
          "this server cannot take CUDA memory: ", p.status().message(),
          " (start trisolved with --backend cuda, or register host memory with "
          "RegisterSharedMemory)"));
    return p.status();
  }
  const double ttl = std::min(ttl_s > 0 ? ttl_s : limits_.default_ttl_s, limits_.max_ttl_s);
  spdlog::info("region {} registered: {} bytes of CUDA memory on device {}", name, bytes, device);
  return Keep(identity, std::make_shared<Region>(backend_, name, static_cast<std::byte*>(*p),
                                                 bytes, device, ttl));
}

absl::StatusOr<RegionInfo> MemoryRegistry::Allocate(const std::string& identity,
                                                    const std::string& name, int64_t bytes,
                                                    double ttl_s) {
  if (name.empty() || name.size() > 64 || !PlainName(name))
    return absl::InvalidArgumentError("name: 1 to 64 characters of [A-Za-z0-9._-]");
  if (bytes <= 0)
    return absl::InvalidArgumentError(absl::StrCat("bytes is ", bytes, ", expected >= 1"));
  if (!std::isfinite(ttl_s) || ttl_s < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("ttl_s is ", ttl_s, ", expected >= 0 (0: the default)"));
  {
    std::lock_guard<std::mutex> lock(admin_mu_);
    if (auto st = CheckRoomLocked(identity, name, bytes); !st.ok()) return st;
  }
  void* map = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (map == MAP_FAILED)
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes: ", std::strerror(errno)));
  bool pinned = false;
  if (backend_ != nullptr) {
    auto p = backend_->PinHostMemory(map, bytes);
    pinned = p.ok() && *p;
  }
  const double ttl = std::min(ttl_s > 0 ? ttl_s : limits_.default_ttl_s, limits_.max_ttl_s);
  spdlog::info("region {} allocated: {} bytes of server memory{}", name, bytes,
               pinned ? ", page-locked" : "");
  return Keep(identity, std::make_shared<Region>(backend_, name, "", -1, map, bytes,
                                                 static_cast<std::byte*>(map), bytes, bytes,
                                                 pinned, ttl));
}

absl::StatusOr<RegionInfo> MemoryRegistry::Unregister(const std::string& identity,
                                                      const std::string& name) {
  std::shared_ptr<Region> dropped;  // unmapped outside the locks, once no request holds it
  std::lock_guard<std::mutex> lock(admin_mu_);
  Shard& shard = ShardOf(identity, name);
  absl::WriterMutexLock write(&shard.mu);
  auto it = shard.regions.find(KeyView{identity, name});
  if (it == shard.regions.end())
    return absl::NotFoundError("name: no such region (never registered, unregistered or expired)");
  RegionInfo info = Info(it->second, Clock::now());
  dropped = std::move(it->second.region);
  shard.regions.erase(it);
  Forget(identity, dropped->bytes());
  return info;
}

std::vector<RegionInfo> MemoryRegistry::List(const std::string& identity) const {
  std::vector<RegionInfo> out;
  const auto now = Clock::now();
  for (const Shard& shard : shards_) {
    absl::ReaderMutexLock lock(&shard.mu);
    for (auto it = shard.regions.lower_bound(KeyView{identity, ""});
         it != shard.regions.end() && it->first.identity == identity; ++it)
      out.push_back(Info(it->second, now));
  }
  std::sort(out.begin(), out.end(),
            [](const RegionInfo& a, const RegionInfo& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<std::shared_ptr<Region>> MemoryRegistry::Find(const std::string& identity,
                                                             const std::string& name,
                                                             absl::string_view field) {
  const auto now = Clock::now();  // outside the lock: a clock read is most of a lookup's time
  {
    Shard& shard = ShardOf(identity, name);
    absl::ReaderMutexLock lock(&shard.mu);
    auto it = shard.regions.find(KeyView{identity, name});
    if (it != shard.regions.end()) {
      it->second.last_used_ns.store(now.time_since_epoch().count(), std::memory_order_relaxed);
      it->second.uses.fetch_add(1, std::memory_order_relaxed);
      return it->second.region;
    }
  }
  return absl::NotFoundError(absl::StrCat(
      field, ": no region named '", Sanitized(name),
      "' (never registered by this caller, unregistered or expired)"));
}

bool MemoryRegistry::Holds(const std::string& identity, const std::string& name,
                           const Region* region) const {
  const Shard& shard = ShardOf(identity, name);
  absl::ReaderMutexLock lock(&shard.mu);
  auto it = shard.regions.find(KeyView{identity, name});
  return it != shard.regions.end() && it->second.region.get() == region;
}

int64_t MemoryRegistry::count() const {
  std::lock_guard<std::mutex> lock(admin_mu_);
  return count_;
}

int64_t MemoryRegistry::bytes() const {
  std::lock_guard<std::mutex> lock(admin_mu_);
  return bytes_;
}

void MemoryRegistry::Forget(const std::string& identity, int64_t bytes) {
  if (auto a = accounts_.find(identity); a != accounts_.end()) {
    a->second.bytes -= bytes;
    if (--a->second.count == 0) accounts_.erase(a);
  }
  --count_;
  bytes_ -= bytes;
}

int MemoryRegistry::ExpireIdle() {
  std::vector<std::shared_ptr<Region>> dropped;  // unmapped outside the lock
  {
    std::lock_guard<std::mutex> lock(admin_mu_);
    for (Shard& shard : shards_) {
      // Most sweeps find nothing to drop: a reader lock to look, so that lookups of the shard's
      // regions go on meanwhile, and the writer lock only where something is to go.
      bool idle_found = false;
      {
        absl::ReaderMutexLock look(&shard.mu);
        const auto now = Clock::now();
        for (const auto& [key, e] : shard.regions)
          if (IdleSeconds(e, now) > e.region->ttl_s()) {
            idle_found = true;
            break;
          }
      }
      if (!idle_found) continue;
      absl::WriterMutexLock write(&shard.mu);
      // Tested again under the writer lock: no Find can mark a region used between this test
      // and the erase, and one may have between the look and now.
      const auto now = Clock::now();
      for (auto it = shard.regions.begin(); it != shard.regions.end();) {
        const double idle = IdleSeconds(it->second, now);
        if (idle > it->second.region->ttl_s()) {
          spdlog::info("region {} expired after {:.0f} s idle", it->first.name, idle);
          Forget(it->first.identity, it->second.region->bytes());
          dropped.push_back(std::move(it->second.region));
          it = shard.regions.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  return int(dropped.size());
}

absl::StatusOr<std::byte*> RequestRegions::Resolve(absl::string_view field,
                                                   const std::string& region, int64_t offset,
                                                   int64_t bytes, int64_t expected_bytes,
                                                   int align, RegionUse use, bool* on_device) {
  if (on_device != nullptr) *on_device = false;
  auto r = registry_->Find(identity_, region, field);
  if (!r.ok()) return r.status();
  if (bytes == 0) bytes = expected_bytes;
  if (bytes != expected_bytes)
    return absl::InvalidArgumentError(absl::StrCat(field, ": the region range has ", bytes,
                                                   " bytes, the array needs ", expected_bytes));
  if (offset < 0 || offset % align != 0)
    return absl::InvalidArgumentError(absl::StrCat(field, ": region offset ", offset,
                                                   " is not a multiple of ", align,
                                                   " (the element size)"));
  if (offset > (*r)->bytes() || bytes > (*r)->bytes() - offset)
    return absl::InvalidArgumentError(absl::StrCat(field, ": [", offset, ", ", offset + bytes,
                                                   ") lies outside region '", (*r)->name(),
                                                   "' of ", (*r)->bytes(), " bytes"));
  if (auto st = (*r)->StillMapped(field); !st.ok()) return st;
  std::byte* p = (*r)->base() + offset;
  if (use == RegionUse::kStructure || ((*r)->on_device() && use == RegionUse::kHost)) {
    // Read on the host from device memory (a parent array, lengths, an update), or a structure
    // array from anywhere (RegionUse): its bytes copied into the server's own, once.
    std::unique_ptr<std::byte[]> copy(new (std::nothrow) std::byte[size_t(bytes)]);
    if (!copy)
      return absl::ResourceExhaustedError(
          absl::StrCat(field, ": cannot allocate ", bytes, " bytes to copy it to the host"));
    if ((*r)->on_device()) {
      if (auto st = registry_->backend()->CopyFromDevice(copy.get(), p, bytes); !st.ok())
        return absl::Status(st.code(), absl::StrCat(field, ": ", st.message()));
    } else {
      std::memcpy(copy.get(), p, size_t(bytes));
    }
    p = copy.get();
    host_copies_.push_back(std::move(copy));
  } else if (on_device != nullptr) {
    *on_device = (*r)->on_device();
  }
  held_.push_back(*std::move(r));
  return p;
}

absl::Status RequestRegions::AfterUse() const {
  for (const auto& r : held_)
    if (auto st = r->StillMapped("region"); !st.ok()) return st;
  return absl::OkStatus();
}

}  // namespace trisolve::server
