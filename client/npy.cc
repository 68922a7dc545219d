#include <cstring>
#include <algorithm>
#include <fstream>
#include <istream>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "trisolve/ndarray.h"

namespace trisolve {

int DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat64: case DType::kInt64: return 8;
    case DType::kFloat32: case DType::kInt32: return 4;
  }
  return 8;
}

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat64: return "float64";
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "?";
}

int64_t ArrayView::elements() const {
  int64_t e = 1;
  for (int64_t d : shape) e *= d;
  return e;
}
int64_t NdArray::elements() const { return view().elements(); }

NdArray NdArray::Zeros(DType t, std::vector<int64_t> shape) {
  NdArray a;
  a.dtype = t;
  a.shape = std::move(shape);
  a.data.assign(static_cast<size_t>(a.elements() * DTypeSize(t)), std::byte{0});
  return a;
}

template <typename T>
NdArray NdArray::From(std::vector<int64_t> shape, const std::vector<T>& v) {
  NdArray a;
  a.dtype = std::is_same_v<T, double>    ? DType::kFloat64
            : std::is_same_v<T, float>   ? DType::kFloat32
            : std::is_same_v<T, int32_t> ? DType::kInt32
                                         : DType::kInt64;
  a.shape = std::move(shape);
  a.data.resize(v.size() * sizeof(T));
  std::memcpy(a.data.data(), v.data(), a.data.size());
  return a;
}
template NdArray NdArray::From(std::vector<int64_t>, const std::vector<double>&);
template NdArray NdArray::From(std::vector<int64_t>, const std::vector<float>&);
template NdArray NdArray::From(std::vector<int64_t>, const std::vector<int32_t>&);
template NdArray NdArray::From(std::vector<int64_t>, const std::vector<int64_t>&);

absl::StatusOr<NdArray> NdArray::ConvertTo(DType t) const {
  if (t == dtype) return *this;
  const bool from_float = dtype == DType::kFloat64 || dtype == DType::kFloat32;
  const bool to_float = t == DType::kFloat64 || t == DType::kFloat32;
  if (from_float != to_float)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot convert ", DTypeName(dtype), " to ", DTypeName(t)));
  NdArray out = Zeros(t, shape);
  const int64_t n = elements();
  for (int64_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::kFloat64: out.as<double>()[i] = as<float>()[i]; break;
      case DType::kFloat32: out.as<float>()[i] = static_cast<float>(as<double>()[i]); break;
      case DType::kInt64: out.as<int64_t>()[i] = as<int32_t>()[i]; break;
      case DType::kInt32: {
        const int64_t v = as<int64_t>()[i];
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
          return absl::InvalidArgumentError(absl::StrCat("value ", v, " at ", i,
                                                         " does not fit in int32"));
        out.as<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      }
    }
  }
  return out;
}

namespace {

// A header excerpt for a message: printable, at most 40 characters.
std::string Shown(absl::string_view v) {
  std::string out;
  for (char ch : v.substr(0, 40)) out.push_back(ch >= 0x20 && ch < 0x7f ? ch : '?');
  if (v.size() > 40) out += "...";
  return out;
}

// More dimensions than any family takes (block: 3), with room for NumPy's own limit (32).
constexpr size_t kMaxRank = 32;

absl::Status Bad(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

// The header's text after "'key':", leading blanks dropped; empty without the key.
absl::string_view AfterKey(absl::string_view header, absl::string_view key) {
  const std::string k = absl::StrCat("'", key, "'");
  size_t p = header.find(k);
  if (p == absl::string_view::npos) return {};
  p = header.find(':', p + k.size());
  if (p == absl::string_view::npos) return {};
  return absl::StripLeadingAsciiWhitespace(header.substr(p + 1));
}

// The value of 'key' in the header's Python dict literal.
absl::string_view DictValue(absl::string_view header, absl::string_view key) {
  const std::string k = absl::StrCat("'", key, "'");
  size_t p = header.find(k);
  if (p == absl::string_view::npos) return {};
  p = header.find(':', p + k.size());
  if (p == absl::string_view::npos) return {};
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(header.substr(p + 1));
  if (rest.empty()) return {};
  char close = rest[0] == '(' ? ')' : rest[0] == '\'' ? '\'' : ',';
  size_t end = rest.find(close, 1);
  if (end == absl::string_view::npos) return {};
  return rest.substr(0, close == ',' ? end : end + 1);
}

// Column-major values of `shape` reordered row-major: C-order element k gathers the
// Fortran-order element at the same multi-index.
std::vector<std::byte> ToCOrder(const std::vector<int64_t>& shape, int size,
                                const std::vector<std::byte>& f) {
  const size_t rank = shape.size();
  std::vector<int64_t> stride(rank, 1);  // Fortran strides, in elements
  for (size_t j = 1; j < rank; ++j) stride[j] = stride[j - 1] * shape[j - 1];
  std::vector<std::byte> c(f.size());
  std::vector<int64_t> index(rank, 0);
  int64_t from = 0;
  for (size_t k = 0; k * size < c.size(); ++k) {
    std::memcpy(c.data() + k * size, f.data() + from * size, size);
    for (size_t j = rank; j-- > 0;) {  // next C-order index: the last dimension fastest
      from += stride[j];
      if (++index[j] < shape[j]) break;
      from -= stride[j] * shape[j];
      index[j] = 0;
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<NdArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  return ReadNpy(in, path);
}

absl::StatusOr<NdArray> ReadNpy(std::istream& in, const std::string& path) {
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    return Bad(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char l[2];
    if (!in.read(reinterpret_cast<char*>(l), 2)) return Bad(path, "truncated header");
    hlen = l[0] | (l[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char l[4];
    if (!in.read(reinterpret_cast<char*>(l), 4)) return Bad(path, "truncated header");
    hlen = l[0] | (l[1] << 8) | (l[2] << 16) | (uint32_t(l[3]) << 24);
  } else {
    return Bad(path, absl::StrCat("unsupported .npy version ", major));
  }
  if (hlen > (1u << 20)) return Bad(path, "header too large");
  std::string header(hlen, '\0');
  if (!in.read(header.data(), hlen)) return Bad(path, "truncated header");

  // descr: byte order ('<' little, '>' big, '=' native: little on every host this builds
  // for), kind and size. Big-endian values are swapped, never reinterpreted.
  const absl::string_view descr = DictValue(header, "descr");
  NdArray a;
  bool known = descr.size() == 5 && descr.front() == '\'' && descr.back() == '\'' &&
               (descr[1] == '<' || descr[1] == '>' || descr[1] == '=');
  const bool swap = known && descr[1] == '>';
  const absl::string_view type = known ? descr.substr(2, 2) : absl::string_view();
  if (type == "f8") a.dtype = DType::kFloat64;
  else if (type == "f4") a.dtype = DType::kFloat32;
  else if (type == "i4") a.dtype = DType::kInt32;
  else if (type == "i8") a.dtype = DType::kInt64;
  else known = false;
  if (!known)
    return Bad(path, absl::StrCat("dtype ", descr.empty() ? "?" : Shown(descr),
                                  " is not supported (float64, float32, int32 or int64; "
                                  "convert it first, e.g. x.astype(np.float64))"));
  // Fortran order (column-major: what np.save writes for a transposed array) is reordered into
  // C order below, so the array holds what NumPy means by it.
  const absl::string_view order = AfterKey(header, "fortran_order");
  const bool fortran = absl::StartsWith(order, "True");
  if (!fortran && !absl::StartsWith(order, "False"))
    return Bad(path, "header has no fortran_order True or False");
  absl::string_view shape = DictValue(header, "shape");
  if (shape.size() < 2 || shape.front() != '(')
    return Bad(path, "header has no shape");
  shape = shape.substr(1, shape.size() - 2);
  // The byte count, overflow-checked: a crafted header must give an error, never a huge or
  // negative allocation (std::bad_alloc / std::length_error aborted the CLI).
  int64_t bytes = DTypeSize(a.dtype);
  for (absl::string_view part : absl::StrSplit(shape, ',', absl::SkipWhitespace())) {
    int64_t d;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 0)
      return Bad(path, absl::StrCat("bad shape entry '", Shown(part), "'"));
    if (a.shape.size() >= kMaxRank)
      return Bad(path, absl::StrCat("shape has more than ", kMaxRank, " dimensions"));
    if (__builtin_mul_overflow(bytes, d, &bytes))
      return Bad(path, "the shape's byte count overflows");
    a.shape.push_back(d);
  }
  if (a.shape.empty()) a.shape.push_back(1);  // a 0-d array: one value
  // Memory is taken only for bytes the file holds: at once where its size is known, else as
  // they are read.
  const std::streamoff at = in.tellg();
  std::streamoff left = -1;
  if (at >= 0 && in.seekg(0, std::ios::end)) {
    left = in.tellg() - at;
    in.seekg(at);
  }
  in.clear();
  const auto short_of = [&] {
    return Bad(path, absl::StrCat("holds fewer than the ", bytes, " bytes its shape needs"));
  };
  if (left >= 0 && left < bytes) return short_of();
  constexpr int64_t kStep = int64_t{64} << 20;
  for (int64_t done = 0; done < bytes;) {
    const int64_t step = left >= 0 ? bytes : std::min(kStep, bytes - done);
    a.data.resize(static_cast<size_t>(done + step));
    if (!in.read(reinterpret_cast<char*>(a.data.data()) + done, step)) return short_of();
    done += step;
  }
  const int size = DTypeSize(a.dtype);
  if (swap)
    for (std::byte* v = a.data.data(); v < a.data.data() + a.data.size(); v += size)
      std::reverse(v, v + size);
  if (fortran && a.shape.size() > 1) a.data = ToCOrder(a.shape, size, a.data);
  return a;
}

absl::Status WriteNpy(const std::string& path, const ArrayView& a) {
  const char* descr = a.dtype == DType::kFloat64   ? "<f8"
                      : a.dtype == DType::kFloat32 ? "<f4"
                      : a.dtype == DType::kInt32   ? "<i4"
                                                   : "<i8";
  std::string shape = absl::StrJoin(a.shape, ", ");
  if (a.shape.size() == 1) shape += ",";
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (",
                                    shape, "), }");
  // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  const char l[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  out.write(l, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(a.data), a.bytes());
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace trisolve
