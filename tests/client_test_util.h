// Helpers of the end-to-end suites that drive a real trisolved through the C++ client.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "trisolve/client.h"
#include "trisolve/examples.h"

namespace trisolve::testing {

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

}  // namespace trisolve::testing
