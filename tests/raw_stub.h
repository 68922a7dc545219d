// The generated gRPC stub on a fresh channel without message-size limits: for the end-to-end
// suites that send hand-built (or malformed) protobuf requests past the client library.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "trisolve/v1/trisolve.grpc.pb.h"

namespace trisolve::testing {

inline std::unique_ptr<v1::Solver::Stub> RawStub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  return v1::Solver::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

// The generated stub on a channel of gRPC's defaults (answers up to 4 MiB; one connection
// shared with the process's other default channels to the same target).
inline std::unique_ptr<v1::Solver::Stub> DefaultStub(const std::string& target) {
  return v1::Solver::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

// `st` has `code` and its message says `words`.
inline void Expect(const grpc::Status& st, grpc::StatusCode code, const std::string& words) {
  EXPECT_EQ(st.error_code(), code) << st.error_message();
  EXPECT_NE(st.error_message().find(words), std::string::npos)
      << "'" << st.error_message() << "' does not say '" << words << "'";
}

}  // namespace trisolve::testing
