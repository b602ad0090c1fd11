// Striped trees under faults (docs/protocol.md, "Stripes", "Recovery"): a node that
// loses one stripe's parent rejoins that stripe alone and is replayed only that
// stripe's chunks it lacks; the others commit bit-exact.
#include "relay/tree/stripe_links.h"
#include "tests/relay/stripe_spy.h"
#include "tests/relay/tree/stripes_fixture.h"

namespace deltacast::relay::stripes_test {
namespace {

using Spied = stripe_test::StripeSpied;
using SpyTransport = stripe_test::StripeSpyTransport;

// The rotated plan for S = 2 (stripes_fixture.h):
//   stripe 0: src -> n1, n2; n1 -> n3, n4; n2 -> n5, n6; n3 -> n7
//   stripe 1: src -> n4, n5; n4 -> n6, n7; n5 -> n1, n2; n6 -> n3
// n5 is interior in stripe 1 alone (a leaf in stripe 0). Killed mid-refit, its
// stripe-1 children n1 and n2 fail over to the source there; their stripe-0 links
// stay as they are.
TEST_F(StripesTest, AStripeOneRelayKilledMidRefitLeavesEveryOtherNodeBitExact) {
  policy_ = "available";
  connect_timeout_ = "2s";
  SetUp();
  Versions v = MakeVersions(1 << 19, 51);
  UseRotatedPlan(2);
  // Paced, so the relay dies while chunks still flow.
  source_bytes_per_second_ = 256 << 10;
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  std::atomic<uint64_t> n1_had = 0;
  std::thread killer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline && agents_[0]->stats().chunks_received < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    n1_had = agents_[0]->stats().chunks_received;
    agents_[4]->Stop();  // n5
  });
  auto report = Publish(v);
  killer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_LT(n1_had.load(), report->delta.chunks) << "n5 died after n1 had every chunk";
  std::set<std::string> prepared;
  for (const auto& n : report->nodes) prepared.insert(n.node_id);
  EXPECT_EQ(prepared, (std::set<std::string>{"n1", "n2", "n3", "n4", "n6", "n7"}));
  for (int i = 0; i < kReceivers; ++i) {
    if (i == 4) continue;
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
    }
    EXPECT_EQ(agents_[i]->stats().refits_committed, 1u) << "n" << i + 1;
  }
  // n1 and n2 joined stripe 1 again (at the source), their stripe 0 parent once:
  // two links to start with, one more each.
  EXPECT_EQ(agents_[0]->stats().parent_joins, 3u);
  EXPECT_EQ(agents_[1]->stats().parent_joins, 3u);
  // The others never lost a parent.
  for (int i : {2, 3, 5, 6}) EXPECT_EQ(agents_[i]->stats().parent_joins, 2u) << "n" << i + 1;
  // By the engine's counters per stripe: n1 and n2 rejoined stripe 1 alone (at its
  // failover parent), and their stripe-0 link carried each of its chunks once.
  const uint64_t data_chunks = report->delta.chunks - 1;  // not the END
  for (int i : {0, 1}) {
    const NodeAgentStats s = agents_[i]->stats();
    EXPECT_EQ(s.stripe_parent_joins, (std::vector<uint64_t>{1, 2})) << "n" << i + 1;
    EXPECT_EQ(s.stripe_chunks[0], StripeChunkCount(0, 2, data_chunks)) << "n" << i + 1;
    EXPECT_EQ(s.stripe_chunk_bytes_resent[0], 0u) << "n" << i + 1;
  }
}

// n1's stripe-1 link (to n5) is reset mid-refit: n1 joins stripe 1 again and is
// replayed stripe 1's chunks it lacks; its stripe-0 link never drops, and no
// stripe-0 chunk comes twice.
TEST_F(StripesTest, AResetLinkOfOneStripeRejoinsThatStripeAlone) {
  Versions v = MakeVersions(1 << 19, 53);
  UseRotatedPlan(2);
  source_bytes_per_second_ = 512 << 10;
  auto spied = std::make_shared<Spied>();
  spied->reset_stripe = 1;
  spied->reset_after_credits = 3;  // the window, then two chunks
  wrap_ = [spied](int node, std::unique_ptr<transport::Transport> t) {
    if (node != 0) return t;
    return std::unique_ptr<transport::Transport>(
        std::make_unique<SpyTransport>(std::move(t), spied));
  };
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  auto report = Publish(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < kReceivers; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
    }
  }
  EXPECT_TRUE(spied->reset.load());
  std::lock_guard lock(spied->mu);
  EXPECT_EQ(spied->hellos[0], 1);  // stripe 0: joined once
  EXPECT_EQ(spied->hellos[1], 2);  // stripe 1: joined again after the reset
  EXPECT_EQ(agents_[0]->stats().parent_joins, 3u);
  // Stripe 0's link carried each of its chunks once; stripe 1's link only odd ones.
  const uint32_t chunks = static_cast<uint32_t>(report->delta.chunks) - 1;  // data: not the END
  for (uint32_t k = 0; k < chunks; k += 2) EXPECT_EQ(spied->chunks_received[0][k], 1) << k;
  for (const auto& [sequence, times] : spied->chunks_received[1]) {
    EXPECT_EQ(sequence % 2, 1u);
    EXPECT_LE(times, 2) << sequence;  // at most once more: what the reset cut off
  }
  EXPECT_EQ(spied->chunks_received[0].size(), (chunks + 1) / 2);
}

// n7 starts after the refit began: it joins both stripes' parents (n3 in stripe 0,
// n4 in stripe 1), each of which queued its stripe's chunks for it, and commits.
TEST_F(StripesTest, ALateJoinerJoinsEveryStripeAndCommitsBitExact) {
  Versions v = MakeVersions(1 << 19, 57);
  UseRotatedPlan(2);
  source_bytes_per_second_ = 512 << 10;
  ASSERT_NO_FATAL_FAILURE(StartAgents(v, /*later=*/{6}));
  std::atomic<uint64_t> n1_had = 0;
  std::thread late([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline && agents_[0]->stats().chunks_received < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    n1_had = agents_[0]->stats().chunks_received;
    StartAgent(6, v);
  });
  auto report = Publish(v);
  late.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_LT(n1_had.load(), report->delta.chunks) << "n7 started after n1 had every chunk";
  EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceivers));
  for (int i = 0; i < kReceivers; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
    }
  }
  const NodeAgentStats n7 = agents_[6]->stats();
  EXPECT_EQ(n7.parent_joins, 2u);  // one link per stripe
  EXPECT_EQ(n7.chunk_bytes_resent, 0u);
  EXPECT_EQ(n7.refits_committed, 1u);
}

}  // namespace
}  // namespace deltacast::relay::stripes_test
