// trisolve bench: a load generator that checks every answer, beside one local core.
#pragma once

#include <cstdint>
#include <string>

#include "trisolve/client.h"

namespace trisolve {

struct BenchOptions {
  int clients = 1;
  int64_t requests = 100;  // per client
  int64_t batch = 1;       // systems a request
  int64_t n = 64;          // unknowns a system
  std::string mode = "unary";  // unary (the whole system each time), handle (SolveSystem), stream
  bool json = false;
};

// Prints requests/s, latency percentiles, payload GB/s, answers by outcome and the local
// alternative. Exit status 0 when every request was answered correctly.
int RunBench(const Client::Options& client_options, const BenchOptions& options);

}  // namespace trisolve
