// Striped trees when a relay cannot take part (docs/protocol.md, "Stripes",
// "Recovery"): its parents leave it out, so its children must not wait for the
// chunks it would have forwarded while their other stripes' parents wait for them.
#include <atomic>
#include <chrono>

#include "tests/relay/intercept_transport.h"
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

// Wraps a transport so that every link whose HELLO joins `stripe`, after the first
// such link, is aborted at that HELLO: the node can never rejoin that stripe.
class NoRejoinTransport : public test_util::InterceptTransport {
 public:
  NoRejoinTransport(std::unique_ptr<transport::Transport> inner, uint32_t stripe)
      : NoRejoinTransport(std::move(inner), stripe, std::make_shared<Counts>()) {}
  int refused() const { return counts_->refused.load(); }

 private:
  struct Counts {
    std::atomic<int> joins{0};
    std::atomic<int> refused{0};
  };
  NoRejoinTransport(std::unique_ptr<transport::Transport> inner, uint32_t stripe,
                    std::shared_ptr<Counts> counts)
      : InterceptTransport(std::move(inner), Hooks(static_cast<int>(stripe), counts)),
        counts_(std::move(counts)) {}
  static test_util::InterceptHooks Hooks(int stripe, std::shared_ptr<Counts> counts) {
    test_util::InterceptHooks hooks;
    hooks.on_send = [stripe, counts](test_util::InterceptedLink& link, transport::Message& message,
                                     transport::SendHandler&) {
      auto type = PeekType(*message);
      if (type.ok() && *type == MessageType::kHello && link.stripe == stripe &&
          counts->joins++ > 0) {
        ++counts->refused;
        return test_util::SendAction::kAbort;
      }
      return test_util::SendAction::kForward;
    };
    return hooks;
  }
  std::shared_ptr<Counts> counts_;
};

// As above, n5 cannot take part and refuses its stripe-1 children n1 and n2; but n1
// can join no stripe-1 parent again (neither n5 nor its failover parent, the
// source). Its stripe-1 chunks cannot come: once its parents there have been away
// past the connect timeout and the failover's turn, n1 says FAILED up stripe 0,
// whose tree would wait for it (before: until the commit timeout, 20 s), and, left
// out itself, refuses its stripe-0 children n3 and n4, which fail over to the
// source. The refit commits without n1 and n5.
TEST_F(StripesTest, ANodeThatCanJoinNoParentOfAStripeSaysFailedUpTheOthers) {
  policy_ = "available";
  connect_timeout_ = "2s";
  SetUp();
  Versions v = MakeVersions(1 << 18, 63);
  UseRotatedPlan(2);
  engine_hooks_[4] =
      EngineHooks{[] { return Status::Unavailable("the test's engine refuses to pause"); }, [] {},
                  std::chrono::milliseconds(1000)};
  NoRejoinTransport* n1_links = nullptr;
  wrap_ = [&n1_links](int node, std::unique_ptr<transport::Transport> t) {
    if (node != 0) return t;
    auto wrapped = std::make_unique<NoRejoinTransport>(std::move(t), 1);
    n1_links = wrapped.get();
    return std::unique_ptr<transport::Transport>(std::move(wrapped));
  };
  ASSERT_NO_FATAL_FAILURE(StartAgents(v));
  const auto started = std::chrono::steady_clock::now();
  auto report = Publish(v);
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_LT(took, std::chrono::seconds(17)) << "the publish waited for n1";
  ASSERT_NE(n1_links, nullptr);
  EXPECT_GE(n1_links->refused(), 1) << "n1 never tried to rejoin stripe 1";
  std::set<std::string> prepared;
  for (const auto& n : report->nodes) prepared.insert(n.node_id);
  EXPECT_EQ(prepared, (std::set<std::string>{"n2", "n3", "n4", "n6", "n7"}));
  for (int i = 1; i < kReceivers; ++i) {
    const auto& want = i == 4 ? v.base : v.target;  // n5 wrote nothing
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(want[t])) << "n" << i + 1 << " tensor " << t;
    }
    EXPECT_EQ(agents_[i]->stats().refits_committed, i == 4 ? 0u : 1u) << "n" << i + 1;
  }
  // n1 applied some of stripe 0's chunks and holds the delta in flight: it catches
  // up at a later refit.
  const NodeAgentStats n1 = agents_[0]->stats();
  EXPECT_EQ(n1.refits_committed, 0u);
  EXPECT_NE(n1.version, report->target_version);
}

}  // namespace
}  // namespace deltacast::relay::stripes_test
