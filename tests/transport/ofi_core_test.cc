// The ofi core driven directly, for orderings a real peer produces only by
// chance: here, a provider cancelling a transfer of a live link by itself.
#include <gtest/gtest.h>

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
  // that message stays posted: nothing is ever sent into it.
  std::promise<void> release;
  struct Releaser {  // before the sender shuts down, whatever fails
    std::promise<void>& release;
    ~Releaser() { release.set_value(); }
  } releaser{release};
  std::shared_future<void> released = release.get_future().share();
  (*link)->Send(MakeMessage(Payload(51, 0, 1 << 20)));
  (*sender)->Connect("not an address", [released](auto) { released.wait(); });

  ASSERT_TRUE(Eventually([&] { return CancelDataReceives(*core) > 0; }))
      << "the core never posted a receive for the announced message";
  ASSERT_TRUE(sink.WaitClosed(milliseconds(3000)))
      << "a receive the provider cancelled left its link open";
  EXPECT_EQ(sink.close_status().code(), StatusCode::kUnavailable) << sink.close_status().ToString();
  EXPECT_EQ(sink.message_count(), 0u);
}

}  // namespace
}  // namespace deltacast::transport
