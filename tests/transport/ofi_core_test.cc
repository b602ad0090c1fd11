// The ofi core driven directly, for orderings a real peer produces only by
// chance: here, a provider cancelling a transfer of a live link by itself.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>

#include "tests/transport/test_util.h"
#include "transport/ofi/core.h"
#include "transport/ofi/fabric.h"
#include "transport/ofi/ofi_transport.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

// Runs Core::CancelDataReceivesForTest on the core's progress thread.
size_t CancelDataReceives(ofi::Core& core) {
  auto done = std::make_shared<std::promise<size_t>>();
  auto count = done->get_future();
  if (!core.Post([&core, done] { done->set_value(core.CancelDataReceivesForTest()); })) return 0;
  return count.get();
}

// Holds a thread in Wait until Open; says whether one is waiting.
class Gate {
 public:
  void Wait() {
    waiting_ = true;
    opened_.wait();
  }
  void Open() {
    if (!open_.exchange(true)) release_.set_value();
  }
  bool waiting() const { return waiting_; }

 private:
  std::promise<void> release_;
  std::shared_future<void> opened_ = release_.get_future().share();
  std::atomic<bool> open_{false};
  std::atomic<bool> waiting_{false};
};

// When a peer's connection drops under a rendezvous read, tcp;ofi_rxm fails our
// posted receive with FI_ECANCELED although we never cancelled it. The link must
// break then (kUnavailable), not wait for peer_timeout while still pointing at
// the freed receive (a use-after-free once the link ends: ASan builds flag it).
TEST(OfiCore, ReceiveTheProviderCancelsBreaksItsLink) {
  OfiOptions options;
  options.provider = "tcp;ofi_rxm";
  options.net_device = "lo";
  options.peer_timeout = milliseconds(10000);
  auto fabric = ofi::Fabric::Open(options.provider);
  ASSERT_TRUE(fabric.ok()) << fabric.status().ToString();
  auto core = std::make_shared<ofi::Core>(options, std::move(fabric).value());
  core->StartThread();
  struct Stopper {
    ofi::Core& core;
    ~Stopper() { core.Shutdown(); }
  } stop_core{*core};
  AcceptQueue accepted;
  auto address = core->Listen("127.0.0.1:0", accepted.Handler());
  ASSERT_TRUE(address.ok()) << address.status().ToString();

  auto sender = MakeOfiTransport(options);
  ASSERT_TRUE(sender.ok()) << sender.status().ToString();
  auto link = ConnectBlocking(**sender, *address, kWait);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  auto connection = accepted.Pop();
  ASSERT_NE(connection, nullptr);
  Sink sink;
  sink.Start(*connection);

  // The sender announces a message, then its progress thread is held (in the
  // handler of a Connect that fails at once), so the receive the core posts for
  // that message stays posted: nothing is ever sent into it. The hold must come
  // before the receiver's CTS can reach the sender (else the data transfer starts
  // and the receive is matched, which no cancel undoes): so the sender's thread is
  // held first, the Send and the second hold are queued behind it, and releasing
  // the first runs both in one batch of commands, with no completion polled
  // between them.
  // The handlers hold the gates: the sender's thread may leave one after this
  // test's frame is gone.
  auto before_send = std::make_shared<Gate>();
  auto after_send = std::make_shared<Gate>();
  struct Opener {  // before the sender shuts down, whatever fails
    Gate& first;
    Gate& second;
    ~Opener() {
      first.Open();
      second.Open();
    }
  } opener{*before_send, *after_send};
  (*sender)->Connect("not an address", [before_send](auto) { before_send->Wait(); });
  ASSERT_TRUE(Eventually([&] { return before_send->waiting(); }))
      << "the sender's progress thread never ran the first hold";
  (*link)->Send(MakeMessage(Payload(51, 0, 1 << 20)));
  (*sender)->Connect("not an address", [after_send](auto) { after_send->Wait(); });
  before_send->Open();

  ASSERT_TRUE(Eventually([&] { return CancelDataReceives(*core) > 0; }))
      << "the core never posted a receive for the announced message";
  ASSERT_TRUE(sink.WaitClosed(milliseconds(3000)))
      << "a receive the provider cancelled left its link open";
  EXPECT_EQ(sink.close_status().code(), StatusCode::kUnavailable) << sink.close_status().ToString();
  EXPECT_EQ(sink.message_count(), 0u);
}

}  // namespace
}  // namespace deltacast::transport
