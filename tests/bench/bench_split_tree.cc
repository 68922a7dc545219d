// One tree (Hines) system through the CUDA backend on one device, and through the multi-device
// backend split by subtrees over D devices (kernels/cpu/tree_split.h), end to end from host
// memory (the arrays in, x out: what the server's backend call does), float64, diagonally
// dominant rows, method auto. Every answer's backward error is computed from the original
// arrays, and the two answers are compared.
//   bench_split_tree [--log2n 24,26] [--reps 5] [--devices D | --list 0,0] [--shape ...]
//                    [--phases 1]
// --phases 1 also runs the split's steps one by one (kernels/cpu/tree_split.h, over a CUDA
// backend a device) and times each: the cut (made once, then kept by the multi-device backend),
// the parts' arrays built, each part prepared on its device, its right-hand sides solved, the
// links' system and x written.
// --list names the split's devices (0,0: two workers on device 0, to check the path on one GPU;
// its times say nothing of two GPUs).
// mixed: each node the next of its parent's cable (70%) or a child of any node before it (30%);
// random: a random recursive tree; chain: one cable.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tree_split.h"  // (the split's steps, for --phases: internal to trisolve_kernels)
#include "split_bench.h"
#include "trisolve/backend.h"
#include "trisolve/tree.h"

namespace {

using namespace trisolve;
using namespace trisolve::bench;

struct Tree {
  int64_t n;
  std::vector<int32_t> parent;
  std::vector<double> lower, upper, diag, rhs;
  TreeProblem<double> P() const {
    TreeProblem<double> p;
    p.batch = 1;
    p.n = n;
    p.parent = parent.data();
    p.lower = lower.data();
    p.upper = upper.data();
    p.diag = diag.data();
    p.rhs = rhs.data();
    return p;
  }
};

Tree Make(int64_t n, const std::string& shape) {
  Tree t{n, std::vector<int32_t>(size_t(n)), std::vector<double>(size_t(n)),
         std::vector<double>(size_t(n)), std::vector<double>(size_t(n)),
         std::vector<double>(size_t(n))};
  std::vector<double> off(size_t(n), 0.0);
  ParallelFor(n, [&](int64_t i0, int64_t i1, int k) {
    std::mt19937_64 rng(uint64_t(k) * 7919 + uint64_t(n));
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = i0; i < i1; ++i) {
      if (i == 0) {
        t.parent[0] = -1;
      } else if (shape == "chain" || (shape == "mixed" && u(rng) < 0.4 /* 70% */)) {
        t.parent[size_t(i)] = int32_t(i - 1);
      } else {
        t.parent[size_t(i)] = int32_t(std::uniform_int_distribution<int64_t>(0, i - 1)(rng));
      }
      t.lower[size_t(i)] = i > 0 ? u(rng) : 0;
      t.upper[size_t(i)] = i > 0 ? u(rng) : 0;
      t.rhs[size_t(i)] = u(rng);
      t.diag[size_t(i)] = 1.5 + 0.5 * u(rng);  // + the row's off-diagonal sum, below
    }
  });
  for (int64_t i = 1; i < n; ++i) {
    off[size_t(i)] += std::abs(t.lower[size_t(i)]);
    off[size_t(t.parent[size_t(i)])] += std::abs(t.upper[size_t(i)]);
  }
  ParallelFor(n, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) t.diag[size_t(i)] += off[size_t(i)];
  });
  return t;
}

Timed Time(Backend& be, const Tree& t, double* x, int reps) {
  return MedianSolve(reps, [&](SystemStatus* st) {
    return be.Solve(t.P(), TreeMethod::kAuto, TreeOutput<double>{x, st}, {});
  });
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// The split's steps one by one over a CUDA backend a device in `list`, timed (medians of reps
// after a warm-up; each step's slowest part).
std::string Phases(const Tree& t, const std::vector<int>& list, int reps) {
  std::vector<std::unique_ptr<Backend>> dev;
  for (int d : list) {
    CudaOptions o;
    o.device = d;
    auto b = MakeCudaBackend(o);
    if (!b.ok()) return "phases: device " + std::to_string(d) + ": " +
                        std::string(b.status().message());
    dev.push_back(*std::move(b));
  }
  const size_t P = list.size();
  auto t0 = Clock::now();
  const TreeCut cut = CutTree(t.parent.data(), t.n, std::vector<double>(P, 1.0), kTreeCutForSpeed);
  const double cut_ms = Ms(t0, Clock::now());
  if (cut.parts == 0) return "phases: no cut";
  std::string parts;
  for (size_t k = 0; k < P; ++k)
    parts += (k ? ", " : "") + std::to_string(cut.nodes[k]) + " nodes x " +
             std::to_string(cut.rhs[k]) + " rhs";
  std::vector<double> build, prepare, solve, join, total;
  std::vector<double> x(static_cast<size_t>(t.n));
  std::string failed;
  for (int r = 0; r <= reps && failed.empty(); ++r) {
    std::vector<Clock::time_point> enter(P), prepared(P), done(P);
    const auto start = Clock::now();
    auto got = SolveTreeSplit<double>(
        t.P(), cut,
        [&](size_t k, const TreeProblem<double>& part, int64_t rhs,
            TreeOutput<double> o) -> absl::StatusOr<SolveInfo> {
          enter[k] = Clock::now();
          SystemSpec spec;
          spec.family = Family::kTree;
          spec.n = part.n;
          spec.coefficients = {part.lower, part.upper, part.diag, part.parent};
          auto system = dev[k]->Prepare(spec);
          if (!system.ok()) return system.status();
          prepared[k] = Clock::now();
          SolveInfo info;
          for (int64_t s = 0; s < rhs; ++s) {
            auto one = dev[k]->SolvePrepared(
                **system, RhsBlock<double>{part.rhs + s * part.n, 1, Layout::kFlat},
                o.x + s * part.n, o.status + s, {});
            if (!one.ok()) return one.status();
            info = *one;
          }
          done[k] = Clock::now();
          return info;
        },
        x.data());
    const auto end = Clock::now();
    if (!got.ok() || !got->solved) {
      failed = got.ok() ? got->why : std::string(got.status().message());
      break;
    }
    if (r == 0) continue;
    double b = 0, p = 0, s = 0;
    auto last = start;
    for (size_t k = 0; k < P; ++k) {
      b = std::max(b, Ms(start, enter[k]));
      p = std::max(p, Ms(enter[k], prepared[k]));
      s = std::max(s, Ms(prepared[k], done[k]));
      last = std::max(last, done[k]);
    }
    build.push_back(b);
    prepare.push_back(p);
    solve.push_back(s);
    join.push_back(Ms(last, end));
    total.push_back(Ms(start, end));
  }
  if (!failed.empty()) return "phases: " + failed;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "phases (2^%d; %s): cut %.1f ms (once); build %.1f, prepare %.1f, solves %.1f, "
                "links and x %.1f, total %.1f ms",
                int(std::lround(std::log2(double(t.n)))), parts.c_str(), cut_ms, Median(build),
                Median(prepare), Median(solve), Median(join), Median(total));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> log2n = {24, 26};
  int reps = 5, devices = CudaDeviceCount();
  std::string shape = "mixed";
  std::vector<int> list;
  bool phases = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--log2n") log2n = Ints(argv[i + 1]);
    else if (k == "--reps") reps = std::atoi(argv[i + 1]);
    else if (k == "--devices") devices = std::atoi(argv[i + 1]);
    else if (k == "--shape") shape = argv[i + 1];
    else if (k == "--list") list = Ints(argv[i + 1]);
    else if (k == "--phases") phases = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (shape != "mixed" && shape != "random" && shape != "chain") {
    std::fprintf(stderr, "--shape: mixed, random or chain\n");
    return 2;
  }
  if (list.empty()) {
    if (devices < 2) {
      std::printf("bench_split_tree: %d CUDA device(s); two or more are needed (or --list 0,0): "
                  "skipped\n",
                  devices);
      return 0;
    }
    for (int d = 0; d < devices; ++d) list.push_back(d);
  }
  devices = int(list.size());
  auto one = MakeCudaBackend();
  PlacementOptions placement;  // a split for speed, which trisolved does not ask for (backend.h)
  placement.split_tree_nodes = 1;
  auto many = MakeMultiDeviceCudaBackend(list, {}, placement);
  if (!one.ok() || !many.ok()) {
    std::fprintf(stderr, "backends: %s / %s\n", std::string(one.status().message()).c_str(),
                 std::string(many.status().message()).c_str());
    return 1;
  }
  const BackendInfo info = (*one)->Info();
  std::string named;
  for (int d : list) named += (named.empty() ? "" : ",") + std::to_string(d);
  std::printf("%s, split over devices %s, %d host threads; float64, one %s tree, diagonally "
              "dominant rows; end to end from pageable host memory (arrays in, x out), median "
              "of %d after a warm-up\n\n",
              info.devices.empty() ? "?" : info.devices[0].name.c_str(), named.c_str(), Threads(),
              shape.c_str(), reps);
  std::printf("| n | GB (lower,upper,diag,rhs,x,parent) | 1 device | %d devices | speed-up | "
              "backward error 1 / %d | max diff | method (1 device) | method (%d devices) |\n"
              "|---|---|---|---|---|---|---|---|---|\n",
              devices, devices, devices);
  std::vector<std::string> notes;
  for (int l : log2n) {
    const int64_t n = int64_t{1} << l;
    const Tree t = Make(n, shape);
    std::vector<double> x1(static_cast<size_t>(n)), x2(static_cast<size_t>(n));
    const Timed t1 = Time(**one, t, x1.data(), reps);
    const Timed t2 = Time(**many, t, x2.data(), reps);
    const SystemStatus ok = SystemStatus::kOk;
    const double be1 = t1.ok ? TreeBackwardError(t.P(), x1.data(), &ok) : NAN;
    const double be2 = t2.ok ? TreeBackwardError(t.P(), x2.data(), &ok) : NAN;
    const double diff = t1.ok && t2.ok ? Distance(n, x2.data(), x1.data()) : NAN;
    std::printf("| 2^%d | %.2f | %s | %s | %.2fx | %.1e / %.1e | %.1e | %s | %s |\n", l,
                44.0 * double(n) / 1e9, Cell(t1).c_str(), Cell(t2).c_str(),
                t1.ok && t2.ok ? t1.median_ms / t2.median_ms : NAN, be1, be2, diff,
                t1.what.c_str(), t2.what.c_str());
    std::fflush(stdout);
    if (phases) notes.push_back(Phases(t, list, reps));
  }
  for (const std::string& note : notes) std::printf("\n%s", note.c_str());
  if (!notes.empty()) std::printf("\n");
  return 0;
}
