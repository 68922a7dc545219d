#include "chunk_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trisolve::wire {
namespace {

constexpr uint8_t kRegionTag = (1 << 3) | 2, kOffsetTag = (2 << 3) | 0, kDataTag = (3 << 3) | 2;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out->push_back(char(v));
}

// Reads the concatenation of the slices byte by byte for the header fields; the data is only
// located, never copied.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& s) : s_(s) { Skip0(); }
  bool done() const { return i_ == s_.size(); }
  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = s_[i_].begin()[at_];
    Advance(1);
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // The next n bytes as spans of the slices (appended), false when fewer are left.
  bool Take(uint64_t n, std::vector<std::pair<const std::byte*, size_t>>* spans) {
    while (n > 0) {
      if (done()) return false;
      const size_t here = std::min<uint64_t>(n, s_[i_].size() - at_);
      if (spans != nullptr)
        spans->emplace_back(reinterpret_cast<const std::byte*>(s_[i_].begin()) + at_, here);
      Advance(here);
      n -= here;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    at_ += n;
    if (at_ == s_[i_].size()) {
      ++i_;
      at_ = 0;
      Skip0();
    }
  }
  void Skip0() {
    while (i_ < s_.size() && s_[i_].size() == 0) ++i_;
  }
  const std::vector<grpc::Slice>& s_;
  size_t i_ = 0, at_ = 0;
};

}  // namespace

grpc::ByteBuffer EncodeMemoryChunk(absl::string_view region, int64_t offset, const std::byte* data,
                                   int64_t bytes, void (*release)(void*), void* user) {
  std::string head;
  if (!region.empty()) {
    head.push_back(char(kRegionTag));
    PutVarint(region.size(), &head);
    head.append(region.data(), region.size());
  }
  if (offset != 0) {
    head.push_back(char(kOffsetTag));
    PutVarint(uint64_t(offset), &head);
  }
  if (bytes > 0) {
    head.push_back(char(kDataTag));
    PutVarint(uint64_t(bytes), &head);
  }
  grpc::Slice parts[2] = {grpc::Slice(head), grpc::Slice()};
  if (bytes > 0) {
    // gRPC never writes through the pointer: the slice type wants it mutable.
    parts[1] = grpc::Slice(const_cast<std::byte*>(data), size_t(bytes), release, user);
  } else if (release != nullptr) {
    release(user);
  }
  return grpc::ByteBuffer(parts, bytes > 0 ? 2 : 1);
}

absl::Status MemoryChunkView::Parse(const grpc::ByteBuffer& buffer) {
  slices_.clear();
  spans_.clear();
  region_.clear();
  offset_ = bytes_ = 0;
  if (grpc::Status st = buffer.Dump(&slices_); !st.ok())
    return absl::InvalidArgumentError("a memory chunk could not be read");
  Cursor c(slices_);
  auto bad = [](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("malformed memory chunk: ", what));
  };
  while (!c.done()) {
    uint64_t key;
    if (!c.Varint(&key)) return bad("truncated field key");
    const uint64_t field = key >> 3, type = key & 7;
    uint64_t v = 0;
    switch (type) {
      case 0:
        if (!c.Varint(&v)) return bad("truncated varint");
        if (field == 2) offset_ = int64_t(v);
        break;
      case 1:
        if (!c.Take(8, nullptr)) return bad("truncated fixed64");
        break;
      case 5:
        if (!c.Take(4, nullptr)) return bad("truncated fixed32");
        break;
      case 2: {
        if (!c.Varint(&v)) return bad("truncated length");
        if (field == 1) {
          std::vector<std::pair<const std::byte*, size_t>> s;
          if (v > 1024 || !c.Take(v, &s)) return bad("region name");
          region_.clear();
          for (auto [p, n] : s) region_.append(reinterpret_cast<const char*>(p), n);
        } else if (field == 3) {
          spans_.clear();  // protobuf keeps the last occurrence of a scalar field
          if (!c.Take(v, &spans_)) return bad("truncated data");
          bytes_ = int64_t(v);
        } else if (!c.Take(v, nullptr)) {
          return bad("truncated field");
        }
        break;
      }
      default:
        return bad("unsupported wire type");
    }
    if ((field == 1 || field == 3) && type != 2) return bad("wrong wire type");
    if (field == 2 && type != 0) return bad("wrong wire type");
  }
  return absl::OkStatus();
}

void MemoryChunkView::CopyTo(std::byte* dst) const {
  for (auto [p, n] : spans_) {
    std::memcpy(dst, p, n);
    dst += n;
  }
}

}  // namespace trisolve::wire
