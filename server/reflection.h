// --no-reflection. Linking gRPC's reflection library registers its plugin with every
// ServerBuilder by a static initializer, so switching it off takes the plugin out of the
// builder again: a builder option may edit the builder's plugins.
#pragma once

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace trisolve::server {

class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(
                                               p.get()) != nullptr;
                                  }),
                   plugins->end());
  }
};

}  // namespace trisolve::server
