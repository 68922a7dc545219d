// The request ring: the control path for clients on the server's host, in POSIX shared memory
// beside the data (docs/api.md, "The request ring"). A client registers a shared-memory region
// (RegisterSharedMemory), writes a ring header at an offset of it, and opens the ring (OpenRing);
// the server then serves the ring's slots from a thread of its own, as the identity that opened
// it. A slot carries one request descriptor and its answer; the arrays and x lie in the same
// region, or in other regions the same identity registered (named in the request, read and
// written in place: a client whose arrays already live in shared memory copies nothing), each
// named by (offset, bytes) from its region's start; the per-system statuses lie in the ring's.
//
// Everything here is plain data, the same bytes in both processes (x86-64 and aarch64 Linux,
// little-endian). The words that change hands (RingHeader's doorbell, sleeping, heartbeat,
// closed, queued; RingSlot's state, waiting) are read and written only through std::atomic_ref;
// the doorbell and the slots' states are futex words of the shared mapping (FUTEX_WAIT /
// FUTEX_WAKE without FUTEX_PRIVATE_FLAG).
// A change of any size or offset below is a new kRingVersion (tests/test_ring.cc pins them); a
// field taken from reserved bytes (zeros in a header written into fresh memory) is not: a side
// that predates it leaves it 0, and the other reads 0.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <ctime>

namespace trisolve::ring {

inline constexpr uint64_t kRingMagic = 0x31474e4952535454ull;  // "TTSRING1", little-endian
inline constexpr uint32_t kRingVersion = 2;
inline constexpr int kRingMaxArrays = 8;
inline constexpr int kRingMaxRank = 4;
inline constexpr int kRingMessageBytes = 240;
// Other regions a request may name (RingRequest::regions).
inline constexpr int kRingMaxRegions = 2;
// Where a ring may start in its region, and what every slot is aligned to.
inline constexpr int64_t kRingAlign = 64;

// RingSlot::state. The client owns a FREE or DONE slot, the server a SUBMITTED or TAKEN one.
enum RingSlotState : uint32_t {
  kSlotFree = 0,
  kSlotSubmitted = 1,  // the client wrote a request and hands the slot over
  kSlotTaken = 2,      // the server copied the request and is answering it
  kSlotDone = 3,       // the answer is written; the client reads it and frees the slot
};

enum RingOp : uint32_t {
  kOpSolve = 1,        // a whole job of `family` (the unary Solve* calls)
  kOpSolveSystem = 2,  // right-hand sides of a persistent system (SolveSystem), by handle
};

// RingRequest::family: trisolve.v1's request messages.
enum RingFamily : uint32_t {
  kFamilyTridiagonal = 0,
  kFamilyTree = 1,
  kFamilyBlockTridiagonal = 2,
  kFamilyDense = 3,
};

// RingRequest::flags.
enum RingFlags : uint32_t {
  kFlagSkipResidual = 1u << 0,
  kFlagScaleRows = 1u << 1,      // block-tridiagonal
  kFlagMaxIterations = 1u << 2,  // block-tridiagonal: max_iterations is set
  kFlagTol = 1u << 3,            // block-tridiagonal: tol is set
};

// RingHeader::closed: why the server stopped serving the ring (0: open).
enum RingClosed : uint32_t {
  kRingOpen = 0,
  kClosedByClient = 1,    // CloseRing
  kClosedRegionGone = 2,  // its region was unregistered or expired
  kClosedShutdown = 3,    // the server is shutting down
  kClosedBroken = 4,      // the header was overwritten (magic, version or slots changed)
};

// One array of a request: its name as the family's request message names the field ("a",
// "d", "rhs", "a_c", ...), its shape, and where its bytes lie.
struct RingArray {
  char name[16];  // NUL-terminated unless all 16 bytes are used
  int32_t rank;   // 1 .. kRingMaxRank
  // 0: the ring's region (the bytes are copied out once, before any check); k in 1 ..
  // kRingMaxRegions: the region RingRequest::regions[k - 1] names, read in place as a
  // RegionRef of the RPCs is.
  uint32_t region;
  int64_t shape[kRingMaxRank];
  int64_t offset;  // from its region's start, aligned for the element type
  int64_t bytes;   // the array's byte size (its shape's values at the dtype's size; int32 indices)
};

// What a client asks. Read once by the server (copied out before any check), so a client that
// writes to it while the server works changes nothing but its own answer.
struct RingRequest {
  uint32_t op;      // RingOp
  uint32_t family;  // RingFamily (kOpSolve)
  uint32_t dtype;   // trisolve.v1.DType: 1 FLOAT64, 2 FLOAT32
  uint32_t layout;  // trisolve.v1.Layout: 0 FLAT, 1 INTERLEAVED
  uint32_t flags;   // RingFlags
  int32_t narrays;  // arrays used, 0 .. kRingMaxArrays
  char method[32];  // as the request message's method ("" = auto); NUL-terminated
  char handle[64];  // kOpSolveSystem: the system's handle; NUL-terminated
  // The request's id in the server's log (as x-request-id: [A-Za-z0-9._:-], at most 63; "" or
  // another: the ring's id and the tag); NUL-terminated.
  char request_id[64];
  // The deadline, nanoseconds since the Unix epoch (CLOCK_REALTIME); 0: none (the server's
  // default applies, as for a call without one).
  int64_t deadline_unix_ns;
  int64_t max_iterations;  // block-tridiagonal, with kFlagMaxIterations
  double tol;              // block-tridiagonal, with kFlagTol
  RingArray arrays[kRingMaxArrays];  // kOpSolveSystem: arrays[0] is the right-hand side "rhs"
  // Where x goes (its bytes: the right-hand side's; in the region x_region says, as
  // RingArray::region), and the per-system statuses (one byte a system,
  // trisolve.v1.SystemStatus), in the ring's region.
  int64_t x_offset, x_bytes;
  int64_t status_offset, status_bytes;
  // Names of the caller's other registered regions (RegisterSharedMemory) that arrays or x lie
  // in, NUL-terminated (at most 63 characters). Never the ring's own region (that is region 0).
  char regions[kRingMaxRegions][64];
  uint32_t x_region;
  uint32_t reserved;
  uint64_t tag;  // the client's, echoed in the answer
};

// What the server answers. Valid once the slot is kSlotDone.
struct RingAnswer {
  int32_t code;  // absl / gRPC status code (0: OK)
  uint32_t message_bytes;
  char message[kRingMessageBytes];  // the status message, cut at kRingMessageBytes
  uint32_t dtype;  // x's
  int32_t x_rank;
  int64_t x_shape[kRingMaxRank];
  int64_t statuses;  // written at status_offset
  int64_t systems, ok, singular, not_converged, diverged, iterations;
  double residual;
  double receive_us, queue_us, h2d_us, compute_us, d2h_us, residual_us, total_us;
  int32_t batched_with;
  int32_t reserved;
  int64_t batch_systems, right_hand_sides;
  char method[32];   // what ran
  char backend[16];  // "cpu" or "cuda"
  uint64_t tag;      // the request's
};

struct RingSlot {
  uint32_t state;    // RingSlotState; futex word the client waits on
  uint32_t waiting;  // 1 while the client sleeps on `state` (the server then wakes it)
  uint64_t sequence;  // the client's count of requests through this slot
  uint8_t reserved[48];
  RingRequest request;
  RingAnswer answer;
  uint8_t tail[24];  // to a multiple of kRingAlign
};

// At the ring's offset in its region; the slots follow it, the rest of the region is the
// client's (its arena for the arrays).
struct RingHeader {
  uint64_t magic;    // kRingMagic
  uint32_t version;  // kRingVersion
  uint32_t slots;    // how many RingSlots follow
  uint32_t slot_bytes;    // sizeof(RingSlot)
  uint32_t header_bytes;  // sizeof(RingHeader)
  // The client adds 1 after it submits a slot, and wakes the server (FUTEX_WAKE) when
  // `sleeping` is 1; the server sleeps on it (FUTEX_WAIT) when it found nothing to do.
  uint32_t doorbell;
  uint32_t sleeping;
  // The server adds 1 a tenth of a second or so while the ring is served: a client waiting on
  // a slot whose heartbeat stops learns that the server is gone (UNAVAILABLE).
  uint32_t heartbeat;
  uint32_t closed;  // RingClosed; the server sets it (and wakes every waiting slot) on closing
  // The server stores it before each answer: requests its serving thread answered in its last
  // pass over its rings (this ring's among them; at least 1). Above 1 the next request will
  // queue behind others': a client need not spin for it. 0 from a server that predates it.
  uint32_t queued;
  uint8_t reserved[20];
};

inline constexpr int64_t RingBytes(int64_t slots) {
  return int64_t(sizeof(RingHeader)) + slots * int64_t(sizeof(RingSlot));
}
inline RingSlot* Slots(RingHeader* h) {
  return reinterpret_cast<RingSlot*>(reinterpret_cast<std::byte*>(h) + sizeof(RingHeader));
}

// The words two processes share, read and written atomically.
inline std::atomic_ref<uint32_t> Word(uint32_t& w) { return std::atomic_ref<uint32_t>(w); }

static_assert(sizeof(RingArray) == 72);
static_assert(sizeof(RingRequest) == 960);
static_assert(sizeof(RingAnswer) == 488);
static_assert(sizeof(RingSlot) == 1536 && sizeof(RingSlot) % kRingAlign == 0);
static_assert(sizeof(RingHeader) == 64);
static_assert(offsetof(RingSlot, request) == 64);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

// The doorbell and the slots' state words are futexes of the shared mapping (not
// FUTEX_PRIVATE_FLAG: the other side waits and wakes in another process).
inline void FutexWait(uint32_t* word, uint32_t expected, double timeout_s) {
  timespec ts{};
  ts.tv_sec = time_t(timeout_s);
  ts.tv_nsec = long((timeout_s - double(ts.tv_sec)) * 1e9);
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
inline void FutexWake(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// A spinning side's pause between two looks at a word.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace trisolve::ring
