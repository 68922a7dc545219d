#include "trisolve/client.h"

#include <grpcpp/grpcpp.h>

#include "client_impl.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "replicas.h"
#include "ring_abi.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve {
namespace {

using Clock = std::chrono::steady_clock;

// The request field (proto name) for a user-facing array name.
std::string FieldName(Kind k, const std::string& name) {
  if (k == Kind::kBlockTridiagonal) {
    if (name == "aC") return "a_c";
    if (name == "cC") return "c_c";
    if (name == "bC") return "b_c";
    if (name == "cA") return "c_a";
    if (name == "cB") return "c_b";
  }
  if (k == Kind::kDense && name == "A") return "a";
  return name;
}

v1::Array* MutableField(v1::StreamRequest& h, Kind k, const std::string& field) {
  switch (k) {
    case Kind::kTridiagonal: {
      auto* r = h.mutable_tridiagonal();
      if (field == "a") return r->mutable_a();
      if (field == "b") return r->mutable_b();
      if (field == "c") return r->mutable_c();
      if (field == "d") return r->mutable_d();
      if (field == "lengths") return r->mutable_lengths();
      if (field == "abc") return r->mutable_abc();
      break;
    }
    case Kind::kTree: {
      auto* r = h.mutable_tree();
      if (field == "parent") return r->mutable_parent();
      if (field == "lower") return r->mutable_lower();
      if (field == "upper") return r->mutable_upper();
      if (field == "diag") return r->mutable_diag();
      if (field == "rhs") return r->mutable_rhs();
      if (field == "lengths") return r->mutable_lengths();
      break;
    }
    case Kind::kBlockTridiagonal: {
      auto* r = h.mutable_block_tridiagonal();
      if (field == "a_c") return r->mutable_a_c();
      if (field == "c_c") return r->mutable_c_c();
      if (field == "b_c") return r->mutable_b_c();
      if (field == "c_a") return r->mutable_c_a();
      if (field == "c_b") return r->mutable_c_b();
      if (field == "f") return r->mutable_f();
      if (field == "y0") return r->mutable_y0();
      break;
    }
    case Kind::kDense: {
      auto* r = h.mutable_dense();
      if (field == "a") return r->mutable_a();
      if (field == "b") return r->mutable_b();
      break;
    }
  }
  return nullptr;
}

v1::RegionRef* MutableXRegion(v1::StreamRequest& h, Kind k) {
  switch (k) {
    case Kind::kTridiagonal: return h.mutable_tridiagonal()->mutable_x_region();
    case Kind::kTree: return h.mutable_tree()->mutable_x_region();
    case Kind::kBlockTridiagonal: return h.mutable_block_tridiagonal()->mutable_x_region();
    case Kind::kDense: return h.mutable_dense()->mutable_x_region();
  }
  return nullptr;
}

void SetOptions(v1::StreamRequest& h, Kind k, const JobOptions& o, v1::DType dt) {
  const v1::Layout layout = o.interleaved ? v1::INTERLEAVED : v1::FLAT;
  switch (k) {
    case Kind::kTridiagonal: {
      auto* r = h.mutable_tridiagonal();
      r->set_dtype(dt);
      r->set_layout(layout);
      r->set_method(o.method);
      r->set_skip_residual(o.skip_residual);
      break;
    }
    case Kind::kTree: {
      auto* r = h.mutable_tree();
      r->set_dtype(dt);
      r->set_layout(layout);
      r->set_method(o.method);
      r->set_skip_residual(o.skip_residual);
      break;
    }
    case Kind::kBlockTridiagonal: {
      auto* r = h.mutable_block_tridiagonal();
      r->set_dtype(dt);
      r->set_method(o.method);
      if (o.max_iterations) r->set_max_iterations(*o.max_iterations);
      if (o.tol) r->set_tol(*o.tol);
      r->set_scale_rows(o.scale_rows);
      r->set_residual_history(o.residual_history);
      break;
    }
    case Kind::kDense: {
      auto* r = h.mutable_dense();
      r->set_dtype(dt);
      r->set_method(o.method);
      r->set_skip_residual(o.skip_residual);
      break;
    }
  }
}

// A solve's answer with the statuses of the systems that are not OK only (the client fills in
// the rest): 65,536 statuses cost a call through shared memory ~1 ms of encoding and decoding.
void SetSparseStatus(v1::StreamRequest& h, Kind k) {
  switch (k) {
    case Kind::kTridiagonal: h.mutable_tridiagonal()->set_sparse_status(true); break;
    case Kind::kTree: h.mutable_tree()->set_sparse_status(true); break;
    case Kind::kBlockTridiagonal: h.mutable_block_tridiagonal()->set_sparse_status(true); break;
    case Kind::kDense: h.mutable_dense()->set_sparse_status(true); break;
  }
}

void ReadSummary(const v1::SolveSummary& s, Summary* out) {
  out->method = s.method();
  out->backend = s.backend();
  out->request_id = s.request_id();
  out->systems = s.systems();
  out->ok = s.ok();
  out->singular = s.singular();
  out->not_converged = s.not_converged();
  out->diverged = s.diverged();
  out->iterations = s.iterations();
  out->residual = s.residual();
  out->handle = s.handle();
  out->right_hand_sides = s.right_hand_sides();
  out->batched_with = s.batched_with();
  const auto& t = s.timings();
  out->timings.receive_us = t.receive_us();
  out->timings.queue_us = t.queue_us();
  out->timings.h2d_us = t.h2d_us();
  out->timings.compute_us = t.compute_us();
  out->timings.d2h_us = t.d2h_us();
  out->timings.residual_us = t.residual_us();
  out->timings.server_total_us = t.total_us();
  out->residual_history.clear();
  for (const auto& q : s.residual_history())
    out->residual_history.push_back({q.iteration(), q.residual()});
}

Progress ReadProgress(const v1::Progress& p) {
  Progress out;
  switch (p.phase()) {
    case v1::Progress::RECEIVED: out.phase = "received"; break;
    case v1::Progress::QUEUED: out.phase = "queued"; break;
    case v1::Progress::SOLVING: out.phase = "solving"; break;
    case v1::Progress::SENDING: out.phase = "sending"; break;
    default: out.phase = "unknown"; break;
  }
  out.bytes_done = p.bytes_done();
  out.bytes_total = p.bytes_total();
  out.iteration = p.iteration();
  out.max_iterations = p.max_iterations();
  if (p.has_residual()) out.residual = p.residual();
  out.tol = p.tol();
  out.elapsed_s = p.elapsed_s();
  return out;
}

// The most bytes a SolveWithProgress request carries inline (the server's default message
// limit, less room for the rest of the message).
constexpr int64_t kProgressInlineBytes = (int64_t{64} << 20) - (int64_t{64} << 10);

// Moves the family's request, built in a stream header, into another message holding the same
// family fields (ProgressRequest, CreateSystemRequest).
template <typename Message>
void MoveFamily(Kind kind, v1::StreamRequest& header, Message& req) {
  switch (kind) {
    case Kind::kTridiagonal: req.mutable_tridiagonal()->Swap(header.mutable_tridiagonal()); break;
    case Kind::kTree: req.mutable_tree()->Swap(header.mutable_tree()); break;
    case Kind::kBlockTridiagonal:
      req.mutable_block_tridiagonal()->Swap(header.mutable_block_tridiagonal());
      break;
    case Kind::kDense: req.mutable_dense()->Swap(header.mutable_dense()); break;
  }
}

}  // namespace

absl::StatusOr<Kind> ParseKind(absl::string_view name) {
  if (name == "tridiagonal") return Kind::kTridiagonal;
  if (name == "tree") return Kind::kTree;
  if (name == "block-tridiagonal") return Kind::kBlockTridiagonal;
  if (name == "dense") return Kind::kDense;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown kind '", name, "' (expected tridiagonal, tree, block-tridiagonal or dense)"));
}

absl::string_view KindName(Kind k) {
  switch (k) {
    case Kind::kTridiagonal: return "tridiagonal";
    case Kind::kTree: return "tree";
    case Kind::kBlockTridiagonal: return "block-tridiagonal";
    case Kind::kDense: return "dense";
  }
  return "?";
}

bool IsIndexArray(absl::string_view name) { return name == "parent" || name == "lengths"; }

const std::vector<std::string>& ArrayNames(Kind k) {
  static const std::vector<std::string> tri = {"d", "a", "b", "c", "lengths", "abc"};
  static const std::vector<std::string> tree = {"rhs", "parent", "lower", "upper", "diag",
                                                 "lengths"};
  static const std::vector<std::string> block = {"f", "aC", "cC", "bC", "cA", "cB", "y0"};
  static const std::vector<std::string> dense = {"b", "A"};
  switch (k) {
    case Kind::kTridiagonal: return tri;
    case Kind::kTree: return tree;
    case Kind::kBlockTridiagonal: return block;
    case Kind::kDense: return dense;
  }
  return tri;
}

absl::string_view SolveStatusName(SolveStatus s) {
  switch (s) {
    case SolveStatus::kOk: return "ok";
    case SolveStatus::kSingular: return "singular";
    case SolveStatus::kNotConverged: return "not_converged";
    case SolveStatus::kDiverged: return "diverged";
  }
  return "?";
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const Client::Options& o) {
  if (!Client::UsesTls(o)) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_ca_file.empty()) {
    auto ca = ReadPem(o.tls_ca_file, "TLS CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  if (!o.tls_cert_file.empty() || !o.tls_key_file.empty()) {
    auto cert = ReadPem(o.tls_cert_file, "TLS client certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(o.tls_key_file, "TLS client key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

absl::Status Client::RegisterMemory(const SharedMemory& memory, const std::string& name) {
  if (!impl_->setup.ok()) return impl_->setup;
  return impl_->Register(memory, name.empty() ? memory.key().substr(1) : name);
}

absl::Status Client::UnregisterMemory(const SharedMemory& memory) {
  if (!impl_->setup.ok()) return impl_->setup;
  return impl_->Unregister(memory.data());
}

absl::Status Client::RegisterCudaMemory(const CudaMemory& memory, const std::string& name,
                                        double ttl_s) {
  if (!impl_->setup.ok()) return impl_->setup;
  return impl_->RegisterCuda(memory, name, ttl_s);
}

absl::Status Client::UnregisterCudaMemory(const CudaMemory& memory) {
  if (!impl_->setup.ok()) return impl_->setup;
  return impl_->Unregister(static_cast<const std::byte*>(memory.data));
}

std::string Client::SharedMemoryState() const {
  std::lock_guard<std::mutex> lock(impl_->shm_mu);
  if (impl_->options.transport == Transport::kGrpc || impl_->shm == Impl::Shm::kNo) return "grpc";
  return impl_->shm == Impl::Shm::kYes ? "shared-memory" : "untried";
}

std::string Client::RingState() const { return impl_->RingState(); }

grpc::ChannelArguments ChannelArgs(const Client::Options& options, bool own_connection) {
  grpc::ChannelArguments args;
  if (!options.tls_server_name.empty())
    args.SetSslTargetNameOverride(options.tls_server_name);
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 << 20);  // as the server: bulk arrays
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  // A failed connection attempt is tried again after this (gRPC's default: 1 s, growing 1.6
  // times an attempt up to 120 s): a call waiting for its connection (connect_timeout_s) gets
  // the next attempt within its wait.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  return args;
}

void Client::Impl::AwaitConnection(grpc::Channel& ch,
                                   std::chrono::system_clock::time_point deadline) const {
  grpc_connectivity_state state = ch.GetState(/*try_to_connect=*/true);
  if (state == GRPC_CHANNEL_READY || options.connect_timeout_s <= 0) return;
  const auto now = std::chrono::system_clock::now();
  const double wait_s = std::min(options.connect_timeout_s, 1e6);
  auto until = now + std::chrono::microseconds(int64_t(wait_s * 1e6));
  if (deadline != std::chrono::system_clock::time_point::max())
    until = std::min(until, deadline <= now ? now : now + (deadline - now) / 2);
  while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_SHUTDOWN) {
    if (!ch.WaitForStateChange(state, until)) return;
    state = ch.GetState(/*try_to_connect=*/true);
  }
}

Client::Client(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  auto creds = Credentials(options);
  if (!creds.ok()) {
    impl_->setup = creds.status();
    creds = grpc::InsecureChannelCredentials();  // never used: every call returns `setup`
  }
  impl_->credentials = *creds;
  auto spec = internal::ParseTarget(options.target);
  if (!spec.ok()) {
    impl_->setup = spec.status();
    spec = internal::TargetSpec{.dial = options.target};  // never used, as above
  }
  impl_->replicas = std::make_unique<internal::Replicas>(
      *std::move(spec), *creds, ChannelArgs(options, options.own_connection), options);
  impl_->channel = impl_->replicas->channel();
  impl_->stub = v1::Solver::NewStub(impl_->channel);
  impl_->health = grpc::health::v1::Health::NewStub(impl_->channel);
}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(Options options) {
  auto c = std::make_unique<Client>(std::move(options));
  if (!c->impl_->setup.ok()) return c->impl_->setup;
  return c;
}

namespace {

// A copy of `v` in type `want`.
absl::StatusOr<NdArray> Converted(const std::string& name, const ArrayView& v, DType want) {
  if (internal::InCudaMemory(v.data, v.bytes()))
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": is ", DTypeName(v.dtype), " in CUDA memory, and it travels as ", DTypeName(want),
        ": the client cannot convert device memory (give it that type)"));
  NdArray tmp;
  tmp.dtype = v.dtype;
  tmp.shape = v.shape;
  tmp.data.resize(static_cast<size_t>(v.bytes()));
  std::memcpy(tmp.data.data(), v.data, tmp.data.size());
  auto c = tmp.ConvertTo(want);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", c.status().message()));
  return c;
}

void SetAuth(grpc::ClientContext& ctx, const Client::Options& o, const JobOptions& j) {
  if (j.timeout_s)
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(int64_t(*j.timeout_s * 1e6)));
  if (!j.request_id.empty()) ctx.AddMetadata("x-request-id", j.request_id);
  if (!o.token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.token);
}

// Appends an answer's statuses, given one a system or sparse (the systems not OK). A sparse
// form that names a system outside its batch, out of order, or without its status is the
// server's fault: DATA_LOSS, never a status read from past the batch.
absl::Status AppendStatuses(const v1::SolveResponse& resp, std::vector<SolveStatus>* out) {
  if (!resp.has_sparse()) {
    out->reserve(out->size() + size_t(resp.status_size()));
    for (int s : resp.status()) out->push_back(static_cast<SolveStatus>(s));
    return absl::OkStatus();
  }
  const v1::SparseStatus& sp = resp.sparse();
  if (sp.systems() < 0 || sp.index_size() != sp.status_size())
    return absl::DataLossError("the server's sparse statuses are malformed");
  const size_t at = out->size();
  int64_t last = -1;
  for (int i = 0; i < sp.index_size(); ++i) {
    if (sp.index(i) <= last || sp.index(i) >= sp.systems())
      return absl::DataLossError("the server's sparse statuses name a system out of order");
    last = sp.index(i);
  }
  out->resize(at + size_t(sp.systems()), SolveStatus::kOk);
  for (int i = 0; i < sp.index_size(); ++i)
    (*out)[at + size_t(sp.index(i))] = static_cast<SolveStatus>(sp.status(i));
  return absl::OkStatus();
}

absl::Status ReadResponse(const v1::SolveResponse& resp, DType dtype, Result* result) {
  result->x.dtype = dtype;
  result->x.shape.assign(resp.x().shape().begin(), resp.x().shape().end());
  const std::string& data = resp.x().data();
  result->x.data = internal::FreshBuffer(int64_t(data.size()));
  std::memcpy(result->x.data.data(), data.data(), data.size());
  if (auto st = AppendStatuses(resp, &result->status); !st.ok()) return st;
  ReadSummary(resp.summary(), &result->summary);
  return absl::OkStatus();
}

// A unary call's answer: `sync` makes the call and waits; `start` begins it on a completion
// queue instead. A call whose arrays all travel by reference polls for its answer while it is
// expected (Options::rpc_spin_us), so that the answer is taken on a running core.
template <typename Response, typename Sync, typename Start>
grpc::Status AwaitUnary(double cap, std::atomic<double>& last_wait_us, bool by_reference,
                        Sync sync, Start start, Response* resp) {
  const double last = last_wait_us.load(std::memory_order_relaxed);
  const double spin_us =
      by_reference && cap > 0 && last >= 0 && last <= cap ? std::min(2 * last, cap) : 0;
  const auto t0 = Clock::now();
  grpc::Status st;
  if (spin_us <= 0) {
    st = sync();
  } else {
    grpc::CompletionQueue cq;
    auto rpc = start(&cq);
    int tag = 0;
    rpc->Finish(resp, &st, &tag);
    void* got = nullptr;
    bool ok = false, done = false;
    const auto until = t0 + std::chrono::microseconds(int64_t(spin_us));
    while (!done && Clock::now() < until)
      done = cq.AsyncNext(&got, &ok, std::chrono::system_clock::now()) ==
             grpc::CompletionQueue::GOT_EVENT;
    if (!done) cq.Next(&got, &ok);
    cq.Shutdown();
    while (cq.Next(&got, &ok)) {
    }
  }
  if (by_reference)
    last_wait_us.store(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count(),
        std::memory_order_relaxed);
  return st;
}

SystemInfo ReadSystemInfo(const v1::SystemInfo& i) {
  SystemInfo s;
  s.handle = i.handle();
  s.label = i.label();
  s.family = i.family();
  s.method = i.method();
  s.prepared = i.prepared();
  s.dtype = i.dtype() == v1::FLOAT32 ? DType::kFloat32 : DType::kFloat64;
  s.interleaved = i.layout() == v1::INTERLEAVED;
  s.rhs_shape.assign(i.rhs_shape().begin(), i.rhs_shape().end());
  s.systems = i.systems();
  s.variable = i.variable();
  s.bytes = i.bytes();
  s.solves = i.solves();
  s.updates = i.updates();
  s.ttl_s = i.ttl_s();
  s.idle_s = i.idle_s();
  return s;
}

// The arrays of a job as they will travel: float32 only when every floating-point array is
// float32, float64 otherwise (never narrowed: a float32 right-hand side used to turn float64
// coefficients into float32 silently), parent and lengths int32.
absl::Status Marshal(const Job& job, bool rhs_optional, DType* dtype,
                     std::vector<std::pair<std::string, ArrayView>>* send,
                     std::vector<NdArray>* converted) {
  // Options the family would ignore are refused, never silently dropped.
  const JobOptions& o = job.options;
  const bool block = job.kind == Kind::kBlockTridiagonal;
  const char* ignored = !block && o.tol                                       ? "tol"
                        : !block && o.max_iterations                          ? "max_iterations"
                        : !block && o.scale_rows                              ? "scale_rows"
                        : block && o.skip_residual                            ? "skip_residual"
                        : !block && o.residual_history                        ? "residual_history"
                        : (block || job.kind == Kind::kDense) && o.interleaved ? "interleaved"
                                                                              : nullptr;
  if (ignored != nullptr)
    return absl::InvalidArgumentError(absl::StrCat(ignored, ": a ", KindName(job.kind),
                                                   " job does not take this option"));
  const auto& names = ArrayNames(job.kind);
  const std::string& rhs_name = names[0];
  auto rhs_it = job.arrays.find(rhs_name);
  if (rhs_it == job.arrays.end() && !rhs_optional)
    return absl::InvalidArgumentError(absl::StrCat(rhs_name, ": missing (a ", KindName(job.kind),
                                                   " job needs ", absl::StrJoin(names, ", "), ")"));
  bool any = false, any64 = false;
  for (const auto& [name, view] : job.arrays) {
    if (IsIndexArray(name)) continue;
    if (view.dtype != DType::kFloat64 && view.dtype != DType::kFloat32)
      return absl::InvalidArgumentError(absl::StrCat(name, ": is ", DTypeName(view.dtype),
                                                     ", expected float64 or float32"));
    any = true;
    any64 |= view.dtype == DType::kFloat64;
  }
  if (!any) return absl::InvalidArgumentError("no floating-point arrays");
  *dtype = any64 ? DType::kFloat64 : DType::kFloat32;
  converted->reserve(job.arrays.size());
  for (const auto& [name, view] : job.arrays) {
    if (std::find(names.begin(), names.end(), name) == names.end() &&
        !(job.kind == Kind::kDense && name == "a"))
      return absl::InvalidArgumentError(absl::StrCat("unknown array '", name, "' for a ",
                                                     KindName(job.kind), " job (expected ",
                                                     absl::StrJoin(names, ", "), ")"));
    const DType want = IsIndexArray(name) ? DType::kInt32 : *dtype;
    ArrayView v = view;
    if (v.dtype != want) {
      auto c = Converted(name, v, want);
      if (!c.ok()) return c.status();
      converted->push_back(*std::move(c));
      v = converted->back().view();
    }
    send->emplace_back(FieldName(job.kind, name), v);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Result> Client::Solve(const Job& job) {
  if (!impl_->setup.ok()) return impl_->setup;
  const auto t0 = Clock::now();
  DType dtype;
  std::vector<std::pair<std::string, ArrayView>> send;
  std::vector<NdArray> converted;
  if (auto st = Marshal(job, false, &dtype, &send, &converted); !st.ok()) return st;
  const std::string rhs_field = FieldName(job.kind, ArrayNames(job.kind)[0]);
  int64_t x_bytes = 0;
  std::vector<ArrayView> views;
  for (const auto& [f, v] : send) {
    views.push_back(v);
    if (f == rhs_field) x_bytes = v.bytes();
  }
  void* x_out = job.options.x_out;
  if (auto r = impl_->SolveOnRing(ring::kOpSolve, job.kind, dtype, send, rhs_field, job.options,
                                  "", x_out, x_bytes)) {
    if (r->ok())
      (*r)->summary.timings.client_total_us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    return *std::move(r);
  }
  if (const int pieces = impl_->Pieces(job, send, x_out, x_bytes); pieces > 1) {
    auto r = impl_->SolveInPieces(job, dtype, send, x_out, x_bytes, pieces);
    if (r.ok())
      r->summary.timings.client_total_us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    return r;
  }
  auto placed = impl_->Place(views, x_out, x_bytes);
  if (!placed.ok()) return placed.status();

  v1::StreamRequest header;
  const v1::DType dt = dtype == DType::kFloat64 ? v1::FLOAT64 : v1::FLOAT32;
  SetOptions(header, job.kind, job.options, dt);
  SetSparseStatus(header, job.kind);
  const bool with_progress =
      job.options.progress && placed->inline_bytes <= kProgressInlineBytes;
  const bool stream =
      !with_progress && placed->inline_bytes > impl_->options.stream_threshold_bytes;
  if (stream) {  // every array's bytes go in chunks, x comes back in chunks
    placed->refs.assign(send.size(), std::nullopt);
    placed->x_ref.reset();
  }
  for (size_t i = 0; i < send.size(); ++i) {
    const auto& [field, v] = send[i];
    v1::Array* a = MutableField(header, job.kind, field);
    for (int64_t d : v.shape) a->add_shape(d);
    if (placed->refs[i]) {
      *a->mutable_region() = *placed->refs[i];
    } else if (!stream) {
      a->set_data(v.data, static_cast<size_t>(v.bytes()));
    }
  }
  if (placed->x_ref && !stream) *MutableXRegion(header, job.kind) = *placed->x_ref;

  grpc::ClientContext ctx;
  SetAuth(ctx, impl_->options, job.options);
  impl_->AwaitConnection(ctx);

  Result result;
  result.summary.streamed = stream;
  const DType out_type = dtype;
  if (with_progress) {
    v1::ProgressRequest req;
    MoveFamily(job.kind, header, req);
    req.set_interval_s(job.options.progress_interval_s);
    auto reader = impl_->stub->SolveWithProgress(&ctx, req);
    v1::ProgressResponse msg;
    bool answered = false;
    while (reader->Read(&msg)) {
      if (msg.has_progress()) {
        job.options.progress(ReadProgress(msg.progress()));
      } else if (msg.has_answer()) {
        if (auto st = ReadResponse(msg.answer(), out_type, &result); !st.ok()) return st;
        answered = true;
      }
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) return FromGrpc(st);
    if (!answered) return absl::InternalError("SolveWithProgress ended without an answer");
    if (auto dst = impl_->DeliverX(*placed, x_out, x_bytes, &result.x, &result.summary.timings);
        !dst.ok())
      return dst;
    result.summary.transport = placed->transport;
  } else if (!stream) {
    v1::SolveResponse resp;
    grpc::Status st;
    v1::Solver::Stub* to = impl_->stub.get();
    auto await = [&](auto sync, auto start) {
      return AwaitUnary(impl_->options.rpc_spin_us, impl_->last_reference_wait_us,
                        placed->transport == "shared-memory", sync, start, &resp);
    };
    switch (job.kind) {
      case Kind::kTridiagonal: {
        const auto& r = header.tridiagonal();
        st = await([&] { return to->SolveTridiagonal(&ctx, r, &resp); },
                   [&](grpc::CompletionQueue* cq) { return to->AsyncSolveTridiagonal(&ctx, r, cq); });
        break;
      }
      case Kind::kTree: {
        const auto& r = header.tree();
        st = await([&] { return to->SolveTree(&ctx, r, &resp); },
                   [&](grpc::CompletionQueue* cq) { return to->AsyncSolveTree(&ctx, r, cq); });
        break;
      }
      case Kind::kBlockTridiagonal: {
        const auto& r = header.block_tridiagonal();
        st = await(
            [&] { return to->SolveBlockTridiagonal(&ctx, r, &resp); },
            [&](grpc::CompletionQueue* cq) { return to->AsyncSolveBlockTridiagonal(&ctx, r, cq); });
        break;
      }
      case Kind::kDense: {
        const auto& r = header.dense();
        st = await([&] { return to->SolveDense(&ctx, r, &resp); },
                   [&](grpc::CompletionQueue* cq) { return to->AsyncSolveDense(&ctx, r, cq); });
        break;
      }
    }
    if (!st.ok()) return FromGrpc(st);
    if (auto read = ReadResponse(resp, out_type, &result); !read.ok()) return read;
    if (auto dst = impl_->DeliverX(*placed, x_out, x_bytes, &result.x, &result.summary.timings);
        !dst.ok())
      return dst;
    result.summary.transport = placed->transport;
  } else {
    auto rw = impl_->stub->SolveStream(&ctx);
    bool sent = rw->Write(header);
    const int64_t chunk = std::max<int64_t>(impl_->options.chunk_bytes, 1024);
    for (const auto& [field, v] : send) {
      const auto* bytes = static_cast<const char*>(v.data);
      for (int64_t off = 0; sent && off < v.bytes(); off += chunk) {
        v1::StreamRequest msg;
        v1::Chunk* c = msg.mutable_chunk();
        c->set_array(field);
        c->set_offset(off);
        c->set_data(bytes + off, static_cast<size_t>(std::min(chunk, v.bytes() - off)));
        sent = rw->Write(msg);
      }
    }
    rw->WritesDone();
    v1::StreamResponse msg;
    bool first = true;
    while (rw->Read(&msg)) {
      if (first) {
        result.x.dtype = out_type;
        result.x.shape.assign(msg.x_shape().begin(), msg.x_shape().end());
        int64_t e = 1;
        for (int64_t d : result.x.shape) e *= d;
        result.x.data.resize(static_cast<size_t>(e * DTypeSize(out_type)));
        first = false;
      }
      if (msg.has_chunk()) {
        const auto& c = msg.chunk();
        if (c.offset() < 0 || c.offset() + int64_t(c.data().size()) > int64_t(result.x.data.size()))
          return absl::DataLossError("the server sent a chunk outside x");
        std::memcpy(result.x.data.data() + c.offset(), c.data().data(), c.data().size());
      }
      for (int s : msg.status()) result.status.push_back(static_cast<SolveStatus>(s));
      if (msg.has_summary()) ReadSummary(msg.summary(), &result.summary);
    }
    grpc::Status st = rw->Finish();
    if (!st.ok()) return FromGrpc(st);
    if (auto dst = impl_->DeliverX(*placed, x_out, x_bytes, &result.x, &result.summary.timings);
        !dst.ok())
      return dst;
    result.summary.transport = "grpc-stream";
  }
  result.summary.timings.client_total_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return result;
}

// ---- a batch in pieces through the server's memory ----------------------------------------

namespace {

// The pieces' answers as one: statuses in order, outcomes and server times summed, the worst
// residual and iteration count.
absl::Status MergePieces(const std::vector<v1::SolveResponse>& answers, Result* result) {
  Summary& sum = result->summary;
  for (size_t k = 0; k < answers.size(); ++k) {
    const v1::SolveResponse& a = answers[k];
    if (auto st = AppendStatuses(a, &result->status); !st.ok()) return st;
    if (k == 0) {
      ReadSummary(a.summary(), &sum);
      continue;
    }
    Summary p;
    ReadSummary(a.summary(), &p);
    sum.systems += p.systems;
    sum.ok += p.ok;
    sum.singular += p.singular;
    sum.not_converged += p.not_converged;
    sum.diverged += p.diverged;
    sum.iterations = std::max(sum.iterations, p.iterations);
    // The worst piece's (NaN in every piece where the residual was skipped).
    if (!(p.residual <= sum.residual)) sum.residual = p.residual;
    Timings& t = sum.timings;
    t.receive_us += p.timings.receive_us;
    t.queue_us += p.timings.queue_us;
    t.h2d_us += p.timings.h2d_us;
    t.compute_us += p.timings.compute_us;
    t.d2h_us += p.timings.d2h_us;
    t.residual_us += p.timings.residual_us;
    t.server_total_us += p.timings.server_total_us;
  }
  return absl::OkStatus();
}

}  // namespace

int Client::Impl::Pieces(const Job& job, const std::vector<std::pair<std::string, ArrayView>>& send,
                         void* x_out, int64_t x_bytes) {
  if (options.pipeline_pieces == 0 || options.pipeline_pieces == 1 ||
      options.pipeline_piece_bytes <= 0)
    return 0;
  if (job.kind != Kind::kTridiagonal && job.kind != Kind::kTree) return 0;
  if (job.options.interleaved || job.options.progress) return 0;
  if (replicas && replicas->balanced()) return 0;
  const std::string rhs_field = FieldName(job.kind, ArrayNames(job.kind)[0]);
  int64_t moved = x_bytes, batch = -1;
  for (const auto& [field, v] : send) {
    if (field == rhs_field && v.shape.size() >= 2) batch = v.shape[0];
    // Arrays already in registered memory, and variable sizes, go the whole-job way.
    if (field == "lengths" || RefOf(v.data, v.bytes())) return 0;
    moved += v.bytes();
  }
  if (batch < 2 || (x_out != nullptr && RefOf(x_out, x_bytes))) return 0;
  for (const auto& [field, v] : send)
    if (v.shape.size() >= 2 && v.shape[0] != batch) return 0;
  if (options.transport == Transport::kAuto) {
    std::lock_guard<std::mutex> lock(shm_mu);
    if (shm != Shm::kNo || moved < options.streams_min_bytes) return 0;
  } else if (options.transport != Transport::kStreams) {
    return 0;
  }
  if (moved / options.pipeline_piece_bytes < 2 || batch < 2) return 0;
  const int64_t k = std::min<int64_t>(
      {moved / options.pipeline_piece_bytes, int64_t(PiecesWanted()), batch});
  return k >= 2 ? int(k) : 0;
}

int Client::Impl::PiecesWanted() {
  if (options.pipeline_pieces >= 0) return options.pipeline_pieces;
  return ServerSolvesOnGpu() ? kAutoPieces : 0;
}

bool Client::Impl::ServerSolvesOnGpu() {
  std::lock_guard<std::mutex> lock(backend_mu);
  if (on_gpu == OnGpu::kUnknown) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AwaitConnection(ctx);
    v1::ServerInfo info;
    // Unanswered: as if on a GPU (the pieces are what the options ask for); not remembered.
    if (!stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok()) return true;
    on_gpu = info.backend() == "cpu" ? OnGpu::kNo : OnGpu::kYes;
  }
  return on_gpu == OnGpu::kYes;
}

absl::StatusOr<Result> Client::Impl::SolveInPieces(
    const Job& job, DType dtype, const std::vector<std::pair<std::string, ArrayView>>& send,
    void* x_out, int64_t x_bytes, int pieces) {
  const std::string rhs_field = FieldName(job.kind, ArrayNames(job.kind)[0]);
  // Each array whole in the region, as the serial path lays it out; those with a row per
  // system (the rest, a tree's parent, go with the first piece) are split by rows.
  struct Slot {
    const std::string* field;
    const ArrayView* v;
    int64_t at, row;  // row: bytes a system (0: not split)
  };
  std::vector<Slot> slots;
  std::vector<int64_t> shape;
  int64_t need = 0;
  for (const auto& [field, v] : send) {
    if (field == rhs_field) shape = v.shape;
    const int64_t row = v.shape.size() >= 2 ? v.bytes() / v.shape[0] : 0;
    slots.push_back({&field, &v, need, row});
    need += (v.bytes() + 63) / 64 * 64;
  }
  const int64_t batch = shape[0], x_at = need, x_row = x_bytes / batch;
  need += x_bytes;
  absl::Status error;
  std::unique_ptr<Remote> remote = AcquireRemoteOrNull(need, &error);
  if (!remote) return error;
  Staging staging(this, std::move(*remote));
  const std::string& region = staging.remote().name;
  auto ref = [&](v1::RegionRef* r, int64_t offset, int64_t bytes) {
    r->set_region(region);
    r->set_offset(offset);
    r->set_bytes(bytes);
  };
  auto first = [&](int k) { return batch * k / pieces; };

  Result result;
  result.x.dtype = dtype;
  result.x.shape = shape;
  // x's own array is made while the first pieces go up; the first download waits for it.
  std::future<std::vector<std::byte>> x_fresh;
  if (x_out == nullptr) x_fresh = internal::FreshBufferAsync(x_bytes);
  auto* x_dst = static_cast<std::byte*>(x_out);
  std::vector<v1::SolveResponse> answers(static_cast<size_t>(pieces));

  v1::StreamRequest header;
  SetOptions(header, job.kind, job.options, dtype == DType::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  SetSparseStatus(header, job.kind);
  PipelineStages stages;
  stages.upload = [&](int k) {
    const int64_t s0 = first(k), s1 = first(k + 1);
    std::vector<Piece> parts;
    for (const Slot& s : slots) {
      const auto* src = static_cast<const std::byte*>(s.v->data);
      if (s.row > 0)
        parts.push_back({src + s0 * s.row, s.at + s0 * s.row, (s1 - s0) * s.row});
      else if (k == 0)
        parts.push_back({src, s.at, s.v->bytes()});
    }
    return Upload(region, parts, /*piece=*/true);
  };
  stages.download = [&](int k) {
    if (x_dst == nullptr) {
      result.x.data = x_fresh.get();
      x_dst = result.x.data.data();
    }
    const int64_t s0 = first(k), s1 = first(k + 1);
    return Download(region, x_at + s0 * x_row, (s1 - s0) * x_row, x_dst + s0 * x_row,
                    /*piece=*/true);
  };
  stages.solve = [&](int k) -> absl::Status {
    const int64_t s0 = first(k), s1 = first(k + 1);
    v1::StreamRequest h = header;
    for (const Slot& s : slots) {
      v1::Array* a = MutableField(h, job.kind, *s.field);
      for (size_t i = 0; i < s.v->shape.size(); ++i)
        a->add_shape(i == 0 && s.row > 0 ? s1 - s0 : s.v->shape[i]);
      if (s.row > 0)
        ref(a->mutable_region(), s.at + s0 * s.row, (s1 - s0) * s.row);
      else
        ref(a->mutable_region(), s.at, s.v->bytes());
    }
    ref(MutableXRegion(h, job.kind), x_at + s0 * x_row, (s1 - s0) * x_row);
    grpc::ClientContext ctx;
    SetAuth(ctx, options, job.options);
    AwaitConnection(ctx);
    grpc::Status st = job.kind == Kind::kTridiagonal
                          ? stub->SolveTridiagonal(&ctx, h.tridiagonal(), &answers[size_t(k)])
                          : stub->SolveTree(&ctx, h.tree(), &answers[size_t(k)]);
    if (st.ok()) return absl::OkStatus();
    // The server counts the piece's systems from 0: say which they are.
    const absl::Status e = FromGrpc(st);
    return absl::Status(e.code(), absl::StrCat("systems [", s0, ", ", s1,
                                               ") of the batch, sent as one piece and counted "
                                               "from 0: ",
                                               e.message()));
  };
  double upload_us = 0, download_us = 0;
  if (auto st = RunPipeline(pieces, stages, &upload_us, &download_us); !st.ok()) return st;
  if (auto st = MergePieces(answers, &result); !st.ok()) return st;
  result.summary.timings.upload_us = upload_us;
  result.summary.timings.download_us = download_us;
  result.summary.transport = "streams";
  result.summary.pieces = pieces;
  return result;
}

// ---- persistent systems ----------------------------------------------------------------------

namespace {

// Updates named as the caller named them (the server takes the block family's proto and
// thesis spellings alike), in `dtype` where one is given (a solve's right-hand side's: the
// system's), as given otherwise. The request copies the bytes, so `converted` may go after.
using RefFinder = std::function<std::optional<v1::RegionRef>(const void*, int64_t)>;

absl::Status AddUpdates(std::optional<DType> dtype, const Updates& update,
                        google::protobuf::RepeatedPtrField<v1::NamedArray>* out,
                        std::vector<NdArray>* converted, const RefFinder& ref_of) {
  for (const auto& [name, view] : update) {
    const DType want = IsIndexArray(name) ? DType::kInt32 : dtype.value_or(view.dtype);
    ArrayView v = view;
    if (v.dtype != want) {
      auto c = Converted(name, v, want);
      if (!c.ok()) return c.status();
      converted->push_back(*std::move(c));
      v = converted->back().view();
    }
    v1::NamedArray* a = out->Add();
    a->set_name(name);
    for (int64_t d : v.shape) a->mutable_array()->add_shape(d);
    if (auto ref = ref_of(v.data, v.bytes()))
      *a->mutable_array()->mutable_region() = *ref;
    else
      a->mutable_array()->set_data(v.data, static_cast<size_t>(v.bytes()));
  }
  return absl::OkStatus();
}

// One step by handle: updates (in the right-hand side's type), then the right-hand side as
// given (the system's type is the server's to know; it refuses one of the wrong size).
// rhs_ref / x_ref: where the right-hand side lies and x goes in shared memory, if they do.
absl::Status FillStep(const ArrayView& rhs, const Updates& update, const RefFinder& ref_of,
                      const std::optional<v1::RegionRef>& rhs_ref,
                      const std::optional<v1::RegionRef>& x_ref, v1::SolveSystemRequest* req) {
  std::vector<NdArray> converted;
  if (auto st = AddUpdates(rhs.dtype, update, req->mutable_update(), &converted, ref_of); !st.ok())
    return st;
  for (int64_t d : rhs.shape) req->mutable_rhs()->add_shape(d);
  if (rhs_ref)
    *req->mutable_rhs()->mutable_region() = *rhs_ref;
  else
    req->mutable_rhs()->set_data(rhs.data, static_cast<size_t>(rhs.bytes()));
  if (x_ref) *req->mutable_x_region() = *x_ref;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SystemInfo> Client::CreateSystem(const Job& job, const SystemOptions& options) {
  if (!impl_->setup.ok()) return impl_->setup;
  DType dtype;
  std::vector<std::pair<std::string, ArrayView>> send;
  std::vector<NdArray> converted;
  if (auto st = Marshal(job, true, &dtype, &send, &converted); !st.ok()) return st;
  std::vector<ArrayView> views;
  for (const auto& [f, v] : send) views.push_back(v);
  auto placed = impl_->Place(views, nullptr, 0);
  if (!placed.ok()) return placed.status();
  v1::StreamRequest header;
  SetOptions(header, job.kind, job.options, dtype == DType::kFloat64 ? v1::FLOAT64 : v1::FLOAT32);
  for (size_t i = 0; i < send.size(); ++i) {
    const auto& [field, v] = send[i];
    v1::Array* a = MutableField(header, job.kind, field);
    for (int64_t d : v.shape) a->add_shape(d);
    if (placed->refs[i])
      *a->mutable_region() = *placed->refs[i];
    else
      a->set_data(v.data, static_cast<size_t>(v.bytes()));
  }
  v1::CreateSystemRequest req;
  MoveFamily(job.kind, header, req);
  req.set_ttl_s(options.ttl_s);
  req.set_label(options.label);
  grpc::ClientContext ctx;
  SetAuth(ctx, impl_->options, job.options);
  impl_->AwaitConnection(ctx);
  v1::SystemInfo info;
  grpc::Status st = impl_->stub->CreateSystem(&ctx, req, &info);
  if (!st.ok()) return FromGrpc(st);
  SystemInfo created = ReadSystemInfo(info);
  impl_->Remember(created);
  return created;
}

// ---- by handle in pieces through the server's memory -------------------------------------

void Client::Impl::Remember(const SystemInfo& info) {
  std::lock_guard<std::mutex> lock(systems_mu);
  // A client that creates systems without end and leaves them to expire: start over.
  if (systems.size() >= 4096) systems.clear();
  systems[info.handle] = info;
}

void Client::Impl::Forget(const std::string& handle) {
  std::lock_guard<std::mutex> lock(systems_mu);
  systems.erase(handle);
}

std::optional<SystemInfo> Client::Impl::SystemOf(const std::string& handle, const JobOptions& o) {
  {
    std::lock_guard<std::mutex> lock(systems_mu);
    if (auto it = systems.find(handle); it != systems.end()) return it->second;
  }
  grpc::ClientContext ctx;
  SetAuth(ctx, options, o);
  AwaitConnection(ctx);
  v1::ListSystemsResponse resp;
  if (!stub->ListSystems(&ctx, v1::ListSystemsRequest(), &resp).ok()) return std::nullopt;
  std::optional<SystemInfo> found;
  for (const auto& i : resp.systems()) {
    SystemInfo info = ReadSystemInfo(i);
    if (info.handle == handle) found = info;
    Remember(info);
  }
  return found;
}

int Client::Impl::HandlePieces(const std::string& handle, const ArrayView& rhs,
                               const JobOptions& o, bool* by_range, SystemInfo* info) {
  if (options.pipeline_pieces == 0 || options.pipeline_pieces == 1 ||
      options.pipeline_piece_bytes <= 0)
    return 0;
  if (replicas && replicas->balanced()) return 0;
  if (rhs.shape.empty() || RefOf(rhs.data, rhs.bytes()) ||
      (o.x_out != nullptr && RefOf(o.x_out, rhs.bytes())))
    return 0;
  // By handle the pieces go only where asked: on the H100 host 2^24 unknowns by handle took
  // 59-68 ms whole, 59-62 in 2 or 4 pieces and 77-81 in 8 (docs/serving.md, "By handle in
  // pieces"): the two directions share the host's capacity, so overlapping them gains nothing.
  if (options.pipeline_pieces < 0) return 0;
  const int64_t moved = 2 * rhs.bytes();  // the right-hand sides up, x down
  if (options.transport == Transport::kAuto) {
    std::lock_guard<std::mutex> lock(shm_mu);
    if (shm != Shm::kNo || moved < options.streams_min_bytes) return 0;
  } else if (options.transport != Transport::kStreams) {
    return 0;
  }
  if (moved / options.pipeline_piece_bytes < 2) return 0;
  const int64_t most = std::min<int64_t>(moved / options.pipeline_piece_bytes, PiecesWanted());
  if (most < 2) return 0;
  auto system = SystemOf(handle, o);
  // Unknown here (another identity's, or gone), or of another type: the serial path says why.
  if (!system || system->dtype != rhs.dtype) return 0;
  const std::vector<int64_t>& one = system->rhs_shape;
  int64_t rows = 0;
  if (rhs.shape.size() == one.size() + 1 &&
      std::equal(one.begin(), one.end(), rhs.shape.begin() + 1)) {
    rows = rhs.shape[0];  // k right-hand sides, split by them: any family, any layout
    *by_range = false;
  } else if (rhs.shape == one && one.size() == 2 && !system->interleaved &&
             (system->family == "tridiagonal" || system->family == "tree")) {
    rows = one[0];  // one right-hand side of a flat batch, split by its systems
    *by_range = true;
  }
  const int64_t k = std::min(most, rows);
  if (k < 2) return 0;
  *info = *std::move(system);
  return int(k);
}

absl::StatusOr<Result> Client::Impl::SolveSystemInPieces(const std::string& handle,
                                                         const ArrayView& rhs,
                                                         const Updates& update,
                                                         const JobOptions& o, int pieces,
                                                         bool by_range) {
  const auto t0 = Clock::now();
  auto route = replicas->ForHandle(handle);
  if (!route.ok()) return route.status();
  v1::Solver::Stub* to = route->first;
  const auto deadline =
      o.timeout_s ? std::chrono::system_clock::now() +
                        std::chrono::microseconds(int64_t(*o.timeout_s * 1e6))
                  : std::chrono::system_clock::time_point::max();
  // Updates apply to the whole system: first, as the serial step applies them before its
  // solve (in the right-hand side's type, as there).
  if (!update.empty()) {
    v1::UpdateSystemRequest req;
    req.set_handle(handle);
    std::vector<NdArray> converted;
    if (auto st = AddUpdates(rhs.dtype, update, req.mutable_update(), &converted,
                             [this](const void* p, int64_t b) { return RefOf(p, b); });
        !st.ok())
      return st;
    grpc::ClientContext ctx;
    SetAuth(ctx, options, o);
    if (o.timeout_s) ctx.set_deadline(deadline);
    if (!route->second) AwaitConnection(ctx);
    v1::SystemInfo info;
    grpc::Status st = to->UpdateSystem(&ctx, req, &info);
    if (!st.ok()) return internal::Replicas::HandleCallStatus(st, handle, route->second);
  }
  const int64_t rows = rhs.shape[0], row = rhs.bytes() / rows;
  const int64_t x_at = (rhs.bytes() + 63) / 64 * 64;
  absl::Status error;
  std::unique_ptr<Remote> remote = AcquireRemoteOrNull(x_at + rhs.bytes(), &error);
  if (!remote) return error;
  Staging staging(this, std::move(*remote));
  const std::string& region = staging.remote().name;
  auto first = [&](int k) { return rows * k / pieces; };
  Result result;
  result.x.dtype = rhs.dtype;
  result.x.shape = rhs.shape;
  // x's own array is made while the first pieces go up; the first download waits for it.
  std::future<std::vector<std::byte>> x_fresh;
  if (o.x_out == nullptr) x_fresh = internal::FreshBufferAsync(rhs.bytes());
  auto* x_dst = static_cast<std::byte*>(o.x_out);
  const auto* src = static_cast<const std::byte*>(rhs.data);
  std::vector<v1::SolveResponse> answers(static_cast<size_t>(pieces));

  PipelineStages stages;
  stages.upload = [&](int k) {
    const int64_t r0 = first(k), r1 = first(k + 1);
    return Upload(region, {{src + r0 * row, r0 * row, (r1 - r0) * row}}, /*piece=*/true);
  };
  stages.download = [&](int k) {
    if (x_dst == nullptr) {
      result.x.data = x_fresh.get();
      x_dst = result.x.data.data();
    }
    const int64_t r0 = first(k), r1 = first(k + 1);
    return Download(region, x_at + r0 * row, (r1 - r0) * row, x_dst + r0 * row,
                    /*piece=*/true);
  };
  stages.solve = [&](int k) -> absl::Status {
    const int64_t r0 = first(k), r1 = first(k + 1);
    v1::SolveSystemRequest req;
    req.set_handle(handle);
    req.set_skip_residual(o.skip_residual);
    req.set_sparse_status(true);
    v1::Array* a = req.mutable_rhs();
    a->add_shape(r1 - r0);
    for (size_t i = 1; i < rhs.shape.size(); ++i) a->add_shape(rhs.shape[i]);
    auto ref = [&](v1::RegionRef* r, int64_t offset) {
      r->set_region(region);
      r->set_offset(offset);
      r->set_bytes((r1 - r0) * row);
    };
    ref(a->mutable_region(), r0 * row);
    ref(req.mutable_x_region(), x_at + r0 * row);
    if (by_range) {
      req.set_first_system(r0);
      req.set_systems(r1 - r0);
    }
    grpc::ClientContext ctx;
    SetAuth(ctx, options, o);
    if (o.timeout_s) ctx.set_deadline(deadline);
    if (!route->second) AwaitConnection(ctx);
    grpc::Status st = to->SolveSystem(&ctx, req, &answers[size_t(k)]);
    if (st.ok()) return absl::OkStatus();
    const absl::Status e = internal::Replicas::HandleCallStatus(st, handle, route->second);
    return absl::Status(e.code(), absl::StrCat("piece ", k + 1, " of ", pieces, " (",
                                               by_range ? "systems [" : "right-hand sides [", r0,
                                               ", ", r1, ") of ", rows, "): ", e.message()));
  };
  double upload_us = 0, download_us = 0;
  if (auto st = RunPipeline(pieces, stages, &upload_us, &download_us); !st.ok()) return st;
  if (auto st = MergePieces(answers, &result); !st.ok()) return st;
  Summary& sum = result.summary;
  sum.handle = handle;
  sum.right_hand_sides = by_range ? 1 : rows;
  sum.timings.upload_us = upload_us;
  sum.timings.download_us = download_us;
  sum.transport = "streams";
  sum.pieces = pieces;
  sum.timings.client_total_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return result;
}

absl::StatusOr<Result> Client::SolveSystem(const std::string& handle, const ArrayView& rhs,
                                           const Updates& update, const JobOptions& options) {
  if (!impl_->setup.ok()) return impl_->setup;
  bool by_range = false;
  SystemInfo info;
  if (const int pieces = impl_->HandlePieces(handle, rhs, options, &by_range, &info); pieces >= 2)
    return impl_->SolveSystemInPieces(handle, rhs, update, options, pieces, by_range);
  const auto t0 = Clock::now();
  if (update.empty() && (rhs.dtype == DType::kFloat64 || rhs.dtype == DType::kFloat32)) {
    const Kind unused = Kind::kTridiagonal;  // the server knows the system's family
    if (auto r = impl_->SolveOnRing(ring::kOpSolveSystem, unused, rhs.dtype, {{"rhs", rhs}},
                                    "rhs", options, handle, options.x_out, rhs.bytes())) {
      if (r->ok())
        (*r)->summary.timings.client_total_us =
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      return *std::move(r);
    }
  } else if (impl_->options.transport == Transport::kRing) {
    return absl::FailedPreconditionError(
        "transport ring: updates (and right-hand sides not float64 or float32) travel through "
        "the RPC");
  }
  v1::SolveSystemRequest req;
  req.set_handle(handle);
  req.set_skip_residual(options.skip_residual);
  req.set_sparse_status(true);
  auto placed = impl_->Place({rhs}, options.x_out, rhs.bytes());
  if (!placed.ok()) return placed.status();
  const RefFinder ref_of = [this](const void* p, int64_t b) { return impl_->RefOf(p, b); };
  if (auto st = FillStep(rhs, update, ref_of, placed->refs[0], placed->x_ref, &req); !st.ok())
    return st;
  auto route = impl_->replicas->ForHandle(handle);
  if (!route.ok()) return route.status();
  grpc::ClientContext ctx;
  SetAuth(ctx, impl_->options, options);
  if (!route->second) impl_->AwaitConnection(ctx);
  v1::SolveResponse resp;
  v1::Solver::Stub* to = route->first;
  grpc::Status st = AwaitUnary(
      impl_->options.rpc_spin_us, impl_->last_reference_wait_us,
      placed->transport == "shared-memory", [&] { return to->SolveSystem(&ctx, req, &resp); },
      [&](grpc::CompletionQueue* cq) { return to->AsyncSolveSystem(&ctx, req, cq); }, &resp);
  if (!st.ok()) return internal::Replicas::HandleCallStatus(st, handle, route->second);
  Result result;
  if (auto read = ReadResponse(resp, resp.dtype() == v1::FLOAT32 ? DType::kFloat32 : DType::kFloat64,
                               &result);
      !read.ok())
    return read;
  if (auto dst =
          impl_->DeliverX(*placed, options.x_out, rhs.bytes(), &result.x, &result.summary.timings);
      !dst.ok())
    return dst;
  result.summary.transport = placed->transport;
  result.summary.timings.client_total_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  return result;
}

absl::StatusOr<SystemInfo> Client::UpdateSystem(const std::string& handle, const Updates& update,
                                                const JobOptions& options) {
  if (!impl_->setup.ok()) return impl_->setup;
  v1::UpdateSystemRequest req;
  req.set_handle(handle);
  std::vector<NdArray> converted;
  if (auto st = AddUpdates(std::nullopt, update, req.mutable_update(), &converted,
                           [this](const void* p, int64_t b) { return impl_->RefOf(p, b); });
      !st.ok())
    return st;
  auto route = impl_->replicas->ForHandle(handle);
  if (!route.ok()) return route.status();
  grpc::ClientContext ctx;
  SetAuth(ctx, impl_->options, options);
  if (!route->second) impl_->AwaitConnection(ctx);
  v1::SystemInfo info;
  grpc::Status st = route->first->UpdateSystem(&ctx, req, &info);
  if (!st.ok()) return internal::Replicas::HandleCallStatus(st, handle, route->second);
  return ReadSystemInfo(info);
}

absl::StatusOr<SystemInfo> Client::ReleaseSystem(const std::string& handle,
                                                 const JobOptions& options) {
  if (!impl_->setup.ok()) return impl_->setup;
  v1::SystemRequest req;
  req.set_handle(handle);
  auto route = impl_->replicas->ForHandle(handle);
  if (!route.ok()) return route.status();
  grpc::ClientContext ctx;
  SetAuth(ctx, impl_->options, options);
  if (!route->second) impl_->AwaitConnection(ctx);
  v1::SystemInfo info;
  grpc::Status st = route->first->ReleaseSystem(&ctx, req, &info);
  impl_->Forget(handle);
  if (!st.ok()) return internal::Replicas::HandleCallStatus(st, handle, route->second);
  return ReadSystemInfo(info);
}

absl::StatusOr<std::vector<SystemInfo>> Client::ListSystems(const JobOptions& options) {
  if (!impl_->setup.ok()) return impl_->setup;
  // Several replicas: each one's systems (a replica that is unavailable holds none now).
  std::vector<std::pair<std::string, v1::Solver::Stub*>> stubs = {{"", impl_->stub.get()}};
  if (impl_->replicas->balanced()) {
    auto all = impl_->replicas->All();
    if (!all.ok()) return all.status();
    stubs = *std::move(all);
  }
  std::vector<SystemInfo> out;
  for (const auto& [address, stub] : stubs) {
    grpc::ClientContext ctx;
    SetAuth(ctx, impl_->options, options);
    if (address.empty()) impl_->AwaitConnection(ctx);
    v1::ListSystemsResponse resp;
    grpc::Status st = stub->ListSystems(&ctx, v1::ListSystemsRequest(), &resp);
    if (!address.empty() && st.error_code() == grpc::StatusCode::UNAVAILABLE) continue;
    if (!st.ok()) return FromGrpc(st);
    for (const auto& i : resp.systems()) out.push_back(ReadSystemInfo(i));
  }
  return out;
}

// The answers are read on a thread of the stream's own as they come, whether or not the caller
// is receiving yet: a caller that sends several steps before receiving would otherwise stall
// both sides once the steps and the answers filled the transport's windows (the server
// writing an answer nobody read, the client writing a step the server could not take). The
// answers wait here, at most one a step in flight: the caller's own choice of depth.
struct StepStream::Impl {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SolveSystemRequest, v1::SolveResponse>> rw;
  std::string handle;
  bool routed = false;  // to the handle's own replica: UNAVAILABLE there is NOT_FOUND
  bool first = true, done_writing = false;
  std::deque<Clock::time_point> sent;  // when each unanswered step went out
  RefFinder ref_of;                    // the client's registered memory
  std::deque<std::pair<void*, bool>> x_out;  // each unanswered step's x_out, in shared memory?

  std::thread reader;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<v1::SolveResponse> answers;  // read, not yet received
  bool ended = false;                     // the server sent its last answer (or failed)

  void StartReading() {
    if (reader.joinable()) return;
    reader = std::thread([this] {
      for (;;) {
        v1::SolveResponse resp;
        const bool got = rw->Read(&resp);
        std::lock_guard<std::mutex> lock(mu);
        if (!got) {
          ended = true;
          cv.notify_all();
          return;
        }
        answers.push_back(std::move(resp));
        cv.notify_all();
      }
    });
  }
  // The stream's status once every answer was read; rw is gone after it.
  grpc::Status End() {
    if (reader.joinable()) reader.join();
    grpc::Status st = rw->Finish();
    rw.reset();
    return st;
  }
};

StepStream::StepStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StepStream::~StepStream() {
  if (impl_ && impl_->rw) {
    impl_->ctx.TryCancel();
    (void)impl_->End();
  }
}

absl::Status StepStream::Send(const ArrayView& rhs, const Updates& update, void* x_out) {
  if (impl_->done_writing) return absl::FailedPreconditionError("the stream was finished");
  if (!impl_->rw) return absl::FailedPreconditionError("the stream has ended");
  v1::SolveSystemRequest req;
  if (impl_->first) req.set_handle(impl_->handle);
  req.set_sparse_status(true);
  const std::optional<v1::RegionRef> x_ref =
      x_out != nullptr ? impl_->ref_of(x_out, rhs.bytes()) : std::nullopt;
  if (auto st = FillStep(rhs, update, impl_->ref_of, impl_->ref_of(rhs.data, rhs.bytes()), x_ref,
                         &req);
      !st.ok())
    return st;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->sent.push_back(Clock::now());
    impl_->x_out.emplace_back(x_out, x_ref.has_value());
  }
  impl_->StartReading();
  if (!impl_->rw->Write(req)) {
    impl_->done_writing = true;
    return absl::UnavailableError("the stream ended (Finish gives the server's status)");
  }
  impl_->first = false;
  return absl::OkStatus();
}

absl::StatusOr<Result> StepStream::Receive() {
  if (!impl_->rw) return absl::OutOfRangeError("the stream has no more answers");
  impl_->StartReading();
  v1::SolveResponse resp;
  std::pair<void*, bool> out{nullptr, false};
  std::optional<Clock::time_point> sent;
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->cv.wait(lock, [&] { return !impl_->answers.empty() || impl_->ended; });
    if (impl_->answers.empty()) {
      lock.unlock();
      grpc::Status st = impl_->End();
      if (!st.ok()) return internal::Replicas::HandleCallStatus(st, impl_->handle, impl_->routed);
      return absl::OutOfRangeError("the stream has no more answers");
    }
    resp = std::move(impl_->answers.front());
    impl_->answers.pop_front();
    if (!impl_->x_out.empty()) {
      out = impl_->x_out.front();
      impl_->x_out.pop_front();
    }
    if (!impl_->sent.empty()) {
      sent = impl_->sent.front();
      impl_->sent.pop_front();
    }
  }
  Result result;
  if (auto read = ReadResponse(resp, resp.dtype() == v1::FLOAT32 ? DType::kFloat32 : DType::kFloat64,
                               &result);
      !read.ok())
    return read;
  result.summary.transport = "grpc";
  auto [x_out, in_shm] = out;
  if (in_shm) {
    result.summary.transport = "shared-memory";
  } else if (x_out != nullptr) {
    std::memcpy(x_out, result.x.data.data(), result.x.data.size());
    result.x.data.clear();
  }
  if (sent)
    result.summary.timings.client_total_us =
        std::chrono::duration<double, std::micro>(Clock::now() - *sent).count();
  return result;
}

absl::Status StepStream::Finish() {
  if (!impl_->rw) return absl::OkStatus();
  if (!impl_->done_writing) impl_->rw->WritesDone();
  impl_->done_writing = true;
  impl_->StartReading();  // drains the answers still due, if the caller did not receive them
  grpc::Status st = impl_->End();
  if (st.ok()) return absl::OkStatus();
  return internal::Replicas::HandleCallStatus(st, impl_->handle, impl_->routed);
}

absl::StatusOr<std::unique_ptr<StepStream>> Client::OpenStepStream(const std::string& handle,
                                                                   const JobOptions& options) {
  if (!impl_->setup.ok()) return impl_->setup;
  auto route = impl_->replicas->ForHandle(handle);
  if (!route.ok()) return route.status();
  auto impl = std::make_unique<StepStream::Impl>();
  SetAuth(impl->ctx, impl_->options, options);
  if (!route->second) impl_->AwaitConnection(impl->ctx);
  impl->handle = handle;
  impl->ref_of = [this](const void* p, int64_t b) { return impl_->RefOf(p, b); };
  impl->routed = route->second;
  impl->rw = route->first->SolveSystemStream(&impl->ctx);
  return std::unique_ptr<StepStream>(new StepStream(std::move(impl)));
}

// A device's mean time a solve, and the device's account of it (GetServerInfo's solve_s, h2d_s,
// kernel_s and d2h_s over its jobs), where the server counts them.
static std::string DeviceJobTimes(const v1::Device& d) {
  if (!d.has_solve_s() || d.jobs() <= 0) return std::string();
  const double per = 1e3 / double(d.jobs());
  return absl::StrFormat("; %.3f ms a job (h2d %.3f, kernel %.3f, d2h %.3f)", d.solve_s() * per,
                         d.h2d_s() * per, d.kernel_s() * per, d.d2h_s() * per);
}

absl::StatusOr<ServerInfoSummary> Client::Info(double timeout_s) {
  if (!impl_->setup.ok()) return impl_->setup;
  grpc::ClientContext ctx;
  if (!impl_->options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + impl_->options.token);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(int64_t(timeout_s * 1e6)));
  impl_->AwaitConnection(ctx);
  v1::ServerInfo info;
  grpc::Status st = impl_->stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  if (!st.ok()) return FromGrpc(st);
  ServerInfoSummary s;
  s.version = info.version();
  s.backend = info.backend();
  s.cpu_threads = info.cpu_threads();
  for (const auto& d : info.devices())
    s.devices.push_back(absl::StrCat(
        "cuda:", d.ordinal(), " ", d.name(), " (", d.total_memory_bytes() >> 20, " MiB total, ",
        d.free_memory_bytes() >> 20, " MiB free, sm ", d.compute_capability(), ", ",
        d.multiprocessors(), " SMs", d.has_jobs() ? absl::StrCat("; ", d.jobs(), " jobs, ",
                                                                 d.jobs_in_flight(), " running")
                                                   : std::string(),
        DeviceJobTimes(d), ")"));
  for (const auto& p : info.pools())
    s.pools.push_back(absl::StrCat(p.name(), ": ", p.in_use_bytes() >> 20, " MiB in use, ",
                                   p.cached_bytes() >> 20, " MiB cached, peak ",
                                   p.peak_bytes() >> 20, " MiB, cap ", p.cap_bytes() >> 20,
                                   " MiB; ", p.hits(), " hits, ", p.misses(), " misses, ",
                                   p.evictions(), " evictions"));
  s.max_message_bytes = info.limits().max_message_bytes();
  s.max_job_bytes = info.limits().max_job_bytes();
  s.max_job_unknowns = info.limits().max_job_unknowns();
  s.max_concurrent_jobs = info.limits().max_concurrent_jobs();
  s.max_queued_jobs = info.limits().max_queued_jobs();
  s.jobs_in_flight = info.jobs_in_flight();
  s.jobs_queued = info.jobs_queued();
  s.jobs_done = info.jobs_done();
  s.systems = info.systems();
  s.system_bytes = info.system_bytes();
  s.uptime_s = info.uptime_s();
  s.cpu_s = info.cpu_s();
  s.replica = info.replica();
  return s;
}

absl::StatusOr<std::string> Client::Health(const std::string& service, double timeout_s) {
  if (!impl_->setup.ok()) return impl_->setup;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(int64_t(timeout_s * 1e6)));
  impl_->AwaitConnection(ctx);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = impl_->health->Check(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
}

}  // namespace trisolve
