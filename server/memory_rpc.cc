// WriteMemory and ReadMemory, the bulk path of clients elsewhere, as raw buffers on the sync
// server: a chunk's bytes go from the received buffer's slices straight into the region, and
// the chunks sent point into the region itself (the slices hold the region until gRPC lets
// them go), so no byte passes through a protobuf `bytes` field on the server (chunk_wire.h).
// They are sync handlers, like every other method: a callback method of the same service
// brings gRPC's callback pollers into the process, and one client's small requests were
// answered later with them (docs/serving.md, "No regression of the small request").
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "chunk_wire.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/method_handler.h"
#include "service.h"
#include "spdlog/spdlog.h"

namespace trisolve::server {
namespace {

using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

template <typename Message>
grpc::ByteBuffer Serialize(const Message& m) {
  bool own = false;
  grpc::ByteBuffer bb;
  (void)grpc::SerializationTraits<Message>::Serialize(m, &bb, &own);
  return bb;
}

absl::Status OutsideRegion(int64_t offset, int64_t bytes, const Region& r, const char* field) {
  // The end as the client would compute it, without overflowing.
  const int64_t end = offset > 0 && bytes > INT64_MAX - offset ? INT64_MAX : offset + bytes;
  return absl::InvalidArgumentError(absl::StrCat(field, ": [", offset, ", ", end,
                                                 ") lies outside region '", r.name(), "' of ",
                                                 r.bytes(), " bytes"));
}

// The method's index in the generated service: its place in the proto's service.
int MethodIndex(const char* name) {
  const auto* service =
      v1::MemoryChunk::descriptor()->file()->FindServiceByName("Solver");
  return service->FindMethodByName(name)->index();
}

}  // namespace

void SolverService::ServeMemoryRaw() {
  // Streamed methods on the sync server read and write ByteBuffers as they are (gRPC's own
  // SerializationTraits<ByteBuffer> moves the slices); the client's stubs are unchanged, as the
  // wire carries exactly a MemoryChunk stream either way.
  using Handler = grpc::internal::BidiStreamingHandler<SolverService, grpc::ByteBuffer,
                                                       grpc::ByteBuffer>;
  MarkMethodStreamed(MethodIndex("WriteMemory"),
                     new Handler([](SolverService* s, grpc::ServerContext* ctx,
                                    RawStream* stream) { return s->WriteMemoryRaw(ctx, stream); },
                                 this));
  MarkMethodStreamed(MethodIndex("ReadMemory"),
                     new Handler([](SolverService* s, grpc::ServerContext* ctx,
                                    RawStream* stream) { return s->ReadMemoryRaw(ctx, stream); },
                                 this));
}

grpc::Status SolverService::WriteMemoryRaw(grpc::ServerContext* ctx, RawStream* stream) {
  Call call = Begin(ctx, "WriteMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/true); !st.ok()) return Finish(call, st);
  // The server's deadline ends a stream however silent its client is (as SolveStream's).
  std::unique_ptr<DeadlineWatch::Guard> watch;
  if (call.deadline < ctx->deadline())
    watch = deadline_watch_.Watch(call.deadline, [ctx] { ctx->TryCancel(); });
  grpc::ByteBuffer buffer;
  wire::MemoryChunkView chunk;
  std::shared_ptr<Region> region;
  int64_t written = 0;
  const auto done = [&](const absl::Status& st) {
    watch.reset();
    call.sample.bytes_in = written;
    if (st.ok()) {
      v1::MemoryRegion m;
      if (region) {
        m.set_name(region->name());
        m.set_bytes(region->bytes());
        m.set_pinned(region->pinned());
        m.set_server_owned(region->server_owned());
      }
      stream->Write(Serialize(m));
    }
    region.reset();
    return Finish(call, st);
  };
  while (stream->Read(&buffer)) {
    if (auto st = chunk.Parse(buffer); !st.ok()) return done(st);
    buffer.Clear();
    // A chunk naming no region writes to the stream's region so far (the first names it). Found
    // again each chunk: that marks it used, so that a long upload does not let it expire.
    const std::string& name = chunk.region().empty() && region ? region->name() : chunk.region();
    auto r = core_.FindRegion(call, name);
    if (!r.ok()) return done(r.status());
    if (*r != region) {
      if (region)  // what was written to the last one reached its object
        if (auto st = region->StillMapped("region"); !st.ok()) return done(st);
      region = *std::move(r);
      // A client's shared memory that it truncated would fault the copy below.
      if (auto st = region->StillMapped("region"); !st.ok()) return done(st);
    }
    const int64_t off = chunk.offset(), len = chunk.bytes();
    if (off < 0 || off > region->bytes() || len > region->bytes() - off)
      return done(OutsideRegion(off, len, *region, "offset"));
    chunk.CopyTo(region->base() + off);
    written += len;
  }
  if (region)
    if (auto st = region->StillMapped("region"); !st.ok()) return done(st);
  // The client's half-close, or the call is gone.
  if (ctx->IsCancelled())
    return done(std::chrono::system_clock::now() + Admission::kDeadlineSkew >= call.deadline
                    ? absl::DeadlineExceededError("the deadline passed while writing memory")
                    : absl::CancelledError("the client cancelled the call"));
  return done(absl::OkStatus());
}

grpc::Status SolverService::ReadMemoryRaw(grpc::ServerContext* ctx, RawStream* stream) {
  Call call = Begin(ctx, "ReadMemory");
  if (auto st = Open(ctx, call, /*refuse_when_draining=*/false); !st.ok())
    return Finish(call, st);
  grpc::ByteBuffer request;
  v1::ReadMemoryRequest req;
  if (!stream->Read(&request))
    return Finish(call, absl::CancelledError("the client sent no request"));
  if (!grpc::SerializationTraits<v1::ReadMemoryRequest>::Deserialize(&request, &req).ok())
    return Finish(call, absl::InvalidArgumentError("the request could not be parsed"));
  auto r = core_.FindRegion(call, req.region());
  if (!r.ok()) return Finish(call, r.status());
  std::shared_ptr<Region> region = *std::move(r);
  const int64_t off = req.offset();
  const int64_t rb = region->bytes();
  const int64_t bytes = req.bytes() == 0 ? rb - std::clamp<int64_t>(off, 0, rb) : req.bytes();
  if (off < 0 || bytes < 0 || off > rb || bytes > rb - off)
    return Finish(call, OutsideRegion(off, bytes, *region, "offset, bytes"));
  if (auto st = region->StillMapped("region"); !st.ok()) return Finish(call, st);
  const int64_t chunk = std::max<int64_t>(options_.stream_chunk_bytes, 1024);
  for (int64_t at = off; at < off + bytes;) {
    const int64_t len = std::min(chunk, off + bytes - at);
    // The slice keeps the region mapped until gRPC has sent it.
    auto* hold = new std::shared_ptr<Region>(region);
    grpc::ByteBuffer out = wire::EncodeMemoryChunk(
        at == off ? region->name() : "", at, region->base() + at, len,
        [](void* p) { delete static_cast<std::shared_ptr<Region>*>(p); }, hold);
    at += len;
    if (!stream->Write(out)) return Finish(call, absl::CancelledError("the client went away"));
  }
  call.sample.bytes_out = bytes;
  // (gRPC may read the last slices after this: a page missing then reads as zeros, and the
  // region fails every later use.)
  if (auto st = region->StillMapped("region"); !st.ok()) return Finish(call, st);
  return Finish(call, absl::OkStatus());
}

}  // namespace trisolve::server
