// The bucket bridge in a striped tree (docs/object-store.md, docs/protocol.md,
// "Stripes"): the uplink joins the source in every stripe and writes each chunk
// once; the downlink serves its children's links of every stripe, each only its
// stripe's chunks. The relay links run over the inproc transport; the bucket is
// s3rver on loopback. Every node's bytes are checked by hash against the target.
#include <gtest/gtest.h>

#include <set>

#include "objstore/bucket_layout.h"
#include "relay/bucket/bucket_bridge.h"
#include "tests/relay/bucket/bucket_fixture.h"
#include "tests/relay/stripe_spy.h"

namespace deltacast::relay {
namespace {

using namespace bucket_test;  // NOLINT: the fixture and its helpers
using stripe_test::StripeSpied;
using stripe_test::StripeSpyTransport;

// S = 2, both region nodes the bridge's children (four links at the downlink). In
// the first refit eu1's stripe-1 link to the downlink is reset after its window and
// two chunks: eu1 rejoins that stripe alone and is replayed only that stripe's
// chunks it lacks; both refits commit with every node bit-exact.
TEST_F(BucketBridgeTest, StripedTreeThroughTheBucketCommitsBitExact) {
  Versions v = MakeVersions(1 << 20, 3, 11);
  ASSERT_NO_FATAL_FAILURE(UseConfig("all", "bucket-eu", 2));
  auto spied = std::make_shared<StripeSpied>();
  spied->reset_stripe = 1;
  spied->reset_after_credits = 3;  // the window, then two chunks
  wrap_ = [spied](int node, std::unique_ptr<transport::Transport> t) {
    if (std::string(kNodes[node]) != "eu1") return t;
    return std::unique_ptr<transport::Transport>(
        std::make_unique<StripeSpyTransport>(std::move(t), spied));
  };
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
  uint64_t written = 0;  // the uplink's PUTs the refits call for
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("refit " + std::to_string(k + 1));
    auto report = PublishStep(v, k);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(report->nodes.size(), 3u);  // us1, and eu1 + eu2 through the bucket
    EXPECT_GT(report->delta.chunks, 8u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version)) << kNodes[i];
    }
    ExpectAllAt(v, k + 1);
    // One refit in the bucket whatever S is: every chunk (the END once) in the seal.
    auto seal = s3_->Get(layout.Sealed(report->refit_id));
    ASSERT_TRUE(seal.ok()) << seal.status().ToString();
    auto parsed = objstore::ParseSeal(AsChars(*seal));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->chunks.size(), report->delta.chunks);
    // BEGIN, head, each chunk once, the seal, the decision, the chain.
    written += report->delta.chunks + 5;

    // eu1's links to the downlink: stripe 0 carried each even data chunk once,
    // stripe 1 only odd ones (one more time at most in the refit it was reset in).
    const uint32_t data = static_cast<uint32_t>(report->delta.chunks) - 1;
    std::lock_guard lock(spied->mu);
    for (uint32_t c = 0; c < data; c += 2) EXPECT_EQ(spied->chunks_received[0][c], 1) << c;
    EXPECT_EQ(spied->chunks_received[0].size(), (data + 1) / 2);
    for (uint32_t c = 1; c < data; c += 2) {
      EXPECT_GE(spied->chunks_received[1][c], 1) << c;
      EXPECT_LE(spied->chunks_received[1][c], k == 0 ? 2 : 1) << c;
    }
    EXPECT_EQ(spied->chunks_received[1].size(), data / 2);
    spied->chunks_received.clear();
  }
  EXPECT_TRUE(spied->reset.load());
  {
    std::lock_guard lock(spied->mu);
    EXPECT_EQ(spied->hellos[0], 1);  // stripe 0: joined once
    EXPECT_EQ(spied->hellos[1], 2);  // stripe 1: joined again after the reset
  }
  EXPECT_EQ(uplink_->stats().objects_written, written);
  EXPECT_EQ(uplink_->stats().refits, 2u);
  EXPECT_EQ(downlink_->stats().refits, 2u);
}

// S = 2, the uplink's stripe-1 link to the source reset mid-refit: the uplink
// rejoins that stripe alone, its HELLO names the chunks the bucket holds, and the
// source replays only that stripe's others; every chunk is still written once and
// the refit commits bit-exact.
TEST_F(BucketBridgeTest, UplinkStripeLinkResetRejoinsThatStripeAlone) {
  Versions v = MakeVersions(1 << 20, 2, 12);
  ASSERT_NO_FATAL_FAILURE(UseConfig("all", "eu1", 2));
  auto spied = std::make_shared<StripeSpied>();
  spied->reset_stripe = 1;
  spied->reset_after_credits = 3;  // the window, then two chunks
  wrap_uplink_ = [spied](std::unique_ptr<transport::Transport> t) {
    return std::unique_ptr<transport::Transport>(
        std::make_unique<StripeSpyTransport>(std::move(t), spied));
  };
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto report = PublishStep(v, 0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), 3u);
  EXPECT_GT(report->delta.chunks, 8u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version)) << kNodes[i];
  }
  ExpectAllAt(v, 1);
  EXPECT_TRUE(spied->reset.load());
  const uint32_t data = static_cast<uint32_t>(report->delta.chunks) - 1;
  {
    std::lock_guard lock(spied->mu);
    EXPECT_EQ(spied->hellos[0], 1);
    EXPECT_EQ(spied->hellos[1], 2);
    for (uint32_t c = 0; c < data; c += 2) EXPECT_EQ(spied->chunks_received[0][c], 1) << c;
    EXPECT_EQ(spied->chunks_received[0].size(), (data + 1) / 2);
    for (const auto& [sequence, times] : spied->chunks_received[1]) {
      EXPECT_EQ(sequence % 2, 1u) << sequence;
      EXPECT_LE(times, 2) << sequence;  // at most once more: what the reset cut off
    }
    EXPECT_EQ(spied->chunks_received[1].size(), data / 2);
  }
  // BEGIN, head, each chunk once, the seal, the decision, the chain.
  EXPECT_EQ(uplink_->stats().objects_written, report->delta.chunks + 5);
}

// S = 2, policy `available`, eu2 (a child of the bridge) away: both stripes'
// subtrees at the downlink leave it out after the connect timeout, the region
// prepares without it, and back for the next refit (two versions behind its
// target) it commits bit-exact with the rest.
TEST_F(BucketBridgeTest, StripedAwayChildIsExcusedInEveryStripe) {
  Versions v = MakeVersions(1 << 19, 3, 13);
  ASSERT_NO_FATAL_FAILURE(UseConfig("available", "bucket-eu", 2));
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));  // not eu2
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto first = PublishStep(v, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->committed) << first->abort_reason;
  std::set<std::string> nodes;
  for (const auto& n : first->nodes) nodes.insert(n.node_id);
  EXPECT_EQ(nodes, (std::set<std::string>{"us1", "eu1"}));
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], first->target_version));
  ExpectAllAt(v, 1);

  ASSERT_NO_FATAL_FAILURE(StartAgent(2, v, 0));
  auto second = PublishStep(v, 1);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(second->committed) << second->abort_reason;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], second->target_version));
  ExpectAllAt(v, 2);
}

}  // namespace
}  // namespace deltacast::relay
