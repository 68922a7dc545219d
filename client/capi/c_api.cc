// libtrisolve: the C API (include/trisolve/trisolve.h) over libtrisolve_client.
//
// Every family goes through one description of its arrays (Geometry below): the public entry
// points only name the family, the element type and the caller's pointers, so the checks, the
// shapes sent and the layout conversions are written once.
#include "trisolve/trisolve.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "trisolve/client.h"

namespace {

using trisolve::DType;
using trisolve::Kind;

// The arrays of one family at one size: what each is called, its shape on the wire, and
// whether the caller's layout has to be rearranged first (dense column-major matrices).
struct Geometry {
  Kind kind = Kind::kTridiagonal;
  DType dtype = DType::kFloat64;
  int64_t n = 0, batch = 1;    // block: n = N block rows, batch = M unknowns a block row
  int layout = TRISOLVE_FLAT;  // tridiagonal and tree: FLAT / INTERLEAVED; dense: ROW / COL_MAJOR
  int64_t parent_systems = 1;  // tree: 1 (one morphology) or batch (one per system)
  // Systems (tree cells) of different sizes: batch of them, n their total, every array [n].
  bool variable = false;

  // One right-hand side (and one x).
  std::vector<int64_t> RhsShape() const {
    if (variable) return {n};
    switch (kind) {
      case Kind::kTridiagonal:
      case Kind::kTree:
        return layout == TRISOLVE_INTERLEAVED ? std::vector<int64_t>{n, batch}
                                              : std::vector<int64_t>{batch, n};
      case Kind::kBlockTridiagonal: return {n, batch};
      case Kind::kDense: return {batch, n};
    }
    return {};
  }
  std::vector<int64_t> Shape(const std::string& name) const {
    if (name == "lengths") return {batch};
    if (kind == Kind::kTree && name == "parent") {
      if (variable) return {n};
      return parent_systems == 1 ? std::vector<int64_t>{n} : std::vector<int64_t>{batch, n};
    }
    if (kind == Kind::kDense && name == "A") return {batch, n, n};
    return RhsShape();
  }
  static int64_t Elements(const std::vector<int64_t>& s) {
    int64_t e = 1;
    for (int64_t v : s) e *= v;
    return e;
  }
  // Statuses a right-hand side answers with.
  int64_t SystemsPerRhs() const { return kind == Kind::kBlockTridiagonal ? 1 : batch; }
  bool Transposed(const std::string& name) const {
    return kind == Kind::kDense && name == "A" && layout == TRISOLVE_COL_MAJOR;
  }
  const std::vector<std::string>& Coefficients() const {
    static const std::vector<std::string> tri = {"a", "b", "c"};
    static const std::vector<std::string> tree = {"lower", "upper", "diag"};
    static const std::vector<std::string> block = {"aC", "cC", "bC", "cA", "cB"};
    static const std::vector<std::string> dense = {"A"};
    switch (kind) {
      case Kind::kTridiagonal: return tri;
      case Kind::kTree: return tree;
      case Kind::kBlockTridiagonal: return block;
      case Kind::kDense: return dense;
    }
    return tri;
  }
  const char* RhsName() const {
    switch (kind) {
      case Kind::kTridiagonal: return "d";
      case Kind::kTree: return "rhs";
      case Kind::kBlockTridiagonal: return "f";
      case Kind::kDense: return "b";
    }
    return "d";
  }
};

const char* TypeName(DType t) { return t == DType::kFloat32 ? "float32" : "float64"; }

}  // namespace

struct trisolve_context {
  std::unique_ptr<trisolve::Client> client;
  double timeout_s = 0;
  trisolve_progress_fn progress = nullptr;
  void* progress_data = nullptr;
  double progress_interval_s = 0;
  bool keep_history = false;
  std::vector<trisolve::HistoryPoint> history;  // the last block solve's
  mutable std::mutex mu;
  std::string last_error;
};

struct trisolve_system {
  trisolve_context* ctx = nullptr;
  std::string handle;
  Geometry g;
  bool released = false;
  std::string method;
  double residual = 0;
  int64_t iterations = 0;
};

struct trisolve_stream {
  trisolve_system* sys = nullptr;
  std::unique_ptr<trisolve::StepStream> stream;
  std::deque<int64_t> pending;  // k of each step sent and not yet received
  // Updates staged for the next step, copied (and a dense column-major A transposed).
  std::vector<std::pair<std::string, std::vector<std::byte>>> staged;
  // The status that ended the stream, once a receive has met it (the C++ stream then has none
  // left for Finish to return).
  absl::Status ended;
};

namespace {

thread_local std::string create_error;

int Fail(trisolve_context* ctx, int code, std::string message) {
  if (ctx != nullptr) {
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->last_error = std::move(message);
  } else {
    create_error = std::move(message);
  }
  return code;
}

int FromStatus(trisolve_context* ctx, const absl::Status& s) {
  if (s.ok()) return TRISOLVE_OK;
  return Fail(ctx, static_cast<int>(s.code()), std::string(s.message()));
}

trisolve::JobOptions Options(const trisolve_context* ctx) {
  trisolve::JobOptions o;
  if (ctx->timeout_s > 0) o.timeout_s = ctx->timeout_s;
  if (ctx->progress != nullptr) {
    o.progress = [fn = ctx->progress, data = ctx->progress_data](const trisolve::Progress& p) {
      const int phase = p.phase == "received" ? TRISOLVE_PHASE_RECEIVED
                        : p.phase == "queued"  ? TRISOLVE_PHASE_QUEUED
                        : p.phase == "solving" ? TRISOLVE_PHASE_SOLVING
                                               : TRISOLVE_PHASE_SENDING;
      fn(data, phase, p.iteration, p.max_iterations, p.residual, p.bytes_total, p.elapsed_s);
    };
    o.progress_interval_s = ctx->progress_interval_s;
  }
  return o;
}

// Copies the statuses out; TRISOLVE_NOT_SOLVED when one is not OK.
int Statuses(trisolve_context* ctx, const trisolve::Result& r, int64_t expected, int* out) {
  if (static_cast<int64_t>(r.status.size()) != expected) {
    return Fail(ctx, TRISOLVE_INTERNAL,
                "the server answered " + std::to_string(r.status.size()) + " statuses, expected " +
                    std::to_string(expected));
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < expected; ++i) {
    const int s = static_cast<int>(r.status[i]);
    if (out != nullptr) out[i] = s;
    if (s != TRISOLVE_SYSTEM_OK) ++bad;
  }
  if (bad > 0) {
    return Fail(ctx, TRISOLVE_NOT_SOLVED,
                std::to_string(bad) + " of " + std::to_string(expected) +
                    " systems not solved (" + r.summary.method + "); see status_out");
  }
  return TRISOLVE_OK;
}

bool Positive(int64_t v) { return v > 0; }

// The sizes and layout of a family's call, checked before anything is read.
int CheckGeometry(trisolve_context* ctx, const Geometry& g) {
  const bool block = g.kind == Kind::kBlockTridiagonal;
  if (!Positive(g.n) || !Positive(g.batch)) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                std::string(block ? "N and M" : "n and batch") + " must be positive (" +
                    std::to_string(g.n) + ", " + std::to_string(g.batch) + ")");
  }
  // The largest array (dense A: batch * n * n) must be countable in int64 bytes.
  const int64_t limit = INT64_MAX / 8;
  if (g.variable) {
    if (g.batch > g.n)
      return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                  std::to_string(g.batch) + " systems of at least one row each need total >= " +
                      std::to_string(g.batch) + ", not " + std::to_string(g.n));
    return TRISOLVE_OK;  // flat; the lengths' values are the server's to check
  }
  if (g.n > limit / g.batch || (g.kind == Kind::kDense && g.n * g.batch > limit / g.n)) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "the arrays' sizes overflow int64");
  }
  switch (g.kind) {
    case Kind::kTridiagonal:
    case Kind::kTree:
      if (g.layout != TRISOLVE_FLAT && g.layout != TRISOLVE_INTERLEAVED) {
        return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                    "layout must be TRISOLVE_FLAT (0) or TRISOLVE_INTERLEAVED (1), not " +
                        std::to_string(g.layout));
      }
      break;
    case Kind::kDense:
      if (g.layout != TRISOLVE_ROW_MAJOR && g.layout != TRISOLVE_COL_MAJOR) {
        return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                    "layout must be TRISOLVE_ROW_MAJOR (2) or TRISOLVE_COL_MAJOR (3), not " +
                        std::to_string(g.layout));
      }
      break;
    case Kind::kBlockTridiagonal: break;
  }
  if (g.kind == Kind::kTree && g.parent_systems != 1 && g.parent_systems != g.batch) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                "parent_systems must be 1 (one tree for the batch) or batch (" +
                    std::to_string(g.batch) + "), not " + std::to_string(g.parent_systems));
  }
  return TRISOLVE_OK;
}

// Column-major n x n matrices (Fortran A(n, n, batch)) to the row-major ones the server takes.
std::vector<std::byte> Transpose(const void* src, int64_t n, int64_t batch, DType t) {
  const size_t es = t == DType::kFloat32 ? 4 : 8;
  std::vector<std::byte> out(static_cast<size_t>(n * n * batch) * es);
  const auto* in = static_cast<const std::byte*>(src);
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t o = s * n * n;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(out.data() + (o + i * n + j) * es, in + (o + j * n + i) * es, es);
      }
    }
  }
  return out;
}

// A job's arrays as the server takes them, and the buffers that rearranged ones live in.
struct Arrays {
  std::map<std::string, trisolve::ArrayView> views;
  std::deque<std::vector<std::byte>> owned;

  void Add(const Geometry& g, const std::string& name, const void* p) {
    const DType t = name == "parent" || name == "lengths" ? DType::kInt32 : g.dtype;
    if (g.Transposed(name)) {
      owned.push_back(Transpose(p, g.n, g.batch, g.dtype));
      p = owned.back().data();
    }
    views[name] = trisolve::ArrayView{t, g.Shape(name), p};
  }
};

// Checks the pointers (NULL names the array) and fills the views.
int Collect(trisolve_context* ctx, const Geometry& g,
            const std::vector<std::pair<std::string, const void*>>& given, Arrays* arrays) {
  for (const auto& [name, p] : given) {
    if (p == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, name + " is NULL");
  }
  for (const auto& [name, p] : given) arrays->Add(g, name, p);
  return TRISOLVE_OK;
}

// The coefficient arrays in the family's order, with the tree's parent first.
std::vector<std::pair<std::string, const void*>> Named(const Geometry& g,
                                                       std::initializer_list<const void*> ptrs) {
  std::vector<std::pair<std::string, const void*>> out;
  auto it = ptrs.begin();
  if (g.kind == Kind::kTree) out.emplace_back("parent", *it++);
  for (const auto& name : g.Coefficients()) out.emplace_back(name, *it++);
  return out;
}

// x from a Result written into the caller's memory (x_out) is checked for shape and type.
int CheckX(trisolve_context* ctx, const trisolve::Result& r, DType t, int64_t elements) {
  if (r.x.dtype != t || r.x.elements() != elements) {
    return Fail(ctx, TRISOLVE_INTERNAL, "the server's x has an unexpected type or size");
  }
  return TRISOLVE_OK;
}

void SetIterative(trisolve::JobOptions* o, double tol, int64_t max_iterations) {
  if (tol >= 0) o->tol = tol;
  if (max_iterations > 0) o->max_iterations = max_iterations;
}

// One-shot solve of a family: coefficients and right-hand side in, x and statuses out.
int SolveOnce(trisolve_context* ctx, const Geometry& g, std::initializer_list<const void*> coef,
              const void* rhs, void* x, int* status_out, double tol = -1,
              int64_t max_iterations = 0) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  if (int rc = CheckGeometry(ctx, g); rc != TRISOLVE_OK) return rc;
  auto named = Named(g, coef);
  named.emplace_back(g.RhsName(), rhs);
  Arrays arrays;
  if (int rc = Collect(ctx, g, named, &arrays); rc != TRISOLVE_OK) return rc;
  if (x == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "x is NULL");
  trisolve::Job job{g.kind};
  job.arrays = std::move(arrays.views);
  job.options = Options(ctx);
  job.options.interleaved = g.layout == TRISOLVE_INTERLEAVED;
  SetIterative(&job.options, tol, max_iterations);
  job.options.x_out = x;
  const bool block = g.kind == Kind::kBlockTridiagonal;
  if (block) {
    ctx->history.clear();
    job.options.residual_history = ctx->keep_history;
  }
  auto r = ctx->client->Solve(job);
  if (!r.ok()) return FromStatus(ctx, r.status());
  if (block) ctx->history = r->summary.residual_history;
  if (int rc = CheckX(ctx, *r, g.dtype, Geometry::Elements(g.RhsShape())); rc != TRISOLVE_OK)
    return rc;
  return Statuses(ctx, *r, g.SystemsPerRhs(), status_out);
}

// (lengths: a variable-size batch's, g.variable.)
int CreateSystem(trisolve_context* ctx, const Geometry& g, std::initializer_list<const void*> coef,
                 trisolve_system** out, double tol = -1, int64_t max_iterations = 0,
                 const int32_t* lengths = nullptr) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  if (out == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (int rc = CheckGeometry(ctx, g); rc != TRISOLVE_OK) return rc;
  auto named = Named(g, coef);
  if (g.variable) named.emplace_back("lengths", lengths);
  Arrays arrays;
  if (int rc = Collect(ctx, g, named, &arrays); rc != TRISOLVE_OK) return rc;
  trisolve::Job job{g.kind};
  job.arrays = std::move(arrays.views);
  job.options = Options(ctx);
  job.options.interleaved = g.layout == TRISOLVE_INTERLEAVED;
  SetIterative(&job.options, tol, max_iterations);
  auto info = ctx->client->CreateSystem(job);
  if (!info.ok()) return FromStatus(ctx, info.status());
  auto* sys = new (std::nothrow) trisolve_system;
  if (sys == nullptr) {
    (void)ctx->client->ReleaseSystem(info->handle, Options(ctx));
    return Fail(ctx, TRISOLVE_RESOURCE_EXHAUSTED, "out of memory");
  }
  sys->ctx = ctx;
  sys->handle = info->handle;
  sys->method = info->method;
  sys->g = g;
  *out = sys;
  return TRISOLVE_OK;
}

int CheckType(trisolve_context* ctx, const trisolve_system* sys, DType t, const char* call) {
  if (sys->g.dtype == t) return TRISOLVE_OK;
  return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
              std::string("the system is ") + TypeName(sys->g.dtype) + " and " + call +
                  " takes " + TypeName(t) + ": use " + call +
                  (t == DType::kFloat64 ? "_f32" : " without _f32"));
}

// The right-hand side view of k right-hand sides of a system.
trisolve::ArrayView RhsView(const Geometry& g, int64_t k, const void* rhs) {
  std::vector<int64_t> shape = g.RhsShape();
  if (k > 1) shape.insert(shape.begin(), k);
  return trisolve::ArrayView{g.dtype, shape, rhs};
}

int SystemSolve(trisolve_system* sys, DType t, const void* rhs, int64_t k, void* x,
                int* status_out, const char* call) {
  if (sys == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "sys is NULL");
  trisolve_context* ctx = sys->ctx;
  if (int rc = CheckType(ctx, sys, t, call); rc != TRISOLVE_OK) return rc;
  if (!Positive(k)) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "k must be positive");
  if (rhs == nullptr || x == nullptr) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "rhs and x must not be NULL");
  }
  const trisolve::ArrayView view = RhsView(sys->g, k, rhs);
  trisolve::JobOptions o = Options(ctx);
  // x may be rhs itself: the client has sent rhs before it writes x.
  o.x_out = x;
  auto r = ctx->client->SolveSystem(sys->handle, view, {}, o);
  if (!r.ok()) return FromStatus(ctx, r.status());
  if (int rc = CheckX(ctx, *r, t, view.elements()); rc != TRISOLVE_OK) return rc;
  sys->residual = r->summary.residual;
  sys->iterations = r->summary.iterations;
  sys->method = r->summary.method;
  return Statuses(ctx, *r, k * sys->g.SystemsPerRhs(), status_out);
}

// A coefficient array's name for this system, or the error naming the ones it has.
int CheckName(trisolve_context* ctx, const Geometry& g, const char* name) {
  if (name == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "name is NULL");
  for (const auto& c : g.Coefficients()) {
    if (c == name) return TRISOLVE_OK;
  }
  std::string names;
  for (const auto& c : g.Coefficients()) names += (names.empty() ? "" : ", ") + c;
  // The caller's string is bounded before it is quoted back.
  return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
              "unknown coefficient array '" + std::string(name).substr(0, 32) + "' (this " +
                  std::string(trisolve::KindName(g.kind)) + " system has " + names + ")");
}

int SystemUpdate(trisolve_system* sys, DType t, const char* name, const void* values,
                 const char* call) {
  if (sys == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "sys is NULL");
  trisolve_context* ctx = sys->ctx;
  if (int rc = CheckType(ctx, sys, t, call); rc != TRISOLVE_OK) return rc;
  if (int rc = CheckName(ctx, sys->g, name); rc != TRISOLVE_OK) return rc;
  Arrays arrays;
  if (int rc = Collect(ctx, sys->g, {{name, values}}, &arrays); rc != TRISOLVE_OK) return rc;
  auto info = ctx->client->UpdateSystem(sys->handle, arrays.views, Options(ctx));
  return FromStatus(ctx, info.status());
}

int StreamUpdate(trisolve_stream* st, DType t, const char* name, const void* values,
                 const char* call) {
  if (st == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "stream is NULL");
  trisolve_system* sys = st->sys;
  trisolve_context* ctx = sys->ctx;
  if (int rc = CheckType(ctx, sys, t, call); rc != TRISOLVE_OK) return rc;
  if (int rc = CheckName(ctx, sys->g, name); rc != TRISOLVE_OK) return rc;
  if (values == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "values is NULL");
  const Geometry& g = sys->g;
  std::vector<std::byte> copy;
  if (g.Transposed(name)) {
    copy = Transpose(values, g.n, g.batch, g.dtype);
  } else {
    const auto* p = static_cast<const std::byte*>(values);
    copy.assign(p, p + Geometry::Elements(g.Shape(name)) * (t == DType::kFloat32 ? 4 : 8));
  }
  for (auto& [staged_name, bytes] : st->staged) {
    if (staged_name == name) {
      bytes = std::move(copy);
      return TRISOLVE_OK;
    }
  }
  st->staged.emplace_back(name, std::move(copy));
  return TRISOLVE_OK;
}

int StreamSend(trisolve_stream* st, DType t, const void* rhs, int64_t k, const char* call) {
  if (st == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "stream is NULL");
  trisolve_system* sys = st->sys;
  trisolve_context* ctx = sys->ctx;
  if (int rc = CheckType(ctx, sys, t, call); rc != TRISOLVE_OK) return rc;
  if (!Positive(k)) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "k must be positive");
  if (rhs == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "rhs is NULL");
  trisolve::Updates updates;
  for (const auto& [name, bytes] : st->staged) {
    updates[name] = trisolve::ArrayView{sys->g.dtype, sys->g.Shape(name), bytes.data()};
  }
  const absl::Status s = st->stream->Send(RhsView(sys->g, k, rhs), updates);
  st->staged.clear();
  if (!s.ok()) return FromStatus(ctx, s);
  st->pending.push_back(k);
  return TRISOLVE_OK;
}

int StreamReceive(trisolve_stream* st, DType t, void* x, int* status_out, const char* call) {
  if (st == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "stream is NULL");
  trisolve_system* sys = st->sys;
  trisolve_context* ctx = sys->ctx;
  if (int rc = CheckType(ctx, sys, t, call); rc != TRISOLVE_OK) return rc;
  if (x == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "x is NULL");
  if (st->pending.empty()) {
    return Fail(ctx, TRISOLVE_FAILED_PRECONDITION, "no step is waiting for its answer");
  }
  const int64_t k = st->pending.front();
  st->pending.pop_front();
  auto r = st->stream->Receive();
  if (!r.ok()) {
    st->ended = r.status();
    return FromStatus(ctx, r.status());
  }
  const int64_t elements = k * Geometry::Elements(sys->g.RhsShape());
  if (int rc = CheckX(ctx, *r, t, elements); rc != TRISOLVE_OK) return rc;
  std::memcpy(x, r->x.data.data(), r->x.data.size());
  sys->residual = r->summary.residual;
  sys->iterations = r->summary.iterations;
  sys->method = r->summary.method;
  return Statuses(ctx, *r, k * sys->g.SystemsPerRhs(), status_out);
}

template <typename T>
int Gtsv(trisolve_context* ctx, int64_t m, const T* dl, const T* d, const T* du, T* x,
         int64_t batch, int64_t stride, int* status_out, DType dtype) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  if (!Positive(m) || !Positive(batch)) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                "m and batch must be positive (m = " + std::to_string(m) +
                    ", batch = " + std::to_string(batch) + ")");
  }
  if (stride < m) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                "batch_stride (" + std::to_string(stride) + ") must be >= m (" +
                    std::to_string(m) + ")");
  }
  if (dl == nullptr || d == nullptr || du == nullptr || x == nullptr) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "dl, d, du and x must not be NULL");
  }
  if (m > INT64_MAX / 8 / batch) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "m * batch overflows");
  const int64_t total = m * batch;
  // Gathered contiguously (flat layout), with dl[0] and du[m-1] set to 0: cuSPARSE leaves them
  // unread, and the server rejects NaN or Inf anywhere.
  std::vector<T> a(total), b(total), c(total), rhs(total);
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t from = s * stride, to = s * m;
    std::memcpy(a.data() + to, dl + from, sizeof(T) * m);
    std::memcpy(b.data() + to, d + from, sizeof(T) * m);
    std::memcpy(c.data() + to, du + from, sizeof(T) * m);
    std::memcpy(rhs.data() + to, x + from, sizeof(T) * m);
    a[to] = T(0);
    c[to + m - 1] = T(0);
  }
  const std::vector<int64_t> shape{batch, m};
  trisolve::Job job{Kind::kTridiagonal};
  job.arrays = {{"a", {dtype, shape, a.data()}},
                {"b", {dtype, shape, b.data()}},
                {"c", {dtype, shape, c.data()}},
                {"d", {dtype, shape, rhs.data()}}};
  job.options = Options(ctx);
  auto r = ctx->client->Solve(job);
  if (!r.ok()) return FromStatus(ctx, r.status());
  if (int rc = CheckX(ctx, *r, dtype, total); rc != TRISOLVE_OK) return rc;
  const T* sol = r->x.template as<T>();
  for (int64_t s = 0; s < batch; ++s) std::memcpy(x + s * stride, sol + s * m, sizeof(T) * m);
  return Statuses(ctx, *r, batch, status_out);
}

Geometry Tri(DType t, int64_t n, int64_t batch, int layout) {
  Geometry g;
  g.kind = Kind::kTridiagonal;
  g.dtype = t;
  g.n = n;
  g.batch = batch;
  g.layout = layout;
  return g;
}

Geometry Tree(DType t, int64_t n, int64_t batch, int64_t parent_systems, int layout) {
  Geometry g = Tri(t, n, batch, layout);
  g.kind = Kind::kTree;
  g.parent_systems = parent_systems;
  return g;
}

// `systems` tridiagonal systems (tree cells) of different sizes, `total` rows in all.
Geometry Variable(Kind kind, DType t, int64_t systems, int64_t total) {
  Geometry g = Tri(t, total, systems, TRISOLVE_FLAT);
  g.kind = kind;
  g.variable = true;
  return g;
}

Geometry Block(DType t, int64_t N, int64_t M) {
  Geometry g = Tri(t, N, M, TRISOLVE_FLAT);
  g.kind = Kind::kBlockTridiagonal;
  return g;
}

Geometry Dense(DType t, int64_t n, int64_t batch, int layout) {
  Geometry g = Tri(t, n, batch, layout);
  g.kind = Kind::kDense;
  return g;
}

constexpr DType F64 = DType::kFloat64;
constexpr DType F32 = DType::kFloat32;

}  // namespace

extern "C" {

const char* trisolve_code_name(int code) {
  switch (code) {
    case TRISOLVE_OK: return "OK";
    case TRISOLVE_CANCELLED: return "CANCELLED";
    case TRISOLVE_UNKNOWN: return "UNKNOWN";
    case TRISOLVE_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case TRISOLVE_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case TRISOLVE_NOT_FOUND: return "NOT_FOUND";
    case TRISOLVE_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case TRISOLVE_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case TRISOLVE_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case TRISOLVE_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case TRISOLVE_ABORTED: return "ABORTED";
    case TRISOLVE_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case TRISOLVE_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case TRISOLVE_INTERNAL: return "INTERNAL";
    case TRISOLVE_UNAVAILABLE: return "UNAVAILABLE";
    case TRISOLVE_DATA_LOSS: return "DATA_LOSS";
    case TRISOLVE_UNAUTHENTICATED: return "UNAUTHENTICATED";
    case TRISOLVE_NOT_SOLVED: return "NOT_SOLVED";
    default: return "UNKNOWN_CODE";
  }
}

int trisolve_create(const char* target, const char* token, trisolve_context** out) {
  if (out == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  trisolve::Client::Options o;
  if (target != nullptr && *target != '\0') {
    o.target = target;
  } else if (const char* env = std::getenv("TRISOLVE_SERVER"); env != nullptr && *env != '\0') {
    o.target = env;
  }
  if (token != nullptr) o.token = token;
  // How arrays travel (auto, ring, shm, streams, grpc): the C++ client's choice unless set.
  if (const char* env = std::getenv("TRISOLVE_TRANSPORT"); env != nullptr && *env != '\0') {
    auto t = trisolve::ParseTransport(env);
    if (!t.ok()) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT,
                             std::string("TRISOLVE_TRANSPORT: ") + std::string(t.status().message()));
    o.transport = *t;
  }
  auto client = trisolve::Client::Create(std::move(o));
  if (!client.ok()) return FromStatus(nullptr, client.status());
  auto* ctx = new (std::nothrow) trisolve_context;
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_RESOURCE_EXHAUSTED, "out of memory");
  ctx->client = std::move(*client);
  *out = ctx;
  return TRISOLVE_OK;
}

void trisolve_destroy(trisolve_context* ctx) { delete ctx; }

const char* trisolve_last_error(const trisolve_context* ctx) {
  if (ctx == nullptr) return create_error.c_str();
  std::lock_guard<std::mutex> lock(ctx->mu);
  return ctx->last_error.c_str();
}

int trisolve_set_timeout(trisolve_context* ctx, double seconds) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  if (!(seconds >= 0)) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "timeout must be >= 0");
  ctx->timeout_s = seconds;
  return TRISOLVE_OK;
}

int trisolve_set_progress(trisolve_context* ctx, trisolve_progress_fn fn, void* user_data,
                          double interval_s) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  if (!(interval_s == 0 || (interval_s >= 0.01 && interval_s <= 3600)))
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                "interval_s must be 0 (0.1 s) or 0.01 .. 3600 seconds");
  ctx->progress = fn;
  ctx->progress_data = user_data;
  ctx->progress_interval_s = interval_s;
  return TRISOLVE_OK;
}

int trisolve_set_residual_history(trisolve_context* ctx, int on) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  ctx->keep_history = on != 0;
  return TRISOLVE_OK;
}

int64_t trisolve_residual_history(const trisolve_context* ctx, int64_t* iterations,
                                  double* residuals, int64_t capacity) {
  if (ctx == nullptr) return -1;
  const int64_t n = static_cast<int64_t>(ctx->history.size());
  for (int64_t i = 0; i < std::min(n, capacity); ++i) {
    if (iterations != nullptr) iterations[i] = ctx->history[size_t(i)].iteration;
    if (residuals != nullptr) residuals[i] = ctx->history[size_t(i)].residual;
  }
  return n;
}

int trisolve_gtsv_strided_batch(trisolve_context* ctx, int64_t m, const double* dl,
                                const double* d, const double* du, double* x, int64_t batch,
                                int64_t batch_stride, int* status_out) {
  return Gtsv<double>(ctx, m, dl, d, du, x, batch, batch_stride, status_out, F64);
}

int trisolve_sgtsv_strided_batch(trisolve_context* ctx, int64_t m, const float* dl,
                                 const float* d, const float* du, float* x, int64_t batch,
                                 int64_t batch_stride, int* status_out) {
  return Gtsv<float>(ctx, m, dl, d, du, x, batch, batch_stride, status_out, F32);
}

// ---- One-shot solves ----

int trisolve_solve_tridiagonal(trisolve_context* ctx, int64_t n, int64_t batch, const double* a,
                               const double* b, const double* c, const double* d, double* x,
                               int layout, int* status_out) {
  return SolveOnce(ctx, Tri(F64, n, batch, layout), {a, b, c}, d, x, status_out);
}
int trisolve_solve_tridiagonal_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                   const float* a, const float* b, const float* c,
                                   const float* d, float* x, int layout, int* status_out) {
  return SolveOnce(ctx, Tri(F32, n, batch, layout), {a, b, c}, d, x, status_out);
}

int trisolve_solve_tree(trisolve_context* ctx, int64_t n, int64_t batch, const int32_t* parent,
                        int64_t parent_systems, const double* lower, const double* upper,
                        const double* diag, const double* rhs, double* x, int layout,
                        int* status_out) {
  return SolveOnce(ctx, Tree(F64, n, batch, parent_systems, layout), {parent, lower, upper, diag},
                   rhs, x, status_out);
}
int trisolve_solve_tree_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                            const int32_t* parent, int64_t parent_systems, const float* lower,
                            const float* upper, const float* diag, const float* rhs, float* x,
                            int layout, int* status_out) {
  return SolveOnce(ctx, Tree(F32, n, batch, parent_systems, layout), {parent, lower, upper, diag},
                   rhs, x, status_out);
}

int trisolve_solve_block(trisolve_context* ctx, int64_t N, int64_t M, const double* aC,
                         const double* cC, const double* bC, const double* cA, const double* cB,
                         const double* f, double* y, double tol, int64_t max_iterations,
                         int* status_out) {
  return SolveOnce(ctx, Block(F64, N, M), {aC, cC, bC, cA, cB}, f, y, status_out, tol,
                   max_iterations);
}
int trisolve_solve_block_f32(trisolve_context* ctx, int64_t N, int64_t M, const float* aC,
                             const float* cC, const float* bC, const float* cA, const float* cB,
                             const float* f, float* y, double tol, int64_t max_iterations,
                             int* status_out) {
  return SolveOnce(ctx, Block(F32, N, M), {aC, cC, bC, cA, cB}, f, y, status_out, tol,
                   max_iterations);
}

int trisolve_solve_dense(trisolve_context* ctx, int64_t n, int64_t batch, const double* A,
                         const double* b, double* x, int layout, int* status_out) {
  return SolveOnce(ctx, Dense(F64, n, batch, layout), {A}, b, x, status_out);
}
int trisolve_solve_dense_f32(trisolve_context* ctx, int64_t n, int64_t batch, const float* A,
                             const float* b, float* x, int layout, int* status_out) {
  return SolveOnce(ctx, Dense(F32, n, batch, layout), {A}, b, x, status_out);
}

// ---- Persistent systems ----

int trisolve_system_create_tridiagonal(trisolve_context* ctx, int64_t n, int64_t batch,
                                       const double* a, const double* b, const double* c,
                                       int layout, trisolve_system** out) {
  return CreateSystem(ctx, Tri(F64, n, batch, layout), {a, b, c}, out);
}
int trisolve_system_create_tridiagonal_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                           const float* a, const float* b, const float* c,
                                           int layout, trisolve_system** out) {
  return CreateSystem(ctx, Tri(F32, n, batch, layout), {a, b, c}, out);
}

int trisolve_system_create_tree(trisolve_context* ctx, int64_t n, int64_t batch,
                                const int32_t* parent, int64_t parent_systems,
                                const double* lower, const double* upper, const double* diag,
                                int layout, trisolve_system** out) {
  return CreateSystem(ctx, Tree(F64, n, batch, parent_systems, layout),
                      {parent, lower, upper, diag}, out);
}
int trisolve_system_create_tree_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                    const int32_t* parent, int64_t parent_systems,
                                    const float* lower, const float* upper, const float* diag,
                                    int layout, trisolve_system** out) {
  return CreateSystem(ctx, Tree(F32, n, batch, parent_systems, layout),
                      {parent, lower, upper, diag}, out);
}

int trisolve_system_create_tridiagonal_variable(trisolve_context* ctx, int64_t systems,
                                                const int32_t* lengths, int64_t total,
                                                const double* a, const double* b,
                                                const double* c, trisolve_system** out) {
  return CreateSystem(ctx, Variable(Kind::kTridiagonal, F64, systems, total), {a, b, c}, out, -1,
                      0, lengths);
}
int trisolve_system_create_tridiagonal_variable_f32(trisolve_context* ctx, int64_t systems,
                                                    const int32_t* lengths, int64_t total,
                                                    const float* a, const float* b,
                                                    const float* c, trisolve_system** out) {
  return CreateSystem(ctx, Variable(Kind::kTridiagonal, F32, systems, total), {a, b, c}, out, -1,
                      0, lengths);
}
int trisolve_system_create_tree_variable(trisolve_context* ctx, int64_t cells,
                                         const int32_t* lengths, int64_t total,
                                         const int32_t* parent, const double* lower,
                                         const double* upper, const double* diag,
                                         trisolve_system** out) {
  return CreateSystem(ctx, Variable(Kind::kTree, F64, cells, total),
                      {parent, lower, upper, diag}, out, -1, 0, lengths);
}
int trisolve_system_create_tree_variable_f32(trisolve_context* ctx, int64_t cells,
                                             const int32_t* lengths, int64_t total,
                                             const int32_t* parent, const float* lower,
                                             const float* upper, const float* diag,
                                             trisolve_system** out) {
  return CreateSystem(ctx, Variable(Kind::kTree, F32, cells, total),
                      {parent, lower, upper, diag}, out, -1, 0, lengths);
}

int trisolve_system_create_block(trisolve_context* ctx, int64_t N, int64_t M, const double* aC,
                                 const double* cC, const double* bC, const double* cA,
                                 const double* cB, double tol, int64_t max_iterations,
                                 trisolve_system** out) {
  return CreateSystem(ctx, Block(F64, N, M), {aC, cC, bC, cA, cB}, out, tol, max_iterations);
}
int trisolve_system_create_block_f32(trisolve_context* ctx, int64_t N, int64_t M,
                                     const float* aC, const float* cC, const float* bC,
                                     const float* cA, const float* cB, double tol,
                                     int64_t max_iterations, trisolve_system** out) {
  return CreateSystem(ctx, Block(F32, N, M), {aC, cC, bC, cA, cB}, out, tol, max_iterations);
}

int trisolve_system_create_dense(trisolve_context* ctx, int64_t n, int64_t batch,
                                 const double* A, int layout, trisolve_system** out) {
  return CreateSystem(ctx, Dense(F64, n, batch, layout), {A}, out);
}
int trisolve_system_create_dense_f32(trisolve_context* ctx, int64_t n, int64_t batch,
                                     const float* A, int layout, trisolve_system** out) {
  return CreateSystem(ctx, Dense(F32, n, batch, layout), {A}, out);
}

int trisolve_system_solve(trisolve_system* sys, const double* rhs, int64_t k, double* x,
                          int* status_out) {
  return SystemSolve(sys, F64, rhs, k, x, status_out, "trisolve_system_solve");
}
int trisolve_system_solve_f32(trisolve_system* sys, const float* rhs, int64_t k, float* x,
                              int* status_out) {
  return SystemSolve(sys, F32, rhs, k, x, status_out, "trisolve_system_solve_f32");
}

int trisolve_system_update(trisolve_system* sys, const char* name, const double* values) {
  return SystemUpdate(sys, F64, name, values, "trisolve_system_update");
}
int trisolve_system_update_f32(trisolve_system* sys, const char* name, const float* values) {
  return SystemUpdate(sys, F32, name, values, "trisolve_system_update_f32");
}

int trisolve_system_release(trisolve_system* sys) {
  if (sys == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "sys is NULL");
  auto info = sys->ctx->client->ReleaseSystem(sys->handle, Options(sys->ctx));
  sys->released = true;  // released or gone on the server either way (NOT_FOUND)
  return FromStatus(sys->ctx, info.status());
}

void trisolve_system_destroy(trisolve_system* sys) {
  if (sys == nullptr) return;
  if (!sys->released) (void)sys->ctx->client->ReleaseSystem(sys->handle, Options(sys->ctx));
  delete sys;
}

const char* trisolve_system_handle(const trisolve_system* sys) {
  return sys == nullptr ? "" : sys->handle.c_str();
}

int trisolve_system_is_f32(const trisolve_system* sys) {
  return sys != nullptr && sys->g.dtype == F32 ? 1 : 0;
}

int trisolve_system_last_summary(const trisolve_system* sys, double* residual,
                                 int64_t* iterations, const char** method) {
  if (sys == nullptr) return TRISOLVE_INVALID_ARGUMENT;
  if (residual != nullptr) *residual = sys->residual;
  if (iterations != nullptr) *iterations = sys->iterations;
  if (method != nullptr) *method = sys->method.c_str();
  return TRISOLVE_OK;
}

// ---- The time-step stream ----

int trisolve_stream_open(trisolve_system* sys, trisolve_stream** out) {
  if (sys == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "sys is NULL");
  trisolve_context* ctx = sys->ctx;
  if (out == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  auto s = ctx->client->OpenStepStream(sys->handle, Options(ctx));
  if (!s.ok()) return FromStatus(ctx, s.status());
  auto* st = new (std::nothrow) trisolve_stream;
  if (st == nullptr) return Fail(ctx, TRISOLVE_RESOURCE_EXHAUSTED, "out of memory");
  st->sys = sys;
  st->stream = std::move(*s);
  *out = st;
  return TRISOLVE_OK;
}

int trisolve_stream_update(trisolve_stream* st, const char* name, const double* values) {
  return StreamUpdate(st, F64, name, values, "trisolve_stream_update");
}
int trisolve_stream_update_f32(trisolve_stream* st, const char* name, const float* values) {
  return StreamUpdate(st, F32, name, values, "trisolve_stream_update_f32");
}

int trisolve_stream_send(trisolve_stream* st, const double* rhs, int64_t k) {
  return StreamSend(st, F64, rhs, k, "trisolve_stream_send");
}
int trisolve_stream_send_f32(trisolve_stream* st, const float* rhs, int64_t k) {
  return StreamSend(st, F32, rhs, k, "trisolve_stream_send_f32");
}

int trisolve_stream_receive(trisolve_stream* st, double* x, int* status_out) {
  return StreamReceive(st, F64, x, status_out, "trisolve_stream_receive");
}
int trisolve_stream_receive_f32(trisolve_stream* st, float* x, int* status_out) {
  return StreamReceive(st, F32, x, status_out, "trisolve_stream_receive_f32");
}

int trisolve_stream_close(trisolve_stream* st) {
  if (st == nullptr) return TRISOLVE_OK;
  trisolve_context* ctx = st->sys->ctx;
  absl::Status s = st->stream->Finish();
  if (s.ok()) s = st->ended;
  delete st;
  return FromStatus(ctx, s);
}

}  // extern "C"
