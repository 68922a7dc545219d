// MemoryChunk (trisolve.v1: region = 1, offset = 2, data = 3) in its wire form, written and read
// without protobuf's copies of `data`: the bytes of a chunk are the largest part of a big job,
// and parsing them into a std::string, then copying that into the region, or copying the
// caller's array into a message, then serialising that, costs two passes over memory for every
// byte on each side. Arrow Flight does the same for its FlightData. The framing is protobuf's:
// a peer using the generated MemoryChunk reads and writes exactly these bytes.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trisolve::wire {

// A chunk ready to send: a small slice of the header fields, then `data` itself in one slice
// that points at it. `release(user)` is called once gRPC holds no reference to `data` any more
// (after the call, at the latest); until then the memory must stay as it is.
grpc::ByteBuffer EncodeMemoryChunk(absl::string_view region, int64_t offset, const std::byte* data,
                                   int64_t bytes, void (*release)(void*), void* user);

// A received chunk: the fields, and its data where it lies in the received buffer's slices.
class MemoryChunkView {
 public:
  // INVALID_ARGUMENT for bytes that are not a MemoryChunk.
  absl::Status Parse(const grpc::ByteBuffer& buffer);
  const std::string& region() const { return region_; }
  int64_t offset() const { return offset_; }
  int64_t bytes() const { return bytes_; }
  // Copies the data to dst[0, bytes()).
  void CopyTo(std::byte* dst) const;

 private:
  std::vector<grpc::Slice> slices_;
  std::vector<std::pair<const std::byte*, size_t>> spans_;  // the data, in order
  std::string region_;
  int64_t offset_ = 0, bytes_ = 0;
};

}  // namespace trisolve::wire
