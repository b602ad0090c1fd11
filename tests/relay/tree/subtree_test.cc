// Subtree on its own: whom a refit waits for as children join, leave, prepare, fail
// and confirm, and what it tells its owner to do, driven with explicit times under
// both commit policies. The same rules through the real source, relay and bucket
// downlink: subtree_conformance_test.cc.
#include "relay/tree/subtree.h"

#include <gtest/gtest.h>

#include "relay/wire/protocol.h"

namespace deltacast::relay {
namespace {

using Clock = Subtree::Clock;
using std::chrono::milliseconds;
using topology::CommitPolicy;

// A Subtree and a record of what it told its owner.
struct Harness {
  std::vector<std::string> left_out;
  std::vector<Failed> failed;
  std::vector<std::string> why;
  int changed = 0;
  Subtree tree;

  Harness(std::vector<std::string> planned, CommitPolicy policy = CommitPolicy::kAll)
      : tree(std::move(planned), {policy, milliseconds(1000), "test: "}, Owner()) {}

  Subtree::Owner Owner() {
    Subtree::Owner o;
    o.leave_out = [this](const std::string& c) { left_out.push_back(c); };
    o.fail = [this](const Failed& f, const std::string& w) {
      failed.push_back(f);
      why.push_back(w);
    };
    o.changed = [this] { ++changed; };
    return o;
  }
  // Children a and b join at `t0`, and refit 7 begins.
  void JoinABAndBegin(Clock::time_point t0) {
    tree.Joined("a", false, t0);
    tree.Joined("b", false, t0);
    tree.BeginRefit(7, t0);
  }
};

Failed OwnFailure(const std::string& child, const std::string& reason = "disk full") {
  return Failed{7, child, reason, FailureKind::kNode};
}

TEST(Subtree, WaitsForEveryPlannedChildToPrepareAndConfirm) {
  Harness h({"a", "b"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.Joined("b", false, t0);
  EXPECT_TRUE(c.AllPlannedConnected());
  c.BeginRefit(7, t0);
  EXPECT_FALSE(c.prepared());
  c.OnPrepared("a", {{"a", 10, 0.1, 1}});
  c.OnPrepared("a", {{"a", 10, 0.1, 1}});  // a second PREPARED counts once
  EXPECT_EQ(h.changed, 1);
  c.OnPrepared("b", {{"b", 20, 0.2, 2}, {"b1", 5, 0.3, 1}});
  EXPECT_TRUE(c.prepared());
  EXPECT_EQ(c.reports().size(), 3u);
  c.Decided(t0);
  EXPECT_EQ(c.AwaitingConfirmation(), 2u);
  c.OnConfirmed("a", 1);
  c.OnConfirmed("b", 2);
  EXPECT_TRUE(c.confirmed());
  EXPECT_EQ(c.confirmed_nodes(), 3u);
  EXPECT_TRUE(h.failed.empty());
  EXPECT_TRUE(h.left_out.empty());
}

TEST(Subtree, UnderPolicyAllAnAwayChildFailsTheRefitNamingIt) {
  Harness h({"a", "b"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.Refused("b", "wrong token");
  c.BeginRefit(7, t0);  // b is absent from the start
  c.Tick(t0 + milliseconds(500));
  EXPECT_TRUE(h.failed.empty()) << "not yet past the connect timeout";
  c.Tick(t0 + milliseconds(1500));
  ASSERT_EQ(h.failed.size(), 1u);
  EXPECT_EQ(h.failed[0].node_id, "b");
  EXPECT_EQ(h.failed[0].refit_id, 7u);
  EXPECT_NE(h.why[0].find("child 'b' has been away longer than the connect timeout"),
            std::string::npos);
  EXPECT_NE(h.why[0].find("wrong token"), std::string::npos) << "the refusal is named";
  // Failed here anyway: it is now left out, so chunks queued for it stop holding
  // the parent's credit.
  c.Tick(t0 + milliseconds(1600));
  EXPECT_EQ(h.left_out, std::vector<std::string>{"b"});
  EXPECT_EQ(h.failed.size(), 1u);
}

// A stripe's subtree keys its children by link ("n6#2" on stripe 2); the FAILED it
// sends up names the node, which is what parents parse (a link key is no valid node
// id: the simulator's --stripes seed 11347 had every parent drop that FAILED, and the
// source wait out the commit timeout for a refit already failed).
TEST(Subtree, AnAwayStripeChildsFailedNamesTheNodeNotTheLink) {
  Harness h({"n6#2", "n4#2"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("n4#2", false, t0);
  c.BeginRefit(7, t0);  // n6 never started
  c.Tick(t0 + milliseconds(1500));
  ASSERT_EQ(h.failed.size(), 1u);
  EXPECT_EQ(h.failed[0].node_id, "n6");
  auto parsed = ParseFailed(EncodeFailed(h.failed[0]));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->node_id, "n6");
  EXPECT_EQ(parsed->refit_id, 7u);

  // The same through CannotTakePart (a source that cannot replay a rejoining child).
  Harness g({"n3#1"});
  g.tree.Joined("n3#1", false, t0);
  g.tree.BeginRefit(8, t0);
  EXPECT_FALSE(g.tree.CannotTakePart("n3#1", "its spool failed"));
  ASSERT_EQ(g.failed.size(), 1u);
  EXPECT_EQ(g.failed[0].node_id, "n3");
  EXPECT_TRUE(ParseFailed(EncodeFailed(g.failed[0])).ok());
}

// A child that holds no weights (a sender the source feeds): under `all` its absence
// fails nothing, mid-refit or at the start, while an adopted child (its child, failed
// over) is still waited for; any other child away still fails the refit.
TEST(Subtree, UnderPolicyAllAChildWithoutWeightsIsLeftOutNotFailed) {
  Harness h({"sender#1"});
  Subtree& c = h.tree;
  c.HoldsNoWeights("sender#1");
  const auto t0 = Clock::now();
  c.Joined("sender#1", false, t0);
  c.BeginRefit(7, t0);
  c.Lost("sender#1", t0 + milliseconds(100));
  c.Joined("n1#1", /*adopted=*/true, t0 + milliseconds(900));
  c.Tick(t0 + milliseconds(1200));
  EXPECT_TRUE(h.failed.empty()) << (h.why.empty() ? "" : h.why[0]);
  EXPECT_EQ(h.left_out, std::vector<std::string>{"sender#1"});
  EXPECT_FALSE(c.prepared()) << "the adopted child has not prepared";
  c.OnPrepared("n1#1", {{"n1", 1, 0, 1}});
  EXPECT_TRUE(c.prepared());
  c.Decided(t0 + milliseconds(1300));
  c.OnConfirmed("n1#1", 1);
  EXPECT_TRUE(c.confirmed());
  c.EndRefit();
  // Still away at the next refit's start: left out there too, as its child is here.
  h.left_out.clear();
  EXPECT_TRUE(c.GoOnWithoutAbsent().ok());
  EXPECT_EQ(h.left_out, std::vector<std::string>{"sender#1"});

  // Without weights but with no child here at all: the refit cannot start.
  Harness alone({"sender#1"});
  alone.tree.HoldsNoWeights("sender#1");
  EXPECT_FALSE(alone.tree.GoOnWithoutAbsent().ok());

  // A child with weights fails the refit under `all`, as ever.
  Harness other({"sender#1", "n2"});
  other.tree.HoldsNoWeights("sender#1");
  other.tree.Joined("sender#1", false, t0);
  other.tree.BeginRefit(8, t0);  // n2 is absent from the start
  other.tree.Tick(t0 + milliseconds(1500));
  ASSERT_EQ(other.failed.size(), 1u);
  EXPECT_EQ(other.failed[0].node_id, "n2");
}

TEST(Subtree, UnderPolicyAvailableAnAwayChildIsLeftOut) {
  Harness h({"a", "b"}, CommitPolicy::kAvailable);
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  h.JoinABAndBegin(t0);
  c.OnPrepared("a", {{"a", 1, 0, 1}});
  c.Lost("b", t0 + milliseconds(100));  // timed from when it left
  c.Tick(t0 + milliseconds(1000));
  EXPECT_TRUE(h.left_out.empty());
  EXPECT_FALSE(c.prepared());
  c.Tick(t0 + milliseconds(1200));
  EXPECT_EQ(h.left_out, std::vector<std::string>{"b"});
  EXPECT_TRUE(h.failed.empty());
  EXPECT_TRUE(c.prepared());
  // Back within the refit: replayed, but no longer waited for.
  c.Joined("b", false, t0 + milliseconds(1300));
  EXPECT_TRUE(c.prepared());
}

TEST(Subtree, AChildBackBeforeTheConnectTimeoutIsNotTimed) {
  Harness h({"a"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(7, t0);
  c.Lost("a", t0 + milliseconds(100));
  c.Joined("a", false, t0 + milliseconds(900));
  c.Tick(t0 + milliseconds(5000));
  EXPECT_TRUE(h.failed.empty());
  EXPECT_TRUE(h.left_out.empty());
}

TEST(Subtree, AFailedChildFailsTheRefitUnderAllAndIsLeftOutUnderAvailable) {
  for (CommitPolicy policy : {CommitPolicy::kAll, CommitPolicy::kAvailable}) {
    SCOPED_TRACE(topology::CommitPolicyName(policy));
    Harness h({"a", "b"}, policy);
    Subtree& c = h.tree;
    const auto t0 = Clock::now();
    c.Joined("a", false, t0);
    c.Joined("b", false, t0);
    c.BeginRefit(7, t0);
    c.OnPrepared("a", {});
    c.OnFailed("b", OwnFailure("b"));
    if (policy == CommitPolicy::kAll) {
      ASSERT_EQ(h.failed.size(), 1u);
      EXPECT_EQ(h.why[0], "node 'b': disk full");
      EXPECT_TRUE(h.left_out.empty());
    } else {
      EXPECT_TRUE(h.failed.empty());
      EXPECT_EQ(h.left_out, std::vector<std::string>{"b"});
      EXPECT_TRUE(c.prepared());
    }
  }
}

// A relay may begin one refit twice (behind a catch-up that failed, then again once
// its held delta resolved, itself a "refit" in between): a child it left out the
// first time said FAILED once and is sent nothing more of it, so the second time
// does not wait for it; another refit waits for it again (the simulator's --stripes
// seed 20749 held a stripe's PREPARED to the commit timeout).
TEST(Subtree, ARefitBegunAgainKeepsTheChildrenItLeftOutAndTheNextDoesNot) {
  Harness h({"a", "b"}, CommitPolicy::kAvailable);
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  h.JoinABAndBegin(t0);
  c.OnFailed("b", OwnFailure("b"));
  ASSERT_EQ(h.left_out, std::vector<std::string>{"b"});
  c.BeginRefit(6, t0);  // the held delta's refit, resolved in between
  c.Decided(t0);
  c.BeginRefit(7, t0);  // the first again
  EXPECT_TRUE(c.Excused("b"));
  c.OnPrepared("a", {});
  EXPECT_TRUE(c.prepared());
  c.BeginRefit(8, t0);  // the next refit: b takes part
  EXPECT_FALSE(c.Excused("b"));
  c.OnPrepared("a", {});
  EXPECT_FALSE(c.prepared());
}

TEST(Subtree, AFailureFromFurtherBelowOrABadDeltaAlwaysFailsTheRefit) {
  Harness h({"a"}, CommitPolicy::kAvailable);
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(7, t0);
  c.OnFailed("a", OwnFailure("a1"));  // a's child, passed up
  c.OnFailed("a", Failed{7, "a", "wrong records", FailureKind::kBadDelta});
  ASSERT_EQ(h.failed.size(), 2u);
  EXPECT_EQ(h.failed[0].node_id, "a1");
  EXPECT_TRUE(h.left_out.empty());
}

TEST(Subtree, AChildThatFailsAfterTheDecisionIsNotWaitedFor) {
  Harness h({"a", "b"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.Joined("b", false, t0);
  c.BeginRefit(7, t0);
  c.OnPrepared("a", {});
  c.OnPrepared("b", {});
  c.Decided(t0);
  c.OnConfirmed("a", 1);
  EXPECT_FALSE(c.confirmed());
  c.OnFailed("b", OwnFailure("b", "commit failed locally"));
  EXPECT_TRUE(h.failed.empty()) << "a FAILED after the decision fails nothing";
  EXPECT_TRUE(c.confirmed());
  EXPECT_EQ(c.confirmed_nodes(), 1u);
}

// The simulator's seed 12141: a relay passed up its child's FAILED, then a replayed
// COMMIT came from above before it had prepared: the child is not waited for.
TEST(Subtree, ACommitFromAboveExcusesTheChildWhoseFailureWentUp) {
  Harness h({"a", "b"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.Joined("b", false, t0);
  c.BeginRefit(7, t0);
  c.OnPrepared("a", {});
  c.OnFailed("b", OwnFailure("b"));
  ASSERT_EQ(h.failed.size(), 1u);
  EXPECT_FALSE(c.prepared());
  c.CommitWaitsForThisNode();
  EXPECT_EQ(h.left_out, std::vector<std::string>{"b"});
  EXPECT_TRUE(c.prepared());
  // And one that fails from now on is not passed up either.
  Harness h2({"a"});
  h2.tree.Joined("a", false, t0);
  h2.tree.BeginRefit(8, t0);
  h2.tree.CommitWaitsForThisNode();
  h2.tree.OnFailed("a", OwnFailure("a"));
  EXPECT_TRUE(h2.failed.empty());
  EXPECT_TRUE(h2.tree.prepared());
}

TEST(Subtree, AfterTheDecisionAnAbsentChildIsGivenUpOnAtItsDeadline) {
  Harness h({"a", "b"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(7, t0);
  c.Decided(t0, milliseconds(3000));  // b absent: 3 s
  EXPECT_EQ(c.AwaitingConfirmation(), 2u);
  c.Tick(t0 + milliseconds(2000));
  EXPECT_EQ(c.AwaitingConfirmation(), 2u);
  c.Lost("a", t0 + milliseconds(2000));  // a drops before confirming: 1 s from then
  c.Tick(t0 + milliseconds(3100));
  EXPECT_TRUE(c.confirmed());
  EXPECT_TRUE(h.failed.empty()) << "after the decision an away child fails nothing";
  // A new refit waits for everyone again.
  c.EndRefit();
  c.Joined("a", false, t0 + milliseconds(4000));
  c.BeginRefit(8, t0 + milliseconds(4000));
  EXPECT_FALSE(c.prepared());
}

TEST(Subtree, ChildrenThatNeverJoinedStopTheRefitUnlessPolicyAvailableHasSomeoneToGoOnWith) {
  {
    Harness h({"a", "b"});
    h.tree.Joined("a", false, Clock::now());
    Status s = h.tree.GoOnWithoutAbsent();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.ToString().find("b (never connected"), std::string::npos) << s.ToString();
  }
  {
    Harness h({"a", "b"}, CommitPolicy::kAvailable);
    h.tree.Refused("b", "wrong token");
    EXPECT_FALSE(h.tree.GoOnWithoutAbsent().ok()) << "nobody to go on with";
    h.tree.Joined("a", false, Clock::now());
    h.tree.BeginRefit(7, Clock::now());
    EXPECT_TRUE(h.tree.GoOnWithoutAbsent().ok());
    EXPECT_EQ(h.left_out, std::vector<std::string>{"b"});
    h.tree.OnPrepared("a", {});
    EXPECT_TRUE(h.tree.prepared());
  }
}

TEST(Subtree, ARejoiningChildIsToldTheDecisionReplayedOrNotWaitedFor) {
  Harness h({"a"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  const Digest128 base = Digest128::FromHex("0102030405060708090a0b0c0d0e0f10").value();
  const Digest128 target = Digest128::FromHex("1112131415161718191a1b1c1d1e1f20").value();
  c.Joined("a", false, t0);
  c.BeginRefit(7, t0);
  c.OnPrepared("a", {{"a", 10, 0.1, 1}});
  Hello holds;
  holds.active_version = base;
  holds.inflight_target = target;
  EXPECT_EQ(c.Rejoined("a", holds, target, std::nullopt), Subtree::Rejoin::kReplay);
  EXPECT_FALSE(c.prepared()) << "it prepares again";
  c.OnPrepared("a", {{"a", 12, 0.2, 1}});
  ASSERT_EQ(c.reports().size(), 1u);
  EXPECT_EQ(c.reports()[0].chunk_bytes, 12u) << "its report is replaced";

  Hello committed;
  committed.active_version = target;
  EXPECT_EQ(c.Rejoined("a", committed, target, true), Subtree::Rejoin::kDecisionAgain);

  c.Decided(t0);
  Hello never_had_it;
  never_had_it.active_version = base;
  EXPECT_EQ(c.Rejoined("a", never_had_it, target, false), Subtree::Rejoin::kNothing);
  EXPECT_TRUE(c.confirmed()) << "nothing to undo, nothing to wait for (seed 1255)";
}

TEST(Subtree, AnAdoptedChildCountsOnlyWhileConnectedAndIsNeverTimed) {
  Harness h({"a"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.Joined("g", true, t0);  // a grandchild whose parent died
  EXPECT_TRUE(c.IsAdopted("g"));
  c.BeginRefit(7, t0);
  c.OnPrepared("a", {});
  EXPECT_FALSE(c.prepared()) << "an adopted child is waited for";
  const int before = h.changed;
  c.Lost("g", t0);
  EXPECT_TRUE(c.prepared());
  EXPECT_GT(h.changed, before) << "its owner is told (seeds 3684, 12423)";
  c.Tick(t0 + milliseconds(5000));
  EXPECT_TRUE(h.failed.empty()) << "an adopted child is never timed";
}

// The simulator's seed 1178: an excused adopted child was still waited for.
TEST(Subtree, AnExcusedAdoptedChildIsNotWaitedFor) {
  Harness h({"a"});
  Subtree& c = h.tree;
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(7, t0);
  c.Joined("x", /*adopted=*/true, t0);
  c.OnPrepared("a", {});
  EXPECT_FALSE(c.prepared());
  c.Excuse("x");
  EXPECT_TRUE(c.prepared());
}

}  // namespace
}  // namespace deltacast::relay
