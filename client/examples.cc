#include "trisolve/examples.h"

#include <cmath>
#include <random>

namespace trisolve::examples {
namespace {
NdArray Mat(int64_t rows, int64_t cols) { return NdArray::Zeros(DType::kFloat64, {rows, cols}); }
}  // namespace

Arrays ThesisExperiment1(int64_t N, int64_t M) {
  Arrays out;
  for (const char* k : {"aC", "cC", "bC", "cA", "cB", "f"}) out[k] = Mat(N, M);
  double *a = out["aC"].as<double>(), *c = out["cC"].as<double>(), *b = out["bC"].as<double>(),
         *A = out["cA"].as<double>(), *B = out["cB"].as<double>(), *F = out["f"].as<double>();
  const double denom = 2.0 * N + M;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      const double v = (2.0 * (i + 1) + (k + 1)) / denom;
      c[e] = 4.0;
      a[e] = k > 0 ? v : 0.0;
      b[e] = k < M - 1 ? v : 0.0;
      A[e] = i > 0 ? v : 0.0;
      B[e] = i < N - 1 ? v : 0.0;
    }
  for (int64_t e = 0; e < N * M; ++e) F[e] = c[e] + a[e] + b[e] + A[e] + B[e];
  return out;
}

Arrays ThesisExperiment2(int64_t N, int64_t M) {
  Arrays out;
  for (const char* k : {"aC", "cC", "bC", "cA", "cB", "f"}) out[k] = Mat(N, M);
  double *a = out["aC"].as<double>(), *c = out["cC"].as<double>(), *b = out["bC"].as<double>(),
         *A = out["cA"].as<double>(), *B = out["cB"].as<double>(), *F = out["f"].as<double>();
  // The thesis' fillSystem, case by case (its signs: positive diagonal, couplings -1).
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < M; ++k) {
      const int64_t e = i * M + k;
      const bool first_row = i == 0, last_row = i == N - 1, first_col = k == 0,
                 last_col = k == M - 1;
      if (!first_row && !last_row && !first_col && !last_col) {
        c[e] = 4; a[e] = -1; b[e] = -1; A[e] = -1; B[e] = -1;
      } else if (!first_row && !last_row && first_col) {
        c[e] = 5; b[e] = -1; A[e] = -1; B[e] = -1;
      } else if (!first_row && !last_row && last_col) {
        c[e] = 5; a[e] = -1; A[e] = -1; B[e] = -1;
      } else if (first_row && !first_col && !last_col) {
        c[e] = 3; a[e] = -1; b[e] = -1; B[e] = -1;
      } else if (first_row && first_col) {
        c[e] = 4; b[e] = -1; B[e] = -1;
      } else if (first_row && last_col) {
        c[e] = 4; a[e] = -1; B[e] = -1;
      } else if (last_row && !first_col && !last_col) {
        c[e] = 3; a[e] = -1; b[e] = -1; A[e] = -1;
      } else if (last_row && first_col) {
        c[e] = 4; b[e] = -1; A[e] = -1;
      } else {
        c[e] = 4; a[e] = -1; A[e] = -1;
      }
      F[e] = (k == 0 || k == M - 1) ? 2.0 : 0.0;
    }
  return out;
}

Arrays RandomTridiagonal(int64_t batch, int64_t n, bool interleaved, uint64_t seed,
                         DType dtype) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const std::vector<int64_t> shape =
      batch == 1 ? std::vector<int64_t>{n}
                 : interleaved ? std::vector<int64_t>{n, batch} : std::vector<int64_t>{batch, n};
  Arrays out;
  for (const char* k : {"a", "b", "c", "d"}) out[k] = NdArray::Zeros(DType::kFloat64, shape);
  double *a = out["a"].as<double>(), *b = out["b"].as<double>(), *c = out["c"].as<double>(),
         *d = out["d"].as<double>();
  for (int64_t e = 0; e < batch * n; ++e) {
    a[e] = u(rng);
    c[e] = u(rng);
    b[e] = (std::abs(a[e]) + std::abs(c[e]) + 1.0 + std::abs(u(rng))) * (u(rng) < 0 ? -1 : 1);
    d[e] = u(rng);
  }
  if (dtype != DType::kFloat64)
    for (auto& [k, v] : out) v = *v.ConvertTo(dtype);
  return out;
}

Arrays CableTree(const Morphology& m, int64_t cells, uint64_t seed) {
  // Units: um, ms, mS, uF. Axial resistivity 100 Ohm cm, membrane 1 uF/cm^2, leak
  // 0.1 mS/cm^2, dt = 0.025 ms. Conductance between a node and its parent through the
  // frustum between them: g = pi r_mean^2 / (R_a L).
  const int64_t n = m.size();
  const double Ra = 100.0 * 1e4 * 1e-6;  // Ohm cm -> MOhm um
  const double cm = 1.0 * 1e-8;          // uF/cm^2 -> uF/um^2
  const double gl = 0.1 * 1e-8;          // mS/cm^2 -> mS/um^2
  const double dt = 0.025;
  std::vector<double> g(n, 0.0), area(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = m.parent[i];
    if (p < 0) {
      area[i] = 4.0 * M_PI * m.radius[i] * m.radius[i];
      continue;
    }
    const double dx = m.x[i] - m.x[p], dy = m.y[i] - m.y[p], dz = m.z[i] - m.z[p];
    const double L = std::max(std::sqrt(dx * dx + dy * dy + dz * dz), 0.01);
    const double r = 0.5 * (m.radius[i] + m.radius[p]);
    g[i] = M_PI * r * r / (Ra * L) * 1e-3;  // 1/MOhm = uS -> mS
    area[i] = 2.0 * M_PI * m.radius[i] * L;
  }
  Arrays out;
  out["parent"] = NdArray::From<int32_t>({n}, m.parent);
  for (const char* k : {"lower", "upper", "diag", "rhs"})
    out[k] = NdArray::Zeros(DType::kFloat64, cells == 1 ? std::vector<int64_t>{n}
                                                        : std::vector<int64_t>{cells, n});
  double *lo = out["lower"].as<double>(), *up = out["upper"].as<double>(),
         *dg = out["diag"].as<double>(), *rhs = out["rhs"].as<double>();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> v(-70.0, -50.0);
  for (int64_t s = 0; s < cells; ++s) {
    double* L = lo + s * n;
    double* U = up + s * n;
    double* D = dg + s * n;
    double* R = rhs + s * n;
    for (int64_t i = 0; i < n; ++i) {
      const double c = cm * area[i] / dt;
      D[i] += c + gl * area[i];
      R[i] = c * v(rng) + gl * area[i] * (-65.0);
      if (m.parent[i] >= 0) {
        L[i] = -g[i];
        U[i] = -g[i];
        D[i] += g[i];
        D[m.parent[i]] += g[i];
      }
    }
  }
  return out;
}

Arrays RandomDense(int64_t batch, int64_t n, bool symmetric, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Arrays out;
  out["a"] = NdArray::Zeros(DType::kFloat64, batch == 1 ? std::vector<int64_t>{n, n}
                                                         : std::vector<int64_t>{batch, n, n});
  out["b"] = NdArray::Zeros(DType::kFloat64, batch == 1 ? std::vector<int64_t>{n}
                                                         : std::vector<int64_t>{batch, n});
  double* A = out["a"].as<double>();
  double* b = out["b"].as<double>();
  for (int64_t s = 0; s < batch; ++s) {
    double* As = A + s * n * n;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) As[i * n + j] = u(rng);
    if (symmetric)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) As[i * n + j] = As[j * n + i];
    for (int64_t i = 0; i < n; ++i) {
      As[i * n + i] += (u(rng) < 0 ? -1.0 : 1.0) * std::sqrt(double(n)) * 2.0;
      b[s * n + i] = u(rng);
    }
  }
  return out;
}

}  // namespace trisolve::examples
