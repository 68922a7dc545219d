// WriteMemory and ReadMemory, the bulk path of clients elsewhere, on gRPC's raw callback API:
// a chunk's bytes go from the received buffer's slices straight into the region, and the
// chunks sent point into the region itself (the slices hold the region until gRPC lets them
// go), so no byte passes through a protobuf `bytes` field on the server (chunk_wire.h).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "chunk_wire.h"
#include "service.h"
#include "spdlog/spdlog.h"

namespace trisolve::server {
namespace {

template <typename Message>
void Serialize(const Message& m, grpc::ByteBuffer* out) {
  bool own = false;
  grpc::ByteBuffer bb;
  (void)grpc::SerializationTraits<Message>::Serialize(m, &bb, &own);
  out->Swap(&bb);
}

absl::Status OutsideRegion(int64_t offset, int64_t bytes, const Region& r, const char* field) {
  // The end as the client would compute it, without overflowing.
  const int64_t end = offset > 0 && bytes > INT64_MAX - offset ? INT64_MAX : offset + bytes;
  return absl::InvalidArgumentError(absl::StrCat(field, ": [", offset, ", ", end,
                                                 ") lies outside region '", r.name(), "' of ",
                                                 r.bytes(), " bytes"));
}

}  // namespace

class SolverService::WriteMemoryReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  WriteMemoryReactor(SolverService* s, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp)
      : s_(s), ctx_(ctx), resp_(resp), call_(s->Begin(ctx, "WriteMemory")) {
    Start();
  }

  void Start() {
    if (auto st = s_->Open(ctx_, call_, /*refuse_when_draining=*/true); !st.ok()) return Done(st);
    // The server's deadline ends a stream however silent its client is (as SolveStream's).
    if (call_.deadline < ctx_->deadline())
      watch_ = s_->deadline_watch_.Watch(call_.deadline, [ctx = ctx_] { ctx->TryCancel(); });
    StartRead(&buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client's half-close, or the call is gone
      call_.sample.bytes_in = written_;
      if (ctx_->IsCancelled())
        return Done(std::chrono::system_clock::now() + Admission::kDeadlineSkew >= call_.deadline
                        ? absl::DeadlineExceededError("the deadline passed while writing memory")
                        : absl::CancelledError("the client cancelled the call"));
      return Done(absl::OkStatus());
    }
    if (auto st = chunk_.Parse(buffer_); !st.ok()) return Done(st);
    buffer_.Clear();
    // A chunk naming no region writes to the stream's region so far (the first names it). Found
    // again each chunk: that marks it used, so that a long upload does not let it expire.
    const std::string& name =
        chunk_.region().empty() && region_ ? region_->name() : chunk_.region();
    auto r = s_->core_.FindRegion(call_, name);
    if (!r.ok()) return Done(r.status());
    if (*r != region_) {
      region_ = *std::move(r);
      // A client's shared memory that it truncated would fault the copy below.
      if (auto st = region_->StillMapped("region"); !st.ok()) return Done(st);
    }
    const int64_t off = chunk_.offset(), len = chunk_.bytes();
    if (off < 0 || off > region_->bytes() || len > region_->bytes() - off)
      return Done(OutsideRegion(off, len, *region_, "offset"));
    chunk_.CopyTo(region_->base() + off);
    written_ += len;
    StartRead(&buffer_);
  }

  void OnDone() override { delete this; }

 private:
  void Done(const absl::Status& st) {
    watch_.reset();
    if (st.ok() && region_) {
      v1::MemoryRegion m;
      m.set_name(region_->name());
      m.set_bytes(region_->bytes());
      m.set_pinned(region_->pinned());
      m.set_server_owned(region_->server_owned());
      Serialize(m, resp_);
    } else if (st.ok()) {
      Serialize(v1::MemoryRegion(), resp_);
    }
    region_.reset();
    Finish(s_->Finish(call_, st));
  }

  SolverService* s_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* resp_;
  Call call_;
  std::unique_ptr<DeadlineWatch::Guard> watch_;
  grpc::ByteBuffer buffer_;
  wire::MemoryChunkView chunk_;
  std::shared_ptr<Region> region_;
  int64_t written_ = 0;
};

class SolverService::ReadMemoryReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadMemoryReactor(SolverService* s, grpc::CallbackServerContext* ctx,
                    const grpc::ByteBuffer* request)
      : s_(s), call_(s->Begin(ctx, "ReadMemory")) {
    Start(ctx, request);
  }

  void Start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
    if (auto st = s_->Open(ctx, call_, /*refuse_when_draining=*/false); !st.ok()) return Done(st);
    v1::ReadMemoryRequest req;
    grpc::ByteBuffer copy(*request);
    if (!grpc::SerializationTraits<v1::ReadMemoryRequest>::Deserialize(&copy, &req).ok())
      return Done(absl::InvalidArgumentError("the request could not be parsed"));
    auto r = s_->core_.FindRegion(call_, req.region());
    if (!r.ok()) return Done(r.status());
    region_ = *std::move(r);
    off_ = req.offset();
    const int64_t rb = region_->bytes();
    const int64_t bytes = req.bytes() == 0 ? rb - std::clamp<int64_t>(off_, 0, rb) : req.bytes();
    if (off_ < 0 || bytes < 0 || off_ > rb || bytes > rb - off_)
      return Done(OutsideRegion(off_, bytes, *region_, "offset, bytes"));
    end_ = off_ + bytes;
    if (auto st = region_->StillMapped("region"); !st.ok()) return Done(st);
    chunk_ = std::max<int64_t>(s_->options_.stream_chunk_bytes, 1024);
    at_ = off_;
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Done(absl::CancelledError("the client went away"));
    Next();
  }

  void OnDone() override { delete this; }

 private:
  void Next() {
    if (at_ >= end_) return Done(absl::OkStatus());
    const int64_t len = std::min(chunk_, end_ - at_);
    // The slice keeps the region mapped until gRPC has sent it.
    auto* hold = new std::shared_ptr<Region>(region_);
    buffer_ = wire::EncodeMemoryChunk(
        at_ == off_ ? region_->name() : "", at_, region_->base() + at_, len,
        [](void* p) { delete static_cast<std::shared_ptr<Region>*>(p); }, hold);
    at_ += len;
    StartWrite(&buffer_);
  }

  void Done(const absl::Status& st) {
    region_.reset();
    Finish(s_->Finish(call_, st));
  }

  SolverService* s_;
  Call call_;
  std::shared_ptr<Region> region_;
  grpc::ByteBuffer buffer_;
  int64_t off_ = 0, end_ = 0, at_ = 0, chunk_ = 0;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* SolverService::WriteMemory(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  return new WriteMemoryReactor(this, ctx, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SolverService::ReadMemory(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  return new ReadMemoryReactor(this, ctx, request);
}

}  // namespace trisolve::server
