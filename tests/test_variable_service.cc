// Variable-size tridiagonal batches and the unified-vector layout end to end: the real
// trisolved through the client library (unary and streamed), raw gRPC for every bad `lengths`
// and `abc`, CreateSystem's refusals, and the CLI's lengths=FILE.npy and abc=FILE.npy.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <unistd.h>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "client_test_util.h"
#include "gtest/gtest.h"
#include "raw_stub.h"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/ndarray.h"
#include "trisolve/reference/tridiagonal.h"
#include "trisolve/tridiagonal.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using testing::ServerProcess;
using testing::Shell;

class VariableService : public testing::SharedServerSuite {};

// A batch of systems of the given sizes, concatenated, with a zero-diagonal system (b = 0,
// a = c = 1: nonsingular for even n, which the callers choose) where `zero_diagonal` names one.
struct VarArrays {
  std::vector<int32_t> lengths;
  std::vector<int64_t> offsets{0};
  std::vector<double> a, b, c, d;
};
VarArrays MakeVar(const std::vector<int32_t>& sizes, int zero_diagonal, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  VarArrays v;
  v.lengths = sizes;
  for (size_t s = 0; s < sizes.size(); ++s) {
    for (int32_t k = 0; k < sizes[s]; ++k) {
      const bool z = int(s) == zero_diagonal;
      v.a.push_back(z ? 1 : u(rng));
      v.c.push_back(z ? 1 : u(rng));
      v.b.push_back(z ? 0 : 2.5 + u(rng));
      v.d.push_back(u(rng));
    }
    v.offsets.push_back(int64_t(v.a.size()));
  }
  return v;
}

// The CPU reference's answer (auto) for v, in the precision T.
template <typename T>
std::vector<T> Reference(const VarArrays& v) {
  std::vector<T> a(v.a.begin(), v.a.end()), b(v.b.begin(), v.b.end()), c(v.c.begin(), v.c.end()),
      d(v.d.begin(), v.d.end()), x(v.a.size());
  std::vector<SystemStatus> st(v.lengths.size());
  TridiagonalProblem<T> p{int64_t(v.lengths.size()), 0, Layout::kFlat, a.data(), b.data(),
                          c.data(), d.data()};
  p.offsets = v.offsets.data();
  cpu::SolveTridiagonal(p, TridiagonalMethod::kAuto, TridiagonalOutput<T>{x.data(), st.data()});
  return x;
}

Job VarJob(const VarArrays& v) {
  Job job;
  job.kind = Kind::kTridiagonal;
  const std::vector<int64_t> total = {int64_t(v.a.size())};
  job.arrays["a"] = {DType::kFloat64, total, v.a.data()};
  job.arrays["b"] = {DType::kFloat64, total, v.b.data()};
  job.arrays["c"] = {DType::kFloat64, total, v.c.data()};
  job.arrays["d"] = {DType::kFloat64, total, v.d.data()};
  job.arrays["lengths"] = {DType::kInt32, {int64_t(v.lengths.size())}, v.lengths.data()};
  return job;
}

void ExpectSameAnswer(const Result& r, const VarArrays& v, double tol) {
  const std::vector<double> want = Reference<double>(v);
  ASSERT_EQ(r.x.shape, std::vector<int64_t>{int64_t(v.a.size())});
  ASSERT_EQ(r.status.size(), v.lengths.size());
  for (SolveStatus s : r.status) EXPECT_EQ(s, SolveStatus::kOk);
  const double* x = reinterpret_cast<const double*>(r.x.data.data());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(x[i], want[i], tol * (1 + std::abs(want[i]))) << i;
  EXPECT_EQ(r.summary.systems, int64_t(v.lengths.size()));
  EXPECT_LE(r.summary.residual, 1e-14);
}

TEST_F(VariableService, SolvesSystemsOfDifferentSizesInOneRequest) {
  // Enough unknowns for the CUDA backend to take it to the device (auto's host threshold).
  std::vector<int32_t> sizes = {1, 2, 3, 17, 100, 4096, 5000, 33};
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) sizes.push_back(int32_t(32 + rng() % 400));
  const VarArrays v = MakeVar(sizes, 5, 7);
  Client client = MakeClient();
  auto r = client.Solve(VarJob(v));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSameAnswer(*r, v, 1e-12);
  EXPECT_FALSE(r->summary.streamed);
}

TEST_F(VariableService, StreamedAnswerIsTheUnaryOne) {
  const VarArrays v = MakeVar({300, 1, 7000, 64, 2}, 3, 9);
  Client unary = MakeClient(), streamed = MakeClient(1024);
  auto r1 = unary.Solve(VarJob(v));
  auto r2 = streamed.Solve(VarJob(v));
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_TRUE(r2->summary.streamed);
  ExpectSameAnswer(*r2, v, 1e-12);
  EXPECT_EQ(r1->x.data, r2->x.data);
}

TEST_F(VariableService, Int64LengthsAndFloat32) {
  const VarArrays v = MakeVar({5, 9, 1, 12}, -1, 11);
  std::vector<int64_t> len64(v.lengths.begin(), v.lengths.end());
  std::vector<float> a(v.a.begin(), v.a.end()), b(v.b.begin(), v.b.end()),
      c(v.c.begin(), v.c.end()), d(v.d.begin(), v.d.end());
  Job job;
  const std::vector<int64_t> total = {int64_t(a.size())};
  job.arrays["a"] = {DType::kFloat32, total, a.data()};
  job.arrays["b"] = {DType::kFloat32, total, b.data()};
  job.arrays["c"] = {DType::kFloat32, total, c.data()};
  job.arrays["d"] = {DType::kFloat32, total, d.data()};
  job.arrays["lengths"] = {DType::kInt64, {4}, len64.data()};
  auto r = MakeClient().Solve(job);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->x.dtype, DType::kFloat32);
  const std::vector<float> want = Reference<float>(v);
  const float* x = reinterpret_cast<const float*>(r->x.data.data());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(x[i], want[i], 1e-5f) << i;
  EXPECT_LE(r->summary.residual, 1e-6);
}

// x and the statuses of a by-handle answer equal a one-shot answer's, bit for bit (the CPU
// backend runs the same solve on the same arrays).
void ExpectSameAs(const Result& by_handle, const Result& one_shot, const std::string& what) {
  EXPECT_EQ(by_handle.x.shape, one_shot.x.shape) << what;
  EXPECT_TRUE(by_handle.x.data == one_shot.x.data) << what;
  EXPECT_EQ(by_handle.status, one_shot.status) << what;
}

// The system without its right-hand side, for CreateSystem.
Job VarSystem(const VarArrays& v) {
  Job job = VarJob(v);
  job.arrays.erase("d");
  return job;
}

// System `s` of v made exactly singular: every row of it zero.
void ZeroSystem(VarArrays& v, size_t s) {
  for (int64_t i = v.offsets[s]; i < v.offsets[s + 1]; ++i) v.a[size_t(i)] = v.b[size_t(i)] = v.c[size_t(i)] = 0;
}

TEST_F(VariableService, ByHandleAnswersAreTheOneShotOnes) {
  std::vector<int32_t> sizes = {1, 2, 3, 17, 100, 4096, 5000, 33};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100; ++i) sizes.push_back(int32_t(1 + rng() % 300));
  VarArrays v = MakeVar(sizes, 5, 13);  // system 5 a zero diagonal (nonsingular, pivots)
  ZeroSystem(v, 3);                     // system 3 singular
  const int64_t total = int64_t(v.a.size()), systems = int64_t(sizes.size());
  Client client = MakeClient();
  auto sys = client.CreateSystem(VarSystem(v), {.label = "lines"});
  ASSERT_TRUE(sys.ok()) << sys.status();
  EXPECT_TRUE(sys->variable);
  EXPECT_EQ(sys->systems, systems);
  EXPECT_EQ(sys->rhs_shape, std::vector<int64_t>{total});
  EXPECT_GE(sys->bytes, 3 * total * 8 + systems * 4);  // a, b, c and the lengths at least

  auto one_shot = client.Solve(VarJob(v));
  ASSERT_TRUE(one_shot.ok()) << one_shot.status();
  const ArrayView d{DType::kFloat64, {total}, v.d.data()};
  auto by_handle = client.SolveSystem(sys->handle, d);
  ASSERT_TRUE(by_handle.ok()) << by_handle.status();
  ExpectSameAs(*by_handle, *one_shot, "one right-hand side");
  ASSERT_EQ(by_handle->status.size(), size_t(systems));
  for (int64_t s = 0; s < systems; ++s)
    EXPECT_EQ(by_handle->status[size_t(s)], s == 3 ? SolveStatus::kSingular : SolveStatus::kOk)
        << "system " << s;
  EXPECT_LE(by_handle->summary.residual, 1e-14);

  // k = 3 right-hand sides [3, total]: each block the one-shot answer for it.
  std::vector<double> three;
  std::vector<VarArrays> each(3, v);
  for (int j = 0; j < 3; ++j) {
    for (double& x : each[size_t(j)].d) x = x * (j + 1) - j;
    three.insert(three.end(), each[size_t(j)].d.begin(), each[size_t(j)].d.end());
  }
  auto k3 = client.SolveSystem(sys->handle, {DType::kFloat64, {3, total}, three.data()});
  ASSERT_TRUE(k3.ok()) << k3.status();
  ASSERT_EQ(k3->x.shape, (std::vector<int64_t>{3, total}));
  ASSERT_EQ(k3->status.size(), size_t(3 * systems));
  EXPECT_EQ(k3->summary.right_hand_sides, 3);
  const long block = long(total * 8);
  for (int j = 0; j < 3; ++j) {
    auto want = client.Solve(VarJob(each[size_t(j)]));
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(std::equal(want->x.data.begin(), want->x.data.end(),
                           k3->x.data.begin() + j * block))
        << "block " << j;
    EXPECT_TRUE(std::equal(want->status.begin(), want->status.end(),
                           k3->status.begin() + j * systems));
  }

  // An update of b that cures system 3: every system OK, the one-shot answer with it.
  VarArrays cured = v;
  for (int64_t i = v.offsets[3]; i < v.offsets[4]; ++i) cured.b[size_t(i)] = 2;
  auto updated = client.UpdateSystem(sys->handle,
                                     {{"b", ArrayView{DType::kFloat64, {total}, cured.b.data()}}});
  ASSERT_TRUE(updated.ok()) << updated.status();
  auto after = client.SolveSystem(sys->handle, d);
  ASSERT_TRUE(after.ok()) << after.status();
  auto cured_one_shot = client.Solve(VarJob(cured));
  ASSERT_TRUE(cured_one_shot.ok()) << cured_one_shot.status();
  ExpectSameAs(*after, *cured_one_shot, "after the update");
  for (SolveStatus st : after->status) EXPECT_EQ(st, SolveStatus::kOk);

  // The time-step stream by handle, a step with an update of c among them.
  VarArrays step2 = cured;
  for (double& x : step2.c) x *= 0.5;
  auto stream = client.OpenStepStream(sys->handle);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Send(d).ok());
  ASSERT_TRUE(
      (*stream)->Send(d, {{"c", ArrayView{DType::kFloat64, {total}, step2.c.data()}}}).ok());
  auto s1 = (*stream)->Receive();
  auto s2 = (*stream)->Receive();
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_TRUE((*stream)->Finish().ok());
  ExpectSameAs(*s1, *cured_one_shot, "stream step 1");
  auto want2 = client.Solve(VarJob(step2));
  ASSERT_TRUE(want2.ok()) << want2.status();
  ExpectSameAs(*s2, *want2, "stream step 2 (c updated)");

  // Through a request ring: its status room from the system's count, k right-hand sides too.
  Client::Options ro;
  ro.target = server_->target();
  ro.transport = Transport::kRing;
  ro.own_connection = true;
  Client ring(ro);
  auto listed = ring.ListSystems();  // the ring client learns the system's shape here
  ASSERT_TRUE(listed.ok()) << listed.status();
  bool found = false;
  for (const SystemInfo& i : *listed)
    if (i.handle == sys->handle) {
      found = true;
      EXPECT_TRUE(i.variable);
      EXPECT_EQ(i.systems, systems);
    }
  EXPECT_TRUE(found);
  auto r1 = ring.SolveSystem(sys->handle, d);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->summary.transport, "ring");
  ExpectSameAs(*r1, *want2, "ring");
  std::vector<double> two(v.d);
  two.insert(two.end(), v.d.begin(), v.d.end());
  auto r2 = ring.SolveSystem(sys->handle, {DType::kFloat64, {2, total}, two.data()});
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->summary.transport, "ring");
  ASSERT_EQ(r2->status.size(), size_t(2 * systems));
  EXPECT_TRUE(std::equal(want2->x.data.begin(), want2->x.data.end(), r2->x.data.begin()));
  EXPECT_TRUE(std::equal(want2->x.data.begin(), want2->x.data.end(), r2->x.data.begin() + block));

  ASSERT_TRUE(client.ReleaseSystem(sys->handle).ok());
  EXPECT_EQ(client.SolveSystem(sys->handle, d).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(VariableService, Float32ByHandle) {
  const VarArrays v = MakeVar({5, 9, 1, 12, 300}, -1, 11);
  std::vector<float> a(v.a.begin(), v.a.end()), b(v.b.begin(), v.b.end()),
      c(v.c.begin(), v.c.end()), d(v.d.begin(), v.d.end());
  const std::vector<int64_t> total = {int64_t(a.size())};
  Job job;
  job.arrays["a"] = {DType::kFloat32, total, a.data()};
  job.arrays["b"] = {DType::kFloat32, total, b.data()};
  job.arrays["c"] = {DType::kFloat32, total, c.data()};
  job.arrays["lengths"] = {DType::kInt32, {5}, v.lengths.data()};
  Client client = MakeClient();
  auto sys = client.CreateSystem(job, {});
  ASSERT_TRUE(sys.ok()) << sys.status();
  job.arrays["d"] = {DType::kFloat32, total, d.data()};
  auto one_shot = client.Solve(job);
  ASSERT_TRUE(one_shot.ok()) << one_shot.status();
  auto by_handle = client.SolveSystem(sys->handle, {DType::kFloat32, total, d.data()});
  ASSERT_TRUE(by_handle.ok()) << by_handle.status();
  EXPECT_EQ(by_handle->x.dtype, DType::kFloat32);
  ExpectSameAs(*by_handle, *one_shot, "float32");
  EXPECT_LE(by_handle->summary.residual, 1e-6);
  ASSERT_TRUE(client.ReleaseSystem(sys->handle).ok());
}

TEST_F(VariableService, ByHandleRefusalsNameTheField) {
  const VarArrays v = MakeVar({3, 4}, -1, 1);
  Client client = MakeClient();
  auto sys = client.CreateSystem(VarSystem(v), {});
  ASSERT_TRUE(sys.ok()) << sys.status();
  const ArrayView d{DType::kFloat64, {7}, v.d.data()};
  std::vector<double> eight(8, 1.0);
  using C = absl::StatusCode;
  testing::Expect(client.SolveSystem(sys->handle, {DType::kFloat64, {8}, eight.data()}).status(),
                  C::kInvalidArgument, "rhs has shape [8], expected [7]");
  testing::Expect(client.SolveSystem(sys->handle, {DType::kFloat64, {2, 4}, eight.data()}).status(),
                  C::kInvalidArgument, "rhs has shape [2, 4], expected [7]");
  testing::Expect(
      client.UpdateSystem(sys->handle, {{"b", ArrayView{DType::kFloat64, {8}, eight.data()}}})
          .status(),
      C::kInvalidArgument, "b has shape [8], expected [7]");
  testing::Expect(
      client.UpdateSystem(sys->handle, {{"lengths", ArrayView{DType::kInt32, {2}, v.lengths.data()}}})
          .status(),
      C::kInvalidArgument, "update: 'lengths' is fixed when the system is created");
  std::vector<double> nan(v.b);
  nan[4] = std::nan("");
  testing::Expect(
      client.UpdateSystem(sys->handle, {{"b", ArrayView{DType::kFloat64, {7}, nan.data()}}})
          .status(),
      C::kInvalidArgument, "b[4]");
  // A range of its systems: refused, solved whole.
  auto stub = testing::RawStub(server_->target());
  for (auto [first, count] : {std::pair{0, 1}, {1, 1}, {0, 2}}) {
    v1::SolveSystemRequest req;
    req.set_handle(sys->handle);
    req.mutable_rhs()->add_shape(v.lengths[size_t(first)]);
    req.mutable_rhs()->set_data(v.d.data(), size_t(v.lengths[size_t(first)]) * 8);
    req.set_first_system(first);
    req.set_systems(count);
    grpc::ClientContext ctx;
    v1::SolveResponse resp;
    const grpc::Status st = stub->SolveSystem(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << first << " " << count;
    EXPECT_NE(st.error_message().find("first_system: a range of systems is solved for batches of "
                                      "one size; this batch's 2 systems have different sizes"),
              std::string::npos)
        << st.error_message();
  }
  // Still answers whole, as before the refusals.
  auto whole = client.SolveSystem(sys->handle, d);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ExpectSameAnswer(*whole, v, 1e-14);
  ASSERT_TRUE(client.ReleaseSystem(sys->handle).ok());

  // CreateSystem checks lengths as a solve does.
  for (const auto& [what, edit, part] :
       std::vector<std::tuple<const char*, std::function<void(Job&)>, const char*>>{
           {"sum short", [&](Job& j) { j.arrays["lengths"].shape = {1}; },
            "lengths: the 1 lengths sum to 3, but a, b, c and d hold 7"},
           {"interleaved", [](Job& j) { j.options.interleaved = true; },
            "lengths: a variable-size batch takes layout FLAT"}}) {
    Job job = VarSystem(v);
    edit(job);
    testing::Expect(client.CreateSystem(job, {}).status(), C::kInvalidArgument, part);
  }
  std::vector<int32_t> zero = {7, 0};
  Job job = VarSystem(v);
  job.arrays["lengths"].data = zero.data();
  testing::Expect(client.CreateSystem(job, {}).status(), C::kInvalidArgument,
                  "lengths: lengths[1] is 0");
}

TEST(VariableByHandle, AnotherIdentityGetsNotFound) {
  const std::string tokens = "/tmp/trisolve_varhandle_tokens_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client alice(testing::ClientOptions(server, Transport::kGrpc, "alice-token"));
  Client bob(testing::ClientOptions(server, Transport::kGrpc, "bob-token"));
  const VarArrays v = MakeVar({3, 4, 9}, -1, 2);
  auto sys = alice.CreateSystem(VarSystem(v), {});
  ASSERT_TRUE(sys.ok()) << sys.status();
  const ArrayView d{DType::kFloat64, {16}, v.d.data()};
  for (const absl::Status& st :
       {bob.SolveSystem(sys->handle, d).status(),
        bob.UpdateSystem(sys->handle, {{"b", ArrayView{DType::kFloat64, {16}, v.b.data()}}}).status(),
        bob.ReleaseSystem(sys->handle).status()})
    testing::Expect(st, absl::StatusCode::kNotFound, "no such system");
  auto mine = alice.SolveSystem(sys->handle, d);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ExpectSameAnswer(*mine, v, 1e-14);
  std::remove(tokens.c_str());
}

void Arr(v1::Array* a, std::vector<int64_t> shape, const std::vector<double>& v) {
  for (int64_t d : shape) a->add_shape(d);
  a->set_data(v.data(), v.size() * sizeof(double));
}
void Lengths(v1::Array* a, const std::vector<int32_t>& v) {
  a->Clear();
  a->add_shape(int64_t(v.size()));
  a->set_data(v.data(), v.size() * sizeof(int32_t));
}

// Two systems, n = 1 and n = 3: [2] x = [4]; [4 1 0; 1 4 1; 0 1 4] x = [5 6 5].
// Sends `req` (one case of a table of malformed requests) and checks the status code and that
// the message holds `part`; returns the answer for the cases that must be solved.
template <typename Stub>
v1::SolveResponse ExpectAnswer(Stub& stub, const v1::TridiagonalRequest& req, grpc::StatusCode code,
                               const std::string& part, const std::string& what) {
  grpc::ClientContext ctx;
  v1::SolveResponse resp;
  const grpc::Status st = stub->SolveTridiagonal(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), code) << what << ": " << st.error_message();
  EXPECT_NE(st.error_message().find(part), std::string::npos)
      << what << ": '" << st.error_message() << "' lacks '" << part << "'";
  EXPECT_LT(st.error_message().size(), 1000u) << what;
  return resp;
}

v1::TridiagonalRequest GoodVariable() {
  v1::TridiagonalRequest r;
  r.set_dtype(v1::FLOAT64);
  Arr(r.mutable_a(), {4}, {0, 0, 1, 1});
  Arr(r.mutable_b(), {4}, {2, 4, 4, 4});
  Arr(r.mutable_c(), {4}, {0, 1, 1, 0});
  Arr(r.mutable_d(), {4}, {4, 5, 6, 5});
  Lengths(r.mutable_lengths(), {1, 3});
  return r;
}

TEST_F(VariableService, EveryBadLengthsHasItsStatusAndNamesTheField) {
  auto stub = testing::RawStub(server_->target());
  using C = grpc::StatusCode;
  struct Case {
    const char* what;
    C code;
    const char* part;
    std::function<void(v1::TridiagonalRequest&)> mutate;
  };
  const std::string huge(100000, 'x');
  std::vector<Case> cases = {
      {"good", C::OK, "", [](auto&) {}},
      {"a zero length", C::INVALID_ARGUMENT, "lengths: lengths[1] is 0",
       [](auto& r) { Lengths(r.mutable_lengths(), {4, 0}); }},
      {"a negative length", C::INVALID_ARGUMENT, "lengths: lengths[0] is -1",
       [](auto& r) { Lengths(r.mutable_lengths(), {-1, 5}); }},
      {"sum short", C::INVALID_ARGUMENT, "lengths: the 2 lengths sum to 3, but a, b, c and d hold 4",
       [](auto& r) { Lengths(r.mutable_lengths(), {1, 2}); }},
      {"sum long", C::INVALID_ARGUMENT, "sum to 5",
       [](auto& r) { Lengths(r.mutable_lengths(), {2, 3}); }},
      {"a sum that would overflow int32", C::INVALID_ARGUMENT, "lengths: lengths[2] is",
       [](auto& r) { Lengths(r.mutable_lengths(), {2147483647, 2147483647, -2147483647 + 1}); }},
      {"more systems than rows", C::INVALID_ARGUMENT,
       "lengths: has 5 systems of at least one row each, but d holds 4 values",
       [](auto& r) { Lengths(r.mutable_lengths(), {1, 1, 1, 1, 1}); }},
      {"empty lengths", C::INVALID_ARGUMENT, "lengths: missing",
       [](auto& r) { r.mutable_lengths()->Clear(); r.mutable_lengths()->set_data("", 0); }},
      {"lengths of rank 2", C::INVALID_ARGUMENT, "lengths has shape [1, 2], expected [systems]",
       [](auto& r) {
         r.mutable_lengths()->set_shape(0, 1);
         r.mutable_lengths()->add_shape(2);
       }},
      {"lengths' bytes", C::INVALID_ARGUMENT, "lengths has 4 bytes of data, expected 8",
       [](auto& r) { r.mutable_lengths()->mutable_data()->resize(4); }},
      {"lengths as float64 bytes", C::INVALID_ARGUMENT, "lengths has 16 bytes of data, expected 8",
       [](auto& r) {
         const std::vector<double> f = {1, 3};
         r.mutable_lengths()->set_data(f.data(), 16);
       }},
      {"interleaved", C::INVALID_ARGUMENT, "lengths: a variable-size batch takes layout FLAT",
       [](auto& r) { r.set_layout(v1::INTERLEAVED); }},
      {"d of rank 2", C::INVALID_ARGUMENT, "d has shape [1, 4], expected [total]",
       [](auto& r) {
         r.mutable_d()->set_shape(0, 1);
         r.mutable_d()->add_shape(4);
       }},
      {"b shorter than d", C::INVALID_ARGUMENT, "b has shape [3], expected [4]",
       [&](auto& r) {
         r.mutable_b()->Clear();
         Arr(r.mutable_b(), {3}, {2, 4, 4});
       }},
      {"a NaN in c", C::INVALID_ARGUMENT, "c[2] is NaN",
       [](auto& r) {
         const double nan = std::nan("");
         std::memcpy(r.mutable_c()->mutable_data()->data() + 16, &nan, 8);
       }},
      {"too many unknowns", C::RESOURCE_EXHAUSTED, "max_job_unknowns = 20000000",
       [](auto& r) {
         for (auto* a : {r.mutable_a(), r.mutable_b(), r.mutable_c(), r.mutable_d()})
           a->set_shape(0, 30000000);
       }},
      {"an unbounded region name is not echoed", C::NOT_FOUND, "lengths.region: no region named",
       [&](auto& r) {
         r.mutable_lengths()->clear_data();
         r.mutable_lengths()->mutable_region()->set_region(huge);
       }},
  };
  for (auto& k : cases) {
    v1::TridiagonalRequest req = GoodVariable();
    k.mutate(req);
    const v1::SolveResponse resp = ExpectAnswer(stub, req, k.code, k.part, k.what);
    if (k.code == C::OK) {
      ASSERT_EQ(resp.status_size(), 2);
      const double* x = reinterpret_cast<const double*>(resp.x().data().data());
      EXPECT_DOUBLE_EQ(x[0], 2);
      for (int i = 1; i < 4; ++i) EXPECT_NEAR(x[i], 1, 1e-15);
    }
  }
}

TEST_F(VariableService, StreamedBadLengthsAreRefusedOnceTheBytesAreThere) {
  auto stub = testing::RawStub(server_->target());
  grpc::ClientContext ctx;
  auto stream = stub->SolveStream(&ctx);
  v1::StreamRequest header;
  *header.mutable_tridiagonal() = GoodVariable();
  for (auto* a : {header.mutable_tridiagonal()->mutable_a(), header.mutable_tridiagonal()->mutable_b(),
                  header.mutable_tridiagonal()->mutable_c(), header.mutable_tridiagonal()->mutable_d(),
                  header.mutable_tridiagonal()->mutable_lengths()})
    a->clear_data();
  ASSERT_TRUE(stream->Write(header));
  const v1::TridiagonalRequest good = GoodVariable();
  const std::vector<int32_t> bad = {2, 3};
  for (auto [name, bytes] : {std::pair<const char*, std::string>{"a", good.a().data()},
                             {"b", good.b().data()}, {"c", good.c().data()},
                             {"d", good.d().data()},
                             {"lengths", std::string(reinterpret_cast<const char*>(bad.data()), 8)}}) {
    v1::StreamRequest m;
    m.mutable_chunk()->set_array(name);
    m.mutable_chunk()->set_offset(0);
    m.mutable_chunk()->set_data(bytes);
    ASSERT_TRUE(stream->Write(m));
  }
  stream->WritesDone();
  v1::StreamResponse resp;
  while (stream->Read(&resp)) {
  }
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("lengths: the 2 lengths sum to 5"), std::string::npos)
      << st.error_message();
}

TEST_F(VariableService, CliSolvesWithALengthsFile) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("trisolve_var_cli_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const VarArrays v = MakeVar({4, 1, 9, 30}, 0, 21);
  const std::vector<int64_t> total = {int64_t(v.a.size())};
  for (auto [name, data] : {std::pair{"a", &v.a}, {"b", &v.b}, {"c", &v.c}, {"d", &v.d}})
    ASSERT_TRUE(WriteNpy(dir + "/" + name + ".npy", {DType::kFloat64, total, data->data()}).ok());
  std::vector<int64_t> len64(v.lengths.begin(), v.lengths.end());
  ASSERT_TRUE(WriteNpy(dir + "/lengths.npy", {DType::kInt64, {4}, len64.data()}).ok());
  const std::vector<double> fl = {4, 1, 9, 30};
  ASSERT_TRUE(WriteNpy(dir + "/lengths_f.npy", {DType::kFloat64, {4}, fl.data()}).ok());
  const std::string cli = ServerProcess::CliBin() + " --server " + server_->target() + " ";
  const std::string arrays = "a=" + dir + "/a.npy b=" + dir + "/b.npy c=" + dir + "/c.npy d=" +
                             dir + "/d.npy ";
  auto [code, out] = Shell(cli + "solve tridiagonal " + arrays + "lengths=" + dir +
                           "/lengths.npy -o " + dir + "/x.npy");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("4 ok"), std::string::npos) << out;
  auto x = ReadNpy(dir + "/x.npy");
  ASSERT_TRUE(x.ok()) << x.status();
  const std::vector<double> want = Reference<double>(v);
  ASSERT_EQ(x->elements(), int64_t(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(x->as<double>()[i], want[i], 1e-12);
  // Floating-point lengths are a usage error of the CLI, naming lengths; nothing is sent.
  std::tie(code, out) = Shell(cli + "solve tridiagonal " + arrays + "lengths=" + dir +
                              "/lengths_f.npy -o " + dir + "/x2.npy");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("lengths"), std::string::npos) << out;
  EXPECT_NE(out.find("integer"), std::string::npos) << out;
  // With --layout interleaved the server refuses it naming lengths.
  std::tie(code, out) = Shell(cli + "solve tridiagonal --layout interleaved " + arrays +
                              "lengths=" + dir + "/lengths.npy -o " + dir + "/x3.npy");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("lengths: a variable-size batch takes layout FLAT"), std::string::npos)
      << out;
  // By handle: system create with lengths=FILE.npy, then solve rhs=FILE.npy: the same x.
  std::tie(code, out) = Shell(cli + "system create tridiagonal a=" + dir + "/a.npy b=" + dir +
                              "/b.npy c=" + dir + "/c.npy lengths=" + dir + "/lengths.npy");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("rhs [44] (4 systems of different sizes)"), std::string::npos) << out;
  const std::string handle = out.substr(0, out.find(' '));
  std::tie(code, out) = Shell(cli + "system solve " + handle + " rhs=" + dir + "/d.npy -o " +
                              dir + "/xh.npy");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("4 ok"), std::string::npos) << out;
  auto xh = ReadNpy(dir + "/xh.npy");
  ASSERT_TRUE(xh.ok()) << xh.status();
  EXPECT_EQ(xh->data, x->data);
  std::tie(code, out) = Shell(cli + "system update " + handle + " lengths=" + dir + "/lengths.npy");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("'lengths' is fixed when the system is created"), std::string::npos) << out;
  std::tie(code, out) = Shell(cli + "system release " + handle);
  EXPECT_EQ(code, 0) << out;
  std::filesystem::remove_all(dir);
}

std::vector<double> Unify(const VarArrays& v) {
  std::vector<double> abc;
  for (size_t i = 0; i < v.a.size(); ++i) abc.insert(abc.end(), {v.a[i], v.b[i], v.c[i]});
  return abc;
}

TEST_F(VariableService, UnifiedLayoutGivesTheSeparateArraysAnswer) {
  // Uniform [batch, n, 3] (unary and streamed), one system [n, 3], and with lengths.
  const VarArrays v = MakeVar(std::vector<int32_t>(64, 300), 7, 13);
  const std::vector<double> abc = Unify(v);
  Job flat;
  for (auto [name, data] : {std::pair{"a", &v.a}, {"b", &v.b}, {"c", &v.c}, {"d", &v.d}})
    flat.arrays[name] = {DType::kFloat64, {64, 300}, data->data()};
  Job uni;
  uni.arrays["d"] = {DType::kFloat64, {64, 300}, v.d.data()};
  uni.arrays["abc"] = {DType::kFloat64, {64, 300, 3}, abc.data()};
  auto r1 = MakeClient().Solve(flat);
  auto r2 = MakeClient().Solve(uni);
  auto r3 = MakeClient(1024).Solve(uni);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_TRUE(r3->summary.streamed);
  EXPECT_EQ(r2->x.shape, (std::vector<int64_t>{64, 300}));
  ASSERT_EQ(r1->x.data.size(), r2->x.data.size());
  const double* x1 = reinterpret_cast<const double*>(r1->x.data.data());
  const double* x2 = reinterpret_cast<const double*>(r2->x.data.data());
  for (size_t i = 0; i < v.a.size(); ++i) EXPECT_NEAR(x1[i], x2[i], 1e-13 * (1 + std::abs(x1[i])));
  EXPECT_EQ(r2->x.data, r3->x.data);
  EXPECT_LE(r2->summary.residual, 1e-15);
  for (SolveStatus st : r2->status) EXPECT_EQ(st, SolveStatus::kOk);
  // Variable sizes in the unified layout: [total, 3] with lengths.
  const VarArrays w = MakeVar({3, 1, 4096, 70, 2}, 2, 17);
  const std::vector<double> wabc = Unify(w);
  Job var = VarJob(w);
  var.arrays.erase("a");
  var.arrays.erase("b");
  var.arrays.erase("c");
  var.arrays["abc"] = {DType::kFloat64, {int64_t(w.a.size()), 3}, wabc.data()};
  auto r4 = MakeClient().Solve(var);
  ASSERT_TRUE(r4.ok()) << r4.status();
  ExpectSameAnswer(*r4, w, 1e-12);
}

TEST_F(VariableService, EveryBadAbcHasItsStatusAndNamesTheField) {
  auto stub = testing::RawStub(server_->target());
  using C = grpc::StatusCode;
  // One system of 3 rows: [[2,1,0],[1,2,1],[0,1,2]] x = [4,8,8], x = [1, 2, 3].
  auto good = [] {
    v1::TridiagonalRequest r;
    r.set_dtype(v1::FLOAT64);
    Arr(r.mutable_abc(), {3, 3}, {0, 2, 1, 1, 2, 1, 1, 2, 0});
    Arr(r.mutable_d(), {3}, {4, 8, 8});
    return r;
  };
  struct Case {
    const char* what;
    C code;
    const char* part;
    std::function<void(v1::TridiagonalRequest&)> mutate;
  };
  std::vector<Case> cases = {
      {"good", C::OK, "", [](auto&) {}},
      {"a given too", C::INVALID_ARGUMENT, "abc: holds a, b and c: leave the arrays a, b and c unset",
       [](auto& r) { Arr(r.mutable_a(), {3}, {0, 1, 1}); }},
      {"interleaved", C::INVALID_ARGUMENT, "abc: the unified layout takes layout FLAT",
       [](auto& r) { r.set_layout(v1::INTERLEAVED); }},
      {"two values a row", C::INVALID_ARGUMENT, "abc has shape [3, 2], expected [3, 3]",
       [](auto& r) {
         r.mutable_abc()->Clear();
         Arr(r.mutable_abc(), {3, 2}, {0, 2, 1, 1, 2, 1});
       }},
      {"transposed", C::INVALID_ARGUMENT, "abc has shape [1, 3, 3], expected [3, 3]",
       [](auto& r) {
         r.mutable_abc()->set_shape(0, 1);
         r.mutable_abc()->set_shape(1, 3);
         r.mutable_abc()->add_shape(3);
       }},
      {"bytes", C::INVALID_ARGUMENT, "abc has 64 bytes of data, expected 72",
       [](auto& r) { r.mutable_abc()->mutable_data()->resize(64); }},
      {"NaN", C::INVALID_ARGUMENT, "abc[1][2] is NaN",
       [](auto& r) {
         const double nan = std::nan("");
         std::memcpy(r.mutable_abc()->mutable_data()->data() + 40, &nan, 8);
       }},
      {"lengths beside a wrong abc", C::INVALID_ARGUMENT, "abc has shape [3, 3, 1]",
       [](auto& r) {
         Lengths(r.mutable_lengths(), {1, 2});
         r.mutable_abc()->add_shape(1);
       }},
  };
  for (auto& k : cases) {
    v1::TridiagonalRequest req = good();
    k.mutate(req);
    const v1::SolveResponse resp = ExpectAnswer(stub, req, k.code, k.part, k.what);
    if (k.code == C::OK) {
      const double* x = reinterpret_cast<const double*>(resp.x().data().data());
      for (int i = 0; i < 3; ++i) EXPECT_NEAR(x[i], i + 1, 1e-15);
    }
  }
  // CreateSystem keeps a, b, c only.
  v1::CreateSystemRequest create;
  *create.mutable_tridiagonal() = good();
  create.mutable_tridiagonal()->clear_d();
  grpc::ClientContext ctx;
  v1::SystemInfo info;
  const grpc::Status st = stub->CreateSystem(&ctx, create, &info);
  EXPECT_EQ(st.error_code(), C::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("abc: CreateSystem takes a, b and c"), std::string::npos)
      << st.error_message();
}

TEST_F(VariableService, CliSolvesTheUnifiedLayout) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("trisolve_abc_cli_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const VarArrays v = MakeVar({20, 20, 20}, -1, 31);
  const std::vector<double> abc = Unify(v);
  ASSERT_TRUE(WriteNpy(dir + "/abc.npy", {DType::kFloat64, {3, 20, 3}, abc.data()}).ok());
  ASSERT_TRUE(WriteNpy(dir + "/d.npy", {DType::kFloat64, {3, 20}, v.d.data()}).ok());
  const std::string cli = ServerProcess::CliBin() + " --server " + server_->target() + " ";
  auto [code, out] = Shell(cli + "solve tridiagonal abc=" + dir + "/abc.npy d=" + dir +
                           "/d.npy -o " + dir + "/x.npy");
  EXPECT_EQ(code, 0) << out;
  auto x = ReadNpy(dir + "/x.npy");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->shape, (std::vector<int64_t>{3, 20}));
  const std::vector<double> want = Reference<double>(v);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(x->as<double>()[i], want[i], 1e-12);
  // Neither a, b, c nor abc: the usage error lists a, b, c.
  std::tie(code, out) = Shell(cli + "solve tridiagonal d=" + dir + "/d.npy");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("a=FILE b=FILE c=FILE"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trisolve
