// RefitChildren on its own: whom a refit waits for, as children join, leave, are
// excused, prepare and confirm, driven with explicit times.
#include "relay/refit_children.h"

#include <gtest/gtest.h>

namespace deltacast::relay {
namespace {

using Clock = RefitChildren::Clock;
using std::chrono::milliseconds;

TEST(RefitChildren, WaitsForEveryPlannedChildToPrepareAndConfirm) {
  RefitChildren c({"a", "b"});
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.Joined("b", false, t0);
  EXPECT_TRUE(c.AllPlannedConnected());
  c.BeginRefit(t0);
  EXPECT_EQ(c.AwaitingPrepared(), 2u);
  EXPECT_TRUE(c.Prepared("a", {{"a", 10, 0.1, 1}}));
  EXPECT_FALSE(c.Prepared("a", {{"a", 10, 0.1, 1}})) << "a second PREPARED counts once";
  EXPECT_TRUE(c.Prepared("b", {{"b", 20, 0.2, 2}, {"b1", 5, 0.3, 1}}));
  EXPECT_EQ(c.AwaitingPrepared(), 0u);
  EXPECT_EQ(c.reports().size(), 3u);
  c.Decided(t0, milliseconds(1000), milliseconds(1000));
  EXPECT_EQ(c.AwaitingConfirmation(), 2u);
  c.Confirmed("a", 1);
  c.Confirmed("b", 2);
  EXPECT_EQ(c.AwaitingConfirmation(), 0u);
  EXPECT_EQ(c.confirmed_nodes(), 3u);
}

TEST(RefitChildren, AnAbsentChildIsTimedAndAnExcusedOneIsNotWaitedFor) {
  RefitChildren c({"a", "b"});
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(t0);  // b is absent from the start
  EXPECT_TRUE(c.AwayLongerThan(t0 + milliseconds(500), milliseconds(1000)).empty());
  EXPECT_EQ(c.AwayLongerThan(t0 + milliseconds(1500), milliseconds(1000)),
            std::vector<std::string>{"b"});
  c.Excuse("b");
  EXPECT_TRUE(c.AwayLongerThan(t0 + milliseconds(1500), milliseconds(1000)).empty());
  c.Prepared("a", {});
  EXPECT_EQ(c.AwaitingPrepared(), 0u);
  // A child that leaves mid-refit is timed from then; back, it is not.
  c.Lost("a", t0 + milliseconds(100));
  EXPECT_EQ(c.AwayLongerThan(t0 + milliseconds(1200), milliseconds(1000)),
            std::vector<std::string>{"a"});
  c.Joined("a", false, t0 + milliseconds(1300));
  EXPECT_TRUE(c.AwayLongerThan(t0 + milliseconds(5000), milliseconds(1000)).empty());
}

TEST(RefitChildren, AfterTheDecisionAnAbsentChildIsGivenUpOnAtItsDeadline) {
  RefitChildren c({"a", "b"});
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(t0);
  c.Decided(t0, milliseconds(3000), milliseconds(1000));  // b absent: 3 s
  EXPECT_EQ(c.AwaitingConfirmation(), 2u);
  EXPECT_TRUE(c.GiveUpOnAway(t0 + milliseconds(2000)).empty());
  c.Lost("a", t0 + milliseconds(2000));  // a drops before confirming: 1 s from then
  EXPECT_EQ(c.GiveUpOnAway(t0 + milliseconds(3100)), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.AwaitingConfirmation(), 0u);
  // A new refit waits for everyone again.
  c.EndRefit();
  c.Joined("a", false, t0 + milliseconds(4000));
  c.BeginRefit(t0 + milliseconds(4000));
  EXPECT_EQ(c.AwaitingPrepared(), 2u);
}

TEST(RefitChildren, AnAdoptedChildCountsOnlyWhileConnected) {
  RefitChildren c({"a"});
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.Joined("g", true, t0);  // a grandchild whose parent died
  EXPECT_TRUE(c.IsAdopted("g"));
  c.BeginRefit(t0);
  EXPECT_EQ(c.AwaitingPrepared(), 2u);
  c.Lost("g", t0);
  EXPECT_EQ(c.AwaitingPrepared(), 1u);
  EXPECT_TRUE(c.AwayLongerThan(t0 + milliseconds(5000), milliseconds(1)).empty())
      << "an adopted child is never timed";
}

TEST(RefitChildren, AChildThatRejoinsPreparesAgainAndItsReportIsReplaced) {
  RefitChildren c({"a"});
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(t0);
  c.Prepared("a", {{"a", 10, 0.1, 1}});
  c.Rejoined("a");
  EXPECT_EQ(c.AwaitingPrepared(), 1u);
  c.Prepared("a", {{"a", 12, 0.2, 1}});
  ASSERT_EQ(c.reports().size(), 1u);
  EXPECT_EQ(c.reports()[0].chunk_bytes, 12u);
}

// Found by the simulator (seed 1178): a relay adopted a child whose parent was down,
// the child could not reach the target and was excused (policy available), and the
// relay still waited for its PREPARED until the source's commit timeout.
TEST(RefitChildren, AnExcusedAdoptedChildIsNotWaitedFor) {
  RefitChildren c({"a"});
  const auto t0 = Clock::now();
  c.Joined("a", false, t0);
  c.BeginRefit(t0);
  c.Joined("x", /*adopted=*/true, t0);
  c.Prepared("a", {});
  EXPECT_EQ(c.AwaitingPrepared(), 1u) << "an adopted child is waited for";
  c.Excuse("x");
  EXPECT_EQ(c.AwaitingPrepared(), 0u);
}

}  // namespace
}  // namespace deltacast::relay
