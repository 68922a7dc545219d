// Persistent systems, many right-hand sides and the time-step stream, end to end: the real
// trisolved on loopback, the C++ client, answers checked against local solves of the CPU
// reference (non-symmetric data, so that a swapped lower/upper or a transposed matrix shows).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "error_measure.h"
#include "gtest/gtest.h"
#include "raw_stub.h"
#include "server_process.h"
#include "trisolve/backend.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using testing::ServerProcess;

NdArray Random(std::vector<int64_t> shape, uint64_t seed, double lo = -1, double hi = 1) {
  NdArray a = NdArray::Zeros(DType::kFloat64, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < a.elements(); ++i) a.as<double>()[i] = u(rng);
  return a;
}

// max |x - y| / max |y|; a non-finite x or a shape mismatch is infinitely wrong.
double RelDiff(const NdArray& x, const std::vector<double>& y) {
  if (x.elements() != int64_t(y.size()) || x.dtype != DType::kFloat64) return INFINITY;
  double d = 0, m = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double xi = x.as<double>()[i];
    if (!std::isfinite(xi)) return INFINITY;
    d = std::max(d, std::abs(xi - y[i]));
    m = std::max(m, std::abs(y[i]));
  }
  return d / m;
}

// One tridiagonal system (flat, batch systems of n) solved locally for a right-hand side.
std::vector<double> LocalTri(const NdArray& a, const NdArray& b, const NdArray& c, const double* d,
                             int64_t batch, int64_t n, Layout layout = Layout::kFlat) {
  std::vector<double> x(size_t(batch * n));
  std::vector<SystemStatus> st(static_cast<size_t>(batch));
  TridiagonalProblem<double> p{batch, n, layout, a.as<double>(), b.as<double>(), c.as<double>(), d};
  cpu::SolveTridiagonal(p, TridiagonalMethod::kThomas, TridiagonalOutput<double>{x.data(), st.data()});
  return x;
}

struct Tri {
  NdArray a, b, c;
  int64_t batch, n;
  Tri(int64_t batch_, int64_t n_, uint64_t seed) : batch(batch_), n(n_) {
    std::vector<int64_t> shape = batch == 1 ? std::vector<int64_t>{n} : std::vector<int64_t>{batch, n};
    a = Random(shape, seed);
    c = Random(shape, seed + 1, -1.5, 0.5);  // not c == a: a transposed solve would show
    b = Random(shape, seed + 2, 3, 4);
  }
  Job AsJob() const {
    Job j{Kind::kTridiagonal};
    j.arrays = {{"a", a.view()}, {"b", b.view()}, {"c", c.view()}};
    return j;
  }
};

class Systems : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--system-ttl", "600", "--max-systems-per-identity", "16"});
    ASSERT_GT(server_->port(), 0) << server_->Log();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static Client MakeClient(const std::string& token = "") {
    Client::Options o;
    o.target = server_->target();
    o.token = token;
    return Client(o);
  }
  static ServerProcess* server_;
};
ServerProcess* Systems::server_ = nullptr;

TEST_F(Systems, CreateSolveUpdateReleaseTridiagonal) {
  Client cl = MakeClient();
  const Tri t(8, 50, 11);
  auto info = cl.CreateSystem(t.AsJob(), {.label = "lifecycle"});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->family, "tridiagonal");
  EXPECT_EQ(info->rhs_shape, (std::vector<int64_t>{8, 50}));
  EXPECT_EQ(info->label, "lifecycle");
  EXPECT_GE(info->bytes, 3 * 8 * 50 * 8);
  const NdArray d = Random({8, 50}, 99);
  auto r = cl.SolveSystem(info->handle, d.view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->summary.ok, 8);
  EXPECT_EQ(r->summary.handle, info->handle);
  EXPECT_LT(r->summary.residual, 1e-14);
  EXPECT_LT(RelDiff(r->x, LocalTri(t.a, t.b, t.c, d.as<double>(), 8, 50)), 1e-13);

  // Update the diagonal: the next solve uses it (and nothing else changed).
  const NdArray b2 = Random({8, 50}, 77, 5, 6);
  auto up = cl.UpdateSystem(info->handle, {{"b", b2.view()}});
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->updates, 1);
  r = cl.SolveSystem(info->handle, d.view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(RelDiff(r->x, LocalTri(t.a, b2, t.c, d.as<double>(), 8, 50)), 1e-13);

  // An update in the solve itself, applied before it.
  r = cl.SolveSystem(info->handle, d.view(), {{"b", t.b.view()}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(RelDiff(r->x, LocalTri(t.a, t.b, t.c, d.as<double>(), 8, 50)), 1e-13);

  auto list = cl.ListSystems();
  ASSERT_TRUE(list.ok());
  bool listed = false;
  for (const auto& s : *list) listed |= s.handle == info->handle && s.solves == 3 && s.updates == 2;
  EXPECT_TRUE(listed);

  auto rel = cl.ReleaseSystem(info->handle);
  ASSERT_TRUE(rel.ok()) << rel.status();
  for (auto st : {cl.SolveSystem(info->handle, d.view()).status(),
                  cl.UpdateSystem(info->handle, {{"b", b2.view()}}).status(),
                  cl.ReleaseSystem(info->handle).status()})
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_EQ(cl.SolveSystem("sys-never-issued", d.view()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(Systems, ManyRightHandSidesByHandleAndUnary) {
  Client cl = MakeClient();
  // One system of n = 40, k = 6 right-hand sides: by handle [6, 40], unary a b c [40], d [6, 40]
  // (flat) and d [40, 6] (interleaved).
  const Tri t(1, 40, 21);
  const NdArray d = Random({6, 40}, 5);
  auto info = cl.CreateSystem(t.AsJob());
  ASSERT_TRUE(info.ok()) << info.status();
  auto r = cl.SolveSystem(info->handle, d.view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->summary.right_hand_sides, 6);
  EXPECT_EQ(r->x.shape, (std::vector<int64_t>{6, 40}));
  std::vector<double> want;
  for (int j = 0; j < 6; ++j) {
    auto xj = LocalTri(t.a, t.b, t.c, d.as<double>() + j * 40, 1, 40);
    want.insert(want.end(), xj.begin(), xj.end());
  }
  EXPECT_LT(RelDiff(r->x, want), 1e-13);
  EXPECT_LT(r->summary.residual, 1e-14);

  Job unary = t.AsJob();
  unary.arrays["d"] = d.view();
  auto u = cl.Solve(unary);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->summary.right_hand_sides, 6);
  EXPECT_LT(RelDiff(u->x, want), 1e-13);

  NdArray dt = NdArray::Zeros(DType::kFloat64, {40, 6});  // interleaved: element i of each rhs
  std::vector<double> want_t(240);
  for (int j = 0; j < 6; ++j)
    for (int i = 0; i < 40; ++i) {
      dt.as<double>()[i * 6 + j] = d.as<double>()[j * 40 + i];
      want_t[size_t(i * 6 + j)] = want[size_t(j * 40 + i)];
    }
  Job inter = t.AsJob();
  inter.arrays["d"] = dt.view();
  inter.options.interleaved = true;
  u = cl.Solve(inter);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_LT(RelDiff(u->x, want_t), 1e-13);

  // A batch system (3 x 40) with k = 4: rhs [4, 3, 40], each block solved with the batch.
  const Tri tb(3, 40, 31);
  auto info2 = cl.CreateSystem(tb.AsJob());
  ASSERT_TRUE(info2.ok()) << info2.status();
  const NdArray d4 = Random({4, 3, 40}, 8);
  r = cl.SolveSystem(info2->handle, d4.view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->summary.systems, 12);
  std::vector<double> want4;
  for (int j = 0; j < 4; ++j) {
    auto xj = LocalTri(tb.a, tb.b, tb.c, d4.as<double>() + j * 120, 3, 40);
    want4.insert(want4.end(), xj.begin(), xj.end());
  }
  EXPECT_LT(RelDiff(r->x, want4), 1e-13);
  EXPECT_TRUE(cl.ReleaseSystem(info->handle).ok());
  EXPECT_TRUE(cl.ReleaseSystem(info2->handle).ok());
}

// A householder-pcr system needs a symmetric A, at creation and at every update: a
// non-symmetric update is refused, naming the array, and the system keeps solving with the A
// it had; a symmetric one is taken.
TEST_F(Systems, HouseholderPcrUpdatesMustStaySymmetric) {
  Client cl = MakeClient();
  const int64_t n = 6;
  auto spd = [&](double scale) {  // scale (tridiag(1, 4, 1) + 0.1 everywhere): symmetric
    NdArray A = NdArray::Zeros(DType::kFloat64, {1, n, n});
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        A.as<double>()[i * n + j] = scale * ((i == j ? 4 : std::abs(i - j) == 1 ? 1 : 0) + 0.1);
    return A;
  };
  const NdArray A = spd(1), A2 = spd(2);
  NdArray skew = A2;
  skew.as<double>()[0 * n + 5] += 1;  // A2 with a[0][5] != a[5][0]
  const NdArray b = Random({1, n}, 7);
  Job create{Kind::kDense};
  create.arrays = {{"a", A.view()}};
  create.options.method = "householder-pcr";
  auto info = cl.CreateSystem(create);
  ASSERT_TRUE(info.ok()) << info.status();
  auto solve_unary = [&](const NdArray& Am) {
    Job unary{Kind::kDense};
    unary.options.method = "gauss-jordan";
    unary.arrays = {{"a", Am.view()}, {"b", b.view()}};
    return cl.Solve(unary);
  };
  const auto st = cl.UpdateSystem(info->handle, {{"a", skew.view()}}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "a: matrix 0 is not symmetric")) << st;
  for (const NdArray* Am : {&A, &A2}) {
    if (Am == &A2) {
      ASSERT_TRUE(cl.UpdateSystem(info->handle, {{"a", A2.view()}}).ok());
    }
    auto byh = cl.SolveSystem(info->handle, b.view());
    ASSERT_TRUE(byh.ok()) << byh.status();
    auto want = solve_unary(*Am);
    ASSERT_TRUE(want.ok()) << want.status();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i)
      worst = std::max(worst, std::abs(byh->x.as<double>()[i] - want->x.as<double>()[i]));
    EXPECT_LT(worst, 1e-12) << (Am == &A ? "the A it had" : "the symmetric update");
  }
  EXPECT_TRUE(cl.ReleaseSystem(info->handle).ok());
}

// A dense system by handle keeps its elimination on the CPU backend (each right-hand side in
// O(n^2)): its answers must be the unary answers, through updates of A, and a singular matrix
// of the batch must stay SINGULAR for each right-hand side while the others are solved.
TEST_F(Systems, DenseByHandleKeepsItsEliminationThroughUpdates) {
  Client cl = MakeClient();
  const int64_t batch = 3, n = 30, k = 4;
  NdArray A = Random({batch, n, n}, 91);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < n; ++i) A.as<double>()[(s * n + i) * n + i] += 2;
  for (int64_t j = 0; j < n; ++j)  // matrix 1: two equal rows
    A.as<double>()[(n + 1) * n + j] = A.as<double>()[n * n + j];
  const NdArray b = Random({k, batch, n}, 92);
  for (const char* method : {"gauss-jordan", "lu"}) {
    SCOPED_TRACE(method);
    Job create{Kind::kDense};
    create.arrays = {{"a", A.view()}};
    create.options.method = method;
    auto info = cl.CreateSystem(create);
    ASSERT_TRUE(info.ok()) << info.status();
    const char* backend = std::getenv("TRISOLVE_TEST_BACKEND");
    if (backend == nullptr || std::string(backend) == "cpu") {
      EXPECT_EQ(info->prepared, std::string(method) == "lu" ? "LU factors on the host"
                                                            : "Gauss-Jordan factors on the host");
    } else if (std::string(backend) == "cuda") {
      EXPECT_EQ(info->prepared, std::string(method) == "lu" ? "LU factors on CUDA device 0"
                                                            : "Gauss-Jordan factors on CUDA device 0");
    }
    NdArray A2 = A;
    for (int64_t i = 0; i < batch * n * n; ++i) A2.as<double>()[i] *= 1.5;
    for (int round = 0; round < 2; ++round) {
      const NdArray& Am = round == 0 ? A : A2;
      if (round == 1) {
        ASSERT_TRUE(cl.UpdateSystem(info->handle, {{"a", A2.view()}}).ok());
      }
      auto byh = cl.SolveSystem(info->handle, b.view());
      ASSERT_TRUE(byh.ok()) << byh.status();
      ASSERT_EQ(byh->status.size(), size_t(k * batch));
      for (int64_t j = 0; j < k; ++j) {
        Job unary{Kind::kDense};
        unary.options.method = method;
        const ArrayView bj{DType::kFloat64, {batch, n}, b.as<double>() + j * batch * n};
        unary.arrays = {{"a", Am.view()}, {"b", bj}};
        auto un = cl.Solve(unary);
        ASSERT_TRUE(un.ok()) << un.status();
        for (int64_t s = 0; s < batch; ++s) {
          EXPECT_EQ(byh->status[size_t(j * batch + s)], s == 1 ? SolveStatus::kSingular
                                                                : SolveStatus::kOk);
          EXPECT_EQ(un->status[size_t(s)], byh->status[size_t(j * batch + s)]);
        }
        double worst = 0;
        for (int64_t i = 0; i < batch * n; ++i)
          worst = testing::WorseOf(worst, std::abs(byh->x.as<double>()[j * batch * n + i] -
                                                   un->x.as<double>()[i]));
        EXPECT_LT(worst, 1e-12) << "right-hand side " << j << ", round " << round;
      }
    }
    EXPECT_TRUE(cl.ReleaseSystem(info->handle).ok());
  }
}

TEST_F(Systems, EveryFamilyByHandleMatchesTheUnaryAnswer) {
  Client cl = MakeClient();
  // Tree: a random tree, lower != upper.
  const int64_t n = 60, cells = 3;
  std::vector<int32_t> parent(n);
  std::mt19937 rng(3);
  parent[0] = -1;
  for (int64_t i = 1; i < n; ++i) parent[size_t(i)] = int32_t(rng() % uint32_t(i));
  const NdArray par = NdArray::From<int32_t>({n}, parent);
  const NdArray lo = Random({cells, n}, 1), upv = Random({cells, n}, 2, -0.5, 1.5),
                dg = Random({cells, n}, 3, 8, 9), rhs = Random({cells, n}, 4);
  Job tree{Kind::kTree};
  tree.arrays = {{"parent", par.view()}, {"lower", lo.view()}, {"upper", upv.view()},
                 {"diag", dg.view()}};
  // Dense: one non-symmetric matrix, 5 right-hand sides.
  const NdArray A = Random({12, 12}, 5), bb = Random({5, 12}, 6);
  NdArray Ad = A;
  for (int i = 0; i < 12; ++i) Ad.as<double>()[i * 13] += 12;
  Job dense{Kind::kDense};
  dense.arrays = {{"A", Ad.view()}};
  // Block: the thesis' experiment 1, 3 right-hand sides.
  examples::Arrays e1 = examples::ThesisExperiment1(8, 10);
  Job block{Kind::kBlockTridiagonal};
  for (const auto& [name, a] : e1)
    if (name != "f") block.arrays[name] = a.view();
  block.options.tol = 1e-12;
  NdArray f3 = NdArray::Zeros(DType::kFloat64, {3, 8, 10});
  for (int j = 0; j < 3; ++j)
    for (int i = 0; i < 80; ++i) f3.as<double>()[j * 80 + i] = e1.at("f").as<double>()[i] * (j + 1);

  struct Case {
    Job create;
    NdArray rhs;
    const char* rhs_name;
  };
  Case cases[] = {{tree, rhs, "rhs"}, {dense, bb, "b"}, {block, f3, "f"}};
  for (Case& cs : cases) {
    SCOPED_TRACE(KindName(cs.create.kind));
    auto info = cl.CreateSystem(cs.create);
    ASSERT_TRUE(info.ok()) << info.status();
    auto byh = cl.SolveSystem(info->handle, cs.rhs.view());
    ASSERT_TRUE(byh.ok()) << byh.status();
    EXPECT_EQ(byh->summary.ok, byh->summary.systems);
    Job unary = cs.create;
    unary.arrays[cs.rhs_name] = cs.rhs.view();
    auto un = cl.Solve(unary);
    ASSERT_TRUE(un.ok()) << un.status();
    std::vector<double> want(un->x.as<double>(), un->x.as<double>() + un->x.elements());
    EXPECT_LT(RelDiff(byh->x, want), cs.create.kind == Kind::kBlockTridiagonal ? 1e-9 : 1e-13);
    EXPECT_TRUE(cl.ReleaseSystem(info->handle).ok());
  }
  // The tree's answer against an independent dense solve: A x = rhs for cell 0.
  {
    Job unary = tree;
    unary.arrays["rhs"] = rhs.view();
    auto un = cl.Solve(unary);
    ASSERT_TRUE(un.ok());
    const double* x = un->x.as<double>();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {  // row i: diag x_i + lower x_parent + sum of upper x_child
      double ax = dg.as<double>()[i] * x[i];
      if (i > 0) ax += lo.as<double>()[i] * x[parent[size_t(i)]];
      for (int64_t j = 1; j < n; ++j)
        if (parent[size_t(j)] == i) ax += upv.as<double>()[j] * x[j];
      worst = testing::WorseOf(worst, std::abs(ax - rhs.as<double>()[i]));
    }
    EXPECT_LT(worst, 1e-12);
  }
}

TEST_F(Systems, BadUpdatesAndRightHandSidesNameTheArray) {
  Client cl = MakeClient();
  const Tri t(2, 30, 41);
  auto info = cl.CreateSystem(t.AsJob());
  ASSERT_TRUE(info.ok()) << info.status();
  const NdArray wrong = Random({2, 31}, 1), good = Random({2, 30}, 2);
  NdArray nan = good;
  nan.as<double>()[7] = NAN;
  auto st = cl.UpdateSystem(info->handle, {{"b", wrong.view()}}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("b has shape [2, 31]"), std::string::npos) << st;
  st = cl.UpdateSystem(info->handle, {{"b", nan.view()}}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("NaN"), std::string::npos) << st;
  st = cl.UpdateSystem(info->handle, {{std::string(10000, 'z'), good.view()}}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(st.message().size(), 300u) << "a client's name is echoed bounded";
  st = cl.SolveSystem(info->handle, wrong.view()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rhs has shape [2, 31]"), std::string::npos) << st;
  st = cl.SolveSystem(info->handle, nan.view()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // A failed update left the system as it was.
  auto r = cl.SolveSystem(info->handle, good.view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(RelDiff(r->x, LocalTri(t.a, t.b, t.c, good.as<double>(), 2, 30)), 1e-13);
  // CreateSystem's own checks: a bad label, a negative time-to-live, no system at all.
  EXPECT_EQ(cl.CreateSystem(t.AsJob(), {.label = "a b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cl.CreateSystem(t.AsJob(), {.ttl_s = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cl.ReleaseSystem(info->handle).ok());
}

// Steps larger than HTTP/2's 64 MiB flow-control window with two in flight: the
// client writes step k + 1 while the server writes answer k. A server that reads only between
// its writes blocks against such a client for good; the deadline turns that into a failure.
TEST_F(Systems, TimeStepStreamKeepsMovingWithStepsOverTheWindow) {
  Client cl = MakeClient();
  constexpr int64_t kN = 5'000'000;  // a float64 rhs of 40 MB per step
  const Tri t(1, kN, 61);
  auto info = cl.CreateSystem(t.AsJob());
  ASSERT_TRUE(info.ok()) << info.status();
  // Four in flight: the client writes steps while the server's answers wait to be read (the
  // client library reads them on a thread of its own; a client that only wrote stalled both).
  for (int in_flight : {2, 4}) {
    auto stream = cl.OpenStepStream(info->handle, {.timeout_s = 60});
    ASSERT_TRUE(stream.ok()) << stream.status();
    std::vector<NdArray> d;
    for (int s = 0; s < in_flight; ++s) d.push_back(Random({kN}, 7000 + s));
    for (int s = 0; s < in_flight; ++s)
      ASSERT_TRUE((*stream)->Send(d[s].view()).ok()) << "step " << s;
    for (int s = 0; s < in_flight; ++s) {
      auto r = (*stream)->Receive();
      ASSERT_TRUE(r.ok()) << "in flight " << in_flight << ", step " << s << ": " << r.status();
      EXPECT_LT(RelDiff(r->x, LocalTri(t.a, t.b, t.c, d[s].as<double>(), 1, kN)), 1e-12)
          << "step " << s;
    }
    EXPECT_TRUE((*stream)->Finish().ok());
  }
  EXPECT_TRUE(cl.ReleaseSystem(info->handle).ok());
}

TEST_F(Systems, TimeStepStreamAnswersInOrderWithUpdates) {
  Client cl = MakeClient();
  const Tri t(4, 64, 51);
  auto info = cl.CreateSystem(t.AsJob());
  ASSERT_TRUE(info.ok()) << info.status();
  auto stream = cl.OpenStepStream(info->handle);
  ASSERT_TRUE(stream.ok()) << stream.status();
  constexpr int kSteps = 40;
  std::vector<NdArray> d, bs;
  for (int s = 0; s < kSteps; ++s) {
    d.push_back(Random({4, 64}, 1000 + s));
    bs.push_back(Random({4, 64}, 2000 + s, 3, 4));
  }
  // Every step sent before any answer is read: the answers must still come in order, each
  // with its own step's diagonal.
  for (int s = 0; s < kSteps; ++s)
    ASSERT_TRUE((*stream)->Send(d[s].view(), {{"b", bs[s].view()}}).ok());
  for (int s = 0; s < kSteps; ++s) {
    auto r = (*stream)->Receive();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(RelDiff(r->x, LocalTri(t.a, bs[s], t.c, d[s].as<double>(), 4, 64)), 1e-13)
        << "step " << s;
  }
  EXPECT_TRUE((*stream)->Finish().ok());

  // A bad step ends the stream with its own status.
  auto s2 = cl.OpenStepStream(info->handle);
  ASSERT_TRUE(s2.ok());
  ASSERT_TRUE((*s2)->Send(d[0].view()).ok());
  const NdArray bad = Random({4, 63}, 3);
  (void)(*s2)->Send(bad.view());
  auto first = (*s2)->Receive();
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = (*s2)->Receive();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument) << second.status();
  // A stream on a handle that does not exist.
  auto s3 = cl.OpenStepStream("sys-nope");
  ASSERT_TRUE(s3.ok());
  (void)(*s3)->Send(d[0].view());
  EXPECT_EQ((*s3)->Receive().status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cl.ReleaseSystem(info->handle).ok());
}

TEST_F(Systems, ConcurrentSolvesAndUpdatesEachGetTheirOwnAnswer) {
  // 8 clients: each solves its own system and a shared one, updating the shared diagonal in the
  // same call; the update and the solve run together, so every answer matches its own diagonal.
  Client owner = MakeClient();
  const Tri shared(2, 40, 61);
  auto sh = owner.CreateSystem(shared.AsJob());
  ASSERT_TRUE(sh.ok()) << sh.status();
  std::atomic<int> wrong{0}, failed{0}, done{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 8; ++c) {
    threads.emplace_back([&, c] {
      Client cl = MakeClient();
      const Tri mine(3, 50, 100 + c);
      auto info = cl.CreateSystem(mine.AsJob());
      if (!info.ok()) {
        ++failed;
        return;
      }
      for (int q = 0; q < 25; ++q) {
        const NdArray d = Random({3, 50}, 10000 * c + q);
        auto r = cl.SolveSystem(info->handle, d.view());
        if (!r.ok()) ++failed;
        else if (!(RelDiff(r->x, LocalTri(mine.a, mine.b, mine.c, d.as<double>(), 3, 50)) < 1e-12))
          ++wrong;
        const NdArray d2 = Random({2, 40}, 20000 * c + q);
        const NdArray b2 = Random({2, 40}, 30000 * c + q, 3, 4);
        auto r2 = cl.SolveSystem(sh->handle, d2.view(), {{"b", b2.view()}});
        if (!r2.ok()) ++failed;
        else if (!(RelDiff(r2->x, LocalTri(shared.a, b2, shared.c, d2.as<double>(), 2, 40)) < 1e-12))
          ++wrong;
        ++done;
      }
      if (!cl.ReleaseSystem(info->handle).ok()) ++failed;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(done.load(), 200);
  EXPECT_TRUE(owner.ReleaseSystem(sh->handle).ok());
}

// Identities, time-to-live, eviction and caps: servers of their own.
TEST(SystemsLimits, AnotherIdentityGetsNotFound) {
  const std::string tokens = "/tmp/trisolve_systems_tokens_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client::Options oa, ob;
  oa.target = ob.target = server.target();
  oa.token = "alice-token";
  ob.token = "bob-token";
  Client alice(oa), bob(ob);
  const Tri t(1, 20, 71);
  auto info = alice.CreateSystem(t.AsJob());
  ASSERT_TRUE(info.ok()) << info.status();
  const NdArray d = Random({20}, 1);
  EXPECT_EQ(bob.SolveSystem(info->handle, d.view()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.UpdateSystem(info->handle, {{"b", t.b.view()}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(bob.ReleaseSystem(info->handle).status().code(), absl::StatusCode::kNotFound);
  auto bl = bob.ListSystems();
  ASSERT_TRUE(bl.ok());
  EXPECT_TRUE(bl->empty());
  EXPECT_TRUE(alice.SolveSystem(info->handle, d.view()).ok()) << "bob's attempts left it alone";
  EXPECT_TRUE(alice.ReleaseSystem(info->handle).ok());
  std::remove(tokens.c_str());
}

TEST(SystemsLimits, IdleSystemsExpireAndTheLeastRecentlyUsedIsEvicted) {
  // Each system below holds 3 x 1000 float64 (24,000 bytes on the CPU backend): a cap of
  // 60,000 bytes holds two.
  // The registry's accounting, on the CPU backend whose systems hold exactly their host copy.
  ServerProcess server({"--max-system-bytes", "60000", "--max-systems-per-identity", "3"}, "cpu");
  ASSERT_GT(server.port(), 0) << server.Log();
  Client::Options o;
  o.target = server.target();
  Client cl(o);
  const Tri t(1, 1000, 81);
  const NdArray d = Random({1000}, 2);
  auto s1 = cl.CreateSystem(t.AsJob());
  auto s2 = cl.CreateSystem(t.AsJob());
  ASSERT_TRUE(s1.ok() && s2.ok());
  ASSERT_TRUE(cl.SolveSystem(s1->handle, d.view()).ok());  // s2 is now the least recently used
  auto s3 = cl.CreateSystem(t.AsJob());
  ASSERT_TRUE(s3.ok()) << s3.status();
  EXPECT_EQ(cl.SolveSystem(s2->handle, d.view()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cl.SolveSystem(s1->handle, d.view()).ok());
  EXPECT_TRUE(cl.SolveSystem(s3->handle, d.view()).ok());
  // A system larger than the cap, and more systems than the identity may hold.
  const Tri big(1, 4000, 82);
  EXPECT_EQ(cl.CreateSystem(big.AsJob()).status().code(), absl::StatusCode::kResourceExhausted);
  auto s4 = cl.CreateSystem(Tri(1, 10, 83).AsJob());
  ASSERT_TRUE(s4.ok()) << s4.status();
  EXPECT_EQ(cl.CreateSystem(Tri(1, 10, 84).AsJob()).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Time-to-live: a system idle past it is dropped by the sweeper (every second).
  ASSERT_TRUE(cl.ReleaseSystem(s4->handle).ok());
  auto brief = cl.CreateSystem(Tri(1, 10, 85).AsJob(), {.ttl_s = 0.2});
  ASSERT_TRUE(brief.ok()) << brief.status();
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto list = cl.ListSystems();
    ASSERT_TRUE(list.ok());
    gone = true;
    for (const auto& s : *list) gone &= s.handle != brief->handle;
  }
  EXPECT_TRUE(gone) << "a system idle past its time-to-live is dropped";
  EXPECT_EQ(cl.SolveSystem(brief->handle, Random({10}, 3).view()).status().code(),
            absl::StatusCode::kNotFound);
  auto info = cl.Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->systems, 2);  // s1 and s3
  ASSERT_TRUE(cl.ReleaseSystem(s1->handle).ok());
  ASSERT_TRUE(cl.ReleaseSystem(s3->handle).ok());
  info = cl.Info();
  EXPECT_EQ(info->systems, 0);
  EXPECT_EQ(info->system_bytes, 0) << "every byte returned";
}

}  // namespace
}  // namespace trisolve

namespace trisolve {
namespace {

// A bounded soak: clients mixing unary solves, solves and updates by handle, time-step
// streams, calls whose deadline is too short to be met and malformed calls. Every answer that
// comes back OK is checked; every other one must carry the status its case allows; afterwards
// the server serves, holds no system and no job.
TEST(Soak, MixedCallsEachAnsweredCorrectlyOrWithAClearStatus) {
  ServerProcess server({"--max-concurrent-jobs", "2", "--max-queued-jobs", "256"});
  ASSERT_GT(server.port(), 0) << server.Log();
  constexpr int kClients = 8, kRounds = 60;
  std::atomic<int> wrong{0}, unexpected{0}, ok{0}, refused{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      Client::Options o;
      o.target = server.target();
      o.own_connection = true;
      Client cl(o);
      const Tri t(4, 48, 500 + c);
      auto sys = cl.CreateSystem(t.AsJob());
      if (!sys.ok()) {
        ++unexpected;
        return;
      }
      std::mt19937 rng(c);
      for (int q = 0; q < kRounds; ++q) {
        const NdArray d = Random({4, 48}, 100000 * c + q);
        const std::vector<double> want = LocalTri(t.a, t.b, t.c, d.as<double>(), 4, 48);
        auto check = [&](const absl::StatusOr<Result>& r,
                         std::initializer_list<absl::StatusCode> allowed) {
          if (r.ok()) {
            if (RelDiff(r->x, want) < 1e-12) ++ok;
            else ++wrong;
            return;
          }
          bool fine = false;
          for (auto code : allowed) fine |= r.status().code() == code;
          if (fine) ++refused;
          else ++unexpected;
        };
        switch (rng() % 5) {
          case 0: {  // unary, sometimes with a deadline too short to be met
            Job job = t.AsJob();
            job.arrays["d"] = d.view();
            if (rng() % 2) job.options.timeout_s = 1e-4;
            check(cl.Solve(job), {absl::StatusCode::kDeadlineExceeded});
            break;
          }
          case 1: {  // by handle, with a short deadline half the time
            JobOptions jo;
            if (rng() % 2) jo.timeout_s = 1e-4;
            check(cl.SolveSystem(sys->handle, d.view(), {}, jo),
                  {absl::StatusCode::kDeadlineExceeded});
            break;
          }
          case 2: {  // an update to the same values and a solve
            if (!cl.UpdateSystem(sys->handle, {{"b", t.b.view()}}).ok()) ++unexpected;
            check(cl.SolveSystem(sys->handle, d.view()), {});
            break;
          }
          case 3: {  // three steps of a time-step stream
            auto s = cl.OpenStepStream(sys->handle);
            if (!s.ok()) {
              ++unexpected;
              break;
            }
            for (int k = 0; k < 3; ++k) (void)(*s)->Send(d.view());
            for (int k = 0; k < 3; ++k) check((*s)->Receive(), {});
            if (!(*s)->Finish().ok()) ++unexpected;
            break;
          }
          default: {  // malformed: a wrong shape, a foreign handle
            const NdArray bad = Random({4, 47}, q);
            auto r1 = cl.SolveSystem(sys->handle, bad.view());
            auto r2 = cl.SolveSystem("sys-0000", d.view());
            if (r1.status().code() == absl::StatusCode::kInvalidArgument &&
                r2.status().code() == absl::StatusCode::kNotFound)
              ++refused;
            else
              ++unexpected;
          }
        }
      }
      if (!cl.ReleaseSystem(sys->handle).ok()) ++unexpected;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(ok.load(), kClients * kRounds / 2);
  Client::Options o;
  o.target = server.target();
  Client cl(o);
  EXPECT_EQ(*cl.Health(), "SERVING");
  auto info = cl.Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->systems, 0);
  EXPECT_EQ(info->system_bytes, 0);
  EXPECT_EQ(info->jobs_in_flight, 0);
  EXPECT_EQ(info->jobs_queued, 0);
}

}  // namespace
}  // namespace trisolve

namespace trisolve {
namespace {

// A streamed tridiagonal header of one system of n (no data: chunks follow).
v1::StreamRequest StreamHeader(int64_t n) {
  v1::StreamRequest h;
  auto* r = h.mutable_tridiagonal();
  r->set_dtype(v1::FLOAT64);
  for (auto* a : {r->mutable_a(), r->mutable_b(), r->mutable_c(), r->mutable_d()}) a->add_shape(n);
  return h;
}

TEST(Receiving, StreamsAreAdmittedAtTheirHeaderAgainstTheBudget) {
  ServerProcess server({"--max-receiving-bytes", "1000000", "--max-receiving-streams", "2"});
  ASSERT_GT(server.port(), 0) << server.Log();
  auto stub = testing::DefaultStub(server.target());
  // A header declaring more than the budget: refused at once, nothing allocated.
  {
    grpc::ClientContext ctx;
    auto rw = stub->SolveStream(&ctx);
    rw->Write(StreamHeader(100000));  // 4 arrays of 800,000 bytes
    rw->WritesDone();
    v1::StreamResponse resp;
    while (rw->Read(&resp)) {
    }
    const grpc::Status st = rw->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(st.error_message().find("max_receiving_bytes"), std::string::npos) << st.error_message();
  }
  // Two streams receiving (header and one chunk each, then waiting): a third is refused.
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamResponse>>> open;
  for (int i = 0; i < 2; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    open.push_back(stub->SolveStream(ctxs.back().get()));
    open.back()->Write(StreamHeader(10));
  }
  grpc::Status third;
  for (int attempt = 0; attempt < 100; ++attempt) {  // until the server has taken both headers
    grpc::ClientContext ctx;
    auto rw = stub->SolveStream(&ctx);
    rw->Write(StreamHeader(10));
    rw->WritesDone();
    v1::StreamResponse resp;
    while (rw->Read(&resp)) {
    }
    third = rw->Finish();
    if (third.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_NE(third.error_message().find("max_receiving_streams"), std::string::npos);
  // The two finish normally and free their places.
  for (auto& rw : open) {
    for (const char* name : {"a", "b", "c", "d"}) {
      v1::StreamRequest msg;
      msg.mutable_chunk()->set_array(name);
      const std::vector<double> v(10, std::string(name) == "b" ? 4.0 : 1.0);
      msg.mutable_chunk()->set_data(v.data(), v.size() * 8);
      rw->Write(msg);
    }
    rw->WritesDone();
    v1::StreamResponse resp;
    while (rw->Read(&resp)) {
    }
    EXPECT_TRUE(rw->Finish().ok());
  }
}

TEST(Receiving, ASilentStreamEndsAtTheServersDeadline) {
  ServerProcess server({"--default-deadline", "1"});
  ASSERT_GT(server.port(), 0) << server.Log();
  auto stub = testing::DefaultStub(server.target());
  grpc::ClientContext ctx;  // no deadline of its own
  auto rw = stub->SolveStream(&ctx);
  rw->Write(StreamHeader(1000));
  v1::StreamRequest msg;
  msg.mutable_chunk()->set_array("a");
  const std::vector<double> v(100, 1.0);
  msg.mutable_chunk()->set_data(v.data(), v.size() * 8);
  rw->Write(msg);
  const auto t0 = std::chrono::steady_clock::now();
  v1::StreamResponse resp;
  while (rw->Read(&resp)) {  // the client says nothing more
  }
  const grpc::Status st = rw->Finish();
  EXPECT_NE(st.error_code(), grpc::StatusCode::OK);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // The server counts and logs it as a deadline, not a bad request.
  bool logged = false;
  for (int i = 0; i < 100 && !logged; ++i) {
    logged = server.Log().find("DEADLINE_EXCEEDED the deadline passed while the job was being "
                               "received") != std::string::npos;
    if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(logged) << server.Log();
}

}  // namespace
}  // namespace trisolve

namespace trisolve {
namespace {

TEST(Precision, AFloat32RightHandSideDoesNotNarrowFloat64Coefficients) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client::Options o;
  o.target = server.target();
  Client cl(o);
  const Tri t(3, 40, 901);
  const NdArray d = Random({3, 40}, 902);
  auto d32 = d.ConvertTo(DType::kFloat32);
  ASSERT_TRUE(d32.ok());
  Job job = t.AsJob();
  job.arrays["d"] = d32->view();
  auto r = cl.Solve(job);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->x.dtype, DType::kFloat64) << "float64 coefficients make the job float64";
  // The right-hand side widened exactly: the answer is the float64 solve of the float32 values.
  NdArray dw = *d32->ConvertTo(DType::kFloat64);
  EXPECT_LT(RelDiff(r->x, LocalTri(t.a, t.b, t.c, dw.as<double>(), 3, 40)), 1e-13);
}

}  // namespace
}  // namespace trisolve
