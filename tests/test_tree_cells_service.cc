// Tree cells of different sizes (TreeRequest.lengths) end to end: the real trisolved through the
// client library (unary and streamed, float64 and float32, a singular cell among good ones),
// raw gRPC for every bad lengths and per-cell parent array, CreateSystem's refusal, and the
// CLI's lengths=FILE.npy for a tree.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "client_test_util.h"
#include "gtest/gtest.h"
#include "raw_stub.h"
#include "server_process.h"
#include "tree_cells.h"
#include "trisolve/client.h"
#include "trisolve/ndarray.h"
#include "trisolve/reference/tree.h"
#include "trisolve/swc.h"
#include "trisolve/tree.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using testing::Cells;
using testing::ServerProcess;
using testing::Shell;

class TreeCellsService : public testing::SharedServerSuite {};

// The CPU reference's answer (hines, a cell at a time) and statuses for c, in precision T.
template <typename T>
std::vector<T> Reference(const Cells& c, std::vector<SystemStatus>* status = nullptr) {
  const auto typed = c.As<T>();
  std::vector<T> x(size_t(c.total()));
  std::vector<SystemStatus> st(size_t(c.cells()));
  cpu::SolveTree(c.Problem(typed), TreeMethod::kHines, TreeOutput<T>{x.data(), st.data()});
  if (status != nullptr) *status = st;
  return x;
}

// The job for c; `typed` keeps float32 copies alive where asked.
Job CellsJob(const Cells& c) {
  Job job;
  job.kind = Kind::kTree;
  const std::vector<int64_t> total = {c.total()};
  job.arrays["parent"] = {DType::kInt32, total, c.parent.data()};
  job.arrays["lower"] = {DType::kFloat64, total, c.lower.data()};
  job.arrays["upper"] = {DType::kFloat64, total, c.upper.data()};
  job.arrays["diag"] = {DType::kFloat64, total, c.diag.data()};
  job.arrays["rhs"] = {DType::kFloat64, total, c.rhs.data()};
  job.arrays["lengths"] = {DType::kInt32, {c.cells()}, c.lengths.data()};
  return job;
}

// Cells of the real morphology (subtrees of it: its first k nodes) and random small trees,
// enough nodes in all for the CUDA backend to take them to the device (auto's host threshold).
Cells MixedCells(uint64_t seed, int singular_at = -1) {
  auto m = ReadSwc(std::string(TRISOLVE_TEST_DATA) + "/neuron_10-2012-02-09-001.CNG.swc");
  EXPECT_TRUE(m.ok()) << m.status();
  std::mt19937_64 rng(seed);
  Cells c;
  const std::vector<int64_t> sub = {3187, 1, 250, 2900, 64};
  for (int k = 0; k < 60; ++k) {
    if (k == singular_at) {
      c.AddSingular();
    } else if (k < int(sub.size())) {
      c.AddRandom(std::vector<int32_t>(m->parent.begin(), m->parent.begin() + sub[size_t(k)]), rng);
    } else {
      c.AddRandom(testing::RandomParents(1 + int64_t(rng() % 200), rng), rng);
    }
  }
  return c;
}

void ExpectReferenceAnswer(const Result& r, const Cells& c, double tol) {
  std::vector<SystemStatus> st;
  const std::vector<double> want = Reference<double>(c, &st);
  ASSERT_EQ(r.x.shape, std::vector<int64_t>{c.total()});
  ASSERT_EQ(r.status.size(), size_t(c.cells()));
  for (size_t s = 0; s < st.size(); ++s)
    EXPECT_EQ(r.status[s] == SolveStatus::kOk, st[s] == SystemStatus::kOk) << "cell " << s;
  const double* x = reinterpret_cast<const double*>(r.x.data.data());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(x[i], want[i], tol * (1 + std::abs(want[i]))) << i;
  EXPECT_EQ(r.summary.systems, c.cells());
}

TEST_F(TreeCellsService, HandWorkedCellsThroughTheService) {
  const Cells c = testing::HandWorkedCells();
  auto r = MakeClient().Solve(CellsJob(c));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<double> want = testing::HandWorkedX();
  const double* x = reinterpret_cast<const double*>(r->x.data.data());
  ASSERT_EQ(r->status.size(), 3u);
  for (SolveStatus s : r->status) EXPECT_EQ(s, SolveStatus::kOk);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(x[i], want[i], 1e-14) << i;
  EXPECT_LE(r->summary.residual, 1e-16);
}

TEST_F(TreeCellsService, CellsOfDifferentSizesInOneRequest) {
  const Cells c = MixedCells(7);
  auto r = MakeClient().Solve(CellsJob(c));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectReferenceAnswer(*r, c, 1e-12);
  for (SolveStatus s : r->status) EXPECT_EQ(s, SolveStatus::kOk);
  EXPECT_LE(r->summary.residual, 1e-15);
  EXPECT_FALSE(r->summary.streamed);
  // Every method answers the same.
  for (const char* m : {"hines", "cables", "contraction"}) {
    Job job = CellsJob(c);
    job.options.method = m;
    auto rm = MakeClient().Solve(job);
    ASSERT_TRUE(rm.ok()) << m << ": " << rm.status();
    ExpectReferenceAnswer(*rm, c, 1e-12);
    EXPECT_LE(rm->summary.residual, 1e-15) << m;
  }
}

TEST_F(TreeCellsService, OnlyTheSingularCellIsSingular) {
  for (int at : {0, 31, 59}) {
    const Cells c = MixedCells(9, at);
    auto r = MakeClient().Solve(CellsJob(c));
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectReferenceAnswer(*r, c, 1e-12);
    for (int64_t s = 0; s < c.cells(); ++s)
      EXPECT_EQ(r->status[size_t(s)], s == at ? SolveStatus::kSingular : SolveStatus::kOk) << s;
    const double* x = reinterpret_cast<const double*>(r->x.data.data());
    for (int64_t i = c.offsets[size_t(at)]; i < c.offsets[size_t(at) + 1]; ++i)
      EXPECT_EQ(x[i], 0.0);
    EXPECT_EQ(r->summary.singular, 1);
  }
}

TEST_F(TreeCellsService, StreamedAnswerIsTheUnaryOne) {
  const Cells c = MixedCells(11);
  Client unary = MakeClient(), streamed = MakeClient(1024);
  // auto solves cells it sees for the first time on the host and builds their plan for the
  // next sight (the CUDA backend): one call first, so that both compared take the same path.
  ASSERT_TRUE(unary.Solve(CellsJob(c)).ok());
  auto r1 = unary.Solve(CellsJob(c));
  auto r2 = streamed.Solve(CellsJob(c));
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_TRUE(r2->summary.streamed);
  ExpectReferenceAnswer(*r2, c, 1e-12);
  EXPECT_EQ(r1->x.data, r2->x.data);
}

TEST_F(TreeCellsService, Int64LengthsAndFloat32) {
  const Cells c = MixedCells(13);
  const auto f = c.As<float>();
  std::vector<int64_t> len64(c.lengths.begin(), c.lengths.end());
  Job job;
  job.kind = Kind::kTree;
  const std::vector<int64_t> total = {c.total()};
  job.arrays["parent"] = {DType::kInt32, total, c.parent.data()};
  job.arrays["lower"] = {DType::kFloat32, total, f.lower.data()};
  job.arrays["upper"] = {DType::kFloat32, total, f.upper.data()};
  job.arrays["diag"] = {DType::kFloat32, total, f.diag.data()};
  job.arrays["rhs"] = {DType::kFloat32, total, f.rhs.data()};
  job.arrays["lengths"] = {DType::kInt64, {c.cells()}, len64.data()};
  auto r = MakeClient().Solve(job);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->x.dtype, DType::kFloat32);
  const std::vector<float> want = Reference<float>(c);
  const float* x = reinterpret_cast<const float*>(r->x.data.data());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(x[i], want[i], 1e-4f * (1 + std::abs(want[i]))) << i;
  EXPECT_LE(r->summary.residual, 1e-6);
}

// x and the statuses of a by-handle answer equal a one-shot answer's, bit for bit (the CPU
// backend runs the same solve on the same arrays).
void ExpectSameAs(const Result& by_handle, const Result& one_shot, const std::string& what) {
  EXPECT_EQ(by_handle.x.shape, one_shot.x.shape) << what;
  EXPECT_TRUE(by_handle.x.data == one_shot.x.data) << what;
  EXPECT_EQ(by_handle.status, one_shot.status) << what;
}

TEST_F(TreeCellsService, ByHandleAnswersAreTheOneShotOnes) {
  Cells c = MixedCells(9, 31);  // cell 31 singular
  Client client = MakeClient();
  Job create = CellsJob(c);
  create.arrays.erase("rhs");
  auto sys = client.CreateSystem(create, {.label = "cells"});
  ASSERT_TRUE(sys.ok()) << sys.status();
  EXPECT_TRUE(sys->variable);
  EXPECT_EQ(sys->systems, c.cells());
  EXPECT_EQ(sys->rhs_shape, std::vector<int64_t>{c.total()});
  // The host copy: four arrays of total values and the lengths.
  EXPECT_GE(sys->bytes, c.total() * (3 * 8 + 4) + c.cells() * 4);
  auto listed = client.ListSystems();
  ASSERT_TRUE(listed.ok()) << listed.status();
  bool found = false;
  for (const SystemInfo& i : *listed)
    if (i.handle == sys->handle) {
      found = true;
      EXPECT_TRUE(i.variable);
      EXPECT_EQ(i.systems, c.cells());
    }
  EXPECT_TRUE(found);

  auto one_shot = client.Solve(CellsJob(c));
  ASSERT_TRUE(one_shot.ok()) << one_shot.status();
  const ArrayView rhs{DType::kFloat64, {c.total()}, c.rhs.data()};
  auto by_handle = client.SolveSystem(sys->handle, rhs);
  ASSERT_TRUE(by_handle.ok()) << by_handle.status();
  ExpectSameAs(*by_handle, *one_shot, "one right-hand side");
  ExpectReferenceAnswer(*by_handle, c, 1e-12);
  for (int64_t s = 0; s < c.cells(); ++s)
    EXPECT_EQ(by_handle->status[size_t(s)] == SolveStatus::kSingular, s == 31) << "cell " << s;

  // k = 2 right-hand sides, [2, total]: each block the one-shot answer for it, 2 x cells
  // statuses.
  std::vector<double> two = c.rhs;
  for (double v : c.rhs) two.push_back(-3 * v);
  auto k2 = client.SolveSystem(sys->handle, {DType::kFloat64, {2, c.total()}, two.data()});
  ASSERT_TRUE(k2.ok()) << k2.status();
  ASSERT_EQ(k2->x.shape, (std::vector<int64_t>{2, c.total()}));
  ASSERT_EQ(k2->status.size(), size_t(2 * c.cells()));
  Cells negated = c;
  for (double& v : negated.rhs) v *= -3;
  auto second = client.Solve(CellsJob(negated));
  ASSERT_TRUE(second.ok()) << second.status();
  const size_t half = size_t(c.total()) * sizeof(double);
  EXPECT_TRUE(std::equal(k2->x.data.begin(), k2->x.data.begin() + long(half),
                         one_shot->x.data.begin()));
  EXPECT_TRUE(std::equal(k2->x.data.begin() + long(half), k2->x.data.end(),
                         second->x.data.begin()));
  EXPECT_EQ(k2->summary.right_hand_sides, 2);

  // An update of the diagonal that cures cell 31: every cell OK, the one-shot answer with it.
  Cells cured = c;
  for (int64_t i = c.offsets[31]; i < c.offsets[32]; ++i) cured.diag[size_t(i)] = 3;
  auto updated = client.UpdateSystem(
      sys->handle, {{"diag", ArrayView{DType::kFloat64, {c.total()}, cured.diag.data()}}});
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->updates, 1);
  auto after = client.SolveSystem(sys->handle, rhs);
  ASSERT_TRUE(after.ok()) << after.status();
  auto cured_one_shot = client.Solve(CellsJob(cured));
  ASSERT_TRUE(cured_one_shot.ok()) << cured_one_shot.status();
  ExpectSameAs(*after, *cured_one_shot, "after the update");
  for (SolveStatus st : after->status) EXPECT_EQ(st, SolveStatus::kOk);

  // The time-step stream by handle: each step's answer the one-shot one, in order.
  auto stream = client.OpenStepStream(sys->handle);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Send(rhs).ok());
  ASSERT_TRUE((*stream)->Send({DType::kFloat64, {c.total()}, negated.rhs.data()}).ok());
  auto s1 = (*stream)->Receive();
  auto s2 = (*stream)->Receive();
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_TRUE((*stream)->Finish().ok());
  ExpectSameAs(*s1, *cured_one_shot, "stream step 1");
  Cells cured_negated = cured;
  cured_negated.rhs = negated.rhs;
  auto want2 = client.Solve(CellsJob(cured_negated));
  ASSERT_TRUE(want2.ok()) << want2.status();
  ExpectSameAs(*s2, *want2, "stream step 2");

  // A parent update is taken, checked cell by cell as at creation.
  auto same_parent = client.UpdateSystem(
      sys->handle, {{"parent", ArrayView{DType::kInt32, {c.total()}, c.parent.data()}}});
  EXPECT_TRUE(same_parent.ok()) << same_parent.status();
  std::vector<int32_t> bad = c.parent;
  bad[size_t(c.offsets[2] + 1)] = 1;  // node 1 of cell 2 its own parent
  auto refused = client.UpdateSystem(sys->handle,
                                     {{"parent", ArrayView{DType::kInt32, {c.total()}, bad.data()}}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("parent: cell 2: parent["), std::string::npos)
      << refused.status();
  // The lengths are the system's shape: not updatable.
  auto lengths = client.UpdateSystem(
      sys->handle, {{"lengths", ArrayView{DType::kInt32, {c.cells()}, c.lengths.data()}}});
  ASSERT_FALSE(lengths.ok());
  EXPECT_EQ(lengths.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lengths.status().message().find("'lengths' is fixed when the system is created"),
            std::string::npos)
      << lengths.status();
  // The refused updates changed nothing.
  auto still = client.SolveSystem(sys->handle, rhs);
  ASSERT_TRUE(still.ok()) << still.status();
  ExpectSameAs(*still, *cured_one_shot, "after the refused updates");
  ASSERT_TRUE(client.ReleaseSystem(sys->handle).ok());
  EXPECT_EQ(client.SolveSystem(sys->handle, rhs).status().code(), absl::StatusCode::kNotFound);
}

void Arr(v1::Array* a, std::vector<int64_t> shape, const std::vector<double>& v) {
  a->Clear();
  for (int64_t d : shape) a->add_shape(d);
  a->set_data(v.data(), v.size() * sizeof(double));
}
void Ints(v1::Array* a, const std::vector<int32_t>& v) {
  a->Clear();
  a->add_shape(int64_t(v.size()));
  a->set_data(v.data(), v.size() * sizeof(int32_t));
}

v1::TreeRequest GoodCells() {
  const Cells c = testing::HandWorkedCells();
  v1::TreeRequest r;
  r.set_dtype(v1::FLOAT64);
  Ints(r.mutable_parent(), c.parent);
  Arr(r.mutable_lower(), {c.total()}, c.lower);
  Arr(r.mutable_upper(), {c.total()}, c.upper);
  Arr(r.mutable_diag(), {c.total()}, c.diag);
  Arr(r.mutable_rhs(), {c.total()}, c.rhs);
  Ints(r.mutable_lengths(), c.lengths);
  return r;
}

TEST_F(TreeCellsService, EveryBadLengthsOrParentHasItsStatusAndNamesTheField) {
  auto stub = testing::RawStub(server_->target());
  using C = grpc::StatusCode;
  struct Case {
    const char* what;
    C code;
    const char* part;
    std::function<void(v1::TreeRequest&)> mutate;
  };
  const std::string huge(100000, 'x');
  const std::vector<Case> cases = {
      {"good", C::OK, "", [](auto&) {}},
      {"a zero length", C::INVALID_ARGUMENT,
       "lengths: lengths[1] is 0; every cell needs at least one node",
       [](auto& r) { Ints(r.mutable_lengths(), {3, 0, 5}); }},
      {"a negative length", C::INVALID_ARGUMENT, "lengths: lengths[0] is -1",
       [](auto& r) { Ints(r.mutable_lengths(), {-1, 4, 5}); }},
      {"sum short", C::INVALID_ARGUMENT,
       "lengths: the 3 lengths sum to 7, but parent, lower, upper, diag and rhs hold 8 values",
       [](auto& r) { Ints(r.mutable_lengths(), {1, 2, 4}); }},
      {"sum long", C::INVALID_ARGUMENT, "sum to 9",
       [](auto& r) { Ints(r.mutable_lengths(), {1, 2, 6}); }},
      {"a sum that would overflow int32", C::INVALID_ARGUMENT, "lengths: lengths[2] is",
       [](auto& r) { Ints(r.mutable_lengths(), {2147483647, 2147483647, -2147483647 + 1}); }},
      {"more cells than nodes", C::INVALID_ARGUMENT,
       "lengths: has 9 cells of at least one node each, but rhs holds 8 values",
       [](auto& r) { Ints(r.mutable_lengths(), {1, 1, 1, 1, 1, 1, 1, 1, 1}); }},
      {"lengths of rank 2", C::INVALID_ARGUMENT, "lengths has shape [1, 3], expected [cells]",
       [](auto& r) {
         r.mutable_lengths()->set_shape(0, 1);
         r.mutable_lengths()->add_shape(3);
       }},
      {"lengths' bytes", C::INVALID_ARGUMENT, "lengths has 8 bytes of data, expected 12",
       [](auto& r) { r.mutable_lengths()->mutable_data()->resize(8); }},
      {"interleaved", C::INVALID_ARGUMENT,
       "lengths: cells of different sizes take layout FLAT",
       [](auto& r) { r.set_layout(v1::INTERLEAVED); }},
      {"rhs of rank 2", C::INVALID_ARGUMENT, "rhs has shape [1, 8], expected [total]",
       [](auto& r) {
         r.mutable_rhs()->set_shape(0, 1);
         r.mutable_rhs()->add_shape(8);
       }},
      {"diag shorter than rhs", C::INVALID_ARGUMENT, "diag has shape [7], expected [8]",
       [](auto& r) { Arr(r.mutable_diag(), {7}, {1, 1, 1, 1, 1, 1, 1}); }},
      {"parent per cell of one size", C::INVALID_ARGUMENT, "parent has shape [2, 4], expected [8]",
       [](auto& r) {
         r.mutable_parent()->set_shape(0, 2);
         r.mutable_parent()->add_shape(4);
       }},
      {"a cell's root with a parent", C::INVALID_ARGUMENT,
       "parent: cell 1: parent[1] (its node 0) is 0, expected -1",
       [](auto& r) { Ints(r.mutable_parent(), {-1, 0, 0, -1, 0, 1, 0, 3}); }},
      {"a global index in cell 2", C::INVALID_ARGUMENT,
       "parent: cell 2: parent[5] (its node 2) is 4, expected 0 <= parent < 2",
       [](auto& r) { Ints(r.mutable_parent(), {-1, -1, 0, -1, 0, 4, 0, 3}); }},
      {"a forward index in cell 2", C::INVALID_ARGUMENT,
       "parent: cell 2: parent[7] (its node 4) is 4, expected 0 <= parent < 4",
       [](auto& r) { Ints(r.mutable_parent(), {-1, -1, 0, -1, 0, 1, 0, 4}); }},
      {"a NaN in upper", C::INVALID_ARGUMENT, "upper[6] is NaN",
       [](auto& r) {
         const double nan = std::nan("");
         std::memcpy(r.mutable_upper()->mutable_data()->data() + 48, &nan, 8);
       }},
      {"too many unknowns", C::RESOURCE_EXHAUSTED, "max_job_unknowns = 20000000",
       [](auto& r) {
         for (auto* a : {r.mutable_parent(), r.mutable_lower(), r.mutable_upper(),
                         r.mutable_diag(), r.mutable_rhs()})
           a->set_shape(0, 30000000);
       }},
      {"an unbounded region name is not echoed", C::NOT_FOUND, "lengths.region: no region named",
       [&](auto& r) {
         r.mutable_lengths()->clear_data();
         r.mutable_lengths()->mutable_region()->set_region(huge);
       }},
  };
  for (const auto& k : cases) {
    v1::TreeRequest req = GoodCells();
    k.mutate(req);
    grpc::ClientContext ctx;
    v1::SolveResponse resp;
    const grpc::Status st = stub->SolveTree(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), k.code) << k.what << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(k.part), std::string::npos)
        << k.what << ": '" << st.error_message() << "' lacks '" << k.part << "'";
    EXPECT_LT(st.error_message().size(), 1000u) << k.what;
    if (k.code == C::OK) {
      ASSERT_EQ(resp.status_size(), 3);
      const std::vector<double> want = testing::HandWorkedX();
      const double* x = reinterpret_cast<const double*>(resp.x().data().data());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(x[i], want[i], 1e-14) << i;
    }
  }
  // CreateSystem checks the cells as a solve does: lengths, then every cell's parents.
  for (const auto& [what, edit, part] :
       std::vector<std::tuple<const char*, std::function<void(v1::TreeRequest&)>, const char*>>{
           {"lengths short", [](auto& r) { Ints(r.mutable_lengths(), {1, 2, 2}); },
            "lengths: the 3 lengths sum to 5"},
           {"a cell's parent", [](auto& r) { r.mutable_parent()->mutable_data()->at(4) = 9; },
            "parent: cell 1"},
           {"interleaved", [](auto& r) { r.set_layout(v1::INTERLEAVED); },
            "lengths: cells of different sizes take layout FLAT"}}) {
    v1::CreateSystemRequest create;
    *create.mutable_tree() = GoodCells();
    create.mutable_tree()->clear_rhs();
    edit(*create.mutable_tree());
    grpc::ClientContext ctx;
    v1::SystemInfo info;
    const grpc::Status st = stub->CreateSystem(&ctx, create, &info);
    EXPECT_EQ(st.error_code(), C::INVALID_ARGUMENT) << what;
    EXPECT_NE(st.error_message().find(part), std::string::npos) << what << ": " << st.error_message();
  }
}

TEST_F(TreeCellsService, StreamedBadParentIsRefusedOnceTheBytesAreThere) {
  auto stub = testing::RawStub(server_->target());
  grpc::ClientContext ctx;
  auto stream = stub->SolveStream(&ctx);
  const v1::TreeRequest good = GoodCells();
  v1::StreamRequest header;
  *header.mutable_tree() = good;
  for (auto* a : {header.mutable_tree()->mutable_parent(), header.mutable_tree()->mutable_lower(),
                  header.mutable_tree()->mutable_upper(), header.mutable_tree()->mutable_diag(),
                  header.mutable_tree()->mutable_rhs(), header.mutable_tree()->mutable_lengths()})
    a->clear_data();
  ASSERT_TRUE(stream->Write(header));
  const std::vector<int32_t> bad = {-1, -1, 0, -1, 0, 1, 5, 3};
  for (auto [name, bytes] :
       {std::pair<const char*, std::string>{"parent",
                                            std::string(reinterpret_cast<const char*>(bad.data()), 32)},
        {"lower", good.lower().data()}, {"upper", good.upper().data()},
        {"diag", good.diag().data()}, {"rhs", good.rhs().data()},
        {"lengths", good.lengths().data()}}) {
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
  EXPECT_NE(st.error_message().find("parent: cell 2: parent[6] (its node 3) is 5"),
            std::string::npos)
      << st.error_message();
}

TEST_F(TreeCellsService, CliSolvesATreeWithALengthsFile) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("trisolve_cells_cli_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const Cells c = MixedCells(21, 3);
  const std::vector<int64_t> total = {c.total()};
  for (auto [name, data] : {std::pair{"lower", &c.lower}, {"upper", &c.upper},
                            {"diag", &c.diag}, {"rhs", &c.rhs}})
    ASSERT_TRUE(WriteNpy(dir + "/" + name + ".npy", {DType::kFloat64, total, data->data()}).ok());
  std::vector<int64_t> parent64(c.parent.begin(), c.parent.end());
  ASSERT_TRUE(WriteNpy(dir + "/parent.npy", {DType::kInt64, total, parent64.data()}).ok());
  std::vector<int64_t> len64(c.lengths.begin(), c.lengths.end());
  ASSERT_TRUE(WriteNpy(dir + "/lengths.npy", {DType::kInt64, {c.cells()}, len64.data()}).ok());
  const std::vector<double> fl(c.lengths.begin(), c.lengths.end());
  ASSERT_TRUE(WriteNpy(dir + "/lengths_f.npy", {DType::kFloat64, {c.cells()}, fl.data()}).ok());
  const std::string cli = ServerProcess::CliBin() + " --server " + server_->target() + " ";
  const std::string arrays = "parent=" + dir + "/parent.npy lower=" + dir + "/lower.npy upper=" +
                             dir + "/upper.npy diag=" + dir + "/diag.npy rhs=" + dir + "/rhs.npy ";
  // Cell 3 is singular: exit 3, its count printed.
  auto [code, out] = Shell(cli + "solve tree " + arrays + "lengths=" + dir + "/lengths.npy -o " +
                           dir + "/x.npy");
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("59 ok, 1 singular"), std::string::npos) << out;
  auto x = ReadNpy(dir + "/x.npy");
  ASSERT_TRUE(x.ok()) << x.status();
  const std::vector<double> want = Reference<double>(c);
  ASSERT_EQ(x->shape, total);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(x->as<double>()[i], want[i], 1e-12 * (1 + std::abs(want[i])));
  // Floating-point lengths are refused before anything is sent, naming lengths.
  std::tie(code, out) = Shell(cli + "solve tree " + arrays + "lengths=" + dir +
                              "/lengths_f.npy -o " + dir + "/x2.npy");
  EXPECT_NE(code, 0) << out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/x2.npy"));
  EXPECT_NE(out.find("lengths"), std::string::npos) << out;
  EXPECT_NE(out.find("integer"), std::string::npos) << out;
  // With --layout interleaved the server refuses it naming lengths.
  std::tie(code, out) = Shell(cli + "solve tree --layout interleaved " + arrays + "lengths=" +
                              dir + "/lengths.npy -o " + dir + "/x3.npy");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("lengths: cells of different sizes take layout FLAT"), std::string::npos)
      << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trisolve
