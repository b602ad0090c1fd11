// Requests up a striped tree (docs/protocol.md, "Stripes", "Recovery"): a node asks
// any joined stripe's parent for catch-up and repair bytes, a request whose link
// drops goes again to another stripe's parent, and the join check does not wait on
// stripe 0. The rotated plan for S = 2 (stripes_fixture.h):
//   stripe 0: src -> n1, n2; n1 -> n3, n4; n2 -> n5, n6; n3 -> n7
//   stripe 1: src -> n4, n5; n4 -> n6, n7; n5 -> n1, n2; n6 -> n3
// n7's parents: n3 in stripe 0 (failover n1), n4 in stripe 1 (failover src). n3 is
// interior in stripe 0 alone, so killing it takes only n7's stripe-0 parent.
#include <condition_variable>

#include "tests/relay/intercept_transport.h"
#include "tests/relay/tree/stripes_fixture.h"

namespace deltacast::relay::stripes_test {
namespace {

bool IsUpRequest(MessageType type) {
  return type == MessageType::kFetch || type == MessageType::kFetchManifest ||
         type == MessageType::kFetchChain || type == MessageType::kFetchDeltaChunk;
}

// What the node's stripe-0 parent link did to its requests up the tree: once armed,
// they are held back (never reach the parent), as if the parent had died with them;
// the test then kills that parent.
struct Held {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> armed{true};
  int held = 0;  // requests up the tree held back on the stripe-0 link
};

// Wraps a node's transport: up-requests on its stripe-0 parent link are held back.
std::unique_ptr<transport::Transport> HoldUpRequests(std::unique_ptr<transport::Transport> inner,
                                                     std::shared_ptr<Held> held) {
  test_util::InterceptHooks hooks;
  hooks.on_send = [held](test_util::InterceptedLink& link, transport::Message& message,
                         transport::SendHandler&) {
    auto type = PeekType(*message);
    if (!type.ok() || !IsUpRequest(*type) || link.stripe != 0 || !held->armed) {
      return test_util::SendAction::kForward;
    }
    {
      std::lock_guard lock(held->mu);
      ++held->held;
    }
    held->cv.notify_all();
    return test_util::SendAction::kSwallow;
  };
  return std::make_unique<test_util::InterceptTransport>(std::move(inner), std::move(hooks));
}

// The step after `v`: its target becomes the base, ~3 % of the elements change.
Versions NextStep(const Versions& v, uint32_t seed) {
  Versions next{v.tensors, v.target, v.target};
  std::mt19937 rng(seed);
  for (auto& tensor : next.target) {
    for (size_t i = 0; i < tensor.size(); i += 2) {
      if (rng() % 100 < 3) tensor[i] ^= std::byte{2};
    }
  }
  return next;
}

class StripesRepairTest : public StripesTest {
 protected:
  void SetUp() override {
    policy_ = "available";
    connect_timeout_ = "2s";
    StripesTest::SetUp();
    UseRotatedPlan(2);
    scratch_ = ::testing::TempDir() + "/stripes-repair-" + std::to_string(getpid()) + "-" +
               std::to_string(base_port_);
    std::filesystem::remove_all(scratch_);
    std::filesystem::create_directories(scratch_);
    decision_log_ = scratch_ / "decisions.log";
  }
  void TearDown() override {
    StripesTest::TearDown();
    std::filesystem::remove_all(scratch_);
  }

  // n7 holds its requests up the stripe-0 link back; once it has held one, n3 (its
  // stripe-0 parent) is killed. Returns the thread that does it.
  std::thread KillN3OnceN7Asks(std::shared_ptr<Held> held) {
    wrap_ = [held](int node, std::unique_ptr<transport::Transport> t) {
      if (node != 6) return t;
      return HoldUpRequests(std::move(t), held);
    };
    return std::thread([this, held] {
      std::unique_lock lock(held->mu);
      held->cv.wait_for(lock, std::chrono::seconds(60), [&] { return held->held != 0; });
      if (held->held > 0) {
        lock.unlock();
        agents_[2]->Stop();  // n3
      }
    });
  }

  // Waits until n7 joined both stripes' parents.
  void WaitForN7Joined() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      const NodeAgentStats s = agents_[6]->stats();
      if (s.stripe_parent_joins[0] >= 1 && s.stripe_parent_joins[1] >= 1) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "n7 did not join both stripes";
  }

  void ExpectAt(int i, const Versions& v) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
    }
  }

  // n7 misses the refits v0 -> v1 -> v2 (it is down; two, so its parents cannot
  // replay it the last one, which starts from v1); then, at the refit v2 -> v3, it
  // must catch up to v2 first. Its first catch-up request goes to its stripe-0 parent
  // n3, which is killed with it unanswered: the catch-up goes on through its stripe-1
  // parent n4 and n7 commits v3 bit-exact. Returns n7's stats.
  NodeAgentStats CatchUpThroughStripeOne() {
    std::vector<Versions> steps = {MakeVersions(1 << 17, 71)};
    steps.push_back(NextStep(steps[0], 72));
    steps.push_back(NextStep(steps[1], 73));
    auto held = std::make_shared<Held>();
    held->armed = false;
    std::thread killer = KillN3OnceN7Asks(held);
    EXPECT_NO_FATAL_FAILURE(StartAgents(steps[0], /*later=*/{6}));
    for (int k = 0; k < 2; ++k) {
      auto missed = Publish(steps[k]);
      EXPECT_TRUE(missed.ok() && missed->committed);
    }
    // Back at v0 between refits: its parents replay it the last refit, whose base it
    // lacks, and no source is publishing to vouch for v0: it waits for the next.
    EXPECT_NO_FATAL_FAILURE(StartAgent(6, steps[0]));
    WaitForN7Joined();
    held->armed = true;
    auto report = Publish(steps[2]);
    {
      std::lock_guard lock(held->mu);
      if (held->held == 0) held->held = -1;  // the killer gives up
    }
    held->cv.notify_all();
    killer.join();
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    if (!report.ok()) return {};
    EXPECT_TRUE(report->committed) << report->abort_reason;
    for (int i = 0; i < kReceivers; ++i) {
      if (i != 2) ExpectAt(i, steps[2]);
    }
    const NodeAgentStats n7 = agents_[6]->stats();
    EXPECT_EQ(n7.version, report->target_version);
    EXPECT_GE(held->held, 1) << "n7 never asked its stripe-0 parent";
    // Asked again of the stripe-1 parent, which answered.
    EXPECT_GE(n7.up_requests_resent, 1u);
    EXPECT_GE(n7.stripe_up_requests[1], 1u);
    return n7;
  }

  std::filesystem::path scratch_;
};

TEST_F(StripesRepairTest, CatchUpByKeptDeltasGoesOnThroughStripeOneWhenStripeZerosParentDies) {
  history_dir_ = scratch_ / "history";
  keep_deltas_ = 4;
  const NodeAgentStats n7 = CatchUpThroughStripeOne();
  EXPECT_EQ(n7.deltas_caught_up, 2u);
  EXPECT_EQ(n7.partitions_caught_up, 0u);
}

TEST_F(StripesRepairTest, CatchUpByPartitionsGoesOnThroughStripeOneWhenStripeZerosParentDies) {
  const NodeAgentStats n7 = CatchUpThroughStripeOne();
  EXPECT_EQ(n7.deltas_caught_up, 0u);
  EXPECT_GT(n7.partitions_caught_up, 0u);
}

// n7's store has a torn partition (bytes of neither version, changed behind the
// engine's back). At END it asks its stripe-0 parent n3 for the target bytes; n3
// dies with the request unanswered; the request goes to n4 over stripe 1, n7 repairs
// the partition and commits bit-exact.
TEST_F(StripesRepairTest, TornRepairIsServedOverStripeOneWhenStripeZerosParentDies) {
  Versions v = MakeVersions(1 << 17, 74);
  auto held = std::make_shared<Held>();
  std::thread killer = KillN3OnceN7Asks(held);
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  WaitForN7Joined();
  // Partition 3 of tensor 1, torn behind the engine's back.
  auto& torn = stores_[6][1];
  for (uint64_t b = 3 * kPartitionBytes + 100; b < 3 * kPartitionBytes + 140; ++b) {
    torn[b] ^= std::byte{0x5a};
  }
  auto report = Publish(v);
  {
    std::lock_guard lock(held->mu);
    if (held->held == 0) held->held = -1;
  }
  held->cv.notify_all();
  killer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < kReceivers; ++i) {
    if (i != 2) ExpectAt(i, v);
  }
  const NodeAgentStats n7 = agents_[6]->stats();
  EXPECT_EQ(n7.version, report->target_version);
  EXPECT_GE(held->held, 1) << "n7 never asked its stripe-0 parent";
  EXPECT_GE(n7.partitions_repaired, 1u);
  EXPECT_GE(n7.up_requests_resent, 1u);
  EXPECT_GE(n7.stripe_up_requests[1], 1u);
}

// Wraps n3's transport: every answer it sends a child (PARTITION, MANIFEST, CHAIN,
// DELTA_CHUNK) says "not found", as a relay with no parent joined answers after 500 ms (or one
// whose path up cannot reach the source). Counts them in `answered`.
std::unique_ptr<transport::Transport> AnswerNotFound(std::unique_ptr<transport::Transport> inner,
                                                     std::shared_ptr<std::atomic<int>> answered) {
  test_util::InterceptHooks hooks;
  hooks.accepted_links = true;
  hooks.on_send = [answered](test_util::InterceptedLink&, transport::Message& message,
                             transport::SendHandler&) {
    auto type = PeekType(*message);
    if (!type.ok()) return test_util::SendAction::kForward;
    const uint64_t id = RequestIdOf(*message);
    std::vector<std::byte> none;
    switch (*type) {
      case MessageType::kPartition:
        none = EncodePartition(id, false, {});
        break;
      case MessageType::kManifest:
        none = EncodeManifest(id, false, {});
        break;
      case MessageType::kDeltaChunk:
        none = EncodeDeltaChunk(id, false, {});
        break;
      case MessageType::kChain: {
        Chain chain;
        chain.request_id = id;
        none = EncodeChain(chain);
        break;
      }
      default:
        return test_util::SendAction::kForward;
    }
    message = transport::MakeMessage(std::move(none));
    ++*answered;
    return test_util::SendAction::kForward;
  };
  return std::make_unique<test_util::InterceptTransport>(std::move(inner), std::move(hooks));
}

// n7 misses two refits and must catch up at the third; its stripe-0 parent n3 answers
// every request "not found" (as a relay with no parent joined does after 500 ms). Such an
// answer is n3's, not the tree's: the request is asked again of n7's stripe-1 parent
// n4, the catch-up finishes and n7 commits bit-exact (the simulator's --stripes seed
// 11809: the catch-up failed on the first "not found", and the node then the refit).
TEST_F(StripesRepairTest, ANotFoundFromOneStripesParentIsAskedOfAnother) {
  std::vector<Versions> steps = {MakeVersions(1 << 17, 76)};
  steps.push_back(NextStep(steps[0], 77));
  steps.push_back(NextStep(steps[1], 78));
  auto answered = std::make_shared<std::atomic<int>>(0);
  wrap_ = [answered](int node, std::unique_ptr<transport::Transport> t) {
    if (node != 2) return t;  // n3
    return AnswerNotFound(std::move(t), answered);
  };
  ASSERT_NO_FATAL_FAILURE(StartAgents(steps[0], /*later=*/{6}));
  for (int k = 0; k < 2; ++k) {
    auto missed = Publish(steps[k]);
    ASSERT_TRUE(missed.ok() && missed->committed);
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent(6, steps[0]));
  WaitForN7Joined();
  auto report = Publish(steps[2]);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < kReceivers; ++i) ExpectAt(i, steps[2]);
  const NodeAgentStats n7 = agents_[6]->stats();
  EXPECT_EQ(n7.version, report->target_version);
  EXPECT_GT(n7.partitions_caught_up, 0u);
  EXPECT_GE(answered->load(), 1) << "n7 never asked n3";
  EXPECT_GE(n7.stripe_up_requests[1], 1u);
}

// n7's stripe-0 parent (n3) is not running: n7 joins stripe 1's parent n4 and the
// join check runs on what n4 says, without waiting for stripe 0 (whose failover
// parent n1 is not running either).
TEST_F(StripesRepairTest, TheJoinCheckRunsOnTheFirstJoinedStripe) {
  Versions v = MakeVersions(1 << 12, 75);
  stores_.assign(kReceivers, v.base);
  agents_.resize(kReceivers);
  sent_.resize(kReceivers);
  ASSERT_NO_FATAL_FAILURE(StartAgent(3, v));  // n4
  ASSERT_NO_FATAL_FAILURE(StartAgent(6, v));  // n7
  const JoinCheck::State state = agents_[6]->WaitForJoin(std::chrono::seconds(20));
  EXPECT_TRUE(state.checked);
  EXPECT_TRUE(state.status.ok()) << state.status.ToString();
  EXPECT_EQ(state.parent, "n4");
  const NodeAgentStats n7 = agents_[6]->stats();
  EXPECT_EQ(n7.stripe_parent_joins[0], 0u);
  EXPECT_EQ(n7.stripe_parent_joins[1], 1u);
}

}  // namespace
}  // namespace deltacast::relay::stripes_test
