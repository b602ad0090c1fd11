// Refusals that arrive: a node its parent turns away (a wrong token, a plan that
// does not make it that parent's child, another stripe count, another protocol
// version) learns the REFUSE's reason before the link closes, unstriped (S = 1) and
// striped (S = 2). Over the inproc transport, where a close withdraws every message
// the peer has not taken yet: a REFUSE sent and closed at once never arrives there.
// And a refused peer that reads nothing is closed all the same, at the handshake
// timeout (docs/protocol.md, "Refusals").
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/relay/tree/stripes_fixture.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay::stripes_test {
namespace {

using namespace std::chrono_literals;

constexpr int kNodes = 3;

std::string RefusalsToml() {
  std::string toml =
      "[cluster]\nname = \"refusals-test\"\n\n[tree]\nfanout = 2\nchunk_size = \"4KiB\"\n"
      "window = 4\nconnect_timeout = \"2s\"\ncommit_timeout = \"20s\"\n\n[limits]\n"
      "handshake_timeout = \"1s\"\n\n[[node]]\nid = \"src\"\nhost = \"mem\"\nport = 1\n"
      "region = \"r\"\nrole = \"source\"\n";
  for (int i = 1; i <= kNodes; ++i) {
    toml += "\n[[node]]\nid = \"n" + std::to_string(i) +
            "\"\nhost = \"mem\"\nport = " + std::to_string(1 + 3 * i) +
            "\nregion = \"r\"\nrole = \"receiver\"\n";
  }
  return toml;
}

// What a raw link to a listener received, and whether it closed.
struct Heard {
  std::mutex mu;
  std::vector<transport::Message> messages;
  bool closed = false;
  // The reason of the first REFUSE, if one came.
  std::string Refusal() {
    std::lock_guard lock(mu);
    for (const auto& m : messages) {
      auto type = PeekType(ByteSpan(*m));
      if (!type.ok() || *type != MessageType::kRefuse) continue;
      auto refuse = ParseRefuse(ByteSpan(*m));
      return refuse.ok() ? refuse->reason : refuse.status().ToString();
    }
    return {};
  }
};

// Param: the stripe count S of the source's plan.
class RefusalsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    auto config = topology::ParseClusterConfig(RefusalsToml(), "refusals-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    auto tree = topology::PlanTree(config_);
    ASSERT_TRUE(tree.ok()) << tree.status().ToString();
    base_tree_ = *tree;
    network_ = std::make_shared<transport::InprocNetwork>();
    v_ = MakeVersions(1 << 10, 61);
    stores_.assign(kNodes, v_.base);
  }
  void TearDown() override {
    for (auto& a : agents_) a->Stop();
    if (source_) source_->Stop();
  }

  // `stripes` trees, each the receivers in `order` below the source, `fanout` each.
  topology::StripedPlan PlanOf(int stripes, const std::vector<std::string>& order,
                               int fanout) const {
    topology::StripedPlan plan;
    plan.source = "src";
    for (int s = 0; s < stripes; ++s) {
      topology::StripeTree stripe;
      stripe.index = s;
      stripe.root = "src";
      stripe.tree = TreeOf(base_tree_, order, fanout);
      plan.stripes.push_back(std::move(stripe));
    }
    return plan;
  }

  void StartSource(const topology::StripedPlan& plan) {
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    auto source = Source::Start(options, transport::MakeInprocTransport(network_), plan);
    ASSERT_TRUE(source.ok()) << source.status().ToString();
    source_ = std::move(*source);
  }

  // Receiver n<i+1>, along `plan`.
  NodeAgent& StartNode(int i, const topology::StripedPlan& plan,
                       const std::string& token = kToken) {
    auto replica = apply::Replica::ForStore(Borrow(v_.tensors, stores_[i]), kPartitionBytes, 1);
    EXPECT_TRUE(replica.ok());
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n" + std::to_string(i + 1);
    options.token = token;
    options.apply_threads = 1;
    auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                  transport::MakeInprocTransport(network_), plan);
    EXPECT_TRUE(agent.ok()) << agent.status().ToString();
    agents_.push_back(std::move(*agent));
    return *agents_.back();
  }

  // A raw link to the source; started (reading) or not.
  std::unique_ptr<transport::Connection> Dial(transport::Transport& t,
                                              const std::shared_ptr<Heard>& heard, bool start) {
    auto link = transport::ConnectBlocking(t, source_->listen_address(), 5s);
    EXPECT_TRUE(link.ok()) << link.status().ToString();
    if (!link.ok()) return nullptr;
    if (start) StartReading(**link, heard);
    return std::move(*link);
  }
  static void StartReading(transport::Connection& link, const std::shared_ptr<Heard>& heard) {
    link.Start(
        [heard](transport::Message m) {
          std::lock_guard lock(heard->mu);
          heard->messages.push_back(std::move(m));
        },
        [heard](Status) {
          std::lock_guard lock(heard->mu);
          heard->closed = true;
        });
  }

  // The node's join check, which must name the parent's refusal and `reason`.
  static void ExpectRefused(NodeAgent& node, const std::string& reason) {
    const JoinCheck::State state = node.WaitForJoin(10s);
    EXPECT_EQ(state.status.code(), StatusCode::kPermissionDenied) << state.status.ToString();
    EXPECT_NE(state.status.message().find("parent 'src' refused this node"), std::string::npos)
        << state.status.ToString();
    EXPECT_NE(state.status.message().find(reason), std::string::npos) << state.status.ToString();
  }

  topology::ClusterConfig config_;
  topology::TreePlan base_tree_;
  std::shared_ptr<transport::InprocNetwork> network_;
  Versions v_;
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<Source> source_;
};

TEST_P(RefusalsTest, ANodeWithAWrongTokenIsToldSo) {
  const topology::StripedPlan plan = PlanOf(GetParam(), {"n1", "n2", "n3"}, 2);
  ASSERT_NO_FATAL_FAILURE(StartSource(plan));
  NodeAgent& n1 = StartNode(0, plan, "not-the-token");
  ExpectRefused(n1, "node 'n1' failed authentication (wrong cluster token)");
}

// n3 believes its parent is the source; the source's plan has it three levels down
// (a chain), where the source cannot even adopt it.
TEST_P(RefusalsTest, ANodeThatIsNotTheParentsChildInItsPlanIsToldSo) {
  ASSERT_NO_FATAL_FAILURE(StartSource(PlanOf(GetParam(), {"n1", "n2", "n3"}, 1)));
  NodeAgent& n3 = StartNode(2, PlanOf(GetParam(), {"n3", "n1", "n2"}, 1));
  ExpectRefused(n3, "node 'n3' is not a child of 'src' in the plan");
}

TEST_P(RefusalsTest, ANodeOfAnotherStripeCountIsToldWhatTheParentServes) {
  const int stripes = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartSource(PlanOf(stripes, {"n1", "n2", "n3"}, 2)));
  NodeAgent& n1 = StartNode(0, PlanOf(stripes == 1 ? 2 : 1, {"n1", "n2", "n3"}, 2));
  ExpectRefused(n1, "but 'src' serves " + std::to_string(stripes) + " stripes");
}

// Every refusal at the door, on every link: the REFUSE and its reason come before the
// close (sent and closed at once, about half were lost here). Raw links send the
// first message themselves: a HELLO with no valid proof, of a node the plan does not
// put below the source, of another stripe count, of another protocol version, or no
// HELLO at all.
TEST_P(RefusalsTest, EveryRefusalAtTheDoorReachesThePeerBeforeTheClose) {
  const int stripes = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartSource(PlanOf(stripes, {"n1", "n2", "n3"}, 1)));  // a chain
  auto hello_of = [&](const std::string& id, uint32_t hello_stripes) {
    Hello hello;
    hello.node_id = id;
    hello.stripes = hello_stripes;
    return EncodeHello(hello);
  };
  std::vector<std::byte> other_version = hello_of("n1", stripes);
  other_version[4] = std::byte{kProtocolVersion + 1};
  const std::vector<std::pair<std::vector<std::byte>, std::string>> cases = {
      {hello_of("n1", stripes), "node 'n1' failed authentication (wrong cluster token)"},
      {hello_of("n3", stripes), "node 'n3' is not a child of 'src' in the plan"},
      {hello_of("n1", stripes + 1), "but 'src' serves " + std::to_string(stripes) + " stripes"},
      {other_version,
       "expected HELLO first: protocol version " + std::to_string(kProtocolVersion + 1) +
           " is not supported (this build speaks " + std::to_string(kProtocolVersion) + ")"},
      {EncodeHeartbeat(), "expected HELLO first, not HEARTBEAT"},
  };
  auto t = transport::MakeInprocTransport(network_);
  for (const auto& [first, reason] : cases) {
    for (int k = 0; k < 10; ++k) {
      auto heard = std::make_shared<Heard>();
      auto link = Dial(*t, heard, /*start=*/true);
      ASSERT_TRUE(link);
      link->Send(transport::MakeMessage(first));
      const auto until = std::chrono::steady_clock::now() + 5s;
      while (std::chrono::steady_clock::now() < until) {
        {
          std::lock_guard lock(heard->mu);
          if (heard->closed) break;
        }
        std::this_thread::sleep_for(1ms);
      }
      {
        std::lock_guard lock(heard->mu);
        EXPECT_TRUE(heard->closed) << "link " << k << " was never closed (" << reason << ")";
      }
      const std::string got = heard->Refusal();
      EXPECT_NE(got.find(reason), std::string::npos)
          << "link " << k << ": REFUSE '" << got << "', want '" << reason << "'";
      link.reset();
    }
  }
  t->Shutdown();
}

// A peer refused at once (it sent no HELLO) that never reads does not hold its link
// open: the REFUSE waits for it only up to the handshake timeout (1 s here).
TEST_P(RefusalsTest, ARefusedPeerThatReadsNothingIsClosedAtTheHandshakeTimeout) {
  ASSERT_NO_FATAL_FAILURE(StartSource(PlanOf(GetParam(), {"n1", "n2", "n3"}, 2)));
  auto t = transport::MakeInprocTransport(network_);
  auto heard = std::make_shared<Heard>();
  auto link = Dial(*t, heard, /*start=*/false);
  ASSERT_TRUE(link);
  link->Send(transport::MakeMessage(EncodeHeartbeat()));  // not a HELLO: refused
  std::this_thread::sleep_for(3s);                        // the timeout, and room
  // Only now does it read: what is left, and the close (before Start nothing was
  // taken, so a link still open would stay open for good).
  StartReading(*link, heard);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard lock(heard->mu);
      if (heard->closed) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  {
    std::lock_guard lock(heard->mu);
    EXPECT_TRUE(heard->closed) << "a refused link that reads nothing is held open";
  }
  link.reset();  // not under heard->mu: it waits for the link's handlers
  t->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Stripes, RefusalsTest, ::testing::Values(1, 2),
                         [](const auto& info) { return "S" + std::to_string(info.param); });

}  // namespace
}  // namespace deltacast::relay::stripes_test
