// The root and its producers in one process over the inproc transport: the ranks of
// a synthetic training job each run a Producer over their own shard files; the Root
// merges them into one delta for a relay tree of NodeAgents, and every receiver
// ends byte-identical to the canonical checkpoint. A producer that dies mid-refit
// aborts the refit cleanly; with it back, the next refit commits. The tree checks
// the source's signatures (protocol v3), so the merged stream must arrive signed.
// Producers join under the tree's mutual token proof and pre-authentication limits.
#include <gtest/gtest.h>

#include "tests/relay/producers/root_fixture.h"

namespace deltacast::relay {
namespace {

TEST_F(RootTest, TensorTimesPipelineProducersPublishTwoSteps) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2,pp=2", 0, 5'000'000, 2));
  ASSERT_NO_FATAL_FAILURE(StartTree(3));
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  auto first = Refit(0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->publish.committed) << first->publish.abort_reason;
  EXPECT_TRUE(first->base_from_producers);
  auto step1 = Canonical(1);
  EXPECT_EQ(
      first->publish.target_version,
      codec::ComputeManifest(
          step1->tensors(), [&](size_t i) { return step1->TensorData(i); }, kPartitionBytes, 1)
          .VersionId());
  ExpectReceiversAt(1);
  // The next refit starts from the committed target: no base hashing.
  auto second = Refit(1);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->publish.committed) << second->publish.abort_reason;
  EXPECT_FALSE(second->base_from_producers);
  ExpectReceiversAt(2);
}

TEST_F(RootTest, MoeExpertParallelProducers) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("ep=2,tp=2", 4, 3'000'000, 1));
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  auto report = Refit(0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->publish.committed) << report->publish.abort_reason;
  ExpectReceiversAt(1);
}

TEST_F(RootTest, ProducerKilledWhileStreamingAbortsThenTheRefitCommits) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2,pp=2", 0, 5'000'000, 1));
  ASSERT_NO_FATAL_FAILURE(StartTree(3));
  for (size_t r = 0; r < ranks_.size(); ++r) {
    producers_.push_back(ConnectProducer(r, r == 2 ? "streaming" : ""));
  }
  std::vector<Served> results;
  auto report = Refit(0, &results);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->publish.committed);
  EXPECT_NE(report->publish.abort_reason.find("rank-00002"), std::string::npos)
      << report->publish.abort_reason;
  EXPECT_EQ(results[2].status.code(), StatusCode::kAborted);
  EXPECT_TRUE(results[0].status.ok());  // told the refit ended, not committed
  EXPECT_FALSE(results[0].committed);
  ExpectReceiversAt(0);  // rolled back exactly
  // The rank comes back; the next attempt commits.
  producers_[2] = ConnectProducer(2);
  auto again = Refit(0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->publish.committed) << again->publish.abort_reason;
  ExpectReceiversAt(1);
}

TEST_F(RootTest, ProducerKilledBeforeTheTargetIsKnownLeavesTheTreeUntouched) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2", 0, 3'000'000, 1));
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  producers_.push_back(ConnectProducer(0));
  producers_.push_back(ConnectProducer(1, "encoded"));
  std::vector<Served> results;
  auto report = Refit(0, &results);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("rank-00001"), std::string::npos)
      << report.status().ToString();
  EXPECT_TRUE(results[0].status.ok()) << results[0].status.ToString();
  EXPECT_FALSE(results[0].committed);
  EXPECT_EQ(results[1].status.code(), StatusCode::kAborted);
  ExpectReceiversAt(0);
  producers_[1] = ConnectProducer(1);
  auto again = Refit(0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->publish.committed);
  ExpectReceiversAt(1);
}

TEST_F(RootTest, AProducerWithTheWrongTokenIsRefused) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=1", 0, 3'000'000, 1));
  ASSERT_NO_FATAL_FAILURE(StartTree(1));
  ProducerOptions o;
  o.id = "intruder";
  o.root_address = root_->producer_address();
  o.root_id = "trainer";
  o.token = "wrong";
  o.connect_timeout = std::chrono::seconds(2);
  auto p = Producer::Connect(std::move(o), transport::MakeInprocTransport(network_));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("failed authentication"), std::string::npos)
      << p.status().ToString();
}

// Anyone can bind the root's producer port while it is down: a producer must not
// hand its share (and its link) to a root that cannot prove the token.
TEST(ProducerHandshakeTest, AProducerRefusesARootThatCannotProveTheToken) {
  auto network = std::make_shared<transport::InprocNetwork>();
  auto impostor = transport::MakeInprocTransport(network);
  transport::testutil::AcceptQueue accepted;
  ASSERT_TRUE(impostor->Listen("fake-root:1", accepted.Handler()).ok());
  std::thread play([&] {
    auto c = accepted.Pop();
    ASSERT_NE(c, nullptr);
    transport::testutil::Sink sink;
    sink.Start(*c);
    c->Send(transport::MakeMessage(EncodeChallenge({RandomNonce(), "trainer"})));
    ASSERT_TRUE(sink.WaitMessages(1));
    auto hello = ParseHello(*sink.messages()[0]);
    ASSERT_TRUE(hello.ok()) << hello.status().ToString();
    // A proof under another token, over the right nonces: still not the token.
    Welcome w{ParentProof("not-the-token", {}, hello->nonce, "trainer", hello->node_id)};
    c->Send(transport::MakeMessage(EncodeWelcome(w)));
    EXPECT_TRUE(sink.WaitClosed()) << "the producer closes the link";
    ASSERT_GE(sink.message_count(), 2u);
    EXPECT_EQ(*PeekType(*sink.messages()[1]), MessageType::kRefuse);
  });
  ProducerOptions o;
  o.id = "rank-00000";
  o.root_address = "fake-root:1";
  o.root_id = "trainer";
  o.token = kToken;
  o.connect_timeout = std::chrono::seconds(5);
  auto p = Producer::Connect(std::move(o), transport::MakeInprocTransport(network));
  play.join();
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kPermissionDenied) << p.status().ToString();
}

// The producer listener holds unauthenticated links as the tree's listener does:
// beyond the per-address cap a link is closed at once, and one that never sends
// its HELLO is dropped at the handshake timeout.
TEST(ProducerHandshakeTest, SilentLinksAreCappedAndDroppedAtTheHandshakeTimeout) {
  auto network = std::make_shared<transport::InprocNetwork>();
  auto listener = transport::MakeInprocTransport(network);
  auto dialer = transport::MakeInprocTransport(network);
  HandshakeLimits limits;
  limits.handshake_timeout = std::chrono::milliseconds(300);
  limits.max_pending = 16;
  limits.max_pending_per_address = 2;
  ProducerHub hub("trainer", kToken, /*capacity=*/1, limits);
  ASSERT_TRUE(hub.Listen(*listener, "producers:1").ok());
  std::vector<std::unique_ptr<transport::Connection>> links;
  std::vector<std::unique_ptr<transport::testutil::Sink>> sinks;
  for (int i = 0; i < 3; ++i) {
    auto c = transport::ConnectBlocking(*dialer, "producers:1", std::chrono::seconds(5));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    sinks.push_back(std::make_unique<transport::testutil::Sink>());
    sinks.back()->Start(**c);
    links.push_back(std::move(*c));
    if (i < 2) {
      ASSERT_TRUE(sinks.back()->WaitMessages(1)) << "link " << i << " was challenged";
    }
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(sinks[2]->WaitClosed(std::chrono::milliseconds(2000))) << "over the cap";
  EXPECT_EQ(sinks[2]->message_count(), 0u) << "closed without a CHALLENGE";
  EXPECT_EQ(hub.pending_handshakes(), 2u);
  EXPECT_TRUE(sinks[0]->WaitClosed(std::chrono::milliseconds(5000)));
  EXPECT_TRUE(sinks[1]->WaitClosed(std::chrono::milliseconds(5000)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_EQ(hub.pending_handshakes(), 0u);
  EXPECT_TRUE(hub.Joined().empty());
  hub.Close();
  for (auto& c : links) c->Close();
}

// FP8 serving is all producers or none: a root whose producers disagree refuses
// the refit before BEGIN, and the receivers keep their version.
TEST_F(RootTest, ProducersThatDisagreeOnFp8ServingAreRefused) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2,pp=2", 0, 3'000'000, 1));
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  serving_[0] = agent::DefaultFp8Serving();
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  std::vector<Served> served;
  auto report = Refit(0, &served);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().ToString().find("serves BF16 while others quantize to FP8"),
            std::string::npos)
      << report.status().ToString();
  EXPECT_FALSE(served[0].status.ok());
  ExpectReceiversAt(0);
}

// Producers serving FP8 over a TP=2 x PP=2 job whose TP cut of the MLP lies inside
// 128 x 128 blocks: the receivers hold the twins and end byte-identical to the
// next twins; the second refit starts from the images the first committed.
TEST_F(RootTest, Fp8ProducersShipTwinDeltasAndReuseTheCommittedImage) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob("tp=2,pp=2", 0, 4'000'000, 2));
  twins_ = agent::DefaultFp8Serving();
  ASSERT_NO_FATAL_FAILURE(StartTree(2));
  for (size_t r = 0; r < ranks_.size(); ++r) serving_[r] = *twins_;
  for (size_t r = 0; r < ranks_.size(); ++r) producers_.push_back(ConnectProducer(r));
  std::vector<Served> served;
  auto first = Refit(0, &served);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->publish.committed) << first->publish.abort_reason;
  EXPECT_GT(first->fp8.split_blocks, 0u);
  EXPECT_EQ(first->fp8.producers, ranks_.size());
  EXPECT_LT(first->fp8.exchange_bytes, first->fp8.gather_bytes);
  for (const Served& s : served) EXPECT_FALSE(s.fp8_base_kept);
  ExpectReceiversAt(1);
  auto second = Refit(1, &served);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->publish.committed) << second->publish.abort_reason;
  for (const Served& s : served) EXPECT_TRUE(s.fp8_base_kept);
  ExpectReceiversAt(2);
}

}  // namespace
}  // namespace deltacast::relay
