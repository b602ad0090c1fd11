// The public API (include/deltacast/) through libdeltacast.so alone: this binary
// links nothing else of deltacast, so it also checks that what embedders need is
// exported.
#include <deltacast/deltacast.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "api_fixture.h"

namespace {

using deltacast::apitest::Model;
using deltacast::apitest::Toml;

int BasePort() { return 28200 + static_cast<int>(::getpid() % 300) * 10; }

TEST(ApiConfig, ABadConfigNamesTheFileAndLine) {
  auto config =
      deltacast::Config::Parse("[cluster]\nname = \"x\"\n[tree]\nfanout = -3\n", "bad.toml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), deltacast::StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("bad.toml:"), std::string::npos)
      << config.status().ToString();
}

TEST(ApiConfig, ListsTheNodesAndDescribesThePlan) {
  auto config = deltacast::Config::Parse(Toml("api", BasePort()), "api.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->source(), "trainer");
  EXPECT_EQ(config->receivers(), (std::vector<std::string>{"w1", "w2"}));
  auto plan = config->DescribePlan();
  ASSERT_TRUE(plan.ok());
  EXPECT_NE(plan->find("w2"), std::string::npos);
}

TEST(ApiConfig, SendersAreNotReceivers) {
  // A sender roots a stripe and holds no weights (topology/stripe_plan.h).
  auto config = deltacast::Config::Parse(
      Toml("api", BasePort()) + "[[node]]\nid = \"snd1\"\nhost = \"127.0.0.1\"\nport = " +
          std::to_string(BasePort() + 9) + "\nrole = \"sender\"\n",
      "api.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->receivers(), (std::vector<std::string>{"w1", "w2"}));
}

// Producers in another region than the root's, under the default tls =
// "cross-region": their links must run TLS, and without certificates the root and
// every producer fail through the API, naming the rule, before they listen or dial.
TEST(ApiProducers, ProducerLinksThatMustRunTlsNeedCertificatesAtBothEnds) {
  auto config = deltacast::Config::Parse(
      Toml("api", BasePort()) +
          "[[region]]\nname = \"eu\"\nwan_bandwidth = \"1Gbit\"\nwan_latency = \"1ms\"\n"
          "[security]\nproducer_region = \"eu\"\n",
      "api.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const std::string why = "the links between producers and the root must run TLS";
  deltacast::RootOptions root_options;
  root_options.token = "t";
  root_options.producer_address = "127.0.0.1:0";
  auto root = deltacast::Root::Start(*config, root_options);
  ASSERT_FALSE(root.ok());
  EXPECT_EQ(root.status().code(), deltacast::StatusCode::kFailedPrecondition);
  EXPECT_NE(root.status().message().find(why), std::string::npos) << root.status().ToString();
  deltacast::ProducerOptions o;
  o.token = "t";
  o.id = "rank-0";
  o.root_address = "127.0.0.1:1";
  auto producer = deltacast::Producer::Connect(*config, o, Model(1).specs);
  ASSERT_FALSE(producer.ok());
  EXPECT_EQ(producer.status().code(), deltacast::StatusCode::kFailedPrecondition);
  EXPECT_NE(producer.status().message().find(why), std::string::npos)
      << producer.status().ToString();
}

TEST(ApiNode, AnUnknownNodeIsRefusedByName) {
  auto config = deltacast::Config::Parse(Toml("api", BasePort()), "api.toml");
  ASSERT_TRUE(config.ok());
  Model m(1);
  deltacast::NodeOptions options;
  options.node_id = "w9";
  options.token = "t";
  auto node = deltacast::Node::Start(*config, options, m.Views());
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().message().find("w9"), std::string::npos) << node.status().ToString();
}

TEST(ApiSource, PublishesToTwoNodesBitExactAndRefusesAnotherModel) {
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  auto config = deltacast::Config::Parse(Toml("api", BasePort() + 1), "api.toml");
  ASSERT_TRUE(config.ok());
  Model trainer(2);
  Model w1 = trainer, w2 = trainer;
  std::vector<std::vector<std::string>> changed(2);
  std::vector<std::unique_ptr<deltacast::Node>> nodes;
  for (int i = 0; i < 2; ++i) {
    deltacast::NodeOptions options;
    options.node_id = "w" + std::to_string(i + 1);
    options.token = "api-token";
    options.apply_threads = 1;
    options.on_commit = [&changed, i](const deltacast::CommitEvent& e) {
      changed[i] = e.changed_tensors;
    };
    auto node = deltacast::Node::Start(*config, options, (i == 0 ? w1 : w2).Views());
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    nodes.push_back(std::move(*node));
  }
  deltacast::SourceOptions options;
  options.token = "api-token";
  auto source = deltacast::Source::Start(*config, options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  Model previous = trainer;
  for (size_t i = 0; i < trainer.bytes[0].size(); i += 64) trainer.bytes[0][i] ^= std::byte{1};
  auto report = (*source)->Publish(previous.Views(), trainer.Views());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes_decided, 2u);
  // Each node says where its time to PREPARED went, and the parts fit in the whole.
  ASSERT_EQ(report->nodes.size(), 2u);
  for (const deltacast::NodeReport& n : report->nodes) {
    SCOPED_TRACE(n.node);
    EXPECT_GT(n.prepared_seconds, 0);
    EXPECT_GT(n.receive_seconds, 0);
    EXPECT_LE(n.receive_seconds, n.prepared_seconds);
    EXPECT_GT(n.check_seconds, 0);
    EXPECT_GT(n.write_seconds, 0);
    EXPECT_GT(n.apply_cpu_seconds, 0);
    EXPECT_GE(n.cpu_wait_seconds, 0);
    EXPECT_GE(n.disk_wait_seconds, 0);
    // One apply thread: its chunks do not overlap, so their times add up to less
    // than BEGIN to PREPARED.
    EXPECT_LE(n.check_seconds + n.write_seconds, n.prepared_seconds);
    EXPECT_LE(n.apply_cpu_seconds + n.cpu_wait_seconds + n.disk_wait_seconds,
              n.prepared_seconds + 1e-3);
  }
  EXPECT_EQ(w1.bytes, trainer.bytes);
  EXPECT_EQ(w2.bytes, trainer.bytes);
  EXPECT_EQ(changed[0], std::vector<std::string>{"a.weight"});
  EXPECT_EQ(nodes[0]->stats().version, report->target_version);

  // A target with another tensor table is not a version of this model.
  Model other(3);
  other.specs[1].shape = {128};
  other.bytes[1].resize(other.specs[1].ByteSize());
  auto refused = (*source)->Publish(trainer.Views(), other.Views());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), deltacast::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("b.bias"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(w1.bytes, trainer.bytes) << "a refused publish changed a node";
}

}  // namespace
