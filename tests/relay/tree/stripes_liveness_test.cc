// Striped trees when a relay cannot take part (docs/protocol.md, "Stripes",
// "Recovery"): its parents leave it out, so its children must not wait for the
// chunks it would have forwarded while their other stripes' parents wait for them.
#include <chrono>

#include "tests/relay/tree/stripes_fixture.h"

namespace deltacast::relay::stripes_test {
namespace {

// The rotated plan for S = 2 (stripes_fixture.h):
//   stripe 0: src -> n1, n2; n1 -> n3, n4; n2 -> n5, n6; n3 -> n7
//   stripe 1: src -> n4, n5; n4 -> n6, n7; n5 -> n1, n2; n6 -> n3
// n5's engine refuses to pause, so n5 cannot take part: the source leaves it (and,
// with one tree, its subtree) out of stripe 1. Its stripe-1 children n1 and n2 get
// no stripe-1 chunk from it, while n1's and n2's stripe-0 subtrees wait for them.
// n5 refuses them, they fail over to the source in stripe 1 and are replayed that
// stripe there; the refit commits without n5 long before the commit timeout (20 s;
// before the fix it aborted there: the simulator's --stripes seeds 6 and 50).
TEST_F(StripesTest, ARelayThatCannotTakePartSendsItsChildrenToTheirFailoverParents) {
  policy_ = "available";
  connect_timeout_ = "2s";
  SetUp();
  Versions v = MakeVersions(1 << 18, 61);
  UseRotatedPlan(2);
  engine_hooks_[4] =
      EngineHooks{[] { return Status::Unavailable("the test's engine refuses to pause"); }, [] {},
                  std::chrono::milliseconds(1000)};
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  const auto started = std::chrono::steady_clock::now();
  auto report = Publish(v);
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_LT(took, std::chrono::seconds(15)) << "the publish waited for n5's children";
  std::set<std::string> prepared;
  for (const auto& n : report->nodes) prepared.insert(n.node_id);
  EXPECT_EQ(prepared, (std::set<std::string>{"n1", "n2", "n3", "n4", "n6", "n7"}));
  for (int i = 0; i < kReceivers; ++i) {
    const auto& want = i == 4 ? v.base : v.target;  // n5 wrote nothing
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(want[t])) << "n" << i + 1 << " tensor " << t;
    }
    EXPECT_EQ(agents_[i]->stats().refits_committed, i == 4 ? 0u : 1u) << "n" << i + 1;
  }
  // n1 and n2 joined stripe 1 again, at the source; stripe 0 once.
  for (int i : {0, 1}) {
    const NodeAgentStats s = agents_[i]->stats();
    ASSERT_EQ(s.stripe_parent_joins.size(), 2u);
    EXPECT_EQ(s.stripe_parent_joins[0], 1u) << "n" << i + 1;
    EXPECT_GE(s.stripe_parent_joins[1], 2u) << "n" << i + 1;
  }
}

}  // namespace
}  // namespace deltacast::relay::stripes_test
