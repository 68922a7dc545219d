#include "trisolve/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trisolve {

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(int64_t bytes) {
  if (bytes <= 0)
    return absl::InvalidArgumentError(absl::StrCat("shared memory of ", bytes, " bytes"));
  const int64_t page = sysconf(_SC_PAGESIZE);
  bytes = (bytes + page - 1) / page * page;
  std::random_device rd;
  std::string key = "/trisolve-";
  for (int i = 0; i < 4; ++i) absl::StrAppend(&key, absl::StrFormat("%08x", rd()));
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("shm_open ", key, ": ", std::strerror(errno)));
  auto fail = [&](const char* what) {
    const int err = errno;
    close(fd);
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " of ", bytes, " bytes (", key, "): ", std::strerror(err),
                     " (is /dev/shm large enough?)"));
  };
  // posix_fallocate reserves the pages now: a full /dev/shm fails here, not with SIGBUS later.
  if (ftruncate(fd, off_t(bytes)) != 0) return fail("ftruncate");
  if (int e = posix_fallocate(fd, 0, off_t(bytes)); e != 0) {
    errno = e;
    return fail("posix_fallocate");
  }
  void* p = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  close(fd);
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(std::move(key), static_cast<std::byte*>(p), bytes));
}

SharedMemory::~SharedMemory() {
  munmap(base_, size_t(bytes_));
  shm_unlink(key_.c_str());
}

absl::StatusOr<void*> SharedMemory::Allocate(int64_t bytes) {
  const int64_t start = (used_ + 63) / 64 * 64;
  if (bytes < 0 || start > bytes_ || bytes > bytes_ - start)
    return absl::ResourceExhaustedError(absl::StrCat("shared memory ", key_, ": ", bytes,
                                                     " bytes do not fit (", bytes_ - used_,
                                                     " of ", bytes_, " left)"));
  used_ = start + bytes;
  return base_ + start;
}

}  // namespace trisolve
