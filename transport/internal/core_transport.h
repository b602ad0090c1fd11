// The Transport facade every backend shares: it forwards to the backend's Core,
// which holds the state and outlives the facade as long as connections need it.
// Core must provide caps, Listen, Connect and Shutdown.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "transport/transport.h"

namespace deltacast::transport::internal {

// `Base` is Transport, or a backend's own interface derived from it (which then
// adds what the facade lacks, e.g. counters).
template <typename Core, typename Base = Transport>
class CoreTransport : public Base {
 public:
  explicit CoreTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  ~CoreTransport() override { core_->Shutdown(); }
  const Capabilities& capabilities() const override { return core_->caps; }
  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept) override {
    return core_->Listen(address, std::move(on_accept));
  }
  void Connect(const std::string& address, ConnectHandler on_done) override {
    core_->Connect(address, std::move(on_done));
  }
  void Shutdown() override { core_->Shutdown(); }

 protected:
  const Core& core() const { return *core_; }

 private:
  const std::shared_ptr<Core> core_;
};

}  // namespace deltacast::transport::internal
