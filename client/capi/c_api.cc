// libtrisolve: the C API (include/trisolve/trisolve.h) over libtrisolve_client.
#include "trisolve/trisolve.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "trisolve/client.h"

struct trisolve_context {
  std::unique_ptr<trisolve::Client> client;
  double timeout_s = 0;
  mutable std::mutex mu;
  std::string last_error;
};

struct trisolve_system {
  trisolve_context* ctx = nullptr;
  std::string handle;
  bool block = false;
  bool interleaved = false;
  bool released = false;
  int64_t n = 0, batch = 1;  // tridiagonal: order and batch; block: N and M
  std::string method;
  double residual = 0;
  int64_t iterations = 0;
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

template <typename T>
int Gtsv(trisolve_context* ctx, int64_t m, const T* dl, const T* d, const T* du, T* x,
         int64_t batch, int64_t stride, int* status_out, trisolve::DType dtype) {
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
  if (m > INT64_MAX / batch) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "m * batch overflows");
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
  trisolve::Job job{trisolve::Kind::kTridiagonal};
  job.arrays = {{"a", {dtype, shape, a.data()}},
                {"b", {dtype, shape, b.data()}},
                {"c", {dtype, shape, c.data()}},
                {"d", {dtype, shape, rhs.data()}}};
  job.options = Options(ctx);
  auto r = ctx->client->Solve(job);
  if (!r.ok()) return FromStatus(ctx, r.status());
  if (r->x.dtype != dtype || r->x.elements() != total) {
    return Fail(ctx, TRISOLVE_INTERNAL, "the server's x has an unexpected type or size");
  }
  const T* sol = r->x.template as<T>();
  for (int64_t s = 0; s < batch; ++s) std::memcpy(x + s * stride, sol + s * m, sizeof(T) * m);
  return Statuses(ctx, *r, batch, status_out);
}

int CreateSystem(trisolve_context* ctx, const trisolve::Job& job, trisolve_system* proto,
                 trisolve_system** out) {
  auto info = ctx->client->CreateSystem(job);
  if (!info.ok()) return FromStatus(ctx, info.status());
  auto* sys = new (std::nothrow) trisolve_system(*proto);
  if (sys == nullptr) {
    (void)ctx->client->ReleaseSystem(info->handle, Options(ctx));
    return Fail(ctx, TRISOLVE_RESOURCE_EXHAUSTED, "out of memory");
  }
  sys->ctx = ctx;
  sys->handle = info->handle;
  sys->method = info->method;
  *out = sys;
  return TRISOLVE_OK;
}

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

int trisolve_gtsv_strided_batch(trisolve_context* ctx, int64_t m, const double* dl,
                                const double* d, const double* du, double* x, int64_t batch,
                                int64_t batch_stride, int* status_out) {
  return Gtsv<double>(ctx, m, dl, d, du, x, batch, batch_stride, status_out,
                      trisolve::DType::kFloat64);
}

int trisolve_sgtsv_strided_batch(trisolve_context* ctx, int64_t m, const float* dl,
                                 const float* d, const float* du, float* x, int64_t batch,
                                 int64_t batch_stride, int* status_out) {
  return Gtsv<float>(ctx, m, dl, d, du, x, batch, batch_stride, status_out,
                     trisolve::DType::kFloat32);
}

int trisolve_system_create_tridiagonal(trisolve_context* ctx, int64_t n, int64_t batch,
                                       const double* a, const double* b, const double* c,
                                       int layout, trisolve_system** out) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  if (out == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (!Positive(n) || !Positive(batch)) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "n and batch must be positive");
  }
  if (layout != TRISOLVE_FLAT && layout != TRISOLVE_INTERLEAVED) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT,
                "layout must be TRISOLVE_FLAT (0) or TRISOLVE_INTERLEAVED (1), not " +
                    std::to_string(layout));
  }
  if (a == nullptr || b == nullptr || c == nullptr) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "a, b and c must not be NULL");
  }
  const bool inter = layout == TRISOLVE_INTERLEAVED;
  const std::vector<int64_t> shape =
      inter ? std::vector<int64_t>{n, batch} : std::vector<int64_t>{batch, n};
  const auto f64 = trisolve::DType::kFloat64;
  trisolve::Job job{trisolve::Kind::kTridiagonal};
  job.arrays = {{"a", {f64, shape, a}}, {"b", {f64, shape, b}}, {"c", {f64, shape, c}}};
  job.options = Options(ctx);
  job.options.interleaved = inter;
  trisolve_system proto;
  proto.interleaved = inter;
  proto.n = n;
  proto.batch = batch;
  return CreateSystem(ctx, job, &proto, out);
}

int trisolve_system_create_block(trisolve_context* ctx, int64_t N, int64_t M, const double* aC,
                                 const double* cC, const double* bC, const double* cA,
                                 const double* cB, double tol, int64_t max_iterations,
                                 trisolve_system** out) {
  if (ctx == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "ctx is NULL");
  if (out == nullptr) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (!Positive(N) || !Positive(M)) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "N and M must be positive");
  }
  if (aC == nullptr || cC == nullptr || bC == nullptr || cA == nullptr || cB == nullptr) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "aC, cC, bC, cA and cB must not be NULL");
  }
  const std::vector<int64_t> shape{N, M};
  const auto f64 = trisolve::DType::kFloat64;
  trisolve::Job job{trisolve::Kind::kBlockTridiagonal};
  job.arrays = {{"aC", {f64, shape, aC}}, {"cC", {f64, shape, cC}}, {"bC", {f64, shape, bC}},
                {"cA", {f64, shape, cA}}, {"cB", {f64, shape, cB}}};
  job.options = Options(ctx);
  if (tol >= 0) job.options.tol = tol;
  if (max_iterations > 0) job.options.max_iterations = max_iterations;
  trisolve_system proto;
  proto.block = true;
  proto.n = N;
  proto.batch = M;
  return CreateSystem(ctx, job, &proto, out);
}

int trisolve_system_solve(trisolve_system* sys, const double* rhs, int64_t k, double* x,
                          int* status_out) {
  if (sys == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "sys is NULL");
  trisolve_context* ctx = sys->ctx;
  if (!Positive(k)) return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "k must be positive");
  if (rhs == nullptr || x == nullptr) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "rhs and x must not be NULL");
  }
  std::vector<int64_t> shape;
  if (sys->block) {
    shape = {sys->n, sys->batch};
  } else {
    shape = sys->interleaved ? std::vector<int64_t>{sys->n, sys->batch}
                             : std::vector<int64_t>{sys->batch, sys->n};
  }
  if (k > 1) shape.insert(shape.begin(), k);
  const trisolve::ArrayView view{trisolve::DType::kFloat64, shape, rhs};
  auto r = ctx->client->SolveSystem(sys->handle, view, {}, Options(ctx));
  if (!r.ok()) return FromStatus(ctx, r.status());
  const int64_t total = view.elements();
  if (r->x.dtype != trisolve::DType::kFloat64 || r->x.elements() != total) {
    return Fail(ctx, TRISOLVE_INTERNAL, "the server's x has an unexpected type or size");
  }
  std::memmove(x, r->x.as<double>(), sizeof(double) * total);
  sys->residual = r->summary.residual;
  sys->iterations = r->summary.iterations;
  sys->method = r->summary.method;
  return Statuses(ctx, *r, sys->block ? k : k * sys->batch, status_out);
}

int trisolve_system_update(trisolve_system* sys, const char* name, const double* values) {
  if (sys == nullptr) return Fail(nullptr, TRISOLVE_INVALID_ARGUMENT, "sys is NULL");
  trisolve_context* ctx = sys->ctx;
  if (name == nullptr || values == nullptr) {
    return Fail(ctx, TRISOLVE_INVALID_ARGUMENT, "name and values must not be NULL");
  }
  std::vector<int64_t> shape;
  if (sys->block || sys->interleaved) {
    shape = {sys->n, sys->batch};
  } else {
    shape = {sys->batch, sys->n};
  }
  trisolve::Updates u{{name, {trisolve::DType::kFloat64, shape, values}}};
  auto info = ctx->client->UpdateSystem(sys->handle, u, Options(ctx));
  return FromStatus(ctx, info.status());
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

int trisolve_system_last_summary(const trisolve_system* sys, double* residual,
                                 int64_t* iterations, const char** method) {
  if (sys == nullptr) return TRISOLVE_INVALID_ARGUMENT;
  if (residual != nullptr) *residual = sys->residual;
  if (iterations != nullptr) *iterations = sys->iterations;
  if (method != nullptr) *method = sys->method.c_str();
  return TRISOLVE_OK;
}

}  // extern "C"
