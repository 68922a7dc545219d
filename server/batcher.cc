#include "batcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "admission.h"
#include "metrics.h"

namespace trisolve::server {
namespace {

using Steady = std::chrono::steady_clock;
// How often a waiting member looks at its caller (cancellation is polled, as in Admission).
constexpr std::chrono::milliseconds kPoll{20};

template <typename T>
double BackwardErrorTyped(const Job& job, const T* x, const SystemStatus* status) {
  const auto residual = job.descriptor().ops<T>().backward_error;
  if (residual == nullptr) return std::numeric_limits<double>::quiet_NaN();
  return residual(job.Spec(), reinterpret_cast<const T*>(job.rhs().data), job.Extra(), x, status);
}

// The job's shared parent array (one tree for all its systems), or null.
const JobArray* SharedParent(const Job& job) {
  if (job.parent_per_system) return nullptr;
  const FamilyDescriptor& d = job.descriptor();
  for (size_t i = 0; i < d.arrays.size(); ++i)
    if (d.arrays[i].role == ArrayRole::kParent && job.arrays[i].declared) return &job.arrays[i];
  return nullptr;
}

uint64_t Fnv1a(const std::byte* p, int64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < bytes; ++i) h = (h ^ uint64_t(p[i])) * 1099511628211ull;
  return h;
}


}  // namespace

double JobBackwardError(const Job& job, const void* x, const SystemStatus* status) {
  return job.precision == Precision::kFloat64
             ? BackwardErrorTyped(job, static_cast<const double*>(x), status)
             : BackwardErrorTyped(job, static_cast<const float*>(x), status);
}

struct Batcher::Member {
  const Job* job = nullptr;
  std::function<bool()> cancelled;
  int64_t first = 0;  // its first system in the batch, set when the batch runs
};

struct Batcher::Batch {
  Key key;
  std::vector<Member*> members;
  int64_t systems = 0, bytes = 0;
  enum class State { kForming, kRunning, kDone } state = State::kForming;
  Steady::time_point created = Steady::now();
  std::condition_variable cv;
  absl::Status status;
  JobResult result;  // the whole batch's (a lone member's own)
  int64_t total_systems = 0;
};

Batcher::Batcher(BatchOptions options, Run run, Metrics* metrics)
    : options_(options), run_(std::move(run)), metrics_(metrics) {}

Batcher::~Batcher() = default;

bool Batcher::Eligible(const Job& job) const {
  if (options_.max_systems <= 1 || job.shared_matrix || job.variable || job.unified)
    return false;
  if (job.descriptor().iterative) return false;
  if (job.layout != Layout::kFlat && job.batch != 1) return false;
  return job.batch <= options_.max_systems && job.total_bytes() <= options_.max_bytes;
}

Batcher::Key Batcher::KeyOf(const Job& job) {
  uint64_t structure = 0;
  // Systems that share one tree are batched only with systems of the same tree.
  if (const JobArray* p = SharedParent(job)) structure = Fnv1a(p->data, p->expected_bytes);
  return Key{int(job.family), int(job.precision), job.n, int(job.method), job.parent_per_system,
             structure};
}

bool Batcher::Fits(const Batch& b, const Job& job) const {
  if (b.systems + job.batch > options_.max_systems ||
      b.bytes + job.total_bytes() > options_.max_bytes)
    return false;
  const JobArray* mine = SharedParent(job);
  if (mine != nullptr && !b.members.empty()) {
    const JobArray& theirs = *SharedParent(*b.members.front()->job);
    return std::memcmp(mine->data, theirs.data, size_t(mine->expected_bytes)) == 0;
  }
  return true;
}

void Batcher::Execute(Batch& b) {
  // The batch stops early only when every member has gone.
  SolveControl control;
  control.cancelled = [&b] {
    for (const Member* m : b.members)
      if (!m->cancelled || !m->cancelled()) return false;
    return true;
  };
  const Job& first = *b.members.front()->job;
  int64_t systems = 0;
  for (Member* m : b.members) {
    m->first = systems;
    systems += m->job->batch;
  }
  b.total_systems = systems;
  if (metrics_ != nullptr)
    metrics_->ObserveBatch(std::string(FamilyName(first.family)), int(b.members.size()), systems);
  if (b.members.size() == 1) {
    auto r = run_(first, control);
    if (r.ok()) b.result = *std::move(r);
    b.status = r.status();
    return;
  }
  // One job of every member's systems, one after the other (flat), its arrays copied in.
  Job all;
  all.family = first.family;
  all.precision = first.precision;
  all.layout = Layout::kFlat;
  all.method = first.method;
  all.batch = systems;
  all.n = first.n;
  all.parent_per_system = first.parent_per_system;
  all.skip_residual = true;  // each member's own, from its own arrays
  const JobArray* shared_parent = SharedParent(first);
  for (size_t slot = 0; slot < first.arrays.size(); ++slot) {
    const JobArray& a0 = first.arrays[slot];
    if (!a0.declared) continue;
    JobArray& ja = all.arrays[slot];
    ja.declared = true;
    ja.elem_bytes = a0.elem_bytes;
    if (&a0 == shared_parent) {
      ja.shape = a0.shape;
      ja.elements = a0.elements;
      ja.expected_bytes = ja.received = a0.expected_bytes;
      ja.data = a0.data;
      continue;
    }
    const int64_t per = a0.elements / first.batch;  // values a system
    ja.shape = {systems, per};
    ja.elements = systems * per;
    ja.expected_bytes = ja.elements * a0.elem_bytes;
    ja.owned.reset(new (std::nothrow) std::byte[size_t(ja.expected_bytes)]);
    if (!ja.owned) {
      b.status = absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", ja.expected_bytes, " bytes for a batch of ",
                       b.members.size(), " requests"));
      return;
    }
    for (const Member* m : b.members) {
      const JobArray& src = m->job->arrays[slot];
      std::memcpy(ja.owned.get() + m->first * per * a0.elem_bytes, src.data,
                  size_t(src.expected_bytes));
    }
    ja.data = ja.owned.get();
    ja.received = ja.expected_bytes;
  }
  auto r = run_(all, control);
  if (r.ok()) b.result = *std::move(r);
  b.status = r.status();
}

absl::StatusOr<JobResult> Batcher::Extract(const Batch& b, const Member& m) const {
  if (!b.status.ok()) return b.status;
  const Job& job = *m.job;
  JobResult r;
  const int64_t eb = job.precision == Precision::kFloat64 ? 8 : 4;
  const int64_t len = job.batch * job.n * eb;
  const std::byte* src = reinterpret_cast<const std::byte*>(b.result.x.data()) + m.first * job.n * eb;
  const void* x = src;
  if (job.x_out != nullptr) {
    std::memcpy(job.x_out, src, size_t(len));
    x = job.x_out;
  } else {
    r.x.assign(reinterpret_cast<const char*>(src), size_t(len));
    x = r.x.data();
  }
  r.status.assign(b.result.status.begin() + m.first,
                  b.result.status.begin() + m.first + job.batch);
  r.info = b.result.info;
  r.compute_us = b.result.compute_us;
  r.batched_with = int(b.members.size());
  r.batch_systems = b.total_systems;
  r.backward_error = std::numeric_limits<double>::quiet_NaN();
  if (!job.skip_residual) {
    const auto t0 = Steady::now();
    r.backward_error = JobBackwardError(job, x, r.status.data());
    r.residual_us = std::chrono::duration<double, std::micro>(Steady::now() - t0).count();
  }
  return r;
}

absl::StatusOr<JobResult> Batcher::Solve(const Job& job,
                                         std::chrono::system_clock::time_point deadline,
                                         const std::function<bool()>& cancelled) {
  Member me;
  me.job = &job;
  me.cancelled = cancelled;
  const Key key = KeyOf(job);
  const auto window = std::chrono::duration_cast<Steady::duration>(
      std::chrono::duration<double, std::micro>(std::max(0.0, options_.window_us)));
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Batch> b;
  {
    Lane& lane = lanes_[key];
    if (!lane.forming.empty() && Fits(*lane.forming.back(), job)) {
      b = lane.forming.back();
    } else {
      b = std::make_shared<Batch>();
      b->key = key;
      lane.forming.push_back(b);
    }
  }
  b->members.push_back(&me);
  b->systems += job.batch;
  b->bytes += job.total_bytes();
  // A batch waiting out its window runs once full. (Not every join: the members would all be
  // woken once a join, a batch of N costing N^2 wake-ups.)
  if (b->systems >= options_.max_systems || b->bytes >= options_.max_bytes) b->cv.notify_all();
  while (b->state != Batch::State::kDone) {
    auto now = Steady::now();
    auto wake = now + kPoll;
    if (b->state == Batch::State::kForming) {
      Lane& lane = lanes_.at(key);
      if (lane.forming.front() == b && lane.running < options_.max_in_flight) {
        // With nothing of its kind running and no company, a request runs at once; otherwise
        // the batch may wait out the window for more, unless it is full.
        const bool company = lane.running > 0 || b->members.size() > 1;
        const auto ready = b->created + window;
        const bool full = b->systems >= options_.max_systems || b->bytes >= options_.max_bytes;
        if (window.count() == 0 || !company || full || now >= ready) {
          b->state = Batch::State::kRunning;
          lane.forming.pop_front();
          ++lane.running;
          lock.unlock();
          Execute(*b);
          lock.lock();
          Lane& after = lanes_.at(key);
          --after.running;
          b->state = Batch::State::kDone;
          b->cv.notify_all();
          if (!after.forming.empty())
            after.forming.front()->cv.notify_all();
          else if (after.running == 0)
            lanes_.erase(key);
          break;
        }
        wake = std::min(wake, ready);
      }
      if (cancelled && cancelled()) {
        // Leaves the batch while it forms; once it runs, the member stays (its arrays are read).
        b->members.erase(std::find(b->members.begin(), b->members.end(), &me));
        b->systems -= job.batch;
        b->bytes -= job.total_bytes();
        if (b->members.empty()) {
          lane.forming.erase(std::find(lane.forming.begin(), lane.forming.end(), b));
          if (!lane.forming.empty())
            lane.forming.front()->cv.notify_all();
          else if (lane.running == 0)
            lanes_.erase(key);
        }
        if (std::chrono::system_clock::now() + Admission::kDeadlineSkew >= deadline)
          return absl::DeadlineExceededError(
              "the deadline passed while the job waited for its batch");
        return absl::CancelledError("the call was cancelled while the job waited for its batch");
      }
    }
    const auto to_deadline = deadline - std::chrono::system_clock::now();
    if (to_deadline < wake - now)
      wake = now + std::chrono::duration_cast<Steady::duration>(
                       std::max(to_deadline, decltype(to_deadline)::zero()));
    b->cv.wait_until(lock, wake);
  }
  lock.unlock();
  if (b->members.size() == 1) {
    if (!b->status.ok()) return b->status;
    JobResult r = std::move(b->result);
    r.batched_with = 1;
    r.batch_systems = b->total_systems;
    return r;
  }
  return Extract(*b, me);
}

}  // namespace trisolve::server
