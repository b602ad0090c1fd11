// PollBackoff on given time points: no clock, no sleeps.
#include "relay/bucket/internal/poll_backoff.h"

#include <gtest/gtest.h>

namespace deltacast::relay::internal {
namespace {

using std::chrono::milliseconds;

TEST(PollBackoff, StaysAtBaseWhileNewsIsFreshThenDoublesToMax) {
  const auto t0 = PollBackoff::Clock::now();
  PollBackoff b(milliseconds(20), milliseconds(250));
  b.Reset(t0);
  EXPECT_EQ(b.Next(t0), milliseconds(20));
  EXPECT_EQ(b.Next(t0 + PollBackoff::kHot - milliseconds(1)), milliseconds(20));
  const auto late = t0 + PollBackoff::kHot;
  EXPECT_EQ(b.Next(late), milliseconds(40));
  EXPECT_EQ(b.Next(late), milliseconds(80));
  EXPECT_EQ(b.Next(late), milliseconds(160));
  EXPECT_EQ(b.Next(late), milliseconds(250));  // bounded
  EXPECT_EQ(b.Next(late), milliseconds(250));
}

TEST(PollBackoff, NewsResetsToBase) {
  const auto t0 = PollBackoff::Clock::now();
  PollBackoff b(milliseconds(20), milliseconds(250));
  b.Reset(t0);
  const auto late = t0 + 3 * PollBackoff::kHot;
  for (int i = 0; i < 10; ++i) (void)b.Next(late);
  EXPECT_EQ(b.Next(late), milliseconds(250));
  b.Reset(late);
  EXPECT_EQ(b.Next(late), milliseconds(20));
  // Once news is stale again, the doubling starts over from the base.
  EXPECT_EQ(b.Next(late + PollBackoff::kHot), milliseconds(40));
}

TEST(PollBackoff, MaxBelowBaseMeansNoBackoff) {
  const auto t0 = PollBackoff::Clock::now();
  PollBackoff b(milliseconds(100), milliseconds(10));
  b.Reset(t0);
  EXPECT_EQ(b.Next(t0 + 10 * PollBackoff::kHot), milliseconds(100));
}

}  // namespace
}  // namespace deltacast::relay::internal
