// Solves by handle in pieces, end to end on the real trisolved over loopback: SolveSystem on a
// range of a batch's systems (raw requests: the range's rows of the whole solve, bit for bit;
// every bad range refused naming its field), and the client's pipelined solve by handle through
// the server's memory (a job over 64 MiB checked by residual and against the serial path bit
// for bit; a bad value named by its piece and system; a client killed mid-pipeline); the
// regions a client keeps between its solves (never another identity's, never a stale answer,
// given up under the caps).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client_test_util.h"
#include "gtest/gtest.h"
#include "raw_stub.h"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using testing::Branchy;
using testing::ClientOptions;
using testing::Expect;
using testing::ServerProcess;

// The system's coefficients (every array but the right-hand side).
Job Coefficients(Kind kind, const examples::Arrays& arrays, const std::string& rhs) {
  Job job{kind};
  for (const auto& [name, a] : arrays)
    if (name != rhs) job.arrays[name] = a.view();
  return job;
}

struct Step {
  grpc::Status status;
  v1::SolveResponse resp;
};

// One SolveSystem by raw request: `rows` rows of `rhs` (a [batch, n] array) from row `row0`,
// shaped [k, rows / k, n] when k > 1, with the range fields as given.
Step SolveRaw(v1::Solver::Stub& stub, const std::string& handle, const NdArray& rhs,
              int64_t row0, int64_t rows, int64_t first_system, int64_t systems, int64_t k = 1) {
  v1::SolveSystemRequest req;
  req.set_handle(handle);
  req.set_first_system(first_system);
  req.set_systems(systems);
  const int64_t n = rhs.shape.back(), eb = DTypeSize(rhs.dtype);
  if (k > 1) req.mutable_rhs()->add_shape(k);
  req.mutable_rhs()->add_shape(rows / k);
  req.mutable_rhs()->add_shape(n);
  req.mutable_rhs()->set_data(rhs.data.data() + row0 * n * eb, size_t(rows * n * eb));
  Step s;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  s.status = stub.SolveSystem(&ctx, req, &s.resp);
  return s;
}

// Each range's x is the whole solve's rows, bit for bit, with the range's statuses and counts;
// k right-hand sides of a range likewise; tridiagonal in both precisions and a tree batch.
TEST(SystemRanges, ARangesAnswerIsTheWholeSolvesRowsBitForBit) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  auto stub = testing::RawStub(server.target());
  Client client(ClientOptions(server, Transport::kGrpc));
  struct Case {
    Kind kind;
    examples::Arrays arrays;
    std::string rhs;
    std::string method;  // thomas: on the CUDA backend every range on the device, as the whole
  };
  std::vector<Case> cases;
  cases.push_back({Kind::kTridiagonal, examples::RandomTridiagonal(37, 100, false, 5), "d"});
  cases.push_back({Kind::kTridiagonal,
                   examples::RandomTridiagonal(37, 100, false, 6, DType::kFloat32), "d"});
  cases.push_back({Kind::kTree, examples::CableTree(Branchy(120), 23, 7), "rhs"});
  cases.push_back(
      {Kind::kTridiagonal, examples::RandomTridiagonal(512, 256, false, 8), "d", "thomas"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.kind == Kind::kTree ? "tree" : c.arrays.at("d").dtype == DType::kFloat32
                                                      ? "tridiagonal float32"
                                                      : "tridiagonal float64 " + c.method);
    Job coefficients = Coefficients(c.kind, c.arrays, c.rhs);
    coefficients.options.method = c.method;
    auto sys = client.CreateSystem(coefficients);
    ASSERT_TRUE(sys.ok()) << sys.status();
    const NdArray& rhs = c.arrays.at(c.rhs);
    const int64_t batch = rhs.shape[0], n = rhs.shape[1], eb = DTypeSize(rhs.dtype);
    const Step whole = SolveRaw(*stub, sys->handle, rhs, 0, batch, 0, 0);
    ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
    const std::string& x = whole.resp.x().data();
    ASSERT_EQ(int64_t(x.size()), batch * n * eb);
    for (auto [first, count] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 5}, {5, 12}, {17, batch - 17}, {batch - 1, 1}, {0, batch}}) {
      SCOPED_TRACE(::testing::Message() << "systems [" << first << ", " << first + count << ")");
      const Step part = SolveRaw(*stub, sys->handle, rhs, first, count, first, count);
      ASSERT_TRUE(part.status.ok()) << part.status.error_message();
      EXPECT_EQ(part.resp.x().data(), x.substr(size_t(first * n * eb), size_t(count * n * eb)));
      EXPECT_EQ(std::vector<int64_t>(part.resp.x().shape().begin(), part.resp.x().shape().end()),
                (std::vector<int64_t>{count, n}));
      ASSERT_EQ(part.resp.status_size(), count);
      for (int64_t s = 0; s < count; ++s)
        EXPECT_EQ(part.resp.status(int(s)), whole.resp.status(int(first + s)));
      EXPECT_EQ(part.resp.summary().systems(), count);
      EXPECT_EQ(part.resp.summary().ok(), count);
      EXPECT_LT(part.resp.summary().residual(), c.rhs == "rhs" ? 1e-12 : 1e-5);
    }
    // Two right-hand sides of systems [3, 9): [2, 6, n], each block the range's rows.
    NdArray two;
    two.dtype = rhs.dtype;
    two.shape = {12, n};
    for (int rep = 0; rep < 2; ++rep)
      two.data.insert(two.data.end(), rhs.data.begin() + 3 * n * eb, rhs.data.begin() + 9 * n * eb);
    const Step k2 = SolveRaw(*stub, sys->handle, two, 0, 12, 3, 6, 2);
    ASSERT_TRUE(k2.status.ok()) << k2.status.error_message();
    const std::string rows = x.substr(size_t(3 * n * eb), size_t(6 * n * eb));
    EXPECT_EQ(k2.resp.x().data(), rows + rows);
    EXPECT_EQ(k2.resp.status_size(), 12);
    EXPECT_EQ(k2.resp.summary().systems(), 12);
    ASSERT_TRUE(client.ReleaseSystem(sys->handle).ok());
  }
}

// Every bad range is INVALID_ARGUMENT naming its field, and refused before anything is applied.
TEST(SystemRanges, EveryBadRangeIsRefusedNamingTheField) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  auto stub = testing::RawStub(server.target());
  Client client(ClientOptions(server, Transport::kGrpc));
  const auto tri = examples::RandomTridiagonal(16, 50, false, 21);
  auto sys = client.CreateSystem(Coefficients(Kind::kTridiagonal, tri, "d"));
  ASSERT_TRUE(sys.ok()) << sys.status();
  const NdArray& d = tri.at("d");
  const auto bad = [&](int64_t row0, int64_t rows, int64_t first, int64_t systems,
                       const std::string& words) {
    SCOPED_TRACE(::testing::Message() << "first_system " << first << ", systems " << systems);
    Expect(SolveRaw(*stub, sys->handle, d, row0, rows, first, systems).status,
           grpc::StatusCode::INVALID_ARGUMENT, words);
  };
  bad(0, 4, -1, 4, "first_system: -1 is negative");
  bad(0, 4, 0, -4, "systems: -4 is negative");
  bad(0, 4, 3, 0, "systems: 0 (the whole batch) with first_system 3");
  bad(0, 1, 16, 1, "first_system: systems [16, 17) lie outside the batch of 16");
  bad(0, 4, 14, 4, "systems: systems [14, 18) lie outside the batch of 16");
  bad(0, 16, 2, 4, "systems [2, 6) of the batch: rhs has shape [16, 50], expected [4, 50]");
  bad(0, 3, 2, 4, "expected [4, 50]");
  {  // An update with a range: refused, and not applied.
    const Step before = SolveRaw(*stub, sys->handle, d, 0, 16, 0, 0);
    ASSERT_TRUE(before.status.ok());
    v1::SolveSystemRequest req;
    req.set_handle(sys->handle);
    req.set_first_system(0);
    req.set_systems(4);
    req.mutable_rhs()->add_shape(4);
    req.mutable_rhs()->add_shape(50);
    req.mutable_rhs()->set_data(d.data.data(), size_t(4 * 50 * 8));
    v1::NamedArray* u = req.add_update();
    u->set_name("b");
    u->mutable_array()->add_shape(16);
    u->mutable_array()->add_shape(50);
    std::vector<double> big(16 * 50, 1e6);
    u->mutable_array()->set_data(big.data(), big.size() * 8);
    v1::SolveResponse resp;
    grpc::ClientContext ctx;
    Expect(stub->SolveSystem(&ctx, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
           "update: a step on a range of systems");
    const Step after = SolveRaw(*stub, sys->handle, d, 0, 16, 0, 0);
    ASSERT_TRUE(after.status.ok());
    EXPECT_EQ(after.resp.x().data(), before.resp.x().data());
  }
  // Families and layouts whose range is not pointer offsets.
  const auto inter = examples::RandomTridiagonal(16, 50, true, 22);
  Job interleaved = Coefficients(Kind::kTridiagonal, inter, "d");
  interleaved.options.interleaved = true;
  auto isys = client.CreateSystem(interleaved);
  ASSERT_TRUE(isys.ok()) << isys.status();
  Expect(SolveRaw(*stub, isys->handle, inter.at("d"), 0, 4, 0, 4).status,
         grpc::StatusCode::INVALID_ARGUMENT, "first_system: a range of systems needs a flat batch");
  const auto dense = examples::RandomDense(6, 10, false, 23);
  auto dsys = client.CreateSystem(Coefficients(Kind::kDense, dense, "b"));
  ASSERT_TRUE(dsys.ok()) << dsys.status();
  Expect(SolveRaw(*stub, dsys->handle, dense.at("b"), 0, 2, 0, 2).status,
         grpc::StatusCode::INVALID_ARGUMENT, "first_system: a range of systems is solved for "
                                             "tridiagonal and tree batches; this system is dense");
  // A bad value in a range is named by its system in the batch.
  NdArray nan = d;
  reinterpret_cast<double*>(nan.data.data())[11 * 50 + 7] = std::nan("");
  const Step refused = SolveRaw(*stub, sys->handle, nan, 8, 8, 8, 8);
  Expect(refused.status, grpc::StatusCode::INVALID_ARGUMENT, "rhs[3][7] is NaN");
  Expect(refused.status, grpc::StatusCode::INVALID_ARGUMENT, "system 11 of the batch");
  // The server goes on.
  EXPECT_TRUE(SolveRaw(*stub, sys->handle, d, 8, 8, 8, 8).status.ok());
}

// The residual of each system of a flat tridiagonal batch from the original arrays: the worst
// normwise backward error (a NaN the worst of all).
double WorstBackwardError(const examples::Arrays& arrays, const double* x) {
  const NdArray& d = arrays.at("d");
  const int64_t batch = d.shape[0], n = d.shape[1];
  const double* a = arrays.at("a").as<double>();
  const double* b = arrays.at("b").as<double>();
  const double* c = arrays.at("c").as<double>();
  const double* r = d.as<double>();
  double worst = 0;
  for (int64_t s = 0; s < batch; ++s) {
    double res = 0, norm_a = 0, norm_x = 0, norm_d = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = s * n + i;
      double ax = b[k] * x[k], row = std::abs(b[k]);
      if (i > 0) ax += a[k] * x[k - 1], row += std::abs(a[k]);
      if (i + 1 < n) ax += c[k] * x[k + 1], row += std::abs(c[k]);
      res = std::max(res, std::abs(r[k] - ax));
      norm_a = std::max(norm_a, row);
      norm_x = std::max(norm_x, std::abs(x[k]));
      norm_d = std::max(norm_d, std::abs(r[k]));
    }
    const double e = res / (norm_a * norm_x + norm_d);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

// Over 64 MiB by handle (d 68 MiB up, x 68 MiB down) in four pieces while they upload and
// download: each system's residual from the original arrays, and x, the statuses and the
// counts as the serial path gives them, bit for bit; into the caller's memory too.
TEST(HandlePipeline, AJobOver64MiBMatchesTheSerialPathAndItsResidual) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  const int64_t batch = 4352, n = 2048;  // 8.9 M unknowns, 71 MB an array
  const auto arrays = examples::RandomTridiagonal(batch, n, false, 31);
  Client::Options serial_o = ClientOptions(server, Transport::kStreams);
  serial_o.pipeline_pieces = 0;
  Client serial(serial_o);
  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.parallel_streams = 4;
  o.pipeline_pieces = 4;
  o.pipeline_piece_bytes = int64_t{32} << 20;
  Client piped(o);
  auto sys = piped.CreateSystem(Coefficients(Kind::kTridiagonal, arrays, "d"));
  ASSERT_TRUE(sys.ok()) << sys.status();
  auto want = serial.SolveSystem(sys->handle, arrays.at("d").view());
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(want->summary.pieces, 0);
  EXPECT_EQ(want->summary.transport, "streams");
  auto got = piped.SolveSystem(sys->handle, arrays.at("d").view());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.pieces, 4);
  EXPECT_EQ(got->summary.transport, "streams");
  EXPECT_EQ(got->summary.handle, sys->handle);
  EXPECT_EQ(got->summary.systems, batch);
  EXPECT_EQ(got->summary.ok, batch);
  EXPECT_EQ(got->summary.right_hand_sides, 1);
  EXPECT_GT(got->summary.timings.upload_us, 0);
  EXPECT_GT(got->summary.timings.download_us, 0);
  EXPECT_EQ(got->x.shape, want->x.shape);
  EXPECT_EQ(got->status, want->status);
  EXPECT_TRUE(got->x.data == want->x.data);
  EXPECT_LT(got->summary.residual, 1e-14);
  EXPECT_LT(WorstBackwardError(arrays, got->x.as<double>()), 1e-14);
  // x written where the caller asks.
  std::vector<double> x(size_t(batch * n), std::nan(""));
  JobOptions into;
  into.x_out = x.data();
  auto placed = piped.SolveSystem(sys->handle, arrays.at("d").view(), {}, into);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->summary.pieces, 4);
  EXPECT_TRUE(placed->x.data.empty());
  EXPECT_EQ(std::memcmp(x.data(), want->x.data.data(), want->x.data.size()), 0);
}

// The other splits: a tree batch by ranges (its shared parent untouched), k right-hand sides
// of one system by right-hand sides, an update sent with the step; each as the serial path,
// bit for bit. A handle this client did not make is looked up; a released one is NOT_FOUND.
TEST(HandlePipeline, TreesManyRightHandSidesAndUpdatesAsTheSerialPath) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client::Options serial_o = ClientOptions(server, Transport::kStreams);
  serial_o.pipeline_pieces = 0;
  Client serial(serial_o);
  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.pipeline_pieces = 5;
  o.pipeline_piece_bytes = 1 << 20;
  Client piped(o);
  const auto tree = examples::CableTree(Branchy(300), 1000, 41);  // rhs 2.4 MB
  auto tsys = serial.CreateSystem(Coefficients(Kind::kTree, tree, "rhs"));  // not piped's
  ASSERT_TRUE(tsys.ok()) << tsys.status();
  auto want = serial.SolveSystem(tsys->handle, tree.at("rhs").view());
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = piped.SolveSystem(tsys->handle, tree.at("rhs").view());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.pieces, 4);  // 4.8 MB moved: four pieces of 1 MiB or more
  EXPECT_TRUE(got->x.data == want->x.data);
  EXPECT_EQ(got->status, want->status);
  EXPECT_EQ(got->summary.systems, 1000);

  // One system, 48 right-hand sides of 8192 unknowns (3 MiB): split by right-hand sides.
  const auto one = examples::RandomTridiagonal(1, 8192, false, 42);
  auto osys = piped.CreateSystem(Coefficients(Kind::kTridiagonal, one, "d"));
  ASSERT_TRUE(osys.ok()) << osys.status();
  const auto many = examples::RandomTridiagonal(48, 8192, false, 43);
  NdArray rhs = many.at("d");
  auto want_k = serial.SolveSystem(osys->handle, rhs.view());
  ASSERT_TRUE(want_k.ok()) << want_k.status();
  auto got_k = piped.SolveSystem(osys->handle, rhs.view());
  ASSERT_TRUE(got_k.ok()) << got_k.status();
  EXPECT_EQ(got_k->summary.pieces, 5);
  EXPECT_EQ(got_k->summary.right_hand_sides, 48);
  EXPECT_EQ(got_k->summary.systems, 48);
  if (ServerProcess::TestBackend() == "cpu") {
    EXPECT_TRUE(got_k->x.data == want_k->x.data);
  } else {
    // A GPU server picks its kernel by the batch's shape, and a piece of ~10 right-hand sides
    // is not the whole 48's: the same answer to rounding, not bit for bit.
    const double* g = got_k->x.as<double>();
    const double* w = want_k->x.as<double>();
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < got_k->x.elements(); ++i) {
      diff = std::max(diff, std::abs(g[i] - w[i]));
      scale = std::max(scale, std::abs(w[i]));
    }
    EXPECT_LE(diff, 1e-12 * scale);
  }
  EXPECT_LT(got_k->summary.residual, 1e-14);

  // An update with the step: applied to the whole system, then the pieces solved.
  const auto tri = examples::RandomTridiagonal(1200, 512, false, 44);  // d 4.9 MB
  const auto tri2 = examples::RandomTridiagonal(1200, 512, false, 45);
  auto s1 = piped.CreateSystem(Coefficients(Kind::kTridiagonal, tri, "d"));
  auto s2 = serial.CreateSystem(Coefficients(Kind::kTridiagonal, tri, "d"));
  ASSERT_TRUE(s1.ok() && s2.ok());
  const Updates update = {{"b", tri2.at("b").view()}};
  auto want_u = serial.SolveSystem(s2->handle, tri.at("d").view(), update);
  ASSERT_TRUE(want_u.ok()) << want_u.status();
  auto got_u = piped.SolveSystem(s1->handle, tri.at("d").view(), update);
  ASSERT_TRUE(got_u.ok()) << got_u.status();
  EXPECT_EQ(got_u->summary.pieces, 5);
  EXPECT_TRUE(got_u->x.data == want_u->x.data);
  // Released: NOT_FOUND, as on the serial path.
  ASSERT_TRUE(piped.ReleaseSystem(s1->handle).ok());
  auto gone = piped.SolveSystem(s1->handle, tri.at("d").view());
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
}

// A bad value in a later piece fails the call naming the piece and the system in the batch;
// the pieces before it were solved, the client and the server go on.
TEST(HandlePipeline, AFailingPieceNamesItsPieceAndSystem) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.pipeline_pieces = 7;
  o.pipeline_piece_bytes = 1 << 20;
  Client piped(o);
  const auto tri = examples::RandomTridiagonal(3001, 512, false, 51);  // d 12.3 MB
  auto sys = piped.CreateSystem(Coefficients(Kind::kTridiagonal, tri, "d"));
  ASSERT_TRUE(sys.ok()) << sys.status();
  NdArray bad = tri.at("d");
  // System 2000 of 3001 lies in the fifth of seven pieces, [1714, 2143).
  bad.as<double>()[2000 * 512 + 7] = std::nan("");
  auto refused = piped.SolveSystem(sys->handle, bad.view());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* words : {"piece 5 of 7 (systems [1714, 2143) of 3001)", "rhs[286][7] is NaN",
                            "system 2000 of the batch"})
    EXPECT_NE(refused.status().message().find(words), std::string::npos)
        << refused.status() << " does not say " << words;
  auto again = piped.SolveSystem(sys->handle, tri.at("d").view());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->summary.pieces, 7);
  EXPECT_EQ(again->summary.ok, 3001);
}

// A client process killed while its solves by handle stream in pieces (connections dropped
// mid-upload, mid-solve or mid-download): the server stays healthy, answers by handle in
// pieces as before, and the dead client's region expires.
TEST(HandlePipeline, AClientKilledMidPipelineLeavesTheServerHealthy) {
  ServerProcess server({"--region-ttl", "1"});
  ASSERT_GT(server.port(), 0) << server.Log();
  std::vector<std::string> args = {ServerProcess::CliBin(), "--server", server.target(),
                                   "--pipeline-pieces", "8",
                                   "--pipeline-piece-bytes", "4194304", "bench", "--transport",
                                   "streams", "--mode", "handle", "--batch", "2048", "--n",
                                   "2048", "--requests", "1000000"};
  testing::ChildProcess cli(args, "/dev/null");
  ASSERT_GT(cli.pid(), 0);
  // Killed once it has had pieces solved (eight a request) and is moving more.
  Client watcher(ClientOptions(server, Transport::kGrpc));
  ASSERT_TRUE(testing::WaitForServer(watcher, [](const ServerInfoSummary& i) {
    return i.jobs_done >= 20;
  })) << server.Log();
  cli.Kill();

  auto health = watcher.Health();
  ASSERT_TRUE(health.ok()) << health.status();
  const auto tri = examples::RandomTridiagonal(1024, 1024, false, 61);  // 8 MiB an array
  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.pipeline_pieces = 8;
  o.pipeline_piece_bytes = 1 << 20;
  Client client(o);
  auto sys = client.CreateSystem(Coefficients(Kind::kTridiagonal, tri, "d"));
  ASSERT_TRUE(sys.ok()) << sys.status();
  auto got = client.SolveSystem(sys->handle, tri.at("d").view());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.pieces, 8);
  EXPECT_LT(WorstBackwardError(tri, got->x.as<double>()), 1e-14);
  const auto expire_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (server.Log().find("expired") == std::string::npos &&
         std::chrono::steady_clock::now() < expire_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(server.Log().find("expired"), std::string::npos) << server.Log();
  got = client.SolveSystem(sys->handle, tri.at("d").view());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.pieces, 8);
}

// The region a client keeps between its solves by handle holds its last right-hand side and x:
// another identity cannot read it, solve into it or use the handle; after a refused call (whole
// and in pieces) the next answer is the new right-hand side's, never the last one's.
TEST(HandleRegions, AKeptRegionIsNeverAnotherIdentitysNorAStaleAnswer) {
  const std::string tokens = "/tmp/trisolve_handle_tokens_" + std::to_string(getpid());
  std::ofstream(tokens) << "alice-token\nbob-token\n";
  ServerProcess server({"--token-file", tokens});
  ASSERT_GT(server.port(), 0) << server.Log();
  const int64_t batch = 2304, n = 1024;  // 18.9 MB an array: x made while d goes up
  const auto one = examples::RandomTridiagonal(batch, n, false, 71);
  const auto two = examples::RandomTridiagonal(batch, n, false, 72);  // its d: another rhs
  Client::Options ao = ClientOptions(server, Transport::kStreams);
  ao.token = "alice-token";
  ao.pipeline_pieces = 0;
  Client alice(ao);
  ao.pipeline_pieces = 3;
  ao.pipeline_piece_bytes = 4 << 20;
  Client alice_piped(ao);
  Client::Options bo = ClientOptions(server, Transport::kStreams);
  bo.token = "bob-token";
  bo.pipeline_pieces = 0;
  Client bob(bo);
  auto sys = alice.CreateSystem(Coefficients(Kind::kTridiagonal, one, "d"));
  ASSERT_TRUE(sys.ok()) << sys.status();
  for (Client* c : {&alice, &alice_piped}) {
    const bool piped = c == &alice_piped;
    SCOPED_TRACE(piped ? "in pieces" : "whole");
    auto first = c->SolveSystem(sys->handle, one.at("d").view());
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->summary.pieces, piped ? 3 : 0);
    EXPECT_LT(WorstBackwardError(one, first->x.as<double>()), 1e-14);
    // Refused after its right-hand side went up: the region keeps what it held.
    NdArray bad = two.at("d");
    bad.as<double>()[(batch - 1) * n + 3] = std::nan("");
    auto refused = c->SolveSystem(sys->handle, bad.view());
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    // The same region again: the new right-hand side's answer, to the last row.
    examples::Arrays next = one;
    next["d"] = two.at("d");
    auto again = c->SolveSystem(sys->handle, next.at("d").view());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->summary.ok, batch);
    EXPECT_LT(WorstBackwardError(next, again->x.as<double>()), 1e-14);
    EXPECT_FALSE(again->x.data == first->x.data);
  }
  // Alice's regions, holding her arrays: not bob's to read, write or solve into.
  auto stub = testing::RawStub(server.target());
  std::vector<std::string> names;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer alice-token");
    v1::ListMemoryResponse listed;
    ASSERT_TRUE(stub->ListMemory(&ctx, v1::ListMemoryRequest(), &listed).ok());
    for (const auto& r : listed.regions()) names.push_back(r.name());
  }
  ASSERT_EQ(names.size(), 2u);  // one a client, kept
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer bob-token");
    v1::ReadMemoryRequest req;
    req.set_region(name);
    req.set_bytes(64);
    auto reader = stub->ReadMemory(&ctx, req);
    v1::MemoryChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    Expect(reader->Finish(), grpc::StatusCode::NOT_FOUND, "no region named");
    v1::SolveSystemRequest step;
    step.set_handle(sys->handle);
    step.mutable_rhs()->add_shape(batch);
    step.mutable_rhs()->add_shape(n);
    step.mutable_rhs()->mutable_region()->set_region(name);
    grpc::ClientContext sctx;
    sctx.AddMetadata("authorization", "Bearer bob-token");
    v1::SolveResponse resp;
    Expect(stub->SolveSystem(&sctx, step, &resp), grpc::StatusCode::NOT_FOUND, "");
  }
  auto foreign = bob.SolveSystem(sys->handle, one.at("d").view());
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kNotFound) << foreign.status();
  // Bob's own system of the same shape, through a region of his own: his answer.
  auto his = bob.CreateSystem(Coefficients(Kind::kTridiagonal, two, "d"));
  ASSERT_TRUE(his.ok()) << his.status();
  auto answer = bob.SolveSystem(his->handle, two.at("d").view());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_LT(WorstBackwardError(two, answer->x.as<double>()), 1e-14);
  std::remove(tokens.c_str());
}

// The regions a client keeps count against its identity's caps: a solve that needs a larger
// region than the kept one gives the kept one up rather than failing; one larger than the cap
// is RESOURCE_EXHAUSTED naming it; the caps hold throughout and the client goes on.
TEST(HandleRegions, KeptRegionsGiveWayUnderTheCaps) {
  const int64_t cap = int64_t{72} << 20;
  ServerProcess server(
      {"--max-region-bytes", std::to_string(cap), "--max-message-bytes", "200000000"});
  ASSERT_GT(server.port(), 0) << server.Log();
  Client::Options o = ClientOptions(server, Transport::kStreams);
  o.pipeline_pieces = 0;
  Client client(o);
  Client maker(ClientOptions(server, Transport::kGrpc));  // the coefficients in the messages
  auto stub = testing::RawStub(server.target());
  auto held = [&] {
    grpc::ClientContext ctx;
    v1::ListMemoryResponse listed;
    EXPECT_TRUE(stub->ListMemory(&ctx, v1::ListMemoryRequest(), &listed).ok());
    int64_t bytes = 0;
    for (const auto& r : listed.regions()) bytes += r.bytes();
    return bytes;
  };
  // d and x of 1 MiB: a region of 16 MiB (the smallest), kept.
  const auto small = examples::RandomTridiagonal(128, 1024, false, 81);
  auto ssys = maker.CreateSystem(Coefficients(Kind::kTridiagonal, small, "d"));
  ASSERT_TRUE(ssys.ok()) << ssys.status();
  auto s1 = client.SolveSystem(ssys->handle, small.at("d").view());
  ASSERT_TRUE(s1.ok()) << s1.status();
  EXPECT_EQ(held(), int64_t{16} << 20);
  // d and x of 24 MiB: a region of 64 MiB, which fits the cap only without the kept one.
  const auto large = examples::RandomTridiagonal(3072, 1024, false, 82);
  auto lsys = maker.CreateSystem(Coefficients(Kind::kTridiagonal, large, "d"));
  ASSERT_TRUE(lsys.ok()) << lsys.status();
  auto l1 = client.SolveSystem(lsys->handle, large.at("d").view());
  ASSERT_TRUE(l1.ok()) << l1.status();
  EXPECT_LT(WorstBackwardError(large, l1->x.as<double>()), 1e-14);
  EXPECT_EQ(held(), int64_t{64} << 20);
  // d and x of 40 MiB: a region of 128 MiB, over the cap whatever the client gives up.
  const auto huge = examples::RandomTridiagonal(5120, 1024, false, 83);
  auto hsys = maker.CreateSystem(Coefficients(Kind::kTridiagonal, huge, "d"));
  ASSERT_TRUE(hsys.ok()) << hsys.status();
  auto h1 = client.SolveSystem(hsys->handle, huge.at("d").view());
  ASSERT_FALSE(h1.ok());
  EXPECT_EQ(h1.status().code(), absl::StatusCode::kResourceExhausted) << h1.status();
  EXPECT_NE(h1.status().message().find("max_region_bytes"), std::string::npos) << h1.status();
  EXPECT_LE(held(), cap);
  // The client goes on: both earlier systems answered again, correctly.
  auto s2 = client.SolveSystem(ssys->handle, small.at("d").view());
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_TRUE(s2->x.data == s1->x.data);
  auto l2 = client.SolveSystem(lsys->handle, large.at("d").view());
  ASSERT_TRUE(l2.ok()) << l2.status();
  EXPECT_TRUE(l2->x.data == l1->x.data);
  EXPECT_LE(held(), cap);
}

}  // namespace
}  // namespace trisolve
