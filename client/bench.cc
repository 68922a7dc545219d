// trisolve bench: C clients x R requests against a server, every answer checked, beside the same
// work on one local core.
#include "trisolve/bench.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <latch>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <omp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/examples.h"
#include "trisolve/client.h"
#include "trisolve/swc.h"

namespace trisolve {
namespace {

using Clock = std::chrono::steady_clock;

// A diagonally dominant tridiagonal batch, flat: a, b, c of batch * n values.
struct Matrix {
  std::vector<double> a, b, c;
  std::vector<double> norm;  // ||A||_inf of each system
};

Matrix MakeMatrix(int64_t batch, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Matrix m;
  const int64_t e = batch * n;
  m.a.resize(size_t(e));
  m.b.resize(size_t(e));
  m.c.resize(size_t(e));
  for (int64_t i = 0; i < e; ++i) {
    m.a[size_t(i)] = u(rng);
    m.c[size_t(i)] = u(rng);
    m.b[size_t(i)] = 4 + u(rng);
  }
  m.norm.assign(size_t(batch), 0);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(s * n + i);
      const double row = std::abs(m.b[k]) + (i > 0 ? std::abs(m.a[k]) : 0) +
                         (i + 1 < n ? std::abs(m.c[k]) : 0);
      m.norm[size_t(s)] = std::max(m.norm[size_t(s)], row);
    }
  return m;
}

// The local alternative: Thomas on one core (what a user's code would call).
void Thomas(const Matrix& m, const double* d, double* x, int64_t batch, int64_t n,
            std::vector<double>& cp) {
  cp.resize(size_t(n));
  for (int64_t s = 0; s < batch; ++s) {
    const double* a = m.a.data() + s * n;
    const double* b = m.b.data() + s * n;
    const double* c = m.c.data() + s * n;
    const double* ds = d + s * n;
    double* xs = x + s * n;
    double beta = b[0];
    cp[0] = c[0] / beta;
    xs[0] = ds[0] / beta;
    for (int64_t i = 1; i < n; ++i) {
      beta = b[i] - a[i] * cp[size_t(i - 1)];
      cp[size_t(i)] = c[i] / beta;
      xs[i] = (ds[i] - a[i] * xs[i - 1]) / beta;
    }
    for (int64_t i = n - 2; i >= 0; --i) xs[i] -= cp[size_t(i)] * xs[i + 1];
  }
}

double BackwardError(const Matrix& m, const double* d, const double* x, int64_t batch, int64_t n) {
  return TridiagonalBackwardError(m.a.data(), m.b.data(), m.c.data(), m.norm.data(), d, x, batch,
                                  n);
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return NAN;
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + long(i), v.end());
  return v[i];
}

// ---- the time-step loop of many cells of one morphology (tree family, by handle) -----------

// Hines systems of `cells` cells of one morphology, flat [cells, n]: a cable equation's implicit
// step, couplings from the radii, each cell's scaled a little so that no two cells are alike.
struct Cells {
  int64_t cells = 0, n = 0;
  std::vector<int32_t> parent;
  std::vector<double> lower, upper, diag0;
};

Cells MakeCells(const Morphology& m, int64_t cells, uint64_t seed) {
  Cells c;
  c.cells = cells;
  c.n = m.size();
  c.parent = m.parent;
  const size_t e = size_t(cells * c.n);
  c.lower.resize(e);
  c.upper.resize(e);
  c.diag0.assign(e, 0);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.8, 1.25);
  for (int64_t s = 0; s < cells; ++s) {
    const double scale = u(rng);
    const size_t o = size_t(s * c.n);
    c.diag0[o] = 1.0;  // the capacitance term over the step, every node
    for (int64_t i = 1; i < c.n; ++i) {
      const int32_t p = c.parent[size_t(i)];
      const double r = std::max(0.05, 0.5 * (m.radius[size_t(i)] + m.radius[size_t(p)]));
      const double g = scale * r * r;  // axial conductance ~ cross-section
      c.lower[o + size_t(i)] = -g;
      c.upper[o + size_t(i)] = -1.1 * g;  // not symmetric: a swapped lower/upper shows
      c.diag0[o + size_t(i)] += 1.0 + 1.1 * g;
      c.diag0[o + size_t(p)] += g;
    }
  }
  return c;
}

// Hines elimination on one core (what a simulator does locally).
void Hines(const Cells& c, const double* diag, const double* rhs, double* x,
           std::vector<double>& d, std::vector<double>& f) {
  const int64_t n = c.n;
  d.resize(size_t(n));
  f.resize(size_t(n));
  for (int64_t s = 0; s < c.cells; ++s) {
    const size_t o = size_t(s * n);
    std::memcpy(d.data(), diag + o, size_t(n) * 8);
    std::memcpy(f.data(), rhs + o, size_t(n) * 8);
    for (int64_t i = n - 1; i >= 1; --i) {
      const size_t p = size_t(c.parent[size_t(i)]);
      const double k = c.upper[o + size_t(i)] / d[size_t(i)];
      d[p] -= k * c.lower[o + size_t(i)];
      f[p] -= k * f[size_t(i)];
    }
    x[o] = f[0] / d[0];
    for (int64_t i = 1; i < n; ++i)
      x[o + size_t(i)] =
          (f[size_t(i)] - c.lower[o + size_t(i)] * x[o + size_t(c.parent[size_t(i)])]) / d[size_t(i)];
  }
}

// The worst cell's ||rhs - A x||_inf / (||A||_inf ||x||_inf + ||rhs||_inf); a non-finite x is
// infinitely wrong.
double TreeError(const Cells& c, const double* diag, const double* rhs, const double* x) {
  const int64_t n = c.n;
  std::vector<double> ax(static_cast<size_t>(n)), row(static_cast<size_t>(n));
  double worst = 0;
  for (int64_t s = 0; s < c.cells; ++s) {
    const size_t o = size_t(s * n);
    double xn = 0, fn = 0, an = 0, r = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(x[o + size_t(i)])) return INFINITY;
      ax[size_t(i)] = diag[o + size_t(i)] * x[o + size_t(i)];
      row[size_t(i)] = std::abs(diag[o + size_t(i)]);
    }
    for (int64_t i = 1; i < n; ++i) {
      const size_t p = size_t(c.parent[size_t(i)]);
      ax[size_t(i)] += c.lower[o + size_t(i)] * x[o + p];
      row[size_t(i)] += std::abs(c.lower[o + size_t(i)]);
      ax[p] += c.upper[o + size_t(i)] * x[o + size_t(i)];
      row[p] += std::abs(c.upper[o + size_t(i)]);
    }
    for (int64_t i = 0; i < n; ++i) {
      r = std::max(r, std::abs(rhs[o + size_t(i)] - ax[size_t(i)]));
      an = std::max(an, row[size_t(i)]);
      xn = std::max(xn, std::abs(x[o + size_t(i)]));
      fn = std::max(fn, std::abs(rhs[o + size_t(i)]));
    }
    worst = std::max(worst, r / (an * xn + fn));
  }
  return worst;
}

int RunTreeLoop(const Client::Options& client_options, const BenchOptions& o) {
  if (o.transport == "shm" || o.transport == "shm-ring") {
    std::cerr << "bench --swc: --transport grpc, auto or streams\n";
    return 2;
  }
  auto morph = ReadSwc(o.swc);
  if (!morph.ok()) {
    std::cerr << "bench: " << morph.status() << "\n";
    return 1;
  }
  const Cells cells = MakeCells(*morph, o.batch, 11);
  const int64_t values = cells.cells * cells.n;
  // Each step brings a new diagonal (the membrane's conductances) and a new right-hand side:
  // a few of each, the pair a step takes differing from client to client, so that an answer to
  // another step or another client's system shows as a large residual.
  constexpr int kDiag = 2, kRhs = 3;
  std::vector<std::vector<double>> diag(kDiag), rhs(kRhs);
  for (int k = 0; k < kDiag; ++k) {
    std::mt19937_64 rng(200 + uint64_t(k));
    std::uniform_real_distribution<double> u(0, 0.5);
    diag[size_t(k)] = cells.diag0;
    for (double& v : diag[size_t(k)]) v += u(rng);
  }
  for (int k = 0; k < kRhs; ++k) {
    std::mt19937_64 rng(300 + uint64_t(k));
    std::uniform_real_distribution<double> u(-1, 1);
    rhs[size_t(k)].resize(size_t(values));
    for (double& v : rhs[size_t(k)]) v = u(rng);
  }
  const std::vector<int64_t> shape = {cells.cells, cells.n};
  auto view = [&](const double* p) { return ArrayView{DType::kFloat64, shape, p}; };
  const ArrayView parent{DType::kInt32, {cells.n}, cells.parent.data()};

  std::mutex mu;
  std::vector<double> latency_us;
  std::map<std::string, int64_t> errors;
  std::map<std::string, std::string> first_error;  // by status code: its first message
  std::atomic<int64_t> ok{0}, wrong{0}, lost{0};
  std::atomic<bool> failed_setup{false};
  double worst_error = 0;
  auto client_loop = [&](int id) {
    Client::Options co = client_options;
    co.own_connection = true;
    co.transport = o.transport == "grpc"      ? Transport::kGrpc
                   : o.transport == "streams" ? Transport::kStreams
                                              : Transport::kAuto;
    Client client(co);
    JobOptions jo;
    jo.skip_residual = true;  // checked here
    // x into the client's own array (as a simulator keeps its state): under --transport auto the
    // answer then comes back through the staging region too, not in a message.
    std::vector<double> xbuf;
    if (o.mode != "stream") {
      xbuf.resize(size_t(values));
      jo.x_out = xbuf.data();
    }
    std::string handle;
    std::unique_ptr<StepStream> stream;
    if (o.mode != "unary") {
      Job job{Kind::kTree};
      job.arrays = {{"parent", parent}, {"lower", view(cells.lower.data())},
                    {"upper", view(cells.upper.data())}, {"diag", view(diag[0].data())}};
      auto made = client.CreateSystem(job, {.ttl_s = 600, .label = absl::StrCat("cells-", id)});
      if (!made.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        std::cerr << "bench: CreateSystem: " << made.status() << "\n";
        failed_setup = true;
        return;
      }
      handle = made->handle;
      if (o.mode == "stream") {
        auto st = client.OpenStepStream(handle, jo);
        if (!st.ok()) {
          failed_setup = true;
          return;
        }
        stream = *std::move(st);
      }
    }
    std::vector<double> local_lat;
    std::map<std::string, int64_t> local_err;
    std::map<std::string, std::string> local_first;
    double local_worst = 0;
    auto step_of = [&](int64_t q) { return std::make_pair(int(q % kDiag), int((q + id) % kRhs)); };
    auto check = [&](const absl::StatusOr<Result>& r, int64_t q, double us) {
      if (!r.ok()) {
        const std::string code(absl::StatusCodeToString(r.status().code()));
        local_err[code]++;
        local_first.emplace(code, std::string(r.status().message().substr(0, 200)));
        return;
      }
      const bool own = jo.x_out != nullptr;
      if (r->x.elements() != values || r->x.dtype != DType::kFloat64 ||
          (!own && int64_t(r->x.data.size()) != values * 8)) {
        ++lost;
        return;
      }
      const auto [dk, rk] = step_of(q);
      const double e = TreeError(cells, diag[size_t(dk)].data(), rhs[size_t(rk)].data(),
                                 own ? xbuf.data() : r->x.as<double>());
      local_worst = std::max(local_worst, e);
      if (!(e <= 1e-12)) {
        ++wrong;
        return;
      }
      ++ok;
      local_lat.push_back(us);
    };
    for (int64_t q = 0; q < o.requests; ++q) {
      const auto [dk, rk] = step_of(q);
      const Updates update = {{"diag", view(diag[size_t(dk)].data())}};
      const auto t0 = Clock::now();
      if (o.mode == "unary") {
        Job job{Kind::kTree};
        job.arrays = {{"parent", parent}, {"lower", view(cells.lower.data())},
                      {"upper", view(cells.upper.data())}, {"diag", view(diag[size_t(dk)].data())},
                      {"rhs", view(rhs[size_t(rk)].data())}};
        job.options = jo;
        auto r = client.Solve(job);
        check(r, q, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      } else if (o.mode == "handle") {
        auto r = client.SolveSystem(handle, view(rhs[size_t(rk)].data()), update, jo);
        check(r, q, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      } else {
        if (auto st = stream->Send(view(rhs[size_t(rk)].data()), update); !st.ok()) {
          local_err["UNAVAILABLE"]++;
          break;
        }
        // Two steps in flight: the next is on its way while one is solved.
        if (q >= 1) {
          auto r = stream->Receive();
          check(r, q - 1, r.ok() ? r->summary.timings.client_total_us : 0);
        }
      }
    }
    if (stream && o.requests > 0) {
      auto r = stream->Receive();
      check(r, o.requests - 1, r.ok() ? r->summary.timings.client_total_us : 0);
    }
    if (stream) {
      if (auto st = stream->Finish(); !st.ok())
        local_err[std::string(absl::StatusCodeToString(st.code()))]++;
    }
    if (!handle.empty()) (void)client.ReleaseSystem(handle);
    std::lock_guard<std::mutex> lock(mu);
    latency_us.insert(latency_us.end(), local_lat.begin(), local_lat.end());
    for (auto& [k, v] : local_err) errors[k] += v;
    for (auto& [k, v] : local_first) first_error.emplace(k, v);
    worst_error = std::max(worst_error, local_worst);
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < o.clients; ++i) threads.emplace_back(client_loop, i);
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();

  // One local core: the same steps, Hines over every cell.
  std::vector<double> x(static_cast<size_t>(values)), d, f;
  const int64_t local_steps = std::max<int64_t>(1, std::min<int64_t>(o.requests, 20));
  const auto l0 = Clock::now();
  for (int64_t q = 0; q < local_steps; ++q)
    Hines(cells, diag[size_t(q % kDiag)].data(), rhs[size_t(q % kRhs)].data(), x.data(), d, f);
  const double local_s =
      std::chrono::duration<double>(Clock::now() - l0).count() / double(local_steps);
  const double local_error = TreeError(cells, diag[size_t((local_steps - 1) % kDiag)].data(),
                                       rhs[size_t((local_steps - 1) % kRhs)].data(), x.data());

  const int64_t total = int64_t(o.clients) * o.requests;
  int64_t errs = 0;
  for (auto& [k, v] : errors) errs += v;
  const int64_t answered = ok + wrong + lost;
  std::vector<double> lat = latency_us;
  const double p50 = Percentile(lat, 0.5), p90 = Percentile(lat, 0.9), p99 = Percentile(lat, 0.99);
  // A step moves the diagonal and the right-hand side in and x out (unary: every array).
  const double bytes_per = double(values) * 8 * (o.mode == "unary" ? 6 : 3);
  std::cout << absl::StrFormat(
      "bench tree time steps %s over %s: %d clients x %d steps, %d cells of %s (%d "
      "compartments each, %d unknowns a step; %.1f MB a step)\n",
      o.mode, o.transport, o.clients, o.requests, cells.cells, o.swc, cells.n, values,
      bytes_per / 1e6);
  std::cout << absl::StrFormat("  %-24s %12s %10s %10s %10s %10s\n", "", "steps/s", "p50 ms",
                               "p90 ms", "p99 ms", "GB/s");
  std::cout << absl::StrFormat("  %-24s %12.2f %10.3f %10.3f %10.3f %10.3f\n", "trisolve",
                               double(ok) / wall, p50 / 1e3, p90 / 1e3, p99 / 1e3,
                               double(ok) * bytes_per / wall / 1e9);
  std::cout << absl::StrFormat("  %-24s %12.2f %10.3f %10s %10s %10s\n", "one local core (Hines)",
                               1 / local_s, local_s * 1e3, "-", "-", "-");
  std::cout << absl::StrFormat(
      "  answers: %d ok, %d wrong, %d malformed, %d errors, %d not answered of %d; worst "
      "backward error %.2e (local %.2e)\n",
      int64_t(ok), int64_t(wrong), int64_t(lost), errs, total - answered - errs, total,
      worst_error, local_error);
  for (auto& [k, v] : errors)
    std::cout << "  error " << k << ": " << v << " (the first: " << first_error[k] << ")\n";
  if (o.json)
    std::cout << absl::StrFormat(
        "{\"family\":\"tree\",\"mode\":\"%s\",\"transport\":\"%s\",\"clients\":%d,"
        "\"steps\":%d,\"cells\":%d,\"n\":%d,\"ok\":%d,\"wrong\":%d,\"errors\":%d,"
        "\"steps_per_s\":%.3f,\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,"
        "\"local_ms\":%.4f,\"local_steps_per_s\":%.3f,\"worst_backward_error\":%.3e}\n",
        o.mode, o.transport, o.clients, o.requests, cells.cells, cells.n, int64_t(ok),
        int64_t(wrong), errs, double(ok) / wall, p50 / 1e3, p90 / 1e3, p99 / 1e3, local_s * 1e3,
        1 / local_s, worst_error);
  if (failed_setup) return 1;
  return ok == total ? 0 : 1;
}

// ---- the block family: a 2D grid's block-tridiagonal system, solved iteratively ------------

Transport TransportOf(const std::string& name) {
  return name == "grpc"                          ? Transport::kGrpc
         : name == "shm"                         ? Transport::kSharedMemory
         : name == "streams"                     ? Transport::kStreams
         : name == "ring" || name == "shm-ring" ? Transport::kRing
                                                 : Transport::kAuto;
}

// The arrays live in registered shared memory (x written into it): shm sends references to
// them over gRPC, shm-ring through the client's request ring.
bool ArraysInSharedMemory(const BenchOptions& o) {
  return o.transport == "shm" || o.transport == "shm-ring";
}

int RunBlock(const Client::Options& client_options, const BenchOptions& o) {
  if (o.mode == "info" || o.mode == "health") {
    std::cerr << "bench --family block: --mode unary, handle or stream\n";
    return 2;
  }
  if (o.N < 2 || o.M < 2 || !(o.tol > 0 && o.tol < 1)) {
    std::cerr << "bench --family block: --N, --M >= 2 and 0 < --tol < 1\n";
    return 2;
  }
  auto method = ParseBlockMethod(o.method);
  if (!method.ok()) {
    std::cerr << "bench: --method: " << method.status().message() << "\n";
    return 2;
  }
  const int64_t N = o.N, M = o.M, values = N * M;
  // The thesis' experiment 2: symmetric positive definite, so that auto takes multigrid-cg on
  // the server and on the local core alike; its iterations stay at 12-13 for every N = M.
  examples::Arrays ex = examples::ThesisExperiment2(N, M);
  static constexpr std::array<const char*, 5> kCoefficients = {"aC", "cC", "bC", "cA", "cB"};
  std::array<const double*, 5> coeff{};
  for (size_t i = 0; i < kCoefficients.size(); ++i) coeff[i] = ex[kCoefficients[i]].as<double>();
  const double norm_a = BlockTridiagonalNorm(N, M, coeff[0], coeff[1], coeff[2], coeff[3], coeff[4]);
  const std::vector<int64_t> shape = {N, M};
  auto view = [&](const double* p) { return ArrayView{DType::kFloat64, shape, p}; };
  // Right-hand sides: a few of each client's own, so that an answer to another request shows as
  // a residual of order one.
  constexpr int kRhs = 3;

  std::mutex mu;
  std::vector<double> latency_us;
  Timings server_sum;
  int64_t server_n = 0, iterations_sum = 0, iterations_max = 0;
  std::map<std::string, int64_t> errors, not_ok_by;
  std::map<std::string, std::string> first_error;
  std::set<std::string> methods;
  std::atomic<int64_t> ok{0}, wrong{0}, lost{0}, not_ok{0};
  std::atomic<bool> failed_setup{false};
  double worst_residual = 0, check_sum_us = 0, call_sum_us = 0;
  int64_t checked = 0;  // answers whose residual was computed (check_every)
  Clock::time_point last_answer{};
  std::latch ready(o.clients), go(1);
  struct Arrive {
    std::latch* l;
    void operator()() {
      if (l != nullptr) l->count_down();
      l = nullptr;
    }
    ~Arrive() { (*this)(); }
  };
  auto setup_failed = [&](const std::string& what, const absl::Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    std::cerr << "bench: " << what << ": " << st << "\n";
    failed_setup = true;
  };

  auto client_loop = [&](int id) {
    Arrive arrive{&ready};
    Client::Options co = client_options;
    co.own_connection = true;
    co.transport = TransportOf(o.transport);
    Client client(co);
    JobOptions jo;
    jo.method = o.method;
    jo.tol = o.tol;
    std::vector<std::vector<double>> own_f(kRhs);
    for (int k = 0; k < kRhs; ++k) {
      std::mt19937_64 rng(5000 + uint64_t(id) * kRhs + uint64_t(k));
      std::uniform_real_distribution<double> u(-1, 1);
      own_f[size_t(k)].resize(size_t(values));
      for (double& v : own_f[size_t(k)]) v = u(rng);
    }
    std::array<const double*, 5> c = coeff;
    std::array<const double*, kRhs> f{};
    for (int k = 0; k < kRhs; ++k) f[size_t(k)] = own_f[size_t(k)].data();
    // shm: every array in the client's registered memory (filled before the clock), y written
    // there too; otherwise y into an array of the client's own (--x-out) or in the answer.
    std::unique_ptr<SharedMemory> shm;
    double *x_area = nullptr, *x_area2 = nullptr;
    std::vector<double> own_x, own_x2;
    if (ArraysInSharedMemory(o)) {
      auto made = SharedMemory::Create((5 + kRhs + 2) * values * 8 + 64 * 16);
      absl::Status st = made.ok() ? absl::OkStatus() : made.status();
      if (st.ok()) {
        shm = *std::move(made);
        auto place = [&](const double* src) {
          double* p = *shm->Allocate<double>(values);
          std::memcpy(p, src, size_t(values) * 8);
          return p;
        };
        for (auto& p : c) p = place(p);
        for (auto& p : f) p = place(p);
        x_area = *shm->Allocate<double>(values);
        x_area2 = *shm->Allocate<double>(values);
        st = client.RegisterMemory(*shm);
      }
      if (!st.ok()) return setup_failed("shared memory", st);
    } else if (o.x_out) {
      own_x.resize(size_t(values));
      own_x2.resize(size_t(values));
      x_area = own_x.data();
      x_area2 = own_x2.data();
    }
    jo.x_out = x_area;
    auto job_of = [&](const double* rhs) {
      Job job{Kind::kBlockTridiagonal};
      for (size_t i = 0; i < kCoefficients.size(); ++i) job.arrays[kCoefficients[i]] = view(c[i]);
      if (rhs != nullptr) job.arrays["f"] = view(rhs);
      job.options = jo;
      return job;
    };
    std::string handle;
    std::unique_ptr<StepStream> stream;
    if (o.mode != "unary") {
      // The server prepares the system once (multigrid-cg: its hierarchy of coarse matrices).
      auto made = client.CreateSystem(job_of(nullptr),
                                      {.ttl_s = 600, .label = absl::StrCat("block-", id)});
      if (!made.ok()) return setup_failed("CreateSystem", made.status());
      handle = made->handle;
      if (o.mode == "stream") {
        auto st = client.OpenStepStream(handle, jo);
        if (!st.ok()) return setup_failed("OpenStepStream", st.status());
        stream = *std::move(st);
      }
    }
    // One solve before the clock, not counted: a client's connection, staging region and the
    // first touch of its arrays are set up once, not a request's cost.
    if (o.mode == "unary") (void)client.Solve(job_of(f[0]));
    if (o.mode == "handle") (void)client.SolveSystem(handle, view(f[0]), {}, jo);
    arrive();
    go.wait();

    std::vector<double> local_lat;
    Timings local_server;
    std::map<std::string, int64_t> local_err, local_not_ok;
    std::map<std::string, std::string> local_first;
    std::set<std::string> local_methods;
    double local_worst = 0, local_check_us = 0, local_call_us = 0;
    int64_t local_iter = 0, local_iter_max = 0, answers_seen = 0, local_checked = 0;
    auto check = [&](const absl::StatusOr<Result>& r, int which, double us, const double* x_own) {
      if (!r.ok()) {
        const std::string code(absl::StatusCodeToString(r.status().code()));
        local_err[code]++;
        local_first.emplace(code, std::string(r.status().message().substr(0, 200)));
        return;
      }
      const double* y = x_own != nullptr ? x_own : r->x.as<double>();
      if (r->x.elements() != values || r->x.dtype != DType::kFloat64 || r->status.size() != 1 ||
          (x_own == nullptr && int64_t(r->x.data.size()) != values * 8)) {
        ++lost;
        return;
      }
      if (r->status[0] != SolveStatus::kOk) {
        ++not_ok;
        local_not_ok[std::string(SolveStatusName(r->status[0]))]++;
        return;
      }
      // The residual of the first and every check_every-th answer; the status of every one.
      if (answers_seen++ % o.check_every == 0) {
        ++local_checked;
        const auto c0 = Clock::now();
        const BlockResidual res = BlockTridiagonalResidual(N, M, c[0], c[1], c[2], c[3], c[4],
                                                           norm_a, f[size_t(which)], y);
        local_check_us += std::chrono::duration<double, std::micro>(Clock::now() - c0).count();
        local_worst = std::max(local_worst, res.residual);
        if (!(res.residual <= o.tol + res.rounding)) {
          local_call_us += us;
          ++wrong;
          return;
        }
      }
      local_call_us += us;
      ++ok;
      local_lat.push_back(us);
      local_methods.insert(r->summary.method);
      local_iter += r->summary.iterations;
      local_iter_max = std::max(local_iter_max, r->summary.iterations);
      const Timings& t = r->summary.timings;
      local_server.receive_us += t.receive_us;
      local_server.queue_us += t.queue_us;
      local_server.h2d_us += t.h2d_us;
      local_server.compute_us += t.compute_us;
      local_server.d2h_us += t.d2h_us;
      local_server.residual_us += t.residual_us;
      local_server.server_total_us += t.server_total_us;
    };
    for (int64_t q = 0; q < o.requests; ++q) {
      const int which = int(q % kRhs);
      const auto t0 = Clock::now();
      if (o.mode == "unary") {
        auto r = client.Solve(job_of(f[size_t(which)]));
        check(r, which, std::chrono::duration<double, std::micro>(Clock::now() - t0).count(),
              x_area);
      } else if (o.mode == "handle") {
        auto r = client.SolveSystem(handle, view(f[size_t(which)]), {}, jo);
        check(r, which, std::chrono::duration<double, std::micro>(Clock::now() - t0).count(),
              x_area);
      } else {
        // Two steps in flight: the next is on its way while one is solved.
        double* xq = q % 2 == 0 ? x_area : x_area2;
        if (auto st = stream->Send(view(f[size_t(which)]), {}, xq); !st.ok()) {
          local_err["UNAVAILABLE"]++;
          break;
        }
        if (q >= 1) {
          auto r = stream->Receive();
          check(r, int((q - 1) % kRhs), r.ok() ? r->summary.timings.client_total_us : 0,
                (q - 1) % 2 == 0 ? x_area : x_area2);
        }
      }
    }
    if (stream) {
      auto r = stream->Receive();
      check(r, int((o.requests - 1) % kRhs), r.ok() ? r->summary.timings.client_total_us : 0,
            (o.requests - 1) % 2 == 0 ? x_area : x_area2);
      if (auto st = stream->Finish(); !st.ok())
        local_err[std::string(absl::StatusCodeToString(st.code()))]++;
    }
    const auto answered = Clock::now();
    if (!handle.empty()) (void)client.ReleaseSystem(handle);
    if (shm) (void)client.UnregisterMemory(*shm);
    std::lock_guard<std::mutex> lock(mu);
    last_answer = std::max(last_answer, answered);
    latency_us.insert(latency_us.end(), local_lat.begin(), local_lat.end());
    server_n += int64_t(local_lat.size());
    server_sum.receive_us += local_server.receive_us;
    server_sum.queue_us += local_server.queue_us;
    server_sum.h2d_us += local_server.h2d_us;
    server_sum.compute_us += local_server.compute_us;
    server_sum.d2h_us += local_server.d2h_us;
    server_sum.residual_us += local_server.residual_us;
    server_sum.server_total_us += local_server.server_total_us;
    check_sum_us += local_check_us;
    checked += local_checked;
    call_sum_us += local_call_us;
    iterations_sum += local_iter;
    iterations_max = std::max(iterations_max, local_iter_max);
    for (auto& [k, v] : local_err) errors[k] += v;
    for (auto& [k, v] : local_not_ok) not_ok_by[k] += v;
    for (auto& [k, v] : local_first) first_error.emplace(k, v);
    methods.insert(local_methods.begin(), local_methods.end());
    worst_residual = std::max(worst_residual, local_worst);
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < o.clients; ++i) threads.emplace_back(client_loop, i);
  ready.wait();
  const auto t0 = Clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::max(last_answer, t0) - t0).count();

  // One local core: the CPU reference (what the server's CPU backend runs), the same method and
  // tolerance, on one thread: up to 3 solves, none started after the first second (a
  // 1024 x 1024 solve takes ~0.6 s: the multi-GPU script runs dozens of these benches).
  omp_set_num_threads(1);
  std::vector<double> y(static_cast<size_t>(values));
  std::vector<double> f0(static_cast<size_t>(values));
  {
    std::mt19937_64 rng(5000);  // client 0's first right-hand side
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& v : f0) v = u(rng);
  }
  BlockTridiagonalProblem<double> p;
  p.N = N;
  p.M = M;
  p.aC = coeff[0];
  p.cC = coeff[1];
  p.bC = coeff[2];
  p.cA = coeff[3];
  p.cB = coeff[4];
  p.f = f0.data();
  BlockOptions bopt;
  bopt.tol = o.tol;
  SystemStatus local_status = SystemStatus::kOk;
  std::string local_method = "(failed)";
  int64_t local_iterations = 0, local_reps = 0;
  const auto l0 = Clock::now();
  double local_s = NAN;
  do {
    auto info = cpu::SolveBlockTridiagonal<double>(p, *method, bopt, {y.data(), &local_status});
    if (!info.ok()) {
      local_method = absl::StrCat("(", info.status().message(), ")");
      break;
    }
    local_method = info->method;
    local_iterations = info->iterations;
    ++local_reps;
    local_s = std::chrono::duration<double>(Clock::now() - l0).count() / double(local_reps);
  } while (local_reps < std::min<int64_t>(o.requests, 3) &&
           std::chrono::duration<double>(Clock::now() - l0).count() < 1);
  const double local_residual =
      local_reps > 0 ? BlockTridiagonalResidual(N, M, p.aC, p.cC, p.bC, p.cA, p.cB, norm_a,
                                                f0.data(), y.data()).residual
                     : NAN;

  const int64_t total = int64_t(o.clients) * o.requests;
  int64_t errs = 0;
  for (auto& [k, v] : errors) errs += v;
  const int64_t answered = ok + wrong + lost + not_ok;
  // Payload: unary moves five coefficient arrays and f in, y out; by handle f in and y out.
  const double bytes_per = double(values) * 8 * (o.mode == "unary" ? 7 : 2);
  std::vector<double> lat = latency_us;
  const double p50 = Percentile(lat, 0.5), p90 = Percentile(lat, 0.9), p99 = Percentile(lat, 0.99);
  const std::string method_seen = absl::StrJoin(methods, ", ");
  std::cout << absl::StrFormat(
      "bench block-tridiagonal %s over %s: %d clients x %d requests, N x M = %d x %d float64 (the "
      "thesis' experiment 2), --method %s, tol %.1e (%.1f MB a request)\n",
      o.mode, o.transport, o.clients, o.requests, N, M, o.method, o.tol, bytes_per / 1e6);
  std::cout << absl::StrFormat("  %-24s %12s %10s %10s %10s %10s\n", "", "requests/s", "p50 ms",
                               "p90 ms", "p99 ms", "GB/s");
  std::cout << absl::StrFormat("  %-24s %12.2f %10.3f %10.3f %10.3f %10.3f\n", "trisolve",
                               double(ok) / wall, p50 / 1e3, p90 / 1e3, p99 / 1e3,
                               double(ok) * bytes_per / wall / 1e9);
  std::cout << absl::StrFormat("  %-24s %12.2f %10.3f %10s %10s %10s\n",
                               "one local core (ref.)", 1 / local_s, local_s * 1e3, "-", "-", "-");
  std::cout << absl::StrFormat(
      "  the server ran %s, %.1f iterations a request on average (at most %d); the local core "
      "%s, %d iterations, residual %.2e\n",
      method_seen.empty() ? "-" : method_seen,
      double(iterations_sum) / double(std::max<int64_t>(server_n, 1)), iterations_max,
      local_method, local_iterations, local_residual);
  if (server_n > 0) {
    const double k = 1e3 * double(server_n);
    std::cout << absl::StrFormat(
        "  server, mean ms: receive+check %.3f, queue %.3f, h2d %.3f, compute %.3f, d2h %.3f, "
        "residual %.3f, total %.3f\n",
        server_sum.receive_us / k, server_sum.queue_us / k, server_sum.h2d_us / k,
        server_sum.compute_us / k, server_sum.d2h_us / k, server_sum.residual_us / k,
        server_sum.server_total_us / k);
    std::cout << absl::StrFormat("  client, mean ms: call %.3f, check %.3f, cycle %.3f\n",
                                 call_sum_us / k, check_sum_us / k,
                                 1e3 * wall * double(o.clients) / double(server_n));
  }
  std::cout << absl::StrFormat(
      "  answers: %d ok, %d wrong (||f - A y||_2 / ||f||_2 over tol), %d not ok (the server's "
      "status), %d malformed, %d errors, %d not answered of %d; worst residual %.2e\n",
      int64_t(ok), int64_t(wrong), int64_t(not_ok), int64_t(lost), errs,
      total - answered - errs, total, worst_residual);
  if (o.check_every > 1)
    std::cout << absl::StrFormat(
        "  residuals checked: %d answers (each client's first and every %d-th); the statuses "
        "of all\n",
        checked, o.check_every);
  for (auto& [k, v] : not_ok_by) std::cout << "  not ok " << k << ": " << v << "\n";
  for (auto& [k, v] : errors)
    std::cout << "  error " << k << ": " << v << " (the first: " << first_error[k] << ")\n";
  if (o.json)
    std::cout << absl::StrFormat(
        "{\"family\":\"block\",\"mode\":\"%s\",\"transport\":\"%s\",\"clients\":%d,"
        "\"requests\":%d,\"N\":%d,\"M\":%d,\"shape\":\"%dx%d\",\"tol\":%.1e,\"ok\":%d,"
        "\"wrong\":%d,\"not_ok\":%d,\"errors\":%d,\"requests_per_s\":%.3f,\"p50_ms\":%.4f,"
        "\"p90_ms\":%.4f,\"p99_ms\":%.4f,\"payload_gb_s\":%.4f,\"local_ms\":%.4f,"
        "\"local_per_s\":%.3f,\"worst_residual\":%.3e,\"iterations\":%.2f,"
        "\"server_total_ms\":%.4f,\"compute_ms\":%.4f,\"checked\":%d}\n",
        o.mode, o.transport, o.clients, o.requests, N, M, N, M, o.tol, int64_t(ok),
        int64_t(wrong), int64_t(not_ok), errs, double(ok) / wall, p50 / 1e3, p90 / 1e3,
        p99 / 1e3, double(ok) * bytes_per / wall / 1e9, local_s * 1e3, 1 / local_s,
        worst_residual, double(iterations_sum) / double(std::max<int64_t>(server_n, 1)),
        server_sum.server_total_us / 1e3 / double(std::max<int64_t>(server_n, 1)),
        server_sum.compute_us / 1e3 / double(std::max<int64_t>(server_n, 1)), checked);
  if (failed_setup) return 1;
  return ok == total ? 0 : 1;
}

}  // namespace

int RunBench(const Client::Options& client_options, const BenchOptions& o) {
  if (o.check_every < 1) {
    std::cerr << "bench: --check-every >= 1\n";
    return 2;
  }
  if (o.check_every > 1 && (!o.swc.empty() || o.mode == "info" || o.mode == "health")) {
    std::cerr << "bench: --check-every applies to tridiagonal and block solves, not --swc time "
                 "steps or --mode info/health\n";
    return 2;
  }
  if (o.family == "block") {
    if (o.clients < 1 || o.requests < 1) {
      std::cerr << "bench: --clients, --requests >= 1\n";
      return 2;
    }
    return RunBlock(client_options, o);
  }
  if (!o.swc.empty()) {
    if (o.pause_ms > 0) {
      std::cerr << "bench: --pause-ms applies to tridiagonal requests, not --swc time steps\n";
      return 2;
    }
    if (o.mode == "info" || o.mode == "health") {
      std::cerr << "bench: --swc runs time steps: --mode unary, handle or stream\n";
      return 2;
    }
    if (o.clients < 1 || o.requests < 1 || o.batch < 1) {
      std::cerr << "bench: --clients, --requests, --batch >= 1\n";
      return 2;
    }
    return RunTreeLoop(client_options, o);
  }
  if (o.clients < 1 || o.requests < 1 || o.batch < 1 || o.n < 2) {
    std::cerr << "bench: --clients, --requests, --batch >= 1 and --n >= 2\n";
    return 2;
  }
  const int64_t values = o.batch * o.n;
  const Matrix m = MakeMatrix(o.batch, o.n, 7);
  // Right-hand sides: a few distinct ones per client, so that an answer given to the wrong
  // request shows as a large residual.
  constexpr int kRhs = 4;
  std::vector<std::vector<double>> rhs(size_t(o.clients) * kRhs);
  for (size_t i = 0; i < rhs.size(); ++i) {
    std::mt19937_64 rng(1000 + i);
    std::uniform_real_distribution<double> u(-1, 1);
    rhs[i].resize(size_t(values));
    for (double& v : rhs[i]) v = u(rng);
  }
  const std::vector<int64_t> shape =
      o.batch == 1 ? std::vector<int64_t>{o.n} : std::vector<int64_t>{o.batch, o.n};

  std::mutex mu;
  std::vector<double> latency_us;
  Timings server_sum;  // the server's own account, summed over the answers checked
  int64_t server_n = 0;
  std::map<std::string, int64_t> errors;  // by status code
  std::atomic<int64_t> ok{0}, wrong{0}, lost{0};
  std::atomic<int> most_pieces{0};  // the streams transport's pipelining (Summary::pieces)
  double worst_error = 0;
  int64_t batched = 0, batched_with = 0;  // answers the server solved with others, and with how many
  std::atomic<bool> failed_setup{false};
  double check_sum_us = 0, call_sum_us = 0;
  int64_t checked = 0;  // answers whose values were checked (check_every)
  // The clock runs from the moment every client has set up (its connection, its shared
  // memory, its system) until the last one has its last answer: setup and teardown (releasing
  // the system, unregistering the memory: the server unpins it, tens of milliseconds for a
  // large region) happen once a client, not a request.
  Clock::time_point last_answer{};
  std::latch ready(o.clients), go(1);
  struct Arrive {
    std::latch* l;
    void operator()() {
      if (l != nullptr) l->count_down();
      l = nullptr;
    }
    ~Arrive() { (*this)(); }
  };

  auto client_loop = [&](int id) {
    Arrive arrive{&ready};
    Client::Options co = client_options;
    co.own_connection = true;  // one connection a client, as separate processes would have
    co.transport = TransportOf(o.transport);
    Client client(co);
    JobOptions jo;
    jo.skip_residual = true;  // the bench checks every answer itself
    // shm: the client's arrays live in shared memory it registered (filled once, before the
    // clock starts, as a simulation that keeps them there would), x is written into it.
    std::unique_ptr<SharedMemory> shm;
    const double *ma = m.a.data(), *mb = m.b.data(), *mc = m.c.data();
    std::vector<const double*> my_rhs(kRhs);
    for (int k = 0; k < kRhs; ++k) my_rhs[size_t(k)] = rhs[size_t(id * kRhs + k)].data();
    // Each right-hand side's answer on this core, before the clock starts: every answer is
    // compared with it (x and the expected x: two arrays a check, where the residual reads
    // five, which bound the bench, not the server, at 16 clients of 2048 x 1024 on the lent
    // 2 x H200 host). The first answer of each client is also checked by its residual.
    std::vector<std::vector<double>> expect(kRhs);
    {
      std::vector<double> cp;
      for (int k = 0; k < kRhs; ++k) {
        expect[size_t(k)].resize(size_t(values));
        Thomas(m, my_rhs[size_t(k)], expect[size_t(k)].data(), o.batch, o.n, cp);
      }
    }
    double *x_area = nullptr, *x_area2 = nullptr;
    if (ArraysInSharedMemory(o)) {
      auto made = SharedMemory::Create((3 + kRhs + 2) * values * 8 + 64 * 16);
      absl::Status st = made.ok() ? absl::OkStatus() : made.status();
      if (st.ok()) {
        shm = *std::move(made);
        auto place = [&](const double* src) {
          double* p = *shm->Allocate<double>(values);
          std::memcpy(p, src, size_t(values) * 8);
          return p;
        };
        ma = place(ma);
        mb = place(mb);
        mc = place(mc);
        for (auto& r : my_rhs) r = place(r);
        x_area = *shm->Allocate<double>(values);
        x_area2 = *shm->Allocate<double>(values);  // the stream's step in flight writes here
        st = client.RegisterMemory(*shm);
      }
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        std::cerr << "bench: shared memory: " << st << "\n";
        failed_setup = true;
        return;
      }
      jo.x_out = x_area;
    }
    std::vector<double> own_x, own_x2;
    if (o.x_out && !shm) {
      own_x.resize(size_t(values));
      own_x2.resize(size_t(values));
      x_area = own_x.data();
      x_area2 = own_x2.data();
      jo.x_out = x_area;
    }
    auto ptr_view = [&](const double* p) { return ArrayView{DType::kFloat64, shape, p}; };
    std::string handle;
    if (o.mode == "handle" || o.mode == "stream") {
      Job job{Kind::kTridiagonal};
      job.arrays = {{"a", ptr_view(ma)}, {"b", ptr_view(mb)}, {"c", ptr_view(mc)}};
      auto made = client.CreateSystem(job, {.ttl_s = 600, .label = absl::StrCat("bench-", id)});
      if (!made.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        std::cerr << "bench: CreateSystem: " << made.status() << "\n";
        failed_setup = true;
        return;
      }
      handle = made->handle;
    }
    std::unique_ptr<StepStream> stream;
    if (o.mode == "stream") {
      auto s = client.OpenStepStream(handle, jo);
      if (!s.ok()) {
        failed_setup = true;
        return;
      }
      stream = *std::move(s);
    }
    if (o.mode == "unary" || o.mode == "info" || o.mode == "health")
      (void)client.Info();  // the connection up before the clock starts
    // One solve before the clock, not counted: what a client sets up once (a request ring and
    // its region, a staging region, the first touch of x) is not a request's cost.
    if (o.mode == "unary") {
      Job job{Kind::kTridiagonal};
      job.arrays = {{"a", ptr_view(ma)}, {"b", ptr_view(mb)}, {"c", ptr_view(mc)},
                    {"d", ptr_view(my_rhs[0])}};
      job.options = jo;
      (void)client.Solve(job);
    } else if (o.mode == "handle") {
      (void)client.SolveSystem(handle, ptr_view(my_rhs[0]), {}, jo);
    }
    arrive();
    go.wait();
    std::vector<double> local_lat;
    Timings local_server;
    std::map<std::string, int64_t> local_err;
    double local_worst = 0;
    int64_t local_batched = 0, local_batched_with = 0;
    double local_check_us = 0, local_call_us = 0;  // the client's own account
    int64_t answers_seen = 0, local_checked = 0;
    auto record_server = [&](const Summary& summary) {
      for (int p = most_pieces.load();
           summary.pieces > p && !most_pieces.compare_exchange_weak(p, summary.pieces);) {
      }
      if (summary.batched_with > 1) {
        ++local_batched;
        local_batched_with += summary.batched_with;
      }
      const Timings& t = summary.timings;
      local_server.receive_us += t.receive_us;
      local_server.queue_us += t.queue_us;
      local_server.h2d_us += t.h2d_us;
      local_server.compute_us += t.compute_us;
      local_server.d2h_us += t.d2h_us;
      local_server.server_total_us += t.server_total_us;
      local_server.upload_us += t.upload_us;
      local_server.download_us += t.download_us;
    };
    auto check = [&](const absl::StatusOr<Result>& r, int which, double us,
                     const double* x_in_shm) {
      if (!r.ok()) {
        local_err[std::string(absl::StatusCodeToString(r.status().code()))]++;
        return;
      }
      const double* x = x_in_shm != nullptr ? x_in_shm : r->x.as<double>();
      if (r->x.elements() != values || r->x.dtype != DType::kFloat64 ||
          (x_in_shm == nullptr && int64_t(r->x.data.size()) != values * 8)) {
        ++lost;
        return;
      }
      // Every answer's statuses; its values for the first and every check_every-th answer.
      const bool full = answers_seen++ % o.check_every == 0;
      if (!full) {
        if (int64_t(r->status.size()) != o.batch) {
          ++lost;
          return;
        }
        if (std::any_of(r->status.begin(), r->status.end(),
                        [](SolveStatus s) { return s != SolveStatus::kOk; })) {
          ++wrong;
          return;
        }
        ++ok;
        local_lat.push_back(us);
        local_call_us += us;
        record_server(r->summary);
        return;
      }
      ++local_checked;
      // The matrices are well conditioned (|b| >= 3, |a| + |c| <= 2): a forward error of
      // 1e-12 is far above rounding and far below any wrong answer.
      const auto c0 = Clock::now();
      double e = MaxRelativeDifference(x, expect[size_t(which % kRhs)].data(), o.batch, o.n);
      if (local_lat.empty() && e <= 1e-12)
        local_worst = std::max(local_worst, BackwardError(m, rhs[size_t(which)].data(), x, o.batch,
                                                          o.n));
      local_check_us += std::chrono::duration<double, std::micro>(Clock::now() - c0).count();
      local_call_us += us;
      if (!(e <= 1e-12)) {
        ++wrong;
        return;
      }
      ++ok;
      local_lat.push_back(us);
      record_server(r->summary);
    };
    for (int64_t q = 0; q < o.requests; ++q) {
      const int which = id * kRhs + int(q % kRhs);
      if (q > 0 && o.pause_ms > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(int64_t(o.pause_ms * 1e3)));
      const auto t0 = Clock::now();
      if (o.mode == "info" || o.mode == "health") {
        // The floor: the cheapest calls the server answers, over the same connection.
        absl::Status st;
        if (o.mode == "info") {
          auto r = client.Info();
          st = r.ok() ? absl::OkStatus() : r.status();
        } else {
          auto r = client.Health();
          st = !r.ok() ? r.status()
               : *r == "SERVING" ? absl::OkStatus()
                                 : absl::UnavailableError(*r);
        }
        if (!st.ok()) {
          local_err[std::string(absl::StatusCodeToString(st.code()))]++;
        } else {
          ++ok;
          local_lat.push_back(
              std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
      } else if (o.mode == "unary") {
        Job job{Kind::kTridiagonal};
        job.arrays = {{"a", ptr_view(ma)}, {"b", ptr_view(mb)}, {"c", ptr_view(mc)},
                      {"d", ptr_view(my_rhs[size_t(q % kRhs)])}};
        job.options = jo;
        auto r = client.Solve(job);
        check(r, which, std::chrono::duration<double, std::micro>(Clock::now() - t0).count(),
              x_area);
      } else if (o.mode == "handle") {
        auto r = client.SolveSystem(handle, ptr_view(my_rhs[size_t(q % kRhs)]), {}, jo);
        check(r, which, std::chrono::duration<double, std::micro>(Clock::now() - t0).count(),
              x_area);
      } else {
        // The stream keeps two steps in flight: the next is on its way while one is solved.
        double* xq = q % 2 == 0 ? x_area : x_area2;
        if (auto st = stream->Send(ptr_view(my_rhs[size_t(q % kRhs)]), {}, xq); !st.ok()) {
          local_err["UNAVAILABLE"]++;
          break;
        }
        if (q >= 1) {
          auto r = stream->Receive();
          check(r, id * kRhs + int((q - 1) % kRhs),
                r.ok() ? r->summary.timings.client_total_us : 0,
                (q - 1) % 2 == 0 ? x_area : x_area2);
        }
      }
    }
    if (stream) {
      if (o.requests >= 1) {
        auto r = stream->Receive();
        check(r, id * kRhs + int((o.requests - 1) % kRhs),
              r.ok() ? r->summary.timings.client_total_us : 0,
              (o.requests - 1) % 2 == 0 ? x_area : x_area2);
      }
      if (auto st = stream->Finish(); !st.ok())
        local_err[std::string(absl::StatusCodeToString(st.code()))]++;
    }
    const auto answered = Clock::now();
    if (!handle.empty()) (void)client.ReleaseSystem(handle);
    if (shm) (void)client.UnregisterMemory(*shm);
    std::lock_guard<std::mutex> lock(mu);
    last_answer = std::max(last_answer, answered);
    latency_us.insert(latency_us.end(), local_lat.begin(), local_lat.end());
    server_n += int64_t(local_lat.size());
    server_sum.receive_us += local_server.receive_us;
    server_sum.queue_us += local_server.queue_us;
    server_sum.h2d_us += local_server.h2d_us;
    server_sum.compute_us += local_server.compute_us;
    server_sum.d2h_us += local_server.d2h_us;
    server_sum.server_total_us += local_server.server_total_us;
    server_sum.upload_us += local_server.upload_us;
    check_sum_us += local_check_us;
    checked += local_checked;
    call_sum_us += local_call_us;
    server_sum.download_us += local_server.download_us;
    for (auto& [k, v] : local_err) errors[k] += v;
    batched += local_batched;
    batched_with += local_batched_with;
    worst_error = std::max(worst_error, local_worst);
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < o.clients; ++i) threads.emplace_back(client_loop, i);
  ready.wait();
  const auto t0 = Clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::max(last_answer, t0) - t0).count();

  // One local core: the same systems, the same number of solves per client, serially.
  std::vector<double> x(static_cast<size_t>(values)), cp;
  const int64_t local_reps = std::max<int64_t>(1, std::min<int64_t>(o.requests, 200));
  const auto l0 = Clock::now();
  for (int64_t q = 0; q < local_reps; ++q)
    Thomas(m, rhs[size_t(q % kRhs)].data(), x.data(), o.batch, o.n, cp);
  const double local_s = std::chrono::duration<double>(Clock::now() - l0).count() / double(local_reps);

  const int64_t total = int64_t(o.clients) * o.requests;
  int64_t errs = 0;
  for (auto& [k, v] : errors) errs += v;
  const int64_t answered = ok + wrong + lost;
  // Payload: what a request must move (unary: a, b, c, d in and x out; by handle: d and x).
  const double bytes_per = double(values) * 8 *
                           (o.mode == "unary" ? 5 : o.mode == "handle" || o.mode == "stream" ? 2 : 0);
  std::vector<double> lat = latency_us;
  const double p50 = Percentile(lat, 0.5), p90 = Percentile(lat, 0.9), p99 = Percentile(lat, 0.99);
  const bool solves = o.mode != "info" && o.mode != "health";
  if (solves)
    std::cout << absl::StrFormat(
        "bench tridiagonal %s over %s: %d clients x %d requests, %d x %d float64 (%.1f MB a "
        "request)\n",
        o.mode, o.transport, o.clients, o.requests, o.batch, o.n, bytes_per / 1e6);
  else
    std::cout << absl::StrFormat(
        "bench %s (%s, no solve): %d clients x %d requests; the local core: %d x %d float64\n",
        o.mode, o.mode == "info" ? "GetServerInfo" : "the health check", o.clients, o.requests,
        o.batch, o.n);
  if (o.pause_ms > 0)
    std::cout << absl::StrFormat("  each client idles %.3f ms before each request after its first\n",
                                 o.pause_ms);
  std::cout << absl::StrFormat("  %-24s %12s %10s %10s %10s %10s\n", "", "requests/s", "p50 ms",
                               "p90 ms", "p99 ms", "GB/s");
  std::cout << absl::StrFormat("  %-24s %12.1f %10.3f %10.3f %10.3f %10.3f\n", "trisolve",
                               double(ok) / wall, p50 / 1e3, p90 / 1e3, p99 / 1e3,
                               double(ok) * bytes_per / wall / 1e9);
  std::cout << absl::StrFormat("  %-24s %12.1f %10.3f %10s %10s %10s\n", "one local core (Thomas)",
                               1 / local_s, local_s * 1e3, "-", "-", "-");
  if (solves && server_n > 0) {
    const double k = 1e3 * double(server_n);
    std::cout << absl::StrFormat(
        "  server, mean ms: receive+check %.3f, queue %.3f, h2d %.3f, compute %.3f, d2h %.3f, "
        "total %.3f\n",
        server_sum.receive_us / k, server_sum.queue_us / k, server_sum.h2d_us / k,
        server_sum.compute_us / k, server_sum.d2h_us / k, server_sum.server_total_us / k);
    if (server_sum.upload_us > 0)
      std::cout << absl::StrFormat("  client, mean ms: upload %.3f, download %.3f\n",
                                   server_sum.upload_us / k, server_sum.download_us / k);
    // What a client's requests took on average, its check of each answer, and the whole cycle
    // (clients x wall / answers): where call + check falls short of the cycle, the client's
    // threads waited on something else (the machine's cores, its memory).
    std::cout << absl::StrFormat("  client, mean ms: call %.3f, check %.3f, cycle %.3f\n",
                                 call_sum_us / k, check_sum_us / k,
                                 1e3 * wall * double(o.clients) / double(server_n));
  }
  if (batched > 0)
    std::cout << absl::StrFormat(
        "  batched by the server: %d of %d answers (%.1f%%), in backend calls of %.1f requests "
        "on average\n",
        batched, int64_t(ok), 100.0 * double(batched) / double(std::max<int64_t>(1, ok)),
        double(batched_with) / double(batched));
  std::cout << absl::StrFormat(
      "  answers: %d ok, %d wrong (x more than 1e-12 from one local core's), %d malformed, %d "
      "errors, %d not answered of %d; worst backward error %.2e (each client's first answer)\n",
      int64_t(ok), int64_t(wrong), int64_t(lost), errs, total - answered - errs, total,
      worst_error);
  if (solves && o.check_every > 1)
    std::cout << absl::StrFormat(
        "  values checked: %d answers (each client's first and every %d-th); the statuses of "
        "all\n",
        checked, o.check_every);
  for (auto& [k, v] : errors) std::cout << "  error " << k << ": " << v << "\n";
  if (o.json) {
    std::cout << absl::StrFormat(
        "{\"family\":\"tridiagonal\",\"mode\":\"%s\",\"transport\":\"%s\",\"clients\":%d,"
        "\"requests\":%d,\"batch\":%d,\"n\":%d,\"shape\":\"%dx%d\",\"ok\":%d,"
        "\"wrong\":%d,\"errors\":%d,\"requests_per_s\":%.3f,\"p50_ms\":%.4f,\"p90_ms\":%.4f,"
        "\"p99_ms\":%.4f,\"payload_gb_s\":%.4f,\"local_ms\":%.4f,\"local_per_s\":%.3f,"
        "\"worst_backward_error\":%.3e,\"batched\":%d,\"upload_ms\":%.4f,\"download_ms\":%.4f,"
        "\"server_total_ms\":%.4f,\"pieces\":%d,\"checked\":%d}\n",
        o.mode, o.transport, o.clients, o.requests, o.batch, o.n, o.batch, o.n, int64_t(ok),
        int64_t(wrong), errs,
        double(ok) / wall, p50 / 1e3, p90 / 1e3, p99 / 1e3, double(ok) * bytes_per / wall / 1e9,
        local_s * 1e3, 1 / local_s, worst_error, batched,
        server_sum.upload_us / 1e3 / double(std::max<int64_t>(server_n, 1)),
        server_sum.download_us / 1e3 / double(std::max<int64_t>(server_n, 1)),
        server_sum.server_total_us / 1e3 / double(std::max<int64_t>(server_n, 1)),
        most_pieces.load(), checked);
  }
  if (failed_setup) return 1;
  return ok == total ? 0 : 1;
}

// Every answer is checked, so the check must cost the client less than the server's answer:
// ||A||_inf comes with the matrix, and the rows between the ends run as one vectorised pass
// (x * 0 sums to NaN for any NaN or infinity in x).
double TridiagonalBackwardError(const double* a, const double* b, const double* c,
                                const double* norm, const double* d, const double* x,
                                int64_t batch, int64_t n) {
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t o = s * n, l = o + n - 1;
    double r = std::max(std::abs(d[o] - b[o] * x[o] - c[o] * x[o + 1]),
                        std::abs(d[l] - a[l] * x[l - 1] - b[l] * x[l]));
    double xn = std::max(std::abs(x[o]), std::abs(x[l]));
    double dn = std::max(std::abs(d[o]), std::abs(d[l]));
    double poison = x[o] * 0 + x[l] * 0;
#pragma omp simd reduction(max : r, xn, dn) reduction(+ : poison)
    for (int64_t i = o + 1; i < l; ++i) {
      const double ax = a[i] * x[i - 1] + b[i] * x[i] + c[i] * x[i + 1];
      r = std::max(r, std::abs(d[i] - ax));
      xn = std::max(xn, std::abs(x[i]));
      dn = std::max(dn, std::abs(d[i]));
      poison += x[i] * 0;
    }
    if (!std::isfinite(poison)) return INFINITY;
    worst = std::max(worst, r / (norm[s] * xn + dn));
  }
  return worst;
}

double MaxRelativeDifference(const double* x, const double* expected, int64_t batch, int64_t n) {
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const double* xs = x + s * n;
    const double* es = expected + s * n;
    double diff = 0, scale = 0, poison = 0;
#pragma omp simd reduction(max : diff, scale) reduction(+ : poison)
    for (int64_t i = 0; i < n; ++i) {
      diff = std::max(diff, std::abs(xs[i] - es[i]));
      scale = std::max(scale, std::abs(es[i]));
      poison += xs[i] * 0;
    }
    if (!std::isfinite(poison)) return INFINITY;
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

}  // namespace trisolve

namespace trisolve {

double BlockTridiagonalNorm(int64_t N, int64_t M, const double* aC, const double* cC,
                            const double* bC, const double* cA, const double* cB) {
  double norm = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      const double row = std::abs(cC[e]) + (k > 0 ? std::abs(aC[e]) : 0) +
                         (k + 1 < M ? std::abs(bC[e]) : 0) + (i > 0 ? std::abs(cA[e]) : 0) +
                         (i + 1 < N ? std::abs(cB[e]) : 0);
      norm = std::max(norm, row);
    }
  return norm;
}

// One pass over the seven arrays, rows of the grid between the ends vectorised: the check runs
// on every answer, so it must cost a client less than the server's solve (5-point: 9 flops a
// value against a multigrid V-cycle's hundreds an iteration).
BlockResidual BlockTridiagonalResidual(int64_t N, int64_t M, const double* aC, const double* cC,
                                       const double* bC, const double* cA, const double* cB,
                                       double norm_a, const double* f, const double* y) {
  std::vector<double> zero(static_cast<size_t>(M), 0.0);
  double rr = 0, yy = 0, ff = 0, poison = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t o = i * M;
    const double* up = i > 0 ? y + o - M : zero.data();
    const double* down = i + 1 < N ? y + o + M : zero.data();
    // A's couplings to rows that do not exist are not A's, whatever the arrays hold there.
    const double su = i > 0 ? 1 : 0, sd = i + 1 < N ? 1 : 0;
    const double* yc = y + o;
    auto row_at = [&](int64_t k) {
      const int64_t e = o + k;
      double ax = cC[e] * yc[k] + su * cA[e] * up[k] + sd * cB[e] * down[k];
      if (k > 0) ax += aC[e] * yc[k - 1];
      if (k + 1 < M) ax += bC[e] * yc[k + 1];
      return f[e] - ax;
    };
    const double r0 = row_at(0);
    rr += r0 * r0;
    if (M > 1) {
      const double r1 = row_at(M - 1);
      rr += r1 * r1;
    }
#pragma omp simd reduction(+ : rr)
    for (int64_t k = 1; k < M - 1; ++k) {
      const int64_t e = o + k;
      const double ax = aC[e] * yc[k - 1] + cC[e] * yc[k] + bC[e] * yc[k + 1] +
                        su * cA[e] * up[k] + sd * cB[e] * down[k];
      const double r = f[e] - ax;
      rr += r * r;
    }
#pragma omp simd reduction(+ : yy, ff, poison)
    for (int64_t k = 0; k < M; ++k) {
      yy += yc[k] * yc[k];
      ff += f[o + k] * f[o + k];
      poison += yc[k] * 0;
    }
  }
  BlockResidual out;
  const double fn = std::sqrt(ff);
  if (!std::isfinite(poison) || !std::isfinite(rr)) {
    out.residual = INFINITY;
    return out;
  }
  const double scale = fn > 0 ? fn : 1;
  out.residual = std::sqrt(rr) / scale;
  out.rounding = 16 * std::numeric_limits<double>::epsilon() * (norm_a * std::sqrt(yy) + fn) / scale;
  return out;
}

}  // namespace trisolve
