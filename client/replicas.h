// Several trisolved replicas behind one Client (internal to libtrisolve_client).
//
// A target of several addresses ("h1:p1,h2:p2") or a DNS name ("dns:///name:port") gets one
// channel balanced by gRPC's round_robin policy over the replicas that pass the
// grpc.health.v1 check, retrying UNAVAILABLE (a replica killed or draining) on another one for
// the calls that carry no state between replicas. A persistent system lives on one replica: its
// handle ends with "@HOST:PORT" (the server's --advertise-address), and its calls go to a
// channel of that replica alone, once that address is found among the target's.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trisolve/client.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve::internal {

// What Client::Options::target names.
struct TargetSpec {
  // Several addresses or a dns: name: round_robin over the replicas, with health checks.
  bool balanced = false;
  std::string dial;  // what the channel dials
  // A dns: target's name and port, resolved again when a handle's replica is checked.
  std::string dns_host, dns_port;
  // A list's replicas, resolved once: "IP:PORT" ("[IPv6]:PORT").
  std::vector<std::string> addresses;
  // The host a certificate is checked against when the channel dials addresses (a list's
  // first host, a dns: target's name).
  std::string tls_name;
};

absl::StatusOr<TargetSpec> ParseTarget(const std::string& target);

// round_robin, health checks on trisolve.v1.Solver, UNAVAILABLE retried for the stateless calls.
const std::string& BalancedServiceConfig();

// The replica a handle names ("sys-...@HOST:PORT" gives "HOST:PORT"), or "".
std::string ReplicaOf(const std::string& handle);

// "HOST:PORT" resolved to "IP:PORT" strings ("[IPv6]:PORT"), numeric hosts without a lookup.
absl::StatusOr<std::vector<std::string>> ResolveAddress(const std::string& host_port);

class Replicas {
 public:
  // `args`: the client's channel arguments; keepalive and the TLS name from `options`.
  Replicas(TargetSpec spec, std::shared_ptr<grpc::ChannelCredentials> creds,
           grpc::ChannelArguments args, const Client::Options& options);

  bool balanced() const { return spec_.balanced; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // The stub for a handle's calls, and whether it is the handle's own replica's: on a balanced
  // target a handle that names a replica goes there, NOT_FOUND when that replica is not one of
  // the target's (gone from its name, or the handle came from another service: a client never
  // sends its token to an address the handle alone names). Otherwise the balanced channel's.
  absl::StatusOr<std::pair<v1::Solver::Stub*, bool>> ForHandle(const std::string& handle);
  // Every replica of the target now, by address, with its stub (ListSystems on a balanced
  // target asks each).
  absl::StatusOr<std::vector<std::pair<std::string, v1::Solver::Stub*>>> All();

  // A handle call's status: UNAVAILABLE from the replica that held the system (killed, gone,
  // draining) means the system is gone with it: NOT_FOUND, saying so.
  static absl::Status HandleCallStatus(const grpc::Status& st, const std::string& handle,
                                       bool routed);

 private:
  // The replicas the target names now ("IP:PORT" strings): the list's, or the name's.
  absl::StatusOr<std::vector<std::string>> Current() const;
  // The stub of a replica known to be one of the target's.
  v1::Solver::Stub* StubFor(const std::string& key, const std::string& resolved);

  const TargetSpec spec_;
  const std::shared_ptr<grpc::ChannelCredentials> creds_;
  grpc::ChannelArguments args_;  // with keepalive, without the balanced service config
  const std::string tls_server_name_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Solver::Stub> stub_;

  std::mutex mu_;
  struct Replica {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Solver::Stub> stub;
  };
  std::map<std::string, Replica> replicas_;  // by the handle's address; never erased
};

}  // namespace trisolve::internal
