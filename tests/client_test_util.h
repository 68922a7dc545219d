// Helpers of the end-to-end suites that drive a real trisolved through the C++ client.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/swc.h"

namespace trisolve::testing {

// A client of `server` over `transport`, on a connection of its own (as each process of a user
// has), with `token` where the server asks for one.
inline Client::Options ClientOptions(const ServerProcess& server, Transport transport,
                                     const std::string& token = "") {
  Client::Options o;
  o.target = server.target();
  o.transport = transport;
  o.token = token;
  o.own_connection = true;
  return o;
}

// `st` has `code` and its message says `words`.
inline void Expect(const absl::Status& st, absl::StatusCode code, const std::string& words) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_NE(st.message().find(words), std::string::npos)
      << "'" << st.message() << "' does not say '" << words << "'";
}

// Polls the server's info (every 10 ms, up to 20 s) until `want` holds.
inline bool WaitForServer(Client& c, const std::function<bool(const ServerInfoSummary&)>& want) {
  for (int i = 0; i < 2000; ++i) {
    auto info = c.Info();
    if (info.ok() && want(*info)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A job of kind `k` over the arrays make-example wrote (views: the arrays must outlive it).
inline Job MakeJob(Kind k, const examples::Arrays& arrays) {
  Job job;
  job.kind = k;
  for (const auto& [name, a] : arrays) job.arrays[name] = a.view();
  return job;
}

// A branched cell of `nodes` compartments: every fifth one's parent a third of the way back.
inline Morphology Branchy(int nodes) {
  Morphology m;
  for (int i = 0; i < nodes; ++i) {
    m.parent.push_back(i == 0 ? -1 : (i % 5 == 0 ? i / 3 : i - 1));
    m.type.push_back(i == 0 ? 1 : 3);
    m.x.push_back(i * 1.5);
    m.y.push_back(i % 7);
    m.z.push_back(0);
    m.radius.push_back(i == 0 ? 4 : 0.4 + 0.02 * (i % 13));
  }
  return m;
}

// One job of each family (and the interleaved tridiagonal layout), small enough for any path.
struct Family {
  Kind kind;
  examples::Arrays arrays;
  bool interleaved = false;
  Job AsJob() const {
    Job job = MakeJob(kind, arrays);
    job.options.interleaved = interleaved;
    return job;
  }
};

inline std::vector<Family> EveryFamily() {
  std::vector<Family> f;
  f.push_back({Kind::kTridiagonal, examples::RandomTridiagonal(64, 300, false, 11)});
  f.push_back({Kind::kTridiagonal, examples::RandomTridiagonal(48, 200, true, 12), true});
  Morphology m;
  for (int i = 0; i < 200; ++i) {
    m.parent.push_back(i == 0 ? -1 : (i % 7 == 0 ? i / 2 : i - 1));
    m.type.push_back(i == 0 ? 1 : 3);
    m.x.push_back(i * 2.0);
    m.y.push_back(i % 5);
    m.z.push_back(0);
    m.radius.push_back(i == 0 ? 5 : 0.5 + 0.01 * (i % 11));
  }
  f.push_back({Kind::kTree, examples::CableTree(m, 16, 13)});
  f.push_back({Kind::kBlockTridiagonal, examples::ThesisExperiment1(24, 20)});
  f.push_back({Kind::kDense, examples::RandomDense(8, 40, false, 14)});
  return f;
}

// A suite whose tests share one trisolved (started once, large jobs allowed) and make gRPC
// clients of it; `stream_threshold` >= 0 sets the client's stream_threshold_bytes.
class SharedServerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--max-job-unknowns", "20000000"});
    ASSERT_GT(server_->port(), 0) << server_->Log();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static Client MakeClient(int64_t stream_threshold = -1) {
    Client::Options o;
    o.target = server_->target();
    o.transport = Transport::kGrpc;
    if (stream_threshold >= 0) o.stream_threshold_bytes = stream_threshold;
    return Client(o);
  }
  inline static ServerProcess* server_ = nullptr;
};

}  // namespace trisolve::testing
