// The generated gRPC stub on a fresh channel without message-size limits: for the end-to-end
// suites that send hand-built (or malformed) protobuf requests past the client library.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve::testing {

inline std::unique_ptr<v1::Solver::Stub> RawStub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  return v1::Solver::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

}  // namespace trisolve::testing
