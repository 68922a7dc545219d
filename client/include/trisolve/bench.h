// trisolve bench: a load generator that checks every answer, beside one local core.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trisolve/client.h"

namespace trisolve {

struct BenchOptions {
  // tridiagonal (--batch systems of --n unknowns); block: the block-tridiagonal system of an
  // N x M grid (the thesis' experiment 2, a 5-point matrix: one block row of M unknowns per grid
  // row), solved by `method` to `tol`; dense: --batch matrices of order --n (MakeDenseBatch).
  // Each client's right-hand sides are its own.
  std::string family = "tridiagonal";
  int clients = 1;
  int64_t requests = 100;  // per client
  int64_t batch = 1;       // systems a request
  int64_t n = 64;          // unknowns a system
  // unary (the whole system each time), handle (SolveSystem), stream; info (GetServerInfo) and
  // health (the health check): the cheapest calls, the floor a solve's latency stands on.
  std::string mode = "unary";
  // grpc: bytes over the socket; auto: the client's choice (shared memory through its staging
  // region for large jobs on the same host); shm: the arrays live in a registered SharedMemory
  // and x is written into it (zero-copy, as a simulation that keeps its arrays there); streams:
  // the bytes written into the server's memory over parallel connections (remote clients);
  // ring: each client's requests through a request ring of its own (the server on this host);
  // shm-ring: the arrays in registered shared memory as with shm, the requests (references to
  // them) through the client's ring.
  std::string transport = "auto";
  // x into an array of each client's own, reused every request (JobOptions::x_out), as a
  // time-stepping code keeps its x; otherwise each answer brings a new x (Result::x). shm: x
  // is in the registered memory either way.
  bool x_out = false;
  bool json = false;
  // Milliseconds each client idles before each of its requests after the first (a simulation's
  // own work between two steps): the server's and client's threads are then asleep when a
  // call comes, as in a time-stepping code, and the latency counts their waking. Tridiagonal.
  double pause_ms = 0;
  // A morphology (SWC file): the bench is then a time-step loop of `batch` cells of it (tree
  // family, Hines systems), the diagonal and the right-hand side new each step (by handle: sent
  // as an update and a right-hand side), beside Hines over the same cells on one local core.
  std::string swc;
  int64_t N = 512, M = 512;  // block: block rows, and the order of each block
  std::string method = "auto";
  double tol = 1e-8;  // block: on ||f - A y||_2 / ||f||_2, what every answer is held to
  // Every answer's shape and statuses are checked; its values (against one local core's x, or
  // the block residual) for a client's first answer and every
  // check_every-th after it. 1 (the default): every answer. Larger values keep the clients'
  // own memory traffic (two arrays read a check) from bounding what many clients measure on the
  // server's host; the report says how many answers were checked.
  int64_t check_every = 1;
};

// Prints requests/s, latency percentiles, payload GB/s, answers by outcome and the local
// alternative. Exit status 0 when every request was answered correctly, 2 for options out of
// range.
int RunBench(const Client::Options& client_options, const BenchOptions& options);

// The check the bench applies to every answer: the worst backward error
// ||d - A x||_inf / (||A||_inf ||x||_inf + ||d||_inf) over a flat batch of tridiagonal systems
// (a, b, c, d, x of batch * n values; norm[s] = ||A||_inf of system s, n >= 2); infinity when x
// holds a NaN or an infinity.
double TridiagonalBackwardError(const double* a, const double* b, const double* c,
                                const double* norm, const double* d, const double* x,
                                int64_t batch, int64_t n);
// The other check: the worst over systems of max |x - expected| / max |expected| (x and
// expected: batch * n values); infinity when x holds a NaN or an infinity.
double MaxRelativeDifference(const double* x, const double* expected, int64_t batch, int64_t n);

// The block family's check: ||f - A y||_2 / ||f||_2 for the block-tridiagonal system of an
// N x M grid (arrays of N * M values, row-major, named as in trisolve/block_tridiagonal.h:
// row i reads cA[i] y[i-1] + (aC, cC, bC) y[i] + cB[i] y[i+1]), and the rounding that
// computing it in float64 may add, on the same scale: 16 eps (||A||_inf ||y||_2 + ||f||_2) /
// ||f||_2. An answer within tol of the server's own measure passes residual <= tol + rounding.
// residual is infinity when y holds a NaN or an infinity.
struct BlockResidual {
  double residual = 0, rounding = 0;
};
BlockResidual BlockTridiagonalResidual(int64_t N, int64_t M, const double* aC, const double* cC,
                                       const double* bC, const double* cA, const double* cB,
                                       double norm_a, const double* f, const double* y);
// ||A||_inf of that system (the largest row sum of |coefficients| that A uses).
double BlockTridiagonalNorm(int64_t N, int64_t M, const double* aC, const double* cC,
                            const double* bC, const double* cA, const double* cB);

// `count` values uniform in [-1, 1) from `seed`: the benches' right-hand sides, each its own seed
// so that an answer to another request shows as a large error.
std::vector<double> UniformValues(int64_t count, uint64_t seed);
// The dense family's systems: `batch` matrices of order n (float64, row-major, batch x n x n),
// off-diagonal entries uniform in (-1, 1), each row strictly diagonally dominant by
// max(1, n / 2); kappa_bound = max ||A||_inf / that margin, an upper bound on kappa_inf of every
// matrix (Varah), about 3 for every n.
struct DenseBatch {
  int64_t batch = 0, n = 0;
  std::vector<double> A;
  double kappa_bound = 0;
};
DenseBatch MakeDenseBatch(int64_t batch, int64_t n, uint64_t seed);
// What the dense check holds an answer to: its normwise backward error (the client's first
// answer) and its difference from one local core's LU x (MaxRelativeDifference; every checked
// answer).
struct DenseTolerance {
  double backward = 0, forward = 0;
};
DenseTolerance DenseCheckTolerance(int64_t n, double kappa_bound);
// The worst over a batch of ||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf) (A: batch x n x n,
// b and x: batch x n); infinity when x holds a NaN or an infinity.
double DenseNormwiseBackwardError(const double* A, const double* b, const double* x, int64_t batch,
                                  int64_t n);

}  // namespace trisolve
