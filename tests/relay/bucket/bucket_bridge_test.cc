// The object-store path end to end in one process: a source, a tree node in the
// source's region, and a region whose gateway takes the delta through an S3 bucket
// (s3rver on loopback) by a bucket bridge, relaying it on to a node below it. The
// relay links run over the inproc transport; the bucket is real. Every test checks
// every node's bytes by hash against the target.
#include "relay/bucket/bucket_bridge.h"

#include <gtest/gtest.h>

#include <future>
#include <set>
#include <thread>

#include "objstore/bucket_layout.h"
#include "relay/bucket/internal/poll_backoff.h"
#include "relay/wire/protocol.h"
#include "tests/relay/bucket/bucket_fixture.h"
#include "topology/plan_format.h"

namespace deltacast::relay {
namespace {

using namespace bucket_test;  // NOLINT: the fixture and its helpers

TEST_F(BucketBridgeTest, RegionThroughTheBucketCommitsBitExact) {
  Versions v = MakeVersions(1 << 20, 3, 1);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  for (int k = 0; k < 2; ++k) {
    auto report = PublishStep(v, k);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(report->nodes.size(), 3u);  // us1, and eu1 + eu2 through the bucket
    EXPECT_GT(report->delta.chunks, 5u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version)) << kNodes[i];
    }
    ExpectAllAt(v, k + 1);
    // The refit's objects: BEGIN, every chunk, the seal and the decision.
    objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
    auto seal = s3_->Get(layout.Sealed(report->refit_id));
    ASSERT_TRUE(seal.ok()) << seal.status().ToString();
    auto parsed = objstore::ParseSeal(AsChars(*seal));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->chunks.size(), report->delta.chunks);  // data chunks and END
    EXPECT_TRUE(s3_->Head(layout.Decision(report->refit_id)).ok());
  }
  EXPECT_EQ(downlink_->stats().refits, 2u);
  EXPECT_EQ(uplink_->stats().refits, 2u);
}

// The S3 server is killed mid-refit and comes back 700 ms later on its folder:
// writes and reads are retried, the source is held back by credit meanwhile, and
// the refit commits everywhere.
TEST_F(BucketBridgeTest, ServerRestartedMidRefitStillCommits) {
  Versions v = MakeVersions(1 << 20, 2, 2);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  PublishOptions options;
  options.config = config_;
  options.token = kToken;
  std::atomic<bool> restarted{false};
  options.on_progress = [&](const PublishProgress& p) {
    if (p.chunks_sent == 4 && !restarted.exchange(true)) {
      server_.Stop();
      restarter_ = std::thread([this] {
        std::this_thread::sleep_for(std::chrono::milliseconds(700));
        ASSERT_TRUE(server_.Start());
      });
    }
  };
  auto source = Source::Start(std::move(options), transport::MakeInprocTransport(network_));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  source_ = std::move(*source);
  auto report = PublishStep(v, 0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(restarted);
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version));
  ExpectAllAt(v, 1);
  EXPECT_GT(uplink_->stats().retries + downlink_->stats().retries, 0u);
}

// The uplink dies mid-refit and a new one starts: it claims nothing, the source
// replays the refit to it, the rewrites are idempotent, and the refit commits.
TEST_F(BucketBridgeTest, UplinkRestartedMidRefitStillCommits) {
  Versions v = MakeVersions(1 << 20, 2, 7);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  PublishOptions options;
  options.config = config_;
  options.token = kToken;
  std::atomic<bool> restarted{false};
  options.on_progress = [&](const PublishProgress& p) {
    if (p.chunks_sent == 4 && !restarted.exchange(true)) {
      restarter_ = std::thread([this] {
        uplink_->Stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        auto up = BucketUplink::Start(BridgeOptions(), transport::MakeInprocTransport(network_));
        ASSERT_TRUE(up.ok()) << up.status().ToString();
        uplink_ = std::move(*up);
      });
    }
  };
  auto source = Source::Start(std::move(options), transport::MakeInprocTransport(network_));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  source_ = std::move(*source);
  auto report = PublishStep(v, 0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(restarted);
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version));
  ExpectAllAt(v, 1);
  restarter_.join();
  EXPECT_EQ(uplink_->stats().refits, 1u);  // the new uplink took the refit over
}

// Chunks lost or cut short in the bucket (deleted, truncated behind the server's
// back) are refused by the downlink, written again by the uplink on its request,
// and the refit commits bit-exact.
TEST_F(BucketBridgeTest, MissingAndTruncatedChunksAreWrittenAgain) {
  Versions v = MakeVersions(1 << 20, 2, 3);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  auto up = BucketUplink::Start(BridgeOptions(), transport::MakeInprocTransport(network_));
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  uplink_ = std::move(*up);
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto publish = std::async(std::launch::async, [&] { return PublishStep(v, 0); });
  // The downlink starts once every chunk is written, and two are damaged first.
  const uint64_t id = WaitForSealedRefit(0);
  ASSERT_NE(id, 0u) << "the uplink never sealed the refit";
  objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
  ASSERT_TRUE(s3_->Delete(layout.Chunk(id, 3)).ok());
  std::filesystem::resize_file(server_.ObjectFile(kBucket, layout.Chunk(id, 5)), 100);
  ASSERT_FALSE(s3_->Get(layout.Chunk(id, 5)).ok());
  ASSERT_NO_FATAL_FAILURE(StartDownlink());
  auto report = publish.get();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version));
  ExpectAllAt(v, 1);
  EXPECT_GE(uplink_->stats().refetches, 2u);
  EXPECT_GE(downlink_->stats().bad_objects, 2u);
}

// A decision object of an earlier refit sits at this refit's key (a writer that
// lagged, a copy by mistake): the downlink refuses it for naming another refit
// and waits; the refit commits on its own decision.
// Each half counts its refit's requests, and idle bridges back off: the poll is
// 10 ms, so without backoff the downlink alone would GET `head` ~100 times a second.
TEST_F(BucketBridgeTest, RequestsAreCountedPerRefitAndIdlePollsBackOff) {
  Versions v = MakeVersions(1 << 18, 2, 8);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto report = PublishStep(v, 0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  const auto up = uplink_->stats().last_refit_requests;
  const auto down = downlink_->stats().last_refit_requests;
  // BEGIN, head, every chunk, the seal, the decision and the chain.
  EXPECT_GE(up.put, report->delta.chunks + 5) << up.ToString();
  EXPECT_GE(down.put, 2u) << down.ToString();  // PREPARED and the outcome
  EXPECT_GE(down.get, report->delta.chunks + 2) << down.ToString();
  EXPECT_GT(up.get, 0u) << up.ToString();  // its polls for the region's reports

  // Past the 2 s at the base rate after the refit's end, then 2 s idle.
  std::this_thread::sleep_for(internal::PollBackoff::kHot + std::chrono::milliseconds(500));
  const uint64_t before = uplink_->stats().requests.Total() + downlink_->stats().requests.Total();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const uint64_t idle =
      uplink_->stats().requests.Total() + downlink_->stats().requests.Total() - before;
  EXPECT_LE(idle, 20u) << "requests in 2 s idle (poll_max 250ms: about 8 GETs of head)";
  EXPECT_GE(idle, 2u) << "an idle downlink still follows head";
}

TEST_F(BucketBridgeTest, StaleDecisionObjectIsIgnored) {
  Versions v = MakeVersions(1 << 19, 3, 4);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto first = PublishStep(v, 0);
  ASSERT_TRUE(first.ok() && first->committed);
  downlink_->Stop();
  downlink_.reset();
  objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
  auto stale = s3_->Get(layout.Decision(first->refit_id));
  ASSERT_TRUE(stale.ok()) << stale.status().ToString();
  auto publish = std::async(std::launch::async, [&] { return PublishStep(v, 1); });
  const uint64_t id = WaitForSealedRefit(first->refit_id);
  ASSERT_NE(id, 0u);
  ASSERT_TRUE(s3_->Put(layout.Decision(id), *stale).ok());
  ASSERT_NO_FATAL_FAILURE(StartDownlink());
  auto report = publish.get();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version));
  ExpectAllAt(v, 2);
  EXPECT_GE(downlink_->stats().stale_decisions, 1u);
}

// A signed cluster: the downlink sends BEGIN and the decision down only if the
// source signed them, so a decision object signed by anyone else (naming the right
// refit and version) is refused, and the refit commits on the source's.
TEST_F(BucketBridgeTest, SignedClusterRefusesAForgedDecisionObject) {
  signing_key_ = std::make_shared<const SigningKey>(*SigningKey::Generate());
  verify_key_ = std::make_shared<const VerifyKey>(signing_key_->Public());
  Versions v = MakeVersions(1 << 19, 2, 6);
  ASSERT_NO_FATAL_FAILURE(UseConfig());
  auto up = BucketUplink::Start(BridgeOptions(), transport::MakeInprocTransport(network_));
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  uplink_ = std::move(*up);
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto publish = std::async(std::launch::async, [&] { return PublishStep(v, 0); });
  const uint64_t id = WaitForSealedRefit(0);
  ASSERT_NE(id, 0u);
  objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
  auto begin = s3_->Get(layout.Begin(id));
  ASSERT_TRUE(begin.ok());
  auto b = ParseBegin(*begin);
  ASSERT_TRUE(b.ok());
  // An ABORT for this very refit, signed by another key.
  const SigningKey forger = *SigningKey::Generate();
  Decision forged{id, b->target_version};
  SignDecision(forger, MessageType::kAbort, forged);
  ASSERT_TRUE(s3_->Put(layout.Decision(id), EncodeDecision(MessageType::kAbort, forged)).ok());
  ASSERT_NO_FATAL_FAILURE(StartDownlink());
  auto report = publish.get();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], report->target_version));
  ExpectAllAt(v, 1);
  EXPECT_GE(downlink_->stats().bad_objects, 1u);
  EXPECT_EQ(agents_[1]->stats().refits_aborted, 0u);
}

// A region node that was down for a refit (policy available: it went on without
// it) is behind at the next one and catches up by the chain kept in the bucket.
TEST_F(BucketBridgeTest, NodeBehindCatchesUpFromTheBucketChain) {
  Versions v = MakeVersions(1 << 19, 4, 5);
  ASSERT_NO_FATAL_FAILURE(UseConfig("available"));
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto first = PublishStep(v, 0);
  ASSERT_TRUE(first.ok() && first->committed);
  ASSERT_TRUE(WaitForVersion(*agents_[2], first->target_version));
  agents_[2]->Stop();  // eu2 misses refit 2
  agents_[2].reset();
  auto second = PublishStep(v, 1);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(second->committed) << second->abort_reason;
  EXPECT_EQ(second->nodes.size(), 2u);
  // Back, at version 1, once refit 3 (from version 2) has begun: its parent replays
  // it that BEGIN, and it must first reach version 2, which only the bucket keeps.
  auto publish = std::async(std::launch::async, [&] { return PublishStep(v, 2); });
  const uint64_t third_id = WaitForSealedRefit(second->refit_id);
  ASSERT_NE(third_id, 0u);
  // eu1 has begun refit 3 once the region's PREPARED of it is in the bucket.
  objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
  for (int i = 0; i < 3000 && !s3_->Head(layout.Prepared(third_id)).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent(2, v, 1));
  auto third = publish.get();
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_TRUE(third->committed) << third->abort_reason;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], third->target_version));
  ExpectAllAt(v, 3);
  EXPECT_GE(agents_[2]->stats().deltas_caught_up, 1u);
}

// Policy `available`, a bridge with two children: one never comes, and the bridge
// leaves it out after the connect timeout as a node would (before, the region waited
// for it until the source's commit timeout). It joins later, behind, and catches up.
TEST_F(BucketBridgeTest, AwayChildIsExcusedUnderPolicyAvailable) {
  Versions v = MakeVersions(1 << 19, 3, 6);
  ASSERT_NO_FATAL_FAILURE(UseConfig("available", "bucket-eu"));
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));  // not eu2
  ASSERT_NO_FATAL_FAILURE(StartSource());
  const auto start = std::chrono::steady_clock::now();
  auto first = PublishStep(v, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->committed) << first->abort_reason;
  // Well inside the 60 s commit timeout: the 2 s connect timeout and the round trips.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  std::set<std::string> nodes;
  for (const auto& n : first->nodes) nodes.insert(n.node_id);
  EXPECT_EQ(nodes, (std::set<std::string>{"us1", "eu1"}));
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], first->target_version));
  ExpectAllAt(v, 1);

  ASSERT_NO_FATAL_FAILURE(StartAgent(2, v, 0));  // back, two versions behind the next target
  auto second = PublishStep(v, 1);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(second->committed) << second->abort_reason;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(WaitForVersion(*agents_[i], second->target_version));
  ExpectAllAt(v, 2);
}

// Policy `available`, every child of the bridge away: the downlink writes FAILED in
// the bridge's name, the source excuses the bridge, and the rest of the tree commits.
TEST_F(BucketBridgeTest, BridgeWithEveryChildAwayIsExcusedUnderPolicyAvailable) {
  Versions v = MakeVersions(1 << 18, 2, 9);
  ASSERT_NO_FATAL_FAILURE(UseConfig("available", "bucket-eu"));
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  ASSERT_NO_FATAL_FAILURE(StartAgent(0, v, 0));  // us1 only
  ASSERT_NO_FATAL_FAILURE(StartSource());
  auto report = PublishStep(v, 0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  ASSERT_EQ(report->nodes.size(), 1u);
  EXPECT_EQ(report->nodes[0].node_id, "us1");
  EXPECT_TRUE(WaitForVersion(*agents_[0], report->target_version));
  ExpectAllAt(v, 1);
  objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
  auto failed = s3_->Get(layout.Failed(report->refit_id));
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  auto parsed = ParseFailed(*failed);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->node_id, "bucket-eu");
  EXPECT_FALSE(s3_->Head(layout.Prepared(report->refit_id)).ok());
}

// Under policy `all` the same away child fails the refit once the connect timeout
// passed, as at a node, instead of leaving it to the source's commit timeout.
TEST_F(BucketBridgeTest, AwayChildFailsTheRefitUnderPolicyAll) {
  Versions v = MakeVersions(1 << 18, 2, 7);
  ASSERT_NO_FATAL_FAILURE(UseConfig("all", "bucket-eu"));
  ASSERT_NO_FATAL_FAILURE(StartBridge());
  for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, 0));
  ASSERT_NO_FATAL_FAILURE(StartSource());
  const auto start = std::chrono::steady_clock::now();
  auto report = PublishStep(v, 0);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed);
  EXPECT_NE(report->abort_reason.find("eu2"), std::string::npos) << report->abort_reason;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  ExpectAllAt(v, 0);
}

// The mixed config: `deltacast plan` shows which region takes the bucket, and a
// bridge that would serve another region's node is refused.
TEST(BucketPlan, PlanShowsTheBucketRegion) {
  auto config = topology::LoadClusterConfig(std::filesystem::path(DELTACAST_SOURCE_DIR) /
                                            "configs/bucket-region.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto plan = topology::PlanTree(*config);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::string text = topology::FormatPlanText(*plan, *config, 1 << 30);
  EXPECT_NE(text.find("eu-west: 4 nodes, WAN in 5 Gbit/s +40ms, gateway bucket-eu, through the "
                      "object store (bridge bucket-eu)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("<- trainer 3.274 Gbit/s WAN +40ms (manual) via bucket deltacast at"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("us-east: 3 nodes (source region), through"), std::string::npos) << text;
  EXPECT_TRUE(topology::CheckBridgePlan(*config, *plan).ok());
  const std::string json = topology::FormatPlanJson(*plan, *config, 1 << 30);
  EXPECT_NE(json.find("\"bucket_bridge\": true"), std::string::npos);

  // us-2 hung under the bridge: it is in another region.
  for (auto& n : config->nodes) {
    if (n.id == "us-2") n.parent = "bucket-eu";
  }
  auto bad = topology::PlanTree(*config);
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  Status s = topology::CheckBridgePlan(*config, *bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("us-2"), std::string::npos) << s.ToString();
}

TEST(BucketPlan, BadObjectStoreTablesAreRefused) {
  const std::string base = R"([cluster]
name = "c"
[[node]]
id = "src"
host = "127.0.0.1"
port = 7000
role = "source"
[[node]]
id = "b"
host = "127.0.0.1"
port = 7010
role = "receiver"
)";
  auto parse = [&](const std::string& objstore) {
    return topology::ParseClusterConfig(base + objstore, "t.toml").status();
  };
  EXPECT_TRUE(
      parse("[objstore]\nendpoint = \"http://h:1\"\nbucket = \"x\"\nbridges = [\"b\"]\n").ok());
  Status no_scheme = parse("[objstore]\nendpoint = \"h:1\"\nbucket = \"x\"\nbridges = [\"b\"]\n");
  EXPECT_NE(no_scheme.message().find("must start with http://"), std::string::npos)
      << no_scheme.ToString();
  Status unknown =
      parse("[objstore]\nendpoint = \"http://h:1\"\nbucket = \"x\"\nbridges = [\"zz\"]\n");
  EXPECT_NE(unknown.message().find("\"zz\", which is not a [[node]]"), std::string::npos)
      << unknown.ToString();
  Status source =
      parse("[objstore]\nendpoint = \"http://h:1\"\nbucket = \"x\"\nbridges = [\"src\"]\n");
  EXPECT_NE(source.message().find("the source"), std::string::npos) << source.ToString();
  Status typo = parse(
      "[objstore]\nendpoint = \"http://h:1\"\nbucket = \"x\"\nbridges = [\"b\"]\nbukket = 1\n");
  EXPECT_NE(typo.message().find("unknown key \"bukket\""), std::string::npos) << typo.ToString();
  Status missing = parse("[objstore]\nendpoint = \"http://h:1\"\nbridges = [\"b\"]\n");
  EXPECT_NE(missing.message().find("bucket"), std::string::npos) << missing.ToString();
  const std::string table =
      "[objstore]\nendpoint = \"http://h:1\"\nbucket = \"x\"\nbridges = [\"b\"]\n";
  Status below = parse(table + "poll = \"100ms\"\npoll_max = \"50ms\"\n");
  EXPECT_NE(below.message().find("poll_max must be at least poll"), std::string::npos)
      << below.ToString();
  auto slow = topology::ParseClusterConfig(base + table + "poll = \"1s\"\n", "t.toml");
  ASSERT_TRUE(slow.ok()) << slow.status().ToString();
  EXPECT_EQ(slow->objstore->poll_max, std::chrono::milliseconds(1000));  // poll alone: no backoff
  auto defaults = topology::ParseClusterConfig(base + table, "t.toml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->objstore->poll, std::chrono::milliseconds(20));
  EXPECT_EQ(defaults->objstore->poll_max, std::chrono::milliseconds(250));
  EXPECT_EQ(defaults->objstore->request_timeout, std::chrono::seconds(30));
  auto timeout =
      topology::ParseClusterConfig(base + table + "request_timeout = \"2s\"\n", "t.toml");
  ASSERT_TRUE(timeout.ok()) << timeout.status().ToString();
  EXPECT_EQ(timeout->objstore->request_timeout, std::chrono::seconds(2));
  Status zero = parse(table + "request_timeout = \"0s\"\n");
  EXPECT_NE(zero.message().find("request_timeout"), std::string::npos) << zero.ToString();
}

}  // namespace
}  // namespace deltacast::relay
