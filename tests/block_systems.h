// Block-tridiagonal test systems as host arrays by name (the thesis' experiments), for the
// block tests (test_block_kept, test_cuda_block, test_cuda_block_graphs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trisolve/block_tridiagonal.h"
#include "trisolve/examples.h"
#include "trisolve/system.h"

namespace trisolve::testing {

// aC, cC, bC, cA, cB and f of an N x M grid, natural layout.
template <typename T>
struct Sys {
  int64_t N, M;
  std::map<std::string, std::vector<T>> a;
  BlockTridiagonalProblem<T> P() const {
    return {N, M, a.at("aC").data(), a.at("cC").data(), a.at("bC").data(), a.at("cA").data(),
            a.at("cB").data(), a.at("f").data(), nullptr};
  }
  // A persistent system of these coefficients (their arrays, not copies) for method m.
  SystemSpec Spec(BlockMethod m, BlockOptions o) const {
    SystemSpec spec;
    spec.family = Family::kBlockTridiagonal;
    spec.precision = sizeof(T) == 8 ? Precision::kFloat64 : Precision::kFloat32;
    spec.n = N * M;
    spec.block_N = N;
    spec.block_M = M;
    spec.method = uint8_t(m);
    spec.block_options = o;
    const auto names = CoefficientNames(Family::kBlockTridiagonal);
    for (size_t i = 0; i < names.size(); ++i)
      spec.coefficients[i] = a.at(std::string(names[i])).data();
    return spec;
  }
};

// The thesis' experiment 1 (not symmetric) or 2 (symmetric positive definite) in T; sign -1
// negates it (experiment 2 then negative definite).
template <typename T>
Sys<T> Experiment(int which, int64_t N, int64_t M, int sign = 1) {
  auto ex = which == 1 ? examples::ThesisExperiment1(N, M) : examples::ThesisExperiment2(N, M);
  Sys<T> s{N, M, {}};
  for (auto& [k, v] : ex) {
    const double* d = v.template as<double>();
    std::vector<T>& out = s.a[k];
    out.reserve(size_t(N * M));
    for (int64_t e = 0; e < N * M; ++e) out.push_back(T(sign * d[e]));
  }
  return s;
}

}  // namespace trisolve::testing
