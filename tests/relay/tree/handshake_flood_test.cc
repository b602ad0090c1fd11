// Floods of half-open links against a relay, over tcp on loopback: 1,032 links
// from 129 addresses (127.0.1.x) that never finish a handshake (the relay's, or
// the transport's below it), so the listener's `max_pending_handshakes` slots are
// all taken, and taken again as soon as one frees. A child dialling from another
// address must still join while the flood goes on (the admission rule of
// common/handshake_admission.h); before that rule it was refused for as long as the
// flood lasted. The same floods against a root's producer listener, whose producer
// links run TLS ([security] producer_region in another region): a producer joins
// over TLS through them, held to the same caps by the same code (ProducerHub, and
// the transport MakeProducerTransport makes under [limits]).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "relay/producers/producer.h"
#include "relay/producers/root.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/node_transports.h"
#include "tests/relay/tree/security_util.h"
#include "tests/temp_dir.h"
#include "tests/transport/raw_peer.h"
#include "topology/cluster_config.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tls_certs.h"

namespace deltacast::relay {
namespace {

using namespace std::chrono_literals;
using transport::testutil::RawPeer;

constexpr char kToken[] = "flood-test-token";
constexpr int kFloodAddresses = 129;
constexpr int kLinksPerAddress = 8;  // the default max_handshakes_per_address

std::string FloodAddress(int k) { return "127.0.1." + std::to_string(1 + k); }

// The flood, against whichever listener a test names (flood_port_).
class FloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    if (limit.rlim_max < 4096) GTEST_SKIP() << "needs 4096 descriptors";
    limit.rlim_cur = std::max<rlim_t>(limit.rlim_cur, 4096);
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ports_ = testing::FreePorts(3);
  }
  void TearDown() override { StopFlood(); }

  // The flood: every address holds its 8 links, and a link the listener closes is
  // dialled again at once from the same address, until StopFlood. `hello`: each
  // link passes the transport's handshake and stays silent before the relay's
  // CHALLENGE; else it says nothing at all.
  void StartFlood(bool hello) {
    hello_ = hello;
    for (int k = 0; k < kFloodAddresses; ++k) {
      for (int j = 0; j < kLinksPerAddress; ++j) flood_.push_back(Dial(k));
    }
    flooder_ = std::thread([this] {
      while (!stop_) {
        for (size_t i = 0; i < flood_.size() && !stop_; ++i) {
          if (!flood_[i]->ClosedByPeer(0)) continue;
          flood_[i] = Dial(static_cast<int>(i) / kLinksPerAddress);
          ++redialled_;
        }
        std::this_thread::sleep_for(1ms);
      }
    });
    // On: the listener's slots are all taken, and links are being closed and
    // dialled again.
    const auto since = std::chrono::steady_clock::now();
    while (redialled_ < 200 && std::chrono::steady_clock::now() - since < 20s)
      std::this_thread::sleep_for(10ms);
  }
  void StopFlood() {
    stop_ = true;
    if (flooder_.joinable()) flooder_.join();
  }
  std::unique_ptr<RawPeer> Dial(int address) {
    auto peer = std::make_unique<RawPeer>(flood_port_, FloodAddress(address));
    if (hello_) peer->Hello();  // whether acked or closed, the flooder sees it later
    return peer;
  }

  std::vector<uint16_t> ports_;
  uint16_t flood_port_ = 0;
  std::vector<std::unique_ptr<RawPeer>> flood_;
  std::thread flooder_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> redialled_{0};
  bool hello_ = false;
};

class HandshakeFloodTest : public FloodTest {
 protected:
  void SetUp() override {
    FloodTest::SetUp();
    if (IsSkipped()) return;
    // The default caps (the relay's 64 pending, 8 per address; the transport's
    // 512, 128 per address); handshake timeouts longer than the test, so no slot
    // frees by itself: only the admission rule can make room.
    const std::string toml =
        "[cluster]\nname = \"flood-test\"\n[tree]\nfanout = 1\nconnect_timeout = \"60s\"\n"
        "idle_timeout = \"60s\"\n[limits]\nhandshake_timeout = \"60s\"\n"
        "[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " +
        std::to_string(ports_[0]) + "\nrole = \"source\"\n[[node]]\nid = \"n1\"\nhost = " +
        "\"127.0.0.1\"\nport = " + std::to_string(ports_[1]) +
        "\n[[node]]\nid = \"n2\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports_[2]) + "\n";
    auto config = topology::ParseClusterConfig(toml, "flood-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    ASSERT_EQ(config->limits.max_pending_handshakes, 64);
    ASSERT_EQ(config->limits.max_handshakes_per_address, kLinksPerAddress);
    v_ = testing::MakeVersions(1 << 12, 3);
    store_ = v_.base;
    auto replica =
        apply::Replica::ForStore(testing::Borrow(v_.tensors, store_), testing::kPartitionBytes, 1);
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
    agent_ = std::move(*agent);
    flood_port_ = ports_[1];
  }
  void TearDown() override {
    StopFlood();
    if (agent_) agent_->Stop();
  }

  // A child joins from 127.0.0.1 while the flood lasts; how long it took.
  double JoinChild(bool* joined) {
    auto client = std::move(*transport::MakeTcpTransport());
    const auto t0 = std::chrono::steady_clock::now();
    testing::ChildPeer child(*client, "127.0.0.1:" + std::to_string(ports_[1]), "n2", "n1", kToken);
    *joined = child.joined();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  testing::Versions v_;
  std::vector<std::vector<std::byte>> store_;
  std::unique_ptr<NodeAgent> agent_;
};

// Links that pass the transport's hello and never answer the relay's CHALLENGE
// fill the relay's 64 slots (relay/tree/downstream.cc).
TEST_F(HandshakeFloodTest, AChildJoinsWhileHalfOpenLinksFromManyAddressesFillTheRelaysSlots) {
  StartFlood(/*hello=*/true);
  ASSERT_GE(flood_.size(), 1030u);
  ASSERT_GE(redialled_.load(), 200u) << "the flood never filled the relay's handshake slots";
  bool joined = false;
  const double seconds = JoinChild(&joined);
  StopFlood();
  EXPECT_TRUE(joined) << "the child was refused while the flood lasted";
  EXPECT_LT(seconds, 2.0) << "the child took " << seconds << " s to join";
  RecordProperty("join_ms", static_cast<int>(seconds * 1000));
  RecordProperty("flood_redialled", static_cast<int>(redialled_.load()));
}

// Sockets that never say even the transport's hello fill its 512 slots
// (transport/tcp/tcp_accept.cc): the same rule there.
TEST_F(HandshakeFloodTest, AChildJoinsWhileSilentSocketsFromManyAddressesFillTheTransportsSlots) {
  StartFlood(/*hello=*/false);
  ASSERT_GE(flood_.size(), 1030u);
  ASSERT_GE(redialled_.load(), 200u) << "the flood never filled the transport's handshake slots";
  bool joined = false;
  const double seconds = JoinChild(&joined);
  StopFlood();
  EXPECT_TRUE(joined) << "the child was refused while the flood lasted";
  EXPECT_LT(seconds, 2.0) << "the child took " << seconds << " s to join";
  RecordProperty("join_ms", static_cast<int>(seconds * 1000));
  RecordProperty("flood_redialled", static_cast<int>(redialled_.load()));
}

// A root (its tree listener on ports_[0], its producer listener on ports_[1]) whose
// producers must come over TLS; the flood targets the producer listener.
class ProducerFloodTest : public FloodTest {
 protected:
  void SetUp() override {
    FloodTest::SetUp();
    if (IsSkipped()) return;
    const auto certs = dir_.path() / "certs";
    ASSERT_TRUE(transport::WriteClusterCertificates(certs, {"src", "n1", "rank-00000"}).ok());
    // The default caps, as above; handshake timeouts longer than the test.
    const std::string toml =
        "[cluster]\nname = \"producer-flood-test\"\n[tree]\nfanout = 1\nconnect_timeout = "
        "\"60s\"\nidle_timeout = \"60s\"\n[limits]\nhandshake_timeout = \"60s\"\n"
        "[[region]]\nname = \"eu\"\nwan_bandwidth = \"1Gbit\"\nwan_latency = \"1ms\"\n"
        "[security]\nproducer_region = \"eu\"\nca = \"" +
        (certs / "ca.crt").string() + "\"\ncert = \"" + (certs / "{node}.crt").string() +
        "\"\nkey = \"" + (certs / "{node}.key").string() +
        "\"\n[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports_[0]) +
        "\nrole = \"source\"\n[[node]]\nid = \"n1\"\nhost = \"127.0.0.1\"\nport = " +
        std::to_string(ports_[2]) + "\n";
    auto config = topology::ParseClusterConfig(toml, "producer-flood-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    ASSERT_TRUE(topology::ProducerLinksUseTls(config_));
    RootOptions options;
    options.publish.config = config_;
    options.publish.token = kToken;
    options.publish.decision_log = dir_.path() / "decisions.log";
    options.producer_address = "127.0.0.1:" + std::to_string(ports_[1]);
    auto tree = MakeNodeTransports(config_, *config_.Source());
    ASSERT_TRUE(tree.ok()) << tree.status().ToString();
    auto producers = MakeProducerTransport(config_, "src");
    ASSERT_TRUE(producers.ok()) << producers.status().ToString();
    auto root = Root::Start(std::move(options), std::move(*tree), std::move(*producers));
    ASSERT_TRUE(root.ok()) << root.status().ToString();
    root_ = std::move(*root);
    flood_port_ = ports_[1];
  }
  void TearDown() override {
    StopFlood();
    if (root_) root_->Stop();
  }

  // A producer joins over TLS from 127.0.0.1 while the flood lasts; how long it took.
  double JoinProducer(Status* joined) {
    auto transport = MakeProducerTransport(config_, "rank-00000");
    EXPECT_TRUE(transport.ok()) << transport.status().ToString();
    ProducerOptions o;
    o.id = "rank-00000";
    o.root_address = root_->producer_address();
    o.root_id = "src";
    o.token = kToken;
    o.tls = true;
    o.connect_timeout = 10s;
    const auto t0 = std::chrono::steady_clock::now();
    auto producer = Producer::Connect(std::move(o), std::move(*transport));
    *joined = producer.ok() ? Status::Ok() : producer.status();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Floods the producer port (`hello`: links that pass the transport's hello, else
  // silent sockets) until `slots` are full; a producer must still join within 2 s.
  void FloodThenJoin(bool hello, const std::string& slots) {
    StartFlood(hello);
    ASSERT_GE(flood_.size(), 1030u);
    ASSERT_GE(redialled_.load(), 200u) << "the flood never filled " << slots;
    Status joined;
    const double seconds = JoinProducer(&joined);
    StopFlood();
    EXPECT_TRUE(joined.ok()) << "the producer was refused while the flood lasted: "
                             << joined.ToString();
    EXPECT_LT(seconds, 2.0) << "the producer took " << seconds << " s to join";
    RecordProperty("join_ms", static_cast<int>(seconds * 1000));
    RecordProperty("flood_redialled", static_cast<int>(redialled_.load()));
  }

  test_util::TempDir dir_{"producer_flood_test"};
  topology::ClusterConfig config_;
  std::unique_ptr<Root> root_;
};

// Links that pass the transport's hello and never answer the root's CHALLENGE fill
// the producer hub's 64 slots (relay/producers/producer_hub.cc).
TEST_F(ProducerFloodTest, AProducerJoinsOverTlsWhileHalfOpenLinksFillTheRootsSlots) {
  FloodThenJoin(/*hello=*/true, "the root's handshake slots");
}

// Sockets that never say even the transport's hello fill its 512 slots on the
// producer listener too.
TEST_F(ProducerFloodTest, AProducerJoinsOverTlsWhileSilentSocketsFillTheTransportsSlots) {
  FloodThenJoin(/*hello=*/false, "the transport's handshake slots");
}

// [limits] handshake_max_message holds on the producer listener too: frame headers
// announcing 1 GiB before HELLO allocate nothing, and a producer still joins.
TEST_F(ProducerFloodTest, HugeFramesBeforeHelloAllocateNothing) {
  const uint64_t before = transport::testutil::ResidentBytes();
  std::vector<std::unique_ptr<RawPeer>> peers;
  for (int i = 0; i < 3; ++i) {
    peers.push_back(std::make_unique<RawPeer>(flood_port_));
    ASSERT_TRUE(peers.back()->Hello());
    ASSERT_TRUE(peers.back()->AnnounceFrame(uint64_t{1} << 30));
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_LT(transport::testutil::ResidentBytes(), before + (uint64_t{32} << 20));
  Status joined;
  JoinProducer(&joined);
  EXPECT_TRUE(joined.ok()) << joined.ToString();
}

}  // namespace
}  // namespace deltacast::relay
