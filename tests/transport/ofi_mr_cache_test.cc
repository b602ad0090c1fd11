// The ofi backend's memory registration: the send-side MrCache over a real
// libfabric domain (tcp;ofi_rxm registers memory even though it does not require
// it), and the counters of a transport that registers (OfiRegistration::kAlways).
#include <gtest/gtest.h>

#include "tests/transport/test_util.h"
#include "transport/ofi/fabric.h"
#include "transport/ofi/mr_cache.h"
#include "transport/ofi/ofi_transport.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers
using ofi::MrCache;

constexpr size_t kMiB = size_t{1} << 20;

class MrCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fabric = ofi::Fabric::Open("tcp;ofi_rxm");
    ASSERT_TRUE(fabric.ok()) << fabric.status().ToString();
    fabric_ = std::move(fabric).value();
  }
  std::unique_ptr<MrCache> MakeCache(uint64_t max_bytes) {
    return std::make_unique<MrCache>(
        max_bytes, [this](const void* data, size_t size) { return fabric_->Register(data, size); });
  }
  static std::vector<Message> Messages(int count, size_t size) {
    std::vector<Message> messages;
    for (int i = 0; i < count; ++i) messages.push_back(MakeMessage(Payload(40, i, size)));
    return messages;
  }
  std::unique_ptr<ofi::Fabric> fabric_;  // outlives every cache (declared first)
};

TEST_F(MrCacheTest, RecurringBuffersAreRegisteredOnce) {
  auto cache = MakeCache(64 * kMiB);
  auto messages = Messages(8, 64 * 1024);
  const uint64_t before = fabric_->registrations();
  for (int i = 0; i < 100; ++i) {
    auto registration = cache->Get(messages[i % 8]);
    ASSERT_TRUE(registration.ok()) << registration.status().ToString();
    EXPECT_EQ((*registration)->message, messages[i % 8]);
    EXPECT_NE((*registration)->mr.desc(), nullptr);
  }
  EXPECT_EQ(fabric_->registrations() - before, 8u);
  const auto stats = cache->stats();
  EXPECT_EQ(stats.misses, 8u);
  EXPECT_EQ(stats.hits, 92u);
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_EQ(stats.entries, 8u);
  EXPECT_EQ(stats.cached_bytes, 8u * 64 * 1024);
}

TEST_F(MrCacheTest, EvictsLeastRecentlyUsedAtTheByteCap) {
  auto cache = MakeCache(3 * kMiB);
  auto m = Messages(4, kMiB);
  for (int i : {0, 1, 2, 0}) ASSERT_TRUE(cache->Get(m[i]).ok());  // 0 is now the most recent
  ASSERT_TRUE(cache->Get(m[3]).ok());                             // evicts 1
  auto stats = cache->stats();
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_EQ(stats.entries, 3u);
  EXPECT_EQ(stats.cached_bytes, 3 * kMiB);
  ASSERT_TRUE(cache->Get(m[0]).ok());
  EXPECT_EQ(cache->stats().hits, 2u);  // 0 stayed
  ASSERT_TRUE(cache->Get(m[1]).ok());
  EXPECT_EQ(cache->stats().misses, 5u);  // 1 was gone: registered again
}

TEST_F(MrCacheTest, EvictionLeavesInFlightRegistrationsValid) {
  auto cache = MakeCache(kMiB);
  auto m = Messages(2, kMiB);
  auto in_flight = cache->Get(m[0]);
  ASSERT_TRUE(in_flight.ok());
  ASSERT_TRUE(cache->Get(m[1]).ok());  // evicts m[0]'s entry, not its registration
  EXPECT_EQ(cache->stats().evictions, 1u);
  EXPECT_NE((*in_flight)->mr.desc(), nullptr);
  EXPECT_EQ((*in_flight)->message, m[0]);
}

TEST_F(MrCacheTest, EntryKeepsItsMessageAliveUntilOnlyTheCacheHoldsIt) {
  auto cache = MakeCache(64 * kMiB);
  auto message = MakeMessage(Payload(41, 0, kMiB));
  std::weak_ptr<const std::vector<std::byte>> watch = message;
  auto registration = cache->Get(message);
  ASSERT_TRUE(registration.ok());
  message.reset();  // the caller let go; an in-flight send still holds the registration
  cache->ReleaseUnused();
  EXPECT_FALSE(watch.expired()) << "freed under a live registration";
  EXPECT_EQ(cache->stats().entries, 1u);
  registration = Status::Aborted("send completed");  // the send let go
  cache->ReleaseUnused();
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(cache->stats().entries, 0u);
  EXPECT_EQ(cache->stats().released, 1u);
}

TEST_F(MrCacheTest, ReleaseDropsOnlyUnheldEntries) {
  auto cache = MakeCache(64 * kMiB);
  auto kept = MakeMessage(Payload(42, 0, kMiB));
  auto dropped = MakeMessage(Payload(42, 1, kMiB));
  const auto* kept_data = kept->data();
  const auto* dropped_data = dropped->data();
  ASSERT_TRUE(cache->Get(kept).ok());
  ASSERT_TRUE(cache->Get(dropped).ok());
  dropped.reset();
  cache->Release(kept_data, kMiB);     // the caller still holds it: stays
  cache->Release(dropped_data, kMiB);  // nobody does: goes
  EXPECT_EQ(cache->stats().entries, 1u);
  EXPECT_EQ(cache->stats().released, 1u);
  ASSERT_TRUE(cache->Get(kept).ok());
  EXPECT_EQ(cache->stats().hits, 1u);
}

TEST_F(MrCacheTest, MessageLargerThanTheCapIsRegisteredButNotCached) {
  auto cache = MakeCache(kMiB);
  auto big = MakeMessage(Payload(43, 0, 2 * kMiB));
  for (int i = 0; i < 2; ++i) {
    auto registration = cache->Get(big);
    ASSERT_TRUE(registration.ok());
    EXPECT_NE((*registration)->mr.desc(), nullptr);
  }
  EXPECT_EQ(cache->stats().misses, 2u);
  EXPECT_EQ(cache->stats().entries, 0u);
}

// Transport level: a registering transport sends recurring Messages with one
// registration each, and a relay forwarding what it received registers nothing.
class OfiRegistered : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Transport> Make(OfiRegistration registration) {
    OfiOptions options;
    options.provider = GetParam();
    options.net_device = "lo";
    options.register_memory = registration;
    auto transport = MakeOfiTransport(options);
    EXPECT_TRUE(transport.ok()) << transport.status().ToString();
    return transport.ok() ? std::move(transport).value() : nullptr;
  }
  std::string ListenAddress() const { return GetParam() == "shm" ? "dc-mr:0" : "127.0.0.1:0"; }
  AcceptQueue accept_;
};

TEST_P(OfiRegistered, RecurringMessagesAreRegisteredOnceAndForwardsUseThePool) {
  auto server = Make(OfiRegistration::kAlways);
  auto client = Make(OfiRegistration::kAlways);
  ASSERT_TRUE(server && client);
  auto [connection, accepted] = ListenAndConnect(*server, *client, ListenAddress(), accept_);
  ASSERT_TRUE(connection && accepted);
  // The server echoes every message back: the Message it forwards is its own
  // pooled (registered) receive buffer.
  Connection* echo = accepted.get();
  accepted->Start([echo](Message m) { echo->Send(std::move(m)); }, [](Status) {});
  Sink back;
  back.Start(*connection);
  std::vector<Message> messages;
  std::vector<uint64_t> hashes;
  for (int i = 0; i < 8; ++i) {
    auto bytes = Payload(44, i, 64 * 1024 + i);
    hashes.push_back(HashOf(bytes));
    messages.push_back(MakeMessage(std::move(bytes)));
  }
  for (int i = 0; i < 100; ++i) connection->Send(messages[i % 8]);
  ASSERT_TRUE(back.WaitMessages(100));
  auto received = back.messages();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(HashOf(*received[i]), hashes[i % 8]) << i;

  const OfiStats sent = AsOfiTransport(client.get())->stats();
  EXPECT_TRUE(sent.registers_memory);
  EXPECT_FALSE(sent.provider_requires_mr);
  EXPECT_LE(sent.send_cache_misses, 8u);
  EXPECT_EQ(sent.send_cache_hits + sent.send_cache_misses, 100u);
  EXPECT_EQ(sent.send_cache_entries, 8u);  // the caller still holds all 8
  const OfiStats relay = AsOfiTransport(server.get())->stats();
  EXPECT_EQ(relay.forwarded_sends, 100u);
  EXPECT_EQ(relay.send_cache_misses, 0u);
  EXPECT_EQ(relay.registrations, relay.control_registrations + relay.receive_registrations);
}

TEST_P(OfiRegistered, ReceiveBuffersAreRegisteredOnceAndRecycled) {
  auto server = Make(OfiRegistration::kAlways);
  auto client = Make(OfiRegistration::kAlways);
  ASSERT_TRUE(server && client);
  auto [connection, accepted] = ListenAndConnect(*server, *client, ListenAddress(), accept_);
  ASSERT_TRUE(connection && accepted);
  std::atomic<int> received{0};
  accepted->Start([&](Message) { ++received; }, [](Status) {});  // drops each one
  connection->Start([](Message) {}, [](Status) {});
  for (int i = 0; i < 20; ++i) {
    connection->Send(MakeMessage(Payload(46, i, 256 * 1024)));
    ASSERT_TRUE(Eventually([&] { return received == i + 1; }));
  }
  const OfiStats stats = AsOfiTransport(server.get())->stats();
  // The returned buffer is taken again with its MR; the deleter may still be
  // running when the next message is granted, hence 2, not 1.
  EXPECT_LE(stats.receive_registrations, 2u);
  EXPECT_GE(stats.receive_registrations, 1u);
}

TEST_P(OfiRegistered, SentAndDroppedMessagesLeaveTheCache) {
  auto server = Make(OfiRegistration::kAlways);
  auto client = Make(OfiRegistration::kAlways);
  ASSERT_TRUE(server && client);
  auto [connection, accepted] = ListenAndConnect(*server, *client, ListenAddress(), accept_);
  ASSERT_TRUE(connection && accepted);
  Sink sink;
  sink.Start(*accepted);
  SendLog log;
  for (int i = 0; i < 10; ++i)
    connection->Send(MakeMessage(Payload(45, i, 1 << 20)), log.Handler(i));
  ASSERT_TRUE(log.WaitCount(10));
  ASSERT_TRUE(sink.WaitMessages(10));
  // Nobody holds those Messages any more: their registrations go (at the latest
  // on the next timer tick, <= 100 ms).
  ASSERT_TRUE(
      Eventually([&] { return AsOfiTransport(client.get())->stats().send_cache_entries == 0; }));
  EXPECT_EQ(AsOfiTransport(client.get())->stats().send_cache_released, 10u);
}

TEST_P(OfiRegistered, AutoRegistersNothingWhereTheProviderDoesNotNeedIt) {
  auto transport = Make(OfiRegistration::kAuto);
  ASSERT_NE(transport, nullptr);
  const OfiStats stats = AsOfiTransport(transport.get())->stats();
  EXPECT_FALSE(stats.provider_requires_mr);
  EXPECT_FALSE(stats.registers_memory);
  EXPECT_EQ(stats.registrations, 0u);
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiRegistered, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           return info.param == "shm" ? std::string("Shm") : std::string("TcpRxm");
                         });

}  // namespace
}  // namespace deltacast::transport
