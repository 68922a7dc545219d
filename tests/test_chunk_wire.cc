// MemoryChunk's hand-written framing (proto/chunk_wire.h) against protobuf's own: what one
// writes the other reads, however gRPC splits the bytes into slices, and bytes that are not a
// chunk are refused without reading past them.
#include <cstring>
#include <string>
#include <vector>

#include "chunk_wire.h"
#include "gtest/gtest.h"
#include "trisolve/v1/trisolve.pb.h"

namespace trisolve {
namespace {

std::string Flat(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> s;
  EXPECT_TRUE(bb.Dump(&s).ok());
  std::string out;
  for (const auto& x : s) out.append(reinterpret_cast<const char*>(x.begin()), x.size());
  return out;
}

// `bytes` as a buffer of slices cut at `cuts` (positions, increasing).
grpc::ByteBuffer Cut(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> s;
  size_t at = 0;
  for (size_t c : cuts) {
    s.emplace_back(bytes.data() + at, c - at);
    at = c;
  }
  s.emplace_back(bytes.data() + at, bytes.size() - at);
  return grpc::ByteBuffer(s.data(), s.size());
}

std::string Data(const wire::MemoryChunkView& v) {
  std::string out(size_t(v.bytes()), '\0');
  v.CopyTo(reinterpret_cast<std::byte*>(out.data()));
  return out;
}

TEST(ChunkWire, WhatItWritesProtobufReadsAndTheDataIsNotCopied) {
  std::vector<std::byte> data(300000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 7 + 3);
  int released = 0;
  for (int64_t offset :
       {int64_t{0}, int64_t{1}, int64_t{127}, int64_t{128}, int64_t{1} << 40, int64_t{-8}}) {
    std::string flat;
    {
      grpc::ByteBuffer bb = wire::EncodeMemoryChunk(
          "upload-1", offset, data.data(), int64_t(data.size()),
          [](void* n) { ++*static_cast<int*>(n); }, &released);
      std::vector<grpc::Slice> s;
      ASSERT_TRUE(bb.Dump(&s).ok());
      ASSERT_EQ(s.size(), 2u);
      EXPECT_EQ(static_cast<const void*>(s[1].begin()), data.data());  // the caller's memory
      flat = Flat(bb);
    }
    v1::MemoryChunk m;
    ASSERT_TRUE(m.ParseFromString(flat)) << offset;
    EXPECT_EQ(m.region(), "upload-1");
    EXPECT_EQ(m.offset(), offset);
    ASSERT_EQ(m.data().size(), data.size());
    EXPECT_EQ(std::memcmp(m.data().data(), data.data(), data.size()), 0);
  }
  EXPECT_EQ(released, 6);  // once each, when the buffer let go of the slice

  // Nothing to send: no data field, and the release still comes.
  grpc::ByteBuffer empty = wire::EncodeMemoryChunk(
      "", 0, nullptr, 0, [](void* n) { ++*static_cast<int*>(n); }, &released);
  EXPECT_EQ(released, 7);
  EXPECT_EQ(Flat(empty), "");
}

TEST(ChunkWire, ReadsWhatProtobufWritesCutAnywhere) {
  v1::MemoryChunk m;
  m.set_region("staging-7");
  m.set_offset(123456789);
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = char(i * 13);
  m.set_data(data);
  std::string bytes = m.SerializeAsString();
  // A field this version does not know (number 9, length-delimited), as a newer peer may add.
  bytes += std::string("\x4a\x03xyz", 5);
  for (size_t i = 1; i < bytes.size(); i += 7)
    for (size_t j = i; j < bytes.size(); j += 61) {
      wire::MemoryChunkView v;
      ASSERT_TRUE(v.Parse(Cut(bytes, {i, j})).ok()) << i << " " << j;
      EXPECT_EQ(v.region(), "staging-7");
      EXPECT_EQ(v.offset(), 123456789);
      ASSERT_EQ(v.bytes(), 1000);
      EXPECT_EQ(Data(v), data) << i << " " << j;
    }
  // Fields in any order, and the last data wins (protobuf's rule for a repeated scalar).
  std::string reordered = std::string("\x1a\x02xy", 4) + std::string("\x10\x05", 2) +
                          std::string("\x1a\x03pqr", 5) + std::string("\x0a\x01r", 3);
  wire::MemoryChunkView v;
  ASSERT_TRUE(v.Parse(Cut(reordered, {3})).ok());
  EXPECT_EQ(v.region(), "r");
  EXPECT_EQ(v.offset(), 5);
  EXPECT_EQ(Data(v), "pqr");
}

TEST(ChunkWire, RefusesWhatIsNotAChunk) {
  v1::MemoryChunk m;
  m.set_region("r");
  m.set_offset(300);
  m.set_data(std::string(40, 'z'));
  const std::string bytes = m.SerializeAsString();
  // Every prefix that ends inside a field (a whole-field prefix is itself a valid chunk).
  int refused = 0;
  for (size_t n = 1; n < bytes.size(); ++n) {
    wire::MemoryChunkView v;
    if (!v.Parse(Cut(bytes.substr(0, n), {n / 2})).ok()) ++refused;
  }
  EXPECT_EQ(refused, int(bytes.size()) - 3);  // all but those ending after region and offset
  for (const std::string& bad :
       {std::string("\x08", 1),                                  // a varint cut short
        std::string("\x0b", 1),                                  // a group: not in proto3
        std::string("\x11\x01\x02\x03\x04\x05\x06\x07\x08", 9),  // offset as fixed64
        std::string("\x18\x05", 2),                              // data as a varint
        std::string("\x0a\xff\xff\x03", 4),                      // a region past the end
        std::string("\x1a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", 11)}) {  // a length of 2^63
    wire::MemoryChunkView v;
    const absl::Status st = v.Parse(Cut(bad, {}));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("malformed memory chunk"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace trisolve
