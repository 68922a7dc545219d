// Shared memory end to end: the real trisolved on loopback, regions registered by this process,
// arrays read from them and x written into them, every family; each bad reference refused with
// its own status; regions of another identity unreachable; a client killed with its region
// registered leaves nothing behind once the time-to-live passes.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "client_test_util.h"
#include "raw_stub.h"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/shared_memory.h"
#include "trisolve/v1/trisolve.grpc.pb.h"


namespace trisolve {
namespace {

using testing::ClientOptions;
using testing::EveryFamily;
using testing::Expect;
using testing::Family;
using testing::MakeJob;
using testing::ServerProcess;

// A copy of `a` inside `shm`, as a view.
ArrayView Into(SharedMemory& shm, const NdArray& a) {
  void* p = *shm.Allocate(int64_t(a.data.size()));
  std::memcpy(p, a.data.data(), a.data.size());
  return ArrayView{a.dtype, a.shape, p};
}

TEST(SharedMemory, EveryFamilySolvesFromAndIntoARegionAsOverTheSocket) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client grpc_client(ClientOptions(server, Transport::kGrpc));
  Client shm_client(ClientOptions(server, Transport::kSharedMemory));
  auto shm = SharedMemory::Create(64 << 20);
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(shm_client.RegisterMemory(**shm, "arrays").ok());
  for (const Family& f : EveryFamily()) {
    SCOPED_TRACE(std::string(KindName(f.kind)));
    Job over_socket = MakeJob(f.kind, f.arrays);
    over_socket.options.interleaved = f.interleaved;
    auto want = grpc_client.Solve(over_socket);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(want->summary.transport, "grpc");

    (*shm)->Reset();
    Job in_shm{f.kind};
    in_shm.options = over_socket.options;
    for (const auto& [name, a] : f.arrays) in_shm.arrays[name] = Into(**shm, a);
    const int64_t x_bytes = int64_t(want->x.data.size());
    void* x = *(*shm)->Allocate(x_bytes);
    std::memset(x, 0xff, size_t(x_bytes));  // NaNs, unless the server writes every value
    in_shm.options.x_out = x;
    auto got = shm_client.Solve(in_shm);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.transport, "shared-memory");
    EXPECT_TRUE(got->x.data.empty());
    EXPECT_EQ(got->x.shape, want->x.shape);
    EXPECT_EQ(got->status, want->status);
    EXPECT_EQ(got->summary.method, want->summary.method);
    EXPECT_EQ(std::memcmp(x, want->x.data.data(), size_t(x_bytes)), 0)
        << "the answer written into the region differs from the one sent over the socket";
  }
  ASSERT_TRUE(shm_client.UnregisterMemory(**shm).ok());
}

TEST(SharedMemory, AutoStagesLargeJobsAndFallsBackWhereRefused) {
  ServerProcess server({});
  ServerProcess refusing({"--no-shared-memory"});
  ASSERT_GT(server.port(), 0) << server.Log();
  ASSERT_GT(refusing.port(), 0) << refusing.Log();
  const auto arrays = examples::RandomTridiagonal(512, 1024, false, 21);  // 16 MiB
  const Job job = MakeJob(Kind::kTridiagonal, arrays);
  auto want = Client(ClientOptions(server, Transport::kGrpc)).Solve(job);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(want->summary.transport, "grpc-stream");

  Client client(ClientOptions(server, Transport::kAuto));
  EXPECT_EQ(client.SharedMemoryState(), "untried");
  for (int rep = 0; rep < 3; ++rep) {  // the staging region is reused
    auto got = client.Solve(job);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.transport, "shared-memory");
    EXPECT_EQ(got->x.data, want->x.data);
  }
  EXPECT_EQ(client.SharedMemoryState(), "shared-memory");

  Client fallback(ClientOptions(refusing, Transport::kAuto));
  auto got = fallback.Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.transport, "grpc-stream");
  EXPECT_EQ(got->x.data, want->x.data);
  EXPECT_EQ(fallback.SharedMemoryState(), "grpc");

  Client insisting(ClientOptions(refusing, Transport::kSharedMemory));
  auto refused = insisting.Solve(job);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--no-shared-memory"), std::string::npos);
}

TEST(SharedMemory, PersistentSystemsAndTheStepStreamReadAndWriteRegions) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client client(ClientOptions(server, Transport::kSharedMemory));
  auto shm = SharedMemory::Create(8 << 20);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(client.RegisterMemory(**shm).ok());
  auto arrays = examples::RandomTridiagonal(16, 500, false, 31);
  Job create{Kind::kTridiagonal};
  for (const char* n : {"a", "b", "c"}) create.arrays[n] = Into(**shm, arrays.at(n));
  auto sys = client.CreateSystem(create);
  ASSERT_TRUE(sys.ok()) << sys.status();

  Client reference(ClientOptions(server, Transport::kGrpc));
  auto want = reference.Solve(MakeJob(Kind::kTridiagonal, arrays));
  ASSERT_TRUE(want.ok());
  const ArrayView d = Into(**shm, arrays.at("d"));
  auto* x = *(*shm)->Allocate<double>(16 * 500);
  JobOptions jo;
  jo.x_out = x;
  auto got = client.SolveSystem(sys->handle, d, {}, jo);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.transport, "shared-memory");
  EXPECT_EQ(std::memcmp(x, want->x.data.data(), want->x.data.size()), 0);

  // An update read from the region, then two steps of the stream answered into the region.
  NdArray b2 = arrays.at("b");
  for (int64_t i = 0; i < b2.elements(); ++i) b2.as<double>()[i] *= 2;
  const ArrayView b2_view = Into(**shm, b2);
  auto two = arrays;
  two["b"] = b2;
  auto want2 = reference.Solve(MakeJob(Kind::kTridiagonal, two));
  ASSERT_TRUE(want2.ok());
  auto stream = client.OpenStepStream(sys->handle);
  ASSERT_TRUE(stream.ok());
  auto* x2 = *(*shm)->Allocate<double>(16 * 500);
  ASSERT_TRUE((*stream)->Send(d, {{"b", b2_view}}, x).ok());
  ASSERT_TRUE((*stream)->Send(d, {}, x2).ok());
  for (int i = 0; i < 2; ++i) {
    auto r = (*stream)->Receive();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->summary.transport, "shared-memory");
  }
  EXPECT_TRUE((*stream)->Finish().ok());
  EXPECT_EQ(std::memcmp(x, want2->x.data.data(), want2->x.data.size()), 0);
  EXPECT_EQ(std::memcmp(x2, want2->x.data.data(), want2->x.data.size()), 0);
}

// Raw requests, to send references the client library would never make.
class Raw {
 public:
  explicit Raw(const ServerProcess& s, std::string token = "")
      : stub_(v1::Solver::NewStub(grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials()))),
        token_(std::move(token)) {}
  v1::Solver::Stub& stub() { return *stub_; }
  template <typename Call>
  grpc::Status Do(Call call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
    return call(*stub_, &ctx);
  }
  grpc::Status Register(const SharedMemory& m, const std::string& name, int64_t offset = 0,
                        int64_t bytes = -1, double ttl_s = 0) {
    v1::RegisterSharedMemoryRequest req;
    req.set_name(name);
    req.set_key(m.key());
    req.set_offset(offset);
    req.set_bytes(bytes < 0 ? m.size() : bytes);
    req.set_ttl_s(ttl_s);
    v1::MemoryRegion resp;
    return Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.RegisterSharedMemory(c, req, &resp);
    });
  }
  grpc::Status Solve(const v1::TridiagonalRequest& req) {
    v1::SolveResponse resp;
    return Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.SolveTridiagonal(c, req, &resp);
    });
  }
  int Regions(std::vector<std::string>* keys = nullptr) {
    v1::ListMemoryResponse resp;
    auto st = Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.ListMemory(c, v1::ListMemoryRequest(), &resp);
    });
    if (keys != nullptr)
      for (const auto& r : resp.regions()) keys->push_back(r.key());
    return st.ok() ? resp.regions_size() : -1;
  }

 private:
  std::unique_ptr<v1::Solver::Stub> stub_;
  std::string token_;
};

// A tridiagonal request of batch x n whose four arrays lie one after the other from `offset`
// of region `region`.
v1::TridiagonalRequest InRegion(const std::string& region, int64_t offset, int64_t batch,
                                int64_t n) {
  v1::TridiagonalRequest r;
  r.set_dtype(v1::FLOAT64);
  int k = 0;
  for (v1::Array* a : {r.mutable_a(), r.mutable_b(), r.mutable_c(), r.mutable_d()}) {
    a->add_shape(batch);
    a->add_shape(n);
    a->mutable_region()->set_region(region);
    a->mutable_region()->set_offset(offset + k++ * batch * n * 8);
  }
  return r;
}

// Statuses in the sparse form (the systems that are not OK) where the request asks and at most
// a quarter of the systems are not OK, one a system otherwise; the client library asks for it and
// answers every system's status as before, by handle, unary and streamed, one or k right-hand
// sides, through shared memory and the socket.
TEST(SharedMemory, SparseStatusesNameEverySystemThatIsNotOk) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const int64_t batch = 64, n = 50;
  // Systems `bad` singular: a row of zeros (a, b and c) in each.
  auto with_singular = [&](const std::vector<int64_t>& bad) {
    auto arrays = examples::RandomTridiagonal(batch, n, false, 41);
    for (int64_t s : bad)
      for (const char* name : {"a", "b", "c"}) arrays.at(name).as<double>()[s * n + 7] = 0;
    return arrays;
  };
  const std::vector<int64_t> few = {3, 40, 63};
  const std::vector<int64_t> many = [] {  // 17 of 64: more than a quarter
    std::vector<int64_t> v;
    for (int64_t s = 0; s < 17; ++s) v.push_back(s * 3);
    return v;
  }();
  auto expected = [&](const std::vector<int64_t>& bad, int64_t k) {
    std::vector<SolveStatus> v(size_t(k * batch), SolveStatus::kOk);
    for (int64_t j = 0; j < k; ++j)
      for (int64_t s : bad) v[size_t(j * batch + s)] = SolveStatus::kSingular;
    return v;
  };

  // On the wire, by raw requests.
  Raw raw(server);
  auto fill = [&](const examples::Arrays& arrays, v1::TridiagonalRequest* r) {
    r->set_dtype(v1::FLOAT64);
    r->set_skip_residual(true);
    for (auto [name, field] : {std::pair{"a", r->mutable_a()}, {"b", r->mutable_b()},
                               {"c", r->mutable_c()}, {"d", r->mutable_d()}}) {
      const NdArray& a = arrays.at(name);
      for (int64_t d : a.shape) field->add_shape(d);
      field->set_data(a.data.data(), a.data.size());
    }
  };
  for (const auto* bad : {&few, &many}) {
    for (bool sparse : {false, true}) {
      SCOPED_TRACE(absl::StrCat(bad->size(), " singular, sparse_status ", sparse));
      const auto arrays = with_singular(*bad);
      v1::TridiagonalRequest req;
      fill(arrays, &req);
      req.set_sparse_status(sparse);
      v1::SolveResponse unary;
      ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
                       return s.SolveTridiagonal(c, req, &unary);
                     }).ok());
      v1::CreateSystemRequest create;
      *create.mutable_tridiagonal() = req;
      create.mutable_tridiagonal()->clear_d();
      v1::SystemInfo info;
      ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
                       return s.CreateSystem(c, create, &info);
                     }).ok());
      v1::SolveSystemRequest step;
      step.set_handle(info.handle());
      *step.mutable_rhs() = req.d();
      step.set_sparse_status(sparse);
      v1::SolveResponse by_handle;
      ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
                       return s.SolveSystem(c, step, &by_handle);
                     }).ok());
      for (const v1::SolveResponse* r : {&unary, &by_handle}) {
        EXPECT_EQ(r->summary().singular(), int64_t(bad->size()));
        if (sparse && bad == &few) {
          EXPECT_EQ(r->status_size(), 0);
          ASSERT_TRUE(r->has_sparse());
          EXPECT_EQ(r->sparse().systems(), batch);
          EXPECT_EQ(std::vector<int64_t>(r->sparse().index().begin(), r->sparse().index().end()),
                    few);
          ASSERT_EQ(r->sparse().status_size(), int(few.size()));
          for (int s : r->sparse().status()) EXPECT_EQ(s, v1::SINGULAR);
        } else {
          EXPECT_FALSE(r->has_sparse());
          ASSERT_EQ(r->status_size(), int(batch));
          const auto want = expected(*bad, 1);
          for (int64_t s = 0; s < batch; ++s)
            EXPECT_EQ(r->status(int(s)), int(want[size_t(s)])) << "system " << s;
        }
      }
    }
  }

  // Through the client library, which asks for sparse statuses: every system's status, and x
  // zero where a system is singular (its calls by reference polling for their answers).
  Client::Options polling = ClientOptions(server, Transport::kSharedMemory);
  polling.rpc_spin_us = 10000;
  Client client(polling);
  auto shm = SharedMemory::Create(16 << 20);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(client.RegisterMemory(**shm).ok());
  for (const auto* bad : {&few, &many}) {
    SCOPED_TRACE(absl::StrCat(bad->size(), " singular"));
    (*shm)->Reset();
    const auto arrays = with_singular(*bad);
    Job create{Kind::kTridiagonal};
    for (const char* name : {"a", "b", "c"}) create.arrays[name] = Into(**shm, arrays.at(name));
    auto sys = client.CreateSystem(create);
    ASSERT_TRUE(sys.ok()) << sys.status();
    const int64_t k = 3;
    NdArray d3{DType::kFloat64, {k, batch, n}, {}};
    d3.data.resize(size_t(k * batch * n * 8));
    for (int64_t j = 0; j < k; ++j)
      std::memcpy(d3.data.data() + j * batch * n * 8, arrays.at("d").data.data(),
                  size_t(batch * n * 8));
    const ArrayView d = Into(**shm, arrays.at("d")), dk = Into(**shm, d3);
    auto* x = *(*shm)->Allocate<double>(k * batch * n);
    auto zero_where_singular = [&](const double* xs, const std::vector<SolveStatus>& st) {
      for (size_t s = 0; s < st.size(); ++s) {
        if (st[s] == SolveStatus::kOk) continue;
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(xs[int64_t(s) * n + i], 0.0) << "system " << s;
      }
    };
    JobOptions jo;
    jo.x_out = x;
    std::memset(x, 0xff, size_t(batch * n * 8));
    auto one = client.SolveSystem(sys->handle, d, {}, jo);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(one->summary.transport, "shared-memory");
    EXPECT_EQ(one->status, expected(*bad, 1));
    zero_where_singular(x, one->status);
    std::memset(x, 0xff, size_t(k * batch * n * 8));
    auto three = client.SolveSystem(sys->handle, dk, {}, jo);
    ASSERT_TRUE(three.ok()) << three.status();
    EXPECT_EQ(three->status, expected(*bad, k));
    zero_where_singular(x, three->status);

    Job unary{Kind::kTridiagonal};
    unary.arrays = create.arrays;
    unary.arrays["d"] = d;
    unary.options = jo;
    auto whole = client.Solve(unary);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(whole->status, expected(*bad, 1));

    auto stream = client.OpenStepStream(sys->handle);
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE((*stream)->Send(d, {}, x).ok());
    auto streamed = (*stream)->Receive();
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(streamed->status, expected(*bad, 1));
    EXPECT_TRUE((*stream)->Finish().ok());
    EXPECT_TRUE(client.ReleaseSystem(sys->handle).ok());
  }
  ASSERT_TRUE(client.UnregisterMemory(**shm).ok());
}

// A server whose sparse statuses name a system outside the batch, out of order, or without
// its status: the client answers DATA_LOSS, never a status read from past the batch.
TEST(SharedMemory, AMalformedSparseAnswerIsDataLoss) {
  class Fake final : public v1::Solver::Service {
   public:
    v1::SparseStatus sparse;
    grpc::Status SolveSystem(grpc::ServerContext*, const v1::SolveSystemRequest* req,
                             v1::SolveResponse* resp) override {
      if (!req->sparse_status()) return grpc::Status(grpc::StatusCode::INTERNAL, "not asked");
      resp->set_dtype(v1::FLOAT64);
      resp->mutable_x()->add_shape(4);
      resp->mutable_x()->add_shape(2);
      resp->mutable_x()->set_data(std::string(64, '\0'));
      *resp->mutable_sparse() = sparse;
      return grpc::Status::OK;
    }
  } fake;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&fake);
  auto server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  Client::Options o;
  o.target = "127.0.0.1:" + std::to_string(port);
  o.transport = Transport::kGrpc;
  o.pipeline_pieces = 0;
  o.own_connection = true;
  Client client(o);
  const std::vector<double> d(8, 1.0);
  const ArrayView rhs{DType::kFloat64, {4, 2}, d.data()};
  auto with = [&](int64_t systems, std::vector<int64_t> index, std::vector<v1::SystemStatus> st) {
    fake.sparse.Clear();
    fake.sparse.set_systems(systems);
    for (int64_t i : index) fake.sparse.add_index(i);
    for (auto x : st) fake.sparse.add_status(x);
    return client.SolveSystem("sys-fake", rhs);
  };
  auto good = with(4, {1, 3}, {v1::SINGULAR, v1::DIVERGED});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->status, (std::vector<SolveStatus>{SolveStatus::kOk, SolveStatus::kSingular,
                                                    SolveStatus::kOk, SolveStatus::kDiverged}));
  for (auto [what, r] : {std::pair{"past the batch", with(4, {4}, {v1::SINGULAR})},
                         {"negative", with(4, {-1}, {v1::SINGULAR})},
                         {"out of order", with(4, {2, 1}, {v1::SINGULAR, v1::SINGULAR})},
                         {"repeated", with(4, {2, 2}, {v1::SINGULAR, v1::SINGULAR})},
                         {"without its status", with(4, {1, 2}, {v1::SINGULAR})},
                         {"a negative batch", with(-4, {}, {})}}) {
    SCOPED_TRACE(what);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  }
  server->Shutdown();
}

// A batch large enough that a GPU server solves it in pieces straight from the page-locked
// region (16 MiB of right-hand side): the singular systems named, their x zero, the others
// solved (run with TRISOLVE_TEST_BACKEND=cuda on a GPU host; the CPU backend's answer here).
TEST(SharedMemory, ALargeBatchByHandleNamesItsSingularSystemsAndZeroesTheirX) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const int64_t batch = 8192, n = 256;
  auto arrays = examples::RandomTridiagonal(batch, n, false, 43);
  const std::vector<int64_t> bad = {0, 4095, 8191};
  for (int64_t s : bad)
    for (const char* name : {"a", "b", "c"}) arrays.at(name).as<double>()[s * n + 100] = 0;
  Client client(ClientOptions(server, Transport::kSharedMemory));
  auto shm = SharedMemory::Create(int64_t{6} * batch * n * 8 + (1 << 20));
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(client.RegisterMemory(**shm).ok());
  Job create{Kind::kTridiagonal};
  for (const char* name : {"a", "b", "c"}) create.arrays[name] = Into(**shm, arrays.at(name));
  auto sys = client.CreateSystem(create);
  ASSERT_TRUE(sys.ok()) << sys.status();
  const ArrayView d = Into(**shm, arrays.at("d"));
  auto* x = *(*shm)->Allocate<double>(batch * n);
  std::fill(x, x + batch * n, 7.0);
  JobOptions jo;
  jo.x_out = x;
  auto got = client.SolveSystem(sys->handle, d, {}, jo);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.singular, int64_t(bad.size()));
  ASSERT_EQ(got->status.size(), size_t(batch));
  for (int64_t s = 0; s < batch; ++s) {
    const bool singular = std::find(bad.begin(), bad.end(), s) != bad.end();
    ASSERT_EQ(got->status[size_t(s)], singular ? SolveStatus::kSingular : SolveStatus::kOk)
        << "system " << s;
    if (singular) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[s * n + i], 0.0) << "system " << s;
    } else {
      ASSERT_NE(x[s * n], 7.0) << "system " << s << " was not written";
    }
  }
  // Every other system solved: its residual from the original arrays.
  const double* a = arrays.at("a").as<double>();
  const double* b = arrays.at("b").as<double>();
  const double* c = arrays.at("c").as<double>();
  const double* dv = arrays.at("d").as<double>();
  double worst = 0;
  for (int64_t s = 1; s < batch; s += 97) {
    if (std::find(bad.begin(), bad.end(), s) != bad.end()) continue;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = s * n + i;
      double r = b[k] * x[k] - dv[k];
      if (i > 0) r += a[k] * x[k - 1];
      if (i + 1 < n) r += c[k] * x[k + 1];
      worst = std::max(worst, std::abs(r) / (std::abs(dv[k]) + 1));
    }
  }
  EXPECT_LT(worst, 1e-10);
  EXPECT_TRUE(client.ReleaseSystem(sys->handle).ok());
  ASSERT_TRUE(client.UnregisterMemory(**shm).ok());
}

TEST(SharedMemory, EveryBadReferenceIsRefusedWithItsOwnStatus) {
  const std::string tokens = "/tmp/trisolve_memory_tokens_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens, "--max-regions-per-identity", "2",
                        "--max-region-bytes", std::to_string(8 << 20)});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw alice(server, "alice-token"), bob(server, "bob-token");
  auto shm = SharedMemory::Create(1 << 20);
  ASSERT_TRUE(shm.ok());
  // Valid, diagonally dominant data in the region: a = c = 1, b = 4, d = 1.
  auto* v = reinterpret_cast<double*>((*shm)->data());
  const int64_t batch = 4, n = 100, e = batch * n;
  for (int64_t i = 0; i < e; ++i) v[i] = v[2 * e + i] = v[3 * e + i] = 1, v[e + i] = 4;
  ASSERT_TRUE(alice.Register(**shm, "r").ok());
  EXPECT_TRUE(alice.Solve(InRegion("r", 0, batch, n)).ok());

  // Registration.
  Expect(alice.Register(**shm, "r"), grpc::StatusCode::ALREADY_EXISTS, "registered already");
  Expect(alice.Register(**shm, "bad name!"), grpc::StatusCode::INVALID_ARGUMENT, "name");
  Expect(alice.Register(**shm, "odd", 100), grpc::StatusCode::INVALID_ARGUMENT, "page size");
  Expect(alice.Register(**shm, "big", 0, (*shm)->size() + 4096), grpc::StatusCode::INVALID_ARGUMENT,
         "does not fit");
  {
    v1::RegisterSharedMemoryRequest req;
    req.set_name("nokey");
    req.set_key("/trisolve-no-such-object");
    req.set_bytes(4096);
    v1::MemoryRegion resp;
    Expect(alice.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.RegisterSharedMemory(c, req, &resp);
    }), grpc::StatusCode::FAILED_PRECONDITION, "same host");
    req.set_key("../etc/passwd");
    Expect(alice.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.RegisterSharedMemory(c, req, &resp);
    }), grpc::StatusCode::INVALID_ARGUMENT, "key");
  }
  auto big = SharedMemory::Create(9 << 20);
  ASSERT_TRUE(big.ok());
  Expect(alice.Register(**big, "huge"), grpc::StatusCode::RESOURCE_EXHAUSTED, "max_region_bytes");
  ASSERT_TRUE(alice.Register(**shm, "second").ok());
  Expect(alice.Register(**shm, "third"), grpc::StatusCode::RESOURCE_EXHAUSTED,
         "max_regions_per_identity");

  // Another identity's region is not there for bob, under any name.
  Expect(bob.Solve(InRegion("r", 0, batch, n)), grpc::StatusCode::NOT_FOUND, "no region named 'r'");
  EXPECT_EQ(bob.Regions(), 0);
  EXPECT_EQ(alice.Regions(), 2);

  // References.
  Expect(alice.Solve(InRegion("nope", 0, batch, n)), grpc::StatusCode::NOT_FOUND, "a.region");
  Expect(alice.Solve(InRegion("r", 4, batch, n)), grpc::StatusCode::INVALID_ARGUMENT,
         "not a multiple of 8");
  Expect(alice.Solve(InRegion("r", (*shm)->size() - 4 * e * 8 + 8, batch, n)),
         grpc::StatusCode::INVALID_ARGUMENT, "lies outside region");
  {
    auto r = InRegion("r", 0, batch, n);
    r.mutable_b()->mutable_region()->set_bytes(e * 8 - 8);
    Expect(alice.Solve(r), grpc::StatusCode::INVALID_ARGUMENT, "b.region");
    r = InRegion("r", 0, batch, n);
    r.mutable_d()->set_data(std::string(size_t(e * 8), '\0'));
    Expect(alice.Solve(r), grpc::StatusCode::INVALID_ARGUMENT, "both data and a region");
    r = InRegion("r", 0, batch, n);
    r.mutable_x_region()->set_region("r");
    r.mutable_x_region()->set_offset(3 * e * 8);  // on top of d
    Expect(alice.Solve(r), grpc::StatusCode::INVALID_ARGUMENT, "overlaps d");
    r.mutable_x_region()->set_offset((*shm)->size() - 8);
    Expect(alice.Solve(r), grpc::StatusCode::INVALID_ARGUMENT, "x_region");
    r.mutable_x_region()->set_offset(4 * e * 8);
    EXPECT_TRUE(alice.Solve(r).ok());
    for (int64_t i = 0; i < e; ++i) ASSERT_TRUE(std::isfinite(v[4 * e + i]) && v[4 * e + i] != 0);
  }
  // A streamed job carries bytes, not references.
  {
    v1::StreamRequest header;
    *header.mutable_tridiagonal() = InRegion("r", 0, batch, n);
    header.mutable_tridiagonal()->mutable_x_region()->set_region("r");
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer alice-token");
    auto stub = v1::Solver::NewStub(
        grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
    auto rw = stub->SolveStream(&ctx);
    rw->Write(header);
    rw->WritesDone();
    v1::StreamResponse resp;
    while (rw->Read(&resp)) {
    }
    Expect(rw->Finish(), grpc::StatusCode::INVALID_ARGUMENT, "a.region");
  }
  // A region whose object shrank under the server fails the request that uses it, alone.
  const int fd = shm_open((*shm)->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  Expect(alice.Solve(InRegion("r", 0, batch, n)), grpc::StatusCode::FAILED_PRECONDITION, "shrank");

  // Unregistered: gone for every later request.
  v1::UnregisterMemoryRequest un;
  un.set_name("r");
  v1::MemoryRegion out;
  EXPECT_TRUE(alice.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    return s.UnregisterMemory(c, un, &out);
  }).ok());
  Expect(alice.Solve(InRegion("r", 0, batch, n)), grpc::StatusCode::NOT_FOUND, "no region");
  Expect(bob.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    un.set_name("second");
    return s.UnregisterMemory(c, un, &out);
  }), grpc::StatusCode::NOT_FOUND, "no such region");
  std::remove(tokens.c_str());
}

// A client that shrinks its object while the server reads it (a hostile or broken client)
// fails the request that met the missing pages, FAILED_PRECONDITION, and every later use of
// that region; the server, its other regions and other clients carry on. Without the guard
// the server's read past the object's end is a SIGBUS that ends the process.
TEST(SharedMemory, AnObjectShrunkDuringASolveFailsThatRegionNotTheServer) {
  ServerProcess server({"--cpu-threads", "1"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  const int64_t batch = 1024, n = 1024, e = batch * n;  // 32 MiB of arrays, ms a solve
  auto shrinks = SharedMemory::Create(5 * e * 8);
  auto stays = SharedMemory::Create(5 * e * 8);
  ASSERT_TRUE(shrinks.ok() && stays.ok());
  for (auto* m : {shrinks->get(), stays->get()}) {
    auto* v = reinterpret_cast<double*>(m->data());
    for (int64_t i = 0; i < e; ++i) v[i] = v[2 * e + i] = v[3 * e + i] = 1, v[e + i] = 4;
  }
  ASSERT_TRUE(raw.Register(**shrinks, "shrinks").ok());
  ASSERT_TRUE(raw.Register(**stays, "stays").ok());
  // Solves back to back, x into the region too (this process must not touch the shrunk pages
  // either), and the object shrunk under them.
  auto in_region = [&](const std::string& name) {
    v1::TridiagonalRequest r = InRegion(name, 0, batch, n);
    r.mutable_x_region()->set_region(name);
    r.mutable_x_region()->set_offset(4 * e * 8);
    return r;
  };
  std::atomic<bool> stop{false};
  std::vector<grpc::Status> seen;
  std::thread solver([&] {
    while (!stop.load()) {
      seen.push_back(raw.Solve(in_region("shrinks")));
      if (!seen.back().ok()) break;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int fd = shm_open((*shrinks)->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  solver.join();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(server.Wait(0), -1) << "the server exited: " << server.Log();
  Expect(seen.back(), grpc::StatusCode::FAILED_PRECONDITION, "shrank under the server");
  for (size_t i = 0; i + 1 < seen.size(); ++i) EXPECT_TRUE(seen[i].ok()) << seen[i].error_message();
  // The region stays failed; the other region and the socket serve on.
  Expect(raw.Solve(in_region("shrinks")), grpc::StatusCode::FAILED_PRECONDITION,
         "shrank");
  {
    const grpc::Status st = raw.Solve(in_region("stays"));
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
  Client client(ClientOptions(server, Transport::kGrpc));
  const auto arrays = examples::RandomTridiagonal(4, 64, false, 3);
  auto got = client.Solve(MakeJob(Kind::kTridiagonal, arrays));
  ASSERT_TRUE(got.ok()) << got.status();
  // Unregistered (unmapped), and the server still serving.
  v1::UnregisterMemoryRequest un;
  un.set_name("shrinks");
  v1::MemoryRegion out;
  EXPECT_TRUE(raw.Do([&](v1::Solver::Stub& st, grpc::ClientContext* c) {
    return st.UnregisterMemory(c, un, &out);
  }).ok());
  EXPECT_EQ(raw.Regions(), 1);
  EXPECT_TRUE(raw.Solve(in_region("stays")).ok());
}

// A client that rewrites a tree's parent array in its region while the server solves from it
// (a hostile client): the server checks and solves from its own copy of the structure, so each
// request is answered for the parents it checked, or refused naming the bad one, and the server
// lives. Solved in place, a parent changed between the check and the sweep sent the sweep
// outside its arrays (SIGSEGV).
TEST(SharedMemory, AParentArrayRewrittenDuringSolvesNeverLeadsTheServerAstray) {
  ServerProcess server({"--cpu-threads", "1"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  const int64_t n = int64_t{1} << 20;  // one cable of 2^20 nodes
  auto shm = SharedMemory::Create(n * 4 + 5 * n * 8);
  ASSERT_TRUE(shm.ok());
  auto* parent = reinterpret_cast<std::atomic<int32_t>*>((*shm)->data());
  auto* v = reinterpret_cast<double*>((*shm)->data() + n * 4);  // lower, upper, diag, rhs, x
  for (int64_t i = 0; i < n; ++i) {
    parent[i].store(int32_t(i - 1), std::memory_order_relaxed);
    v[i] = v[n + i] = -1, v[2 * n + i] = 4, v[3 * n + i] = 1;
  }
  ASSERT_TRUE(raw.Register(**shm, "tree").ok());
  v1::TreeRequest req;
  req.set_dtype(v1::FLOAT64);
  req.set_method("hines");
  int k = 0;
  for (v1::Array* a : {req.mutable_parent(), req.mutable_lower(), req.mutable_upper(),
                       req.mutable_diag(), req.mutable_rhs()}) {
    a->add_shape(n);
    a->mutable_region()->set_region("tree");
    a->mutable_region()->set_offset(a == req.mutable_parent() ? 0 : n * 4 + (k++) * n * 8);
  }
  req.mutable_x_region()->set_region("tree");
  req.mutable_x_region()->set_offset(n * 4 + 4 * n * 8);
  std::atomic<bool> stop{false};
  std::thread flipper([&] {  // the last nodes' parents, far out of range and back, over and over
    while (!stop.load())
      for (int64_t i = n - 1; i >= n - 256; --i) {
        parent[i].store(int32_t{1} << 30, std::memory_order_relaxed);
        parent[i].store(int32_t(i - 1), std::memory_order_relaxed);
      }
  });
  int ok = 0, refused = 0;
  for (int q = 0; q < 60 && server.Wait(0) == -1; ++q) {
    v1::SolveResponse resp;
    const grpc::Status st = raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.SolveTree(c, req, &resp);
    });
    if (st.ok()) {
      ++ok;
    } else {
      ++refused;
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
      EXPECT_NE(st.error_message().find("parent"), std::string::npos) << st.error_message();
    }
  }
  stop = true;
  flipper.join();
  EXPECT_EQ(server.Wait(0), -1) << "the server exited: " << server.Log();
  EXPECT_EQ(ok + refused, 60);
  // Once the client stops, the answer is the cable's, from the region.
  v1::SolveResponse resp;
  ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    return s.SolveTree(c, req, &resp);
  }).ok());
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* x = v + 4 * n;
    double r = 4 * x[i] - 1;
    if (i > 0) r -= x[i - 1];
    if (i + 1 < n) r -= x[i + 1];
    worst = std::max(worst, std::abs(r));
  }
  EXPECT_LT(worst, 1e-12);
}

// RegisterCudaMemory where the server has no device (the CPU backend, as CI runs it): refused
// FAILED_PRECONDITION saying how to get it, after the fields are checked, each named; nothing
// is registered. (The CUDA backend's side: test_cuda_ipc on a GPU.)
TEST(CudaMemory, RefusedByAServerWithoutADeviceAndEveryBadFieldNamed) {
  ServerProcess server({}, "cpu");
  ServerProcess refusing({"--no-shared-memory"}, "cpu");
  ASSERT_GT(server.port(), 0) << server.Log();
  ASSERT_GT(refusing.port(), 0) << refusing.Log();
  Raw raw(server), raw_refusing(refusing);
  auto reg = [](Raw& r, const std::string& name, const std::string& handle, int device,
                int64_t offset, int64_t bytes, double ttl_s = 0) {
    v1::RegisterCudaMemoryRequest req;
    req.set_name(name);
    req.set_handle(handle);
    req.set_device(device);
    req.set_offset(offset);
    req.set_bytes(bytes);
    req.set_ttl_s(ttl_s);
    v1::MemoryRegion resp;
    return r.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.RegisterCudaMemory(c, req, &resp);
    });
  };
  const std::string handle(64, '\x11');
  Expect(reg(raw, "dev", handle, 0, 0, 1 << 20), grpc::StatusCode::FAILED_PRECONDITION,
         "--backend cuda");
  Expect(reg(raw_refusing, "dev", handle, 0, 0, 1 << 20), grpc::StatusCode::FAILED_PRECONDITION,
         "--no-shared-memory");
  Expect(reg(raw, "dev", std::string(63, 'h'), 0, 0, 1 << 20), grpc::StatusCode::INVALID_ARGUMENT,
         "handle: 63 bytes, expected 64");
  Expect(reg(raw, "dev", "", 0, 0, 1 << 20), grpc::StatusCode::INVALID_ARGUMENT, "handle: 0 bytes");
  Expect(reg(raw, "bad name!", handle, 0, 0, 1 << 20), grpc::StatusCode::INVALID_ARGUMENT, "name");
  Expect(reg(raw, "", handle, 0, 0, 1 << 20), grpc::StatusCode::INVALID_ARGUMENT, "name");
  Expect(reg(raw, "dev", handle, -1, 0, 1 << 20), grpc::StatusCode::INVALID_ARGUMENT, "device");
  Expect(reg(raw, "dev", handle, 0, -8, 1 << 20), grpc::StatusCode::INVALID_ARGUMENT, "offset");
  Expect(reg(raw, "dev", handle, 0, 0, 0), grpc::StatusCode::INVALID_ARGUMENT, "bytes");
  Expect(reg(raw, "dev", handle, 0, 1, std::numeric_limits<int64_t>::max()),
         grpc::StatusCode::INVALID_ARGUMENT, "overflows");
  Expect(reg(raw, "dev", handle, 0, 0, 1 << 20, -1), grpc::StatusCode::INVALID_ARGUMENT, "ttl_s");
  Expect(reg(raw, "dev", handle, 0, 0, int64_t{1} << 40), grpc::StatusCode::RESOURCE_EXHAUSTED,
         "max_region_bytes");
  EXPECT_EQ(raw.Regions(), 0);
  Expect(raw.Solve(InRegion("dev", 0, 4, 100)), grpc::StatusCode::NOT_FOUND, "no region named");

  // Through the client library, with a CudaMemory it did not make itself (no CUDA here).
  Client client(ClientOptions(server, Transport::kGrpc));
  CudaMemory m;
  static double host_stand_in[512];
  m.data = host_stand_in;
  m.bytes = sizeof(host_stand_in);
  m.handle = handle;
  Expect(client.RegisterCudaMemory(m, "dev"), absl::StatusCode::kFailedPrecondition,
         "--backend cuda");
  Expect(client.UnregisterCudaMemory(m), absl::StatusCode::kNotFound, "not registered");
}

// A client process killed with its region registered and a job in flight: the server carries on,
// and the registration goes when its time-to-live passes.
TEST(SharedMemory, AKilledClientsRegionExpiresAndTheServerCarriesOn) {
  ServerProcess server({"--region-ttl", "1"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw raw(server);
  std::vector<std::string> args = {ServerProcess::CliBin(), "--server", server.target(),
                                   "bench", "--transport", "shm", "--mode", "unary",
                                   "--batch", "256", "--n", "1024", "--requests", "1000000"};
  testing::ChildProcess cli(args, "/dev/null");
  ASSERT_GT(cli.pid(), 0);
  // Killed once its region is registered and its requests are running.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (raw.Regions() < 1 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<std::string> keys;
  ASSERT_EQ(raw.Regions(&keys), 1) << server.Log();
  // Killed with its requests running: the server has answered some of them, and counts more.
  Client watcher(ClientOptions(server, Transport::kGrpc));
  ASSERT_TRUE(testing::WaitForServer(watcher, [](const ServerInfoSummary& i) {
    return i.jobs_done >= 5 && i.jobs_in_flight + i.jobs_queued > 0;
  })) << server.Log();
  cli.Kill();
  for (const auto& k : keys) shm_unlink(k.c_str());  // what the dead client left in /dev/shm
  // The server answers as before, and the dead client's region expires.
  const auto arrays = examples::RandomTridiagonal(8, 64, false, 41);
  Client client(ClientOptions(server, Transport::kGrpc));
  EXPECT_TRUE(client.Solve(MakeJob(Kind::kTridiagonal, arrays)).ok());
  const auto expire_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (raw.Regions() != 0 && std::chrono::steady_clock::now() < expire_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(raw.Regions(), 0);
  EXPECT_NE(server.Log().find("expired"), std::string::npos);
  EXPECT_TRUE(client.Solve(MakeJob(Kind::kTridiagonal, arrays)).ok());
}

}  // namespace
}  // namespace trisolve

namespace trisolve {
namespace {

// A large job's non-finite value is refused by position, and no answer is given: found by the
// host's threaded check, or by the device's scan under --backend cuda (the position then from
// the host's check).
TEST(SharedMemory, ALargeJobsNonFiniteValueIsRefusedByPosition) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client client(ClientOptions(server, Transport::kSharedMemory));
  const int64_t batch = 2048, n = 1024;  // 2^21 unknowns, 2^23 values: the threaded check
  auto arrays = examples::RandomTridiagonal(batch, n, false, 51);
  auto shm = SharedMemory::Create(10 * batch * n * 8 + 4096);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(client.RegisterMemory(**shm).ok());
  Job job{Kind::kTridiagonal};
  for (const auto& [name, a] : arrays) job.arrays[name] = Into(**shm, a);
  auto* x = *(*shm)->Allocate<double>(batch * n);
  job.options.x_out = x;
  {  // (under --backend cuda: copied in, solved and copied back in pieces, each scanned)
    auto good = client.Solve(job);
    ASSERT_TRUE(good.ok()) << good.status();
    EXPECT_EQ(good->summary.ok, batch);
    EXPECT_LT(good->summary.residual, 1e-14);
  }
  auto* b = static_cast<double*>(const_cast<void*>(job.arrays["b"].data));
  b[1500 * n + 7] = std::nan("");
  auto r = client.Solve(job);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("b[1500][7] is NaN"), std::string::npos) << r.status();
  b[1500 * n + 7] = 4;

  Job create{Kind::kTridiagonal};
  for (const char* name : {"a", "b", "c"}) create.arrays[name] = job.arrays[name];
  auto sys = client.CreateSystem(create);
  ASSERT_TRUE(sys.ok()) << sys.status();
  // Two right-hand sides (2^22 values).
  auto* d2 = *(*shm)->Allocate<double>(2 * batch * n);
  auto* x2 = *(*shm)->Allocate<double>(2 * batch * n);
  for (int k = 0; k < 2; ++k)
    std::memcpy(d2 + k * batch * n, job.arrays["d"].data, size_t(batch * n * 8));
  const ArrayView rhs2{DType::kFloat64, {2, batch, n}, d2};
  JobOptions jo;
  jo.x_out = x2;
  {
    auto good = client.SolveSystem(sys->handle, rhs2, {}, jo);
    ASSERT_TRUE(good.ok()) << good.status();
    EXPECT_EQ(good->summary.ok, 2 * batch);
    EXPECT_LT(good->summary.residual, 1e-14);
  }
  d2[batch * n + 2047 * n + 1023] = INFINITY;
  auto s = client.SolveSystem(sys->handle, rhs2, {}, jo);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("rhs[1][2047][1023] is Inf"), std::string::npos)
      << s.status();
}

}  // namespace
}  // namespace trisolve

namespace trisolve {
namespace {

// Clients elsewhere: the bytes go into the server's memory over several connections at once.
TEST(ServerMemory, ParallelStreamsSolveAsOverTheSocket) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const auto arrays = examples::RandomTridiagonal(512, 1024, false, 61);  // 4 MiB an array
  const Job job = MakeJob(Kind::kTridiagonal, arrays);
  Client reference(ClientOptions(server, Transport::kGrpc));
  auto want = reference.Solve(job);
  ASSERT_TRUE(want.ok()) << want.status();

  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.parallel_streams = 3;  // 20 MiB over three connections
  Client client(o);
  for (int rep = 0; rep < 2; ++rep) {  // the second reuses the server region
    auto got = client.Solve(job);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.transport, "streams");
    EXPECT_EQ(got->x.data, want->x.data);
  }
  std::vector<double> x(512 * 1024);
  Job into = job;
  into.options.x_out = x.data();
  auto got = client.Solve(into);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->x.data.empty());
  EXPECT_EQ(std::memcmp(x.data(), want->x.data.data(), want->x.data.size()), 0);

  Job create{Kind::kTridiagonal};
  for (const char* n : {"a", "b", "c"}) create.arrays[n] = arrays.at(n).view();
  auto sys = client.CreateSystem(create);
  ASSERT_TRUE(sys.ok()) << sys.status();
  auto by_handle = client.SolveSystem(sys->handle, arrays.at("d").view());
  ASSERT_TRUE(by_handle.ok()) << by_handle.status();
  EXPECT_EQ(by_handle->summary.transport, "streams");
  EXPECT_EQ(by_handle->x.data, want->x.data);

  // The upload regions are the caller's, listed as the server's own memory.
  Raw raw(server);
  v1::ListMemoryResponse list;
  ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    return s.ListMemory(c, v1::ListMemoryRequest(), &list);
  }).ok());
  ASSERT_GE(list.regions_size(), 1);
  for (const auto& r : list.regions()) EXPECT_TRUE(r.server_owned()) << r.name();
}

// Over 64 MiB through the server's memory (the chunks written from the caller's arrays and read
// back into x without protobuf copies), checked by each system's backward error from the
// original arrays.
TEST(ServerMemory, StreamsCarryAJobOver64MiBCheckedByResidual) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const int64_t batch = 2048, n = 2048;  // 32 MiB an array: 128 MiB in, 32 MiB out
  const auto arrays = examples::RandomTridiagonal(batch, n, false, 71);
  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.parallel_streams = 4;
  o.pipeline_pieces = 4;
  o.pipeline_piece_bytes = int64_t{32} << 20;  // below the default, so that 160 MB goes in pieces
  Client client(o);
  std::vector<double> x(size_t(batch * n), std::nan(""));
  Job job = MakeJob(Kind::kTridiagonal, arrays);
  job.options.x_out = x.data();
  auto got = client.Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.transport, "streams");
  EXPECT_GE(got->summary.pieces, 2);  // solved in pieces while the next ones uploaded
  EXPECT_EQ(got->summary.systems, batch);
  EXPECT_EQ(got->summary.ok, batch);
  EXPECT_EQ(got->status.size(), size_t(batch));
  EXPECT_GT(got->summary.timings.upload_us, 0);
  EXPECT_GT(got->summary.timings.download_us, 0);
  const auto* a = reinterpret_cast<const double*>(arrays.at("a").data.data());
  const auto* b = reinterpret_cast<const double*>(arrays.at("b").data.data());
  const auto* c = reinterpret_cast<const double*>(arrays.at("c").data.data());
  const auto* d = reinterpret_cast<const double*>(arrays.at("d").data.data());
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t o0 = s * n;
    double r = 0, norm_a = 0, norm_x = 0, norm_d = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = o0 + i;
      double ax = b[k] * x[size_t(k)], row = std::abs(b[k]);
      if (i > 0) ax += a[k] * x[size_t(k - 1)], row += std::abs(a[k]);
      if (i + 1 < n) ax += c[k] * x[size_t(k + 1)], row += std::abs(c[k]);
      r = std::max(r, std::abs(d[k] - ax));
      norm_a = std::max(norm_a, row);
      norm_x = std::max(norm_x, std::abs(x[size_t(k)]));
      norm_d = std::max(norm_d, std::abs(d[k]));
    }
    const double e = r / (norm_a * norm_x + norm_d);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  EXPECT_LT(worst, 1e-14);
}

// By default (pipeline_pieces -1) a job goes in pieces only to a server that solves on a GPU
// (a CPU-backend server gets it whole), and a solve by handle goes whole either way; asked for
// pieces, both get them.
TEST(ServerMemory, PiecesByDefaultOnlyWhereTheServerSolvesOnAGpu) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const int64_t batch = 256, n = 2048;  // 4 MiB an array
  const auto arrays = examples::RandomTridiagonal(batch, n, false, 72);
  for (const int pieces : {-1, 4}) {
    Client::Options o = ClientOptions(server, Transport::kStreams);
    o.pipeline_pieces = pieces;
    o.pipeline_piece_bytes = int64_t{2} << 20;
    Client client(o);
    auto got = client.Solve(MakeJob(Kind::kTridiagonal, arrays));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.ok, batch);
    const bool gpu = ServerProcess::TestBackend() != "cpu";
    EXPECT_EQ(got->summary.pieces, pieces < 0 && !gpu ? 0 : 4) << "pipeline_pieces " << pieces;
    Job sys = MakeJob(Kind::kTridiagonal, arrays);
    sys.arrays.erase("d");
    auto made = client.CreateSystem(sys, {});
    ASSERT_TRUE(made.ok()) << made.status();
    auto step = client.SolveSystem(made->handle, arrays.at("d").view());
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->summary.ok, batch);
    EXPECT_EQ(step->summary.pieces, pieces < 0 ? 0 : 4) << "by handle, pipeline_pieces " << pieces;
  }
}

// A batch in pieces gives the answer of the whole job bit for bit (a tree batch: its parent
// array goes once, with the first piece), its x returned or written where the caller asked; a
// bad value in a later piece is refused naming the systems it lies in.
TEST(ServerMemory, ABatchInPiecesAnswersAsTheWholeJob) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const auto tree = examples::CableTree(testing::Branchy(300), 1000, 91);  // 4 arrays of 2.4 MB
  const auto tri = examples::RandomTridiagonal(3001, 512, false, 92);  // 12.3 MB an array
  Client::Options whole_o = ClientOptions(server, Transport::kStreams);
  whole_o.pipeline_pieces = 0;
  Client whole(whole_o);
  Client::Options pieces_o = ClientOptions(server, Transport::kStreams);
  pieces_o.pipeline_piece_bytes = 1 << 20;
  pieces_o.pipeline_pieces = 7;
  Client pieces(pieces_o);
  for (const auto* arrays : {&tree, &tri}) {
    const Job job = MakeJob(arrays == &tree ? Kind::kTree : Kind::kTridiagonal, *arrays);
    auto want = whole.Solve(job);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(want->summary.pieces, 0);
    auto got = pieces.Solve(job);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.pieces, 7);
    EXPECT_EQ(got->summary.transport, "streams");
    EXPECT_EQ(got->x.shape, want->x.shape);
    EXPECT_EQ(got->x.data, want->x.data);
    EXPECT_EQ(got->status, want->status);
    EXPECT_EQ(got->summary.systems, want->summary.systems);
    EXPECT_EQ(got->summary.ok, want->summary.ok);
    EXPECT_LT(got->summary.residual, 1e-13);
    std::vector<std::byte> x(want->x.data.size());
    Job into = job;
    into.options.x_out = x.data();
    auto placed = pieces.Solve(into);
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_TRUE(placed->x.data.empty());
    EXPECT_EQ(std::memcmp(x.data(), want->x.data.data(), x.size()), 0);
  }
  // System 2000 of 3001 lies in the fifth of seven pieces, [1714, 2143).
  auto bad = tri;
  reinterpret_cast<double*>(bad.at("d").data.data())[2000 * 512 + 7] = std::nan("");
  auto refused = pieces.Solve(MakeJob(Kind::kTridiagonal, bad));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("systems [1714, 2143) of the batch"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("d[286][7] is NaN"), std::string::npos)
      << refused.status();
  // The client goes on after the refusal.
  auto again = pieces.Solve(MakeJob(Kind::kTridiagonal, tri));
  ASSERT_TRUE(again.ok()) << again.status();
}

// A client process killed while its big jobs stream in and out (its connections dropped
// mid-upload or mid-download, most likely the former: uploading is most of each job): the
// server answers the others as before and the dead client's region expires.
TEST(ServerMemory, AClientKilledMidUploadLeavesTheServerServing) {
  ServerProcess server({"--region-ttl", "1"});
  ASSERT_GT(server.port(), 0) << server.Log();
  std::vector<std::string> args = {ServerProcess::CliBin(), "--server", server.target(),
                                   "bench", "--transport", "streams", "--mode", "unary",
                                   "--batch", "2048", "--n", "2048", "--requests", "1000000"};
  testing::ChildProcess cli(args, "/dev/null");
  ASSERT_GT(cli.pid(), 0);
  // Killed once it has had jobs solved and is moving more.
  Client watcher(ClientOptions(server, Transport::kGrpc));
  ASSERT_TRUE(testing::WaitForServer(watcher, [](const ServerInfoSummary& i) {
    return i.jobs_done >= 3;
  })) << server.Log();
  cli.Kill();
  const auto arrays = examples::RandomTridiagonal(1024, 1024, false, 42);  // 8 MiB an array
  const Job job = MakeJob(Kind::kTridiagonal, arrays);
  auto want = Client(ClientOptions(server, Transport::kGrpc)).Solve(job);
  ASSERT_TRUE(want.ok()) << want.status();
  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.pipeline_pieces = 8;
  o.pipeline_piece_bytes = 8 << 20;
  Client client(o);
  auto got = client.Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GE(got->summary.pieces, 2);
  EXPECT_EQ(got->x.data, want->x.data);
  // The dead client's region goes; this client's stays while it is in use.
  const auto expire_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (server.Log().find("expired") == std::string::npos &&
         std::chrono::steady_clock::now() < expire_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(server.Log().find("expired"), std::string::npos) << server.Log();
  got = client.Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->x.data, want->x.data);
}

// A generic call that sends bytes no MemoryChunk would hold.
grpc::Status WriteRawBytes(const ServerProcess& server, const std::string& bytes) {
  auto channel = grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto call = stub.PrepareCall(&ctx, "/trisolve.v1.Solver/WriteMemory", &cq);
  void* tag;
  bool ok;
  call->StartCall(&ctx);
  cq.Next(&tag, &ok);
  grpc::Slice slice(bytes.data(), bytes.size());
  call->Write(grpc::ByteBuffer(&slice, 1), &ctx);
  cq.Next(&tag, &ok);
  call->WritesDone(&ctx);
  cq.Next(&tag, &ok);
  grpc::Status st;
  call->Finish(&st, &ctx);
  cq.Next(&tag, &ok);
  call.reset();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

// An upload that breaks (dropped mid-stream, past its region, malformed) fails that call alone:
// a client moving a job over the same server at the same time gets every answer right.
TEST(ServerMemory, ABrokenUploadFailsThatCallAlone) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const auto arrays = examples::RandomTridiagonal(512, 1024, false, 81);  // 4 MiB an array
  const Job job = MakeJob(Kind::kTridiagonal, arrays);
  auto want = Client(ClientOptions(server, Transport::kGrpc)).Solve(job);
  ASSERT_TRUE(want.ok()) << want.status();
  std::atomic<bool> stop{false};
  std::atomic<int> solved{0}, wrong{0};
  std::thread busy([&] {
    Client::Options o = ClientOptions(server, Transport::kStreams);
    o.parallel_streams = 2;
    Client client(o);
    while ((!stop || solved < 3) && wrong == 0) {
      auto got = client.Solve(job);
      if (got.ok() && got->x.data == want->x.data)
        ++solved;
      else
        ++wrong;
    }
  });

  Raw raw(server);
  v1::AllocateMemoryRequest alloc;
  alloc.set_name("small");
  alloc.set_bytes(1 << 20);
  v1::MemoryRegion region;
  ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    return s.AllocateMemory(c, alloc, &region);
  }).ok());
  // Dropped mid-upload: half the region written, then the stream is reset.
  for (int rep = 0; rep < 3; ++rep) {
    grpc::ClientContext ctx;
    v1::MemoryRegion resp;
    auto w = raw.stub().WriteMemory(&ctx, &resp);
    v1::MemoryChunk chunk;
    chunk.set_region("small");
    chunk.set_data(std::string(512 << 10, '\x02'));
    ASSERT_TRUE(w->Write(chunk));
    ctx.TryCancel();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // A chunk past the region's end.
  Expect(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    v1::MemoryRegion resp;
    auto w = s.WriteMemory(c, &resp);
    v1::MemoryChunk chunk;
    chunk.set_region("small");
    chunk.set_offset((1 << 20) - 4096);
    chunk.set_data(std::string(8192, '\x03'));
    w->Write(chunk);
    w->WritesDone();
    return w->Finish();
  }), grpc::StatusCode::INVALID_ARGUMENT, "lies outside region 'small' of 1048576 bytes");
  // Bytes that are not a chunk.
  Expect(WriteRawBytes(server, std::string("\x0a\x05sma", 5)), grpc::StatusCode::INVALID_ARGUMENT,
         "malformed memory chunk");
  Expect(WriteRawBytes(server, std::string("\x1a\x05\x01", 3) + "x"),
         grpc::StatusCode::INVALID_ARGUMENT, "malformed memory chunk");
  stop = true;
  busy.join();
  EXPECT_GE(solved.load(), 3);
  EXPECT_EQ(wrong.load(), 0);
  // The region still takes a whole upload and gives it back.
  v1::MemoryChunk whole;
  whole.set_region("small");
  whole.set_data(std::string(1 << 20, '\x04'));
  ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    v1::MemoryRegion resp;
    auto w = s.WriteMemory(c, &resp);
    w->Write(whole);
    w->WritesDone();
    return w->Finish();
  }).ok());
  std::string back;
  ASSERT_TRUE(raw.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    v1::ReadMemoryRequest req;
    req.set_region("small");
    auto r = s.ReadMemory(c, req);
    v1::MemoryChunk chunk;
    while (r->Read(&chunk)) back += chunk.data();
    return r->Finish();
  }).ok());
  EXPECT_EQ(back, whole.data());
}

TEST(ServerMemory, BadAllocationsWritesAndReadsAreRefused) {
  const std::string tokens = "/tmp/trisolve_memory_tokens2_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens, "--max-region-bytes", std::to_string(1 << 20)});
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw alice(server, "alice-token"), bob(server, "bob-token");
  auto allocate = [](Raw& who, const std::string& name, int64_t bytes) {
    v1::AllocateMemoryRequest req;
    req.set_name(name);
    req.set_bytes(bytes);
    v1::MemoryRegion resp;
    return who.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.AllocateMemory(c, req, &resp);
    });
  };
  Expect(allocate(alice, "no spaces", 4096), grpc::StatusCode::INVALID_ARGUMENT, "name");
  Expect(allocate(alice, "zero", 0), grpc::StatusCode::INVALID_ARGUMENT, "bytes");
  Expect(allocate(alice, "huge", 2 << 20), grpc::StatusCode::RESOURCE_EXHAUSTED, "max_region_bytes");
  ASSERT_TRUE(allocate(alice, "up", 65536).ok());
  Expect(allocate(alice, "up", 4096), grpc::StatusCode::ALREADY_EXISTS, "registered already");

  auto write = [](Raw& who, const std::string& region, int64_t offset, size_t bytes) {
    v1::MemoryRegion resp;
    return who.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      auto w = s.WriteMemory(c, &resp);
      v1::MemoryChunk chunk;
      chunk.set_region(region);
      chunk.set_offset(offset);
      chunk.set_data(std::string(bytes, '\x01'));
      w->Write(chunk);
      w->WritesDone();
      return w->Finish();
    });
  };
  EXPECT_TRUE(write(alice, "up", 0, 65536).ok());
  Expect(write(alice, "up", 65000, 1000), grpc::StatusCode::INVALID_ARGUMENT, "lies outside");
  Expect(write(alice, "up", -8, 8), grpc::StatusCode::INVALID_ARGUMENT, "lies outside");
  Expect(write(bob, "up", 0, 8), grpc::StatusCode::NOT_FOUND, "no region named 'up'");

  auto read = [](Raw& who, const std::string& region, int64_t offset, int64_t bytes,
                 std::string* out) {
    v1::ReadMemoryRequest req;
    req.set_region(region);
    req.set_offset(offset);
    req.set_bytes(bytes);
    return who.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      auto r = s.ReadMemory(c, req);
      v1::MemoryChunk chunk;
      while (r->Read(&chunk)) out->append(chunk.data());
      return r->Finish();
    });
  };
  std::string got;
  ASSERT_TRUE(read(alice, "up", 100, 1000, &got).ok());
  EXPECT_EQ(got, std::string(1000, '\x01'));
  got.clear();
  Expect(read(alice, "up", 65000, 1000, &got), grpc::StatusCode::INVALID_ARGUMENT, "lies outside");
  Expect(read(bob, "up", 0, 8, &got), grpc::StatusCode::NOT_FOUND, "no region named 'up'");
  std::remove(tokens.c_str());
}

}  // namespace
}  // namespace trisolve
