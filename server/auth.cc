#include "auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trisolve::server {

absl::StatusOr<std::string> BearerTokens::Check(
    std::optional<absl::string_view> authorization) const {
  if (!authorization)
    return absl::UnauthenticatedError(
        "missing bearer token (metadata 'authorization: Bearer <token>')");
  constexpr absl::string_view kBearer = "Bearer ";
  if (authorization->size() <= kBearer.size() || !absl::StartsWith(*authorization, kBearer))
    return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
  const absl::string_view token = authorization->substr(kBearer.size());
  // Compare against every token, each in time independent of where they differ.
  int match = -1;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const std::string& t = tokens_[k];
    unsigned diff = t.size() != token.size();
    for (size_t i = 0; i < t.size(); ++i)
      diff |= unsigned(t[i] ^ (i < token.size() ? token[i] : 0));
    if (diff == 0) match = int(k);
  }
  if (match < 0) return absl::UnauthenticatedError("invalid bearer token");
  return absl::StrCat("token:", match + 1);
}

bool OpenWithoutToken(absl::string_view path) {
  return absl::StartsWith(path, "/grpc.health.v1.Health/");
}

namespace {

absl::string_view View(const grpc_slice& s) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)), GRPC_SLICE_LENGTH(s)};
}

// gRPC core's hook on every call's initial metadata (the server auth filter), run before the
// call reaches the server's method dispatch, so before its message is received. It decides only
// whether the call goes on; the handler derives the identity again from the same metadata.
struct TokenProcessor {
  std::shared_ptr<const BearerTokens> tokens;
  RejectHook on_reject;

  static void Process(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    const auto* self = static_cast<const TokenProcessor*>(state);
    absl::string_view path;
    std::optional<absl::string_view> authorization;
    for (size_t i = 0; i < num_md; ++i) {
      const absl::string_view key = View(md[i].key);
      if (key == ":path") path = View(md[i].value);
      else if (key == "authorization" && !authorization) authorization = View(md[i].value);
    }
    if (OpenWithoutToken(path)) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    auto identity = self->tokens->Check(authorization);
    if (identity.ok()) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    const std::string message(identity.status().message());
    if (self->on_reject) self->on_reject(path, message);
    // gRPC copies the details before `done` returns.
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, message.c_str());
  }
  static void Destroy(void* state) { delete static_cast<TokenProcessor*>(state); }
};

// The C++ InsecureServerCredentials refuse an AuthMetadataProcessor (an assertion), although
// gRPC core's insecure credentials run the server auth filter like any other: these credentials
// build the core ones for each listening port and attach the token check to them, plaintext or
// TLS alike.
class TokenCheckedCredentials final : public grpc::ServerCredentials {
 public:
  TokenCheckedCredentials(std::optional<grpc::SslServerCredentialsOptions> tls,
                          std::shared_ptr<const BearerTokens> tokens, RejectHook on_reject)
      : tls_(std::move(tls)), tokens_(std::move(tokens)), on_reject_(std::move(on_reject)) {}

  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    // Not used by trisolve: the token check is this class's own.
    GPR_ASSERT(false);
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = nullptr;
    if (tls_) {
      std::vector<grpc_ssl_pem_key_cert_pair> pairs;
      for (const auto& p : tls_->pem_key_cert_pairs)
        pairs.push_back({p.private_key.c_str(), p.cert_chain.c_str()});
      creds = grpc_ssl_server_credentials_create_ex(
          tls_->pem_root_certs.empty() ? nullptr : tls_->pem_root_certs.c_str(),
          pairs.empty() ? nullptr : pairs.data(), pairs.size(),
          tls_->force_client_auth ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                  : tls_->client_certificate_request,
          nullptr);
    } else {
      creds = grpc_insecure_server_credentials_create();
    }
    if (creds == nullptr) return 0;
    grpc_server_credentials_set_auth_metadata_processor(
        creds, {&TokenProcessor::Process, &TokenProcessor::Destroy,
                new TokenProcessor{tokens_, on_reject_}});
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  std::optional<grpc::SslServerCredentialsOptions> tls_;
  std::shared_ptr<const BearerTokens> tokens_;
  RejectHook on_reject_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const grpc::SslServerCredentialsOptions* tls, std::shared_ptr<const BearerTokens> tokens,
    RejectHook on_reject) {
  if (!tokens || tokens->empty())
    return tls != nullptr ? grpc::SslServerCredentials(*tls) : grpc::InsecureServerCredentials();
  std::optional<grpc::SslServerCredentialsOptions> t;
  if (tls != nullptr) t = *tls;
  return std::make_shared<TokenCheckedCredentials>(std::move(t), std::move(tokens),
                                                   std::move(on_reject));
}

}  // namespace trisolve::server
