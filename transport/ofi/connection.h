// The Connection handed to applications: a thin handle that queues each call as
// a command for the core's progress thread.
//
// Thread safety: all methods are thread-safe (transport.h).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "transport/ofi/core.h"
#include "transport/transport.h"

namespace deltacast::transport::ofi {

class OfiConnection final : public Connection {
 public:
  OfiConnection(std::shared_ptr<Core> core, std::shared_ptr<Link> link)
      : core_(std::move(core)), link_(std::move(link)) {}
  ~OfiConnection() override {
    core_->Post([core = core_.get(), link = link_] { core->CloseLink(link, /*abort=*/false); });
    link_->gate.Close();
  }

  void Start(MessageHandler on_message, CloseHandler on_closed) override {
    core_->Post([core = core_.get(), link = link_, m = std::move(on_message),
                 c = std::move(on_closed)]() mutable {
      core->StartLink(link, std::move(m), std::move(c));
    });
  }

  void Send(Message message, SendHandler on_sent) override {
    Status precheck;
    uint64_t bytes = 0;
    if (!message) {
      precheck = Status::InvalidArgument("null message");
    } else if (message->size() > core_->caps.max_message_bytes) {
      precheck = Status::InvalidArgument("message of " + std::to_string(message->size()) +
                                         " bytes exceeds max_message_bytes " +
                                         std::to_string(core_->caps.max_message_bytes));
    } else {
      bytes = message->size();
    }
    link_->queued_bytes += bytes;
    const bool posted = core_->Post([core = core_.get(), link = link_, m = std::move(message),
                                     s = std::move(on_sent), p = std::move(precheck)]() mutable {
      core->SendOnLink(link, std::move(m), std::move(s), std::move(p));
    });
    if (!posted) link_->queued_bytes -= bytes;
  }

  uint64_t QueuedBytes() const override { return link_->queued_bytes.load(); }

  void Close() override {
    core_->Post([core = core_.get(), link = link_] { core->CloseLink(link, /*abort=*/false); });
  }
  void Abort() override {
    core_->Post([core = core_.get(), link = link_] { core->CloseLink(link, /*abort=*/true); });
  }

  std::string PeerAddress() const override { return link_->peer_address; }
  void Authenticated() override {
    core_->Post([core = core_.get(), link = link_] { core->AuthenticateLink(link); });
  }

 private:
  // Shared: the core must outlive every connection it handed out (they may
  // outlive the Transport), and the link is shared with the core's table.
  const std::shared_ptr<Core> core_;
  const std::shared_ptr<Link> link_;
};

}  // namespace deltacast::transport::ofi
