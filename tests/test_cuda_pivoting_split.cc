// pivoting-split on the device (kernels/cuda/tridiagonal/pivoting_split.cu): few, long systems
// that are not diagonally dominant, solved again by the partition method with partial pivoting
// instead of the host's sweep (below cuda::kPivotingDeviceBatch systems) or the device's sweep
// of a thread a system. Against LAPACK's gtsv and the CPU reference, float64 and float32:
//  - one system of 2^20 rows of each of the 20 matrices of the stability suite, and of 2^22
//    rows of those that can be built at that size (random, half the couplings zero, the zero
//    diagonal, tridiag(1, 1e-8, 1)): OK wherever LAPACK solves it, its backward error within
//    10x of max(LAPACK's, eps);
//  - batches of 1, 3, 31 and 64 long random systems, all answered by the split;
//  - a batch where only one system is not dominant: that one alone solved again;
//  - singular systems still SINGULAR (x = 0);
//  - a system whose first part's block is singular (the whole system is not): the split gives
//    it up and the fallback (the host's sweep, the device's at 32 systems or more) answers;
//  - the launch itself: only flagged systems touched, their flags cleared where answered.
// Skips, saying so, where no CUDA device is present; run on the lent GPU.
#include <cuda_runtime.h>
#include <lapacke.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "stability_matrices.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/backend.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"

namespace trisolve {
namespace {

using ::trisolve::testing::Cuda;
using namespace ::trisolve::stability;

template <typename T>
constexpr double Eps() {
  return std::is_same_v<T, float> ? double(FLT_EPSILON) : DBL_EPSILON;
}
template <typename T>
const char* Dtype() {
  return std::is_same_v<T, float> ? "float32" : "float64";
}

// The count in " + <what> (k system[s])", or 0.
int64_t CountOf(const std::string& method, const std::string& what) {
  const std::string key = " + " + what + " (";
  const size_t at = method.find(key);
  return at == std::string::npos ? 0 : std::stoll(method.substr(at + key.size()));
}
int64_t Split(const std::string& m) { return CountOf(m, "pivoting-split"); }
int64_t Sweep(const std::string& m) { return CountOf(m, "pivoting"); }

// A flat batch of systems, each a Tri rounded to T, right-hand sides U(-1, 1).
template <typename T>
struct Flat {
  int64_t batch = 0, n = 0;
  std::vector<T> a, b, c, d;
  std::vector<std::string> names;
  Flat(const std::vector<Tri>& tri, int64_t n_, uint64_t seed)
      : batch(int64_t(tri.size())), n(n_), a(size_t(batch * n_)), b(a.size()), c(a.size()),
        d(a.size()) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t s = 0; s < batch; ++s) {
      names.push_back(tri[size_t(s)].name);
      for (int64_t k = 0; k < n; ++k) {
        const size_t e = size_t(s * n + k);
        a[e] = T(tri[size_t(s)].a[size_t(k)]);
        b[e] = T(tri[size_t(s)].b[size_t(k)]);
        c[e] = T(tri[size_t(s)].c[size_t(k)]);
        d[e] = T(u(rng));
      }
    }
  }
  TridiagonalProblem<T> P() const {
    return {batch, n, Layout::kFlat, a.data(), b.data(), c.data(), d.data()};
  }
  Tri Get(int64_t s, std::vector<double>* rhs) const {
    Tri t{names[size_t(s)], std::vector<double>(size_t(n)), std::vector<double>(size_t(n)),
          std::vector<double>(size_t(n))};
    rhs->resize(size_t(n));
    for (int64_t k = 0; k < n; ++k) {
      const size_t e = size_t(s * n + k);
      t.a[size_t(k)] = k > 0 ? double(a[e]) : 0.0;
      t.b[size_t(k)] = double(b[e]);
      t.c[size_t(k)] = k + 1 < n ? double(c[e]) : 0.0;
      (*rhs)[size_t(k)] = double(d[e]);
    }
    return t;
  }
  std::vector<double> X(const std::vector<T>& x, int64_t s) const {
    return std::vector<double>(x.begin() + s * n, x.begin() + (s + 1) * n);
  }
  // LAPACK's gtsv on system s: x in double, whether it solved (and x is finite).
  bool Gtsv(int64_t s, std::vector<double>* xo) const {
    const int m = int(n);
    std::vector<T> dl(static_cast<size_t>(std::max(m - 1, 1))), dd(static_cast<size_t>(m)),
        du(dl.size()), x(static_cast<size_t>(m));
    for (int k = 0; k < m; ++k) {
      const size_t e = size_t(s * n + k);
      dd[size_t(k)] = b[e];
      x[size_t(k)] = d[e];
      if (k + 1 < m) {
        du[size_t(k)] = c[e];
        dl[size_t(k)] = a[e + 1];
      }
    }
    lapack_int info;
    if constexpr (std::is_same_v<T, float>)
      info = LAPACKE_sgtsv(LAPACK_COL_MAJOR, m, 1, dl.data(), dd.data(), du.data(), x.data(), m);
    else
      info = LAPACKE_dgtsv(LAPACK_COL_MAJOR, m, 1, dl.data(), dd.data(), du.data(), x.data(), m);
    xo->assign(x.begin(), x.end());
    return info == 0 && std::all_of(x.begin(), x.end(), [](T v) { return std::isfinite(v); });
  }
};

Tri Constant(const std::string& name, int64_t n, double a, double b, double c) {
  return Tri{name, std::vector<double>(size_t(n), a), std::vector<double>(size_t(n), b),
             std::vector<double>(size_t(n), c)};
}

Tri Random(const std::string& name, int64_t n, uint64_t seed, bool half_zero = false) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Tri t = Constant(name, n, 0, 0, 0);
  for (int64_t k = 0; k < n; ++k) {
    t.a[size_t(k)] = u(rng), t.b[size_t(k)] = u(rng), t.c[size_t(k)] = u(rng);
    if (half_zero && k % 2 == 0) t.a[size_t(k)] = 0;
    if (half_zero && k % 2 == 1) t.c[size_t(k)] = 0;
  }
  return t;
}

// ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf), the residual in long double over every
// core (stability_matrices.h's BackwardError, in __float128, takes seconds a system of 2^22
// rows; long double's 64-bit significand is far below the errors judged); infinite where the
// system is not OK or x is not finite.
double Backward(const Tri& t, const std::vector<double>& d, const std::vector<double>& x,
                bool ok) {
  if (!ok) return INFINITY;
  const int64_t n = int64_t(x.size());
  long double rm = 0, am = 0, xm = 0, dm = 0;
  bool finite = true;
#pragma omp parallel for reduction(max : rm, am, xm, dm) reduction(&& : finite)
  for (int64_t k = 0; k < n; ++k) {
    const size_t i = size_t(k);
    long double r = (long double)d[i] - (long double)t.b[i] * x[i];
    long double row = std::abs((long double)t.b[i]);
    if (k > 0) r -= (long double)t.a[i] * x[i - 1], row += std::abs((long double)t.a[i]);
    if (k + 1 < n) r -= (long double)t.c[i] * x[i + 1], row += std::abs((long double)t.c[i]);
    finite = finite && std::isfinite(x[i]);
    rm = std::max(rm, std::abs(r));
    am = std::max(am, row);
    xm = std::max(xm, std::abs((long double)x[i]));
    dm = std::max(dm, std::abs((long double)d[i]));
  }
  if (!finite) return INFINITY;
  const long double den = am * xm + dm;
  return double(den > 0 ? rm / den : rm);
}

struct Run {
  std::vector<SystemStatus> status;
  std::string method;
};

template <typename T>
Run SolveGpu(const Flat<T>& f, TridiagonalMethod m, std::vector<T>* x) {
  x->assign(f.a.size(), T(std::nan("")));
  Run r;
  r.status.assign(size_t(f.batch), SystemStatus::kDiverged);
  auto info = Cuda()->Solve(f.P(), m, TridiagonalOutput<T>{x->data(), r.status.data()},
                            SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) r.method = info->method;
  return r;
}

// Every system of f by `m` on the GPU: OK where LAPACK solves it, backward error within 10x
// of max(LAPACK's, eps) (the CPU reference's sweep printed beside). Returns the method.
template <typename T>
std::string CheckAgainstLapack(const Flat<T>& f, TridiagonalMethod m, const std::string& where,
                               bool print) {
  std::vector<T> x;
  const Run g = SolveGpu(f, m, &x);
  for (int64_t s = 0; s < f.batch; ++s) {
    std::vector<double> rhs, xl;
    const Tri t = f.Get(s, &rhs);
    const bool lok = f.Gtsv(s, &xl);
    const bool gok = g.status[size_t(s)] == SystemStatus::kOk;
    const double gb = Backward(t, rhs, f.X(x, s), gok);
    const double lb = Backward(t, rhs, xl, lok);
    double cb = -1;  // the CPU reference's sweep, for the table
    if (print) {
      std::vector<T> xc(static_cast<size_t>(f.n)), work(static_cast<size_t>(3 * f.n));
      const bool cok = cpu::PivotingStrided(f.n, 1, f.a.data() + s * f.n, f.b.data() + s * f.n,
                                            f.c.data() + s * f.n, f.d.data() + s * f.n,
                                            xc.data(), work.data());
      cb = Backward(t, rhs, std::vector<double>(xc.begin(), xc.end()), cok);
    }
    const std::string what = where + " " + Dtype<T>() + " n " + std::to_string(f.n) +
                             " system " + std::to_string(s) + " (" + t.name + "), '" +
                             g.method + "'";
    if (print)
      std::printf("| %s | %s | %lld | %.1e | %.1e | %.1e | %s |\n", t.name.c_str(), Dtype<T>(),
                  (long long)f.n, gok ? gb : -1.0, cb, lok ? lb : -1.0, g.method.c_str());
    if (!lok) {  // singular to working precision: SINGULAR, or a stable answer
      EXPECT_TRUE(!gok || gb <= 10 * Eps<T>()) << what << ": " << gb;
      if (!gok) {
        for (int64_t k = 0; k < f.n; ++k) {
          EXPECT_EQ(x[size_t(s * f.n + k)], T(0)) << what;
          if (x[size_t(s * f.n + k)] != T(0)) break;
        }
      }
      continue;
    }
    EXPECT_TRUE(gok) << what << " not OK, solved by LAPACK";
    EXPECT_TRUE(gb <= 10 * std::max(lb, Eps<T>()))
        << what << ": backward error " << gb << ", LAPACK's " << lb << ", the CPU's " << cb;
  }
  return g.method;
}

// One system of 2^20 rows of each of the 20 matrices, by `pivoting` (certified: thomas-window
// or the partitioned kernels, then the split on what they flagged). The random ones (#1, #5)
// must be the split's; every one within 10x of LAPACK.
template <typename T>
void TwentyMatricesOneSystemEach(int64_t n, const std::vector<Tri>& suite) {
  std::printf("\n| matrix | dtype | n | GPU | CPU sweep | gtsv | method |\n"
              "|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < suite.size(); ++i) {
    const Flat<T> f({suite[i]}, n, 100 + i);
    const std::string m =
        CheckAgainstLapack(f, TridiagonalMethod::kPivoting, "#" + std::to_string(i + 1), true);
    if (i == 0 || i == 4) {
      EXPECT_EQ(Split(m), 1) << "#" << i + 1 << ": " << m;
    }
  }
}

TEST(CudaPivotingSplit, TwentyMatricesOneSystemOf2To20) {
  REQUIRE_GPU();
  const int64_t n = int64_t(1) << 20;
  const std::vector<Tri> suite = Suite(int(n), 2021 + uint64_t(n));  // (~30 s of the host's)
  TwentyMatricesOneSystemEach<double>(n, suite);
  TwentyMatricesOneSystemEach<float>(n, suite);
}

// 2^22 rows (and 2^20 + 2, whose parts end differently): random, half the couplings zero, the
// zero diagonal (n even: nonsingular, every Thomas pivot zero), tridiag(1, 1e-8, 1); by
// `pivoting` (and `auto` in float64), each answered by the split.
template <typename T>
void LongSystems(int64_t n) {
  std::printf("\n| matrix | dtype | n | GPU | CPU sweep | gtsv | method |\n"
              "|---|---|---|---|---|---|---|\n");
  const std::vector<Tri> tris = {Random("random U(-1,1)", n, 1),
                                 Random("random, half the couplings zero", n, 2, true),
                                 Constant("tridiag(1, 0, 1)", n, 1, 0, 1),
                                 Constant("tridiag(1, 1e-8, 1)", n, 1, 1e-8, 1)};
  std::vector<TridiagonalMethod> methods = {TridiagonalMethod::kPivoting};
  if (std::is_same_v<T, double>) methods.push_back(TridiagonalMethod::kAuto);
  for (const Tri& t : tris)
    for (TridiagonalMethod m : methods) {
      const Flat<T> f({t}, n, 7);
      const std::string method = CheckAgainstLapack(f, m, t.name, true);
      EXPECT_EQ(Split(method), 1) << t.name << ": " << method;
      EXPECT_EQ(Sweep(method), 0) << t.name << ": " << method;
    }
}

TEST(CudaPivotingSplit, OneSystemOf2To22) {
  REQUIRE_GPU();
  LongSystems<double>(int64_t(1) << 22);
  LongSystems<float>(int64_t(1) << 22);
  LongSystems<double>((int64_t(1) << 20) + 2);
}

// Batches of 1, 3, 31 and 64 random systems (2^22 rows in all): every one the split's (the 64
// too: there it replaces the device's sweep), within 10x of LAPACK.
template <typename T>
void Batches() {
  for (int64_t batch : {1, 3, 31, 64}) {
    const int64_t n = (int64_t(1) << 22) / batch / 2 * 2;
    std::vector<Tri> tris;
    for (int64_t s = 0; s < batch; ++s)
      tris.push_back(Random("random #" + std::to_string(s), n, 40 + uint64_t(s)));
    const Flat<T> f(tris, n, 9);
    const std::string m = CheckAgainstLapack(f, TridiagonalMethod::kPivoting,
                                             "batch " + std::to_string(batch), false);
    std::printf("%s batch %lld n %lld: '%s'\n", Dtype<T>(), (long long)batch, (long long)n,
                m.c_str());
    EXPECT_EQ(Split(m), batch) << m;
    EXPECT_EQ(Sweep(m), 0) << m;
    EXPECT_NE(m.find(batch == 1 ? "(1 system)" : "(" + std::to_string(batch) + " systems)"),
              std::string::npos)
        << m;
  }
}

TEST(CudaPivotingSplit, BatchesOfLongSystems) {
  REQUIRE_GPU();
  Batches<double>();
  Batches<float>();
}

// Four systems of 2^20 rows, one of them not dominant: that one alone solved again, by the
// split; the others the fast kernel's answer.
template <typename T>
void OnlyOneNotDominant() {
  const int64_t n = int64_t(1) << 20;
  std::vector<Tri> tris;
  for (int s = 0; s < 4; ++s) {
    Tri t = Random("dominant", n, 60 + uint64_t(s));
    for (int64_t k = 0; k < n; ++k)
      t.b[size_t(k)] = (std::abs(t.a[size_t(k)]) + std::abs(t.c[size_t(k)]) + 0.5) *
                       (t.b[size_t(k)] < 0 ? -1 : 1);
    tris.push_back(t);
  }
  tris[2] = Random("random", n, 64);
  const Flat<T> f(tris, n, 11);
  for (TridiagonalMethod m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPivoting}) {
    const std::string method = CheckAgainstLapack(f, m, "one of four", false);
    EXPECT_NE(method.find(" + pivoting-split (1 system)"), std::string::npos) << method;
    EXPECT_EQ(Sweep(method), 0) << method;
  }
}

TEST(CudaPivotingSplit, OnlyTheSystemNotDominantIsSolvedAgain) {
  REQUIRE_GPU();
  OnlyOneNotDominant<double>();
  OnlyOneNotDominant<float>();
}

// Singular systems: a zero row, and tridiag(1, 0, 1) of odd n: SINGULAR and x = 0, whatever
// the split made of them (its check fails, the sweep finds the zero pivot); in a batch of 3
// (host fallback) and of 40 (device fallback) with random systems answered beside them.
template <typename T>
void Singular(int64_t batch) {
  const int64_t n = (int64_t(1) << 18) + 1;
  std::vector<Tri> tris;
  for (int64_t s = 0; s < batch; ++s) tris.push_back(Random("random", n, 80 + uint64_t(s)));
  Tri zero_row = Random("zero row", n, 90);
  zero_row.a[1000] = zero_row.b[1000] = zero_row.c[1000] = 0;
  tris[0] = zero_row;
  tris[1] = Constant("tridiag(1, 0, 1), n odd", n, 1, 0, 1);
  const Flat<T> f(tris, n, 13);
  std::vector<T> x;
  const Run g = SolveGpu(f, TridiagonalMethod::kPivoting, &x);
  for (int64_t s = 0; s < 2; ++s) {
    EXPECT_EQ(g.status[size_t(s)], SystemStatus::kSingular) << s << " " << g.method;
    for (int64_t k = 0; k < n; ++k) ASSERT_EQ(x[size_t(s * n + k)], T(0)) << s << " " << k;
  }
  for (int64_t s = 2; s < batch; ++s) EXPECT_EQ(g.status[size_t(s)], SystemStatus::kOk) << s;
  EXPECT_EQ(Split(g.method), batch - 2) << g.method;
}

TEST(CudaPivotingSplit, SingularSystemsStaySingular) {
  REQUIRE_GPU();
  Singular<double>(3);
  Singular<double>(40);
  Singular<float>(3);
}

// tridiag(1, b, 1) with b 0 but at rows 0, m - 2 and m (m the parts' rows): the first part's
// block (rows 0 .. m - 2) is singular (its continuant vanishes exactly), the whole system not
// (n even). The split gives it up; the fallback answers it, OK, within 10x of LAPACK.
template <typename T>
void BlockSingular(int64_t batch) {
  const int64_t n = int64_t(1) << 16, m = cuda::kPivotingSplitPartRows;
  Tri t = Constant("first block singular", n, 1, 0, 1);
  t.b[0] = t.b[size_t(m - 2)] = t.b[size_t(m)] = 1;
  std::vector<Tri> tris(size_t(batch), t);
  const Flat<T> f(tris, n, 17);
  std::vector<double> xl;
  ASSERT_TRUE(f.Gtsv(0, &xl)) << "the system should be nonsingular";
  const std::string method =
      CheckAgainstLapack(f, TridiagonalMethod::kPivoting, "block singular", false);
  EXPECT_EQ(Split(method), 0) << method;
  EXPECT_EQ(Sweep(method), batch) << method;
}

TEST(CudaPivotingSplit, ABlockThatDoesNotFactorFallsBack) {
  REQUIRE_GPU();
  BlockSingular<double>(1);   // the host's sweep
  BlockSingular<double>(32);  // the device's
  BlockSingular<float>(1);
}

// The launch on device arrays: systems whose flag is clear are not touched (x keeps what it
// held, the flag stays 0); flagged ones are answered, their flags cleared and counted. Both
// ways of staging the parts (whole, and 8 rows at a time), random systems (refined) and
// zero-diagonal ones (not), and with nothing flagged the launch that asks first says so.
void LaunchOnly(bool whole, bool zero) {
  SCOPED_TRACE(::testing::Message() << "whole " << whole << " zero diagonal " << zero);
  const int64_t n = 5000, batch = 6;
  std::vector<Tri> tris;
  for (int64_t s = 0; s < batch; ++s)
    tris.push_back(zero ? Constant("tridiag(1, 0, 1)", n, 1, 0, 1)
                        : Random("random", n, 200 + uint64_t(s)));
  const Flat<double> f(tris, n, 19);
  const size_t bytes = f.a.size() * sizeof(double);
  double *a, *b, *c, *d, *x;
  uint8_t* flags;
  void* scratch;
  int* solved;
  ASSERT_EQ(cudaMalloc(&a, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&c, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&x, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&flags, size_t(batch)), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&solved, sizeof(int)), cudaSuccess);
  const int64_t sb = cuda::PivotingSplitScratchBytes(n, batch, false);
  ASSERT_GT(sb, 0);
  ASSERT_EQ(cudaMalloc(&scratch, size_t(sb)), cudaSuccess);
  cudaMemcpy(a, f.a.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(b, f.b.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(c, f.c.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(d, f.d.data(), bytes, cudaMemcpyHostToDevice);
  std::vector<double> sentinel(f.a.size(), 42.0);
  cudaMemcpy(x, sentinel.data(), bytes, cudaMemcpyHostToDevice);
  const std::vector<uint8_t> given = {0, cuda::kFlagNotDominant, 0, cuda::kFlagVanished,
                                      cuda::kFlagNotDominant | cuda::kFlagVanished, 0};
  cudaMemcpy(flags, given.data(), size_t(batch), cudaMemcpyHostToDevice);
  *solved = 0;
  const TridiagonalProblem<double> dp{batch, n, Layout::kFlat, a, b, c, d};
  ASSERT_TRUE(cuda::LaunchPivotingSplit(dp, x, flags, scratch, nullptr, solved, nullptr, whole)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> hx(f.a.size());
  std::vector<uint8_t> hf(static_cast<size_t>(batch));
  cudaMemcpy(hx.data(), x, bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(hf.data(), flags, size_t(batch), cudaMemcpyDeviceToHost);
  EXPECT_EQ(*solved, 3);
  for (int64_t s = 0; s < batch; ++s) {
    EXPECT_EQ(hf[size_t(s)], 0) << s;
    if (given[size_t(s)] == 0) {
      for (int64_t k = 0; k < n; ++k) ASSERT_EQ(hx[size_t(s * n + k)], 42.0) << s << " " << k;
      continue;
    }
    std::vector<double> rhs, xl;
    const Tri t = f.Get(s, &rhs);
    ASSERT_TRUE(f.Gtsv(s, &xl));
    const double gb = Backward(t, rhs, f.X(hx, s), true);
    EXPECT_LE(gb, 10 * std::max(Backward(t, rhs, xl, true), DBL_EPSILON)) << s;
  }
  // Nothing flagged now: the launch that asks says so, and touches nothing.
  int* any;
  ASSERT_EQ(cudaMallocHost(&any, sizeof(int)), cudaSuccess);
  *any = -1;
  int* any_mapped = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&any_mapped), any, 0), cudaSuccess);
  const cuda::SplitAny ask{any_mapped, any};
  cudaMemcpy(x, sentinel.data(), bytes, cudaMemcpyHostToDevice);
  ASSERT_TRUE(cuda::LaunchPivotingSplit(dp, x, flags, scratch, nullptr, solved, &ask, whole).ok());
  EXPECT_EQ(*any, 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(hx.data(), x, bytes, cudaMemcpyDeviceToHost);
  EXPECT_EQ(hx, sentinel);
  cudaFreeHost(any);
  for (void* q : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c),
                  static_cast<void*>(d), static_cast<void*>(x), static_cast<void*>(flags),
                  scratch, static_cast<void*>(solved)})
    cudaFree(q);
}

TEST(CudaPivotingSplit, LaunchTouchesOnlyFlaggedSystems) {
  REQUIRE_GPU();
  for (bool whole : {true, false})
    for (bool zero : {false, true}) LaunchOnly(whole, zero);
}

}  // namespace
}  // namespace trisolve
