#include <chrono>
#include <cstdio>
#include <vector>
#include "trisolve/block_tridiagonal.h"
using namespace trisolve;
#include <cmath>
#include <limits>
#include <algorithm>
template <typename T>
bool IsSym(const BlockTridiagonalProblem<T>& p) {
  const int64_t N = p.N, M = p.M;
  auto close = [](T u, T v) {
    return std::abs(u - v) <= T(64) * std::numeric_limits<T>::epsilon() *
                                  std::max(std::abs(u), std::abs(v));
  };
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      if (k + 1 < M && !close(p.aC[e + 1], p.bC[e])) return false;
      if (i + 1 < N && !close(p.cA[e + M], p.cB[e])) return false;
    }
  return true;
}
int main() {
  const int64_t N = 1024, M = 1024, n = N * M;
  std::vector<double> aC(n, -1), bC(n, -1), cC(n, 4), cA(n, -1), cB(n, -1), f(n, 1);
  BlockTridiagonalProblem<double> p{N, M, aC.data(), cC.data(), bC.data(), cA.data(), cB.data(), f.data(), nullptr};
  for (int r = 0; r < 8; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    bool s = IsSym(p);
    auto t1 = std::chrono::steady_clock::now();
    printf("%d %.3f ms\n", s, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
}
