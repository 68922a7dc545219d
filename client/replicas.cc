#include "replicas.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trisolve::internal {
namespace {

struct HostPort {
  std::string host, port;  // host without brackets
};

absl::StatusOr<HostPort> SplitHostPort(absl::string_view s) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("target '", s, "': ", why, " (expected HOST:PORT, [IPv6]:PORT)"));
  };
  HostPort hp;
  size_t colon;
  if (absl::StartsWith(s, "[")) {
    const size_t close = s.find(']');
    if (close == absl::string_view::npos) return bad("no closing ]");
    hp.host = std::string(s.substr(1, close - 1));
    colon = close + 1;
    if (colon >= s.size() || s[colon] != ':') return bad("no port");
  } else {
    colon = s.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port");
    hp.host = std::string(s.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) return bad("an IPv6 address needs brackets");
  }
  hp.port = std::string(s.substr(colon + 1));
  if (hp.host.empty()) return bad("no host");
  if (hp.port.empty() || hp.port.find_first_not_of("0123456789") != std::string::npos)
    return bad("the port is not a number");
  return hp;
}

absl::StatusOr<std::vector<std::string>> Resolve(const HostPort& hp) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &res);
  // A name that has no address (a Service without ready pods) is NOT_FOUND; a resolver that
  // cannot answer now is UNAVAILABLE.
  if (rc == EAI_NONAME || rc == EAI_NODATA)
    return absl::NotFoundError(absl::StrCat(hp.host, " has no address (", gai_strerror(rc), ")"));
  if (rc != 0)
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", hp.host, ": ", gai_strerror(rc)));
  std::vector<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof ip);
      out.push_back(absl::StrCat(ip, ":", hp.port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, ip, sizeof ip);
      out.push_back(absl::StrCat("[", ip, "]:", hp.port));
    }
  }
  freeaddrinfo(res);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return absl::NotFoundError(absl::StrCat(hp.host, " has no address"));
  return out;
}

// gRPC's sockaddr target for resolved addresses: "ipv4:" for IPv4 alone, else "ipv6:" with
// IPv4 addresses mapped (one URI scheme holds one family).
std::string SockaddrTarget(const std::vector<std::string>& addresses) {
  const bool all4 = std::none_of(addresses.begin(), addresses.end(),
                                 [](const std::string& a) { return a[0] == '['; });
  if (all4) return absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
  std::vector<std::string> v6;
  for (const auto& a : addresses)
    v6.push_back(a[0] == '[' ? a : absl::StrCat("[::ffff:", a.substr(0, a.rfind(':')), "]",
                                                a.substr(a.rfind(':'))));
  return absl::StrCat("ipv6:", absl::StrJoin(v6, ","));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveAddress(const std::string& host_port) {
  auto hp = SplitHostPort(host_port);
  if (!hp.ok()) return hp.status();
  return Resolve(*hp);
}

absl::StatusOr<TargetSpec> ParseTarget(const std::string& target) {
  TargetSpec spec;
  spec.dial = target;
  if (absl::StartsWith(target, "dns:")) {
    // dns:NAME:PORT, dns:///NAME:PORT or dns://AUTHORITY/NAME:PORT (the name is re-resolved
    // through the system's resolver for handle checks; gRPC's channel uses the authority).
    absl::string_view rest = absl::string_view(target).substr(4);
    if (absl::StartsWith(rest, "//")) {
      const size_t slash = rest.find('/', 2);
      if (slash == absl::string_view::npos)
        return absl::InvalidArgumentError(
            absl::StrCat("target '", target, "': expected dns:///NAME:PORT"));
      rest = rest.substr(slash + 1);
    }
    auto hp = SplitHostPort(rest);
    if (!hp.ok()) return hp.status();
    spec.balanced = true;
    spec.dns_host = hp->host;
    spec.dns_port = hp->port;
    spec.tls_name = hp->host;
    return spec;
  }
  if (target.find(',') == std::string::npos) return spec;  // one server: as gRPC dials it
  // A list: each entry resolved now, once (gRPC's own resolvers take one name, or addresses).
  absl::string_view list = target;
  if (absl::StartsWith(list, "ipv4:") || absl::StartsWith(list, "ipv6:")) list.remove_prefix(5);
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    auto hp = SplitHostPort(absl::StripAsciiWhitespace(entry));
    if (!hp.ok()) return hp.status();
    if (spec.tls_name.empty()) spec.tls_name = hp->host;
    auto resolved = Resolve(*hp);
    if (!resolved.ok()) return resolved.status();
    for (auto& a : *resolved)
      if (std::find(spec.addresses.begin(), spec.addresses.end(), a) == spec.addresses.end())
        spec.addresses.push_back(std::move(a));
  }
  if (spec.addresses.empty())
    return absl::InvalidArgumentError(absl::StrCat("target '", target, "' names no address"));
  spec.balanced = true;
  spec.dial = SockaddrTarget(spec.addresses);
  return spec;
}

const std::string& BalancedServiceConfig() {
  // Retried on another replica, on UNAVAILABLE (the replica was killed, is draining or
  // unreachable) and CANCELLED (a replica shutting down cancels the calls it received but had
  // not started; the library never cancels these calls itself, and gRPC does not retry a call
  // its caller cancelled): the solves and reads, which hold no state on a replica, and
  // CreateSystem (a retry after a lost answer can leave a copy on the first replica, unused
  // until its time-to-live drops it; a killed or draining replica keeps none). Calls by handle
  // are not retried: the system lives on one replica only.
  static const std::string config = R"json({
  "loadBalancingConfig": [{"round_robin": {}}],
  "healthCheckConfig": {"serviceName": "trisolve.v1.Solver"},
  "retryThrottling": {"maxTokens": 100, "tokenRatio": 0.1},
  "methodConfig": [{
    "name": [
      {"service": "trisolve.v1.Solver", "method": "SolveTridiagonal"},
      {"service": "trisolve.v1.Solver", "method": "SolveTree"},
      {"service": "trisolve.v1.Solver", "method": "SolveBlockTridiagonal"},
      {"service": "trisolve.v1.Solver", "method": "SolveDense"},
      {"service": "trisolve.v1.Solver", "method": "SolveStream"},
      {"service": "trisolve.v1.Solver", "method": "GetServerInfo"},
      {"service": "trisolve.v1.Solver", "method": "CreateSystem"},
      {"service": "trisolve.v1.Solver", "method": "ListSystems"}
    ],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.02s",
      "maxBackoff": "0.5s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]
    }
  }]
})json";
  return config;
}

std::string ReplicaOf(const std::string& handle) {
  const size_t at = handle.find('@');
  return at == std::string::npos ? std::string() : handle.substr(at + 1);
}

Replicas::Replicas(TargetSpec spec, std::shared_ptr<grpc::ChannelCredentials> creds,
                   grpc::ChannelArguments args, const Client::Options& options)
    : spec_(std::move(spec)),
      creds_(std::move(creds)),
      args_(args),
      tls_server_name_(options.tls_server_name) {
  if (spec_.balanced && options.keepalive_s > 0) {
    // Pings while calls are open (the health watch is one), without limit while no data moves
    // (a long solve): a silent peer is found within keepalive + timeout.
    args_.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, int(std::min(options.keepalive_s * 1e3, 2e9)));
    args_.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                 int(std::min(std::max(options.keepalive_timeout_s, 0.001) * 1e3, 2e9)));
    args_.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  if (spec_.balanced) {
    grpc::ChannelArguments balanced = args_;
    balanced.SetServiceConfigJSON(BalancedServiceConfig());
    // A request must stay buffered to be retried: room for a unary request up to the size
    // above which the client streams (4 MiB), and for CreateSystem's coefficients.
    balanced.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, 64 << 20);
    // Addresses dialled: the certificate names the service, not each address.
    if (tls_server_name_.empty() && spec_.dns_host.empty())
      balanced.SetSslTargetNameOverride(spec_.tls_name);
    channel_ = grpc::CreateCustomChannel(spec_.dial, creds_, balanced);
  } else {
    channel_ = grpc::CreateCustomChannel(spec_.dial, creds_, args_);
  }
  stub_ = v1::Solver::NewStub(channel_);
}

absl::StatusOr<std::vector<std::string>> Replicas::Current() const {
  if (!spec_.dns_host.empty()) return Resolve({spec_.dns_host, spec_.dns_port});
  return spec_.addresses;
}

v1::Solver::Stub* Replicas::StubFor(const std::string& key, const std::string& resolved) {
  std::lock_guard<std::mutex> lock(mu_);
  Replica& r = replicas_[key];
  if (!r.stub) {
    grpc::ChannelArguments args = args_;  // pick_first, no retries: this replica or nothing
    if (tls_server_name_.empty()) args.SetSslTargetNameOverride(spec_.tls_name);
    r.channel = grpc::CreateCustomChannel(SockaddrTarget({resolved}), creds_, args);
    r.stub = v1::Solver::NewStub(r.channel);
  }
  return r.stub.get();
}

absl::StatusOr<std::pair<v1::Solver::Stub*, bool>> Replicas::ForHandle(const std::string& handle) {
  const std::string replica = ReplicaOf(handle);
  if (!spec_.balanced || replica.empty()) return std::make_pair(stub_.get(), false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = replicas_.find(replica);
    if (it != replicas_.end()) return std::make_pair(it->second.stub.get(), true);
  }
  auto mine = ResolveAddress(replica);
  auto current = Current();
  // The target's name cannot be resolved now: the handle may well be good.
  if (!current.ok() && current.status().code() == absl::StatusCode::kUnavailable)
    return absl::UnavailableError(absl::StrCat("system ", handle, ": cannot check its replica ",
                                               replica, ": ", current.status().message()));
  if (mine.ok() && current.ok())
    for (const auto& a : *mine)
      if (std::find(current->begin(), current->end(), a) != current->end())
        return std::make_pair(StubFor(replica, a), true);
  return absl::NotFoundError(absl::StrCat(
      "system ", handle, ": its replica ", replica, " is not one of ",
      spec_.dns_host.empty() ? absl::StrJoin(spec_.addresses, ", ")
                             : absl::StrCat(spec_.dns_host, "'s addresses"),
      " (the replica went away and its systems with it, or the handle is another service's)",
      mine.ok() ? "" : absl::StrCat("; ", mine.status().message()),
      current.ok() ? "" : absl::StrCat("; ", current.status().message())));
}

absl::StatusOr<std::vector<std::pair<std::string, v1::Solver::Stub*>>> Replicas::All() {
  auto current = Current();
  if (!current.ok() && current.status().code() == absl::StatusCode::kNotFound)
    return std::vector<std::pair<std::string, v1::Solver::Stub*>>();  // no replica, no system
  if (!current.ok()) return current.status();
  std::vector<std::pair<std::string, v1::Solver::Stub*>> out;
  for (const auto& a : *current) out.emplace_back(a, StubFor(a, a));
  return out;
}

absl::Status Replicas::HandleCallStatus(const grpc::Status& st, const std::string& handle,
                                        bool routed) {
  if (routed && st.error_code() == grpc::StatusCode::UNAVAILABLE)
    return absl::NotFoundError(absl::StrCat("system ", handle, ": its replica ",
                                            ReplicaOf(handle),
                                            " is unavailable and its systems with it (",
                                            st.error_message(), ")"));
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
}

}  // namespace trisolve::internal
