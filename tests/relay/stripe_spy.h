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
#include "tests/relay/intercept_transport.h"

namespace deltacast::relay::stripe_test {

struct StripeSpied {
  std::mutex mu;
  std::map<uint32_t, int> hellos;                               // stripe -> HELLOs sent
  std::map<uint32_t, std::map<uint32_t, int>> chunks_received;  // stripe -> sequence -> times
  std::atomic<bool> reset{false};
  int reset_stripe = -1;
  int reset_after_credits = 0;
};

// Only the links the node opens (to its parents) are spied, not its children's.
class StripeSpyTransport : public test_util::InterceptTransport {
 public:
  StripeSpyTransport(std::unique_ptr<transport::Transport> inner,
                     std::shared_ptr<StripeSpied> spied)
      : InterceptTransport(std::move(inner), Hooks(std::move(spied))) {}

 private:
  static test_util::InterceptHooks Hooks(std::shared_ptr<StripeSpied> spied) {
    test_util::InterceptHooks hooks;
    hooks.on_send = [spied](test_util::InterceptedLink& link, transport::Message& message,
                            transport::SendHandler&) {
      auto type = PeekType(*message);
      if (type.ok() && *type == MessageType::kHello) {
        std::lock_guard lock(spied->mu);
        ++spied->hellos[static_cast<uint32_t>(link.stripe.load())];
      } else if (type.ok() && *type == MessageType::kCredit && link.stripe == spied->reset_stripe &&
                 ++link.count > spied->reset_after_credits && !spied->reset.exchange(true)) {
        return test_util::SendAction::kForwardAndAbort;
      }
      return test_util::SendAction::kForward;
    };
    hooks.on_receive = [spied](test_util::InterceptedLink& link,
                               const std::vector<std::byte>& message) {
      auto type = PeekType(message);
      if (!type.ok() || *type != MessageType::kChunk) return;
      auto header = codec::PeekChunkHeader(ChunkOf(message));
      if (!header.ok() || header->kind != codec::ChunkKind::kData) return;
      std::lock_guard lock(spied->mu);
      ++spied->chunks_received[static_cast<uint32_t>(link.stripe.load())][header->sequence];
    };
    return hooks;
  }
};

}  // namespace deltacast::relay::stripe_test
