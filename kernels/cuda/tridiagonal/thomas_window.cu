// Batched tridiagonal systems by Thomas' algorithm, one thread a system (or a window of one),
// the rows streamed through shared memory by the copy engine and x stored by a look-ahead back
// substitution: "thomas-window" (tridiagonal.h says when it runs). In short: c' and d' stay in a
// ring of shared memory; a chunk of 16 rows is substituted back from the forward sweep's front
// once the carried bound on prod |c'| puts the error under the unit roundoff (else the problem
// runs again with a longer ring, then by the exact paths); windows past a system's first drop
// their left coupling and bound that error a posteriori too (else a longer halo, then the exact
// paths); vanishing pivots and non-finite x flag the system as the CPU reference does. The
// proofs of both bounds, the flat and chained layouts, mirrored windows and where the time goes:
// docs/kernels/tridiagonal.md, "thomas-window: design notes".
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>

#include "tridiagonal/thomas_window_kernel.cuh"
#include "common/bulk_copy.cuh"
#include "runtime/check.h"
#include "runtime/launch.h"
#include "common/numerics.cuh"
#include "runtime/pinned_word.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/windows.h"

namespace trisolve::cuda {
namespace {

// `every`: a box takes every other system (the chain's mirrored tasks: even or odd windows).
template <typename T>
bool EncodeMaps(const TridiagonalProblem<T>& p, T* x, int sys, int every, Maps& maps) {
  const auto encode = TensorMapEncoder();
  if (!encode) return false;
  const T* arrays[4] = {p.a, p.b, p.c, p.d};
  for (int q = 0; q < 4; ++q) {
    const bool flat = p.layout == Layout::kFlat;
    const cuuint64_t dims[2] = {cuuint64_t(flat ? p.n : p.batch), cuuint64_t(flat ? p.batch : p.n)};
    const cuuint64_t strides[1] = {cuuint64_t(flat ? p.n : p.batch) * sizeof(T)};
    const cuuint32_t box[2] = {flat ? StageRows<T>() : cuuint32_t(sys),
                               flat ? cuuint32_t(sys * every) : StageRows<T>()};
    const cuuint32_t elem[2] = {1, cuuint32_t(flat ? every : 1)};
    if (encode(&maps.m[q],
               sizeof(T) == 8 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT64 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
               2, const_cast<T*>(arrays[q]), dims, strides, box, elem,
               CU_TENSOR_MAP_INTERLEAVE_NONE,
               flat ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  if (p.layout == Layout::kFlat) {
    const cuuint64_t dims[2] = {cuuint64_t(p.n), cuuint64_t(p.batch)};
    const cuuint64_t strides[1] = {cuuint64_t(p.n) * sizeof(T)};
    const cuuint32_t box[2] = {cuuint32_t(64 / sizeof(T)), cuuint32_t(sys * every)};
    const cuuint32_t elem[2] = {1, cuuint32_t(every)};
    if (encode(&maps.x,
               sizeof(T) == 8 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT64 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
               2, x, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_64B,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

// The chain's maps of one part: the rows from `from` viewed as `count` windows of `core` rows.
template <typename T>
bool EncodeChainMaps(const TridiagonalProblem<T>& p, T* x, int64_t from, int64_t core,
                     int64_t count, int every, Maps& maps) {
  TridiagonalProblem<T> view = p;
  view.layout = Layout::kFlat;
  view.batch = count;
  view.n = core;
  view.a = p.a + from;
  view.b = p.b + from;
  view.c = p.c + from;
  view.d = p.d + from;
  return EncodeMaps(view, x + from, kLanes, every, maps);
}

std::atomic<int64_t> g_launches{0};   // ThomasWindowLaunches
std::atomic<int64_t> g_last_halo{0};  // ThomasWindowLastHalo

// One launch with a ring of kRing rows: kInWord (the answer, 0 or kFail*, comes in the word
// once the kernel is done), or an answer known without launching.
constexpr int kInWord = -1;
template <typename T, int kRing, int kSys, int kStages, bool kFlat>
absl::StatusOr<int> LaunchThomasWindow(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                       const Maps& maps, int64_t windows, int64_t halo,
                                       bool mirror, const PinnedWord& word, cudaStream_t stream) {
  constexpr int kPer = kLanes / kSys;
  Maps chain1{}, chain2{};  // one system: its parts' maps (PlanChain)
  auto kernel = ThomasWindowKernel<T, kRing, kSys, kStages, kFlat>;
  const size_t smem = sizeof(Smem<T, kRing, kSys, kStages, kFlat>) + 512;
  // The shared-memory attribute and the blocks that run at once: asked once a device.
  static PerDevice asked;
  const absl::StatusOr<int64_t> resident = asked.Get([&] {
    LaunchConfig launch(0, kLanes, smem, nullptr);
    return ResidentGroups(kernel, launch);
  });
  if (!resident.ok()) return resident.status();
  if (*resident < 1) return kFailRows;
  halo = (halo + StageRows<T>() - 1) / StageRows<T>() * StageRows<T>();
  Args args;
  args.plan.halo = halo;
  if (kFlat && p.batch == 1) {  // one system: its windows the lanes' (the chain)
    // Mirrored: one part (its maps take every other window).
    const ChainPlan plan = PlanChain(p.n, *resident, kSys, kOut, kChainMinCore, mirror);
    // (A halo reaches one window back only.)
    if (plan.parts == 0 || halo > plan.part[0].core) return kFailRows;
    const ChainPart &one = plan.part[0], &two = plan.part[1];
    args.chain = true;
    args.plan.core = one.core;
    args.plan.per_system = one.windows;
    args.mirror = mirror;
    args.tasks1 = INT64_MAX;  // (one part: every task the first's)
    if (mirror) {
      args.tasks = 2 * ((one.windows + 2 * kSys - 1) / (2 * kSys));
      if (!EncodeChainMaps(p, x, 0, one.core, one.windows, 2, chain1))
        return kFailRows;  // (the exact path)
    } else if (plan.parts == 1) {
      args.tasks = plan.tasks;
      if (!EncodeChainMaps(p, x, 0, one.core, one.windows, 1, chain1))
        return kFailRows;  // (the exact path)
    } else {
      // The first part's view ends a window late (the second's first rows), the second's
      // starts a window early (the first's last rows).
      args.tasks = plan.tasks;
      args.tasks1 = one.windows / kSys;
      args.start2 = int(two.start);
      args.core2 = int(two.core);
      args.wins2 = int(two.windows);
      if (!EncodeChainMaps(p, x, 0, one.core, one.windows + 1, 1, chain1) ||
          !EncodeChainMaps(p, x, two.start - two.core, two.core, two.windows + 1, 1, chain2))
        return kFailRows;  // (the exact path)
    }
  } else {
    // Windows a system: enough tasks (kPer windows of a group) for the blocks that run at once
    // in one wave (a second one for a few tasks costs a whole task's time), cores of 4 halos
    // or more.
    const int64_t groups = (p.batch + kSys - 1) / kSys;
    if (windows <= 0) windows = groups * kPer >= *resident ? 1 : *resident / groups * kPer;
    windows = std::max<int64_t>(1, std::min(windows, p.n / (4 * halo)));
    args.plan.core = (p.n + windows - 1) / windows;
    args.plan.core = (args.plan.core + kOut - 1) / kOut * kOut;
    // Mirrored: whole cores, a divisor of n up to a quarter longer (2^20: 1008 -> 1024 rows).
    int64_t whole = 0;
    for (int64_t c = args.plan.core; mirror && c <= args.plan.core * 5 / 4 && !whole; c += kOut)
      if (p.n % c == 0) whole = c;
    if (whole) args.plan.core = whole;
    args.plan.per_system = (p.n + args.plan.core - 1) / args.plan.core;
    const int64_t wins = args.plan.per_system;
    args.mirror = whole && wins >= 2;
    args.tasks = groups * (args.mirror ? 2 * (((wins + 1) / 2 + kPer - 1) / kPer)
                                       : (wins + kPer - 1) / kPer);
  }
  args.tau = std::ldexp(1.0, -(std::numeric_limits<T>::digits + 2));
  // The kernel counts its answer into the word's scratch and its last block writes it into the
  // host word: no device word to clear before the launch, no copy after it.
  args.fail = word.scratch();
  args.answer = word.mapped();
  g_launches.fetch_add(1, std::memory_order_relaxed);
  if (args.plan.per_system > 1) g_last_halo.store(halo, std::memory_order_relaxed);
  kernel<<<unsigned(std::min(args.tasks, *resident)), kLanes, smem, stream>>>(
      p, x, flags, args.chain ? chain1 : maps, chain2, args);
  TRISOLVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return kInWord;
}

// Systems a box: whole warps of systems where the batch has 32 or more, else two windows of
// 16 systems a warp (or four of 8); one (flat) system: 32 of its windows (the chain).
template <typename T>
int SystemsABox(const TridiagonalProblem<T>& p) {
  return p.batch >= 32 || p.batch == 1 ? 32 : p.batch >= 16 ? 16 : 8;
}

template <typename T, int kRing, int kStages, bool kFlat>
absl::StatusOr<int> LaunchBySystems(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                    const Maps& maps, int64_t windows, int64_t halo, bool mirror,
                                    const PinnedWord& word, cudaStream_t stream) {
  switch (SystemsABox(p)) {
    case 32:
      return LaunchThomasWindow<T, kRing, 32, kStages, kFlat>(p, x, flags, maps, windows, halo,
                                                              mirror, word, stream);
    case 16:
      return LaunchThomasWindow<T, kRing, 16, kStages, kFlat>(p, x, flags, maps, windows, halo,
                                                              mirror, word, stream);
    default:
      return LaunchThomasWindow<T, kRing, 8, kStages, kFlat>(p, x, flags, maps, windows, halo,
                                                             mirror, word, stream);
  }
}

// Copies in flight a warp: float64 2 (4 cost a block an SM), float32 2 by default, or 1 or 4.
// Evidence: docs/kernels/tridiagonal.md, "Tuning evidence", LaunchByStages (thomas-window).
template <typename T, int kRing>
absl::StatusOr<int> LaunchByStages(const TridiagonalProblem<T>& p, T* x, uint8_t* flags,
                                   const Maps& maps, int64_t windows, int64_t halo, int stages,
                                   bool mirror, const PinnedWord& word, cudaStream_t stream) {
  if (p.layout == Layout::kFlat)  // (two copies in flight only)
    return LaunchBySystems<T, kRing, 2, true>(p, x, flags, maps, windows, halo, mirror, word,
                                                    stream);
  if constexpr (sizeof(T) == 4) {
    if (stages == 1)
      return LaunchBySystems<T, kRing, 1, false>(p, x, flags, maps, windows, halo, mirror, word,
                                                  stream);
    if (stages == 4)
      return LaunchBySystems<T, kRing, 4, false>(p, x, flags, maps, windows, halo, mirror, word,
                                                  stream);
  }
  return LaunchBySystems<T, kRing, 2, false>(p, x, flags, maps, windows, halo, mirror, word,
                                              stream);
}

// Where a shape's last solve started and succeeded: the ring, mirrored or forward, and the
// halo (the shorter one its windows measured, if so). A time-stepping caller solves the same
// shape with rows alike at every step, so the launches that failed at its first solve (up to
// three: a halo, a ring, the mirror) need not be paid at every step. A launch from the
// remembered start that fails goes on from there as a first solve would (and is forgotten if
// it ends on the exact path); every kFresh-th solve of a shape starts with the short ring and
// mirrored again, so that rows that became easier get them back (the halo follows the
// windows' measure at every solve).
struct Start {
  bool long_ring = false;
  int64_t halo = 0;
  bool mirror = false;
};
class StartMemory {
 public:
  static constexpr int kFresh = 64;
  static constexpr size_t kShapes = 8;
  struct Shape {
    int bytes;  // sizeof(T)
    int64_t n, batch;
    Layout layout;
    int64_t windows, halo;
    int stages, mirror;
    bool operator==(const Shape& o) const {
      return bytes == o.bytes && n == o.n && batch == o.batch && layout == o.layout &&
             windows == o.windows && halo == o.halo && stages == o.stages && mirror == o.mirror;
    }
  };
  // The remembered start (a fresh turn: its halo alone), unless none.
  std::optional<Start> Find(const Shape& k) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = Locate(k);
    if (it == entries_.end()) return std::nullopt;
    entries_.splice(entries_.begin(), entries_, it);  // most recent first (as the backend's plans)
    if (++it->solves % kFresh == 0) return Start{false, it->start.halo, true};
    return it->start;
  }
  // A solve of k succeeded from `s` (or, !ok, went to the exact path: forgotten).
  void Keep(const Shape& k, const Start& s, bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = Locate(k);
    if (!ok) {
      if (it != entries_.end()) entries_.erase(it);
      return;
    }
    if (it != entries_.end()) {
      it->start = s;
      return;
    }
    entries_.push_front(Entry{k, s, 0});
    if (entries_.size() > kShapes) entries_.pop_back();
  }

 private:
  struct Entry {
    Shape shape;
    Start start;
    int64_t solves;
  };
  std::list<Entry>::iterator Locate(const Shape& k) {
    return std::find_if(entries_.begin(), entries_.end(),
                        [&](const Entry& e) { return e.shape == k; });
  }
  std::mutex mu_;
  std::list<Entry> entries_;
};
StartMemory g_starts;

}  // namespace

int64_t ThomasWindowLaunches() { return g_launches.load(std::memory_order_relaxed); }
int64_t ThomasWindowLastHalo() { return g_last_halo.load(std::memory_order_relaxed); }

bool ThomasWindowApplies(int64_t n, int64_t batch, Layout layout, bool float32) {
  // The copies' row stride, whole 16-byte words: a row of the batch (interleaved), a system
  // (flat).
  const int64_t word = float32 ? 4 : 2;
  const bool strides = layout == Layout::kInterleaved && batch > 1 ? batch % word == 0
                                                                   : n % word == 0;
  // One system (either layout): a warp's 32 windows of kChainMinCore rows at least, cores of
  // whole chunks (where PlanChain has a plan: the one window a lane, at worst).
  const bool chain = batch == 1 && n % kOut == 0 && n >= kLanes * kChainMinCore;
  return (batch >= 2 || chain) && strides && n >= 1 && n < (int64_t(1) << 31) - kLongRing &&
         ClustersAvailable() && TensorMapEncoder() != nullptr;
}

// The halo to launch with for a measured need: an eighth and a copy over it (the rows of a
// time step's next solve are alike, not the same), whole copies, 16 to 256 rows.
template <typename T>
int64_t FitHalo(int need) {
  const int64_t k = int64_t(need) + need / 8 + StageRows<T>();
  return std::clamp<int64_t>((k + StageRows<T>() - 1) / StageRows<T>() * StageRows<T>(), 16,
                             kLongHalo);
}

// A thomas-window solve from its first launch to its answer: what a launch again (a longer
// halo or ring, forward only) needs, and the pinned word the launches answer in.
template <typename T>
struct WindowRun {
  TridiagonalProblem<T> p;
  T* x = nullptr;
  uint8_t* flags = nullptr;
  cudaStream_t stream = nullptr;
  int64_t windows = 0, halo = 0;  // the caller's (0: by shape, the default halo)
  int stages = 0;
  StartMemory::Shape shape{};
  bool long_ring = false;
  int64_t h = 0;  // the halo of the next launch
  bool mirror = false;
  Maps maps{};  // (a batch's: one system's chain maps its own at each launch)
  PinnedWord word;
  bool unread = false;  // a launch whose answer is not read yet (the word is the kernel's)

  WindowRun() = default;
  WindowRun(const WindowRun&) = delete;
  WindowRun& operator=(const WindowRun&) = delete;
  // Unfinished: the kernel may still write the word and count in its scratch, which go back
  // to be taken by other launches.
  ~WindowRun() {
    if (unread) (void)cudaStreamSynchronize(stream);
  }

  // Queues a launch from the current start; an answer known without launching comes back.
  absl::StatusOr<int> Launch() {
    absl::StatusOr<int> a =
        long_ring ? LaunchByStages<T, kLongRing>(p, x, flags, maps, windows, h, stages, mirror,
                                                  word, stream)
                  : LaunchByStages<T, kShortRing>(p, x, flags, maps, windows, h, stages, mirror,
                                                   word, stream);
    unread = a.ok() && *a == kInWord;
    return a;
  }

  // From a launch's answer (kInWord: in the word, after the kernel) to the problem's: true
  // where thomas-window solved it, false where the exact path must (the flags cleared).
  // *again: a launch after the first rewrote x and the flags.
  // A ring of 64 rows first; a longer ring where the look-ahead ran out, a longer halo (the
  // one the windows measured) where a halo was too short for the left end's bound (unless the
  // caller set it). Mirrored windows that fail past those run once more forward only: a
  // backward window sees the rows transposed (its look-ahead fades with a, its left end with
  // c), which rows far from symmetric may not allow where the forward windows do.
  absl::StatusOr<bool> Answer(int answer, bool* again) {
    int64_t next_h = h;  // the halo a shape's next solve starts with
    for (;;) {
      int need = 0;  // the halo the windows measured (0: none past a system's first ran)
      if (answer == kInWord) {
        TRISOLVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        unread = false;
        answer = static_cast<volatile int*>(word.get())[0];
        need = static_cast<volatile int*>(word.get())[1];
      }
      const bool ring_again = answer == kFailLookAhead && !long_ring;
      const bool halo_again = answer == kFailHalo && halo <= 0 && h < kLongHalo;
      next_h = answer == 0 && halo <= 0 && need > 0 ? std::min(h, FitHalo<T>(need)) : h;
      if (answer == 0 || (!ring_again && !halo_again && !mirror)) break;
      if (!ring_again && !halo_again) mirror = false;
      long_ring |= ring_again;
      if (halo_again) h = std::min(kLongHalo, std::max(h + StageRows<T>(), FitHalo<T>(need)));
      TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(p.batch), stream));
      *again = true;
      absl::StatusOr<int> a = Launch();
      if (!a.ok()) return a.status();
      answer = *a;
    }
    g_starts.Keep(shape, Start{long_ring, next_h, mirror}, answer == 0);
    if (answer == 0) return true;
    // Systems flagged before the failure: the exact path decides again.
    TRISOLVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flags, 0, size_t(p.batch), stream));
    *again = true;
    return false;
  }
};

template <typename T>
absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<T>& in, T* x, uint8_t* flags,
                                         cudaStream_t stream, int64_t windows, int64_t halo,
                                         int stages, int mirror_by, ThomasWindowRest* rest) {
  if (!ThomasWindowApplies(in.n, in.batch, in.layout, sizeof(T) == 4)) return false;
  auto run = std::make_unique<WindowRun<T>>();
  WindowRun<T>& r = *run;
  r.p = in;
  TridiagonalProblem<T>& p = r.p;
  if (p.batch == 1) p.layout = Layout::kFlat;  // (one system: the layouts are the same)
  // Mirrored windows by default in the interleaved layout alone: the flat layout read 9% fewer
  // bytes mirrored but ran no faster (NOTES.md t39, t41).
  r.mirror = mirror_by > 0 || (mirror_by == 0 && p.layout == Layout::kInterleaved);
  const T* arrays[4] = {p.a, p.b, p.c, p.d};
  for (const T* q : arrays)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  if (p.layout == Layout::kFlat && reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  r.x = x;
  r.flags = flags;
  r.stream = stream;
  r.windows = windows;
  r.halo = halo;
  r.stages = stages;
  r.h = halo > 0 ? halo : kFirstHalo;
  r.shape = StartMemory::Shape{int(sizeof(T)), p.n,  p.batch, p.layout,
                               windows,        halo, stages,  mirror_by};
  if (const std::optional<Start> start = g_starts.Find(r.shape)) {
    r.long_ring = start->long_ring;
    r.h = start->halo;
    r.mirror &= start->mirror;
  }
  // (One system: each launch maps the parts of its chain, PlanChain's for the blocks that run.)
  if (p.batch > 1 && !EncodeMaps(p, x, SystemsABox(p), 1, r.maps)) return false;
  auto word = PinnedWord::Take();
  if (!word.ok()) return word.status();
  r.word = std::move(*word);
  absl::StatusOr<int> first = r.Launch();
  if (!first.ok()) return first.status();
  if (rest != nullptr && *first == kInWord) {
    *rest = [run = std::move(run)](bool* again) { return run->Answer(kInWord, again); };
    return true;
  }
  bool again = false;
  return r.Answer(*first, &again);
}

template absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<double>&, double*,
                                                  uint8_t*, cudaStream_t, int64_t, int64_t, int,
                                                  int, ThomasWindowRest*);
template absl::StatusOr<bool> SolveThomasWindowed(const TridiagonalProblem<float>&, float*,
                                                  uint8_t*, cudaStream_t, int64_t, int64_t, int,
                                                  int, ThomasWindowRest*);

}  // namespace trisolve::cuda
