// The admission rule shared by the tree's listener and the root's producer
// listener (relay/wire/internal/handshake_limits.h), on its own: which link gives way
// when every handshake slot is taken.
#include "relay/wire/internal/handshake_limits.h"

#include <gtest/gtest.h>

namespace deltacast::relay {
namespace {

struct Entry {
  std::string host;
};
using Pending = std::map<uint64_t, Entry>;

HandshakeLimits Limits(size_t max_pending, size_t per_address) {
  return {std::chrono::milliseconds(5000), max_pending, per_address};
}

TEST(HandshakeAdmission, AdmitsWhileSlotsAreFreeAndRefusesAnAddressAtItsCap) {
  const ProvenHosts none;
  Pending p{{1, {"a"}}, {2, {"a"}}};
  auto r = AdmitHandshake(p, "a", Limits(8, 3), none);
  EXPECT_TRUE(r.admit);
  EXPECT_FALSE(r.evict);
  p[3] = {"a"};
  r = AdmitHandshake(p, "a", Limits(8, 3), none);
  EXPECT_FALSE(r.admit);
  EXPECT_STREQ(r.refused_by, "max_handshakes_per_address");
  EXPECT_EQ(r.count, 3u);
  EXPECT_TRUE(AdmitHandshake(p, "b", Limits(8, 3), none).admit);
}

TEST(HandshakeAdmission, AFullTableGivesUpTheOldestLinkOfTheMostRepresentedAddress) {
  const ProvenHosts none;
  // b holds 3, a and c 2 each: b's oldest (serial 2) goes for a newcomer from d.
  Pending p{{1, {"a"}}, {2, {"b"}}, {3, {"c"}}, {4, {"b"}}, {5, {"a"}}, {6, {"b"}}, {7, {"c"}}};
  auto r = AdmitHandshake(p, "d", Limits(7, 4), none);
  ASSERT_TRUE(r.admit);
  ASSERT_TRUE(r.evict);
  EXPECT_EQ(*r.evict, 2u);
  // A newcomer from b itself (3 pending, the most) is refused instead.
  r = AdmitHandshake(p, "b", Limits(7, 4), none);
  EXPECT_FALSE(r.admit);
  EXPECT_STREQ(r.refused_by, "max_pending_handshakes");
  // Ties: the address whose oldest link is oldest (a, serial 1) over c.
  p.erase(2);
  p[8] = {"e"};
  r = AdmitHandshake(p, "d", Limits(7, 4), none);
  ASSERT_TRUE(r.evict);
  EXPECT_EQ(*r.evict, 1u) << "a, b and c hold 2 each; a's oldest link is the oldest";
}

TEST(HandshakeAdmission, OneLinkPerAddressEverywhereRefusesANewcomerHoldingOneToo) {
  const ProvenHosts none;
  Pending p{{1, {"a"}}, {2, {"b"}}, {3, {"c"}}};
  auto r = AdmitHandshake(p, "d", Limits(3, 8), none);
  ASSERT_TRUE(r.evict);
  EXPECT_EQ(*r.evict, 1u) << "every address holds one: the oldest link goes";
  r = AdmitHandshake(p, "b", Limits(3, 8), none);
  EXPECT_FALSE(r.admit) << "b holds as many as anyone: nothing to gain by swapping";
}

TEST(HandshakeAdmission, AProvenAddressIsDisplacedOnlyWhenNoUnprovenOneIsPending) {
  ProvenHosts proven;
  proven.Add("child");
  // The proven child's link is the oldest and its address holds as many as any.
  Pending p{{1, {"child"}}, {2, {"x"}}, {3, {"y"}}};
  auto r = AdmitHandshake(p, "z", Limits(3, 8), proven);
  ASSERT_TRUE(r.evict);
  EXPECT_EQ(*r.evict, 2u) << "the oldest unproven link goes, not the child's";
  // A proven newcomer displaces an unproven link even where it holds as many.
  Pending q{{1, {"x"}}, {2, {"child"}}, {3, {"y"}}};
  r = AdmitHandshake(q, "child", Limits(3, 8), proven);
  ASSERT_TRUE(r.evict);
  EXPECT_EQ(*r.evict, 1u);
  // Only proven links pending: the usual rule among them.
  Pending all{{1, {"child"}}, {2, {"child"}}};
  r = AdmitHandshake(all, "z", Limits(2, 8), proven);
  ASSERT_TRUE(r.evict);
  EXPECT_EQ(*r.evict, 1u);
}

TEST(HandshakeAdmission, ProvenHostsKeepTheLatestDistinctAddresses) {
  ProvenHosts proven(2);
  proven.Add("a");
  proven.Add("b");
  proven.Add("a");  // already there: nothing moves
  proven.Add("c");
  EXPECT_FALSE(proven.Contains("a"));
  EXPECT_TRUE(proven.Contains("b"));
  EXPECT_TRUE(proven.Contains("c"));
}

}  // namespace
}  // namespace deltacast::relay
