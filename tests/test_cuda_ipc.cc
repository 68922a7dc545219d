// CUDA memory regions (RegisterCudaMemory) against the real trisolved --backend cuda: this
// process cudaMallocs the arrays, fills them on the device, hands the server the IPC handle
// (the server is another process: CUDA opens no handle in the process that made it), and the
// answers written into its device memory are checked against the same jobs sent over the
// socket and against their residuals. Skips, saying so, without a device.
#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server_process.h"
#include "trisolve/backend.h"
#include "trisolve/client.h"
#include "trisolve/cuda_ipc.h"
#include "trisolve/examples.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using testing::ServerProcess;

#define REQUIRE_DEVICE()                                                             \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped"

template <typename T>
constexpr DType DTypeOf() {
  return sizeof(T) == 8 ? DType::kFloat64 : DType::kFloat32;
}

// One cudaMalloc allocation, carved into arrays, freed at the end.
class DeviceArena {
 public:
  explicit DeviceArena(int64_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&base_, size_t(bytes)) != cudaSuccess) base_ = nullptr;
  }
  ~DeviceArena() {
    if (base_ != nullptr) cudaFree(base_);
  }
  std::byte* base() const { return static_cast<std::byte*>(base_); }
  int64_t bytes() const { return bytes_; }
  template <typename T>
  T* Take(int64_t values) {
    used_ = (used_ + 255) / 256 * 256;
    T* p = reinterpret_cast<T*>(base() + used_);
    used_ += values * int64_t(sizeof(T));
    EXPECT_LE(used_, bytes_);
    return p;
  }
  template <typename T>
  T* Put(const std::vector<T>& v) {
    T* p = Take<T>(int64_t(v.size()));
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  }
  template <typename T>
  static std::vector<T> Get(const T* p, int64_t values) {
    std::vector<T> v(static_cast<size_t>(values));
    EXPECT_EQ(cudaMemcpy(v.data(), p, size_t(values) * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return v;
  }
  int64_t offset_of(const void* p) const { return static_cast<const std::byte*>(p) - base(); }

 private:
  void* base_ = nullptr;
  int64_t bytes_;
  int64_t used_ = 0;
};

// A diagonally dominant batch, flat [batch, n] or interleaved [n, batch].
template <typename T>
struct Tri {
  int64_t batch, n;
  bool interleaved;
  std::vector<T> a, b, c, d;
  Tri(int64_t batch_, int64_t n_, bool inter, unsigned seed)
      : batch(batch_), n(n_), interleaved(inter) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    const size_t e = size_t(batch * n);
    a.resize(e), b.resize(e), c.resize(e), d.resize(e);
    for (size_t i = 0; i < e; ++i) {
      a[i] = T(u(g));
      c[i] = T(u(g));
      b[i] = T(3 + u(g));
      d[i] = T(u(g) * 10);
    }
  }
  std::vector<int64_t> shape() const {
    return interleaved ? std::vector<int64_t>{n, batch} : std::vector<int64_t>{batch, n};
  }
  int64_t at(int64_t s, int64_t k) const { return interleaved ? k * batch + s : s * n + k; }
  // The largest |A x - d| / (|A| |x| + |d|) over rows, from the original arrays.
  double BackwardError(const std::vector<T>& x) const {
    double worst = 0;
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = at(s, k);
        double r = double(b[i]) * x[i] - d[i], scale = std::abs(double(b[i]) * x[i]) + std::abs(double(d[i]));
        if (k > 0) {
          r += double(a[i]) * x[at(s, k - 1)];
          scale += std::abs(double(a[i]) * x[at(s, k - 1)]);
        }
        if (k + 1 < n) {
          r += double(c[i]) * x[at(s, k + 1)];
          scale += std::abs(double(c[i]) * x[at(s, k + 1)]);
        }
        const double e = std::abs(r) / (scale > 0 ? scale : 1);
        worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
      }
    return worst;
  }
};

template <typename T>
Job HostJob(const Tri<T>& t) {
  Job job{Kind::kTridiagonal};
  job.arrays["a"] = {DTypeOf<T>(), t.shape(), t.a.data()};
  job.arrays["b"] = {DTypeOf<T>(), t.shape(), t.b.data()};
  job.arrays["c"] = {DTypeOf<T>(), t.shape(), t.c.data()};
  job.arrays["d"] = {DTypeOf<T>(), t.shape(), t.d.data()};
  job.options.interleaved = t.interleaved;
  return job;
}

Client::Options Opts(const ServerProcess& s, const std::string& token = "") {
  Client::Options o;
  o.target = s.target();
  o.transport = Transport::kGrpc;  // nothing staged: only the CUDA region travels by reference
  o.own_connection = true;
  o.token = token;
  return o;
}

void Expect(const absl::Status& st, absl::StatusCode code, const std::string& words) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_NE(st.message().find(words), std::string::npos)
      << "'" << st.message() << "' does not say '" << words << "'";
}
void Expect(const grpc::Status& st, grpc::StatusCode code, const std::string& words) {
  EXPECT_EQ(st.error_code(), code) << st.error_message();
  EXPECT_NE(st.error_message().find(words), std::string::npos)
      << "'" << st.error_message() << "' does not say '" << words << "'";
}

template <typename T>
double MaxRelDiff(const std::vector<T>& x, const T* y) {
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(double(x[i]) - double(y[i])) /
                                std::max(1.0, std::abs(double(y[i]))));
  return worst;
}

// One job with every array and x in the device region, against the same job over the socket.
template <typename T>
void SolveInDeviceMemory(Client& client, DeviceArena& arena, const Tri<T>& t,
                         const std::string& method = "") {
  SCOPED_TRACE(::testing::Message() << "batch " << t.batch << " n " << t.n
                                  << (t.interleaved ? " interleaved" : " flat") << " "
                                  << (sizeof(T) == 8 ? "float64" : "float32") << " method '"
                                  << method << "'");
  Job host = HostJob(t);
  host.options.method = method;
  auto want = client.Solve(host);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->summary.ok, t.batch);

  Job dev{Kind::kTridiagonal};
  dev.options.interleaved = t.interleaved;
  dev.options.method = method;
  dev.arrays["a"] = {DTypeOf<T>(), t.shape(), arena.Put(t.a)};
  dev.arrays["b"] = {DTypeOf<T>(), t.shape(), arena.Put(t.b)};
  dev.arrays["c"] = {DTypeOf<T>(), t.shape(), arena.Put(t.c)};
  dev.arrays["d"] = {DTypeOf<T>(), t.shape(), arena.Put(t.d)};
  T* x = arena.Take<T>(t.batch * t.n);
  dev.options.x_out = x;
  auto got = client.Solve(dev);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.transport, "shared-memory");
  EXPECT_EQ(got->summary.ok, t.batch);
  EXPECT_TRUE(got->x.data.empty());  // written into the device region
  EXPECT_TRUE(std::isnan(got->summary.residual)) << "no host residual of device arrays";
  const std::vector<T> xs = DeviceArena::Get(x, t.batch * t.n);
  EXPECT_LE(MaxRelDiff(xs, want->x.template as<T>()), sizeof(T) == 8 ? 1e-12 : 1e-5)
      << got->summary.method << " against " << want->summary.method;
  EXPECT_LE(t.BackwardError(xs), sizeof(T) == 8 ? 1e-12 : 1e-5);
  // Where the time went, both ways (information for the log, no target: benchmarks hold those).
  for (const auto* r : {&*want, &*got})
    std::printf("[ timing   ] %lld x %lld %s %s, %s %s: client %.3f ms, server %.3f ms (receive "
                "%.3f, h2d %.3f, compute %.3f, d2h %.3f)\n",
                (long long)t.batch, (long long)t.n, t.interleaved ? "interleaved" : "flat",
                sizeof(T) == 8 ? "float64" : "float32",
                r == &*want ? "socket" : "device region", r->summary.method.c_str(),
                r->summary.timings.client_total_us / 1e3, r->summary.timings.server_total_us / 1e3,
                r->summary.timings.receive_us / 1e3, r->summary.timings.h2d_us / 1e3,
                r->summary.timings.compute_us / 1e3, r->summary.timings.d2h_us / 1e3);
}

// Any family: `host` by name (float64 but int32 index arrays), those named in `on_device` put
// in the device region, x there too; against the same job over the socket.
struct Named {
  std::vector<int64_t> shape;
  std::vector<double> f64;
  std::vector<int32_t> i32;
};
void BothWays(Client& client, DeviceArena& arena, Kind kind, const std::map<std::string, Named>& host,
              const std::set<std::string>& on_device, const std::string& x_like) {
  Job job{kind};
  for (const auto& [name, a] : host)
    job.arrays[name] = a.i32.empty() ? ArrayView{DType::kFloat64, a.shape, a.f64.data()}
                                     : ArrayView{DType::kInt32, a.shape, a.i32.data()};
  auto want = client.Solve(job);
  ASSERT_TRUE(want.ok()) << want.status();
  for (const auto& name : on_device) {
    const Named& a = host.at(name);
    job.arrays[name].data = a.i32.empty() ? static_cast<const void*>(arena.Put(a.f64))
                                          : static_cast<const void*>(arena.Put(a.i32));
  }
  const int64_t xn = int64_t(host.at(x_like).f64.size());
  double* x = arena.Take<double>(xn);
  job.options.x_out = x;
  auto got = client.Solve(job);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->summary.ok, want->summary.ok);
  EXPECT_EQ(got->summary.ok, got->summary.systems);
  EXPECT_LE(MaxRelDiff(DeviceArena::Get(x, xn), want->x.as<double>()), 1e-12)
      << got->summary.method << " against " << want->summary.method;
}

std::vector<double> Uniform(size_t count, double lo, double hi, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(count);
  for (double& e : v) e = u(g);
  return v;
}

TEST(CudaMemory, EveryOtherFamilyAndFormSolvesFromAndIntoTheClientsDeviceMemory) {
  REQUIRE_DEVICE();
  ServerProcess server({}, "cuda");
  ASSERT_GT(server.port(), 0) << server.Log();
  Client client(Opts(server));
  DeviceArena arena(int64_t{64} << 20);
  auto mem = DescribeCudaMemory(arena.base(), arena.bytes());
  ASSERT_TRUE(mem.ok()) << mem.status();
  ASSERT_TRUE(client.RegisterCudaMemory(*mem, "dev").ok());
  // Tree: 256 cells of one random 300-node tree (parent in host memory, the server reads it;
  // or in device memory, copied across for it), and auto's smallest through host copies.
  for (const auto& [batch, parent_on_device] : {std::pair{int64_t{256}, false}, {int64_t{256}, true},
                                                {int64_t{2}, false}}) {
    SCOPED_TRACE(::testing::Message() << "tree batch " << batch
                                      << (parent_on_device ? ", parent on the device" : ""));
    const int64_t n = 300, e = batch * n;
    std::map<std::string, Named> t;
    t["parent"].shape = {n};
    std::mt19937 g(5);
    for (int64_t i = 0; i < n; ++i)
      t["parent"].i32.push_back(i == 0 ? -1 : int32_t(std::max<int64_t>(0, i - 1 - int64_t(g() % 4))));
    for (const char* name : {"lower", "upper", "diag", "rhs"}) t[name].shape = {batch, n};
    t["lower"].f64 = Uniform(size_t(e), -1, 1, 6);
    t["upper"].f64 = Uniform(size_t(e), -1, 1, 7);
    t["diag"].f64 = Uniform(size_t(e), 8, 10, 8);
    t["rhs"].f64 = Uniform(size_t(e), -5, 5, 9);
    std::set<std::string> dev = {"lower", "upper", "diag", "rhs"};
    if (parent_on_device) dev.insert("parent");
    BothWays(client, arena, Kind::kTree, t, dev, "rhs");
  }
  // Dense: 64 systems of order 48, every array on the device.
  {
    const int64_t batch = 64, n = 48;
    std::map<std::string, Named> d;
    d["a"].shape = {batch, n, n};
    d["a"].f64 = Uniform(size_t(batch * n * n), -1, 1, 10);
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t i = 0; i < n; ++i) d["a"].f64[size_t((s * n + i) * n + i)] += 2 * double(n);
    d["b"].shape = {batch, n};
    d["b"].f64 = Uniform(size_t(batch * n), -1, 1, 11);
    BothWays(client, arena, Kind::kDense, d, {"a", "b"}, "b");
  }
  // Through host copies, correct all the same: the block-tridiagonal family, and a
  // variable-size tridiagonal batch (its lengths read on the host).
  {
    std::map<std::string, Named> b;
    std::set<std::string> dev;
    for (const auto& [name, a] : examples::ThesisExperiment1(48, 40)) {
      b[name].shape = a.shape;
      b[name].f64.assign(a.as<double>(), a.as<double>() + a.elements());
      dev.insert(name);
    }
    BothWays(client, arena, Kind::kBlockTridiagonal, b, dev, "f");
  }
  {
    std::map<std::string, Named> v;
    std::mt19937 g(12);
    int64_t total = 0;
    for (int s = 0; s < 100; ++s) {
      v["lengths"].i32.push_back(int32_t(50 + g() % 100));
      total += v["lengths"].i32.back();
    }
    v["lengths"].shape = {100};
    unsigned seed = 13;
    for (const char* name : {"a", "b", "c", "d"}) {
      v[name].shape = {total};
      v[name].f64 = Uniform(size_t(total), -1, 1, seed++);
    }
    for (double& e : v["b"].f64) e += 3;
    BothWays(client, arena, Kind::kTridiagonal, v, {"a", "b", "c", "d", "lengths"}, "d");
  }
  EXPECT_TRUE(client.UnregisterCudaMemory(*mem).ok());
}

std::string TokenFile() {
  const std::string path = "/tmp/trisolve_ipc_tokens_" + std::to_string(getpid());
  std::ofstream(path) << "alice-token\nbob-token\n";
  return path;
}

TEST(CudaMemory, TridiagonalSolvesReadAndWriteTheClientsDeviceMemory) {
  REQUIRE_DEVICE();
  ServerProcess server({}, "cuda");
  ASSERT_GT(server.port(), 0) << server.Log();
  Client client(Opts(server));
  DeviceArena arena(int64_t{256} << 20);
  ASSERT_NE(arena.base(), nullptr);
  auto mem = DescribeCudaMemory(arena.base(), arena.bytes());
  ASSERT_TRUE(mem.ok()) << mem.status();
  ASSERT_TRUE(client.RegisterCudaMemory(*mem, "dev").ok());

  // On the device throughout (in place, x copied on the device), large enough for the
  // pipelined and thomas-window paths; float64 and float32, flat and interleaved.
  SolveInDeviceMemory(client, arena, Tri<double>(1024, 512, false, 1));
  SolveInDeviceMemory(client, arena, Tri<float>(1024, 512, false, 2));
  SolveInDeviceMemory(client, arena, Tri<double>(256, 1000, true, 3));
  SolveInDeviceMemory(client, arena, Tri<double>(64, 4096, false, 4), "pcr");
  // Paths that solve on the host get host copies: auto's smallest, few systems.
  SolveInDeviceMemory(client, arena, Tri<double>(4, 64, false, 5));
  SolveInDeviceMemory(client, arena, Tri<float>(8, 5000, false, 6));
  SolveInDeviceMemory(client, arena, Tri<double>(8, 5000, false, 7), "pivoting");

  // A singular system in a device batch: flagged, its x zero on the device, the others solved.
  {
    Tri<double> t(512, 256, false, 8);
    for (int64_t k = 0; k < t.n; ++k) t.a[size_t(3 * t.n + k)] = t.b[size_t(3 * t.n + k)] =
        t.c[size_t(3 * t.n + k)] = 0;
    Job dev{Kind::kTridiagonal};
    dev.options.method = "thomas";
    for (auto [name, v] : {std::pair{"a", &t.a}, {"b", &t.b}, {"c", &t.c}, {"d", &t.d}})
      dev.arrays[name] = {DType::kFloat64, t.shape(), arena.Put(*v)};
    // x first filled with garbage: the singular system's part must come back zero.
    double* x = arena.Put(std::vector<double>(size_t(t.batch * t.n), 7.0));
    dev.options.x_out = x;
    auto got = client.Solve(dev);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->summary.singular, 1);
    EXPECT_EQ(got->status[3], SolveStatus::kSingular);
    const auto xs = DeviceArena::Get(x, t.batch * t.n);
    for (int64_t k = 0; k < t.n; ++k) ASSERT_EQ(xs[size_t(3 * t.n + k)], 0.0);
    EXPECT_NE(xs[size_t(4 * t.n)], 7.0);
  }

  // An array of another type than the job's in device memory: the client would have to convert
  // it on the host, which it cannot: refused, named, before anything is sent.
  {
    Tri<double> t(64, 100, false, 9);
    Job mixed = HostJob(t);
    std::vector<float> d32(t.d.begin(), t.d.end());
    mixed.arrays["d"] = {DType::kFloat32, t.shape(), arena.Put(d32)};
    Expect(client.Solve(mixed).status(), absl::StatusCode::kInvalidArgument,
           "d: is float32 in CUDA memory");
  }

  auto info = client.Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->backend, "cuda");
  EXPECT_TRUE(client.UnregisterCudaMemory(*mem).ok());
}

TEST(CudaMemory, ByHandleAndThroughTheStepStreamTheRightHandSideAndXStayOnTheDevice) {
  REQUIRE_DEVICE();
  ServerProcess server({}, "cuda");
  ASSERT_GT(server.port(), 0) << server.Log();
  Client client(Opts(server));
  DeviceArena arena(int64_t{128} << 20);
  auto mem = DescribeCudaMemory(arena.base(), arena.bytes());
  ASSERT_TRUE(mem.ok()) << mem.status();
  ASSERT_TRUE(client.RegisterCudaMemory(*mem, "dev").ok());
  for (const bool single : {false, true}) {
    SCOPED_TRACE(single ? "one system, k right-hand sides" : "a batch of systems");
    Tri<double> t(single ? 1 : 512, single ? 20000 : 300, false, 21);
    Job sys = HostJob(t);
    sys.arrays.erase("d");
    auto created = client.CreateSystem(sys);
    ASSERT_TRUE(created.ok()) << created.status();
    for (const int64_t k : {int64_t{1}, int64_t{3}}) {
      Tri<double> many(k * t.batch, t.n, false, unsigned(30 + k));  // k right-hand sides
      std::vector<int64_t> shape = t.shape();
      if (k > 1) shape.insert(shape.begin(), k);
      const ArrayView host_rhs{DType::kFloat64, shape, many.d.data()};
      auto want = client.SolveSystem(created->handle, host_rhs);
      ASSERT_TRUE(want.ok()) << want.status();
      const ArrayView dev_rhs{DType::kFloat64, shape, arena.Put(many.d)};
      double* x = arena.Take<double>(k * t.batch * t.n);
      JobOptions o;
      o.x_out = x;
      auto got = client.SolveSystem(created->handle, dev_rhs, {}, o);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->summary.ok, k * t.batch);
      EXPECT_EQ(got->summary.right_hand_sides, k);
      const auto xs = DeviceArena::Get(x, k * t.batch * t.n);
      EXPECT_LE(MaxRelDiff(xs, want->x.as<double>()), 1e-12) << got->summary.method;
    }
    // The time-step stream: a new right-hand side a step, x into the device region.
    auto stream = client.OpenStepStream(created->handle);
    ASSERT_TRUE(stream.ok()) << stream.status();
    for (int step = 0; step < 3; ++step) {
      Tri<double> s(t.batch, t.n, false, unsigned(40 + step));
      auto want = client.SolveSystem(created->handle, {DType::kFloat64, t.shape(), s.d.data()});
      ASSERT_TRUE(want.ok());
      double* x = arena.Take<double>(t.batch * t.n);
      ASSERT_TRUE((*stream)->Send({DType::kFloat64, t.shape(), arena.Put(s.d)}, {}, x).ok());
      auto got = (*stream)->Receive();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_LE(MaxRelDiff(DeviceArena::Get(x, t.batch * t.n), want->x.as<double>()), 1e-12);
    }
    EXPECT_TRUE((*stream)->Finish().ok());
  }
}

// Raw requests, to send references the client library would not make.
class Raw {
 public:
  Raw(const ServerProcess& s, std::string token)
      : stub_(v1::Solver::NewStub(grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials()))),
        token_(std::move(token)) {}
  template <typename Call>
  grpc::Status Do(Call call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ctx.AddMetadata("authorization", "Bearer " + token_);
    return call(*stub_, &ctx);
  }
  grpc::Status Register(const CudaMemory& m, const std::string& name, int device, int64_t offset,
                        int64_t bytes, v1::MemoryRegion* out = nullptr) {
    v1::RegisterCudaMemoryRequest req;
    req.set_name(name);
    req.set_handle(m.handle);
    req.set_device(device);
    req.set_offset(offset);
    req.set_bytes(bytes);
    v1::MemoryRegion resp;
    return Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.RegisterCudaMemory(c, req, out != nullptr ? out : &resp);
    });
  }
  grpc::Status Solve(const v1::TridiagonalRequest& req) {
    v1::SolveResponse resp;
    return Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
      return s.SolveTridiagonal(c, req, &resp);
    });
  }

 private:
  std::unique_ptr<v1::Solver::Stub> stub_;
  std::string token_;
};

// batch x n float64 arrays a, b, c, d one after the other from `offset` of `region`, x after.
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
  r.mutable_x_region()->set_region(region);
  r.mutable_x_region()->set_offset(offset + 4 * batch * n * 8);
  return r;
}

TEST(CudaMemory, BadHandlesNonFiniteValuesOtherIdentitiesAndUnregisteredRegionsAreRefused) {
  REQUIRE_DEVICE();
  ServerProcess server({"--token-file", TokenFile()}, "cuda");
  ASSERT_GT(server.port(), 0) << server.Log();
  Raw alice(server, "alice-token"), bob(server, "bob-token");
  DeviceArena arena(int64_t{64} << 20);
  auto mem = DescribeCudaMemory(arena.base(), arena.bytes());
  ASSERT_TRUE(mem.ok()) << mem.status();

  // Registration.
  CudaMemory garbage = *mem;
  for (char& ch : garbage.handle) ch = char(0x5a);
  Expect(alice.Register(garbage, "g", 0, 0, 4096), grpc::StatusCode::INVALID_ARGUMENT, "handle");
  CudaMemory shortened = *mem;
  shortened.handle.resize(10);
  Expect(alice.Register(shortened, "s", 0, 0, 4096), grpc::StatusCode::INVALID_ARGUMENT,
         "handle: 10 bytes");
  Expect(alice.Register(*mem, "d", 7, 0, 4096), grpc::StatusCode::INVALID_ARGUMENT, "device");
  Expect(alice.Register(*mem, "big", 0, 0, arena.bytes() + (int64_t{1} << 30)),
         grpc::StatusCode::INVALID_ARGUMENT, "outside the allocation");
  Expect(alice.Register(*mem, "bad name!", 0, 0, 4096), grpc::StatusCode::INVALID_ARGUMENT,
         "name");
  v1::MemoryRegion listed;
  ASSERT_TRUE(alice.Register(*mem, "r", 0, 0, arena.bytes(), &listed).ok());
  EXPECT_TRUE(listed.cuda());
  EXPECT_EQ(listed.device(), 0);
  // The same handle again, under another name: the one mapping shared.
  ASSERT_TRUE(alice.Register(*mem, "r2", 0, 4096, 4096).ok());

  // Valid data: a = c = 1, b = 4, d = 1, batch 64 x 1000.
  const int64_t batch = 64, n = 1000, e = batch * n;
  std::vector<double> v(size_t(4 * e), 1.0);
  for (int64_t i = 0; i < e; ++i) v[size_t(e + i)] = 4;
  ASSERT_EQ(cudaMemcpy(arena.base(), v.data(), v.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_TRUE(alice.Solve(InRegion("r", 0, batch, n)).ok());
  // Another identity: NOT_FOUND, as for a name never registered.
  Expect(bob.Solve(InRegion("r", 0, batch, n)), grpc::StatusCode::NOT_FOUND, "no region named");
  // Bounds and alignment, as for host regions.
  Expect(alice.Solve(InRegion("r", 4, batch, n)), grpc::StatusCode::INVALID_ARGUMENT,
         "not a multiple of 8");
  Expect(alice.Solve(InRegion("r", arena.bytes() - 1024, batch, n)),
         grpc::StatusCode::INVALID_ARGUMENT, "lies outside region");
  // The server reads and writes no device memory on the host: ReadMemory refuses it.
  {
    v1::ReadMemoryRequest req;
    req.set_region("r");
    req.set_bytes(64);
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer alice-token");
    v1::MemoryChunk c;
    auto stub = v1::Solver::NewStub(grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
    auto reader = stub->ReadMemory(&ctx, req);
    while (reader->Read(&c)) {
    }
    Expect(reader->Finish(), grpc::StatusCode::FAILED_PRECONDITION, "CUDA memory");
  }

  // A NaN in a device array, found on the device and named by position (the server copies the
  // array back to say where): a large job, and a small one solved through host copies.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ASSERT_EQ(cudaMemcpy(arena.base() + (3 * e + 5 * n + 7) * 8, &nan, 8, cudaMemcpyHostToDevice),
            cudaSuccess);
  Expect(alice.Solve(InRegion("r", 0, batch, n)), grpc::StatusCode::INVALID_ARGUMENT,
         "d[5][7] is NaN");
  {
    std::vector<double> small(4 * 2 * 8, 1.0);
    for (int i = 16; i < 32; ++i) small[size_t(i)] = 4;
    small[size_t(16 + 9)] = std::numeric_limits<double>::infinity();  // b[1][1]
    const int64_t off = int64_t{32} << 20;
    ASSERT_EQ(cudaMemcpy(arena.base() + off, small.data(), small.size() * 8, cudaMemcpyHostToDevice),
              cudaSuccess);
    Expect(alice.Solve(InRegion("r", off, 2, 8)), grpc::StatusCode::INVALID_ARGUMENT,
           "b[1][1] is Inf");
  }
  const double one = 1;
  ASSERT_EQ(cudaMemcpy(arena.base() + (3 * e + 5 * n + 7) * 8, &one, 8, cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_TRUE(alice.Solve(InRegion("r", 0, batch, n)).ok());

  // Unregistered: later references are NOT_FOUND; the other name of the handle still works.
  ASSERT_TRUE(alice.Do([&](v1::Solver::Stub& s, grpc::ClientContext* c) {
    v1::UnregisterMemoryRequest req;
    req.set_name("r");
    v1::MemoryRegion resp;
    return s.UnregisterMemory(c, req, &resp);
  }).ok());
  Expect(alice.Solve(InRegion("r", 0, batch, n)), grpc::StatusCode::NOT_FOUND, "no region named");
  ASSERT_TRUE(alice.Register(*mem, "r3", 0, 0, arena.bytes()).ok());
  EXPECT_TRUE(alice.Solve(InRegion("r3", 0, batch, n)).ok());
}

TEST(CudaMemory, TheClientLibraryRefusesWhereTheServerHasNoDevice) {
  REQUIRE_DEVICE();
  ServerProcess server({}, "cpu");
  ASSERT_GT(server.port(), 0) << server.Log();
  Client client(Opts(server));
  DeviceArena arena(1 << 20);
  auto mem = DescribeCudaMemory(arena.base(), arena.bytes());
  ASSERT_TRUE(mem.ok()) << mem.status();
  Expect(client.RegisterCudaMemory(*mem, "dev"), absl::StatusCode::kFailedPrecondition,
         "--backend cuda");
}

}  // namespace
}  // namespace trisolve
