// Bearer tokens, checked by gRPC core on a call's initial metadata: a call without a valid token
// is answered UNAUTHENTICATED before its message is read (and before any handler runs), so an
// unauthenticated client cannot make the server buffer or parse its payload.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trisolve::server {

// The accepted tokens, in the token file's order.
class BearerTokens {
 public:
  explicit BearerTokens(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}
  bool empty() const { return tokens_.empty(); }
  // The identity "token:N" (N: the token's place among the file's tokens, from 1; the token
  // itself is never kept) for an `authorization` metadata value, or UNAUTHENTICATED. Every
  // token is compared in time independent of where it differs.
  absl::StatusOr<std::string> Check(std::optional<absl::string_view> authorization) const;

 private:
  std::vector<std::string> tokens_;
};

// Calls that need no token: the health service (an orchestrator probes it with none).
bool OpenWithoutToken(absl::string_view path);

// A call refused by the credentials' check: its method path (client-supplied: bounded and
// sanitised by the callee before use) and the status message it got.
using RejectHook = std::function<void(absl::string_view path, absl::string_view message)>;

// Plaintext (tls == nullptr) or TLS server credentials; with a non-empty `tokens`, every call but
// the health service's must carry "authorization: Bearer <token>", checked on its initial
// metadata before its message is read. `on_reject` is called (from a gRPC thread) for each call
// refused there.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const grpc::SslServerCredentialsOptions* tls, std::shared_ptr<const BearerTokens> tokens,
    RejectHook on_reject);

}  // namespace trisolve::server
