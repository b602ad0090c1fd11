// The Connection facade backends share: it forwards every call to the backend's
// Link, which holds the state and may outlive the facade (handlers, pending I/O).
// Link must provide Start, Send, QueuedBytes, Close(bool abortive), peer(), and
// Detach(): close the link and return once none of its user handlers can run; and
// may provide identity() (PeerIdentity), Authenticated() and last_arrival()
// (LastArrival).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "transport/arrival.h"
#include "transport/transport.h"

namespace deltacast::transport::internal {

template <typename Link>
class LinkConnection final : public Connection, public ArrivalClock {
 public:
  explicit LinkConnection(std::shared_ptr<Link> link) : link_(std::move(link)) {}
  ~LinkConnection() override { link_->Detach(); }
  void Start(MessageHandler on_message, CloseHandler on_closed) override {
    link_->Start(std::move(on_message), std::move(on_closed));
  }
  void Send(Message message, SendHandler on_sent) override {
    link_->Send(std::move(message), std::move(on_sent));
  }
  uint64_t QueuedBytes() const override { return link_->QueuedBytes(); }
  void Close() override { link_->Close(/*abortive=*/false); }
  void Abort() override { link_->Close(/*abortive=*/true); }
  std::string PeerAddress() const override { return link_->peer(); }
  std::string PeerIdentity() const override {
    if constexpr (requires { link_->identity(); }) {
      return link_->identity();
    } else {
      return {};
    }
  }
  void Authenticated() override {
    if constexpr (requires { link_->Authenticated(); }) link_->Authenticated();
  }
  // The link's last_arrival() where it has one; the epoch otherwise.
  std::chrono::steady_clock::time_point LastArrival() const override {
    if constexpr (requires { link_->last_arrival(); }) {
      return link_->last_arrival();
    } else {
      return {};
    }
  }

 private:
  const std::shared_ptr<Link> link_;
};

}  // namespace deltacast::transport::internal
