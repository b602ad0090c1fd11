// Attacks on the relay tree, in one process over tcp on loopback: the findings of
// issue 17 replayed as scenarios. Each test would pass for the attacker without
// the defence it names.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/log.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/publisher.h"
#include "relay/wire/signing.h"
#include "tests/relay/tree/security_util.h"
#include "tests/transport/raw_peer.h"
#include "topology/cluster_config.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tls_certs.h"

namespace deltacast::relay {
namespace {

using namespace std::chrono_literals;
using testing::Borrow;
using testing::Impostor;
using testing::ManifestOf;
using testing::Versions;

constexpr char kToken[] = "security-test-token";

// A chain src -> n1 -> n2 on loopback tcp.
std::string ChainToml(const std::vector<uint16_t>& ports, const std::string& extra = "") {
  std::string toml =
      "[cluster]\nname = \"security-test\"\n[tree]\nfanout = 1\nchunk_size = \"16KiB\"\n"
      "window = 4\nconnect_timeout = \"5s\"\nidle_timeout = \"30s\"\ncommit_timeout = "
      "\"10s\"\n" +
      extra + "\n[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports[0]) +
      "\nrole = \"source\"\n";
  for (size_t i = 1; i < ports.size(); ++i) {
    toml += "[[node]]\nid = \"n" + std::to_string(i) +
            "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports[i]) + "\n";
  }
  return toml;
}

std::unique_ptr<transport::Transport> Tcp() { return std::move(*transport::MakeTcpTransport()); }

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ports_ = testing::FreePorts(3);
    v_ = testing::MakeVersions(1 << 15, 7);
  }
  void TearDown() override {
    for (auto& a : agents_) a->Stop();
  }
  void UseConfig(const std::string& toml) {
    auto config = topology::ParseClusterConfig(toml, "security-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
  }
  void StartAgents(int n, std::shared_ptr<const VerifyKey> verify_key = nullptr) {
    stores_.assign(n, v_.base);
    for (int i = 0; i < n; ++i) {
      auto replica =
          apply::Replica::ForStore(Borrow(v_.tensors, stores_[i]), testing::kPartitionBytes, 1);
      ASSERT_TRUE(replica.ok());
      NodeAgentOptions options;
      options.config = config_;
      options.node_id = "n" + std::to_string(i + 1);
      options.token = kToken;
      options.apply_threads = 1;
      options.verify_key = verify_key;
      // The agent's own transports, limits from the config, as `deltacast agent` makes them.
      auto transport = MakeNodeTransports(config_, *config_.FindNode(options.node_id));
      ASSERT_TRUE(transport.ok()) << transport.status().ToString();
      auto agent = NodeAgent::Start(std::move(options), std::move(*replica), std::move(*transport));
      ASSERT_TRUE(agent.ok()) << agent.status().ToString();
      agents_.push_back(std::move(*agent));
    }
  }
  Result<PublishReport> PublishReal(std::shared_ptr<const SigningKey> key = nullptr) {
    auto base = Borrow(v_.tensors, v_.base);
    auto target = Borrow(v_.tensors, v_.target);
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    options.encode_threads = 1;
    options.signing_key = key;
    return Publish(options, *base, ManifestOf(v_.tensors, v_.base), *target,
                   ManifestOf(v_.tensors, v_.target), Tcp());
  }
  std::string SourceAddress() const { return "127.0.0.1:" + std::to_string(ports_[0]); }
  // A forged version: the base with a few bytes of layer0 overwritten.
  std::vector<std::vector<std::byte>> Forged() const {
    auto forged = v_.base;
    for (int i = 0; i < 64; ++i) forged[0][4096 + i] = std::byte{0x5a};
    return forged;
  }
  Begin ForgedBegin(const std::vector<std::vector<std::byte>>& forged) const {
    return Begin{0x1234, ManifestOf(v_.tensors, v_.base).VersionId(),
                 ManifestOf(v_.tensors, forged).VersionId(), testing::kPartitionBytes};
  }
  bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(20ms);
    }
    return done();
  }

  std::vector<uint16_t> ports_;
  Versions v_;
  topology::ClusterConfig config_;
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
};

// Finding 1: a process without the token bound the source's port between two
// refits and sent WELCOME, a forged delta and COMMIT; both nodes below committed it.
TEST_F(SecurityTest, ProcessWithoutTheTokenOnTheSourcesPortIsRefusedByTheChild) {
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_)));
  ASSERT_NO_FATAL_FAILURE(StartAgents(2));
  const auto forged = Forged();
  {
    Impostor impostor(Tcp(), SourceAddress(), "src", "not-the-token", ForgedBegin(forged),
                      testing::DeltaChunks(v_, forged));
    // n1 dials, answers the CHALLENGE (it cannot tell yet), and refuses the WELCOME.
    ASSERT_TRUE(WaitFor([&] { return impostor.refused >= 2; }, 15s))
        << "hellos " << impostor.hellos << ", refused " << impostor.refused;
    EXPECT_EQ(impostor.prepared, 0);
    EXPECT_EQ(agents_[0]->stats().parent_joins, 0u);
    EXPECT_EQ(agents_[0]->stats().chunks_received, 0u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(agents_[i]->stats().refits_committed, 0u);
      EXPECT_EQ(stores_[i], v_.base) << "node n" << i + 1 << " changed";
    }
  }
  // The real source, once back, is joined and commits as usual.
  auto report = PublishReal();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(stores_[i], v_.target) << "node n" << i + 1;
}

// With the token, a process on the source's address passes the handshake; what it
// says must still carry the source's signature. Unsigned, or signed with another
// key, its version and its COMMIT are refused, and nothing is applied.
TEST_F(SecurityTest, ImpostorWithTheTokenCannotInjectAVersionIntoASignedCluster) {
  auto source_key = std::make_shared<const SigningKey>(*SigningKey::Generate());
  auto verify = std::make_shared<const VerifyKey>(source_key->Public());
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_)));
  ASSERT_NO_FATAL_FAILURE(StartAgents(2, verify));
  const auto forged = Forged();
  const SigningKey other = *SigningKey::Generate();
  for (const SigningKey* key : {static_cast<const SigningKey*>(nullptr), &other}) {
    Begin begin = ForgedBegin(forged);
    if (key) SignBegin(*key, begin);
    std::vector<std::vector<std::byte>> chunks;
    for (const auto& c : testing::DeltaChunks(v_, forged)) {
      chunks.push_back(EncodeSignedChunk(key, ChunkOf(c)));
    }
    Impostor impostor(Tcp(), SourceAddress(), "src", kToken, begin, std::move(chunks));
    ASSERT_TRUE(WaitFor([&] { return impostor.refused >= 1; }, 15s))
        << "hellos " << impostor.hellos << ", refused " << impostor.refused;
    EXPECT_EQ(impostor.prepared, 0);
    EXPECT_EQ(impostor.committed, 0);
    EXPECT_EQ(agents_[0]->stats().chunks_received, 0u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(agents_[i]->stats().refits_committed, 0u);
      EXPECT_EQ(stores_[i], v_.base) << "node n" << i + 1 << " changed";
    }
  }
  // A source that signs is followed as usual.
  auto report = PublishReal(source_key);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(stores_[i], v_.target) << "node n" << i + 1;
}

// Without signing, the same impostor (it has the token) would have its version
// applied: shows that the test above tests the signatures, not something else.
TEST_F(SecurityTest, WithoutSigningAnImpostorWithTheTokenIsFollowed) {
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_)));
  ASSERT_NO_FATAL_FAILURE(StartAgents(2));
  const auto forged = Forged();
  Impostor impostor(Tcp(), SourceAddress(), "src", kToken, ForgedBegin(forged),
                    testing::DeltaChunks(v_, forged));
  ASSERT_TRUE(WaitFor([&] { return agents_[1]->stats().refits_committed == 1; }, 15s));
  EXPECT_EQ(stores_[0], forged);
  EXPECT_EQ(stores_[1], forged);
}

// A parent that sends, after a refit's BEGIN, a chunk of another delta (here the END
// of base -> forged behind the data chunks of base -> target) is refused: taken for
// this refit's END, it said the stream was whole (the simulator's --stripes seed
// 70276 took another delta's END for its own stripe's). Nothing commits; the real
// source, once back, commits the target.
TEST_F(SecurityTest, AChunkOfAnotherDeltaAfterABeginIsRefused) {
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_)));
  ASSERT_NO_FATAL_FAILURE(StartAgents(2));
  auto chunks = testing::DeltaChunks(v_, v_.target);
  auto others = testing::DeltaChunks(v_, Forged());
  ASSERT_GE(chunks.size(), 2u);
  chunks.back() = others.back();  // the END of another delta
  const Begin begin{0x4321, ManifestOf(v_.tensors, v_.base).VersionId(),
                    ManifestOf(v_.tensors, v_.target).VersionId(), testing::kPartitionBytes};
  {
    Impostor parent(Tcp(), SourceAddress(), "src", kToken, begin, std::move(chunks));
    ASSERT_TRUE(WaitFor([&] { return parent.refused >= 1; }, 15s))
        << "hellos " << parent.hellos << ", prepared " << parent.prepared;
    EXPECT_EQ(parent.prepared, 0);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(agents_[i]->stats().refits_committed, 0u);
  }
  auto report = PublishReal();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(stores_[i], v_.target) << "node n" << i + 1;
}

// Finding 2: a FETCH whose offset and length wrap around 2^64 crashed the serving
// node. Offsets are checked without overflow (offset * element size would wrap to
// the tensor's first bytes here), lengths are capped to a partition, and the node
// keeps serving.
TEST_F(SecurityTest, FetchesWhoseOffsetOrLengthWrapAreRefusedAndTheNodeKeepsServing) {
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_)));
  ASSERT_NO_FATAL_FAILURE(StartAgents(1));
  auto client = Tcp();
  testing::ChildPeer child(*client, "127.0.0.1:" + std::to_string(ports_[1]), "n2", "n1", kToken);
  ASSERT_TRUE(child.joined());
  const std::string tensor = v_.tensors[0].name;
  const uint64_t elements = v_.tensors[0].ElementCount();
  const auto first16 = HashPartition(ByteSpan(v_.base[0]).first(16));
  struct Case {
    uint64_t offset, length;
    bool found;
  };
  const Case cases[] = {
      {uint64_t{1} << 63, 16, false},  // 2^63 BF16 elements = 2^64 bytes: wraps to byte 0
      {(uint64_t{1} << 63) + 1, 16, false},
      {elements - 1, kMaxFetchBytes, false},  // runs past the end
      {elements, 0, false},
      {~uint64_t{0}, 16, false},
      {0, 16, true},  // the node still answers
  };
  uint64_t id = 1;
  for (const Case& c : cases) {
    child.Send(EncodeFetch({id, tensor, c.offset, c.length, first16}));
    auto answer = child.Next(MessageType::kPartition);
    ASSERT_TRUE(answer.has_value()) << "no answer to offset " << c.offset;
    auto p = ParsePartition(**answer);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->request_id, id);
    EXPECT_EQ(p->found, c.found) << "offset " << c.offset << " length " << c.length;
    if (c.found) {
      EXPECT_EQ(std::vector<std::byte>(p->bytes.begin(), p->bytes.end()),
                std::vector<std::byte>(v_.base[0].begin(), v_.base[0].begin() + 16));
    }
    ++id;
  }
  // A length beyond any partition does not even parse; the link stays up.
  child.Send(EncodeFetch({id, tensor, 0, ~uint64_t{0}, first16}));
  child.Send(EncodeFetch({id + 1, tensor, 0, 16, first16}));
  auto answer = child.Next(MessageType::kPartition);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(ParsePartition(**answer)->request_id, id + 1);
  EXPECT_FALSE(child.closed());
}

// A request routed up carries its hops in the top byte of its id (docs/protocol.md,
// "Message types"): one that has made 64 is in a loop (paths across stripes can
// come back; the simulator's --stripes seed 20597 circled one until the commit
// timeout) and n1 answers it "not found" at once. One that may go on waits for n1's
// parent (not running here) 500 ms, then is answered "not found". Each answer names
// the id the child sent.
TEST_F(SecurityTest, ARequestPastTheHopLimitIsNotFoundAtOnceAndOneWithoutAParentAfterAWait) {
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_)));
  ASSERT_NO_FATAL_FAILURE(StartAgents(1));  // n1, whose parent (the source) is not running
  auto client = Tcp();
  testing::ChildPeer child(*client, "127.0.0.1:" + std::to_string(ports_[1]), "n2", "n1", kToken);
  ASSERT_TRUE(child.joined());
  const Digest128 version = Hash128(AsBytes("a version"));
  const uint64_t waits = 7, looped = (uint64_t{64} << 56) | 8;
  const auto sent = std::chrono::steady_clock::now();
  child.Send(EncodeFetchManifest({waits, version, version}));
  child.Send(EncodeFetchManifest({looped, version, version}));
  std::vector<uint64_t> answered;
  for (int i = 0; i < 2; ++i) {
    auto answer = child.Next(MessageType::kManifest, std::chrono::seconds(10));
    ASSERT_TRUE(answer.has_value()) << "answer " << i;
    auto m = ParseManifest(**answer);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_FALSE(m->found);
    answered.push_back(m->request_id);
    if (m->request_id == waits) {
      EXPECT_GE(std::chrono::steady_clock::now() - sent, std::chrono::milliseconds(500));
    }
  }
  EXPECT_EQ(answered, (std::vector<uint64_t>{looped, waits}));  // the looped one first
  EXPECT_EQ(agents_[0]->stats().stripe_up_requests[0], 0u);     // neither went up
  EXPECT_FALSE(child.closed());
}

// An answer is taken only as the type its id asked for: a relay that restarted
// numbers its requests afresh, and an answer to what its dead self routed up came
// back as the answer to a new request of another type under the same id (the
// simulator's --stripes seed 17320: a CHAIN went down for a child's FETCH_MANIFEST,
// whose real answer then found nobody waiting, and that child's catch-up waited for
// its manifest until the commit timeout). Here n1's parent answers the routed
// FETCH_MANIFEST with a CHAIN first, then with the MANIFEST: the child gets the
// manifest, under the id it sent, and no chain.
TEST_F(SecurityTest, AnAnswerOfTheWrongTypeIsDroppedAndTheRightOneStillReachesTheChild) {
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_)));
  std::atomic<uint64_t> routed_id{0};
  testing::AnsweringParent parent(
      Tcp(), SourceAddress(), "src", kToken, [&](transport::Connection& link, ByteSpan message) {
        auto type = PeekType(message);
        if (!type.ok() || *type != MessageType::kFetchManifest) return;
        const uint64_t id = RequestIdOf(message);
        routed_id = id;
        Chain wrong;
        wrong.request_id = id;
        link.Send(transport::MakeMessage(EncodeChain(wrong)));
        link.Send(transport::MakeMessage(EncodeManifest(id, false, {})));
      });
  ASSERT_NO_FATAL_FAILURE(StartAgents(1));
  auto client = Tcp();
  testing::ChildPeer child(*client, "127.0.0.1:" + std::to_string(ports_[1]), "n2", "n1", kToken);
  ASSERT_TRUE(child.joined());
  ASSERT_TRUE(WaitFor([&] { return parent.hellos > 0; }, 10s)) << "n1 did not join its parent";
  const Digest128 version = Hash128(AsBytes("a version"));
  const uint64_t asked = 7;
  child.Send(EncodeFetchManifest({asked, version, version}));
  auto answer = child.Next(MessageType::kManifest, std::chrono::seconds(10));
  ASSERT_TRUE(answer.has_value()) << "the manifest's answer did not come down";
  auto m = ParseManifest(**answer);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->request_id, asked);
  EXPECT_NE(routed_id.load(), asked) << "routed up under a number of n1's own";
  EXPECT_FALSE(child.Next(MessageType::kChain, 300ms).has_value()) << "the wrong answer came down";
}

// Finding 4 at the relay: links that pass the transport handshake and never send
// HELLO hold a slot only until the handshake timeout; one address gets at most
// max_handshakes_per_address slots, so a legitimate child joins through a flood.
TEST_F(SecurityTest, SilentLinksAreCappedPerAddressAndDroppedAtTheHandshakeTimeout) {
  ASSERT_NO_FATAL_FAILURE(
      UseConfig(ChainToml(ports_,
                          "[limits]\nhandshake_timeout = \"1500ms\"\nmax_pending_handshakes = 16\n"
                          "max_handshakes_per_address = 4\n")));
  ASSERT_NO_FATAL_FAILURE(StartAgents(1));  // n1; the test plays a flood, then n2
  std::vector<std::unique_ptr<transport::testutil::RawPeer>> flood;
  for (int i = 0; i < 30; ++i) {
    flood.push_back(std::make_unique<transport::testutil::RawPeer>(ports_[1], "127.0.0.2"));
    ASSERT_TRUE(flood.back()->Hello()) << "transport handshake " << i;
  }
  int closed_at_once = 0;
  for (auto& p : flood) closed_at_once += p->ClosedByPeer(100) ? 1 : 0;
  EXPECT_EQ(closed_at_once, 26) << "4 of 30 silent links keep a slot";
  // A child from another address joins while the 4 wait.
  auto client = Tcp();
  testing::ChildPeer child(*client, "127.0.0.1:" + std::to_string(ports_[1]), "n2", "n1", kToken);
  EXPECT_TRUE(child.joined());
  // And the 4 are dropped at the handshake timeout.
  int closed = 0;
  for (auto& p : flood) closed += p->ClosedByPeer(3000) ? 1 : 0;
  EXPECT_EQ(closed, 30);
}

// Finding 3 at the agent: a frame header announcing 1 GiB before HELLO allocates
// nothing, and the link goes at the handshake timeout.
TEST_F(SecurityTest, HugeFramesBeforeHelloAllocateNothingAndAreDropped) {
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_, "[limits]\nhandshake_timeout = \"1s\"\n")));
  ASSERT_NO_FATAL_FAILURE(StartAgents(1));
  const uint64_t before = transport::testutil::ResidentBytes();
  std::vector<std::unique_ptr<transport::testutil::RawPeer>> peers;
  for (int i = 0; i < 3; ++i) {
    peers.push_back(std::make_unique<transport::testutil::RawPeer>(ports_[1]));
    ASSERT_TRUE(peers.back()->Hello());
    ASSERT_TRUE(peers.back()->AnnounceFrame(uint64_t{1} << 30));
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_LT(transport::testutil::ResidentBytes(), before + (uint64_t{32} << 20));
  for (auto& p : peers) EXPECT_TRUE(p->ClosedByPeer(3000));
}

// A thousand sockets that never even say the transport's hello: those beyond the
// caps are closed at accept, so the agent's descriptors stay bounded (1,000 such
// sockets held 1,007 descriptors before).
TEST_F(SecurityTest, AThousandSilentSocketsDoNotExhaustDescriptors) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_max < 4096) GTEST_SKIP() << "needs 4096 descriptors";
  limit.rlim_cur = std::max<rlim_t>(limit.rlim_cur, 4096);
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ChainToml(ports_, "[limits]\nhandshake_timeout = \"2s\"\n")));
  ASSERT_NO_FATAL_FAILURE(StartAgents(1));
  const auto fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                         std::filesystem::directory_iterator{});
  };
  const auto before = fds();
  std::vector<std::unique_ptr<transport::testutil::RawPeer>> flood;
  for (int i = 0; i < 1000; ++i) {
    flood.push_back(std::make_unique<transport::testutil::RawPeer>(ports_[1], "127.0.0.2"));
  }
  std::this_thread::sleep_for(300ms);
  const auto during = fds() - before - 1000;  // the agent's share: the rest are the test's
  const auto& limits = config_.limits;
  EXPECT_LE(during, limits.max_handshakes_per_address + 16)
      << "the agent holds " << during << " descriptors for 1000 silent sockets";
  auto client = Tcp();
  testing::ChildPeer child(*client, "127.0.0.1:" + std::to_string(ports_[1]), "n2", "n1", kToken);
  EXPECT_TRUE(child.joined());
}

// Finding 5: a node id with a newline was written raw into the log. Peer strings
// are refused where they must be ids, and escaped wherever they are logged.
TEST(LogEscapeTest, PeerStringsCannotForgeLogLines) {
  EXPECT_EQ(log::Escape("n1\n2026-12-01 info forged"), "n1\\x0a2026-12-01 info forged");
  EXPECT_EQ(log::Escape("a\\b"), "a\\\\b");
  EXPECT_EQ(log::Escape("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(log::Escape("caf\xc3\xa9"), "caf\\xc3\\xa9");
  EXPECT_EQ(log::Escape("plain-id_1.2"), "plain-id_1.2");
}

// TLS on the hops the config encrypts: a chain src -> n1 -> n2 where n2 is in
// another region, so n1 -> n2 runs TLS by default and src -> n1 does not.
class TlsHopTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    dir_ = std::filesystem::temp_directory_path() /
           ("deltacast-tls-hop-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(transport::WriteClusterCertificates(dir_, {"src", "n1", "n2", "n3"}).ok());
    std::string toml =
        "[cluster]\nname = \"tls-test\"\n[tree]\nfanout = 1\nchunk_size = \"16KiB\"\n"
        "window = 4\nconnect_timeout = \"5s\"\ncommit_timeout = \"10s\"\n"
        "[[region]]\nname = \"eu\"\nwan_bandwidth = \"1Gbit\"\nwan_latency = \"1ms\"\n"
        "[security]\nca = \"" +
        (dir_ / "ca.crt").string() + "\"\ncert = \"" + (dir_ / "{node}.crt").string() +
        "\"\nkey = \"" + (dir_ / "{node}.key").string() + "\"\n";
    toml += "[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports_[0]) +
            "\nrole = \"source\"\nregion = \"us\"\n";
    toml += "[[node]]\nid = \"n1\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports_[1]) +
            "\nregion = \"us\"\nparent = \"src\"\n";
    toml += "[[node]]\nid = \"n2\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports_[2]) +
            "\nregion = \"eu\"\nparent = \"n1\"\n";
    ASSERT_NO_FATAL_FAILURE(UseConfig(toml));
  }
  void TearDown() override {
    SecurityTest::TearDown();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::unique_ptr<transport::Transport> TlsAs(const std::string& id) {
    transport::TcpOptions options;
    options.tls = transport::TlsFiles{dir_ / "ca.crt", dir_ / (id + ".crt"), dir_ / (id + ".key")};
    return std::move(*transport::MakeTcpTransport(options));
  }
  std::filesystem::path dir_;
};

TEST_F(TlsHopTest, TheCrossRegionHopRunsTlsAndTheVersionCommits) {
  ASSERT_NO_FATAL_FAILURE(StartAgents(2));
  auto report = PublishReal();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(stores_[i], v_.target) << "node n" << i + 1;
}

TEST_F(TlsHopTest, AChildOnAnEncryptedHopMustShowItsOwnCertificate) {
  ASSERT_NO_FATAL_FAILURE(StartAgents(1));  // n1, whose child n2 is across regions
  const std::string n1 = "127.0.0.1:" + std::to_string(ports_[1]);
  {
    auto plain = Tcp();  // plaintext, token right: refused, TLS is required on this hop
    testing::ChildPeer child(*plain, n1, "n2", "n1", kToken);
    EXPECT_FALSE(child.joined());
  }
  {
    auto impostor = TlsAs("n3");  // a cluster certificate, but n3's, claiming to be n2
    testing::ChildPeer child(*impostor, "tls://" + n1, "n2", "n1", kToken);
    EXPECT_FALSE(child.joined());
  }
  {
    auto real = TlsAs("n2");
    testing::ChildPeer child(*real, "tls://" + n1, "n2", "n1", kToken);
    EXPECT_TRUE(child.joined());
  }
}

// The child's side: a parent whose certificate (a valid one of the cluster) names
// another node is refused before the child says anything.
TEST_F(TlsHopTest, AParentWithAnotherNodesCertificateIsRefused) {
  stores_.assign(2, v_.base);
  auto replica =
      apply::Replica::ForStore(Borrow(v_.tensors, stores_[1]), testing::kPartitionBytes, 1);
  ASSERT_TRUE(replica.ok());
  NodeAgentOptions options;
  options.config = config_;
  options.node_id = "n2";
  options.token = kToken;
  auto transport = MakeNodeTransports(config_, *config_.FindNode("n2"));
  ASSERT_TRUE(transport.ok()) << transport.status().ToString();
  auto agent = NodeAgent::Start(std::move(options), std::move(*replica), std::move(*transport));
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  agents_.push_back(std::move(*agent));
  Impostor impostor(TlsAs("n3"), "127.0.0.1:" + std::to_string(ports_[1]), "n1", kToken,
                    ForgedBegin(Forged()), testing::DeltaChunks(v_, Forged()));
  std::this_thread::sleep_for(1500ms);  // n2 dials every 100-500 ms
  EXPECT_EQ(impostor.hellos, 0) << "n2 answered a parent that is not n1";
  EXPECT_EQ(agents_[0]->stats().parent_joins, 0u);
  EXPECT_EQ(stores_[1], v_.base);
}

TEST_F(TlsHopTest, WithoutCertificatesACrossRegionNodeRefusesToStart) {
  config_.security = {};  // tls = cross-region by default, no files
  auto replica = apply::Replica::ForStore(Borrow(v_.tensors, v_.base), testing::kPartitionBytes, 1);
  ASSERT_TRUE(replica.ok());
  NodeAgentOptions options;
  options.config = config_;
  options.node_id = "n2";
  options.token = kToken;
  auto agent = NodeAgent::Start(std::move(options), std::move(*replica), Tcp());
  ASSERT_FALSE(agent.ok());
  EXPECT_EQ(agent.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(agent.status().message().find("n1 -> n2 must run TLS"), std::string::npos)
      << agent.status().message();
  EXPECT_NE(agent.status().message().find("deltacast certs"), std::string::npos);
}

// A signed chunk changed in transit (or by a relay) no longer verifies; nor does a
// signature made for one message type stand for another.
TEST(SigningTest, SignaturesCoverTheirMessageAndNothingElse) {
  const SigningKey key = *SigningKey::Generate();
  const VerifyKey verify = key.Public();
  Begin begin{7, Hash128(AsBytes("a")), Hash128(AsBytes("b")), 4096};
  begin.manifest_digest = Sha256(AsBytes("manifest"));
  SignBegin(key, begin);
  EXPECT_TRUE(VerifyBegin(verify, begin).ok());
  auto parsed = ParseBegin(EncodeBegin(begin));
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(VerifyBegin(verify, *parsed).ok()) << "the signature travels in BEGIN";
  for (int field = 0; field < 6; ++field) {
    Begin changed = begin;
    if (field == 0) changed.refit_id ^= 1;
    if (field == 1) changed.target_version.bytes[0] ^= 1;
    if (field == 2) changed.partition_bytes *= 2;
    if (field == 3) changed.manifest_digest[5] ^= 1;
    if (field == 4) changed.stream_id ^= 1;
    // A relay that made an old refit look newer would have nodes drop the live one.
    if (field == 5) changed.begun_at_us += 1;
    EXPECT_EQ(VerifyBegin(verify, changed).code(), StatusCode::kPermissionDenied) << field;
  }
  Decision commit{7, begin.target_version};
  SignDecision(key, MessageType::kCommit, commit);
  EXPECT_TRUE(VerifyDecision(verify, MessageType::kCommit, commit).ok());
  EXPECT_FALSE(VerifyDecision(verify, MessageType::kAbort, commit).ok());
  Decision other = commit;
  other.refit_id = 8;
  EXPECT_FALSE(VerifyDecision(verify, MessageType::kCommit, other).ok());

  auto chunk = EncodeSignedChunk(&key, AsBytes("some chunk bytes"));
  EXPECT_TRUE(VerifyChunkMessage(verify, chunk).ok());
  chunk[kMessageHeaderBytes + 3] ^= std::byte{1};
  EXPECT_FALSE(VerifyChunkMessage(verify, chunk).ok());
  EXPECT_FALSE(VerifyChunkMessage(verify, EncodeChunk(AsBytes("some chunk bytes"))).ok());
  // Another key's signature is not the source's.
  const SigningKey stranger = *SigningKey::Generate();
  EXPECT_FALSE(VerifyChunkMessage(verify, EncodeSignedChunk(&stranger, AsBytes("x"))).ok());
}

TEST(SigningTest, KeysRoundTripThroughPemFiles) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("deltacast-signing-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const SigningKey key = *SigningKey::Generate();
  ASSERT_TRUE(key.Write(dir / "signing.key").ok());
  ASSERT_TRUE(key.Public().Write(dir / "verify.pub").ok());
  EXPECT_EQ(std::filesystem::status(dir / "signing.key").permissions() &
                std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  auto loaded = SigningKey::Load(dir / "signing.key");
  auto verify = VerifyKey::Load(dir / "verify.pub");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(verify.ok()) << verify.status().ToString();
  EXPECT_TRUE(verify->Verify(AsBytes("m"), loaded->Sign(AsBytes("m"))));
  // A private key is not a public key, and garbage is neither.
  EXPECT_EQ(VerifyKey::Load(dir / "signing.key").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(VerifyKey::Load(dir / "missing.pub").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deltacast::relay
