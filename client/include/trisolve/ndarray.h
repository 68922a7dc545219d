// Arrays on the client side, and NumPy's .npy format (versions 1-3; read in C or Fortran
// order, little- or big-endian, into C order and this host's byte order; written C order).
#pragma once

#include "absl/strings/string_view.h"
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trisolve {

enum class DType : uint8_t { kFloat64, kFloat32, kInt32, kInt64 };
int DTypeSize(DType t);
absl::string_view DTypeName(DType t);  // "float64", ...

// A borrowed array: shape and a pointer to C-order values.
struct ArrayView {
  DType dtype = DType::kFloat64;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t elements() const;
  int64_t bytes() const { return elements() * DTypeSize(dtype); }
};

// An owned array.
struct NdArray {
  DType dtype = DType::kFloat64;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;

  static NdArray Zeros(DType t, std::vector<int64_t> shape);
  template <typename T>
  static NdArray From(std::vector<int64_t> shape, const std::vector<T>& values);
  int64_t elements() const;
  ArrayView view() const { return ArrayView{dtype, shape, data.data()}; }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(data.data()); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
  // A copy converted to another type (floats to floats, ints to ints; an int64 out of int32
  // range is an error).
  absl::StatusOr<NdArray> ConvertTo(DType t) const;
};

absl::StatusOr<NdArray> ReadNpy(const std::string& path);
// The same from a stream (a file's, or bytes in memory); `origin` names it in errors.
absl::StatusOr<NdArray> ReadNpy(std::istream& in, const std::string& origin);
absl::Status WriteNpy(const std::string& path, const ArrayView& a);

}  // namespace trisolve
