// trisolve bench: C clients x R requests against a server, every answer checked, beside the same
// work on one local core.
#include "trisolve/bench.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trisolve/block_tridiagonal.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/reference/block_tridiagonal.h"
#include "trisolve/reference/dense.h"
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
  for (int k = 0; k < kRhs; ++k) rhs[size_t(k)] = UniformValues(values, 300 + uint64_t(k));
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

// ---- one driver for every family -------------------------------------------------------------

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

double Micros(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// One client's share of a family's work: the arrays it sends and the check of its answers.
// The views may be repointed into the client's shared memory by the driver; the check reads the
// family's own original arrays, never what was sent.
class ClientWork {
 public:
  virtual ~ClientWork() = default;
  // CreateSystem's job (a unary job adds rhs_name = the right-hand side).
  std::vector<std::pair<std::string, ArrayView>> coefficients;
  std::string rhs_name;
  std::vector<ArrayView> rhs;  // request q sends rhs[q % rhs.size()]
  // The values of x (the answer to rhs[k]; its shape and statuses already checked): right or
  // wrong. first: the client's first checked answer (some families check it further).
  virtual bool Check(int k, const double* x, bool first) = 0;
  // An answer that passed: the family's account of it (iterations, methods).
  virtual void Accepted(const Summary&) {}
};

// What the driver tallies over every client's answers.
struct Tally {
  std::atomic<int64_t> ok{0}, wrong{0}, lost{0}, not_ok{0};
  std::atomic<int> most_pieces{0};  // the streams transport's pipelining (Summary::pieces)
  std::mutex mu;                    // the rest: merged once a client
  std::vector<double> latency_us;
  Timings server;  // the server's own account, summed over the answers accepted
  int64_t server_n = 0, batched = 0, batched_with = 0, checked = 0;
  double check_us = 0, call_us = 0;
  std::map<std::string, int64_t> errors, not_ok_by;  // by status code; by the server's status
  std::map<std::string, std::string> first_error;    // by status code: its first message
  Clock::time_point last_answer{};
};

// A family's workload: its arrays, its checks, the local alternative and its report.
class Workload {
 public:
  virtual ~Workload() = default;
  virtual const char* family() const = 0;  // the JSON's name
  virtual Kind kind() const = 0;
  virtual int64_t values() const = 0;   // x's values an answer
  virtual int64_t systems() const = 0;  // statuses an answer
  virtual JobOptions options() const = 0;
  // Called in the client's thread, before the clock.
  virtual std::unique_ptr<ClientWork> ForClient(int id) const = 0;
  // After the client's last answer, under the tally's mutex.
  virtual void Merge(ClientWork&) {}
  // What a request must move in `mode` (x out included).
  virtual double PayloadBytes(const std::string& mode) const = 0;
  // One local core's seconds a request of `mode`; called after every client is done.
  virtual double LocalSeconds(const BenchOptions& o) = 0;
  // A server's answer whose status is not ok: counted apart (not_ok), or as wrong.
  virtual bool CountsNotOk() const { return true; }
  virtual int RateDecimals() const { return 2; }
  virtual std::string Header(const BenchOptions& o, double bytes_per) const = 0;
  virtual std::string LocalLabel() const = 0;
  virtual void ExtraLines(const Tally&) const {}           // after the table
  virtual std::string WrongMeaning() const = 0;            // "wrong (...)"
  virtual std::string WorstLine() const = 0;               // the answers line's end
  virtual std::string CheckedNoun() const = 0;             // "values", "residuals"
  virtual std::string JsonShape() const = 0;               // after "requests"
  virtual std::string JsonTail(const Tally& t) const = 0;  // after "local_per_s"
  virtual std::string JsonEnd(const Tally& t) const = 0;   // after "server_total_ms"
};

// The server's account of answers, summed (client_total_us is the client's own: not summed).
void AddTimings(const Timings& t, Timings* sum) {
  sum->receive_us += t.receive_us;
  sum->queue_us += t.queue_us;
  sum->h2d_us += t.h2d_us;
  sum->compute_us += t.compute_us;
  sum->d2h_us += t.d2h_us;
  sum->residual_us += t.residual_us;
  sum->server_total_us += t.server_total_us;
  sum->upload_us += t.upload_us;
  sum->download_us += t.download_us;
}

// Where the cores went, read at the clock's start and end: the server process's CPU seconds
// (GetServerInfo; < 0 where it did not answer), this process's (the clients'), and the host's
// busy and total ticks over every core (/proc/stat; < 0 where it cannot be read).
struct CpuSample {
  Clock::time_point at;
  double server_s = -1, clients_s = 0, host_busy = -1, host_total = -1;
  int host_cores = 0;
};

CpuSample SampleCpu(Client& client) {
  CpuSample c;
  if (auto info = client.Info(); info.ok()) c.server_s = info->cpu_s;
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0)
    c.clients_s = double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
                  1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  std::ifstream stat("/proc/stat");
  std::string line;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu ", 0) == 0) {
      std::istringstream in(line.substr(4));
      double v, total = 0, idle = 0;
      for (int i = 0; in >> v; ++i) {
        total += v;
        if (i == 3 || i == 4) idle += v;  // idle, iowait
      }
      c.host_busy = total - idle;
      c.host_total = total;
    } else if (line.rfind("cpu", 0) == 0) {
      ++c.host_cores;
    }
  }
  c.at = Clock::now();
  return c;
}

// The cores each kept busy between two samples, and the line and JSON fields that say so.
struct CoresBusy {
  double server = -1, clients = 0, host = -1;
  int host_cores = 0;
  std::string Line() const {
    std::string s = absl::StrFormat("  cores busy during the clock: the clients' %.1f", clients);
    if (server >= 0) absl::StrAppend(&s, absl::StrFormat(", the server's %.1f", server));
    if (host >= 0)
      absl::StrAppend(&s, absl::StrFormat(", the host's %.1f of %d (everything on it)", host,
                                          host_cores));
    return s + "\n";
  }
  std::string Json() const {
    std::string s = absl::StrFormat("\"client_cores\":%.2f", clients);
    if (server >= 0) absl::StrAppend(&s, absl::StrFormat(",\"server_cores\":%.2f", server));
    if (host >= 0) absl::StrAppend(&s, absl::StrFormat(",\"host_cores\":%.2f", host));
    return s;
  }
};

CoresBusy Between(const CpuSample& a, const CpuSample& b) {
  CoresBusy c;
  const double wall = std::chrono::duration<double>(b.at - a.at).count();
  if (wall <= 0) return c;
  c.clients = (b.clients_s - a.clients_s) / wall;
  if (a.server_s >= 0 && b.server_s >= 0) c.server = (b.server_s - a.server_s) / wall;
  if (a.host_total >= 0 && b.host_total > a.host_total) {
    c.host_cores = b.host_cores;
    c.host = double(b.host_cores) * (b.host_busy - a.host_busy) / (b.host_total - a.host_total);
  }
  return c;
}

int Drive(const Client::Options& client_options, const BenchOptions& o, Workload& w) {
  const int64_t values = w.values();
  const bool solves = o.mode != "info" && o.mode != "health";
  Tally tally;
  std::atomic<bool> failed_setup{false};
  // The clock runs from the moment every client has set up (its connection, its shared
  // memory, its system) until the last one has its last answer: setup and teardown (releasing
  // the system, unregistering the memory: the server unpins it, tens of milliseconds for a
  // large region) happen once a client, not a request.
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
    std::lock_guard<std::mutex> lock(tally.mu);
    std::cerr << "bench: " << what << ": " << st << "\n";
    failed_setup = true;
  };

  auto client_loop = [&](int id) {
    Arrive arrive{&ready};
    Client::Options co = client_options;
    co.own_connection = true;  // one connection a client, as separate processes would have
    co.transport = TransportOf(o.transport);
    Client client(co);
    JobOptions jo = w.options();
    std::unique_ptr<ClientWork> work = w.ForClient(id);
    const int nrhs = int(work->rhs.size());
    // shm: every array in the client's registered memory (filled once, before the clock, as a
    // simulation that keeps them there would), x written there too; otherwise x into arrays of
    // the client's own (--x-out) or in the answer. The stream keeps two steps in flight: the
    // second x area is the one in flight's.
    std::unique_ptr<SharedMemory> shm;
    double *x_area = nullptr, *x_area2 = nullptr;
    std::vector<double> own_x, own_x2;
    if (ArraysInSharedMemory(o)) {
      int64_t bytes = 2 * (values * 8 + 256);
      for (auto& [name, v] : work->coefficients) bytes += v.elements() * 8 + 256;
      for (auto& v : work->rhs) bytes += v.elements() * 8 + 256;
      auto made = SharedMemory::Create(bytes);
      absl::Status st = made.ok() ? absl::OkStatus() : made.status();
      if (st.ok()) {
        shm = *std::move(made);
        auto place = [&](ArrayView& v) {
          double* p = *shm->Allocate<double>(v.elements());
          std::memcpy(p, v.data, size_t(v.elements()) * 8);
          v.data = p;
        };
        for (auto& [name, v] : work->coefficients) place(v);
        for (auto& v : work->rhs) place(v);
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
    auto job_of = [&](const ArrayView* rhs) {
      Job job{w.kind()};
      for (auto& [name, v] : work->coefficients) job.arrays[name] = v;
      if (rhs != nullptr) job.arrays[work->rhs_name] = *rhs;
      job.options = jo;
      return job;
    };
    std::string handle;
    std::unique_ptr<StepStream> stream;
    if (o.mode == "handle" || o.mode == "stream") {
      // The server prepares the system once (factors, a multigrid hierarchy).
      auto made = client.CreateSystem(job_of(nullptr),
                                      {.ttl_s = 600, .label = absl::StrCat(w.family(), "-", id)});
      if (!made.ok()) return setup_failed("CreateSystem", made.status());
      handle = made->handle;
      if (o.mode == "stream") {
        auto st = client.OpenStepStream(handle, jo);
        if (!st.ok()) return setup_failed("OpenStepStream", st.status());
        stream = *std::move(st);
      }
    }
    if (o.mode == "unary" || !solves) (void)client.Info();  // the connection up before the clock
    // One solve before the clock, not counted: what a client sets up once (a request ring and
    // its region, a staging region, the first touch of x) is not a request's cost.
    if (o.mode == "unary") (void)client.Solve(job_of(&work->rhs[0]));
    if (o.mode == "handle") (void)client.SolveSystem(handle, work->rhs[0], {}, jo);
    arrive();
    go.wait();

    std::vector<double> local_lat;
    Timings local_server;
    std::map<std::string, int64_t> local_err, local_not_ok;
    std::map<std::string, std::string> local_first;
    int64_t local_batched = 0, local_batched_with = 0, answers_seen = 0, local_checked = 0;
    double local_check_us = 0, local_call_us = 0;  // the client's own account
    auto error = [&](const absl::Status& st) {
      const std::string code(absl::StatusCodeToString(st.code()));
      local_err[code]++;
      local_first.emplace(code, std::string(st.message().substr(0, 200)));
    };
    auto accept = [&](const Summary& summary, double us) {
      ++tally.ok;
      local_lat.push_back(us);
      work->Accepted(summary);
      for (int p = tally.most_pieces.load();
           summary.pieces > p && !tally.most_pieces.compare_exchange_weak(p, summary.pieces);) {
      }
      if (summary.batched_with > 1) {
        ++local_batched;
        local_batched_with += summary.batched_with;
      }
      AddTimings(summary.timings, &local_server);
    };
    auto check = [&](const absl::StatusOr<Result>& r, int k, double us, const double* x_own) {
      if (!r.ok()) return error(r.status());
      local_call_us += us;
      if (r->x.elements() != values || r->x.dtype != DType::kFloat64 ||
          int64_t(r->status.size()) != w.systems() ||
          (x_own == nullptr && int64_t(r->x.data.size()) != values * 8)) {
        ++tally.lost;
        return;
      }
      // Every answer's statuses; its values for the first and every check_every-th answer.
      const auto bad = std::find_if(r->status.begin(), r->status.end(),
                                    [](SolveStatus s) { return s != SolveStatus::kOk; });
      if (bad != r->status.end()) {
        if (!w.CountsNotOk()) {
          ++tally.wrong;
          return;
        }
        ++tally.not_ok;
        local_not_ok[std::string(SolveStatusName(*bad))]++;
        return;
      }
      const bool first = answers_seen == 0;
      if (answers_seen++ % o.check_every == 0) {
        ++local_checked;
        const auto c0 = Clock::now();
        const bool right = work->Check(k, x_own != nullptr ? x_own : r->x.as<double>(), first);
        local_check_us += Micros(c0);
        if (!right) {
          ++tally.wrong;
          return;
        }
      }
      accept(r->summary, us);
    };
    for (int64_t q = 0; q < o.requests; ++q) {
      const int k = int(q % nrhs);
      if (q > 0 && o.pause_ms > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(int64_t(o.pause_ms * 1e3)));
      const auto t0 = Clock::now();
      if (!solves) {
        // The floor: the cheapest calls the server answers, over the same connection.
        absl::Status st;
        if (o.mode == "info") {
          auto r = client.Info();
          st = r.ok() ? absl::OkStatus() : r.status();
        } else {
          auto r = client.Health();
          st = !r.ok()           ? r.status()
               : *r == "SERVING" ? absl::OkStatus()
                                 : absl::UnavailableError(*r);
        }
        if (!st.ok()) {
          error(st);
        } else {
          ++tally.ok;
          local_lat.push_back(Micros(t0));
        }
      } else if (o.mode == "unary") {
        auto r = client.Solve(job_of(&work->rhs[size_t(k)]));
        check(r, k, Micros(t0), x_area);
      } else if (o.mode == "handle") {
        auto r = client.SolveSystem(handle, work->rhs[size_t(k)], {}, jo);
        check(r, k, Micros(t0), x_area);
      } else {
        double* xq = q % 2 == 0 ? x_area : x_area2;
        if (auto st = stream->Send(work->rhs[size_t(k)], {}, xq); !st.ok()) {
          error(st);
          break;
        }
        if (q >= 1) {
          auto r = stream->Receive();
          check(r, int((q - 1) % nrhs), r.ok() ? r->summary.timings.client_total_us : 0,
                (q - 1) % 2 == 0 ? x_area : x_area2);
        }
      }
    }
    if (stream) {
      auto r = stream->Receive();
      check(r, int((o.requests - 1) % nrhs), r.ok() ? r->summary.timings.client_total_us : 0,
            (o.requests - 1) % 2 == 0 ? x_area : x_area2);
      if (auto st = stream->Finish(); !st.ok()) error(st);
    }
    const auto answered = Clock::now();
    if (!handle.empty()) (void)client.ReleaseSystem(handle);
    if (shm) (void)client.UnregisterMemory(*shm);
    std::lock_guard<std::mutex> lock(tally.mu);
    tally.last_answer = std::max(tally.last_answer, answered);
    tally.latency_us.insert(tally.latency_us.end(), local_lat.begin(), local_lat.end());
    if (solves) tally.server_n += int64_t(local_lat.size());
    AddTimings(local_server, &tally.server);
    tally.check_us += local_check_us;
    tally.checked += local_checked;
    tally.call_us += local_call_us;
    tally.batched += local_batched;
    tally.batched_with += local_batched_with;
    for (auto& [k, v] : local_err) tally.errors[k] += v;
    for (auto& [k, v] : local_not_ok) tally.not_ok_by[k] += v;
    for (auto& [k, v] : local_first) tally.first_error.emplace(k, v);
    w.Merge(*work);
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < o.clients; ++i) threads.emplace_back(client_loop, i);
  ready.wait();
  Client observer(client_options);  // reads the server's CPU time at the clock's ends
  const CpuSample cpu0 = SampleCpu(observer);
  const auto t0 = Clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  const CoresBusy cores = Between(cpu0, SampleCpu(observer));
  const double wall = std::chrono::duration<double>(std::max(tally.last_answer, t0) - t0).count();
  const double local_s = w.LocalSeconds(o);

  const int64_t ok = tally.ok, wrong = tally.wrong, lost = tally.lost, not_ok = tally.not_ok;
  const int64_t total = int64_t(o.clients) * o.requests;
  int64_t errs = 0;
  for (auto& [k, v] : tally.errors) errs += v;
  const int64_t answered = ok + wrong + lost + not_ok;
  const double bytes_per = solves ? w.PayloadBytes(o.mode) : 0;
  std::vector<double> lat = tally.latency_us;
  const double p50 = Percentile(lat, 0.5), p90 = Percentile(lat, 0.9), p99 = Percentile(lat, 0.99);
  const int dec = w.RateDecimals();
  std::cout << w.Header(o, bytes_per);
  if (o.pause_ms > 0)
    std::cout << absl::StrFormat(
        "  each client idles %.3f ms before each request after its first\n", o.pause_ms);
  std::cout << absl::StrFormat("  %-24s %12s %10s %10s %10s %10s\n", "", "requests/s", "p50 ms",
                               "p90 ms", "p99 ms", "GB/s");
  std::cout << absl::StrFormat("  %-24s %12.*f %10.3f %10.3f %10.3f %10.3f\n", "trisolve", dec,
                               double(ok) / wall, p50 / 1e3, p90 / 1e3, p99 / 1e3,
                               double(ok) * bytes_per / wall / 1e9);
  std::cout << absl::StrFormat("  %-24s %12.*f %10.3f %10s %10s %10s\n", w.LocalLabel(), dec,
                               1 / local_s, local_s * 1e3, "-", "-", "-");
  w.ExtraLines(tally);
  std::cout << cores.Line();
  const Timings& s = tally.server;
  if (solves && tally.server_n > 0) {
    const double k = 1e3 * double(tally.server_n);
    std::cout << absl::StrFormat(
        "  server, mean ms: receive+check %.3f, queue %.3f, h2d %.3f, compute %.3f, d2h %.3f, "
        "%stotal %.3f\n",
        s.receive_us / k, s.queue_us / k, s.h2d_us / k, s.compute_us / k, s.d2h_us / k,
        w.options().skip_residual ? "" : absl::StrFormat("residual %.3f, ", s.residual_us / k),
        s.server_total_us / k);
    if (s.upload_us > 0)
      std::cout << absl::StrFormat("  client, mean ms: upload %.3f, download %.3f\n",
                                   s.upload_us / k, s.download_us / k);
    // What a client's requests took on average, its check of each answer, and the whole cycle
    // (clients x wall / answers): where call + check falls short of the cycle, the client's
    // threads waited on something else (the machine's cores, its memory).
    std::cout << absl::StrFormat("  client, mean ms: call %.3f, check %.3f, cycle %.3f\n",
                                 tally.call_us / k, tally.check_us / k,
                                 1e3 * wall * double(o.clients) / double(tally.server_n));
  }
  if (tally.batched > 0)
    std::cout << absl::StrFormat(
        "  batched by the server: %d of %d answers (%.1f%%), in backend calls of %.1f requests "
        "on average\n",
        tally.batched, ok, 100.0 * double(tally.batched) / double(std::max<int64_t>(1, ok)),
        double(tally.batched_with) / double(tally.batched));
  std::cout << absl::StrFormat(
      "  answers: %d ok, %d wrong (%s), %s%d malformed, %d errors, %d not answered of %d; %s\n", ok,
      wrong, w.WrongMeaning(),
      w.CountsNotOk() ? absl::StrFormat("%d not ok (the server's status), ", not_ok) : "", lost,
      errs, total - answered - errs, total, w.WorstLine());
  if (solves && o.check_every > 1)
    std::cout << absl::StrFormat(
        "  %s checked: %d answers (each client's first and every %d-th); the statuses of all\n",
        w.CheckedNoun(), tally.checked, o.check_every);
  for (auto& [k, v] : tally.not_ok_by) std::cout << "  not ok " << k << ": " << v << "\n";
  for (auto& [k, v] : tally.errors)
    std::cout << "  error " << k << ": " << v << " (the first: " << tally.first_error[k] << ")\n";
  if (o.json) {
    const double n = double(std::max<int64_t>(tally.server_n, 1));
    std::cout << absl::StrFormat(
        "{\"family\":\"%s\",\"mode\":\"%s\",\"transport\":\"%s\",\"clients\":%d,"
        "\"requests\":%d,%s,\"ok\":%d,\"wrong\":%d,%s\"errors\":%d,\"requests_per_s\":%.3f,"
        "\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,\"payload_gb_s\":%.4f,"
        "\"local_ms\":%.4f,\"local_per_s\":%.3f,%s,\"server_total_ms\":%.4f,%s,\"checked\":%d,"
        "%s}\n",
        w.family(), o.mode, o.transport, o.clients, o.requests, w.JsonShape(), ok, wrong,
        w.CountsNotOk() ? absl::StrFormat("\"not_ok\":%d,", not_ok) : "", errs, double(ok) / wall,
        p50 / 1e3, p90 / 1e3, p99 / 1e3, double(ok) * bytes_per / wall / 1e9, local_s * 1e3,
        1 / local_s, w.JsonTail(tally), s.server_total_us / 1e3 / n, w.JsonEnd(tally),
        tally.checked, cores.Json());
  }
  if (failed_setup) return 1;
  return ok == total ? 0 : 1;
}

// ---- tridiagonal: --batch diagonally dominant systems of --n unknowns -------------------------

class TridiagonalWork final : public ClientWork {
 public:
  TridiagonalWork(const Matrix& m, int64_t batch, int64_t n) : m_(m), batch_(batch), n_(n) {}
  // The matrices are well conditioned (|b| >= 3, |a| + |c| <= 2): a forward error of 1e-12 is
  // far above rounding and far below any wrong answer. Against one local core's x (two arrays
  // read a check, where the residual reads five: at 16 clients of 2048 x 1024 on the lent
  // 2 x H200 host the residual bound the bench, not the server); the first answer also by its
  // backward error.
  bool Check(int k, const double* x, bool first) override {
    const double e = MaxRelativeDifference(x, expect[size_t(k)].data(), batch_, n_);
    if (first && e <= 1e-12)
      worst = std::max(worst, BackwardError(m_, d[size_t(k)], x, batch_, n_));
    return e <= 1e-12;
  }
  std::vector<const double*> d;  // the original right-hand sides
  std::vector<std::vector<double>> expect;
  double worst = 0;

 private:
  const Matrix& m_;
  const int64_t batch_, n_;
};

// A batch of `batch` systems of n unknowns each (tridiagonal, dense): one status a system,
// answers checked by their values against one local core's, the server's residual skipped.
class BatchWorkload : public Workload {
 public:
  explicit BatchWorkload(const BenchOptions& o) : o_(o) {}
  int64_t values() const override { return o_.batch * o_.n; }
  int64_t systems() const override { return o_.batch; }
  JobOptions options() const override {
    JobOptions jo;
    jo.skip_residual = true;  // the bench checks every answer itself
    return jo;
  }
  std::string CheckedNoun() const override { return "values"; }
  std::string JsonShape() const override {
    return absl::StrFormat("\"batch\":%d,\"n\":%d,\"shape\":\"%dx%d\"", o_.batch, o_.n, o_.batch,
                           o_.n);
  }

 protected:
  const BenchOptions& o_;
};

class TridiagonalWorkload final : public BatchWorkload {
 public:
  // Right-hand sides: a few distinct ones per client, so that an answer given to the wrong
  // request shows as a large error.
  static constexpr int kRhs = 4;
  explicit TridiagonalWorkload(const BenchOptions& o)
      : BatchWorkload(o), m_(MakeMatrix(o.batch, o.n, 7)), rhs_(size_t(o.clients) * kRhs) {
    for (size_t i = 0; i < rhs_.size(); ++i) rhs_[i] = UniformValues(values(), 1000 + i);
    shape_ = o.batch == 1 ? std::vector<int64_t>{o.n} : std::vector<int64_t>{o.batch, o.n};
  }
  const char* family() const override { return "tridiagonal"; }
  Kind kind() const override { return Kind::kTridiagonal; }
  std::unique_ptr<ClientWork> ForClient(int id) const override {
    auto w = std::make_unique<TridiagonalWork>(m_, o_.batch, o_.n);
    auto view = [&](const double* p) { return ArrayView{DType::kFloat64, shape_, p}; };
    w->coefficients = {
        {"a", view(m_.a.data())}, {"b", view(m_.b.data())}, {"c", view(m_.c.data())}};
    w->rhs_name = "d";
    // Each right-hand side's answer on this core, before the clock starts.
    std::vector<double> cp;
    for (int k = 0; k < kRhs; ++k) {
      const double* d = rhs_[size_t(id * kRhs + k)].data();
      w->rhs.push_back(view(d));
      w->d.push_back(d);
      w->expect.emplace_back(size_t(values()));
      Thomas(m_, d, w->expect.back().data(), o_.batch, o_.n, cp);
    }
    return w;
  }
  void Merge(ClientWork& w) override {
    worst_ = std::max(worst_, static_cast<TridiagonalWork&>(w).worst);
  }
  // unary: a, b, c, d in and x out; by handle: d and x.
  double PayloadBytes(const std::string& mode) const override {
    return double(values()) * 8 * (mode == "unary" ? 5 : 2);
  }
  // The same systems, the same number of solves per client (up to 200), serially.
  double LocalSeconds(const BenchOptions& o) override {
    std::vector<double> x(static_cast<size_t>(values())), cp;
    const int64_t reps = std::max<int64_t>(1, std::min<int64_t>(o.requests, 200));
    const auto l0 = Clock::now();
    for (int64_t q = 0; q < reps; ++q)
      Thomas(m_, rhs_[size_t(q % kRhs)].data(), x.data(), o.batch, o.n, cp);
    return std::chrono::duration<double>(Clock::now() - l0).count() / double(reps);
  }
  // A server's status other than ok is a wrong answer here (the JSON line has no not_ok: the
  // scripts read "wrong":0,"errors":0 as a clean run).
  bool CountsNotOk() const override { return false; }
  int RateDecimals() const override { return 1; }
  std::string Header(const BenchOptions& o, double bytes_per) const override {
    if (o.mode == "info" || o.mode == "health")
      return absl::StrFormat(
          "bench %s (%s, no solve): %d clients x %d requests; the local core: %d x %d float64\n",
          o.mode, o.mode == "info" ? "GetServerInfo" : "the health check", o.clients, o.requests,
          o.batch, o.n);
    return absl::StrFormat(
        "bench tridiagonal %s over %s: %d clients x %d requests, %d x %d float64 (%.1f MB a "
        "request)\n",
        o.mode, o.transport, o.clients, o.requests, o.batch, o.n, bytes_per / 1e6);
  }
  std::string LocalLabel() const override { return "one local core (Thomas)"; }
  std::string WrongMeaning() const override { return "x more than 1e-12 from one local core's"; }
  std::string WorstLine() const override {
    return absl::StrFormat("worst backward error %.2e (each client's first answer)", worst_);
  }
  std::string JsonTail(const Tally& t) const override {
    const double n = double(std::max<int64_t>(t.server_n, 1));
    return absl::StrFormat(
        "\"worst_backward_error\":%.3e,\"batched\":%d,\"upload_ms\":%.4f,\"download_ms\":%.4f",
        worst_, t.batched, t.server.upload_us / 1e3 / n, t.server.download_us / 1e3 / n);
  }
  std::string JsonEnd(const Tally& t) const override {
    return absl::StrFormat("\"pieces\":%d", t.most_pieces.load());
  }

 private:
  const Matrix m_;
  std::vector<std::vector<double>> rhs_;
  std::vector<int64_t> shape_;
  double worst_ = 0;
};

// ---- block: a 2D grid's block-tridiagonal system, solved iteratively --------------------------

static constexpr std::array<const char*, 5> kCoefficients = {"aC", "cC", "bC", "cA", "cB"};

class BlockWork final : public ClientWork {
 public:
  BlockWork(int64_t N, int64_t M, const std::array<const double*, 5>& c, double norm_a, double tol)
      : N_(N), M_(M), c_(c), norm_a_(norm_a), tol_(tol) {}
  // ||f - A y||_2 / ||f||_2 from the original arrays, held to the server's own tolerance.
  bool Check(int k, const double* y, bool) override {
    const BlockResidual res = BlockTridiagonalResidual(N_, M_, c_[0], c_[1], c_[2], c_[3], c_[4],
                                                       norm_a_, f[size_t(k)].data(), y);
    worst = std::max(worst, res.residual);
    return res.residual <= tol_ + res.rounding;
  }
  void Accepted(const Summary& s) override {
    methods.insert(s.method);
    iterations += s.iterations;
    iterations_max = std::max(iterations_max, s.iterations);
    ++accepted;
  }
  std::vector<std::vector<double>> f;
  double worst = 0;
  std::set<std::string> methods;
  int64_t iterations = 0, iterations_max = 0, accepted = 0;

 private:
  const int64_t N_, M_;
  const std::array<const double*, 5> c_;
  const double norm_a_, tol_;
};

class BlockWorkload final : public Workload {
 public:
  // A few right-hand sides of each client's own, so that an answer to another request shows as
  // a residual of order one.
  static constexpr int kRhs = 3;
  BlockWorkload(const BenchOptions& o, BlockMethod method)
      : o_(o),
        method_(method),
        // The thesis' experiment 2: symmetric positive definite, so that auto takes
        // multigrid-cg on the server and on the local core alike; its iterations stay at 12-13
        // for every N = M.
        ex_(examples::ThesisExperiment2(o.N, o.M)) {
    for (size_t i = 0; i < kCoefficients.size(); ++i)
      coeff_[i] = ex_[kCoefficients[i]].as<double>();
    norm_a_ = BlockTridiagonalNorm(o.N, o.M, coeff_[0], coeff_[1], coeff_[2], coeff_[3], coeff_[4]);
  }
  const char* family() const override { return "block"; }
  Kind kind() const override { return Kind::kBlockTridiagonal; }
  int64_t values() const override { return o_.N * o_.M; }
  int64_t systems() const override { return 1; }
  JobOptions options() const override {
    JobOptions jo;
    jo.method = o_.method;
    jo.tol = o_.tol;
    return jo;
  }
  static std::vector<double> Rhs(int id, int k, int64_t values) {
    return UniformValues(values, 5000 + uint64_t(id) * kRhs + uint64_t(k));
  }
  std::unique_ptr<ClientWork> ForClient(int id) const override {
    auto w = std::make_unique<BlockWork>(o_.N, o_.M, coeff_, norm_a_, o_.tol);
    const std::vector<int64_t> shape = {o_.N, o_.M};
    auto view = [&](const double* p) { return ArrayView{DType::kFloat64, shape, p}; };
    for (size_t i = 0; i < kCoefficients.size(); ++i)
      w->coefficients.emplace_back(kCoefficients[i], view(coeff_[i]));
    w->rhs_name = "f";
    for (int k = 0; k < kRhs; ++k) w->f.push_back(Rhs(id, k, values()));
    for (auto& f : w->f) w->rhs.push_back(view(f.data()));
    return w;
  }
  void Merge(ClientWork& cw) override {
    auto& w = static_cast<BlockWork&>(cw);
    worst_ = std::max(worst_, w.worst);
    methods_.insert(w.methods.begin(), w.methods.end());
    iterations_ += w.iterations;
    iterations_max_ = std::max(iterations_max_, w.iterations_max);
    accepted_ += w.accepted;
  }
  // unary: five coefficient arrays and f in, y out; by handle f in and y out.
  double PayloadBytes(const std::string& mode) const override {
    return double(values()) * 8 * (mode == "unary" ? 7 : 2);
  }
  // The CPU reference (what the server's CPU backend runs), the same method and tolerance, on
  // one thread: up to 3 solves, none started after the first second (a 1024 x 1024 solve takes
  // ~0.6 s: the multi-GPU script runs dozens of these benches).
  double LocalSeconds(const BenchOptions& o) override {
    omp_set_num_threads(1);
    std::vector<double> y(static_cast<size_t>(values()));
    const std::vector<double> f0 = Rhs(0, 0, values());  // client 0's first right-hand side
    BlockTridiagonalProblem<double> p;
    p.N = o.N;
    p.M = o.M;
    p.aC = coeff_[0];
    p.cC = coeff_[1];
    p.bC = coeff_[2];
    p.cA = coeff_[3];
    p.cB = coeff_[4];
    p.f = f0.data();
    BlockOptions bopt;
    bopt.tol = o.tol;
    SystemStatus status = SystemStatus::kOk;
    int64_t reps = 0;
    const auto l0 = Clock::now();
    double local_s = NAN;
    do {
      auto info = cpu::SolveBlockTridiagonal<double>(p, method_, bopt, {y.data(), &status});
      if (!info.ok()) {
        local_method_ = absl::StrCat("(", info.status().message(), ")");
        break;
      }
      local_method_ = info->method;
      local_iterations_ = info->iterations;
      ++reps;
      local_s = std::chrono::duration<double>(Clock::now() - l0).count() / double(reps);
    } while (reps < std::min<int64_t>(o.requests, 3) &&
             std::chrono::duration<double>(Clock::now() - l0).count() < 1);
    local_residual_ = reps > 0 ? BlockTridiagonalResidual(o.N, o.M, p.aC, p.cC, p.bC, p.cA, p.cB,
                                                          norm_a_, f0.data(), y.data())
                                     .residual
                               : NAN;
    return local_s;
  }
  std::string Header(const BenchOptions& o, double bytes_per) const override {
    return absl::StrFormat(
        "bench block-tridiagonal %s over %s: %d clients x %d requests, N x M = %d x %d float64 "
        "(the thesis' experiment 2), --method %s, tol %.1e (%.1f MB a request)\n",
        o.mode, o.transport, o.clients, o.requests, o.N, o.M, o.method, o.tol, bytes_per / 1e6);
  }
  std::string LocalLabel() const override { return "one local core (ref.)"; }
  void ExtraLines(const Tally&) const override {
    const std::string seen = absl::StrJoin(methods_, ", ");
    std::cout << absl::StrFormat(
        "  the server ran %s, %.1f iterations a request on average (at most %d); the local core "
        "%s, %d iterations, residual %.2e\n",
        seen.empty() ? "-" : seen, double(iterations_) / double(std::max<int64_t>(accepted_, 1)),
        iterations_max_, local_method_, local_iterations_, local_residual_);
  }
  std::string WrongMeaning() const override { return "||f - A y||_2 / ||f||_2 over tol"; }
  std::string WorstLine() const override { return absl::StrFormat("worst residual %.2e", worst_); }
  std::string CheckedNoun() const override { return "residuals"; }
  std::string JsonShape() const override {
    return absl::StrFormat("\"N\":%d,\"M\":%d,\"shape\":\"%dx%d\",\"tol\":%.1e", o_.N, o_.M, o_.N,
                           o_.M, o_.tol);
  }
  std::string JsonTail(const Tally&) const override {
    return absl::StrFormat("\"worst_residual\":%.3e,\"iterations\":%.2f", worst_,
                           double(iterations_) / double(std::max<int64_t>(accepted_, 1)));
  }
  std::string JsonEnd(const Tally& t) const override {
    return absl::StrFormat("\"compute_ms\":%.4f",
                           t.server.compute_us / 1e3 / double(std::max<int64_t>(t.server_n, 1)));
  }

 private:
  const BenchOptions& o_;
  const BlockMethod method_;
  examples::Arrays ex_;
  std::array<const double*, 5> coeff_{};
  double norm_a_ = 0, worst_ = 0;
  std::set<std::string> methods_;
  int64_t iterations_ = 0, iterations_max_ = 0, accepted_ = 0;
  std::string local_method_ = "(failed)";
  int64_t local_iterations_ = 0;
  double local_residual_ = NAN;
};

// ---- dense: --batch matrices of order --n, LU on the server and on the local core ------------

class DenseWork final : public ClientWork {
 public:
  DenseWork(const DenseBatch& m, DenseTolerance tol) : m_(m), tol_(tol) {}
  // Against the local core's x for the same right-hand side; the client's first answer also by
  // its own normwise backward error.
  bool Check(int k, const double* x, bool first) override {
    const double e = MaxRelativeDifference(x, expect[size_t(k)].data(), m_.batch, m_.n);
    worst_forward = std::max(worst_forward, e);
    if (!(e <= tol_.forward)) return false;
    if (first) {
      const double eta =
          DenseNormwiseBackwardError(m_.A.data(), b[size_t(k)].data(), x, m_.batch, m_.n);
      worst_backward = std::max(worst_backward, eta);
      return eta <= tol_.backward;
    }
    return true;
  }
  std::vector<std::vector<double>> b, expect;
  double worst_forward = 0, worst_backward = 0;

 private:
  const DenseBatch& m_;
  const DenseTolerance tol_;
};

class DenseWorkload final : public BatchWorkload {
 public:
  static constexpr int kRhs = 3;
  explicit DenseWorkload(const BenchOptions& o)
      : BatchWorkload(o),
        m_(MakeDenseBatch(o.batch, o.n, 17)),
        tol_(DenseCheckTolerance(o.n, m_.kappa_bound)),
        // LU with partial pivoting, as getrf / getrs (what the GPU backend runs for n > 64),
        // on every core here, once: each client's expected answers before the clock.
        factors_(cpu::FactorDense<double>(o.batch, o.n, m_.A.data(), DenseMethod::kLu)) {
    rhs_.resize(size_t(o.clients) * kRhs);
    expect_.resize(rhs_.size());
    std::vector<SystemStatus> status(static_cast<size_t>(o.batch));
    for (size_t i = 0; i < rhs_.size(); ++i) {
      rhs_[i] = UniformValues(values(), 9000 + i);
      expect_[i].resize(size_t(values()));
      cpu::SolveFactored(factors_, rhs_[i].data(), expect_[i].data(), status.data());
    }
  }
  const char* family() const override { return "dense"; }
  Kind kind() const override { return Kind::kDense; }
  std::unique_ptr<ClientWork> ForClient(int id) const override {
    auto w = std::make_unique<DenseWork>(m_, tol_);
    w->coefficients = {{"A", ArrayView{DType::kFloat64, {o_.batch, o_.n, o_.n}, m_.A.data()}}};
    w->rhs_name = "b";
    for (int k = 0; k < kRhs; ++k) {
      w->b.push_back(rhs_[size_t(id * kRhs + k)]);
      w->expect.push_back(expect_[size_t(id * kRhs + k)]);
    }
    for (auto& b : w->b) w->rhs.push_back(ArrayView{DType::kFloat64, {o_.batch, o_.n}, b.data()});
    return w;
  }
  void Merge(ClientWork& cw) override {
    auto& w = static_cast<DenseWork&>(cw);
    worst_forward_ = std::max(worst_forward_, w.worst_forward);
    worst_backward_ = std::max(worst_backward_, w.worst_backward);
  }
  // unary: A and b in, x out; by handle (the factors kept on the server): b in, x out.
  double PayloadBytes(const std::string& mode) const override {
    return double(values()) * 8 * (mode == "unary" ? double(o_.n) + 2 : 2);
  }
  // The CPU reference's LU on one thread: unary factors and solves each request, by handle the
  // factors are kept and a request is the solve alone. Up to 200 requests, none started after
  // the first second (a 16 x 1024 factorisation takes seconds here).
  double LocalSeconds(const BenchOptions& o) override {
    omp_set_num_threads(1);
    std::vector<double> x(static_cast<size_t>(values()));
    std::vector<SystemStatus> status(static_cast<size_t>(o.batch));
    int64_t reps = 0;
    const auto l0 = Clock::now();
    do {
      const double* b = rhs_[size_t(reps % kRhs)].data();
      if (o.mode == "unary") {
        // Factor and solve in one pass, each matrix's factors in a scratch of n x n (what a
        // user's code would do): FactorDense keeps all of them, batch x n x n written out,
        // 2.4x slower at 64 x 256 on the development VM.
        cpu::SolveDense<double>({o.batch, o.n, m_.A.data(), b}, DenseMethod::kLu,
                                {x.data(), status.data()});
      } else {
        cpu::SolveFactored(factors_, b, x.data(), status.data());
      }
      ++reps;
    } while (reps < std::min<int64_t>(o.requests, 200) &&
             std::chrono::duration<double>(Clock::now() - l0).count() < 1);
    return std::chrono::duration<double>(Clock::now() - l0).count() / double(reps);
  }
  std::string Header(const BenchOptions& o, double bytes_per) const override {
    return absl::StrFormat(
        "bench dense %s over %s: %d clients x %d requests, %d matrices of order %d float64 (rows "
        "diagonally dominant, kappa_inf <= %.2f; %.1f MB a request)\n",
        o.mode, o.transport, o.clients, o.requests, o.batch, o.n, m_.kappa_bound, bytes_per / 1e6);
  }
  std::string LocalLabel() const override {
    return o_.mode == "unary" ? "one local core (LU)" : "one local core (LU solve)";
  }
  std::string WrongMeaning() const override {
    return absl::StrFormat(
        "x more than %.1e from one local core's, or a first answer's backward error over %.1e",
        tol_.forward, tol_.backward);
  }
  std::string WorstLine() const override {
    return absl::StrFormat(
        "worst forward difference %.2e, worst backward error %.2e (each client's first answer)",
        worst_forward_, worst_backward_);
  }
  std::string JsonTail(const Tally&) const override {
    return absl::StrFormat(
        "\"worst_backward_error\":%.3e,\"worst_forward_error\":%.3e,\"kappa_bound\":%.3f",
        worst_backward_, worst_forward_, m_.kappa_bound);
  }
  std::string JsonEnd(const Tally& t) const override {
    return absl::StrFormat("\"compute_ms\":%.4f",
                           t.server.compute_us / 1e3 / double(std::max<int64_t>(t.server_n, 1)));
  }

 private:
  const DenseBatch m_;
  const DenseTolerance tol_;
  const cpu::DenseFactors<double> factors_;
  std::vector<std::vector<double>> rhs_, expect_;
  double worst_forward_ = 0, worst_backward_ = 0;
};

}  // namespace

int RunBench(const Client::Options& client_options, const BenchOptions& o) {
  if (o.check_every < 1) {
    std::cerr << "bench: --check-every >= 1\n";
    return 2;
  }
  if (o.check_every > 1 && (!o.swc.empty() || o.mode == "info" || o.mode == "health")) {
    std::cerr << "bench: --check-every applies to tridiagonal, block and dense solves, not --swc "
                 "time steps or --mode info/health\n";
    return 2;
  }
  if (o.family == "block") {
    if (o.mode == "info" || o.mode == "health") {
      std::cerr << "bench --family block: --mode unary, handle or stream\n";
      return 2;
    }
    if (o.clients < 1 || o.requests < 1) {
      std::cerr << "bench: --clients, --requests >= 1\n";
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
    BlockWorkload w(o, *method);
    return Drive(client_options, o, w);
  }
  if (o.family == "dense") {
    if (o.mode == "info" || o.mode == "health") {
      std::cerr << "bench --family dense: --mode unary, handle or stream\n";
      return 2;
    }
    // The matrices are held in full, here and in each client's shared memory (shm): 2^31
    // values (16 GiB) is far beyond what a request should be, and keeps batch * n * n in range.
    if (o.clients < 1 || o.requests < 1 || o.batch < 1 || o.n < 1 || o.n > 65536 ||
        double(o.batch) * double(o.n) * double(o.n) > double(int64_t{1} << 31)) {
      std::cerr << "bench --family dense: --clients, --requests, --batch >= 1, 1 <= --n <= 65536 "
                   "and --batch x --n x --n <= 2^31\n";
      return 2;
    }
    // Within the bound, the matrices and their factors (16 bytes a value) may still be more
    // than this host holds: that is an error to report, not a crash.
    std::unique_ptr<DenseWorkload> w;
    try {
      w = std::make_unique<DenseWorkload>(o);
    } catch (const std::bad_alloc&) {
      std::cerr << absl::StrFormat(
          "bench --family dense: %d matrices of order %d and their factors (%.1f GB) do not fit "
          "in this host's memory\n",
          o.batch, o.n, 16e-9 * double(o.batch) * double(o.n) * double(o.n));
      return 1;
    }
    return Drive(client_options, o, *w);
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
  TridiagonalWorkload w(o);
  return Drive(client_options, o, w);
}

std::vector<double> UniformValues(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(count));
  for (double& x : v) x = u(rng);
  return v;
}

// The dense family's systems. Varah's bound: a matrix whose every row is strictly diagonally
// dominant by delta has ||A^-1||_inf <= 1 / delta, so kappa_inf(A) <= ||A||_inf / delta. With
// off-diagonal entries in (-1, 1) (row sums ~ n / 2) and delta = max(1, n / 2), ||A||_inf is
// about 3 n / 2 and kappa_inf about 3, for every n.
DenseBatch MakeDenseBatch(int64_t batch, int64_t n, uint64_t seed) {
  DenseBatch m;
  m.batch = batch;
  m.n = n;
  m.A.resize(size_t(batch * n * n));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const double delta = std::max(1.0, double(n) / 2);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < n; ++i) {
      double* row = m.A.data() + (s * n + i) * n;
      double off = 0;
      for (int64_t j = 0; j < n; ++j) {
        row[j] = j == i ? 0 : u(rng);
        off += std::abs(row[j]);
      }
      row[i] = off + delta;
      m.kappa_bound = std::max(m.kappa_bound, (2 * off + delta) / delta);
    }
  return m;
}

// LU with partial pivoting on a diagonally dominant matrix has growth factor <= 2, so its
// computed x has normwise backward error within a small multiple of n eps (rounding errors
// accumulate over the n terms of each inner product); Gauss-Jordan, which the CPU backend runs,
// is forward stable: its residual carries kappa as well. 8 n eps kappa bounds both with room.
// Two such answers differ by at most 2 kappa eta / (1 - kappa eta) (the forward error bound
// of each, added); an answer to another right-hand side differs by O(1).
DenseTolerance DenseCheckTolerance(int64_t n, double kappa_bound) {
  DenseTolerance t;
  t.backward = 8 * double(n) * std::numeric_limits<double>::epsilon() * kappa_bound;
  t.forward = 2 * kappa_bound * t.backward / (1 - kappa_bound * t.backward);
  return t;
}

double DenseNormwiseBackwardError(const double* A, const double* b, const double* x, int64_t batch,
                                  int64_t n) {
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const double* As = A + s * n * n;
    const double* bs = b + s * n;
    const double* xs = x + s * n;
    double r = 0, an = 0, xn = 0, bn = 0, poison = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double* row = As + i * n;
      double ax = 0, arow = 0;
#pragma omp simd reduction(+ : ax, arow)
      for (int64_t j = 0; j < n; ++j) {
        ax += row[j] * xs[j];
        arow += std::abs(row[j]);
      }
      r = std::max(r, std::abs(bs[i] - ax));
      an = std::max(an, arow);
      xn = std::max(xn, std::abs(xs[i]));
      bn = std::max(bn, std::abs(bs[i]));
      poison += xs[i] * 0;
    }
    // x * 0 sums to NaN for any NaN or infinity in x (std::max would drop a NaN).
    if (!std::isfinite(poison)) return INFINITY;
    const double denom = an * xn + bn;
    worst = std::max(worst, denom > 0 ? r / denom : r);
  }
  return worst;
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
