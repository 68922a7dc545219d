// trisolve: the command-line client.
//   trisolve [--server HOST:PORT] health | info   (--server H1:P1,H2:P2 or dns:///NAME:PORT:
//                                                  replicas, round_robin with health checks)
//   trisolve [--server HOST:PORT] solve KIND NAME=FILE.npy ... -o OUT.npy [options]
//   trisolve make-example KIND DIR          (writes example inputs as .npy files)
//   trisolve system create|solve|update|release|list ...   (persistent systems)
//   trisolve bench [--clients C] [--requests R] [--batch B] [--n N] [--mode unary|handle|stream]
//                  [--family block --N N --M M --tol TOL] [--family dense --batch B --n N]
// Exit status: 0 solved (every system ok), 3 solved but some system was not ok, 1 error
// (the server's status is printed), 2 usage.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "trisolve/bench.h"
#include "trisolve/client.h"
#include "trisolve/examples.h"
#include "trisolve/ndarray.h"
#include "trisolve/swc.h"

namespace {

int Fail(const absl::Status& st) {
  std::cerr << "error: " << absl::StatusCodeToString(st.code()) << ": " << st.message() << "\n";
  return 1;
}

std::string Ms(double us) { return absl::StrFormat("%.3f", us / 1e3); }

int MakeExample(const std::string& kind_name, const std::string& dir, int64_t batch, int64_t n,
                const std::string& swc) {
  auto kind = trisolve::ParseKind(kind_name);
  if (!kind.ok()) return Fail(kind.status());
  std::filesystem::create_directories(dir);
  trisolve::examples::Arrays arrays;
  std::string cmd;
  switch (*kind) {
    case trisolve::Kind::kTridiagonal:
      arrays = trisolve::examples::RandomTridiagonal(batch > 0 ? batch : 1000, n > 0 ? n : 64,
                                                     false, 42);
      break;
    case trisolve::Kind::kTree: {
      if (swc.empty())
        return Fail(absl::InvalidArgumentError("make-example tree needs --swc FILE.swc"));
      auto m = trisolve::ReadSwc(swc);
      if (!m.ok()) return Fail(m.status());
      arrays = trisolve::examples::CableTree(*m, batch > 0 ? batch : 16, 42);
      arrays.erase("parent");  // the solve names the .swc itself: parent=FILE.swc
      break;
    }
    case trisolve::Kind::kBlockTridiagonal:
      arrays = trisolve::examples::ThesisExperiment1(batch > 0 ? batch : 64, n > 0 ? n : 64);
      break;
    case trisolve::Kind::kDense:
      arrays = trisolve::examples::RandomDense(batch > 0 ? batch : 100, n > 0 ? n : 16, false, 42);
      arrays["A"] = std::move(arrays["a"]);
      arrays.erase("a");
      break;
  }
  std::vector<std::string> args;
  for (const auto& [name, a] : arrays) {
    const std::string path = absl::StrCat(dir, "/", name, ".npy");
    if (auto st = trisolve::WriteNpy(path, a.view()); !st.ok()) return Fail(st);
    args.push_back(absl::StrCat(name, "=", path));
  }
  if (*kind == trisolve::Kind::kTree) args.push_back(absl::StrCat("parent=", swc));
  std::cout << "trisolve solve " << kind_name << " " << absl::StrJoin(args, " ") << " -o " << dir
            << "/x.npy\n";
  return 0;
}

// A usage error: the command line itself is wrong (what --help would have told). Exit 2.
constexpr int kUsageExit = 2;
int Usage(absl::string_view why) {
  std::cerr << "usage: " << why << "\nRun with --help for more information.\n";
  return kUsageExit;
}

// One spelling per array: dense `a` is `A`; the block family's proto names are the thesis'.
std::string CanonicalName(std::optional<trisolve::Kind> kind, const std::string& name) {
  if (kind == trisolve::Kind::kDense && name == "a") return "A";
  if (kind == trisolve::Kind::kBlockTridiagonal) {
    static const std::map<std::string, std::string> proto = {
        {"a_c", "aC"}, {"c_c", "cC"}, {"b_c", "bC"}, {"c_a", "cA"}, {"c_b", "cB"}};
    if (auto it = proto.find(name); it != proto.end()) return it->second;
  }
  return name;
}

// What the NAME=FILE arguments must name.
enum class Names {
  kJob,           // solve KIND: every array of the family (y0 optional)
  kCoefficients,  // system create KIND: every coefficient array, the right-hand side optional
  kAny,           // system solve / update: the server knows the system's family
};

// NAME=FILE arguments checked against the family: malformed, repeated, unknown and missing
// names are usage errors (exit 2) -- found before any file is read or call made.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseInputs(
    const std::vector<std::string>& inputs, std::optional<trisolve::Kind> kind, Names names) {
  std::vector<std::pair<std::string, std::string>> out;
  std::map<std::string, std::string> given;  // canonical name -> as written
  for (const std::string& arg : inputs) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size())
      return absl::InvalidArgumentError(absl::StrCat("'", arg, "': expected NAME=FILE"));
    const std::string name = CanonicalName(kind, arg.substr(0, eq));
    if (auto [it, fresh] = given.emplace(name, arg.substr(0, eq)); !fresh)
      return absl::InvalidArgumentError(absl::StrCat(
          "array '", name, "' is given twice (", it->second, "=... and ", arg.substr(0, eq),
          "=...); name each array once"));
    out.emplace_back(name, arg.substr(eq + 1));
  }
  if (names == Names::kAny || !kind) return out;
  const auto& family = trisolve::ArrayNames(*kind);
  const std::string family_list = absl::StrJoin(family, ", ");
  for (const auto& [name, path] : out)
    if (std::find(family.begin(), family.end(), name) == family.end())
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not an array of a ",
                                                     trisolve::KindName(*kind), " job (",
                                                     family_list, ")"));
  std::vector<std::string> missing;
  for (size_t i = 0; i < family.size(); ++i) {
    // a, b, c or abc (the unified layout) for a tridiagonal job.
    const bool abc_given = given.count("abc") > 0;
    const bool tri_coefficient = *kind == trisolve::Kind::kTridiagonal &&
                                 (family[i] == "a" || family[i] == "b" || family[i] == "c");
    const bool optional = family[i] == "y0" || family[i] == "lengths" ||
                          family[i] == "abc" ||
                          (tri_coefficient && abc_given) ||
                          (names == Names::kCoefficients && i == 0);
    if (!optional && given.count(family[i]) == 0) missing.push_back(family[i] + "=FILE");
  }
  if (!missing.empty())
    return absl::InvalidArgumentError(absl::StrCat("a ", trisolve::KindName(*kind),
                                                   names == Names::kJob ? " solve" : " system",
                                                   " needs ", absl::StrJoin(missing, " ")));
  return out;
}

// The files read (parent=FILE.swc for a tree). Integer arrays become float64 -- NumPy's
// own promotion, exact to 2^53 and refused beyond -- so np.save of an integer array works;
// `parent` must hold integers. `read_as` records each array's type in its file.
absl::Status ReadArrays(const std::vector<std::pair<std::string, std::string>>& inputs,
                        std::map<std::string, trisolve::NdArray>* arrays,
                        std::map<std::string, trisolve::DType>* read_as) {
  for (const auto& [name, path] : inputs) {
    trisolve::NdArray a;
    if (name == "parent" && absl::EndsWithIgnoreCase(path, ".swc")) {
      auto m = trisolve::ReadSwc(path);
      if (!m.ok()) return m.status();
      a = trisolve::NdArray::From<int32_t>({m->size()}, m->parent);
    } else {
      auto r = trisolve::ReadNpy(path);
      if (!r.ok()) return r.status();
      a = *std::move(r);
    }
    (*read_as)[name] = a.dtype;
    const bool integer = a.dtype == trisolve::DType::kInt32 || a.dtype == trisolve::DType::kInt64;
    if (name == "parent" && !integer)
      return absl::InvalidArgumentError(absl::StrCat(
          "parent (", path, ") is ", trisolve::DTypeName(a.dtype),
          ": node indices must be an integer array (int32 or int64)"));
    if (name == "lengths" && !integer)
      return absl::InvalidArgumentError(absl::StrCat(
          "lengths (", path, ") is ", trisolve::DTypeName(a.dtype),
          ": the systems' (cells') sizes must be an integer array (int32 or int64)"));
    if (!trisolve::IsIndexArray(name) && integer) {
      trisolve::NdArray f = trisolve::NdArray::Zeros(trisolve::DType::kFloat64, a.shape);
      constexpr int64_t kExact = int64_t{1} << 53;
      for (int64_t i = 0; i < a.elements(); ++i) {
        const int64_t v = a.dtype == trisolve::DType::kInt32 ? a.as<int32_t>()[i]
                                                             : a.as<int64_t>()[i];
        if (v > kExact || v < -kExact)
          return absl::InvalidArgumentError(absl::StrCat(
              name, " (", path, ") is ", trisolve::DTypeName(a.dtype), " and its value ", v,
              " at ", i, " has no exact float64; save it as floating point"));
        f.as<double>()[i] = static_cast<double>(v);
      }
      a = std::move(f);
    }
    (*arrays)[name] = std::move(a);
  }
  return absl::OkStatus();
}

// "float64" and, for arrays that arrived in another type, "(converted: b int64, d float32)":
// the type the job ran in is the answer's (float32 only when every array is float32).
std::string DTypeUsed(trisolve::DType used, const std::map<std::string, trisolve::DType>& read_as) {
  std::vector<std::string> converted;
  for (const auto& [name, t] : read_as)
    if (!trisolve::IsIndexArray(name) && t != used) converted.push_back(absl::StrCat(name, " ", trisolve::DTypeName(t)));
  std::string out(trisolve::DTypeName(used));
  if (!converted.empty()) absl::StrAppend(&out, " (converted: ", absl::StrJoin(converted, ", "), ")");
  return out;
}

// A dense right-hand side as NumPy's solve takes one column: b [n, 1] beside A [n, n] (or
// [batch, n, 1] beside [batch, n, n]) is one right-hand side, sent as [n] ([batch, n]); x is
// written back in b's shape. Right-hand sides here are rows ([k, n] for k of them), so b
// [n, k] beside A [n, n], k > 1 and k != n, is refused naming b. Returns b's shape as given.
absl::StatusOr<std::vector<int64_t>> DenseColumns(std::map<std::string, trisolve::NdArray>* arrays) {
  auto A = arrays->find("A"), b = arrays->find("b");
  if (A == arrays->end() || b == arrays->end()) return std::vector<int64_t>{};
  const std::vector<int64_t> as = A->second.shape, given = b->second.shape;
  const size_t r = as.size();
  if (r < 2 || as[r - 1] != as[r - 2] || given.size() != r) return given;
  const int64_t n = as[r - 1];
  if (!std::equal(as.begin(), as.end() - 1, given.begin()) || given.back() == n) return given;
  if (given.back() != 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "b has shape [", absl::StrJoin(given, ", "), "] beside A [", absl::StrJoin(as, ", "),
        "]: right-hand sides are the rows of b ([k, ", n, "] for k of them beside one matrix; "
        "NumPy's columns: save b.T)"));
  b->second.shape.pop_back();  // the column, as a vector (given.back() is 1, n is not)
  return given;
}

bool Given(const CLI::App* cmd, const std::string& name) {
  const CLI::Option* o = cmd->get_option_no_throw(name);
  return o != nullptr && o->count() > 0;
}

// The progress bar of `solve` on stderr: the phase, and for iterative solves the iterations and
// the residual, with a bar that fills as the residual falls from its first value towards tol on
// a log scale (or as the sweeps run out, when that is further along). Redrawn in place; the
// line is cleared when the solve ends, so what follows reads as without it.
class ProgressBar {
 public:
  void Draw(const trisolve::Progress& p) {
    double fraction = -1;
    std::string detail;
    if (p.phase == "solving" && p.max_iterations > 0) {
      fraction = double(p.iteration) / double(p.max_iterations);
      if (!std::isnan(p.residual)) {
        if (std::isnan(first_residual_)) first_residual_ = p.residual;
        if (p.tol > 0 && first_residual_ > p.tol && p.residual > 0)
          fraction = std::max(fraction, std::log(first_residual_ / p.residual) /
                                            std::log(first_residual_ / p.tol));
        detail = absl::StrFormat("  it %d/%d  residual %.2e", p.iteration, p.max_iterations,
                                 p.residual);
        if (p.tol > 0) detail += absl::StrFormat(" -> %.0e", p.tol);
      }
    } else if (p.bytes_total > 0) {
      detail = absl::StrFormat("  %.1f MB", p.bytes_total / 1e6);
    }
    std::string bar;
    if (fraction >= 0) {
      const int filled = int(std::clamp(fraction, 0.0, 1.0) * kWidth + 0.5);
      bar = absl::StrCat("[", std::string(size_t(filled), '#'),
                         std::string(size_t(kWidth - filled), '.'), "] ");
    }
    std::string line = absl::StrFormat("%s%-9s%s  %.1f s", bar, p.phase, detail, p.elapsed_s);
    const size_t width = line.size();
    if (line.size() < drawn_) line.append(drawn_ - line.size(), ' ');
    std::fprintf(stderr, "\r%s", line.c_str());
    std::fflush(stderr);
    drawn_ = width;
  }
  void Clear() {
    if (drawn_ == 0) return;
    std::fprintf(stderr, "\r%s\r", std::string(drawn_, ' ').c_str());
    std::fflush(stderr);
    drawn_ = 0;
  }

 private:
  static constexpr int kWidth = 30;
  double first_residual_ = std::numeric_limits<double>::quiet_NaN();
  size_t drawn_ = 0;
};

// What is wrong with a solve's or system create's options for KIND, or "" when nothing is:
// an option the family ignores, or a value out of its range.
std::string JobOptionsFault(const CLI::App* cmd, trisolve::Kind kind, int64_t iterations,
                            double tol) {
  const bool block = kind == trisolve::Kind::kBlockTridiagonal;
  const std::string family(trisolve::KindName(kind));
  for (const char* name : {"--iterations", "--tol", "--scale-rows"})
    if (!block && Given(cmd, name))
      return absl::StrCat(name, " applies to block-tridiagonal only: a ", family,
                          " solve is direct and would ignore it");
  if ((block || kind == trisolve::Kind::kDense) && Given(cmd, "--layout"))
    return absl::StrCat("--layout applies to tridiagonal and tree only: ", family,
                        " arrays have one layout");
  if (block && Given(cmd, "--skip-residual"))
    return "--skip-residual does not apply to block-tridiagonal: the residual decides when "
           "the iteration stops, and is always computed";
  if (Given(cmd, "--iterations") && iterations < 1)
    return absl::StrCat("--iterations is ", iterations, ", expected at least 1");
  if (Given(cmd, "--tol") && !(tol >= 0 && tol < 1))
    return absl::StrCat("--tol is ", tol, ", expected 0 <= tol < 1 (0: exactly --iterations "
                        "sweeps)");
  return "";
}

void PrintSystem(const trisolve::SystemInfo& s) {
  std::cout << s.handle << "  " << s.family << " " << trisolve::DTypeName(s.dtype)
            << (s.interleaved ? " interleaved" : "") << ", rhs ["
            << absl::StrJoin(s.rhs_shape, ", ") << "]"
            << (s.variable ? absl::StrCat(" (", s.systems, " systems of different sizes)") : "")
            << ", method " << s.method << ", "
            << s.prepared << ", " << s.bytes << " bytes, " << s.solves << " solves, "
            << s.updates << " updates, idle " << absl::StrFormat("%.1f", s.idle_s) << " s of "
            << absl::StrFormat("%.0f", s.ttl_s) << (s.label.empty() ? "" : ", label " + s.label)
            << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  // As trisolved: Debian's Abseil checks every gRPC mutex against a lock-order graph.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"trisolve: solve structured linear systems on a trisolved server"};
  app.require_subcommand(1);
  std::string server = "127.0.0.1:50051";
  double timeout = 0;
  app.add_option("--server", server,
                 "trisolved address, HOST:PORT; replicas: HOST:PORT,HOST:PORT,... or "
                 "dns:///NAME:PORT (round_robin over the serving ones)")
      ->envname("TRISOLVE_SERVER")->capture_default_str();
  app.add_option("--timeout", timeout, "deadline of the call in seconds (0: none)");
  trisolve::Client::Options copt;
  std::string token_file;
  app.add_option("--tls-ca", copt.tls_ca_file, "CA (PEM) of the server's certificate: use TLS")
      ->envname("TRISOLVE_TLS_CA");
  app.add_option("--tls-cert", copt.tls_cert_file, "client certificate (PEM), for mutual TLS")
      ->envname("TRISOLVE_TLS_CLIENT_CERT");
  app.add_option("--tls-key", copt.tls_key_file, "client private key (PEM), for mutual TLS")
      ->envname("TRISOLVE_TLS_CLIENT_KEY");
  app.add_option("--tls-server-name", copt.tls_server_name,
                 "name to check in the server's certificate (default: the host of --server)")
      ->envname("TRISOLVE_TLS_SERVER_NAME");
  app.add_option("--token", copt.token, "bearer token")->envname("TRISOLVE_TOKEN");
  app.add_option("--token-file", token_file, "file whose first line is the bearer token")
      ->envname("TRISOLVE_TOKEN_FILE");
  std::string transport = "auto";
  app.add_option("--transport", transport,
                 "how arrays travel: auto (a request ring for small solves and shared memory for "
                 "large jobs when the server is on this host, else parallel streams into its "
                 "memory), ring, shm, streams, grpc")
      ->envname("TRISOLVE_TRANSPORT")
      ->check(CLI::IsMember({"auto", "ring", "shm", "shared-memory", "streams", "grpc"}))
      ->capture_default_str();
  app.add_option("--parallel-streams", copt.parallel_streams,
                 "connections a large job's bytes are spread over (the streams transport)")
      ->envname("TRISOLVE_PARALLEL_STREAMS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--pipeline-pieces", copt.pipeline_pieces,
                 "the streams transport: pieces (of --pipeline-piece-bytes or more) a batch of "
                 "whole systems or a solve by handle goes in, one uploading while another is "
                 "solved and another's x comes back (0 or 1: whole; -1: 4 where the server "
                 "solves on a GPU, whole where it solves on its CPU, and solves by handle whole)")
      ->envname("TRISOLVE_PIPELINE_PIECES")
      ->check(CLI::Range(-1, 64))
      ->capture_default_str();
  app.add_option("--pipeline-piece-bytes", copt.pipeline_piece_bytes,
                 "the streams transport: the fewest bytes moved (arrays up and x down) a piece; "
                 "a solve by handle moves the right-hand side and x only")
      ->envname("TRISOLVE_PIPELINE_PIECE_BYTES")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();

  app.add_option("--rpc-spin-us", copt.rpc_spin_us,
                 "a call whose arrays all lie in shared memory polls for its answer, for up to "
                 "twice the last such call's wait where that was at most this long, before it "
                 "sleeps (0: never, the default)")
      ->envname("TRISOLVE_RPC_SPIN_US")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();

  auto* health = app.add_subcommand("health", "the server's grpc.health.v1 status");
  std::string health_service;
  health->add_option("--service", health_service, "service name ('' = the whole server)");
  auto* info = app.add_subcommand("info", "backend, devices, limits, version");

  auto* solve = app.add_subcommand("solve", "solve the systems given as .npy files");
  std::string kind_name, out_path, status_path, method, layout = "flat";
  std::vector<std::string> inputs;
  int64_t iterations = 0;
  double tol = -1;
  bool scale_rows = false, json = false, skip_residual = false;
  solve->add_option("kind", kind_name, "tridiagonal, tree, block-tridiagonal, dense")
      ->required()->check(CLI::IsMember({"tridiagonal", "tree", "block-tridiagonal", "dense"}));
  solve->add_option("arrays", inputs, "NAME=FILE.npy (parent=FILE.swc for a tree)")->required();
  solve->add_option("-o,--output", out_path, "where to write x (.npy)");
  solve->add_option("--status-output", status_path, "where to write the per-system status (.npy, int32)");
  solve->add_option("--method", method, "solver method (default: auto)");
  solve->add_option("--layout", layout, "flat (batch x n) or interleaved (n x batch)")
      ->check(CLI::IsMember({"flat", "interleaved"}))->capture_default_str();
  solve->add_option("--iterations", iterations, "block-tridiagonal: the most sweeps L");
  solve->add_option("--tol", tol, "block-tridiagonal: relative residual to reach (0: exactly L sweeps)");
  solve->add_flag("--scale-rows", scale_rows, "block-tridiagonal: the thesis' Jacobi row scaling");
  solve->add_flag("--skip-residual", skip_residual, "do not compute the backward error");
  solve->add_flag("--json", json, "print a JSON summary as the last line");
  std::string progress = "auto", history_path;
  solve->add_option("--progress", progress,
                    "a progress bar on stderr: auto (when stderr is a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  solve->add_option("--history-output", history_path,
                    "block-tridiagonal: write the residual history (CSV: iteration,residual)");

  auto* example = app.add_subcommand("make-example", "write an example input of KIND into DIR");
  std::string ex_kind, ex_dir, ex_swc;
  int64_t ex_batch = 0, ex_n = 0;
  example->add_option("kind", ex_kind, "tridiagonal, tree, block-tridiagonal, dense")
      ->required()->check(CLI::IsMember({"tridiagonal", "tree", "block-tridiagonal", "dense"}));
  example->add_option("dir", ex_dir, "output folder")->required();
  example->add_option("--batch", ex_batch, "systems (block-tridiagonal: N)");
  example->add_option("--n", ex_n, "unknowns per system (block-tridiagonal: M)");
  example->add_option("--swc", ex_swc, "tree: the morphology (.swc)");

  auto* system = app.add_subcommand("system", "persistent systems: send the matrix once, then "
                                                "right-hand sides");
  system->require_subcommand(1);
  auto* sys_create = system->add_subcommand("create", "keep a system on the server; prints its handle");
  std::string sys_kind, sys_label, sys_handle;
  double sys_ttl = 0;
  std::vector<std::string> sys_inputs;
  sys_create->add_option("kind", sys_kind, "tridiagonal, tree, block-tridiagonal, dense")
      ->required()->check(CLI::IsMember({"tridiagonal", "tree", "block-tridiagonal", "dense"}));
  sys_create->add_option("arrays", sys_inputs, "NAME=FILE.npy: the coefficients")->required();
  sys_create->add_option("--method", method, "solver method (default: auto)");
  sys_create->add_option("--layout", layout, "flat (batch x n) or interleaved (n x batch)")
      ->check(CLI::IsMember({"flat", "interleaved"}))->capture_default_str();
  sys_create->add_option("--iterations", iterations, "block-tridiagonal: the most sweeps L");
  sys_create->add_option("--tol", tol, "block-tridiagonal: relative residual to reach");
  sys_create->add_option("--ttl", sys_ttl, "seconds unused before the server drops it (0: its default)");
  sys_create->add_option("--label", sys_label, "a name for listings ([A-Za-z0-9._-])");
  auto* sys_solve = system->add_subcommand("solve", "solve right-hand sides of a system");
  sys_solve->add_option("handle", sys_handle, "the system's handle")->required();
  sys_solve->add_option("arrays", sys_inputs,
                        "rhs=FILE.npy (the right-hand sides, whatever the family), and "
                        "NAME=FILE.npy coefficients to replace first")
      ->required();
  sys_solve->add_option("-o,--output", out_path, "where to write x (.npy)");
  sys_solve->add_flag("--skip-residual", skip_residual, "do not compute the backward error");
  auto* sys_update = system->add_subcommand("update", "replace coefficient arrays of a system");
  sys_update->add_option("handle", sys_handle, "the system's handle")->required();
  sys_update->add_option("arrays", sys_inputs, "NAME=FILE.npy")->required();
  auto* sys_release = system->add_subcommand("release", "drop a system (its memory is returned)");
  sys_release->add_option("handle", sys_handle, "the system's handle")->required();
  system->add_subcommand("list", "the systems this identity holds");

  auto* bench = app.add_subcommand("bench",
                                   "load the server with checked solves (tridiagonal, "
                                   "block-tridiagonal or dense), beside one local core");
  trisolve::BenchOptions bo;
  bench
      ->add_option("--family", bo.family,
                   "tridiagonal (--batch systems of --n unknowns), block (the block-tridiagonal "
                   "system of an --N x --M grid, solved to --tol by --method) or dense (--batch "
                   "diagonally dominant matrices of order --n; by handle the server keeps their "
                   "LU factors)")
      ->check(CLI::IsMember({"tridiagonal", "block", "dense"}))
      ->capture_default_str();
  bench->add_option("--clients", bo.clients, "concurrent clients (threads)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))->capture_default_str();
  bench->add_option("--requests", bo.requests, "requests a client")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))->capture_default_str();
  bench->add_option("--batch", bo.batch, "systems a request")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))->capture_default_str();
  bench->add_option("--n", bo.n, "unknowns a system (dense: the matrices' order)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))
      ->capture_default_str();
  bench->add_option("--mode", bo.mode,
                    "unary (whole system), handle (rhs only), stream; info (GetServerInfo) and "
                    "health (the health check): the cheapest calls, no solve")
      ->check(CLI::IsMember({"unary", "handle", "stream", "info", "health"}))
      ->capture_default_str();
  bench->add_option("--transport", bo.transport,
                    "grpc, auto (the client's choice), shm (arrays kept in registered shared "
                    "memory, x written into it), streams (parallel streams into the server's "
                    "memory), ring (a request ring a client: no socket), shm-ring (as shm, the "
                    "references through the client's request ring)")
      ->check(CLI::IsMember({"grpc", "auto", "shm", "streams", "ring", "shm-ring"}))
      ->capture_default_str();
  bench->add_flag("--x-out", bo.x_out,
                  "x into an array of each client's own, reused every request (as a "
                  "time-stepping code keeps its x), not a new one each answer");
  bench->add_flag("--json", bo.json, "print a JSON summary as the last line");
  bench->add_option("--pause-ms", bo.pause_ms,
                    "tridiagonal: each client idles this long before each request after its "
                    "first (a simulation's own work between steps), so that every call finds "
                    "the threads asleep")
      ->check(CLI::Range(0.0, 60000.0))->capture_default_str();
  bench
      ->add_option("--check-every", bo.check_every,
                   "solves: every answer's shape and statuses are checked, its values for each "
                   "client's first answer and every K-th after it (1: all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  bench->add_option("--N", bo.N, "block: block rows (grid rows)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  bench->add_option("--M", bo.M, "block: the order of each block (grid columns)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  bench->add_option("--method", bo.method,
                    "block: auto (multigrid-cg here: the system is symmetric and a tolerance is "
                    "asked), multigrid-cg, multigrid-bicgstab, cg, red-black, jacobi, "
                    "gauss-seidel")
      ->check(CLI::IsMember({"auto", "multigrid-cg", "multigrid-bicgstab", "cg", "red-black",
                             "jacobi", "gauss-seidel"}))
      ->capture_default_str();
  bench->add_option("--tol", bo.tol,
                    "block: ||f - A y||_2 / ||f||_2 every answer must reach (the server's "
                    "tolerance, and the check's)")
      ->capture_default_str();
  bench->add_option("--swc", bo.swc,
                    "a morphology: time steps of --batch cells of it (tree family; diagonal and "
                    "right-hand side new each step) instead of tridiagonal requests")
      ->check(CLI::ExistingFile);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (105, 106, 109, ...) would contradict the documented 2; --help is 0.
    return app.exit(e) == 0 ? 0 : kUsageExit;
  }
  // Options a family ignores, and values out of range, are refused, never silently dropped or
  // defaulted: the answer must be the one the command line asked for.
  if (!std::isfinite(timeout) || timeout < 0)
    return Usage(absl::StrCat("--timeout is ", timeout, ", expected seconds >= 0 (0: none)"));

  if (*example) {
    for (const char* name : {"--batch", "--n"})
      if (Given(example, name) && (name[2] == 'b' ? ex_batch : ex_n) < 1)
        return Usage(absl::StrCat(name, " is ", name[2] == 'b' ? ex_batch : ex_n,
                                  ", expected at least 1"));
    if (ex_kind == "tree" && Given(example, "--n"))
      return Usage("--n does not apply to a tree example: the morphology (--swc) sets n");
    if (ex_kind != "tree" && Given(example, "--swc"))
      return Usage("--swc applies to tree examples only");
    return MakeExample(ex_kind, ex_dir, ex_batch, ex_n, ex_swc);
  }
  // The command line checked whole before a file is read or a call made.
  std::optional<trisolve::Kind> kind;
  const CLI::App* job_cmd = *solve ? solve : *sys_create ? sys_create : nullptr;
  if (job_cmd != nullptr) {
    kind = *trisolve::ParseKind(*solve ? kind_name : sys_kind);  // CLI11 checked the name
    if (std::string fault = JobOptionsFault(job_cmd, *kind, iterations, tol); !fault.empty())
      return Usage(fault);
    if (*solve && *kind != trisolve::Kind::kBlockTridiagonal && Given(solve, "--history-output"))
      return Usage(absl::StrCat("--history-output applies to block-tridiagonal only: a ",
                                kind_name, " solve is direct and has no residual history"));
  }
  if (*sys_create && (!std::isfinite(sys_ttl) || sys_ttl < 0))
    return Usage(absl::StrCat("--ttl is ", sys_ttl, ", expected seconds >= 0 (0: the server's default)"));
  std::vector<std::pair<std::string, std::string>> named;
  if (*solve || *sys_create || *sys_solve || *sys_update) {
    auto parsed = ParseInputs(*solve ? inputs : sys_inputs, kind,
                              *solve ? Names::kJob : *sys_create ? Names::kCoefficients : Names::kAny);
    if (!parsed.ok()) return Usage(parsed.status().message());
    named = *std::move(parsed);
    if (*sys_solve && std::none_of(named.begin(), named.end(),
                                   [](const auto& e) { return e.first == "rhs"; }))
      return Usage("system solve needs rhs=FILE.npy (the right-hand sides)");
  }
  std::map<std::string, trisolve::NdArray> arrays;
  std::map<std::string, trisolve::DType> read_as;
  if (auto st = ReadArrays(named, &arrays, &read_as); !st.ok()) return Fail(st);

  copt.target = server;
  copt.transport = *trisolve::ParseTransport(transport);
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in || !std::getline(in, copt.token) || copt.token.empty())
      return Fail(absl::NotFoundError(absl::StrCat("token file ", token_file, ": no token")));
    while (!copt.token.empty() && (copt.token.back() == '\r' || copt.token.back() == ' '))
      copt.token.pop_back();
  }
  if (*bench) {
    // Options of the other families are refused, not ignored.
    const bool block = bo.family == "block", dense = bo.family == "dense";
    for (const char* name : {"--batch", "--n", "--swc", "--pause-ms"})
      if (block && Given(bench, name))
        return Usage(absl::StrCat(name, " does not apply to bench --family block (--N, --M)"));
    for (const char* name : {"--swc", "--pause-ms"})
      if (dense && Given(bench, name))
        return Usage(absl::StrCat(name, " does not apply to bench --family dense"));
    for (const char* name : {"--N", "--M", "--method", "--tol"})
      if (!block && Given(bench, name))
        return Usage(absl::StrCat(name, " applies to bench --family block only"));
    if (block && !(bo.tol > 0 && bo.tol < 1))
      return Usage(absl::StrCat("--tol is ", bo.tol, ", expected 0 < tol < 1"));
    if ((block || dense) && (bo.mode == "info" || bo.mode == "health"))
      return Usage(
          absl::StrCat("bench --family ", bo.family, " solves: --mode unary, handle or stream"));
    if (dense && bo.n > 65536)
      return Usage(absl::StrCat("--n is ", bo.n,
                                ", expected at most 65536 (the largest dense "
                                "order) for bench --family dense"));
    if (dense && double(bo.batch) * double(bo.n) * double(bo.n) > double(int64_t{1} << 31))
      return Usage(absl::StrCat("--batch x --n x --n is ", bo.batch, " x ", bo.n, " x ", bo.n,
                                ", expected at most 2^31 values for bench --family dense"));
    return trisolve::RunBench(copt, bo);
  }
  auto created = trisolve::Client::Create(copt);
  if (!created.ok()) return Fail(created.status());
  trisolve::Client& client = **created;
  const double t = timeout > 0 ? timeout : 10;

  if (*system) {
    trisolve::JobOptions jo;
    if (timeout > 0) jo.timeout_s = timeout;
    if (*sys_create) {
      trisolve::Job job;
      job.kind = *kind;
      for (const auto& [name, a] : arrays) job.arrays[name] = a.view();
      job.options = jo;
      job.options.method = method;
      job.options.interleaved = layout == "interleaved";
      if (Given(sys_create, "--iterations")) job.options.max_iterations = iterations;
      if (Given(sys_create, "--tol")) job.options.tol = tol;
      auto made = client.CreateSystem(job, {.ttl_s = sys_ttl, .label = sys_label});
      if (!made.ok()) return Fail(made.status());
      PrintSystem(*made);
      return 0;
    }
    if (*sys_solve) {
      const trisolve::NdArray* rhs = nullptr;
      trisolve::Updates update;
      for (const auto& [name, a] : arrays) {
        if (name == "rhs")
          rhs = &a;
        else
          update[name] = a.view();
      }
      jo.skip_residual = skip_residual;
      auto res = client.SolveSystem(sys_handle, rhs->view(), update, jo);
      if (!res.ok()) return Fail(res.status());
      const auto& sm = res->summary;
      if (!out_path.empty())
        if (auto st = trisolve::WriteNpy(out_path, res->x.view()); !st.ok()) return Fail(st);
      std::cout << sm.handle << ": " << sm.right_hand_sides << " right-hand side"
                << (sm.right_hand_sides == 1 ? "" : "s") << ", " << sm.systems << " systems, "
                << DTypeUsed(res->x.dtype, read_as) << ", method "
                << sm.method << ", backend " << sm.backend << "\n"
                << "residual " << (std::isnan(sm.residual) ? std::string("not computed")
                                                          : absl::StrFormat("%.3e", sm.residual))
                << "; status: " << sm.ok << " ok, " << sm.singular << " singular, "
                << sm.not_converged << " not converged, " << sm.diverged << " diverged\n"
                << "time: " << Ms(sm.timings.client_total_us) << " ms at the client; server "
                << Ms(sm.timings.server_total_us) << " ms (h2d " << Ms(sm.timings.h2d_us)
                << ", compute " << Ms(sm.timings.compute_us) << ", d2h " << Ms(sm.timings.d2h_us)
                << ")\n";
      if (!out_path.empty()) std::cout << "x written to " << out_path << "\n";
      return sm.ok == sm.systems ? 0 : 3;
    }
    if (*sys_update) {
      trisolve::Updates update;
      for (const auto& [name, a] : arrays) update[name] = a.view();
      auto updated = client.UpdateSystem(sys_handle, update, jo);
      if (!updated.ok()) return Fail(updated.status());
      PrintSystem(*updated);
      return 0;
    }
    if (*sys_release) {
      auto released = client.ReleaseSystem(sys_handle, jo);
      if (!released.ok()) return Fail(released.status());
      std::cout << "released " << released->handle << " (" << released->bytes << " bytes)\n";
      return 0;
    }
    auto list = client.ListSystems(jo);
    if (!list.ok()) return Fail(list.status());
    for (const auto& s : *list) PrintSystem(s);
    if (list->empty()) std::cout << "no systems\n";
    return 0;
  }

  if (*health) {
    auto st = client.Health(health_service, t);
    if (!st.ok()) return Fail(st.status());
    std::cout << *st << "\n";
    return *st == "SERVING" ? 0 : 1;
  }
  if (*info) {
    auto s = client.Info(t);
    if (!s.ok()) return Fail(s.status());
    std::cout << "version:   " << s->version << "\n"
              << "backend:   " << s->backend << " (" << s->cpu_threads << " CPU threads)\n";
    for (const auto& d : s->devices) std::cout << "device:    " << d << "\n";
    for (const auto& p : s->pools) std::cout << "pool:      " << p << "\n";
    std::cout << "limits:    message " << s->max_message_bytes << " B, job " << s->max_job_bytes
              << " B / " << s->max_job_unknowns << " unknowns, " << s->max_concurrent_jobs
              << " concurrent, " << s->max_queued_jobs << " queued\n"
              << "jobs:      " << s->jobs_in_flight << " running, " << s->jobs_queued
              << " queued, " << s->jobs_done << " done; up "
              << absl::StrFormat("%.1f s, %.1f s of CPU", s->uptime_s, s->cpu_s) << "\n";
    if (!s->replica.empty()) std::cout << "replica:   " << s->replica << " (handles end with @" << s->replica << ")\n";
    return 0;
  }

  // solve
  trisolve::Job job;
  job.kind = *kind;
  std::vector<int64_t> b_shape;  // dense: b as given, x written in it
  if (job.kind == trisolve::Kind::kDense) {
    auto given = DenseColumns(&arrays);
    if (!given.ok()) return Fail(given.status());
    b_shape = *given;
  }
  for (const auto& [name, a] : arrays) job.arrays[name] = a.view();
  job.options.method = method;
  job.options.interleaved = layout == "interleaved";
  if (Given(solve, "--iterations")) job.options.max_iterations = iterations;
  if (Given(solve, "--tol")) job.options.tol = tol;
  job.options.scale_rows = scale_rows;
  job.options.skip_residual = skip_residual;
  if (timeout > 0) job.options.timeout_s = timeout;
  ProgressBar progress_bar;
  if (progress == "on" || (progress == "auto" && isatty(STDERR_FILENO)))
    job.options.progress = [&progress_bar](const trisolve::Progress& p) { progress_bar.Draw(p); };
  job.options.residual_history = !history_path.empty();

  auto res = client.Solve(job);
  progress_bar.Clear();
  if (!res.ok()) return Fail(res.status());
  if (!history_path.empty()) {
    std::ofstream out(history_path);
    out << "iteration,residual\n";
    for (const auto& q : res->summary.residual_history)
      out << q.iteration << "," << absl::StrFormat("%.17g", q.residual) << "\n";
    if (!out.flush())
      return Fail(absl::UnavailableError(absl::StrCat("cannot write ", history_path)));
  }
  const auto& s = res->summary;
  if (!b_shape.empty() && res->x.elements() == trisolve::ArrayView{{}, b_shape, nullptr}.elements())
    res->x.shape = b_shape;
  if (!out_path.empty())
    if (auto st = trisolve::WriteNpy(out_path, res->x.view()); !st.ok()) return Fail(st);
  if (!status_path.empty()) {
    std::vector<int32_t> codes;
    for (auto st : res->status) codes.push_back(static_cast<int32_t>(st));
    auto arr = trisolve::NdArray::From<int32_t>({int64_t(codes.size())}, codes);
    if (auto st = trisolve::WriteNpy(status_path, arr.view()); !st.ok()) return Fail(st);
  }
  const bool iterative = job.kind == trisolve::Kind::kBlockTridiagonal;
  std::cout << kind_name << ": " << s.systems << (s.systems == 1 ? " system" : " systems")
            << ", " << DTypeUsed(res->x.dtype, read_as) << ", x "
            << absl::StrCat("[", absl::StrJoin(res->x.shape, ", "), "]") << ", backend " << s.backend << ", method "
            << s.method << (s.streamed ? " (streamed)" : "") << "\n";
  if (iterative)
    std::cout << "iterations " << s.iterations << ", relative residual ||f - Ay|| / ||f|| = "
              << absl::StrFormat("%.3e", s.residual) << "\n";
  else
    std::cout << "backward error ||b - Ax|| / (||A|| ||x|| + ||b||) = "
              << (std::isnan(s.residual) ? std::string("not computed")
                                         : absl::StrFormat("%.3e", s.residual))
              << "\n";
  std::cout << "status: " << s.ok << " ok, " << s.singular << " singular";
  if (iterative) std::cout << ", " << s.not_converged << " not converged, " << s.diverged << " diverged";
  std::cout << "\n";
  const auto& tm = s.timings;
  std::cout << "time: " << Ms(tm.client_total_us) << " ms at the client; server " << Ms(tm.server_total_us)
            << " ms (receive " << Ms(tm.receive_us) << ", queue " << Ms(tm.queue_us) << ", h2d "
            << Ms(tm.h2d_us) << ", compute " << Ms(tm.compute_us) << ", d2h " << Ms(tm.d2h_us)
            << ", residual " << Ms(tm.residual_us) << ")\n";
  if (!out_path.empty()) std::cout << "x written to " << out_path << "\n";
  if (json) {
    nlohmann::json j;
    j["kind"] = kind_name;
    j["method"] = s.method;
    j["dtype"] = trisolve::DTypeName(res->x.dtype);
    j["converted"] = nlohmann::json::object();
    for (const auto& [name, type] : read_as)
      if (!trisolve::IsIndexArray(name) && type != res->x.dtype) j["converted"][name] = trisolve::DTypeName(type);
    j["backend"] = s.backend;
    j["request_id"] = s.request_id;
    j["systems"] = s.systems;
    j["iterations"] = s.iterations;
    j["residual"] = std::isnan(s.residual) ? nlohmann::json(nullptr) : nlohmann::json(s.residual);
    j["status"] = {{"ok", s.ok}, {"singular", s.singular}, {"not_converged", s.not_converged},
                   {"diverged", s.diverged}};
    j["streamed"] = s.streamed;
    j["timings_ms"] = {{"client_total", tm.client_total_us / 1e3}, {"server_total", tm.server_total_us / 1e3},
                       {"receive", tm.receive_us / 1e3}, {"queue", tm.queue_us / 1e3},
                       {"h2d", tm.h2d_us / 1e3}, {"compute", tm.compute_us / 1e3},
                       {"d2h", tm.d2h_us / 1e3}, {"residual", tm.residual_us / 1e3}};
    std::cout << j.dump() << "\n";
  }
  return s.ok == s.systems ? 0 : 3;
}
