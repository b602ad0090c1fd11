// The RootTest fixture: a synthetic training job's ranks, each a Producer over its
// own shard files, a Root, and a relay tree of NodeAgents over the inproc transport
// (tests/relay/producers/root_test.cc, root_trust_test.cc).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <thread>

#include "agent/fp8_twin.h"
#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "relay/producers/producer.h"
#include "relay/producers/producer_hub.h"
#include "relay/producers/root.h"
#include "relay/producers/shard_input.h"
#include "relay/tree/node_agent.h"
#include "relay/wire/signing.h"
#include "tests/temp_dir.h"
#include "tests/transport/test_util.h"
#include "topology/cluster_config.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {

namespace fs = std::filesystem;

inline constexpr char kToken[] = "root-test-token";
inline constexpr uint64_t kPartitionBytes = 64 << 10;

inline std::string ConfigToml(int receivers) {
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
    auto config = topology::ParseClusterConfig(
        config_toml_.empty() ? ConfigToml(receivers) : config_toml_, "root-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    network_ = std::make_shared<transport::InprocNetwork>();
    auto step0 = Expected(0);
    stores_.resize(receivers);
    for (int i = 0; i < receivers; ++i) {
      for (size_t t = 0; t < step0->tensors().size(); ++t) {
        const ByteSpan b = step0->TensorData(t);
        stores_[i].emplace_back(b.begin(), b.end());
      }
      std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
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
                                    TreeTransport("n" + std::to_string(i + 1)));
      ASSERT_TRUE(agent.ok()) << agent.status().ToString();
      agents_.push_back(std::move(*agent));
    }
    RootOptions options;
    options.publish.config = config_;
    options.publish.token = kToken;
    options.publish.signing_key = signing_key;
    options.publish.decision_log = dir_.path() / "decisions.log";
    options.producer_address = producer_address_;
    options.producers = ranks_.size();
    options.partition_bytes = kPartitionBytes;
    options.join_timeout = join_timeout_;
    options.produce_timeout = std::chrono::seconds(20);
    auto root =
        Root::Start(std::move(options), TreeTransport("trainer"), ProducerLinkTransport("trainer"));
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
    if (auto it = serving_.find(r); it != serving_.end()) o.serving = it->second;
    o.refit_timeout = std::chrono::seconds(20);
    o.tls = topology::ProducerLinksUseTls(config_);
    auto p = Producer::Connect(std::move(o), ProducerLinkTransport(agent::RankFileStem(r)));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // Every producer serves step `from` -> from + 1 on its own thread; returns the
  // root's answer and each producer's.
  // A producer's outcome: its Serve status and, when OK, whether the refit committed.
  struct Served {
    Status status;
    bool committed = false;
    bool fp8_base_kept = false;
  };
  // `inputs` replaces a rank's share (a trainer's mistake), `base` is the root's
  // known base manifest.
  Result<RootReport> Refit(int from, std::vector<Served>* producer_results = nullptr,
                           const std::map<size_t, ShareInput>& inputs = {},
                           const codec::Manifest* base = nullptr) {
    std::vector<std::thread> threads;
    std::vector<Served> results(producers_.size());
    for (size_t r = 0; r < producers_.size(); ++r) {
      threads.emplace_back([this, r, from, &results, &inputs] {
        auto it = inputs.find(r);
        auto served =
            producers_[r]->Serve(it != inputs.end() ? it->second : ranks_[r]->Input(from));
        results[r] = {served.ok() ? Status::Ok() : served.status(),
                      served.ok() && served->committed, served.ok() && served->fp8_stats.base_kept};
      });
    }
    auto report = root_->Publish(base);
    for (auto& t : threads) t.join();
    if (producer_results) *producer_results = results;
    return report;
  }

  // The transports of node `id`'s tree links and of the producer links of `id`
  // (a producer's, or the root's: "trainer"): inproc here; over tcp and TLS in
  // tests/relay/producers/producer_tls_test.cc.
  virtual std::unique_ptr<transport::Transport> TreeTransport(const std::string& /*id*/) {
    return transport::MakeInprocTransport(network_);
  }
  virtual std::unique_ptr<transport::Transport> ProducerLinkTransport(const std::string& /*id*/) {
    return transport::MakeInprocTransport(network_);
  }

  std::unique_ptr<apply::CheckpointDirStore> Canonical(int step) {
    auto s = apply::CheckpointDirStore::Open(dir_.path() / ("step" + std::to_string(step)),
                                             apply::CheckpointDirStore::Access::kReadOnly);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }

  // What receivers hold at `step`: the canonical checkpoint, or its FP8 twin when
  // the job serves FP8 (twins_).
  std::unique_ptr<apply::WeightStore> Expected(int step) {
    auto canonical = Canonical(step);
    if (!twins_) return canonical;
    auto plan = agent::PlanFp8Twin(*twins_, canonical->tensors());
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    auto twin = agent::QuantizeStore(*canonical, *plan, 1);
    EXPECT_TRUE(twin.ok()) << twin.status().ToString();
    return std::move(*twin);
  }

  // Every receiver holds exactly the canonical checkpoint of `step` (its twin).
  void ExpectReceiversAt(int step) {
    auto want = Expected(step);
    for (size_t i = 0; i < stores_.size(); ++i) {
      for (size_t t = 0; t < want->tensors().size(); ++t) {
        const ByteSpan w = want->TensorData(t);
        ASSERT_TRUE(std::equal(w.begin(), w.end(), stores_[i][t].begin(), stores_[i][t].end()))
            << "receiver n" << i + 1 << " tensor " << want->tensors()[t].name << " is not step "
            << step;
      }
    }
  }

  std::map<size_t, quant::ServingDescription> serving_;  // ranks that quantize to FP8
  std::optional<quant::ServingDescription> twins_;       // receivers hold FP8 twins

  void TearDown() override {
    producers_.clear();
    if (root_) root_->Stop();
    for (auto& a : agents_) a->Stop();
  }

  std::string config_toml_;                       // empty: ConfigToml(receivers)
  std::string producer_address_ = "producers:1";  // the root's producer listener
  std::chrono::milliseconds join_timeout_{10'000};
  test_util::TempDir dir_{"root_test"};
  std::vector<std::unique_ptr<RankFiles>> ranks_;
  topology::ClusterConfig config_;
  std::shared_ptr<transport::InprocNetwork> network_;
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<Root> root_;
  std::vector<std::unique_ptr<Producer>> producers_;
};

}  // namespace deltacast::relay
