// A transport wrapper for tests that watch or steer a node's links: every link it
// makes (and, if asked, every link it accepts) hands each message it sends to
// `on_send` and each message it receives to `on_receive` before the node sees it.
// A hook may count, replace, swallow or cut; the wrapper does the forwarding. Each
// link learns its stripe from the HELLO it sends (a node's link to a parent).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "relay/wire/protocol.h"
#include "transport/transport.h"

namespace deltacast::test_util {

// One wrapped link, as the hooks see it (shared_from_this keeps it for a callback).
struct InterceptedLink : std::enable_shared_from_this<InterceptedLink> {
  std::atomic<int> stripe{-1};    // from the HELLO this side sent; -1 before
  std::atomic<int64_t> count{0};  // free for the hooks (credits sent, messages in flight)
};

// What becomes of a message this side sends.
enum class SendAction {
  kForward,          // hand it on
  kSwallow,          // report it sent, send nothing (held back, as by a hung path)
  kAbort,            // send nothing and cut the link
  kForwardAndAbort,  // hand it on, then cut the link
};

struct InterceptHooks {
  // May replace `message` or wrap `on_sent`; runs on the sender's thread.
  std::function<SendAction(InterceptedLink&, transport::Message&, transport::SendHandler&)> on_send;
  // Sees each received message before the node does; runs on the transport's thread.
  std::function<void(InterceptedLink&, const std::vector<std::byte>&)> on_receive;
  // Each new link, once made.
  std::function<void(const std::shared_ptr<InterceptedLink>&)> on_link;
  bool accepted_links = false;  // wrap the links others open to this side too
};

class InterceptTransport : public transport::Transport {
 public:
  InterceptTransport(std::unique_ptr<transport::Transport> inner, InterceptHooks hooks)
      : inner_(std::move(inner)), hooks_(std::make_shared<InterceptHooks>(std::move(hooks))) {}
  const transport::Capabilities& capabilities() const override { return inner_->capabilities(); }
  Result<std::string> Listen(const std::string& address,
                             transport::AcceptHandler on_accept) override {
    if (!hooks_->accepted_links) return inner_->Listen(address, std::move(on_accept));
    return inner_->Listen(address, [hooks = hooks_, on_accept](auto connection) {
      on_accept(Wrap(std::move(connection), hooks));
    });
  }
  void Connect(const std::string& address, transport::ConnectHandler on_done) override {
    inner_->Connect(address, [hooks = hooks_, on_done](auto connection) {
      if (!connection.ok()) return on_done(std::move(connection));
      on_done(Wrap(std::move(*connection), hooks));
    });
  }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  class Link : public transport::Connection {
   public:
    Link(std::unique_ptr<transport::Connection> inner, std::shared_ptr<InterceptHooks> hooks)
        : inner_(std::move(inner)),
          hooks_(std::move(hooks)),
          state_(std::make_shared<InterceptedLink>()) {
      if (hooks_->on_link) hooks_->on_link(state_);
    }
    void Start(transport::MessageHandler on_message, transport::CloseHandler on_closed) override {
      if (!hooks_->on_receive) return inner_->Start(std::move(on_message), std::move(on_closed));
      inner_->Start(
          [hooks = hooks_, state = state_, on_message](transport::Message m) {
            hooks->on_receive(*state, *m);
            on_message(std::move(m));
          },
          std::move(on_closed));
    }
    void Send(transport::Message message, transport::SendHandler on_sent) override {
      auto type = relay::PeekType(*message);
      if (type.ok() && *type == relay::MessageType::kHello) {
        auto hello = relay::ParseHello(*message);
        if (hello.ok()) state_->stripe = static_cast<int>(hello->stripe);
      }
      SendAction action = SendAction::kForward;
      if (hooks_->on_send) action = hooks_->on_send(*state_, message, on_sent);
      switch (action) {
        case SendAction::kForward:
          return inner_->Send(std::move(message), std::move(on_sent));
        case SendAction::kSwallow:
          if (on_sent) on_sent(Status::Ok());
          return;
        case SendAction::kAbort:
          return inner_->Abort();
        case SendAction::kForwardAndAbort:
          inner_->Send(std::move(message), std::move(on_sent));
          return inner_->Abort();
      }
    }
    uint64_t QueuedBytes() const override { return inner_->QueuedBytes(); }
    void Close() override { inner_->Close(); }
    void Abort() override { inner_->Abort(); }
    std::string PeerAddress() const override { return inner_->PeerAddress(); }
    std::string PeerIdentity() const override { return inner_->PeerIdentity(); }
    void Authenticated() override { inner_->Authenticated(); }

   private:
    std::unique_ptr<transport::Connection> inner_;
    std::shared_ptr<InterceptHooks> hooks_;
    std::shared_ptr<InterceptedLink> state_;
  };

  static std::unique_ptr<transport::Connection> Wrap(
      std::unique_ptr<transport::Connection> connection,
      const std::shared_ptr<InterceptHooks>& hooks) {
    return std::make_unique<Link>(std::move(connection), hooks);
  }

  std::unique_ptr<transport::Transport> inner_;
  std::shared_ptr<InterceptHooks> hooks_;
};

}  // namespace deltacast::test_util
