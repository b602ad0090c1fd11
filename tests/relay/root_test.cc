// The root and its producers in one process over the inproc transport: the ranks of
// a synthetic training job each run a Producer over their own shard files; the Root
// merges them into one delta for a relay tree of NodeAgents, and every receiver
// ends byte-identical to the canonical checkpoint. A producer that dies mid-refit
// aborts the refit cleanly; with it back, the next refit commits. The tree checks
// the source's signatures (protocol v3), so the merged stream must arrive signed.
// Producers join under the tree's mutual token proof and pre-authentication limits.
#include "relay/root.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "relay/node_agent.h"
#include "relay/producer.h"
#include "relay/producer_hub.h"
#include "relay/shard_input.h"
#include "relay/signing.h"
#include "tests/temp_dir.h"
#include "tests/transport/test_util.h"
#include "topology/cluster_config.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;

constexpr char kToken[] = "root-test-token";
constexpr uint64_t kPartitionBytes = 64 << 10;

std::string ConfigToml(int receivers) {
  std::string toml =
      "[cluster]\nname = \"root-test\"\n\n[tree]\nfanout = 2\nchunk_size = \"64KiB\"\n"
      "window = 4\nconnect_timeout = \"5s\"\ncommit_timeout = \"20s\"\n\n"
      "[[node]]\nid = \"trainer\"\nhost = \"mem\"\nport = 1\nregion = \"r\"\nrole = \"source\"\n";
  for (int i = 1; i <= receivers; ++i) {
    toml += "\n[[node]]\nid = \"n" + std::to_string(i) +
            "\"\nhost = \"mem\"\nport = " + std::to_string(1 + 3 * i) +
            "\nregion = \"r\"\nrole = \"receiver\"\n";
  }
  return toml;
}

// One rank's shard at every step, and its placement.
struct RankFiles {
  std::vector<std::unique_ptr<ShardFile>> steps;
  RankPlacement placement;
  ShareInput Input(int from) const {
    return {&placement.map, [this, from](uint32_t i) { return steps[from]->TensorData(i); },
            [this, from](uint32_t i) { return steps[from + 1]->TensorData(i); }};
  }
};

class RootTest : public ::testing::Test {
 protected:
  void SetUpJob(const std::string& shards, uint64_t experts, uint64_t params, int steps) {
    agent::SynthOptions o;
    o.out_dir = dir_.path();
    o.params = params;
    o.steps = steps;
    o.seed = 21;
    o.threads = 2;
    o.experts = experts;
    o.shards = *agent::ParseShardSpec(shards);
    auto synth = agent::Synthesize(o);
    ASSERT_TRUE(synth.ok()) << synth.status().ToString();
    for (int r = 0; r < synth->shard_ranks; ++r) {
      auto files = std::make_unique<RankFiles>();
      const std::string stem = agent::RankFileStem(r);
      for (int k = 0; k <= steps; ++k) {
        const fs::path d = agent::ShardDirOf(dir_.path() / ("step" + std::to_string(k)));
        auto f = ShardFile::Open(d / (stem + ".safetensors"));
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        files->steps.push_back(std::move(*f));
      }
      auto p = LoadRankPlacement(agent::ShardDirOf(dir_.path() / "step0") / (stem + ".toml"),
                                 files->steps[0]->tensors());
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      files->placement = std::move(*p);
      ranks_.push_back(std::move(files));
    }
  }

  void StartTree(int receivers) {
    auto signing = SigningKey::Generate();
    ASSERT_TRUE(signing.ok()) << signing.status().ToString();
    auto signing_key = std::make_shared<const SigningKey>(std::move(*signing));
    auto verify_key = std::make_shared<const VerifyKey>(signing_key->Public());
    auto config = topology::ParseClusterConfig(ConfigToml(receivers), "root-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    network_ = std::make_shared<transport::InprocNetwork>();
    auto step0 = Canonical(0);
    stores_.resize(receivers);
    for (int i = 0; i < receivers; ++i) {
      for (size_t t = 0; t < step0->tensors().size(); ++t) {
        const ByteSpan b = step0->TensorData(t);
        stores_[i].emplace_back(b.begin(), b.end());
      }
      std::vector<std::pair<codec::TensorInfo, MutableByteSpan>> spans;
      for (size_t t = 0; t < step0->tensors().size(); ++t) {
        spans.emplace_back(step0->tensors()[t], MutableByteSpan(stores_[i][t]));
      }
      auto replica =
          apply::Replica::ForStore(std::move(*apply::HostStore::Borrow(spans)), kPartitionBytes, 1);
      ASSERT_TRUE(replica.ok());
      NodeAgentOptions options;
      options.config = config_;
      options.node_id = "n" + std::to_string(i + 1);
      options.token = kToken;
      options.verify_key = verify_key;
      options.apply_threads = 1;
      auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                    transport::MakeInprocTransport(network_));
      ASSERT_TRUE(agent.ok()) << agent.status().ToString();
      agents_.push_back(std::move(*agent));
    }
    RootOptions options;
    options.publish.config = config_;
    options.publish.token = kToken;
    options.publish.signing_key = signing_key;
    options.publish.decision_log = dir_.path() / "decisions.log";
    options.producer_address = "producers:1";
    options.producers = ranks_.size();
    options.partition_bytes = kPartitionBytes;
    options.join_timeout = std::chrono::seconds(10);
    options.produce_timeout = std::chrono::seconds(20);
    auto root = Root::Start(std::move(options), transport::MakeInprocTransport(network_),
                            transport::MakeInprocTransport(network_));
    ASSERT_TRUE(root.ok()) << root.status().ToString();
    root_ = std::move(*root);
  }

  std::unique_ptr<Producer> ConnectProducer(size_t r, std::string die_at = "") {
    ProducerOptions o;
    o.id = agent::RankFileStem(r);
    o.root_address = root_->producer_address();
    o.root_id = "trainer";
    o.token = kToken;
    o.threads = 1;
    o.die_at = std::move(die_at);
    o.refit_timeout = std::chrono::seconds(20);
    auto p = Producer::Connect(std::move(o), transport::MakeInprocTransport(network_));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // Every producer serves step `from` -> from + 1 on its own thread; returns the
  // root's answer and each producer's.
  // A producer's outcome: its Serve status and, when OK, whether the refit committed.
  struct Served {
    Status status;
    bool committed = false;
  };
  Result<RootReport> Refit(int from, std::vector<Served>* producer_results = nullptr) {
    std::vector<std::thread> threads;
    std::vector<Served> results(producers_.size());
    for (size_t r = 0; r < producers_.size(); ++r) {
      threads.emplace_back([this, r, from, &results] {
        auto served = producers_[r]->Serve(ranks_[r]->Input(from));
        results[r] = {served.ok() ? Status::Ok() : served.status(),
                      served.ok() && served->committed};
      });
    }
    auto report = root_->Publish();
    for (auto& t : threads) t.join();
    if (producer_results) *producer_results = results;
    return report;
  }

  std::unique_ptr<apply::CheckpointDirStore> Canonical(int step) {
    auto s = apply::CheckpointDirStore::Open(dir_.path() / ("step" + std::to_string(step)),
                                             apply::CheckpointDirStore::Access::kReadOnly);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }

  // Every receiver holds exactly the canonical checkpoint of `step`.
  void ExpectReceiversAt(int step) {
    auto want = Canonical(step);
    for (size_t i = 0; i < stores_.size(); ++i) {
      for (size_t t = 0; t < want->tensors().size(); ++t) {
        const ByteSpan w = want->TensorData(t);
        ASSERT_TRUE(std::equal(w.begin(), w.end(), stores_[i][t].begin(), stores_[i][t].end()))
            << "receiver n" << i + 1 << " tensor " << want->tensors()[t].name << " is not step "
            << step;
      }
    }
  }

  void TearDown() override {
    producers_.clear();
    if (root_) root_->Stop();
    for (auto& a : agents_) a->Stop();
  }

  test_util::TempDir dir_{"root_test"};
  std::vector<std::unique_ptr<RankFiles>> ranks_;
  topology::ClusterConfig config_;
  std::shared_ptr<transport::InprocNetwork> network_;
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<Root> root_;
  std::vector<std::unique_ptr<Producer>> producers_;
};

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

}  // namespace
}  // namespace deltacast::relay
