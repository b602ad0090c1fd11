// Striped trees (docs/protocol.md, "Stripes") in one process over loopback tcp: a
// Source serving S stripe trees and seven NodeAgents, each joined to its parent in
// every stripe's tree. The trees are given (NodeAgent::Start with a plan), so each
// test knows which node is interior in which stripe; every check is on bytes.
#include "tests/relay/tree/stripes_fixture.h"

namespace deltacast::relay::stripes_test {
namespace {

TEST_F(StripesTest, TwoAndThreeStripesOverSevenNodesCommitBitExact) {
  for (int stripes : {2, 3}) {
    SCOPED_TRACE("stripes = " + std::to_string(stripes));
    TearDown();
    agents_.clear();
    stores_.clear();
    sent_.clear();
    SetUp();  // fresh ports: the last round's listeners are gone
    Versions v = MakeVersions(1 << 18, 30 + stripes);
    UseRotatedPlan(stripes);
    ASSERT_NO_FATAL_FAILURE(StartAgents(v));
    auto report = Publish(v);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceivers));
    EXPECT_EQ(report->nodes_decided, static_cast<uint32_t>(kReceivers));
    EXPECT_GT(report->delta.chunks, 3u * stripes);  // every stripe carried several
    const codec::Manifest target = ManifestOf(*Borrow(v.tensors, v.target));
    for (int i = 0; i < kReceivers; ++i) {
      // Every partition's hash is the target manifest's.
      auto store = Borrow(v.tensors, stores_[i]);
      EXPECT_EQ(ManifestOf(*store).VersionId(), target.VersionId()) << "node n" << i + 1;
      for (size_t t = 0; t < v.tensors.size(); ++t) {
        EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
      }
      const NodeAgentStats stats = agents_[i]->stats();
      EXPECT_EQ(stats.version, report->target_version);
      EXPECT_EQ(stats.refits_committed, 1u);
      // Each chunk came once, down one stripe: nothing twice.
      EXPECT_EQ(stats.chunk_bytes_resent, 0u) << "n" << i + 1;
    }
    // The source sent each data chunk down its own stripe only: to the stripe's
    // children there (two per stripe), never to another stripe's.
    std::lock_guard lock(source_sent_->mu);
    for (const auto& [sequence, times] : source_sent_->data_chunks) {
      EXPECT_EQ(times, 2) << "chunk " << sequence;
    }
    EXPECT_EQ(source_sent_->ends, 2 * stripes);  // the END down every stripe
  }
}

TEST_F(StripesTest, AbortUnderTwoStripesRollsBackExactly) {
  Versions v = MakeVersions(1 << 17, 41);
  UseRotatedPlan(2);
  // n6 holds something else: it cannot apply the delta, and fails the refit.
  stores_.assign(kReceivers, v.base);
  stores_[5][1][100] ^= std::byte{0x40};
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  auto report = Publish(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed);
  EXPECT_NE(report->abort_reason.find("n6"), std::string::npos) << report->abort_reason;
  // n6 fails fast, so the source may decide before a node has begun the refit; that
  // node takes BEGIN and ABORT after Publish returns. Wait for every node's outcome.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; i < kReceivers; ++i) {
    while (agents_[i]->stats().refits_aborted == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (int i = 0; i < kReceivers; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      std::vector<std::byte> expected = v.base[t];
      if (i == 5 && t == 1) expected[100] ^= std::byte{0x40};
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(expected)) << "n" << i + 1 << " tensor " << t;
    }
    EXPECT_EQ(agents_[i]->stats().refits_committed, 0u);
    EXPECT_EQ(agents_[i]->stats().refits_aborted, 1u) << "n" << i + 1;
  }
}

// Stripe 0: src -> n1, n2; n1 -> n3, n4; n2 -> n5, n6; n3 -> n7.
// Stripe 1: src -> n4, n5; n4 -> n1, n2; n5 -> n3, n6; n1 -> n7.
// n4 and n5 are leaves in stripe 0 and the stripe-1 parents of n1, n2, n3, n6; n6
// and n7 are leaves in both. Each node forwards a stripe's data chunks only down
// that stripe's tree: its uplink carries one copy per child it has there.
TEST_F(StripesTest, ANodeForwardsOnlyTheChunksOfTheStripesItIsInteriorIn) {
  Versions v = MakeVersions(1 << 18, 43);
  UsePlan({{"n1", "n2", "n3", "n4", "n5", "n6", "n7"}, {"n4", "n5", "n1", "n2", "n3", "n6", "n7"}});
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  auto report = Publish(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < kReceivers; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
    }
  }
  const uint32_t data_chunks = static_cast<uint32_t>(report->delta.chunks) - 1;  // and the END
  ASSERT_GE(data_chunks, 8u);
  // Children per stripe, from the plan: what each node must have sent.
  for (int i = 0; i < kReceivers; ++i) {
    const std::string id = "n" + std::to_string(i + 1);
    std::vector<size_t> children;
    for (const auto& stripe : plan_.stripes)
      children.push_back(stripe.tree.Find(id)->children.size());
    std::lock_guard lock(sent_[i]->mu);
    std::map<uint32_t, int> expected;
    for (uint32_t k = 0; k < data_chunks; ++k) {
      if (children[k % 2] > 0) expected[k] = static_cast<int>(children[k % 2]);
    }
    EXPECT_EQ(sent_[i]->data_chunks, expected) << id;
    EXPECT_EQ(sent_[i]->ends, static_cast<int>(children[0] + children[1])) << id;
  }
  // n4, a leaf in stripe 0, sent stripe 1's chunks (odd sequences) alone.
  {
    std::lock_guard lock(sent_[3]->mu);
    ASSERT_FALSE(sent_[3]->data_chunks.empty());
    for (const auto& [sequence, times] : sent_[3]->data_chunks) EXPECT_EQ(sequence % 2, 1u);
  }
  // n6, a leaf in both trees: its uplink carried no data.
  std::lock_guard lock(sent_[5]->mu);
  EXPECT_EQ(sent_[5]->data_bytes, 0u);
}

TEST_F(StripesTest, ANodeOfAnotherStripeCountIsRefusedWithAClearReason) {
  Versions v = MakeVersions(1 << 14, 47);
  UseRotatedPlan(2);
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  // The source plans one tree: every node's HELLO names 2 stripes, and is refused.
  UsePlan({Receivers()});  // one tree
  PublishOptions options;
  options.config = config_;
  options.config.tree.connect_timeout = std::chrono::milliseconds(1500);
  options.token = kToken;
  auto base = Borrow(v.tensors, v.base);
  auto target = Borrow(v.tensors, v.target);
  auto source = Source::Start(options, Tcp(std::make_shared<Sent>()), plan_);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto report = (*source)->Publish(*base, ManifestOf(*base), *target, ManifestOf(*target));
  (*source)->Stop();
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("serves 1 stripes"), std::string::npos)
      << report.status().ToString();
  for (int i = 0; i < kReceivers; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.base[t])) << "n" << i + 1 << " tensor " << t;
    }
  }
}

}  // namespace
}  // namespace deltacast::relay::stripes_test
