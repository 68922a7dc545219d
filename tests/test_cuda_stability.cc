// The CUDA backend's certified `auto` and `pivoting` (docs/kernels/tridiagonal.md, "Certified
// by dominance") against the stability suite (tests/stability_matrices.h) and LAPACK's gtsv:
// every fast kernel `auto` dispatches to flags each system with a row that is not diagonally
// dominant, and `auto` and `pivoting` solve every flagged system again by the pivoting sweep.
// For shapes that reach each fast kernel, both layouts and precisions:
//  - the fast kernel flags every system with a row not dominant (thomas-window: with a |c'|
//    over 1, its certificate), and no dominant one for that;
//  - `auto` and `pivoting`: every system LAPACK solves comes back OK, its backward error within
//    10x of max(gtsv's, n eps), the method counting the systems solved again;
//  - the explicit methods (partitioned, thomas) keep their answer: SINGULAR exactly where a
//    pivot vanished (never for dominance), nothing solved again;
//  - diagonally dominant batches: nothing flagged, nothing solved again (auto and pivoting);
//  - one system (below cuda::kPivotingDeviceBatch): `pivoting` runs the fast kernel and solves
//    only a flagged system on the host.
// Skips, saying so, where no CUDA device is present; run on the lent GPU.
#include <cuda_runtime.h>
#include <lapacke.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_test_util.h"
#include "gtest/gtest.h"
#include "runtime/memory_pool.h"
#include "stability_matrices.h"
#include "tridiagonal/flags.h"
#include "tridiagonal/tridiagonal.h"
#include "trisolve/backend.h"
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

// A batch in `layout`: system s is tri[s] with a right-hand side U(-1, 1), rounded to T.
template <typename T>
struct Batch {
  int64_t batch, n;
  Layout layout;
  std::vector<T> a, b, c, d;
  std::vector<std::string> names;
  Batch(const std::vector<Tri>& tri, int64_t n_, Layout l, uint64_t seed)
      : batch(int64_t(tri.size())), n(n_), layout(l), a(size_t(batch * n)), b(a.size()),
        c(a.size()), d(a.size()) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t s = 0; s < batch; ++s) {
      names.push_back(tri[size_t(s)].name);
      for (int64_t k = 0; k < n; ++k) {
        const size_t e = At(s, k);
        a[e] = T(tri[size_t(s)].a[size_t(k)]);
        b[e] = T(tri[size_t(s)].b[size_t(k)]);
        c[e] = T(tri[size_t(s)].c[size_t(k)]);
        d[e] = T(u(rng));
      }
    }
  }
  size_t At(int64_t s, int64_t k) const { return size_t(ElementIndex(layout, batch, n, s, k)); }
  TridiagonalProblem<T> P() const {
    return {batch, n, layout, a.data(), b.data(), c.data(), d.data()};
  }
  // System s as stored, in double (a[0], c[n-1] zero), and its right-hand side.
  Tri Get(int64_t s, std::vector<double>* rhs) const {
    Tri t{names[size_t(s)], std::vector<double>(size_t(n)), std::vector<double>(size_t(n)),
          std::vector<double>(size_t(n))};
    rhs->resize(size_t(n));
    for (int64_t k = 0; k < n; ++k) {
      t.a[size_t(k)] = k > 0 ? double(a[At(s, k)]) : 0.0;
      t.b[size_t(k)] = double(b[At(s, k)]);
      t.c[size_t(k)] = k + 1 < n ? double(c[At(s, k)]) : 0.0;
      (*rhs)[size_t(k)] = double(d[At(s, k)]);
    }
    return t;
  }
  std::vector<double> X(const std::vector<T>& x, int64_t s) const {
    std::vector<double> r(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) r[size_t(k)] = double(x[At(s, k)]);
    return r;
  }
  // Whether Thomas' elimination of system s, in T on the host, leaves some |c'| clearly over 1
  // (thomas-window's certificate fails; docs/kernels/tridiagonal.md) or meets a zero pivot.
  bool CprimeOverOne(int64_t s) const {
    double cp = 0;
    for (int64_t k = 0; k < n; ++k) {
      const T ak = k > 0 ? a[At(s, k)] : T(0), ck = k + 1 < n ? c[At(s, k)] : T(0);
      const T den = T(b[At(s, k)] - ak * T(cp));
      if (den == T(0)) return true;
      cp = double(T(ck / den));
      if (!(std::abs(cp) <= 1 + 1e-3)) return true;
    }
    return false;
  }
  // Whether every row of system s, as stored, is diagonally dominant by kDominanceRatio times
  // `factor` (the kernels' test, in T, at factor 1; 1 -+ 1e-6: clearly so, or clearly not).
  bool Dominant(int64_t s, double factor = 1 - 1e-6) const {
    const T ratio = T(cuda::kDominanceRatio * factor);
    for (int64_t k = 0; k < n; ++k) {
      const T ak = k > 0 ? a[At(s, k)] : T(0), ck = k + 1 < n ? c[At(s, k)] : T(0);
      if (!(std::abs(ak) + std::abs(ck) <= ratio * std::abs(b[At(s, k)]))) return false;
    }
    return true;
  }
};

// LAPACK's gtsv on system s as stored: x in double, whether it solved (a finite x).
template <typename T>
bool Gtsv(const Batch<T>& bt, int64_t s, std::vector<double>* xo) {
  const int n = int(bt.n);
  std::vector<T> dl(static_cast<size_t>(std::max(n - 1, 1))), dd(static_cast<size_t>(n)),
      du(dl.size()), x(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    dd[size_t(k)] = bt.b[bt.At(s, k)];
    x[size_t(k)] = bt.d[bt.At(s, k)];
    if (k + 1 < n) {
      du[size_t(k)] = bt.c[bt.At(s, k)];
      dl[size_t(k)] = bt.a[bt.At(s, k + 1)];
    }
  }
  lapack_int info;
  if constexpr (std::is_same_v<T, float>)
    info = LAPACKE_sgtsv(LAPACK_COL_MAJOR, n, 1, dl.data(), dd.data(), du.data(), x.data(), n);
  else
    info = LAPACKE_dgtsv(LAPACK_COL_MAJOR, n, 1, dl.data(), dd.data(), du.data(), x.data(), n);
  xo->assign(x.begin(), x.end());
  return info == 0 && std::all_of(x.begin(), x.end(), [](T v) { return std::isfinite(v); });
}

// The fast kernel `auto` (or m) runs on the batch, on the device, without a second solve: the
// kernel's name and the flags it left.
struct Flagged {
  std::string kernel;
  std::vector<uint8_t> flags;
};
template <typename T>
Flagged DeviceFlags(const Batch<T>& bt, TridiagonalMethod m) {
  Flagged r;
  const size_t bytes = sizeof(T) * bt.a.size();
  T* dev[5] = {};
  for (T*& q : dev) EXPECT_EQ(cudaMalloc(&q, bytes), cudaSuccess);
  uint8_t* flags = nullptr;
  EXPECT_EQ(cudaMalloc(&flags, size_t(bt.batch)), cudaSuccess);
  const std::vector<T>* host[4] = {&bt.a, &bt.b, &bt.c, &bt.d};
  for (int q = 0; q < 4; ++q)
    EXPECT_EQ(cudaMemcpy(dev[q], host[q]->data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(flags, 0, size_t(bt.batch)), cudaSuccess);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    cuda::Pool pool(cuda::Pool::Kind::kDevice, 0, int64_t{1} << 30);
    const TridiagonalProblem<T> p{bt.batch, bt.n, bt.layout, dev[0], dev[1], dev[2], dev[3]};
    auto k = cuda::SolveTridiagonalDevice(p, m, dev[4], flags, pool, stream);
    EXPECT_TRUE(k.ok()) << k.status();
    if (k.ok()) r.kernel = cuda::KernelName(*k);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  r.flags.resize(size_t(bt.batch));
  EXPECT_EQ(cudaMemcpy(r.flags.data(), flags, size_t(bt.batch), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (T* q : dev) cudaFree(q);
  cudaFree(flags);
  cudaStreamDestroy(stream);
  return r;
}

struct Solved {
  std::vector<SystemStatus> status;
  std::string method;
};
template <typename T>
Solved SolveGpu(const Batch<T>& bt, TridiagonalMethod m, std::vector<T>* x) {
  x->assign(bt.a.size(), T(std::nan("")));
  Solved r;
  r.status.assign(size_t(bt.batch), SystemStatus::kDiverged);
  auto info = Cuda()->Solve(bt.P(), m, TridiagonalOutput<T>{x->data(), r.status.data()},
                            SolveControl{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) r.method = info->method;
  return r;
}

// The systems solved again: the counts of " + pivoting-split (k ...)" (the device's split) and
// " + pivoting (k ...)" (the sweep, on the device or the host) summed.
int64_t Resolved(const std::string& method) {
  int64_t total = 0;
  for (const std::string key : {" + pivoting (", " + pivoting-split ("}) {
    const size_t at = method.find(key);
    if (at != std::string::npos) total += std::stoll(method.substr(at + key.size()));
  }
  return total;
}

// `m` (auto or pivoting) on the batch: every system LAPACK solves is OK with a backward error
// within 10x of max(gtsv's, n eps); returns the systems solved again (the method's count).
template <typename T>
int64_t CheckCertified(const Batch<T>& bt, TridiagonalMethod m, const std::string& kernel,
                       const std::string& where) {
  std::vector<T> x;
  const Solved g = SolveGpu(bt, m, &x);
  const double floor = double(bt.n) * Eps<T>();
  double worst = 0;
  for (int64_t s = 0; s < bt.batch; ++s) {
    std::vector<double> rhs, xl;
    const Tri t = bt.Get(s, &rhs);
    const bool lok = Gtsv(bt, s, &xl);
    const bool gok = g.status[size_t(s)] == SystemStatus::kOk;
    const double gb = BackwardError(t, rhs, bt.X(x, s), gok);
    const double lb = BackwardError(t, rhs, xl, lok);
    const std::string what = where + ": " + std::string(MethodName(m)) + " system " +
                             std::to_string(s) +
                             " (" + t.name + "), fast kernel " + kernel + ", method '" +
                             g.method + "': backward error " + std::to_string(gb) +
                             ", gtsv's " + std::to_string(lb);
    if (!lok) {  // singular to working precision (float32's randsvd): SINGULAR or stable
      EXPECT_TRUE(!gok || gb <= 10 * floor) << what;
      continue;
    }
    EXPECT_TRUE(gok) << what << " (not OK, solved by LAPACK)";
    EXPECT_LE(gb, 10 * std::max(lb, floor)) << what;
    worst = std::max(worst, gb / std::max(lb, floor));
  }
  std::printf("  %s by %s: '%s', worst backward error / max(gtsv's, n eps) %.2g\n",
              where.c_str(), std::string(MethodName(m)).c_str(), g.method.c_str(), worst);
  return Resolved(g.method);
}

// One batch of the suite's matrices `first` .. `first + count - 1` (mod 20) at n.
template <typename T>
void Suite20(int n, int first, int count, Layout layout, std::set<std::string>* kernels) {
  const std::string where = std::string(Dtype<T>()) + " n " + std::to_string(n) + " batch " +
                            std::to_string(count) +
                            (layout == Layout::kFlat ? " flat" : " interleaved");
  SCOPED_TRACE(where);
  const std::vector<Tri> suite = Suite(n, 2021 + uint64_t(n));
  ASSERT_EQ(suite.size(), 20u);
  std::vector<Tri> tri;
  for (int i = 0; i < count; ++i) {
    tri.push_back(suite[size_t((first + i) % 20)]);
    tri.back().name = "#" + std::to_string((first + i) % 20 + 1) + " " + tri.back().name;
  }
  const Batch<T> bt(tri, n, layout, uint64_t(7 + n + first));

  // The fast kernel flags every system with a row not dominant (thomas-window: every system
  // whose |c'| passes 1, its certificate); none for dominance otherwise.
  const Flagged fast = DeviceFlags(bt, TridiagonalMethod::kAuto);
  kernels->insert(fast.kernel);
  const bool by_cprime = fast.kernel == "thomas-window";
  int64_t not_certified = 0;
  for (int64_t s = 0; s < bt.batch; ++s) {
    const bool dominant = bt.Dominant(s);  // (clearly; a row within 1e-6 of the ratio: either)
    const bool must_flag = by_cprime ? bt.CprimeOverOne(s) : !bt.Dominant(s, 1 + 1e-6);
    not_certified += must_flag;
    const uint8_t f = fast.flags[size_t(s)];
    if (must_flag) {
      EXPECT_NE(f, 0) << "system " << s << " (" << bt.names[size_t(s)] << ") is not "
                      << (by_cprime ? "certified (|c'| > 1)" : "dominant") << "; "
                      << fast.kernel << " did not flag it";
    } else if (dominant) {
      EXPECT_EQ(f & cuda::kFlagNotDominant, 0)
          << "system " << s << " (" << bt.names[size_t(s)] << ") is dominant; " << fast.kernel
          << " flagged it " << int(f);
    }
  }
  std::printf("%s: %s, %lld systems not certified\n", where.c_str(), fast.kernel.c_str(),
              (long long)not_certified);
  for (TridiagonalMethod m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPivoting}) {
    const int64_t again = CheckCertified(bt, m, fast.kernel, where);
    EXPECT_GE(again, not_certified) << MethodName(m);
  }

  // The explicit methods keep their answer: SINGULAR exactly where a pivot vanished (bit 1 of
  // the partitioned kernels' flags), never for dominance, and nothing solved again.
  for (TridiagonalMethod m : {TridiagonalMethod::kPartitioned, TridiagonalMethod::kThomas}) {
    std::vector<T> xe;
    const Solved e = SolveGpu(bt, m, &xe);
    EXPECT_EQ(e.method.find("pivoting"), std::string::npos) << e.method;
    if (m != TridiagonalMethod::kPartitioned) continue;
    const Flagged pf = DeviceFlags(bt, m);
    for (int64_t s = 0; s < bt.batch; ++s)
      EXPECT_EQ((pf.flags[size_t(s)] & cuda::kFlagVanished) != 0,
                e.status[size_t(s)] == SystemStatus::kSingular)
          << "system " << s << " (" << bt.names[size_t(s)] << ") by partitioned ("
          << pf.kernel << "): flags " << int(pf.flags[size_t(s)]) << ", status "
          << int(e.status[size_t(s)]);
  }
}

// The shapes: each runs a different fast kernel under auto (dispatch.cc; the H100's table).
// Rows not dominant fail the windows' check, so those shapes run the path below them.
template <typename T>
void AllShapes(std::set<std::string>* kernels) {
  constexpr bool f64 = std::is_same_v<T, double>;
  for (Layout l : {Layout::kFlat, Layout::kInterleaved}) {
    Suite20<T>(512, 0, 40, l, kernels);      // one block (flat), streamed / thomas-window
    Suite20<T>(1 << 14, 0, 40, l, kernels);  // thomas-window, two-pass
  }
  Suite20<T>(1024, 0, 40, Layout::kFlat, kernels);         // streamed (float64)
  Suite20<T>(256, 0, 40, Layout::kInterleaved, kernels);   // one block, interleaved
  // Batches under 16 (no thomas-window): the cluster kernel (interleaved 512 < n <= 2048;
  // float32 flat 4096 < n <= 8192) and the streamed rows (float64 flat 8192).
  for (int first : {0, 10}) {
    Suite20<T>(2048, first, 10, Layout::kInterleaved, kernels);
    Suite20<T>(8192, first, 10, Layout::kFlat, kernels);
    if (f64) Suite20<T>(1 << 14, first, 10, Layout::kFlat, kernels);
  }
}

std::string Joined(const std::set<std::string>& s) {
  std::string r;
  for (const std::string& k : s) r += (r.empty() ? "" : ", ") + k;
  return r;
}

TEST(CudaStability, CertifiedAutoAndPivotingFloat64) {
  REQUIRE_GPU();
  std::set<std::string> kernels;
  AllShapes<double>(&kernels);
  std::printf("float64 kernels: %s\n", Joined(kernels).c_str());
  // (thomas-window: on these batches a window past a system's first meets a row its
  // certificate fails and hands the problem to the exact path, which is what answers; its own
  // answer is checked on the dominant batches and the 2^24-row system below.)
  for (const char* k : {"partitioned", "partitioned-stream", "partitioned-cluster",
                        "partitioned-cluster-stream"})
    EXPECT_TRUE(kernels.count(k)) << k << " not run; ran " << Joined(kernels);
}

TEST(CudaStability, CertifiedAutoAndPivotingFloat32) {
  REQUIRE_GPU();
  std::set<std::string> kernels;
  AllShapes<float>(&kernels);
  std::printf("float32 kernels: %s\n", Joined(kernels).c_str());
  for (const char* k : {"partitioned", "partitioned-cluster"})
    EXPECT_TRUE(kernels.count(k)) << k << " not run; ran " << Joined(kernels);
}

// A diagonally dominant batch (rows |b| = |a| + |c| + 0.5 of either sign, and
// tridiag(U(-1, 1), 4, U(-1, 1))): nothing flagged, nothing solved again by auto or pivoting.
template <typename T>
std::vector<Tri> DominantTris(int64_t n, int64_t batch) {
  std::mt19937_64 rng(uint64_t(n) * 31 + uint64_t(batch));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Tri> tri;
  for (int64_t s = 0; s < batch; ++s) {
    Tri t{"dominant", std::vector<double>(size_t(n)), std::vector<double>(size_t(n)),
          std::vector<double>(size_t(n))};
    for (int64_t k = 0; k < n; ++k) {
      const double a = k > 0 ? u(rng) : 0, c = k + 1 < n ? u(rng) : 0;
      t.a[size_t(k)] = a;
      t.c[size_t(k)] = c;
      t.b[size_t(k)] = s % 2 ? 4 : (std::abs(a) + std::abs(c) + 0.5) * (u(rng) < 0 ? -1 : 1);
    }
    tri.push_back(std::move(t));
  }
  return tri;
}

template <typename T>
void Dominant(int64_t n, int64_t batch, Layout layout, std::set<std::string>* kernels) {
  SCOPED_TRACE(::testing::Message() << Dtype<T>() << " n " << n << " batch " << batch
                                    << (layout == Layout::kFlat ? " flat" : " interleaved"));
  const Batch<T> bt(DominantTris<T>(n, batch), n, layout, uint64_t(n));
  const Flagged fast = DeviceFlags(bt, TridiagonalMethod::kAuto);
  kernels->insert(fast.kernel);
  int64_t flagged = 0;
  for (uint8_t f : fast.flags) flagged += f != 0;
  EXPECT_EQ(flagged, 0) << fast.kernel;
  for (TridiagonalMethod m : {TridiagonalMethod::kAuto, TridiagonalMethod::kPivoting}) {
    std::vector<T> x;
    const Solved g = SolveGpu(bt, m, &x);
    EXPECT_EQ(g.method.find("pivoting"), std::string::npos)
        << MethodName(m) << " solved again on dominant data: " << g.method;
    for (SystemStatus st : g.status) EXPECT_EQ(st, SystemStatus::kOk);
    // pivoting's answer there is the fast kernel's, stable: against gtsv's.
    for (int64_t s = 0; s < bt.batch; s += std::max<int64_t>(1, bt.batch / 4)) {
      std::vector<double> rhs, xl;
      const Tri t = bt.Get(s, &rhs);
      const bool lok = Gtsv(bt, s, &xl);
      EXPECT_LE(BackwardError(t, rhs, bt.X(x, s), true),
                10 * std::max(BackwardError(t, rhs, xl, lok), double(n) * Eps<T>()))
          << MethodName(m) << " system " << s;
    }
  }
}

TEST(CudaStability, DominantBatchesSolvedOnce) {
  REQUIRE_GPU();
  std::set<std::string> kernels;
  for (Layout l : {Layout::kFlat, Layout::kInterleaved})
    for (int n : {32, 256, 512, 1024, 2048, 8192, 1 << 14})
      for (int64_t batch : {int64_t(8), int64_t(64)}) {
        Dominant<double>(n, batch, l, &kernels);
        Dominant<float>(n, batch, l, &kernels);
      }
  std::printf("dominant: kernels %s\n", Joined(kernels).c_str());
  for (const char* k : {"partitioned-window", "thomas-window", "partitioned-cluster-stream"})
    EXPECT_TRUE(kernels.count(k)) << k << " not run; ran " << Joined(kernels);
}

// One system (below cuda::kPivotingDeviceBatch): `pivoting` runs the fast kernel on the device
// and solves again on the host only a system it flagged; each of the suite's matrices that is
// not dominant comes back solved again, within 10x of gtsv's backward error.
template <typename T>
void OneSystem(int n) {
  const std::vector<Tri> suite = Suite(n, 2021 + uint64_t(n));
  for (size_t i = 0; i < suite.size(); ++i) {
    Tri t = suite[i];
    t.name = "#" + std::to_string(i + 1) + " " + t.name;
    const Batch<T> bt({t}, n, Layout::kFlat, 11 + i);
    const std::string where = std::string(Dtype<T>()) + " one system n " + std::to_string(n);
    SCOPED_TRACE(where + " " + t.name);
    const int64_t again = CheckCertified(bt, TridiagonalMethod::kPivoting, "(one system)", where);
    if (!bt.Dominant(0, 1 + 1e-6)) {
      EXPECT_EQ(again, 1) << t.name;
    } else if (bt.Dominant(0)) {
      EXPECT_EQ(again, 0) << t.name;
    }
  }
}

TEST(CudaStability, OneSystemByPivoting) {
  REQUIRE_GPU();
  OneSystem<double>(512);
  OneSystem<double>(1 << 14);
  OneSystem<float>(512);
}

// One system of 2^24 rows (thomas-window under auto): a dominant one by `pivoting` is the fast
// kernel's answer, nothing solved on the host; tridiag(1, 1e-8, 1) (not dominant, nonsingular
// for even n) is flagged and solved again by the host's sweep, to gtsv's backward error.
TEST(CudaStability, OneLargeSystemByPivoting) {
  REQUIRE_GPU();
  const int64_t n = int64_t(1) << 24;
  {
    const Batch<double> bt(DominantTris<double>(n, 1), n, Layout::kFlat, 5);
    const Flagged fast = DeviceFlags(bt, TridiagonalMethod::kAuto);
    EXPECT_EQ(fast.kernel, "thomas-window");
    EXPECT_EQ(fast.flags[0], 0);
    EXPECT_EQ(CheckCertified(bt, TridiagonalMethod::kPivoting, "thomas-window", "2^24 dominant"),
              0);
  }
  {
    Tri t{"tridiag(1, 1e-8, 1)", std::vector<double>(size_t(n), 1.0),
          std::vector<double>(size_t(n), 1e-8), std::vector<double>(size_t(n), 1.0)};
    const Batch<double> bt({t}, n, Layout::kFlat, 6);
    EXPECT_EQ(CheckCertified(bt, TridiagonalMethod::kPivoting, "thomas-window",
                             "2^24 not dominant"),
              1);
  }
}

// A variable-size batch (the variable kernel's short systems and a long one through the
// uniform kernels) of the suite's matrices at n = 96 .. 3000: `auto` solves again, on the host,
// every system its kernels did not certify; every system LAPACK solves comes back OK within
// 10x of max(gtsv's, n eps).
template <typename T>
void VariableSizes() {
  const std::vector<int> sizes = {96, 512, 1000, 3000};
  std::vector<T> a, b, c, d;
  std::vector<int64_t> offsets{0};
  std::vector<Tri> tris;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int n : sizes) {
    const std::vector<Tri> suite = Suite(n, 2021 + uint64_t(n));
    for (size_t i = 0; i < suite.size(); ++i) {
      tris.push_back(suite[i]);
      tris.back().name = "#" + std::to_string(i + 1) + " " + suite[i].name + ", n " +
                         std::to_string(n);
      for (int k = 0; k < n; ++k) {
        a.push_back(T(suite[i].a[size_t(k)]));
        b.push_back(T(suite[i].b[size_t(k)]));
        c.push_back(T(suite[i].c[size_t(k)]));
        d.push_back(T(u(rng)));
      }
      offsets.push_back(int64_t(a.size()));
    }
  }
  const int64_t batch = int64_t(tris.size());
  TridiagonalProblem<T> p{batch, 3000, Layout::kFlat, a.data(), b.data(), c.data(), d.data()};
  p.offsets = offsets.data();
  std::vector<T> x(a.size(), T(std::nan("")));
  std::vector<SystemStatus> st(size_t(batch), SystemStatus::kDiverged);
  auto info = Cuda()->Solve(p, TridiagonalMethod::kAuto,
                            TridiagonalOutput<T>{x.data(), st.data()}, SolveControl{});
  ASSERT_TRUE(info.ok()) << info.status();
  std::printf("%s variable sizes: '%s'\n", Dtype<T>(), info->method.c_str());
  int64_t not_dominant = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t o = offsets[size_t(s)], n = offsets[size_t(s) + 1] - o;
    const std::vector<Tri> one = {Tri{tris[size_t(s)].name,
                                      std::vector<double>(a.begin() + o, a.begin() + o + n),
                                      std::vector<double>(b.begin() + o, b.begin() + o + n),
                                      std::vector<double>(c.begin() + o, c.begin() + o + n)}};
    Batch<T> bt(one, n, Layout::kFlat, 0);
    std::copy(d.begin() + o, d.begin() + o + n, bt.d.begin());
    not_dominant += !bt.Dominant(0, 1 + 1e-6);
    std::vector<double> rhs, xl;
    const Tri t = bt.Get(0, &rhs);
    const bool lok = Gtsv(bt, 0, &xl);
    const bool gok = st[size_t(s)] == SystemStatus::kOk;
    const std::vector<double> xs(x.begin() + o, x.begin() + o + n);
    const double gb = BackwardError(t, rhs, xs, gok), lb = BackwardError(t, rhs, xl, lok);
    const double floor = double(n) * Eps<T>();
    if (!lok) {
      EXPECT_TRUE(!gok || gb <= 10 * floor) << t.name << ": " << gb;
      continue;
    }
    EXPECT_TRUE(gok) << t.name << " not OK, solved by LAPACK (" << info->method << ")";
    EXPECT_LE(gb, 10 * std::max(lb, floor))
        << t.name << ": backward error " << gb << ", gtsv's " << lb << " (" << info->method << ")";
  }
  EXPECT_GE(Resolved(info->method), not_dominant) << info->method;
}

TEST(CudaStability, VariableSizesByAuto) {
  REQUIRE_GPU();
  VariableSizes<double>();
  VariableSizes<float>();
}

}  // namespace
}  // namespace trisolve
