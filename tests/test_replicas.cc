// Replicas behind the client's load balancing (issue 38 item 3): two and three real trisolved
// processes on loopback, one client over all of them (round_robin with grpc.health.v1 checks).
// Requests spread, a killed or draining replica's traffic moves to the others with no answer
// lost or wrong, handles route home, and a killed replica's handles are NOT_FOUND.
#include <signal.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "replicas.h"  // client/: the target's parsing, tested on its own
#include "server_process.h"
#include "trisolve/backend.h"
#include "trisolve/client.h"
#include "trisolve/reference/tridiagonal.h"

namespace trisolve {
namespace {

using testing::ServerProcess;
using testing::Shell;

NdArray Random(std::vector<int64_t> shape, uint64_t seed, double lo = -1, double hi = 1) {
  NdArray a = NdArray::Zeros(DType::kFloat64, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < a.elements(); ++i) a.as<double>()[i] = u(rng);
  return a;
}

// A batch of diagonally dominant, non-symmetric tridiagonal systems and its local solution.
struct Tri {
  static constexpr int64_t kBatch = 4, kN = 40;
  NdArray a, b, c, d;
  explicit Tri(uint64_t seed)
      : a(Random({kBatch, kN}, seed)),
        b(Random({kBatch, kN}, seed + 1, 3, 4)),
        c(Random({kBatch, kN}, seed + 2, -1.5, 0.5)),
        d(Random({kBatch, kN}, seed + 3)) {}
  Job AsJob(bool with_rhs = true) const {
    Job j{Kind::kTridiagonal};
    j.arrays = {{"a", a.view()}, {"b", b.view()}, {"c", c.view()}};
    if (with_rhs) j.arrays.emplace("d", d.view());
    return j;
  }
  std::vector<double> Local(const NdArray& diag, const NdArray& rhs) const {
    std::vector<double> x(static_cast<size_t>(kBatch * kN));
    std::vector<SystemStatus> st(static_cast<size_t>(kBatch));
    TridiagonalProblem<double> p{kBatch, kN, Layout::kFlat, a.as<double>(), diag.as<double>(),
                                 c.as<double>(), rhs.as<double>()};
    cpu::SolveTridiagonal(p, TridiagonalMethod::kThomas,
                          TridiagonalOutput<double>{x.data(), st.data()});
    return x;
  }
};

// Whether x is the local solution (to rounding); a wrong shape or type is wrong.
bool Right(const absl::StatusOr<Result>& r, const std::vector<double>& want) {
  if (!r.ok() || r->x.dtype != DType::kFloat64 || r->x.elements() != int64_t(want.size()))
    return false;
  double d = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::abs(r->x.as<double>()[i] - want[i]));
    m = std::max(m, std::abs(want[i]));
  }
  return d <= 1e-12 * m;
}

std::unique_ptr<ServerProcess> StartReplica() {
  auto s = std::make_unique<ServerProcess>(std::vector<std::string>{
      "--advertise-address", "127.0.0.1", "--cpu-threads", "1", "--grace", "20"});
  return s;
}

std::string ListTarget(const std::vector<std::unique_ptr<ServerProcess>>& replicas) {
  std::string t;
  for (const auto& r : replicas) t += (t.empty() ? "" : ",") + r->target();
  return t;
}

// Jobs the replica has solved, asked of it alone.
int64_t JobsDone(const ServerProcess& s) {
  Client direct({.target = s.target()});
  auto info = direct.Info();
  return info.ok() ? info->jobs_done : -1;
}

// Solves until every replica has answered one: round_robin reaches a replica once its
// connection is up, which on a loaded machine can take longer than a few calls. At most 20 s.
bool WarmUp(Client& client, const std::vector<std::unique_ptr<ServerProcess>>& replicas) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  const Tri t(99);
  while (std::chrono::steady_clock::now() < end) {
    if (!client.Solve(t.AsJob()).ok()) return false;
    bool all = true;
    for (const auto& r : replicas) all = all && JobsDone(*r) > 0;
    if (all) return true;
  }
  return false;
}

std::string ReplicaOf(const std::string& handle) {
  const size_t at = handle.find('@');
  return at == std::string::npos ? "" : handle.substr(at + 1);
}

class Replicas : public ::testing::Test {
 protected:
  void Start(int n) {
    for (int i = 0; i < n; ++i) {
      replicas_.push_back(StartReplica());
      ASSERT_GT(replicas_.back()->port(), 0) << replicas_.back()->Log();
    }
  }
  std::vector<std::unique_ptr<ServerProcess>> replicas_;
};

TEST_F(Replicas, RequestsSpreadOverTwo) {
  Start(2);
  Client client({.target = ListTarget(replicas_)});
  ASSERT_TRUE(WarmUp(client, replicas_));
  const int64_t before0 = JobsDone(*replicas_[0]), before1 = JobsDone(*replicas_[1]);
  constexpr int kCalls = 40;
  for (int i = 0; i < kCalls; ++i) {
    const Tri t(1000 + i);
    auto r = client.Solve(t.AsJob());
    ASSERT_TRUE(Right(r, t.Local(t.b, t.d))) << i << ": " << r.status();
  }
  const int64_t first = JobsDone(*replicas_[0]) - before0,
                second = JobsDone(*replicas_[1]) - before1;
  EXPECT_EQ(first + second, kCalls);
  // round_robin alternates over the replicas connected and serving: half each.
  EXPECT_GE(first, kCalls / 2 - 2) << "replica 0 served " << first << ", replica 1 " << second;
  EXPECT_GE(second, kCalls / 2 - 2) << "replica 0 served " << first << ", replica 1 " << second;

  // GetServerInfo through the balanced channel comes from one of them, which names itself.
  auto info = client.Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->replica == replicas_[0]->target() || info->replica == replicas_[1]->target())
      << info->replica;
}

// Four clients solve without pause; one replica is killed (SIGKILL), then another drained
// (SIGTERM: health NOT_SERVING, new calls UNAVAILABLE, running ones finish) until it exits.
// Every answer comes back, right; what began after the drained one exited went to the last.
TEST_F(Replicas, KilledAndDrainedReplicasLoseNoAnswer) {
  Start(3);
  Client client({.target = ListTarget(replicas_)});
  constexpr int kThreads = 4, kStep = 60;
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, failed = 0, wrong = 0;
  bool only_last = false, stop = false;  // guarded by mu
  int at_kill = -1, at_drain = -1;
  int begun_on_last = 0;                 // calls begun once only the last replica was left
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t i = 0;; ++i) {
        const Tri tri(uint64_t(t) * 1000003 + i * 7);
        bool on_last;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (stop) return;
          on_last = only_last;
        }
        auto r = client.Solve(tri.AsJob());
        const bool right = Right(r, tri.Local(tri.b, tri.d));
        std::lock_guard<std::mutex> lock(mu);
        if (!r.ok() && failed++ == 0)
          first_failure = absl::StrCat(r.status().ToString(), " (after ", done, " calls; kill at ",
                                       at_kill, ", drain at ", at_drain, ")");
        if (r.ok() && !right) ++wrong;
        begun_on_last += on_last;
        ++done;
        cv.notify_all();
      }
    });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done >= kStep; });
  replicas_[0]->Signal(SIGKILL);
  at_kill = done;
  cv.wait(lock, [&] { return done >= at_kill + kStep; });
  replicas_[1]->Signal(SIGTERM);
  at_drain = done;
  lock.unlock();
  const int drained_exit = replicas_[1]->Wait(30);
  lock.lock();
  only_last = true;
  const int at_exit = done;
  cv.wait(lock, [&] { return done >= at_exit + kStep; });
  stop = true;
  lock.unlock();
  for (auto& th : threads) th.join();

  EXPECT_EQ(failed, 0) << first_failure;
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(replicas_[0]->Wait(10), 128 + SIGKILL);
  EXPECT_EQ(drained_exit, 0) << replicas_[1]->Log();  // drained and exited cleanly
  EXPECT_NE(replicas_[1]->Log().find("all jobs finished"), std::string::npos);
  EXPECT_GT(at_drain, at_kill);
  // The last replica answered every call begun after the other two were gone, and not
  // everything before: the load had been spread.
  const int64_t last = JobsDone(*replicas_[2]);
  EXPECT_GE(begun_on_last, kStep - kThreads);
  EXPECT_GE(last, begun_on_last);
  EXPECT_LT(last, done) << "the last replica served everything: the calls did not spread";
}

TEST_F(Replicas, HandlesRouteHomeAndDieWithTheirReplica) {
  Start(3);
  const std::string target = ListTarget(replicas_);
  Client client({.target = target});
  ASSERT_TRUE(WarmUp(client, replicas_));
  constexpr int kSystems = 9;
  std::vector<std::unique_ptr<Tri>> tris;
  std::vector<std::string> handles;
  std::map<std::string, int> per_replica;
  for (int i = 0; i < kSystems; ++i) {
    tris.push_back(std::make_unique<Tri>(5000 + 10 * i));
    auto info = client.CreateSystem(tris.back()->AsJob(false), {.label = "home"});
    ASSERT_TRUE(info.ok()) << info.status();
    handles.push_back(info->handle);
    ++per_replica[ReplicaOf(info->handle)];
  }
  // Every handle names one of the three; they were spread, so routing is what keeps them right.
  std::set<std::string> targets;
  for (const auto& r : replicas_) targets.insert(r->target());
  for (const auto& [replica, n] : per_replica) EXPECT_EQ(targets.count(replica), 1u) << replica;
  EXPECT_EQ(per_replica.size(), 3u);  // round_robin over three connected replicas
  for (const auto& r : replicas_) {
    Client direct({.target = r->target()});
    auto info = direct.Info();
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->systems, per_replica[r->target()]) << r->target();
    EXPECT_EQ(info->replica, r->target());
  }

  // Solves, updates and streams by handle, from this client and from a new one (as another
  // process holding only the handle would).
  Client other({.target = target});
  std::vector<NdArray> diagonals;  // each system's b after its update
  for (int i = 0; i < kSystems; ++i) {
    const Tri& t = *tris[size_t(i)];
    for (int k = 0; k < 3; ++k) {
      const NdArray rhs = Random({Tri::kBatch, Tri::kN}, uint64_t(77 + k + 10 * i));
      auto r = (k % 2 ? other : client).SolveSystem(handles[size_t(i)], rhs.view());
      ASSERT_TRUE(Right(r, t.Local(t.b, rhs))) << handles[size_t(i)] << ": " << r.status();
    }
    const NdArray b2 = Random({Tri::kBatch, Tri::kN}, uint64_t(900 + i), 5, 6);
    ASSERT_TRUE(other.UpdateSystem(handles[size_t(i)], {{"b", b2.view()}}).ok());
    auto stream = client.OpenStepStream(handles[size_t(i)]);
    ASSERT_TRUE(stream.ok()) << stream.status();
    for (int k = 0; k < 3; ++k) ASSERT_TRUE((*stream)->Send(t.d.view()).ok());
    for (int k = 0; k < 3; ++k) {
      auto r = (*stream)->Receive();
      ASSERT_TRUE(Right(r, t.Local(b2, t.d))) << handles[size_t(i)] << ": " << r.status();
    }
    EXPECT_TRUE((*stream)->Finish().ok());
    diagonals.push_back(b2);
  }
  auto listed = client.ListSystems();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), size_t(kSystems));

  // The replica of the first handle goes away: its handles are NOT_FOUND, quickly, for every
  // call; the others' still solve right.
  const std::string gone = ReplicaOf(handles[0]);
  for (auto& r : replicas_)
    if (r->target() == gone) {
      r->Signal(SIGKILL);
      EXPECT_EQ(r->Wait(10), 128 + SIGKILL);
    }
  JobOptions bounded;
  bounded.timeout_s = 60;  // a hang shows as DEADLINE_EXCEEDED, not as a stuck test
  int lost = 0, kept = 0;
  for (int i = 0; i < kSystems; ++i) {
    const std::string& h = handles[size_t(i)];
    const Tri& t = *tris[size_t(i)];
    if (ReplicaOf(h) == gone) {
      const auto t0 = std::chrono::steady_clock::now();
      auto s = client.SolveSystem(h, t.d.view(), {}, bounded);
      EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
      EXPECT_EQ(other.SolveSystem(h, t.d.view(), {}, bounded).status().code(),
                absl::StatusCode::kNotFound);
      EXPECT_EQ(client.UpdateSystem(h, {{"b", t.b.view()}}, bounded).status().code(),
                absl::StatusCode::kNotFound);
      auto stream = client.OpenStepStream(h, bounded);
      ASSERT_TRUE(stream.ok());
      (void)(*stream)->Send(t.d.view());
      EXPECT_EQ((*stream)->Receive().status().code(), absl::StatusCode::kNotFound);
      EXPECT_EQ(client.ReleaseSystem(h, bounded).status().code(), absl::StatusCode::kNotFound);
      ++lost;
    } else {
      auto r = client.SolveSystem(h, t.d.view(), {}, bounded);
      EXPECT_TRUE(Right(r, t.Local(diagonals[size_t(i)], t.d))) << h << ": " << r.status();
      ++kept;
    }
  }
  EXPECT_EQ(lost, per_replica[gone]);
  listed = client.ListSystems();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(int(listed->size()), kept);
  for (const auto& s : *listed) EXPECT_NE(ReplicaOf(s.handle), gone);
  // Unary solves carry on over the two left.
  const Tri t(42);
  EXPECT_TRUE(Right(client.Solve(t.AsJob()), t.Local(t.b, t.d)));
  for (const auto& h : handles) {
    if (ReplicaOf(h) != gone) {
      EXPECT_TRUE(client.ReleaseSystem(h).ok()) << h;
    }
  }
}

// A handle is sent only to a replica of the client's target: a forged or foreign handle is
// NOT_FOUND without a connection (the client's token never goes where a handle alone says).
TEST_F(Replicas, HandleNamingAnotherAddressIsNotFound) {
  Start(2);
  Client client({.target = ListTarget(replicas_), .token = "secret"});
  const Tri t(7);
  auto r = client.SolveSystem("sys-00000000000000000000000000000000@127.0.0.1:1", t.d.view());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_NE(r.status().message().find("is not one of"), std::string::npos) << r.status();
  // One of the target's replicas, a handle it never issued: the server's own NOT_FOUND.
  r = client.SolveSystem("sys-00000000000000000000000000000000@" + replicas_[1]->target(),
                         t.d.view());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_NE(r.status().message().find("no such system"), std::string::npos) << r.status();
}

// dns:///NAME:PORT: every address of the name, re-resolved; handles checked against it.
TEST_F(Replicas, DnsTargetBalancesAndRoutesHandles) {
  Start(1);
  Client client({.target = "dns:///localhost:" + std::to_string(replicas_[0]->port())});
  const Tri t(3);
  EXPECT_TRUE(Right(client.Solve(t.AsJob()), t.Local(t.b, t.d)));
  auto sys = client.CreateSystem(t.AsJob(false));
  ASSERT_TRUE(sys.ok()) << sys.status();
  EXPECT_EQ(ReplicaOf(sys->handle), replicas_[0]->target());
  EXPECT_TRUE(Right(client.SolveSystem(sys->handle, t.d.view()), t.Local(t.b, t.d)));
  EXPECT_TRUE(client.ReleaseSystem(sys->handle).ok());
  auto bad = Client::Create({.target = "dns:///localhost"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST_F(Replicas, CliOverSeveralTargets) {
  Start(2);
  const std::string cli = ServerProcess::CliBin() + " --server " + ListTarget(replicas_);
  const std::string dir = "/tmp/trisolve_replicas_cli_" + std::to_string(getpid());
  auto [rc, out] = Shell(ServerProcess::CliBin() + " make-example tridiagonal " + dir);
  ASSERT_EQ(rc, 0) << out;
  const std::string coeffs = " a=" + dir + "/a.npy b=" + dir + "/b.npy c=" + dir + "/c.npy";
  for (int i = 0; i < 4; ++i) {
    std::tie(rc, out) = Shell(cli + " solve tridiagonal" + coeffs + " d=" + dir + "/d.npy -o " +
                              dir + "/x.npy");
    ASSERT_EQ(rc, 0) << out;
  }
  EXPECT_EQ(JobsDone(*replicas_[0]) + JobsDone(*replicas_[1]), 4);
  std::tie(rc, out) = Shell(cli + " info");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("replica:   127.0.0.1:"), std::string::npos) << out;

  std::tie(rc, out) = Shell(cli + " system create tridiagonal" + coeffs);
  ASSERT_EQ(rc, 0) << out;
  const std::string handle = out.substr(0, out.find(' '));
  const std::string home = ReplicaOf(handle);
  ASSERT_FALSE(home.empty()) << out;
  // Another CLI process, holding only the handle, reaches the system, as many times as asked.
  for (int i = 0; i < 3; ++i) {
    std::tie(rc, out) = Shell(cli + " system solve " + handle + " rhs=" + dir + "/d.npy -o " +
                              dir + "/xh.npy");
    ASSERT_EQ(rc, 0) << out;
  }
  std::tie(rc, out) = Shell(cli + " system list");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(handle), std::string::npos) << out;
  for (auto& r : replicas_)
    if (r->target() == home) {
      r->Signal(SIGKILL);
      EXPECT_EQ(r->Wait(10), 128 + SIGKILL);
    }
  std::tie(rc, out) = Shell(cli + " --timeout 30 system solve " + handle + " rhs=" + dir + "/d.npy");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  // Solves go on, on the replica left.
  std::tie(rc, out) = Shell(cli + " solve tridiagonal" + coeffs + " d=" + dir + "/d.npy");
  EXPECT_EQ(rc, 0) << out;
  std::filesystem::remove_all(dir);
}

// A replica that stops answering without closing its connections (SIGSTOP: as a deleted pod
// whose address vanished): keepalive finds it, its handles are NOT_FOUND and the solves that
// were sent to it are answered by the other, in seconds, not when TCP gives up.
TEST_F(Replicas, SilentReplicaIsFoundByKeepalive) {
  Start(2);
  Client::Options o{.target = ListTarget(replicas_)};
  o.keepalive_s = 1;
  o.keepalive_timeout_s = 1;
  Client client(o);
  ASSERT_TRUE(WarmUp(client, replicas_));
  // One handle on each replica: round_robin alternates once both are connected.
  std::map<std::string, std::string> by_replica;
  const Tri t(21);
  for (int i = 0; i < 8 && by_replica.size() < 2; ++i) {
    auto sys = client.CreateSystem(t.AsJob(false));
    ASSERT_TRUE(sys.ok()) << sys.status();
    by_replica.emplace(ReplicaOf(sys->handle), sys->handle);
  }
  ASSERT_EQ(by_replica.size(), 2u);
  const std::vector<std::string> handles = {by_replica.begin()->second,
                                            std::next(by_replica.begin())->second};
  for (const auto& h : handles)
    ASSERT_TRUE(Right(client.SolveSystem(h, t.d.view()), t.Local(t.b, t.d)));
  ServerProcess& silent = ReplicaOf(handles[0]) == replicas_[0]->target() ? *replicas_[0]
                                                                            : *replicas_[1];
  silent.Signal(SIGSTOP);
  // kill() returns before the process is stopped: wait until /proc says it is ('T').
  bool stopped = false;
  for (int i = 0; i < 1000 && !stopped; ++i) {
    std::ifstream stat("/proc/" + std::to_string(silent.pid()) + "/stat");
    std::string pid_field, comm, state;
    stat >> pid_field >> comm >> state;
    stopped = state == "T";
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(stopped);
  JobOptions bounded;
  bounded.timeout_s = 60;
  const auto t0 = std::chrono::steady_clock::now();
  auto lost = client.SolveSystem(handles[0], t.d.view(), {}, bounded);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kNotFound) << lost.status();
  EXPECT_LT(waited, 15) << "keepalive 1 s + 1 s should have found the silent replica";
  // Unary solves: those round_robin sends to the silent replica before keepalive drops it
  // are retried on the other; none fails.
  for (int i = 0; i < 6; ++i) {
    const Tri u(uint64_t(60 + i));
    auto r = client.Solve(u.AsJob());
    EXPECT_TRUE(Right(r, u.Local(u.b, u.d))) << r.status();
  }
  EXPECT_TRUE(Right(client.SolveSystem(handles[1], t.d.view(), {}, bounded), t.Local(t.b, t.d)));
  silent.Signal(SIGKILL);  // stopped processes take SIGKILL
  EXPECT_EQ(silent.Wait(10), 128 + SIGKILL);
}

// --max-connection-age closes connections (GOAWAY) so that clients resolve again; calls go on
// over a new connection and a time-step stream on the old one runs to its end.
TEST_F(Replicas, ConnectionAgeEndsNoCall) {
  replicas_.push_back(std::make_unique<ServerProcess>(std::vector<std::string>{
      "--advertise-address", "127.0.0.1", "--max-connection-age", "0.3"}));
  ASSERT_GT(replicas_[0]->port(), 0) << replicas_[0]->Log();
  Client client({.target = replicas_[0]->target() + "," + replicas_[0]->target()});
  const Tri t(11);
  auto sys = client.CreateSystem(t.AsJob(false));
  ASSERT_TRUE(sys.ok()) << sys.status();
  auto stream = client.OpenStepStream(sys->handle);
  ASSERT_TRUE(stream.ok());
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  int steps = 0;
  while (std::chrono::steady_clock::now() < end) {  // five connection ages of traffic
    ASSERT_TRUE((*stream)->Send(t.d.view()).ok());
    auto step = (*stream)->Receive();
    ASSERT_TRUE(Right(step, t.Local(t.b, t.d))) << steps << ": " << step.status();
    const Tri u(uint64_t(2000 + steps));
    auto r = client.Solve(u.AsJob());
    ASSERT_TRUE(Right(r, u.Local(u.b, u.d))) << steps << ": " << r.status();
    ++steps;
  }
  EXPECT_TRUE((*stream)->Finish().ok());
  EXPECT_GT(steps, 10);
}

// TLS and tokens over replicas: the certificates name only DNS:localhost, so every channel that
// dials an address (the balanced one and each handle's replica's) must check the certificate
// against the target's host name.
TEST_F(Replicas, TlsAndTokensOverReplicas) {
  const std::string d = "/tmp/trisolve_replicas_tls_" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  auto [rc, out] = Shell("cd " + d + R"( && set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=replicas-ca -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj /CN=server -keyout server.key -out server.csr
printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem
echo replica-token > tokens)");
  ASSERT_EQ(rc, 0) << out;
  for (int i = 0; i < 2; ++i) {
    replicas_.push_back(std::make_unique<ServerProcess>(std::vector<std::string>{
        "--advertise-address", "127.0.0.1", "--tls-cert", d + "/server.pem", "--tls-key",
        d + "/server.key", "--token-file", d + "/tokens"}));
    ASSERT_GT(replicas_.back()->port(), 0) << replicas_.back()->Log();
  }
  const std::string target = "localhost:" + std::to_string(replicas_[0]->port()) +
                             ",localhost:" + std::to_string(replicas_[1]->port());
  Client::Options o{.target = target, .tls_ca_file = d + "/ca.pem", .token = "replica-token"};
  Client client(o);
  for (int i = 0; i < 6; ++i) {
    const Tri t(700 + i);
    ASSERT_TRUE(Right(client.Solve(t.AsJob()), t.Local(t.b, t.d)));
  }
  // Creates alone in a row (round_robin alternates calls: interleaved with solves, every
  // create would land on the same replica).
  // (until both replicas hold one: the second's TLS connection may come up late; 20 s at most)
  std::set<std::string> homes;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; homes.size() < 2 && std::chrono::steady_clock::now() < end; ++i) {
    const Tri t(uint64_t(800 + i));
    auto sys = client.CreateSystem(t.AsJob(false));
    ASSERT_TRUE(sys.ok()) << sys.status();
    homes.insert(ReplicaOf(sys->handle));
    auto r = client.SolveSystem(sys->handle, t.d.view());
    ASSERT_TRUE(Right(r, t.Local(t.b, t.d))) << r.status();
    ASSERT_TRUE(client.ReleaseSystem(sys->handle).ok());
  }
  EXPECT_EQ(homes.size(), 2u);
  EXPECT_EQ(JobsDone(*replicas_[0]), -1);  // a plaintext client gets nothing from a TLS server
  // Without the token: UNAUTHENTICATED, from whichever replica, not retried into success.
  o.token.clear();
  const Tri t(9);
  EXPECT_EQ(Client(o).Solve(t.AsJob()).status().code(), absl::StatusCode::kUnauthenticated);
  std::filesystem::remove_all(d);
}

// The target's forms, without servers.
TEST(ReplicaTargets, ParseEveryForm) {
  auto one = internal::ParseTarget("localhost:50051");
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->balanced);
  EXPECT_EQ(one->dial, "localhost:50051");  // one server: as gRPC dials it, unchanged

  auto list = internal::ParseTarget("127.0.0.1:1, 127.0.0.2:2,127.0.0.1:1");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->balanced);
  EXPECT_EQ(list->dial, "ipv4:127.0.0.1:1,127.0.0.2:2");  // duplicates once
  EXPECT_EQ(list->tls_name, "127.0.0.1");

  auto mixed = internal::ParseTarget("[::1]:5,127.0.0.1:6");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->dial, "ipv6:[::1]:5,[::ffff:127.0.0.1]:6");
  EXPECT_EQ(mixed->addresses, (std::vector<std::string>{"[::1]:5", "127.0.0.1:6"}));

  auto dns = internal::ParseTarget("dns:///trisolved.ns.svc:50051");
  ASSERT_TRUE(dns.ok()) << dns.status();
  EXPECT_TRUE(dns->balanced);
  EXPECT_EQ(dns->dial, "dns:///trisolved.ns.svc:50051");
  EXPECT_EQ(dns->dns_host, "trisolved.ns.svc");
  EXPECT_EQ(dns->dns_port, "50051");
  auto authority = internal::ParseTarget("dns://10.0.0.10/trisolved:7");
  ASSERT_TRUE(authority.ok()) << authority.status();
  EXPECT_EQ(authority->dns_host, "trisolved");

  for (const char* bad : {"dns:///trisolved", "dns://nohost", "127.0.0.1:1,127.0.0.2",
                          "::1:5,127.0.0.1:6", "127.0.0.1:1,:7", "127.0.0.1:1,127.0.0.2:x"}) {
    auto r = internal::ParseTarget(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << r.status();
  }
  EXPECT_EQ(internal::ReplicaOf("sys-0123@[::1]:5"), "[::1]:5");
  EXPECT_EQ(internal::ReplicaOf("sys-0123"), "");
}

// --advertise-address HOST:PORT as given (what the handles and GetServerInfo say), IPv6 in
// brackets; a malformed one stops the server.
TEST(ReplicaTargets, AdvertisedAddressForms) {
  for (const auto& [flag, want] : std::vector<std::pair<std::string, std::string>>{
           {"10.1.2.3:7000", "10.1.2.3:7000"}, {"[fd00::5]:7001", "[fd00::5]:7001"}}) {
    ServerProcess s({"--advertise-address", flag});
    ASSERT_GT(s.port(), 0) << s.Log();
    Client direct({.target = s.target()});
    auto info = direct.Info();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->replica, want);
    const Tri t(1);
    auto sys = direct.CreateSystem(t.AsJob(false));
    ASSERT_TRUE(sys.ok()) << sys.status();
    EXPECT_EQ(ReplicaOf(sys->handle), want);
    // One server named directly: the handle's calls go to it whatever the handle names.
    EXPECT_TRUE(Right(direct.SolveSystem(sys->handle, t.d.view()), t.Local(t.b, t.d)));
  }
  ServerProcess bare({"--advertise-address", "fd00::7"});
  ASSERT_GT(bare.port(), 0) << bare.Log();
  auto info = Client({.target = bare.target()}).Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->replica, "[fd00::7]:" + std::to_string(bare.port()));
  ServerProcess bad({"--advertise-address", "a@b:1"});
  EXPECT_EQ(bad.port(), 0);
  EXPECT_EQ(bad.Wait(10), 1) << bad.Log();
}

// A list that mixes IPv6 and IPv4, one of them dead: the live replica answers everything.
TEST_F(Replicas, MixedFamiliesOneDead) {
  Start(1);
  Client client({.target = "[::1]:1," + replicas_[0]->target()});
  for (int i = 0; i < 5; ++i) {
    const Tri t(300 + i);
    auto r = client.Solve(t.AsJob());
    EXPECT_TRUE(Right(r, t.Local(t.b, t.d))) << r.status();
  }
}

}  // namespace
}  // namespace trisolve
