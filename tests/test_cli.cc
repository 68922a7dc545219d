// The CLI as a user runs it: the real `trisolve` binary against the real `trisolved` on
// loopback. Input handling (issue 33 item 5) and the README's statements about exit codes,
// what x holds, and how trees are numbered (item 6).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server_process.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/ndarray.h"

namespace trisolve {
namespace {

using testing::ServerProcess;
using testing::Shell;

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({});
    ASSERT_GT(server_->port(), 0) << server_->Log();
    dir_ = new std::string("/tmp/trisolve_cli_" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete server_;
  }
  // `trisolve --server ... ARGS`: exit status and everything it printed.
  static std::pair<int, std::string> Run(const std::string& args) {
    return Shell(ServerProcess::CliBin() + " --server " + server_->target() + " " + args);
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
  static std::string Save(const std::string& name, const NdArray& a) {
    EXPECT_TRUE(WriteNpy(Path(name), a.view()).ok());
    return Path(name);
  }
  // A tridiagonal system of 2 x 4 (flat) whose answer is known: x = 1 everywhere.
  static std::string TridiagonalArgs() {
    Save("a.npy", NdArray::From<double>({2, 4}, {0, 1, 1, 1, 0, 2, 2, 2}));
    Save("b.npy", NdArray::From<double>({2, 4}, {4, 4, 4, 4, 5, 5, 5, 5}));
    Save("c.npy", NdArray::From<double>({2, 4}, {1, 1, 1, 0, 2, 2, 2, 0}));
    Save("d.npy", NdArray::From<double>({2, 4}, {5, 6, 6, 5, 7, 9, 9, 7}));
    return " a=" + Path("a.npy") + " b=" + Path("b.npy") + " c=" + Path("c.npy") +
           " d=" + Path("d.npy");
  }
  static ServerProcess* server_;
  static std::string* dir_;
};
ServerProcess* Cli::server_ = nullptr;
std::string* Cli::dir_ = nullptr;

bool Has(const std::string& out, const std::string& what) {
  return out.find(what) != std::string::npos;
}

std::vector<double> Values(const NdArray& a) {
  std::vector<double> v(a.elements());
  for (int64_t i = 0; i < a.elements(); ++i)
    v[i] = a.dtype == DType::kFloat64 ? a.as<double>()[i] : a.as<float>()[i];
  return v;
}

// A Fortran-order .npy of `c` (given in C order), as np.save(f, np.asfortranarray(c)) writes.
void WriteFortranNpy(const std::string& path, const std::vector<int64_t>& shape,
                     const std::vector<double>& c) {
  const int64_t rows = shape[0], cols = shape[1];
  std::vector<double> f(c.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) f[j * rows + i] = c[i * cols + j];
  std::string h = "{'descr': '<f8', 'fortran_order': True, 'shape': (" + std::to_string(rows) +
                  ", " + std::to_string(cols) + "), }";
  h.append(64 - (10 + h.size() + 1) % 64, ' ');
  h.push_back('\n');
  std::ofstream o(path, std::ios::binary);
  o.write("\x93NUMPY\x01\x00", 8);
  const char l[2] = {char(h.size() & 0xff), char(h.size() >> 8)};
  o.write(l, 2);
  o << h;
  o.write(reinterpret_cast<const char*>(f.data()), std::streamsize(f.size() * sizeof(double)));
}

// ---- item 5: input handling -----------------------------------------------------------------

TEST_F(Cli, FortranOrderFilesAreReadAsTheArrayNumPyMeant) {
  const std::string args = TridiagonalArgs();
  // The same b, saved column-major: the answer must not change (a reinterpretation would
  // scramble b and give another x).
  WriteFortranNpy(Path("bf.npy"), {2, 4}, {4, 4, 4, 4, 5, 5, 5, 5});
  const std::string fargs = " a=" + Path("a.npy") + " b=" + Path("bf.npy") + " c=" +
                            Path("c.npy") + " d=" + Path("d.npy");
  auto [rc, out] = Run("solve tridiagonal" + fargs + " -o " + Path("xf.npy"));
  ASSERT_EQ(rc, 0) << out;
  auto x = ReadNpy(Path("xf.npy"));
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->shape, (std::vector<int64_t>{2, 4}));
  for (double v : Values(*x)) EXPECT_NEAR(v, 1.0, 1e-14);
}

TEST_F(Cli, IntegerArraysAreConvertedToFloat64AndSaySo) {
  TridiagonalArgs();
  Save("bi.npy", NdArray::From<int64_t>({2, 4}, {4, 4, 4, 4, 5, 5, 5, 5}));
  Save("di.npy", NdArray::From<int32_t>({2, 4}, {5, 6, 6, 5, 7, 9, 9, 7}));
  auto [rc, out] = Run("solve tridiagonal a=" + Path("a.npy") + " b=" + Path("bi.npy") + " c=" +
                       Path("c.npy") + " d=" + Path("di.npy") + " -o " + Path("xi.npy") +
                       " --json");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "float64 (converted: b int64, d int32)")) << out;
  const std::string trimmed = out.substr(0, out.find_last_not_of('\n') + 1);
  auto j = nlohmann::json::parse(trimmed.substr(trimmed.rfind('\n') + 1));  // the last line
  EXPECT_EQ(j["dtype"], "float64");
  EXPECT_EQ(j["converted"]["b"], "int64");
  auto x = ReadNpy(Path("xi.npy"));
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->dtype, DType::kFloat64);
  for (double v : Values(*x)) EXPECT_NEAR(v, 1.0, 1e-14);
  // A value float64 cannot hold exactly is refused, naming the array.
  Save("big.npy", NdArray::From<int64_t>({2, 4}, {4, 4, 4, (int64_t{1} << 60) + 1, 5, 5, 5, 5}));
  auto [rc2, out2] = Run("solve tridiagonal a=" + Path("a.npy") + " b=" + Path("big.npy") +
                         " c=" + Path("c.npy") + " d=" + Path("d.npy"));
  EXPECT_EQ(rc2, 1) << out2;
  EXPECT_TRUE(Has(out2, "INVALID_ARGUMENT: b (")) << out2;
  EXPECT_TRUE(Has(out2, "no exact float64")) << out2;
  // parent holds node indices: a floating-point parent is refused, naming it.
  Save("pf.npy", NdArray::From<double>({3}, {-1, 0, 1}));
  Save("t.npy", NdArray::From<double>({3}, {1, 1, 1}));
  auto [rc3, out3] = Run("solve tree parent=" + Path("pf.npy") + " lower=" + Path("t.npy") +
                         " upper=" + Path("t.npy") + " diag=" + Path("t.npy") + " rhs=" +
                         Path("t.npy"));
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_TRUE(Has(out3, "parent (")) << out3;
  EXPECT_TRUE(Has(out3, "integer array")) << out3;
}

TEST_F(Cli, TheTypeUsedIsPrintedAndNeverNarrowed) {
  const std::string args = TridiagonalArgs();
  Save("d32.npy", NdArray::From<float>({2, 4}, {5, 6, 6, 5, 7, 9, 9, 7}));
  auto [rc, out] = Run("solve tridiagonal a=" + Path("a.npy") + " b=" + Path("b.npy") + " c=" +
                       Path("c.npy") + " d=" + Path("d32.npy") + " -o " + Path("x64.npy"));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "float64 (converted: d float32)")) << out;
  EXPECT_EQ(ReadNpy(Path("x64.npy"))->dtype, DType::kFloat64);
  // Every array float32: the job runs in float32 and says so, with nothing converted.
  std::string args32;
  for (const char* name : {"a", "b", "c", "d"}) {
    auto a = ReadNpy(Path(std::string(name) + ".npy"))->ConvertTo(DType::kFloat32);
    args32 += std::string(" ") + name + "=" + Save(std::string(name) + "32.npy", *a);
  }
  auto [rc2, out2] = Run("solve tridiagonal" + args32 + " -o " + Path("x32.npy"));
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_TRUE(Has(out2, "2 systems, float32, x [2, 4]")) << out2;
  EXPECT_EQ(ReadNpy(Path("x32.npy"))->dtype, DType::kFloat32);
}

TEST_F(Cli, DenseColumnRightHandSideIsUnderstoodAndOthersBlameB) {
  // [[2,1,0],[1,3,1],[0,1,4]] x = [3,5,5]: x = 1.
  Save("A.npy", NdArray::From<double>({3, 3}, {2, 1, 0, 1, 3, 1, 0, 1, 4}));
  Save("bcol.npy", NdArray::From<double>({3, 1}, {3, 5, 5}));
  auto [rc, out] = Run("solve dense A=" + Path("A.npy") + " b=" + Path("bcol.npy") + " -o " +
                       Path("xcol.npy"));
  ASSERT_EQ(rc, 0) << out;
  auto x = ReadNpy(Path("xcol.npy"));
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->shape, (std::vector<int64_t>{3, 1}));  // in b's shape, as numpy.linalg.solve
  for (double v : Values(*x)) EXPECT_NEAR(v, 1.0, 1e-14);
  // A batch of two matrices with b [2, 3, 1].
  Save("A2.npy", NdArray::From<double>({2, 3, 3}, {2, 1, 0, 1, 3, 1, 0, 1, 4,  //
                                                   4, 0, 0, 0, 4, 0, 0, 0, 4}));
  Save("b2col.npy", NdArray::From<double>({2, 3, 1}, {3, 5, 5, 8, 8, 8}));
  auto [rc2, out2] = Run("solve dense A=" + Path("A2.npy") + " b=" + Path("b2col.npy") + " -o " +
                         Path("x2col.npy"));
  ASSERT_EQ(rc2, 0) << out2;
  auto x2 = ReadNpy(Path("x2col.npy"));
  EXPECT_EQ(x2->shape, (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(Values(*x2), (std::vector<double>{1, 1, 1, 2, 2, 2}));
  // b [3, 2] (NumPy's two columns) beside A [3, 3]: refused, and the message is about b.
  Save("b32.npy", NdArray::From<double>({3, 2}, {3, 3, 5, 5, 5, 5}));
  auto [rc3, out3] = Run("solve dense A=" + Path("A.npy") + " b=" + Path("b32.npy"));
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_TRUE(Has(out3, "INVALID_ARGUMENT: b has shape [3, 2] beside A [3, 3]")) << out3;
  EXPECT_TRUE(Has(out3, "b.T")) << out3;
  // Rows, as documented: b [2, 3] is two right-hand sides of the one matrix.
  Save("brows.npy", NdArray::From<double>({2, 3}, {3, 5, 5, 6, 10, 10}));
  auto [rc4, out4] = Run("solve dense A=" + Path("A.npy") + " b=" + Path("brows.npy") + " -o " +
                         Path("xrows.npy"));
  ASSERT_EQ(rc4, 0) << out4;
  EXPECT_EQ(Values(*ReadNpy(Path("xrows.npy"))), (std::vector<double>{1, 1, 1, 2, 2, 2}));
}

TEST_F(Cli, OptionsAFamilyIgnoresAreUsageErrors) {
  const std::string tri = "solve tridiagonal" + TridiagonalArgs();
  Save("A.npy", NdArray::From<double>({2, 2}, {2, 1, 1, 2}));
  Save("bd.npy", NdArray::From<double>({2}, {3, 3}));
  const std::string dense = "solve dense A=" + Path("A.npy") + " b=" + Path("bd.npy");
  auto ex = examples::ThesisExperiment1(8, 8);
  std::string block = "solve block-tridiagonal";
  for (const auto& [name, a] : ex) block += " " + name + "=" + Save("blk_" + name + ".npy", a);
  for (const auto& [cmd, why] : std::vector<std::pair<std::string, std::string>>{
           {tri + " --tol 1e-3", "--tol applies to block-tridiagonal only"},
           {tri + " --iterations 5", "--iterations applies to block-tridiagonal only"},
           {tri + " --scale-rows", "--scale-rows applies to block-tridiagonal only"},
           {dense + " --tol 1e-3", "--tol applies to block-tridiagonal only"},
           {dense + " --layout interleaved", "--layout applies to tridiagonal and tree only"},
           {block + " --layout flat", "--layout applies to tridiagonal and tree only"},
           {block + " --skip-residual", "--skip-residual does not apply to block-tridiagonal"},
           {"system create tridiagonal a=" + Path("a.npy") + " b=" + Path("b.npy") + " c=" +
                Path("c.npy") + " --iterations 3",
            "--iterations applies to block-tridiagonal only"},
       }) {
    auto [rc, out] = Run(cmd);
    EXPECT_EQ(rc, 2) << cmd << "\n" << out;
    EXPECT_TRUE(Has(out, why)) << cmd << "\n" << out;
  }
  // The same options where they apply are taken.
  auto [rc, out] = Run(block + " --iterations 400 --tol 1e-8 --scale-rows");
  EXPECT_EQ(rc, 0) << out;
}

// A job of 32 MiB over the streams transport, its bytes spread over 3 connections (4 wanted):
// the answer as over the socket.
TEST_F(Cli, ParallelStreamsCarryALargeJob) {
  const int64_t n = int64_t{1} << 20;
  std::vector<double> off(n, 1.0), diag(n, 4.0), rhs(n, 6.0);
  off[0] = 0;
  rhs[0] = rhs[n - 1] = 5.0;  // x = 1: 1 + 4 + 1 = 6 inside, 4 + 1 = 5 at the ends
  std::vector<double> c(off.rbegin(), off.rend());
  const std::string args = " a=" + Save("pa.npy", NdArray::From<double>({n}, off)) +
                           " b=" + Save("pb.npy", NdArray::From<double>({n}, diag)) +
                           " c=" + Save("pc.npy", NdArray::From<double>({n}, c)) +
                           " d=" + Save("pd.npy", NdArray::From<double>({n}, rhs));
  auto [rc, out] = Run("--transport streams --parallel-streams 3 solve tridiagonal" + args +
                       " -o " + Path("px.npy"));
  ASSERT_EQ(rc, 0) << out;
  auto x = ReadNpy(Path("px.npy"));
  ASSERT_TRUE(x.ok()) << x.status();
  double worst = 0;
  for (double v : Values(*x)) worst = std::max(worst, std::abs(v - 1.0));
  EXPECT_LE(worst, 1e-14);
}

// A connection attempt that libgrpc 1.51 fails by chance, to a server that listens (it reads
// connect's errno after other calls overwrote it: connect_errno_fault.cc), costs a first call
// nothing: the call waits for gRPC's next attempt (Client::Options::connect_timeout_s). Over
// the one connection of `info`, and over the streams transport's lanes (the main connection
// first, then 4 lanes up for 32 MiB, each lane's first attempt failed). Where every attempt
// fails, the call still fails UNAVAILABLE with gRPC's reason, once the wait is over.
TEST_F(Cli, AConnectionAttemptThatFailsByChanceIsTriedAgain) {
  const auto faulted = [](const std::string& which, const std::string& args) {
    return Shell("LD_PRELOAD=" CONNECT_ERRNO_FAULT_LIB " TRISOLVE_TEST_CONNECT_ERRNO=" + which +
                 " " + ServerProcess::CliBin() + " --server " + server_->target() + " " + args);
  };
  const auto faults = [](const std::string& out) {
    const std::string said = "connect_errno_fault: errno ENOENT";
    int n = 0;
    for (size_t at = out.find(said); at != std::string::npos; at = out.find(said, at + 1)) ++n;
    return n;
  };
  {
    auto [rc, out] = faulted("1", "--timeout 20 info");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(faults(out), 1) << out;
    EXPECT_NE(out.find("version:"), std::string::npos) << out;
  }
  {
    auto [rc, out] = faulted("1:4", "bench --transport streams --batch 1024 --n 1024 --requests 1");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(faults(out), 4) << out;
    EXPECT_NE(out.find("answers: 1 ok, 0 wrong"), std::string::npos) << out;
  }
  {
    const auto t0 = std::chrono::steady_clock::now();
    auto [rc, out] = faulted("1000", "--timeout 60 info");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("UNAVAILABLE"), std::string::npos) << out;
    EXPECT_NE(out.find("No such file or directory"), std::string::npos) << out;
    EXPECT_GT(faults(out), 1) << out;  // tried again before it failed
    // 2 s of waiting (connect_timeout_s), not half the deadline's 60: room for a loaded machine.
    EXPECT_LT(s, 20) << "the wait for a connection is bounded by connect_timeout_s";
  }
}

TEST_F(Cli, OutOfRangeValuesAreRefusedNotDefaulted) {
  auto ex = examples::ThesisExperiment1(8, 8);
  std::string block = "solve block-tridiagonal";
  for (const auto& [name, a] : ex) block += " " + name + "=" + Save("blk_" + name + ".npy", a);
  for (const auto& [cmd, why] : std::vector<std::pair<std::string, std::string>>{
           {block + " --tol -1", "--tol is -1"},
           {block + " --tol 1", "--tol is 1"},
           {block + " --tol nan", "--tol is nan"},
           {block + " --iterations 0", "--iterations is 0"},
           {block + " --iterations -5", "--iterations is -5"},
           {"--timeout -1 health", "--timeout is -1"},
           {"system create tridiagonal a=x.npy b=x.npy c=x.npy --ttl -1", "--ttl is -1"},
           {"make-example dense " + Path("ex") + " --batch 0", "--batch is 0"},
           {"make-example tree " + Path("ex") + " --n 5 --swc x.swc", "--n does not apply"},
           {"bench --clients 0", "--clients"},
           {"--parallel-streams 0 health", "--parallel-streams"},
           {"--parallel-streams 65 health", "--parallel-streams"},
       }) {
    auto [rc, out] = Run(cmd);
    EXPECT_EQ(rc, 2) << cmd << "\n" << out;
    EXPECT_TRUE(Has(out, why)) << cmd << "\n" << out;
  }
  // Above the server's bound the server refuses it, naming the field.
  auto [rc, out] = Run(block + " --iterations 1000000000");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(Has(out, "max_iterations")) << out;
}

TEST_F(Cli, ArrayNamesAreCheckedBeforeAnythingIsSent) {
  const std::string args = TridiagonalArgs();
  Save("A.npy", NdArray::From<double>({2, 2}, {2, 1, 1, 2}));
  Save("bd.npy", NdArray::From<double>({2}, {3, 3}));
  for (const auto& [cmd, why] : std::vector<std::pair<std::string, std::string>>{
           {"solve tridiagonal" + args + " a=" + Path("b.npy"), "array 'a' is given twice"},
           {"solve dense A=" + Path("A.npy") + " a=" + Path("A.npy") + " b=" + Path("bd.npy"),
            "array 'A' is given twice (A=... and a=...)"},
           {"solve block-tridiagonal aC=x.npy a_c=x.npy", "array 'aC' is given twice"},
           {"solve tridiagonal" + args + " e=" + Path("b.npy"), "'e' is not an array of a tridiagonal job"},
           {"solve tridiagonal a=" + Path("a.npy") + " d=" + Path("d.npy"), "needs b=FILE c=FILE"},
           {"solve tridiagonal" + args + " " + Path("b.npy"), "expected NAME=FILE"},
           {"system create dense b=" + Path("bd.npy"), "a dense system needs A=FILE"},
           {"system solve sys-0 b=" + Path("b.npy"), "system solve needs rhs=FILE.npy"},
           {"system solve sys-0 rhs=" + Path("d.npy") + " rhs=" + Path("d.npy"), "array 'rhs' is given twice"},
       }) {
    auto [rc, out] = Run(cmd);
    EXPECT_EQ(rc, 2) << cmd << "\n" << out;
    EXPECT_TRUE(Has(out, why)) << cmd << "\n" << out;
  }
  // The block family's proto spelling is the thesis' name.
  auto ex = examples::ThesisExperiment1(8, 8);
  std::string block = "solve block-tridiagonal";
  for (const auto& [name, a] : ex) {
    const std::string proto = name == "aC" ? "a_c" : name == "cB" ? "c_b" : name;
    block += " " + proto + "=" + Save("blk_" + name + ".npy", a);
  }
  auto [rc, out] = Run(block);
  EXPECT_EQ(rc, 0) << out;
}

TEST_F(Cli, UsageErrorsExitTwoAsTheReadmeStates) {
  for (const std::string& cmd : std::vector<std::string>{"", "bogus", "solve", "solve tridiagonal", "solve foo a=x.npy",
                                "solve tridiagonal a=x.npy --nope", "system", "info extra",
                                "make-example quadratic " + Path("ex")}) {
    auto [rc, out] = Run(cmd);
    EXPECT_EQ(rc, 2) << "'" << cmd << "'\n" << out;
  }
  auto [rc, out] = Run("--help");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "solve")) << out;
  // An error that is not usage: 1 with the server's status.
  auto [rc2, out2] = Run("solve tridiagonal" + TridiagonalArgs() + " --method qr");
  EXPECT_EQ(rc2, 1) << out2;
  EXPECT_TRUE(Has(out2, "error: INVALID_ARGUMENT")) << out2;
  // A file that cannot be read is an error too, naming it.
  auto [rc3, out3] = Run("solve dense A=" + Path("nope.npy") + " b=" + Path("nope.npy"));
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_TRUE(Has(out3, "nope.npy: cannot open")) << out3;
}

// The client library refuses the same options rather than drop them (SetOptions sends tol and
// max_iterations for block jobs only, the layout for tridiagonal and tree only).
TEST_F(Cli, TheLibraryRefusesOptionsAFamilyIgnores) {
  Client::Options co;
  co.target = server_->target();
  Client client(co);
  auto tri = examples::RandomTridiagonal(3, 5, false, 1);
  auto dense = examples::RandomDense(2, 4, false, 1);
  auto block = examples::ThesisExperiment1(8, 8);
  auto job_of = [](Kind k, const examples::Arrays& arrays) {
    Job job{k};
    for (const auto& [name, a] : arrays) job.arrays[name] = a.view();
    return job;
  };
  struct Case {
    Job job;
    const char* field;
  };
  std::vector<Case> cases;
  cases.push_back({job_of(Kind::kTridiagonal, tri), "tol"});
  cases.back().job.options.tol = 1e-3;
  cases.push_back({job_of(Kind::kDense, dense), "max_iterations"});
  cases.back().job.options.max_iterations = 5;
  cases.push_back({job_of(Kind::kTridiagonal, tri), "scale_rows"});
  cases.back().job.options.scale_rows = true;
  cases.push_back({job_of(Kind::kDense, dense), "interleaved"});
  cases.back().job.options.interleaved = true;
  cases.push_back({job_of(Kind::kBlockTridiagonal, block), "interleaved"});
  cases.back().job.options.interleaved = true;
  cases.push_back({job_of(Kind::kBlockTridiagonal, block), "skip_residual"});
  cases.back().job.options.skip_residual = true;
  for (const Case& c : cases) {
    auto r = client.Solve(c.job);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_TRUE(absl::StartsWith(r.status().message(), c.field)) << r.status();
    auto made = client.CreateSystem(c.job);
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
  }
  // Where they apply, they are taken.
  Job ok = job_of(Kind::kBlockTridiagonal, block);
  ok.options.tol = 1e-8;
  ok.options.max_iterations = 400;
  auto r = client.Solve(ok);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->summary.ok, 1);
}

// ---- item 6: what the README says -----------------------------------------------------------

// README: exit 3 when some system is not ok; SINGULAR and DIVERGED systems come back as zeros,
// a NOT_CONVERGED one with the last iterate (what L sweeps reached), never NaN.
TEST_F(Cli, NotConvergedKeepsTheLastIterateAndExitsThree) {
  auto ex = examples::ThesisExperiment1(16, 16);
  std::string block = "solve block-tridiagonal --method jacobi";
  for (const auto& [name, a] : ex) block += " " + name + "=" + Save("nc_" + name + ".npy", a);
  auto [rc, out] = Run(block + " --iterations 3 --tol 1e-12 -o " + Path("nc_x.npy") +
                       " --status-output " + Path("nc_s.npy"));
  ASSERT_EQ(rc, 3) << out;
  EXPECT_TRUE(Has(out, "1 not converged")) << out;
  EXPECT_EQ(ReadNpy(Path("nc_s.npy"))->as<int32_t>()[0], 2);  // NOT_CONVERGED
  // Exactly three sweeps (tol 0), status OK: the same iterate, bit for bit.
  auto [rc2, out2] = Run(block + " --iterations 3 --tol 0 -o " + Path("fixed_x.npy"));
  ASSERT_EQ(rc2, 0) << out2;
  const auto x = Values(*ReadNpy(Path("nc_x.npy"))), fixed = Values(*ReadNpy(Path("fixed_x.npy")));
  EXPECT_EQ(x, fixed);
  double norm = 0;
  for (double v : x) norm = std::max(norm, std::abs(v));
  EXPECT_GT(norm, 0.5);  // not zeros: y0 = 0 and the answer is all ones
  // A singular system ([[1, 1], [1, 1]]), with the default method: zeros, exit 3.
  Save("s_a.npy", NdArray::From<double>({2}, {0, 1}));
  Save("s_b.npy", NdArray::From<double>({2}, {1, 1}));
  Save("s_c.npy", NdArray::From<double>({2}, {1, 0}));
  Save("s_d.npy", NdArray::From<double>({2}, {1, 2}));
  auto [rc3, out3] = Run("solve tridiagonal a=" + Path("s_a.npy") + " b=" + Path("s_b.npy") +
                         " c=" + Path("s_c.npy") + " d=" + Path("s_d.npy") + " -o " +
                         Path("s_x.npy"));
  ASSERT_EQ(rc3, 3) << out3;
  EXPECT_TRUE(Has(out3, "0 ok, 1 singular")) << out3;
  EXPECT_EQ(Values(*ReadNpy(Path("s_x.npy"))), (std::vector<double>{0, 0}));
}

// docs/api.md: tree nodes need only parent[i] < i; depth-first numbering is not required.
// A breadth-first numbered tree, with non-symmetric couplings, through every CPU method,
// compared with a dense solve done here.
TEST_F(Cli, TreesNeedOnlyParentsBeforeChildren) {
  // 0 -> {1, 2}, 1 -> {3, 4}, 2 -> {5, 6}, 3 -> {7}: breadth-first, not depth-first.
  const std::vector<int32_t> parent = {-1, 0, 0, 1, 1, 2, 2, 3};
  const int n = int(parent.size());
  std::vector<double> lower(n), upper(n), diag(n), rhs(n);
  for (int i = 0; i < n; ++i) {
    lower[i] = i == 0 ? 0 : -0.5 - 0.1 * i;
    upper[i] = i == 0 ? 0 : -1.0 + 0.05 * i;
    diag[i] = 4 + 0.3 * i;
  }
  const std::vector<double> want = {1, -2, 3, 0.5, -1, 2, 4, -3};
  for (int i = 0; i < n; ++i) rhs[i] = diag[i] * want[i];
  for (int i = 1; i < n; ++i) {
    rhs[i] += lower[i] * want[parent[i]];  // A[i][parent] = lower[i]
    rhs[parent[i]] += upper[i] * want[i];  // A[parent][i] = upper[i]
  }
  const std::string args = " parent=" + Save("t_p.npy", NdArray::From<int32_t>({n}, parent)) +
                           " lower=" + Save("t_l.npy", NdArray::From<double>({n}, lower)) +
                           " upper=" + Save("t_u.npy", NdArray::From<double>({n}, upper)) +
                           " diag=" + Save("t_d.npy", NdArray::From<double>({n}, diag)) +
                           " rhs=" + Save("t_r.npy", NdArray::From<double>({n}, rhs));
  for (const char* method : {"auto", "hines", "cables", "contraction"}) {
    auto [rc, out] = Run(std::string("solve tree --method ") + method + args + " -o " +
                         Path("t_x.npy"));
    ASSERT_EQ(rc, 0) << method << "\n" << out;
    const auto x = Values(*ReadNpy(Path("t_x.npy")));
    for (int i = 0; i < n; ++i) EXPECT_NEAR(x[i], want[i], 1e-13) << method << " node " << i;
  }
  // A child before its parent is refused, naming the node.
  std::vector<int32_t> bad = parent;
  bad[3] = 5;
  auto [rc, out] = Run("solve tree parent=" + Save("t_bad.npy", NdArray::From<int32_t>({n}, bad)) +
                       " lower=" + Path("t_l.npy") + " upper=" + Path("t_u.npy") + " diag=" +
                       Path("t_d.npy") + " rhs=" + Path("t_r.npy"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(Has(out, "INVALID_ARGUMENT")) << out;
  EXPECT_TRUE(Has(out, "parent")) << out;
}

// The load generator against the real server: every answer checked, and the floor (the
// cheapest calls) measured the same way; a run in which anything fails exits 1.
TEST_F(Cli, BenchChecksEveryAnswerAndMeasuresTheFloor) {
  for (const std::string mode : {"unary", "handle", "stream", "info", "health"}) {
    auto [rc, out] = Run("bench --clients 2 --requests 20 --n 64 --json --mode " + mode);
    EXPECT_EQ(rc, 0) << mode << "\n" << out;
    EXPECT_TRUE(Has(out, "answers: 40 ok, 0 wrong")) << mode << "\n" << out;
    EXPECT_TRUE(Has(out, " 0 malformed, 0 errors, 0 not answered of 40")) << mode << "\n" << out;
    EXPECT_TRUE(Has(out, "\"mode\":\"" + mode + "\"")) << out;
    // The server's own account comes with solves only.
    EXPECT_EQ(Has(out, "server, mean ms"), mode != "info" && mode != "health") << mode << "\n"
                                                                                 << out;
  }
  // x into the clients' own arrays, reused: every answer is still checked, over the messages
  // and the streams transport, whole and in pieces.
  for (const std::string args :
       {"--mode unary", "--mode handle", "--mode stream", "--mode handle --transport streams",
        "--mode unary --transport streams --batch 512"}) {
    auto [rc, out] = Run("--pipeline-pieces 2 --pipeline-piece-bytes 262144 bench --clients 2 "
                         "--requests 12 --json --x-out " + args + " --n 64");
    EXPECT_EQ(rc, 0) << args << "\n" << out;
    EXPECT_TRUE(Has(out, "answers: 24 ok, 0 wrong")) << args << "\n" << out;
  }
  // A morphology's time steps are solves: the floor's modes do not apply there.
  auto [rc, out] = Run("bench --mode info --swc " + std::string(TRISOLVE_TEST_DATA) +
                       "/neuron_10-2012-02-09-001.CNG.swc");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Has(out, "--swc runs time steps")) << out;
}

// Idling between requests (a simulation's work between steps): the pause is not counted in a
// call's latency, so 5 requests after 60 ms pauses still answer each well under 60 ms here,
// while the run takes at least the 4 pauses; where the pause does not apply it is refused.
TEST_F(Cli, BenchPausesBetweenRequestsOutsideTheLatency) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [rc, out] = Run("bench --requests 5 --n 64 --json --mode handle --pause-ms 60");
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "each client idles 60.000 ms before each request")) << out;
  EXPECT_TRUE(Has(out, "answers: 5 ok, 0 wrong")) << out;
  EXPECT_GE(wall_s, 0.24) << out;
  const auto at = out.find("\"p99_ms\":");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_LT(std::stod(out.substr(at + 9)), 60.0) << out;
  for (auto [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"bench --family block --pause-ms 5", "--pause-ms does not apply"},
           {"bench --pause-ms -1", "--pause-ms"},
           {"bench --pause-ms 5 --mode handle --swc " + std::string(TRISOLVE_TEST_DATA) +
                "/neuron_10-2012-02-09-001.CNG.swc",
            "--pause-ms applies to tridiagonal requests"}}) {
    auto [rc2, out2] = Run(args);
    EXPECT_EQ(rc2, 2) << args << "\n" << out2;
    EXPECT_TRUE(Has(out2, why)) << args << "\n" << out2;
  }
}

// Sampled checks (--check-every K): every answer counted by its statuses, the values of each
// client's first and every K-th after it checked (2 clients x 10 requests, K = 4: answers 0, 4
// and 8 of each, 6 in all); the tree loop and the no-solve modes refuse it.
TEST_F(Cli, BenchChecksEveryKthAnswerWhenAsked) {
  for (const std::string args : {"--mode handle", "--mode unary --transport shm",
                                 "--family block --N 24 --M 16 --mode handle"}) {
    auto [rc, out] = Run("bench --clients 2 --requests 10 --check-every 4 --json " + args +
                         (args.find("block") == std::string::npos ? " --n 64" : ""));
    EXPECT_EQ(rc, 0) << args << "\n" << out;
    EXPECT_TRUE(Has(out, "answers: 20 ok, 0 wrong")) << args << "\n" << out;
    EXPECT_TRUE(Has(out, "checked: 6 answers (each client's first and every 4-th)"))
        << args << "\n" << out;
    EXPECT_TRUE(Has(out, "\"checked\":6,\"client_cores\":")) << args << "\n" << out;
    // Where the cores went during the clock: the clients' and the server's (GetServerInfo).
    EXPECT_TRUE(Has(out, "cores busy during the clock: the clients' ")) << args << "\n" << out;
    EXPECT_TRUE(Has(out, ",\"server_cores\":")) << args << "\n" << out;
  }
  auto [rc, out] = Run("bench --clients 2 --requests 3 --n 64 --json");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "\"checked\":6,")) << out;
  EXPECT_FALSE(Has(out, "values checked")) << out;
  for (auto [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"bench --check-every 0", "--check-every"},
           {"bench --check-every 4 --mode health", "--check-every applies to"},
           {"bench --check-every 2 --mode handle --swc " + std::string(TRISOLVE_TEST_DATA) +
                "/neuron_10-2012-02-09-001.CNG.swc",
            "--check-every applies to"}}) {
    auto [rc2, out2] = Run(args);
    EXPECT_EQ(rc2, 2) << args << "\n" << out2;
    EXPECT_TRUE(Has(out2, why)) << args << "\n" << out2;
  }
}

// The block family's load: every answer's ||f - A y||_2 / ||f||_2 computed on the client from
// the original arrays and held to the tolerance, over each mode and the data paths; a run whose
// answers the server could not bring within it (jacobi's 1000 sweeps) exits 1.
TEST_F(Cli, BenchBlockChecksEveryAnswer) {
  for (const std::string args :
       {"--mode unary", "--mode handle", "--mode stream", "--mode unary --transport grpc",
        "--mode handle --transport shm", "--mode handle --transport streams --x-out"}) {
    auto [rc, out] = Run("bench --family block --N 40 --M 24 --clients 2 --requests 6 --json " + args);
    EXPECT_EQ(rc, 0) << args << "\n" << out;
    EXPECT_TRUE(Has(out, "answers: 12 ok, 0 wrong")) << args << "\n" << out;
    EXPECT_TRUE(Has(out, " 0 not ok (the server's status), 0 malformed, 0 errors, 0 not answered "
                         "of 12")) << args << "\n" << out;
    EXPECT_TRUE(Has(out, "the server ran multigrid-cg")) << args << "\n" << out;
    EXPECT_TRUE(Has(out, "\"family\":\"block\"")) << out;
    EXPECT_TRUE(Has(out, "\"shape\":\"40x24\"")) << out;
  }
  {
    auto [rc, out] = Run("bench --family block --N 64 --M 64 --requests 2 --method jacobi");
    EXPECT_EQ(rc, 1) << out;
    EXPECT_TRUE(Has(out, "0 ok, 0 wrong")) << out;
    EXPECT_TRUE(Has(out, "2 not ok")) << out;
    EXPECT_TRUE(Has(out, "not ok not_converged: 2")) << out;
  }
  // The tridiagonal JSON names its family too.
  auto [rc, out] = Run("bench --requests 2 --n 16 --json");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(Has(out, "{\"family\":\"tridiagonal\",")) << out;
  // Options of the other family are refused before anything is sent.
  for (auto [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"bench --family block --n 5", "--n does not apply to bench --family block"},
           {"bench --family block --batch 5", "--batch does not apply"},
           {"bench --tol 1e-6", "--tol applies to bench --family block only"},
           {"bench --N 8", "--N applies to bench --family block only"},
           {"bench --family block --tol 0", "--tol is 0"},
           {"bench --family block --tol 1", "--tol is 1"},
           {"bench --family block --mode info", "--family block solves"},
           {"bench --family block --N 1", "--N"},
           {"bench --family qr", "--family"}}) {
    auto [rc2, out2] = Run(args);
    EXPECT_EQ(rc2, 2) << args << "\n" << out2;
    EXPECT_TRUE(Has(out2, why)) << args << "\n" << out2;
  }
}

// The dense family's load: each answer against the local core's LU x (the first also by its
// backward error), in every mode and over shared memory; the options of the other families,
// and matrices too large to hold, are refused before anything is sent.
TEST_F(Cli, BenchDenseChecksEveryAnswer) {
  for (const std::string args :
       {"--mode unary", "--mode handle", "--mode stream", "--mode handle --transport shm",
        "--mode unary --transport grpc --x-out"}) {
    auto [rc, out] =
        Run("bench --family dense --batch 3 --n 48 --clients 2 --requests 6 --json " + args);
    EXPECT_EQ(rc, 0) << args << "\n" << out;
    EXPECT_TRUE(Has(out, "answers: 12 ok, 0 wrong")) << args << "\n" << out;
    EXPECT_TRUE(Has(out,
                    " 0 not ok (the server's status), 0 malformed, 0 errors, 0 not answered "
                    "of 12"))
        << args << "\n"
        << out;
    EXPECT_TRUE(Has(out, "{\"family\":\"dense\",")) << out;
    EXPECT_TRUE(Has(out, "\"shape\":\"3x48\"")) << out;
    EXPECT_TRUE(Has(out, "\"checked\":12,")) << out;
  }
  {
    auto [rc, out] =
        Run("bench --family dense --batch 2 --n 32 --clients 2 --requests 10 "
            "--check-every 4 --mode handle");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_TRUE(Has(out, "answers: 20 ok, 0 wrong")) << out;
    EXPECT_TRUE(Has(out, "values checked: 6 answers (each client's first and every 4-th)")) << out;
  }
  for (auto [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"bench --family dense --N 8", "--N applies to bench --family block only"},
           {"bench --family dense --tol 1e-6", "--tol applies to bench --family block only"},
           {"bench --family dense --method cg", "--method applies to bench --family block only"},
           {"bench --family dense --pause-ms 5",
            "--pause-ms does not apply to bench --family dense"},
           {"bench --family dense --swc " + std::string(TRISOLVE_TEST_DATA) +
                "/neuron_10-2012-02-09-001.CNG.swc",
            "--swc does not apply to bench --family dense"},
           {"bench --family dense --mode info", "--family dense solves"},
           {"bench --family dense --n 70000", "--n is 70000"},
           {"bench --family dense --batch 4096 --n 1024", "--batch x --n x --n is 4096 x 1024"}}) {
    auto [rc2, out2] = Run(args);
    EXPECT_EQ(rc2, 2) << args << "\n" << out2;
    EXPECT_TRUE(Has(out2, why)) << args << "\n" << out2;
  }
  // Within the bound but beyond the memory the process may have: an error, not a crash.
  auto [rc, out] = Shell("ulimit -v 4000000; " + ServerProcess::CliBin() + " --server " +
                         server_->target() + " bench --family dense --batch 1 --n 40000");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(Has(out, "do not fit in this host's memory")) << out;
}

}  // namespace
}  // namespace trisolve
