// A transport wrapper for a node's links to its parents in a striped tree: it
// counts the HELLOs sent and the data chunks received per stripe, and aborts one
// stripe's link once, after it sent a given number of CREDITs (mid-refit), as a
// reset connection breaks. Used by the striped tree's fault tests and the bucket
// bridge's (its downlink as that parent).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "codec/chunk.h"
#include "relay/wire/protocol.h"
#include "transport/transport.h"

namespace deltacast::relay::stripe_test {

struct StripeSpied {
  std::mutex mu;
  std::map<uint32_t, int> hellos;                               // stripe -> HELLOs sent
  std::map<uint32_t, std::map<uint32_t, int>> chunks_received;  // stripe -> sequence -> times
  std::atomic<bool> reset{false};
  int reset_stripe = -1;
  int reset_after_credits = 0;
};

class StripeSpyTransport : public transport::Transport {
 public:
  StripeSpyTransport(std::unique_ptr<transport::Transport> inner,
                     std::shared_ptr<StripeSpied> spied)
      : inner_(std::move(inner)), spied_(std::move(spied)) {}
  const transport::Capabilities& capabilities() const override { return inner_->capabilities(); }
  Result<std::string> Listen(const std::string& address,
                             transport::AcceptHandler on_accept) override {
    return inner_->Listen(address, std::move(on_accept));  // its children's links: not spied
  }
  void Connect(const std::string& address, transport::ConnectHandler on_done) override {
    inner_->Connect(address, [spied = spied_, on_done](auto connection) {
      if (!connection.ok()) return on_done(std::move(connection));
      on_done(std::unique_ptr<transport::Connection>(
          std::make_unique<Link>(std::move(*connection), spied)));
    });
  }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  // A link to a parent: its stripe is the one its HELLO names.
  class Link : public transport::Connection {
   public:
    Link(std::unique_ptr<transport::Connection> inner, std::shared_ptr<StripeSpied> spied)
        : inner_(std::move(inner)), spied_(std::move(spied)) {}
    void Start(transport::MessageHandler on_message, transport::CloseHandler on_closed) override {
      inner_->Start(
          [this, on_message](transport::Message m) {
            Received(*m);
            on_message(std::move(m));
          },
          std::move(on_closed));
    }
    void Send(transport::Message message, transport::SendHandler on_sent) override {
      auto type = PeekType(*message);
      bool abort = false;
      if (type.ok() && *type == MessageType::kHello) {
        auto hello = ParseHello(*message);
        if (hello.ok()) {
          stripe_ = static_cast<int>(hello->stripe);
          std::lock_guard lock(spied_->mu);
          ++spied_->hellos[hello->stripe];
        }
      } else if (type.ok() && *type == MessageType::kCredit && stripe_ == spied_->reset_stripe &&
                 ++credits_ > spied_->reset_after_credits && !spied_->reset.exchange(true)) {
        abort = true;
      }
      inner_->Send(std::move(message), std::move(on_sent));
      if (abort) inner_->Abort();
    }
    uint64_t QueuedBytes() const override { return inner_->QueuedBytes(); }
    void Close() override { inner_->Close(); }
    void Abort() override { inner_->Abort(); }
    std::string PeerAddress() const override { return inner_->PeerAddress(); }
    std::string PeerIdentity() const override { return inner_->PeerIdentity(); }
    void Authenticated() override { inner_->Authenticated(); }

   private:
    void Received(const std::vector<std::byte>& message) {
      auto type = PeekType(message);
      if (!type.ok() || *type != MessageType::kChunk) return;
      auto header = codec::PeekChunkHeader(ChunkOf(message));
      if (!header.ok() || header->kind != codec::ChunkKind::kData) return;
      std::lock_guard lock(spied_->mu);
      ++spied_->chunks_received[static_cast<uint32_t>(stripe_.load())][header->sequence];
    }
    std::unique_ptr<transport::Connection> inner_;
    std::shared_ptr<StripeSpied> spied_;
    std::atomic<int> stripe_{-1};
    int credits_ = 0;  // sent on this link (the node's loop thread)
  };
  std::unique_ptr<transport::Transport> inner_;
  std::shared_ptr<StripeSpied> spied_;
};

}  // namespace deltacast::relay::stripe_test
