// The fixture of the object-store tests that run a whole cluster: a source, a tree
// node in the source's region, and a region whose gateway takes the delta through an
// S3 bucket (s3rver on loopback) by a bucket bridge. The relay links run over the
// inproc transport; the bucket is real.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <random>
#include <set>
#include <thread>

#include "apply/host_store.h"
#include "codec/manifest.h"
#include "objstore/bucket_layout.h"
#include "relay/bucket/bucket_bridge.h"
#include "relay/bucket/internal/poll_backoff.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "relay/tree/source.h"
#include "relay/wire/protocol.h"
#include "relay/wire/signing.h"
#include "tests/objstore/s3rver.h"
#include "tests/relay/bucket/bucket_versions.h"
#include "tests/temp_dir.h"
#include "topology/cluster_config.h"
#include "topology/plan_format.h"
#include "topology/tree_plan.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay::bucket_test {

inline constexpr char kToken[] = "bucket-test-token";
inline constexpr uint64_t kPartitionBytes = 8 << 10;
inline constexpr char kBucket[] = "deltacast";

// `eu2_parent`: "eu1" (the bridge serves one gateway) or "bucket-eu" (two children).
// `stripes` > 0: [tree] stripes (docs/protocol.md, "Stripes").
inline std::string ConfigToml(const std::string& endpoint, const std::string& policy,
                              const std::string& eu2_parent = "eu1", int stripes = 0) {
  return R"([cluster]
name = "bucket-test"

[tree]
)" + (stripes > 0 ? "stripes = " + std::to_string(stripes) + "\n" : std::string()) +
         R"(fanout = 2
chunk_size = "16KiB"
window = 4
connect_timeout = "2s"
commit_timeout = "60s"
commit_policy = ")" +
         policy + R"("

[security]
tls = "none"

[[region]]
name = "eu"
wan_bandwidth = "1Gbit"
wan_latency = "20ms"

[[node]]
id = "src"
host = "mem"
port = 1
region = "us"
role = "source"

[[node]]
id = "us1"
host = "mem"
port = 4
region = "us"
role = "receiver"
parent = "src"

[[node]]
id = "bucket-eu"
host = "mem"
port = 7
region = "eu"
role = "receiver"
parent = "src"

[[node]]
id = "eu1"
host = "mem"
port = 10
region = "eu"
role = "receiver"
parent = "bucket-eu"

[[node]]
id = "eu2"
host = "mem"
port = 13
region = "eu"
role = "receiver"
parent = ")" +
         eu2_parent + R"("

[objstore]
endpoint = ")" +
         endpoint +
         R"("
bucket = "deltacast"
bridges = ["bucket-eu"]
poll = "10ms"
)";
}

// The S3 options of the bucket on `server` (s3rver's fixed keys).
inline objstore::S3Options S3OptionsOf(const test_util::S3rver& server) {
  return {.endpoint = server.endpoint(),
          .bucket = kBucket,
          .access_key = "S3RVER",
          .secret_key = "S3RVER"};
}

// The options of bridge node `node_id` under `config`, with its [objstore] prefix
// and polling.
inline BucketBridgeOptions BridgeOptionsOf(const topology::ClusterConfig& config,
                                           const std::string& node_id, const std::string& token,
                                           objstore::S3Options s3) {
  BucketBridgeOptions o;
  o.config = config;
  o.node_id = node_id;
  o.token = token;
  o.s3 = std::move(s3);
  o.prefix = config.objstore->prefix;
  o.poll = config.objstore->poll;
  o.poll_max = config.objstore->poll_max;
  return o;
}

inline codec::Manifest ManifestOf(const apply::WeightStore& store) {
  return codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); }, kPartitionBytes, 1);
}

class BucketBridgeTest : public ::testing::Test {
 protected:
  static constexpr const char* kNodes[] = {"us1", "eu1", "eu2"};

  void SetUp() override {
    if (!test_util::S3rver::Available()) GTEST_SKIP() << test_util::S3rver::kSkipMessage;
    ASSERT_TRUE(server_.Start()) << "s3rver did not start";
    auto c = objstore::S3Client::Create(S3());
    ASSERT_TRUE(c.ok());
    s3_ = std::move(*c);
    Status created = s3_->CreateBucket();
    ASSERT_TRUE(created.ok()) << created.ToString();
    network_ = std::make_shared<transport::InprocNetwork>();
  }
  void TearDown() override {
    if (restarter_.joinable()) restarter_.join();
    source_.reset();
    for (auto& a : agents_) {
      if (a) a->Stop();
    }
    if (uplink_) uplink_->Stop();
    if (downlink_) downlink_->Stop();
  }

  // Waits until the bucket's head names a refit other than `not_id` whose chunks are
  // all written (sealed); returns its id (0 on timeout).
  uint64_t WaitForSealedRefit(uint64_t not_id) {
    objstore::BucketLayout layout(config_.objstore->prefix, "bucket-eu");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto head = s3_->Get(layout.Head());
      if (head.ok()) {
        auto id = objstore::ParseHead(AsChars(*head));
        if (id.ok() && *id != not_id && s3_->Head(layout.Sealed(*id)).ok()) return *id;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return 0;
  }

  objstore::S3Options S3() const { return S3OptionsOf(server_); }

  void UseConfig(const std::string& policy = "all", const std::string& eu2_parent = "eu1",
                 int stripes = 0) {
    auto config = topology::ParseClusterConfig(
        ConfigToml(server_.endpoint(), policy, eu2_parent, stripes), "test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
  }

  BucketBridgeOptions BridgeOptions() const {
    BucketBridgeOptions o = BridgeOptionsOf(config_, "bucket-eu", kToken, S3());
    o.keep_refits = keep_refits_;
    o.request_timeout = request_timeout_;
    o.verify_key = verify_key_;
    return o;
  }

  void StartBridge() {
    auto transport = transport::MakeInprocTransport(network_);
    if (wrap_uplink_) transport = wrap_uplink_(std::move(transport));
    auto up = BucketUplink::Start(BridgeOptions(), std::move(transport));
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    uplink_ = std::move(*up);
    StartDownlink();
  }
  void StartDownlink() {
    auto down = BucketDownlink::Start(BridgeOptions(), transport::MakeInprocTransport(network_));
    ASSERT_TRUE(down.ok()) << down.status().ToString();
    downlink_ = std::move(*down);
  }

  // Node kNodes[i] over stores_[i], holding version `k`.
  void StartAgent(int i, const Versions& v, int k) {
    if (agents_.size() < 3) agents_.resize(3);
    if (stores_.size() < 3) stores_.resize(3);
    stores_[i] = v.v[k];
    auto replica = apply::Replica::ForStore(Borrow(v.tensors, stores_[i]), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok());
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = kNodes[i];
    options.token = kToken;
    options.apply_threads = 1;
    options.spool_dir = dir_.path() / ("spool-" + std::string(kNodes[i]));
    options.verify_key = verify_key_;
    auto transport = transport::MakeInprocTransport(network_);
    if (wrap_) transport = wrap_(i, std::move(transport));
    auto agent = NodeAgent::Start(std::move(options), std::move(*replica), std::move(transport));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agents_[i] = std::move(*agent);
  }

  void StartSource() {
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    options.decision_log = dir_.path() / "decisions";
    options.history_dir = dir_.path() / "history";
    options.keep_deltas = 4;
    options.signing_key = signing_key_;
    auto source = Source::Start(std::move(options), transport::MakeInprocTransport(network_));
    ASSERT_TRUE(source.ok()) << source.status().ToString();
    source_ = std::move(*source);
  }

  Result<PublishReport> PublishStep(Versions& v, int k) {
    auto base = Borrow(v.tensors, v.v[k]);
    auto target = Borrow(v.tensors, v.v[k + 1]);
    return source_->Publish(*base, ManifestOf(*base), *target, ManifestOf(*target));
  }

  // Every running node holds version k, byte for byte.
  void ExpectAllAt(const Versions& v, int k) {
    for (int i = 0; i < 3; ++i) {
      if (!agents_[i]) continue;
      for (size_t t = 0; t < v.tensors.size(); ++t) {
        EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.v[k][t]))
            << kNodes[i] << " tensor " << t << " is not at version " << k;
      }
    }
  }

  // The agent's version settles on `version` (commits are reported asynchronously).
  static bool WaitForVersion(const NodeAgent& agent, const Digest128& version) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (agent.stats().version == version) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  test_util::TempDir dir_{"bucket-bridge"};
  test_util::S3rver server_{dir_.path() / "s3"};
  std::unique_ptr<objstore::S3Client> s3_;
  topology::ClusterConfig config_;
  std::shared_ptr<transport::InprocNetwork> network_;
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<BucketUplink> uplink_;
  std::unique_ptr<BucketDownlink> downlink_;
  std::unique_ptr<Source> source_;
  std::thread restarter_;
  // A signed cluster: set both before starting anything.
  std::shared_ptr<const SigningKey> signing_key_;
  std::shared_ptr<const VerifyKey> verify_key_;
  // Wraps node kNodes[i]'s transport (a spy, a fault); set before StartAgent.
  std::function<std::unique_ptr<transport::Transport>(int, std::unique_ptr<transport::Transport>)>
      wrap_;
  // Wraps the uplink's transport; set before StartBridge.
  std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>)>
      wrap_uplink_;
  // The bridge's: set before StartBridge.
  size_t keep_refits_ = 4;
  std::chrono::milliseconds request_timeout_{30000};
};

}  // namespace deltacast::relay::bucket_test
