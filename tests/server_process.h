// Starts the real trisolved binary on a loopback port the kernel picks, for end-to-end tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace trisolve::testing {

class ServerProcess {
 public:
  // The backend is TRISOLVE_TEST_BACKEND's (cpu when unset: CI has no GPU; the GPU run sets
  // cuda), or `backend` where a test needs one.
  explicit ServerProcess(std::vector<std::string> extra_args, std::string backend = "") {
    static int counter = 0;
    log_ = "/tmp/trisolved_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".log";
    if (backend.empty()) backend = TestBackend();
    // TRISOLVED_BIN in the environment: the server where the build's path is not (a bundle).
    const char* bin = std::getenv("TRISOLVED_BIN");
    std::vector<std::string> args = {bin != nullptr && *bin != 0 ? bin : TRISOLVED_BIN, "--listen",
                                     "127.0.0.1:0", "--backend", backend};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    // The server logs "listening on ... (port N)" once it accepts calls.
    const std::regex re("\\(port ([0-9]+)\\)");
    for (int i = 0; i < 200 && pid_ > 0 && port_ == 0 && !exited_; ++i) {
      std::smatch m;
      const std::string text = Log();
      if (std::regex_search(text, m, re)) {
        port_ = std::stoi(m[1]);
      } else if (int status = 0; waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;  // it could not start (a bad flag, no such backend): no port
        exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      }
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  static std::string TestBackend() {
    const char* b = std::getenv("TRISOLVE_TEST_BACKEND");
    return b != nullptr && *b != 0 ? b : "cpu";
  }
  // The CLI: TRISOLVE_CLI_BIN in the environment, else the build's.
  static std::string CliBin() {
    const char* b = std::getenv("TRISOLVE_CLI_BIN");
    return b != nullptr && *b != 0 ? b : TRISOLVE_CLI_BIN;
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // A line of /proc/<pid>/status in bytes ("VmRSS": resident now, "VmHWM": the peak), or -1.
  int64_t StatusBytes(const std::string& field) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(in, line);)
      if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
    return -1;
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The log once it holds `needle` (lines logged after the listening line may not be there yet
  // when the port is known), or as it is after `seconds`.
  std::string LogWith(const std::string& needle, double seconds = 5) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::string log = Log();
    while (log.find(needle) == std::string::npos && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      log = Log();
    }
    return log;
  }
  // The port --metrics-listen got (its log line), or 0 when none was logged within 5 s.
  int MetricsPort() const {
    std::smatch m;
    const std::string log = LogWith("metrics on http");
    return std::regex_search(log, m, std::regex("metrics on http://\\S*:([0-9]+)/metrics"))
               ? std::stoi(m[1])
               : 0;
  }
  void Signal(int sig) { kill(pid_, sig); }
  // The exit status, or -1 if it did not exit in time.
  int Wait(double seconds) {
    if (exited_) return exit_status_;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  int exit_status_ = -1;
  std::string log_;
};

// `args` (the program first) run as a child process, its standard output into `stdout_path`
// where one is given; killed at the latest when this goes, so that a test that stops early
// leaves no child holding ctest's output pipe.
class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> args, const char* stdout_path = nullptr) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (stdout_path != nullptr) posix_spawn_file_actions_addopen(&fa, 1, stdout_path, O_WRONLY, 0);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Kill(); }
  pid_t pid() const { return pid_; }  // -1 where it could not start
  // SIGKILL, and waits for it.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// Runs a shell command; returns its exit status and what it printed (stdout and stderr).
inline std::pair<int, std::string> Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace trisolve::testing
