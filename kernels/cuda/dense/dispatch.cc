#include "dense/dispatch.h"

#include <array>
#include <cstddef>

#include "dense/dense.h"
#include "dense/factors.h"

namespace trisolve::cuda {

DensePath ChooseDensePath(int64_t n, DenseMethod m) {
  const bool small = n <= kDenseGpuMaxN;
  if (m == DenseMethod::kHouseholderPcr && n <= kHouseholderBlockMaxN)
    return DensePath::kHouseholderPcrBlock;
  if (m == DenseMethod::kHouseholderPcr) return DensePath::kHouseholderPcr;
  if (m == DenseMethod::kGaussJordan && !small) return DensePath::kGaussJordanBlocked;
  if (m == DenseMethod::kLu || !small) return DensePath::kLu;
  return DensePath::kGaussJordanSmall;
}

bool DenseKeepsFactors(DensePath path) {
  return path == DensePath::kGaussJordanSmall || path == DensePath::kLu;
}

namespace {
constexpr int64_t kAlign = 256;
int64_t Aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
// The parts' sizes, in layout order: values, pivot rows or interchanges, the permutation, LU
// addresses, flags.
std::array<int64_t, 5> Parts(DenseFactorsKind kind, int64_t batch, int64_t n, int elem_bytes) {
  const bool lu = kind == DenseFactorsKind::kLu;
  return {Aligned(batch * n * n * elem_bytes), Aligned(batch * n * (lu ? 4 : 1)),
          lu ? Aligned(batch * n * 4) : 0, lu ? Aligned(batch * int64_t(sizeof(void*))) : 0,
          Aligned(batch)};
}
}  // namespace

int64_t DenseFactorsBytes(DenseFactorsKind kind, int64_t batch, int64_t n, int elem_bytes) {
  int64_t total = 0;
  for (int64_t b : Parts(kind, batch, n, elem_bytes)) total += b;
  return total;
}

template <typename T>
DenseFactorsDevice<T> DenseFactorsAt(DenseFactorsKind kind, int64_t batch, int64_t n,
                                     void* base) {
  const auto parts = Parts(kind, batch, n, int(sizeof(T)));
  auto* p = static_cast<std::byte*>(base);
  DenseFactorsDevice<T> f;
  f.kind = kind;
  f.batch = batch;
  f.n = n;
  f.values = reinterpret_cast<T*>(p);
  p += parts[0];
  if (kind == DenseFactorsKind::kLu)
    f.ipiv = reinterpret_cast<int*>(p);
  else
    f.pivot_row = reinterpret_cast<uint8_t*>(p);
  p += parts[1];
  if (kind == DenseFactorsKind::kLu) f.perm = reinterpret_cast<int*>(p);
  p += parts[2];
  if (kind == DenseFactorsKind::kLu) f.lu_ptrs = reinterpret_cast<T**>(p);
  p += parts[3];
  f.flags = reinterpret_cast<uint8_t*>(p);
  return f;
}

template DenseFactorsDevice<double> DenseFactorsAt<double>(DenseFactorsKind, int64_t, int64_t,
                                                           void*);
template DenseFactorsDevice<float> DenseFactorsAt<float>(DenseFactorsKind, int64_t, int64_t,
                                                         void*);

}  // namespace trisolve::cuda
