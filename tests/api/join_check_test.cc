// Mistakes caught at the door, through the public API: a node whose weights are not
// the cluster's version, or whose token is wrong, is told so when it joins (and
// the publish names it), and Verify audits what a node holds. Links to
// libdeltacast.so alone, like api_test.cc.
#include <deltacast/deltacast.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "api_fixture.h"

namespace {

using deltacast::apitest::Model;
using deltacast::apitest::Toml;

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// Ports of their own per process (each test runs in its own process under ctest).
int BasePort() { return 28202 + static_cast<int>(::getpid() % 300) * 10; }

struct Cluster {
  deltacast::Config config;
  std::vector<std::unique_ptr<deltacast::Node>> nodes;

  static deltacast::Config Parse() {
    auto config = deltacast::Config::Parse(Toml("join", BasePort()), "join.toml");
    EXPECT_TRUE(config.ok()) << config.status().ToString();
    return *config;
  }
  Cluster() : config(Parse()) { deltacast::SetLogLevel(deltacast::LogLevel::kOff); }

  deltacast::Node& Start(const std::string& id, Model& weights, const std::string& token) {
    deltacast::NodeOptions options;
    options.node_id = id;
    options.token = token;
    options.apply_threads = 1;
    auto node = deltacast::Node::Start(config, options, weights.Views());
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    nodes.push_back(std::move(*node));
    return *nodes.back();
  }
  std::unique_ptr<deltacast::Source> Source(const std::string& token) {
    deltacast::SourceOptions options;
    options.token = token;
    auto source = deltacast::Source::Start(config, options);
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    return std::move(*source);
  }
};

TEST(ApiJoin, WeightsThatAreNotTheClustersVersionAreNamedAtJoinAndInThePublish) {
  Cluster cluster;
  Model trainer(2);
  Model w1 = trainer;
  Model w2 = trainer;
  w2.bytes[0][70000] ^= std::byte{0x04};       // one bit of a.weight
  w2.specs[1].dtype = deltacast::DType::kI32;  // b.bias: same bytes, another dtype
  const Model w2_before = w2;
  auto source = cluster.Source("t");
  EXPECT_EQ(source->version(), "");
  ASSERT_TRUE(source->SetVersion(trainer.Views()).ok());
  EXPECT_EQ(source->version().size(), 32u);
  deltacast::Node& n1 = cluster.Start("w1", w1, "t");
  deltacast::Node& n2 = cluster.Start("w2", w2, "t");

  EXPECT_TRUE(n1.WaitForJoin(milliseconds(10000)).ok());
  const deltacast::Status joined = n2.WaitForJoin(milliseconds(10000));
  EXPECT_EQ(joined.code(), deltacast::StatusCode::kFailedPrecondition) << joined.ToString();
  EXPECT_THAT(joined.message(), HasSubstr("'a.weight': bits differ in partition 0 (1 of 1)"));
  EXPECT_THAT(joined.message(), HasSubstr("'b.bias': dtype I32, expected F32"));

  // The publish fails everywhere, and says which tensors of which node.
  Model target = trainer;
  target.bytes[0][0] ^= std::byte{1};
  auto report = source->Publish(trainer.Views(), target.Views());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed);
  EXPECT_THAT(report->abort_reason, HasSubstr("w2"));
  EXPECT_THAT(report->abort_reason, HasSubstr("a.weight"));
  EXPECT_EQ(w1.bytes, trainer.bytes) << "w1 was not rolled back";
  EXPECT_EQ(w2.bytes, w2_before.bytes) << "w2's weights were touched";
  EXPECT_EQ(source->version(), report->base_version);
}

TEST(ApiJoin, AWrongTokenIsReportedOnBothEnds) {
  Cluster cluster;
  Model trainer(3);
  Model w1 = trainer;
  Model w2 = trainer;
  auto source = cluster.Source("right");
  deltacast::Node& n1 = cluster.Start("w1", w1, "wrong");
  deltacast::Node& n2 = cluster.Start("w2", w2, "right");
  const deltacast::Status refused = n1.WaitForJoin(milliseconds(10000));
  EXPECT_EQ(refused.code(), deltacast::StatusCode::kPermissionDenied) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("wrong cluster token"));
  // w2's parent is w1 in this plan (trainer -> w1 -> w2): w1, holding another
  // token, cannot prove it to w2 either.
  const deltacast::Status n2_joined = n2.WaitForJoin(milliseconds(10000));
  EXPECT_EQ(n2_joined.code(), deltacast::StatusCode::kPermissionDenied) << n2_joined.ToString();
  EXPECT_THAT(n2_joined.message(), HasSubstr("parent 'w1' refused this node"));

  Model target = trainer;
  target.bytes[1][8] ^= std::byte{1};
  auto report = source->Publish(trainer.Views(), target.Views());
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), deltacast::StatusCode::kUnavailable);
  EXPECT_THAT(report.status().message(),
              HasSubstr("w1 (refused: node 'w1' failed authentication (wrong cluster token))"));
  EXPECT_EQ(w2.bytes, trainer.bytes) << "a publish that never began changed a node";
}

TEST(ApiJoin, ARelayNamesTheChildItRefusedInItsFailure) {
  Cluster cluster;
  Model trainer(6);
  Model w1 = trainer;
  Model w2 = trainer;
  auto source = cluster.Source("right");
  deltacast::Node& n1 = cluster.Start("w1", w1, "right");
  deltacast::Node& n2 = cluster.Start("w2", w2, "wrong");
  // The source knows no version before its first publish: w1 is let in unchecked.
  const deltacast::Status n1_joined = n1.WaitForJoin(milliseconds(10000));
  EXPECT_TRUE(n1_joined.ok()) << n1_joined.ToString();
  EXPECT_EQ(n2.WaitForJoin(milliseconds(10000)).code(), deltacast::StatusCode::kPermissionDenied);

  Model target = trainer;
  target.bytes[1][8] ^= std::byte{1};
  auto report = source->Publish(trainer.Views(), target.Views());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed);
  EXPECT_THAT(report->abort_reason,
              HasSubstr("its last attempt was refused: node 'w2' failed authentication (wrong "
                        "cluster token)"));
  EXPECT_EQ(w1.bytes, trainer.bytes) << "w1 was not rolled back";
}

TEST(ApiJoin, VerifyAuditsWhatANodeHolds) {
  Cluster cluster;
  Model trainer(4);
  Model w1 = trainer;
  Model w2 = trainer;
  auto source = cluster.Source("t");
  deltacast::Node& n1 = cluster.Start("w1", w1, "t");
  cluster.Start("w2", w2, "t");
  Model target = trainer;
  for (size_t i = 0; i < target.bytes[0].size(); i += 512) target.bytes[0][i] ^= std::byte{2};
  auto report = source->Publish(trainer.Views(), target.Views());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(source->version(), report->target_version);

  auto clean = n1.Verify();
  ASSERT_TRUE(clean.ok()) << clean.status().ToString();
  EXPECT_TRUE(clean->ok()) << clean->summary;
  EXPECT_EQ(clean->version, report->target_version);
  EXPECT_EQ(clean->tensors, 2u);

  w1.bytes[1][100] ^= std::byte{0x80};  // changed behind the node's back
  auto dirty = n1.Verify();
  ASSERT_TRUE(dirty.ok()) << dirty.status().ToString();
  ASSERT_EQ(dirty->mismatches.size(), 1u) << dirty->summary;
  EXPECT_EQ(dirty->mismatches[0].tensor, "b.bias");
  EXPECT_EQ(dirty->mismatches[0].what, "bits differ in partition 0 (1 of 1)");
}

TEST(ApiSource, APublishAfterStopFailsAtOnceWithThatReason) {
  Cluster cluster;
  Model trainer(5);
  Model target = trainer;
  target.bytes[0][0] ^= std::byte{1};
  auto source = cluster.Source("t");
  source->Stop();
  auto report = source->Publish(trainer.Views(), target.Views());
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), deltacast::StatusCode::kFailedPrecondition);
  EXPECT_THAT(report.status().message(), HasSubstr("the source is stopped"));
}

}  // namespace
