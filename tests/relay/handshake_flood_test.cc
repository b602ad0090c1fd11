// A flood of half-open links against a relay, over tcp on loopback: ~1,030 links
// from 129 addresses (127.0.1.x) pass the transport's handshake and never answer
// the relay's CHALLENGE, so the relay's `max_pending_handshakes` slots are all
// taken, and taken again as soon as one frees. A child dialling from another
// address must still join while the flood goes on (the admission rule of
// relay/internal/handshake_limits.h); before that rule it was refused for as long
// as the flood lasted.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "relay/node_agent.h"
#include "relay/node_transports.h"
#include "tests/relay/security_util.h"
#include "tests/transport/raw_peer.h"
#include "topology/cluster_config.h"
#include "transport/tcp/tcp_transport.h"

namespace deltacast::relay {
namespace {

using namespace std::chrono_literals;
using transport::testutil::RawPeer;

constexpr char kToken[] = "flood-test-token";
constexpr int kFloodAddresses = 129;
constexpr int kLinksPerAddress = 8;  // the default max_handshakes_per_address

std::string FloodAddress(int k) { return "127.0.1." + std::to_string(1 + k); }

TEST(HandshakeFloodTest, AChildJoinsWhileHalfOpenLinksFromManyAddressesFillEverySlot) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_max < 4096) GTEST_SKIP() << "needs 4096 descriptors";
  limit.rlim_cur = std::max<rlim_t>(limit.rlim_cur, 4096);
  ::setrlimit(RLIMIT_NOFILE, &limit);

  const std::vector<uint16_t> ports = testing::FreePorts(3);
  // The default caps (64 pending, 8 per address); a handshake timeout longer than
  // the test, so no slot frees by itself: only the admission rule can make room.
  const std::string toml =
      "[cluster]\nname = \"flood-test\"\n[tree]\nfanout = 1\nconnect_timeout = \"5s\"\n"
      "idle_timeout = \"60s\"\n[limits]\nhandshake_timeout = \"60s\"\n"
      "[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " +
      std::to_string(ports[0]) + "\nrole = \"source\"\n[[node]]\nid = \"n1\"\nhost = " +
      "\"127.0.0.1\"\nport = " + std::to_string(ports[1]) +
      "\n[[node]]\nid = \"n2\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports[2]) + "\n";
  auto config = topology::ParseClusterConfig(toml, "flood-test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->limits.max_pending_handshakes, 64);
  ASSERT_EQ(config->limits.max_handshakes_per_address, kLinksPerAddress);

  testing::Versions v = testing::MakeVersions(1 << 12, 3);
  std::vector<std::vector<std::byte>> store = v.base;
  auto replica =
      apply::Replica::ForStore(testing::Borrow(v.tensors, store), testing::kPartitionBytes, 1);
  ASSERT_TRUE(replica.ok());
  NodeAgentOptions options;
  options.config = *config;
  options.node_id = "n1";
  options.token = kToken;
  options.apply_threads = 1;
  auto transport = MakeNodeTransports(*config, *config->FindNode("n1"));
  ASSERT_TRUE(transport.ok()) << transport.status().ToString();
  auto agent = NodeAgent::Start(std::move(options), std::move(*replica), std::move(*transport));
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();

  // The flood: every address holds its 8 links, and a link the relay closes is
  // dialled again at once from the same address, for as long as the test runs.
  std::vector<std::unique_ptr<RawPeer>> flood;
  for (int k = 0; k < kFloodAddresses; ++k) {
    for (int j = 0; j < kLinksPerAddress; ++j) {
      flood.push_back(std::make_unique<RawPeer>(ports[1], FloodAddress(k)));
      ASSERT_TRUE(flood.back()->Hello()) << "transport handshake from " << FloodAddress(k);
    }
  }
  ASSERT_GE(flood.size(), 1030u);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> redialled{0};
  std::thread flooder([&] {
    while (!stop) {
      for (size_t i = 0; i < flood.size() && !stop; ++i) {
        if (!flood[i]->ClosedByPeer(0)) continue;
        flood[i] = std::make_unique<RawPeer>(ports[1],
                                             FloodAddress(static_cast<int>(i) / kLinksPerAddress));
        if (flood[i]->Hello()) ++redialled;
      }
      std::this_thread::sleep_for(1ms);
    }
  });
  // The flood is on: the relay's slots are all taken and links are being closed
  // and dialled again.
  const auto on_since = std::chrono::steady_clock::now();
  while (redialled < 200 && std::chrono::steady_clock::now() - on_since < 20s)
    std::this_thread::sleep_for(10ms);
  ASSERT_GE(redialled.load(), 200u) << "the flood never filled the relay's handshake slots";

  // A child joins from 127.0.0.1 while it lasts, within a bound.
  auto client = std::move(*transport::MakeTcpTransport());
  const uint64_t redialled_before = redialled;
  const auto t0 = std::chrono::steady_clock::now();
  testing::ChildPeer child(*client, "127.0.0.1:" + std::to_string(ports[1]), "n2", "n1", kToken);
  const double join_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t redialled_during = redialled - redialled_before;
  stop = true;
  flooder.join();
  EXPECT_TRUE(child.joined()) << "the child was refused while the flood lasted";
  EXPECT_LT(join_seconds, 2.0) << "the child took " << join_seconds << " s to join";
  // It was under the flood, not in a lull: the relay kept closing flood links.
  EXPECT_GT(redialled_during + redialled_before, 200u);
  RecordProperty("join_ms", static_cast<int>(join_seconds * 1000));
  RecordProperty("flood_redialled", static_cast<int>(redialled.load()));
  (*agent)->Stop();
}

}  // namespace
}  // namespace deltacast::relay
