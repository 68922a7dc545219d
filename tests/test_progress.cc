// SolveWithProgress and the residual history against the real trisolved on loopback: the
// stream is monotone and ends with the answer, nothing is reported where nobody asked, the
// history matches the answer, and a cancelled progress call gives its slot back.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client_test_util.h"
#include "raw_stub.h"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using testing::MakeJob;
using testing::ServerProcess;
using testing::WaitForServer;

class Progress_ : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One slot for every job (no small-jobs pool): the cancellation test needs to see it freed.
    server_ = new ServerProcess({"--max-concurrent-jobs", "1", "--small-job-unknowns", "0"});
    ASSERT_GT(server_->port(), 0) << server_->Log();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static Client MakeClient() {
    Client::Options o;
    o.target = server_->target();
    o.transport = Transport::kGrpc;
    return Client(o);
  }
  static std::unique_ptr<v1::Solver::Stub> Stub() { return testing::RawStub(server_->target()); }
  static ServerProcess* server_;
};
ServerProcess* Progress_::server_ = nullptr;

void SetArray(v1::Array* a, const NdArray& x) {
  for (int64_t d : x.shape) a->add_shape(d);
  a->set_data(x.data.data(), x.data.size());
}

// The thesis' experiment 1 on N x M as a block request.
v1::BlockTridiagonalRequest BlockRequest(const examples::Arrays& ar, const std::string& method,
                                         double tol, int64_t max_iterations) {
  v1::BlockTridiagonalRequest r;
  r.set_dtype(v1::FLOAT64);
  r.set_method(method);
  SetArray(r.mutable_a_c(), ar.at("aC"));
  SetArray(r.mutable_c_c(), ar.at("cC"));
  SetArray(r.mutable_b_c(), ar.at("bC"));
  SetArray(r.mutable_c_a(), ar.at("cA"));
  SetArray(r.mutable_c_b(), ar.at("cB"));
  SetArray(r.mutable_f(), ar.at("f"));
  r.set_tol(tol);
  r.set_max_iterations(max_iterations);
  return r;
}

TEST_F(Progress_, StreamIsMonotoneAndEndsWithTheAnswer) {
  const auto ar = examples::ThesisExperiment1(128, 128);
  v1::ProgressRequest req;
  *req.mutable_block_tridiagonal() = BlockRequest(ar, "red-black", 1e-10, 100000);
  req.mutable_block_tridiagonal()->set_residual_history(true);
  req.set_interval_s(0.01);
  auto stub = Stub();
  grpc::ClientContext ctx;
  auto reader = stub->SolveWithProgress(&ctx, req);
  std::vector<v1::ProgressResponse> msgs;
  v1::ProgressResponse m;
  while (reader->Read(&m)) msgs.push_back(m);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_GE(msgs.size(), 3u);
  ASSERT_TRUE(msgs.back().has_answer()) << "the last message is the answer";
  int phase = 0;
  int64_t iteration = 0, bytes = 0, solving = 0;
  double elapsed = 0;
  for (size_t i = 0; i + 1 < msgs.size(); ++i) {
    ASSERT_TRUE(msgs[i].has_progress()) << "only the last message is an answer (" << i << ")";
    const v1::Progress& p = msgs[i].progress();
    EXPECT_GE(int(p.phase()), phase) << i;
    if (int(p.phase()) != phase) bytes = 0;
    phase = int(p.phase());
    EXPECT_GE(p.bytes_done(), bytes) << i;
    EXPECT_LE(p.bytes_done(), p.bytes_total()) << i;
    bytes = p.bytes_done();
    EXPECT_GE(p.elapsed_s(), elapsed) << i;
    elapsed = p.elapsed_s();
    if (p.phase() == v1::Progress::SOLVING) {
      ++solving;
      EXPECT_GE(p.iteration(), iteration) << i;
      iteration = p.iteration();
      EXPECT_EQ(p.max_iterations(), 100000);
      EXPECT_DOUBLE_EQ(p.tol(), 1e-10);
      if (p.has_residual()) {
        EXPECT_TRUE(std::isfinite(p.residual()));
      }
    }
  }
  EXPECT_EQ(msgs.front().progress().phase(), v1::Progress::RECEIVED);
  EXPECT_EQ(msgs.front().progress().bytes_total(), 6 * 128 * 128 * 8);
  EXPECT_GE(solving, 1) << "a solve of ~" << elapsed << " s reported no iteration";
  const v1::SolveResponse& a = msgs.back().answer();
  EXPECT_EQ(a.status_size(), 1);
  EXPECT_EQ(a.status(0), v1::OK);
  EXPECT_LE(a.summary().residual(), 1e-10);
  EXPECT_GE(a.summary().iterations(), iteration);
  EXPECT_EQ(int64_t(a.x().data().size()), 128 * 128 * 8);
  ASSERT_GT(a.summary().residual_history_size(), 1);
  EXPECT_EQ(a.summary().residual_history(a.summary().residual_history_size() - 1).iteration(),
            a.summary().iterations());
}

TEST_F(Progress_, ClientCallbackAndResidualHistory) {
  Client client = MakeClient();
  for (const char* method : {"multigrid-cg", "cg", "multigrid-bicgstab", "gauss-seidel", "auto"}) {
    SCOPED_TRACE(method);
    const auto ar = examples::ThesisExperiment2(64, 64);
    Job job = MakeJob(Kind::kBlockTridiagonal, ar);
    job.options.method = method;
    job.options.tol = 1e-10;
    job.options.max_iterations = 20000;
    job.options.residual_history = true;
    std::vector<trisolve::Progress> seen;
    job.options.progress = [&](const trisolve::Progress& p) { seen.push_back(p); };
    job.options.progress_interval_s = 0.01;
    auto r = client.Solve(job);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.front().phase, "received");
    const auto& h = r->summary.residual_history;
    ASSERT_GE(h.size(), 2u);
    EXPECT_LE(h.size(), 1024u);
    EXPECT_EQ(h.front().iteration, 0);
    EXPECT_DOUBLE_EQ(h.front().residual, 1.0) << "y0 = 0: the first residual is ||f|| / ||f||";
    for (size_t i = 1; i < h.size(); ++i) EXPECT_GT(h[i].iteration, h[i - 1].iteration) << i;
    EXPECT_EQ(h.back().iteration, r->summary.iterations);
    EXPECT_DOUBLE_EQ(h.back().residual, r->summary.residual);
    EXPECT_LE(r->summary.residual, 1e-10);
    int64_t last = 0;
    for (const auto& p : seen)
      if (p.phase == "solving") {
        EXPECT_GE(p.iteration, last);
        last = p.iteration;
        EXPECT_LE(p.iteration, r->summary.iterations);
      }
  }
}

// Past 1024 checks the history keeps every other point, then every fourth, ...: bounded, still
// from 0 to the end, iterations increasing.
TEST_F(Progress_, HistoryStaysBoundedOverALongSolve) {
  Client client = MakeClient();
  const auto ar = examples::ThesisExperiment1(16, 16);
  Job job = MakeJob(Kind::kBlockTridiagonal, ar);
  job.options.method = "jacobi";
  job.options.tol = 1e-300;  // never reached: every one of the 5000 sweeps is checked
  job.options.max_iterations = 5000;
  job.options.residual_history = true;
  auto r = client.Solve(job);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& h = r->summary.residual_history;
  EXPECT_LE(h.size(), 1024u);
  EXPECT_GE(h.size(), 512u);
  EXPECT_EQ(h.front().iteration, 0);
  EXPECT_EQ(h.back().iteration, 5000);
  EXPECT_EQ(r->summary.iterations, 5000);
  for (size_t i = 1; i < h.size(); ++i) EXPECT_GT(h[i].iteration, h[i - 1].iteration) << i;
}

TEST_F(Progress_, NothingReportedWhereNotAsked) {
  Client client = MakeClient();
  const auto ar = examples::ThesisExperiment1(32, 32);
  Job job = MakeJob(Kind::kBlockTridiagonal, ar);
  job.options.tol = 1e-10;
  auto r = client.Solve(job);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->summary.residual_history.empty());
  EXPECT_GT(r->summary.iterations, 0);
  // The unary RPC's answer carries no history unless asked.
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1::SolveResponse resp;
  ASSERT_TRUE(stub->SolveBlockTridiagonal(&ctx, BlockRequest(ar, "", 1e-10, 1000), &resp).ok());
  EXPECT_EQ(resp.summary().residual_history_size(), 0);
  // Asked on the unary RPC: there too.
  grpc::ClientContext ctx2;
  auto req = BlockRequest(ar, "", 1e-10, 1000);
  req.set_residual_history(true);
  ASSERT_TRUE(stub->SolveBlockTridiagonal(&ctx2, req, &resp).ok());
  ASSERT_GT(resp.summary().residual_history_size(), 1);
  EXPECT_EQ(resp.summary().residual_history(resp.summary().residual_history_size() - 1).iteration(),
            resp.summary().iterations());
  // A direct family: the client refuses the history rather than drop it.
  const auto tr = examples::RandomTridiagonal(4, 16, false, 1);
  Job tj = MakeJob(Kind::kTridiagonal, tr);
  tj.options.residual_history = true;
  auto bad = client.Solve(tj);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("residual_history"), std::string::npos);
}

TEST_F(Progress_, DirectFamiliesAndBadRequests) {
  auto stub = Stub();
  {  // a tridiagonal solve: phases, no iterations, then the answer
    const auto tr = examples::RandomTridiagonal(8, 32, false, 3);
    v1::ProgressRequest req;
    auto* t = req.mutable_tridiagonal();
    t->set_dtype(v1::FLOAT64);
    SetArray(t->mutable_a(), tr.at("a"));
    SetArray(t->mutable_b(), tr.at("b"));
    SetArray(t->mutable_c(), tr.at("c"));
    SetArray(t->mutable_d(), tr.at("d"));
    grpc::ClientContext ctx;
    auto reader = stub->SolveWithProgress(&ctx, req);
    v1::ProgressResponse m;
    std::vector<v1::ProgressResponse> msgs;
    while (reader->Read(&m)) msgs.push_back(m);
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_GE(msgs.size(), 2u);
    ASSERT_TRUE(msgs.back().has_answer());
    EXPECT_EQ(msgs.back().answer().status_size(), 8);
    for (size_t i = 0; i + 1 < msgs.size(); ++i) {
      EXPECT_EQ(msgs[i].progress().iteration(), 0);
      EXPECT_EQ(msgs[i].progress().max_iterations(), 0);
    }
  }
  auto status_of = [&](const v1::ProgressRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub->SolveWithProgress(&ctx, req);
    v1::ProgressResponse m;
    int n = 0;
    while (reader->Read(&m)) ++n;
    EXPECT_EQ(n, 0) << "a refused request reports nothing";
    return reader->Finish();
  };
  v1::ProgressRequest empty;
  auto st = status_of(empty);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("request"), std::string::npos);
  v1::ProgressRequest fast;
  *fast.mutable_block_tridiagonal() = BlockRequest(examples::ThesisExperiment1(8, 8), "", 1e-8, 10);
  fast.set_interval_s(0.001);
  st = status_of(fast);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("interval_s"), std::string::npos);
  v1::ProgressRequest bad_tol;
  *bad_tol.mutable_block_tridiagonal() = BlockRequest(examples::ThesisExperiment1(8, 8), "", 2, 10);
  st = status_of(bad_tol);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("tol"), std::string::npos);
}

// A progress call the client cancels mid-solve stops and gives its slot (the only one) back:
// the next job runs at once.
TEST_F(Progress_, CancelledCallFreesItsSlot) {
  const auto ar = examples::ThesisExperiment1(256, 256);
  v1::ProgressRequest req;
  *req.mutable_block_tridiagonal() = BlockRequest(ar, "gauss-seidel", 1e-300, 100000000);
  req.set_interval_s(0.01);
  auto stub = Stub();
  grpc::ClientContext ctx;
  auto reader = stub->SolveWithProgress(&ctx, req);
  v1::ProgressResponse m;
  bool solving = false;
  while (!solving && reader->Read(&m))
    solving = m.has_progress() && m.progress().phase() == v1::Progress::SOLVING &&
              m.progress().iteration() > 0;
  ASSERT_TRUE(solving);
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  Client client = MakeClient();
  EXPECT_TRUE(WaitForServer(client, [](const ServerInfoSummary& s) {
    return s.jobs_in_flight == 0 && s.jobs_queued == 0;
  }));
  const auto small = examples::ThesisExperiment1(16, 16);
  Job job = MakeJob(Kind::kBlockTridiagonal, small);
  job.options.timeout_s = 20;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = client.Solve(job);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->summary.timings.queue_us, 1e6) << "waited for the cancelled job's slot";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST_F(Progress_, DeadlineEndsAProgressCall) {
  const auto ar = examples::ThesisExperiment1(256, 256);
  v1::ProgressRequest req;
  *req.mutable_block_tridiagonal() = BlockRequest(ar, "gauss-seidel", 1e-300, 100000000);
  auto stub = Stub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(700));
  auto reader = stub->SolveWithProgress(&ctx, req);
  v1::ProgressResponse m;
  bool answered = false;
  while (reader->Read(&m)) answered |= m.has_answer();
  EXPECT_FALSE(answered);
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  Client client = MakeClient();
  EXPECT_TRUE(WaitForServer(client, [](const ServerInfoSummary& s) {
    return s.jobs_in_flight == 0 && s.jobs_queued == 0;
  }));
}

// The CLI: a bar on stderr only where asked (or on a terminal); nothing extra otherwise; the
// history written as CSV.
TEST_F(Progress_, CliBarOnlyWhereAsked) {
  const std::string dir = "/tmp/trisolve_progress_cli_" + std::to_string(getpid());
  const std::string cli = ServerProcess::CliBin();
  ASSERT_EQ(std::system((cli + " make-example block-tridiagonal " + dir +
                         " --batch 64 --n 64 > /dev/null").c_str()),
            0);
  const std::string solve = cli + " --server " + server_->target() +
                            " solve block-tridiagonal aC=" + dir + "/aC.npy cC=" + dir +
                            "/cC.npy bC=" + dir + "/bC.npy cA=" + dir + "/cA.npy cB=" + dir +
                            "/cB.npy f=" + dir + "/f.npy --method red-black --tol 1e-10";
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_EQ(std::system((solve + " > " + dir + "/out1 2> " + dir + "/err1").c_str()), 0);
  EXPECT_EQ(read(dir + "/err1"), "") << "stderr is not a terminal: no bar";
  ASSERT_EQ(std::system((solve + " --progress on --history-output " + dir + "/h.csv > " + dir +
                         "/out2 2> " + dir + "/err2").c_str()),
            0);
  const std::string err = read(dir + "/err2");
  EXPECT_NE(err.find("received"), std::string::npos) << err;
  EXPECT_NE(err.find('\r'), std::string::npos) << "redrawn in place";
  EXPECT_NE(read(dir + "/out2").find("status: 1 ok"), std::string::npos);
  const std::string csv = read(dir + "/h.csv");
  EXPECT_EQ(csv.rfind("iteration,residual\n0,1\n", 0), 0u) << csv;
  EXPECT_EQ(std::system((solve + " --history-output x.csv --progress sometimes > /dev/null 2>&1")
                            .c_str()) >> 8,
            2);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trisolve
