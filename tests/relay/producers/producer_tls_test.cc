// Producer links under [security] (docs/producers.md, "Authentication and
// transports"), over real TLS on loopback tcp with certificates from
// transport::WriteClusterCertificates (what `deltacast certs` writes): the tree is
// one region, the producers sit in another ([security] producer_region), so with
// tls = "cross-region" the producer links run TLS and the tree's hops do not. The
// root, its producers and the nodes make their transports as the CLI does
// (MakeNodeTransports, MakeProducerTransport). Producers over TLS publish and every
// node ends at the target; a producer without TLS, or with another producer's
// certificate, is refused on both ends and the tree keeps its version; a producer
// refuses a root whose certificate is another's.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "codec/manifest.h"
#include "relay/tree/node_transports.h"
#include "tests/relay/producers/root_fixture.h"
#include "tests/relay/tree/security_util.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tls_certs.h"

namespace deltacast::relay {
namespace {

using namespace std::chrono_literals;

class ProducerTlsTest : public RootTest {
 protected:
  void SetUp() override {
    ports_ = testing::FreePorts(3);
    certs_ = dir_.path() / "certs";
    ASSERT_TRUE(transport::WriteClusterCertificates(
                    certs_, {"trainer", "n1", "n2", "rank-00000", "rank-00001"})
                    .ok());
    config_toml_ =
        "[cluster]\nname = \"producer-tls-test\"\n[tree]\nfanout = 2\nchunk_size = \"64KiB\"\n"
        "window = 4\nconnect_timeout = \"5s\"\ncommit_timeout = \"20s\"\n"
        "[[region]]\nname = \"eu\"\nwan_bandwidth = \"1Gbit\"\nwan_latency = \"1ms\"\n"
        "[security]\ntls = \"cross-region\"\nproducer_region = \"eu\"\nca = \"" +
        (certs_ / "ca.crt").string() + "\"\ncert = \"" + (certs_ / "{node}.crt").string() +
        "\"\nkey = \"" + (certs_ / "{node}.key").string() + "\"\n";
    const char* ids[] = {"trainer", "n1", "n2"};
    for (int i = 0; i < 3; ++i) {
      config_toml_ += "[[node]]\nid = \"" + std::string(ids[i]) +
                      "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(ports_[i]) +
                      "\nregion = \"us\"\nrole = \"" + (i == 0 ? "source" : "receiver") + "\"\n";
    }
    producer_address_ = "127.0.0.1:0";
    auto config = topology::ParseClusterConfig(config_toml_, "producer-tls-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    ASSERT_TRUE(topology::ProducerLinksUseTls(config_));
    ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2", 0, 2'000'000, 2));
  }

  std::unique_ptr<transport::Transport> TreeTransport(const std::string& id) override {
    auto t = MakeNodeTransports(config_, *config_.FindNode(id));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(*t) : nullptr;
  }
  std::unique_ptr<transport::Transport> ProducerLinkTransport(const std::string& id) override {
    auto t = MakeProducerTransport(config_, id);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(*t) : nullptr;
  }
  // tcp with `id`'s certificate (another's than the one it claims, in a test).
  std::unique_ptr<transport::Transport> TlsAs(const std::string& id) {
    transport::TcpOptions options;
    options.tls =
        transport::TlsFiles{certs_ / "ca.crt", certs_ / (id + ".crt"), certs_ / (id + ".key")};
    return std::move(*transport::MakeTcpTransport(options));
  }
  ProducerOptions OptionsFor(const std::string& id) {
    ProducerOptions o;
    o.id = id;
    o.root_address = root_->producer_address();
    o.root_id = "trainer";
    o.token = kToken;
    o.threads = 1;
    o.tls = true;
    o.connect_timeout = 3s;
    return o;
  }

  // Every receiver's version, from a hash of what it holds, is the canonical
  // checkpoint's of `step`; and the bytes are that checkpoint's.
  void ExpectEveryNodeAt(int step, const Digest128& reported) {
    auto want = Canonical(step);
    const Digest128 target =
        codec::ComputeManifest(
            want->tensors(), [&](size_t t) { return want->TensorData(t); }, kPartitionBytes, 1)
            .VersionId();
    EXPECT_EQ(reported, target);
    for (size_t i = 0; i < stores_.size(); ++i) {
      const Digest128 held = codec::ComputeManifest(
                                 want->tensors(), [&](size_t t) { return ByteSpan(stores_[i][t]); },
                                 kPartitionBytes, 1)
                                 .VersionId();
      EXPECT_EQ(held, target) << "receiver n" << i + 1 << " is not at step " << step;
    }
    ExpectReceiversAt(step);
  }

  // A producer for rank-00001 that the root must refuse: it fails to join with
  // kFailedPrecondition carrying the root's reason (`why`), the root's Publish says
  // the same, the tree keeps its version; then the real rank-00001 joins over TLS
  // and the refit commits.
  void ExpectRefusedThenTheRealProducerCommits(ProducerOptions options,
                                               std::unique_ptr<transport::Transport> transport,
                                               const std::string& why) {
    producers_.push_back(ConnectProducer(0));
    ASSERT_NE(producers_[0], nullptr);
    auto refused = Producer::Connect(std::move(options), std::move(transport));
    ASSERT_FALSE(refused.ok()) << "the root accepted it";
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
        << refused.status().ToString();
    EXPECT_NE(refused.status().message().find(why), std::string::npos)
        << refused.status().ToString();
    // The root's end: Publish fails before BEGIN and names the refusal.
    auto publish = root_->Publish();
    ASSERT_FALSE(publish.ok());
    EXPECT_NE(publish.status().message().find("1 of 2 producers joined"), std::string::npos)
        << publish.status().ToString();
    EXPECT_NE(publish.status().message().find(why), std::string::npos)
        << publish.status().ToString();
    ExpectReceiversAt(0);
    producers_.push_back(ConnectProducer(1));
    ASSERT_NE(producers_[1], nullptr);
    auto report = Refit(0);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(report->publish.committed) << report->publish.abort_reason;
    ExpectEveryNodeAt(1, report->publish.target_version);
  }

  std::vector<uint16_t> ports_;
  std::filesystem::path certs_;
};

TEST_F(ProducerTlsTest, ProducersOverTlsPublishTwoStepsAndEveryNodeEndsAtTheTarget) {
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  ASSERT_EQ(producers_.size(), 2u);
  for (const auto& p : producers_) ASSERT_NE(p, nullptr);
  for (int step = 0; step < 2; ++step) {
    auto report = Refit(step);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(report->publish.committed) << report->publish.abort_reason;
    ExpectEveryNodeAt(step + 1, report->publish.target_version);
  }
}

TEST_F(ProducerTlsTest, APlaintextProducerIsRefusedOnBothEndsAndTheTreeKeepsItsVersion) {
  join_timeout_ = 1s;
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  ProducerOptions o = OptionsFor("rank-00001");
  o.tls = false;  // a producer that does not know its link must be encrypted
  ASSERT_NO_FATAL_FAILURE(ExpectRefusedThenTheRealProducerCommits(
      std::move(o), std::move(*transport::MakeTcpTransport()),
      "producer 'rank-00001' must connect over TLS with its certificate"));
}

TEST_F(ProducerTlsTest, AProducerWithAnotherProducersCertificateIsRefused) {
  join_timeout_ = 1s;
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  // A certificate of the cluster, but rank-00000's, claiming to be rank-00001
  // (which holds the token too: only the certificate tells them apart).
  ASSERT_NO_FATAL_FAILURE(ExpectRefusedThenTheRealProducerCommits(
      OptionsFor("rank-00001"), TlsAs("rank-00000"),
      "producer 'rank-00001' presented the certificate of 'rank-00000'"));
}

// A producer whose certificate was never issued cannot even make its link: the
// error names the file; and a config that encrypts producer links without naming
// certificates stops the root and every producer before they listen or dial.
TEST_F(ProducerTlsTest, WithoutItsCertificateAProducerCannotStartItsLink) {
  auto missing = MakeProducerTransport(config_, "rank-00009");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("rank-00009.crt"), std::string::npos)
      << missing.status().ToString();
  topology::ClusterConfig bare = config_;
  bare.security.ca.clear();
  bare.security.cert.clear();
  bare.security.key.clear();
  auto unconfigured = MakeProducerTransport(bare, "rank-00000");
  ASSERT_FALSE(unconfigured.ok());
  EXPECT_EQ(unconfigured.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unconfigured.status().message().find(
                "the links between producers and the root must run TLS (it crosses regions (us "
                "-> eu)"),
            std::string::npos)
      << unconfigured.status().message();
  EXPECT_NE(unconfigured.status().message().find("deltacast certs"), std::string::npos);
  RootOptions options;
  options.publish.config = bare;
  options.publish.token = kToken;
  options.producer_address = "127.0.0.1:0";
  auto root = Root::Start(std::move(options), std::move(*transport::MakeTcpTransport()),
                          std::move(*transport::MakeTcpTransport()));
  ASSERT_FALSE(root.ok());
  EXPECT_EQ(root.status().code(), StatusCode::kFailedPrecondition) << root.status().ToString();
}

// The producer's side, as a node checks its parent: a listener on the root's
// producer port with a valid cluster certificate that is not the root's (n1's),
// which even holds the token, gets no HELLO.
TEST_F(ProducerTlsTest, AProducerRefusesARootWhoseCertificateIsAnothers) {
  auto impostor = TlsAs("n1");
  ProducerHub hub("trainer", kToken, /*capacity=*/1);
  auto address = hub.Listen(*impostor, "127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  ProducerOptions o;
  o.id = "rank-00000";
  o.root_address = *address;
  o.root_id = "trainer";
  o.token = kToken;
  o.tls = true;
  o.connect_timeout = 3s;
  auto p = Producer::Connect(std::move(o), TlsAs("rank-00000"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kPermissionDenied) << p.status().ToString();
  EXPECT_NE(p.status().message().find("its certificate is that of 'n1', not of 'trainer'"),
            std::string::npos)
      << p.status().ToString();
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(hub.Joined().empty());
  hub.Close();
}

}  // namespace
}  // namespace deltacast::relay
