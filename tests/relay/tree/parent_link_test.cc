// ParentLink on its own over the inproc transport: the test plays the parent,
// speaking the handshake by hand.
#include "relay/tree/parent_link.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "tests/transport/test_util.h"
#include "topology/tree_plan.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {
namespace {

using std::chrono::milliseconds;
using transport::testutil::AcceptQueue;
using transport::testutil::Sink;

constexpr char kToken[] = "parent-link-token";

// What the link told its owner, recorded on the loop thread.
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  int joined = 0;
  int lost = 0;
  std::vector<MessageType> messages;
  template <typename F>
  bool Wait(F done) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return done(*this); });
  }
};

class ParentLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = topology::ParseClusterConfig(
        "[cluster]\nname = \"pl\"\n[tree]\nidle_timeout = \"30s\"\n"
        "[[node]]\nid = \"src\"\nhost = \"mem\"\nport = 1\nrole = \"source\"\n"
        "[[node]]\nid = \"n1\"\nhost = \"mem\"\nport = 4\n",
        "pl.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    auto plan = topology::PlanTree(config_);
    ASSERT_TRUE(plan.ok());
    self_ = *plan->Find("n1");
    network_ = std::make_shared<transport::InprocNetwork>();
    parent_ = transport::MakeInprocTransport(network_);
    ASSERT_TRUE(parent_->Listen("mem:1", accepted_.Handler()).ok());
    transport_ = transport::MakeInprocTransport(network_);
    ParentLink::Events events;
    events.hello = [] {
      Hello h;
      h.applied_chunks = {7};
      return h;
    };
    events.joined = [this] { Note([](Seen& s) { ++s.joined; }); };
    events.lost = [this](const Status&) { Note([](Seen& s) { ++s.lost; }); };
    events.message = [this](MessageType type, const transport::Message&) {
      Note([type](Seen& s) { s.messages.push_back(type); });
    };
    link_ = std::make_unique<ParentLink>(loop_, config_, self_, kToken, *transport_, events);
    loop_.Start();
  }
  void TearDown() override {
    loop_.Stop();
    link_.reset();
  }
  template <typename F>
  void Note(F f) {
    std::lock_guard lock(seen_.mu);
    f(seen_);
    seen_.cv.notify_all();
  }
  // Accepts the link's next connection and sends CHALLENGE as `parent_id`; returns
  // the connection and what it receives.
  std::pair<std::unique_ptr<transport::Connection>, std::unique_ptr<Sink>> Challenge(
      const std::string& parent_id, std::array<uint8_t, kNonceBytes>* nonce) {
    auto connection = accepted_.Pop(milliseconds(10000));
    EXPECT_NE(connection, nullptr);
    if (!connection) return {};
    auto sink = std::make_unique<Sink>();
    sink->Start(*connection);
    *nonce = RandomNonce();
    connection->Send(transport::MakeMessage(EncodeChallenge({*nonce, parent_id})));
    return {std::move(connection), std::move(sink)};
  }
  // The WELCOME that proves the token back over the nonce of the HELLO `sink` got.
  static transport::Message WelcomeFor(Sink& sink, const std::array<uint8_t, kNonceBytes>& nonce) {
    EXPECT_TRUE(sink.WaitMessages(1));
    auto hello = ParseHello(*sink.messages()[0]);
    EXPECT_TRUE(hello.ok()) << hello.status().ToString();
    if (!hello.ok()) return transport::MakeMessage(EncodeWelcome({}));
    return transport::MakeMessage(
        EncodeWelcome({ParentProof(kToken, nonce, hello->nonce, "src", "n1")}));
  }

  topology::ClusterConfig config_;
  topology::PlannedNode self_;
  std::shared_ptr<transport::InprocNetwork> network_;
  std::unique_ptr<transport::Transport> parent_, transport_;
  AcceptQueue accepted_;
  Seen seen_;
  std::unique_ptr<ParentLink> link_;
  EventLoop loop_{[this] {
    if (link_) link_->Tick(ParentLink::Clock::now(), /*between_refits=*/true);
  }};
};

TEST_F(ParentLinkTest, AnswersTheChallengeWithAProofAndDeliversMessagesAfterWelcome) {
  std::array<uint8_t, kNonceBytes> nonce;
  auto [connection, sink] = Challenge("src", &nonce);
  ASSERT_TRUE(connection);
  ASSERT_TRUE(sink->WaitMessages(1));
  auto hello = ParseHello(*sink->messages()[0]);
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->node_id, "n1");
  EXPECT_TRUE(ProofMatches(hello->proof, ChildProof(kToken, nonce, "n1", "src")));
  EXPECT_EQ(hello->applied_chunks, std::vector<uint32_t>{7}) << "what the owner said it holds";
  connection->Send(WelcomeFor(*sink, nonce));
  ASSERT_TRUE(seen_.Wait([](Seen& s) { return s.joined == 1; }));
  connection->Send(transport::MakeMessage(EncodeBegin({1, {}, {}, 4096})));
  ASSERT_TRUE(seen_.Wait([](Seen& s) { return s.messages.size() == 1; }));
  EXPECT_EQ(seen_.messages[0], MessageType::kBegin);
}

TEST_F(ParentLinkTest, RefusesANodeThatIsNotTheParentItDialled) {
  std::array<uint8_t, kNonceBytes> nonce;
  auto [connection, sink] = Challenge("impostor", &nonce);
  ASSERT_TRUE(connection);
  ASSERT_TRUE(sink->WaitMessages(1));
  auto type = PeekType(*sink->messages()[0]);
  ASSERT_TRUE(type.ok());
  EXPECT_EQ(*type, MessageType::kRefuse);
  EXPECT_TRUE(sink->WaitClosed());
  EXPECT_EQ(seen_.joined, 0);
}

TEST_F(ParentLinkTest, AMessageBeforeTheHandshakeIsAProtocolError) {
  auto connection = accepted_.Pop(milliseconds(10000));
  ASSERT_NE(connection, nullptr);
  Sink sink;
  sink.Start(*connection);
  connection->Send(transport::MakeMessage(EncodeBegin({1, {}, {}, 4096})));
  EXPECT_TRUE(sink.WaitClosed());
  EXPECT_TRUE(seen_.messages.empty());
}

TEST_F(ParentLinkTest, ALostLinkIsReportedAndDialledAgain) {
  std::array<uint8_t, kNonceBytes> nonce;
  {
    auto [connection, sink] = Challenge("src", &nonce);
    ASSERT_TRUE(connection);
    connection->Send(WelcomeFor(*sink, nonce));
    ASSERT_TRUE(seen_.Wait([](Seen& s) { return s.joined == 1; }));
    connection->Close();
  }
  ASSERT_TRUE(seen_.Wait([](Seen& s) { return s.lost == 1; }));
  auto [again, sink] = Challenge("src", &nonce);  // it came back by itself
  ASSERT_TRUE(again);
  again->Send(WelcomeFor(*sink, nonce));
  EXPECT_TRUE(seen_.Wait([](Seen& s) { return s.joined == 2; }));
}

TEST_F(ParentLinkTest, AParentWhoseWelcomeDoesNotProveTheTokenIsRefused) {
  std::array<uint8_t, kNonceBytes> nonce;
  auto [connection, sink] = Challenge("src", &nonce);
  ASSERT_TRUE(connection);
  ASSERT_TRUE(sink->WaitMessages(1));
  connection->Send(transport::MakeMessage(EncodeWelcome({})));  // no proof
  ASSERT_TRUE(sink->WaitMessages(2));
  auto type = PeekType(*sink->messages()[1]);
  ASSERT_TRUE(type.ok());
  EXPECT_EQ(*type, MessageType::kRefuse) << "told why before the link closes";
  EXPECT_TRUE(sink->WaitClosed());
  EXPECT_EQ(seen_.joined, 0);
}

}  // namespace
}  // namespace deltacast::relay
