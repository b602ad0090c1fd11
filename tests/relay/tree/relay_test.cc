// The relay tree in one process over the inproc transport: a Publisher and seven
// NodeAgents whose stores are buffers this test owns, so every check is on bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "apply/host_store.h"
#include "codec/chunk.h"
#include "codec/manifest.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "relay/wire/protocol.h"
#include "tests/relay/intercept_transport.h"
#include "topology/cluster_config.h"
#include "topology/tree_plan.h"
#include "transport/factory.h"
#include "transport/fault_transport.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {
namespace {

constexpr char kToken[] = "relay-test-token";
// Small partitions, so a few MiB of tensors make hundreds of records and many chunks.
constexpr uint64_t kPartitionBytes = 8 << 10;

std::string ConfigToml(int receivers, int fanout, const std::string& chunk, int window,
                       const std::string& connect_timeout = "5s", const std::string& policy = "all",
                       const std::string& idle_timeout = "30s", const std::string& host = "mem",
                       int base_port = 1) {
  std::string toml =
      "[cluster]\nname = \"relay-test\"\n\n[tree]\nfanout = " + std::to_string(fanout) +
      "\nchunk_size = \"" + chunk + "\"\nwindow = " + std::to_string(window) +
      "\nconnect_timeout = \"" + connect_timeout + "\"\nidle_timeout = \"" + idle_timeout +
      "\"\ncommit_timeout = \"20s\"\ncommit_policy = \"" + policy +
      "\"\n\n"
      "[[node]]\nid = \"src\"\nhost = \"" +
      host + "\"\nport = " + std::to_string(base_port) + "\nregion = \"r\"\nrole = \"source\"\n";
  for (int i = 1; i <= receivers; ++i) {
    // Three ports apart: room for the ucx and ofi listeners of a node.
    toml += "\n[[node]]\nid = \"n" + std::to_string(i) + "\"\nhost = \"" + host +
            "\"\nport = " + std::to_string(base_port + 3 * i) +
            "\nregion = \"r\"\nrole = \"receiver\"\n";
  }
  return toml;
}

// A base version and a target in which ~3% of the BF16 elements changed.
struct Versions {
  std::vector<TensorSpec> tensors;
  std::vector<std::vector<std::byte>> base, target;
};

Versions MakeVersions(uint64_t elements_per_tensor, uint32_t seed) {
  Versions v;
  std::mt19937 rng(seed);
  for (int t = 0; t < 3; ++t) {
    v.tensors.push_back(
        {"layer" + std::to_string(t) + ".weight", DType::kBF16, {elements_per_tensor}});
    std::vector<std::byte> b(elements_per_tensor * 2);
    for (auto& x : b) x = std::byte(rng());
    auto n = b;
    for (uint64_t i = 0; i < elements_per_tensor; ++i) {
      if (rng() % 100 < 3) n[2 * i] ^= std::byte{1};
    }
    v.base.push_back(std::move(b));
    v.target.push_back(std::move(n));
  }
  v.tensors.push_back({"norm.weight", DType::kF32, {64}});  // unchanged
  v.base.emplace_back(256, std::byte{7});
  v.target.emplace_back(256, std::byte{7});
  return v;
}

std::unique_ptr<apply::WeightStore> Borrow(const std::vector<TensorSpec>& tensors,
                                           std::vector<std::vector<std::byte>>& buffers) {
  std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], MutableByteSpan(buffers[i]));
  return std::move(*apply::HostStore::Borrow(std::move(spans)));
}

codec::Manifest ManifestOf(const apply::WeightStore& store) {
  return codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); }, kPartitionBytes, 1);
}

// Polls `done` every 10 ms for up to 20 s.
bool WaitUntil(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Wraps a transport so that the `nth` data CHUNK it sends (over all its links) has
// one bit of its first record's target hash flipped and its checksums recomputed:
// well-formed, checksums intact, but wrong, as from a peer that lies or a bug.
class WrongRecordTransport : public test_util::InterceptTransport {
 public:
  WrongRecordTransport(std::unique_ptr<transport::Transport> inner, int nth)
      : WrongRecordTransport(std::move(inner), std::make_shared<State>(nth)) {}
  int tampered() const { return state_->tampered; }

 private:
  struct State {
    explicit State(int n) : nth(n) {}
    std::atomic<int> data_chunks{0};
    std::atomic<int> tampered{0};
    int nth = 0;
  };
  WrongRecordTransport(std::unique_ptr<transport::Transport> inner, std::shared_ptr<State> state)
      : InterceptTransport(std::move(inner), Hooks(state)), state_(std::move(state)) {}
  static test_util::InterceptHooks Hooks(std::shared_ptr<State> state) {
    test_util::InterceptHooks hooks;
    hooks.accepted_links = true;
    hooks.on_send = [state](test_util::InterceptedLink&, transport::Message& message,
                            transport::SendHandler&) {
      message = MaybeTamper(*state, std::move(message));
      return test_util::SendAction::kForward;
    };
    return hooks;
  }
  static transport::Message MaybeTamper(State& state, transport::Message message) {
    auto type = PeekType(*message);
    if (!type.ok() || *type != MessageType::kChunk) return message;
    const size_t c = kMessageHeaderBytes;  // the chunk inside the message
    if (message->size() < c + codec::kChunkHeaderBytes + 2 ||
        static_cast<uint8_t>((*message)[c + 6]) != 1) {  // not a data chunk
      return message;
    }
    if (++state.data_chunks != state.nth) return message;
    auto copy = std::make_shared<std::vector<std::byte>>(*message);
    std::byte* chunk = copy->data() + c;
    const size_t name = LoadLE<uint16_t>(chunk + codec::kChunkHeaderBytes);
    // name length, name, dtype/encoding/entropy/reserved, offset, count, changes,
    // base hash: then the target hash.
    chunk[codec::kChunkHeaderBytes + 2 + name + 4 + 3 * 8 + 16] ^= std::byte{1};
    const size_t size = copy->size() - c - kSignatureBytes;  // the chunk, not its signature
    StoreLE<uint64_t>(chunk + 64, Hash64(ByteSpan(chunk + codec::kChunkHeaderBytes,
                                                  size - codec::kChunkHeaderBytes)));
    StoreLE<uint64_t>(chunk + 72, Hash64(ByteSpan(chunk, 72)));
    ++state.tampered;
    return copy;
  }

  std::shared_ptr<State> state_;
};

class RelayTest : public ::testing::Test {
 protected:
  void UseConfig(const std::string& toml) {
    auto config = topology::ParseClusterConfig(toml, "relay-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    if (staged_) {
      for (auto& node : config_.nodes) node.apply_mode = topology::ApplyMode::kStaged;
    }
    network_ = std::make_shared<transport::InprocNetwork>();
  }

  // Starts receiver n<i+1> over stores_[i] (which the caller has filled).
  void StartAgent(int i, const Versions& v, const std::string& token = kToken,
                  std::unique_ptr<transport::Transport> transport = nullptr) {
    if (commits_.size() <= static_cast<size_t>(i)) commits_.resize(i + 1);
    auto replica = apply::Replica::ForStore(Borrow(v.tensors, stores_[i]), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok());
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n" + std::to_string(i + 1);
    options.token = token;
    options.apply_threads = 1;
    options.on_commit = [this, i](const CommitEvent& e) { commits_[i] = e; };
    if (!transport) transport = transport::MakeInprocTransport(network_);
    auto agent = NodeAgent::Start(std::move(options), std::move(*replica), std::move(transport));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agents_.push_back(std::move(*agent));
  }

  void StartCluster(
      const std::string& toml, const Versions& v, int receivers,
      const std::function<std::unique_ptr<transport::Transport>(int)>& transport_for = {}) {
    ASSERT_NO_FATAL_FAILURE(UseConfig(toml));
    stores_.assign(receivers, v.base);
    for (int i = 0; i < receivers; ++i) {
      ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, kToken, transport_for ? transport_for(i) : nullptr));
    }
  }

  Result<PublishReport> PublishVersions(
      Versions& v, std::unique_ptr<transport::Transport> transport = nullptr,
      std::function<void(const PublishProgress&)> on_progress = {}) {
    source_base_ = Borrow(v.tensors, v.base);
    source_target_ = Borrow(v.tensors, v.target);
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    options.on_progress = std::move(on_progress);
    options.decision_log = decision_log_;
    options.history_dir = history_dir_;
    options.keep_deltas = keep_deltas_;
    return Publish(options, *source_base_, ManifestOf(*source_base_), *source_target_,
                   ManifestOf(*source_target_),
                   transport ? std::move(transport) : transport::MakeInprocTransport(network_));
  }

  void TearDown() override {
    for (auto& a : agents_) a->Stop();
  }

  topology::ClusterConfig config_;
  std::shared_ptr<transport::InprocNetwork> network_;
  bool staged_ = false;  // every node of the config applies staged
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::optional<CommitEvent>> commits_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<apply::WeightStore> source_base_, source_target_;
  std::filesystem::path decision_log_;  // empty: none (the source knows only its base)
  std::filesystem::path history_dir_;   // empty: no deltas kept
  size_t keep_deltas_ = 0;
};

TEST_F(RelayTest, SevenNodesCommitBitExact) {
  Versions v = MakeVersions(1 << 20, 1);
  StartCluster(ConfigToml(7, 2, "16KiB", 2), v, 7);
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), 7u);
  EXPECT_EQ(report->nodes_decided, 7u);
  EXPECT_GT(report->delta.chunks, 5u);  // small chunks: the stream was pipelined
  for (int i = 0; i < 7; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "node n" << i + 1 << " tensor " << t;
    }
    ASSERT_TRUE(commits_[i].has_value()) << "node n" << i + 1 << " saw no commit callback";
    EXPECT_EQ(commits_[i]->version, report->target_version);
    // The unchanged norm is not reported as changed.
    EXPECT_EQ(commits_[i]->changed_tensors,
              (std::vector<std::string>{"layer0.weight", "layer1.weight", "layer2.weight"}));
    EXPECT_EQ(agents_[i]->stats().version, report->target_version);
  }
}

// A trainer that publishes a step back (A -> B, then B -> A, as a revert of a bad
// step does): the second refit's target is a version every node held before, and
// they must run it, not take its BEGIN for a replay of a refit they are past.
TEST_F(RelayTest, ARefitBackToTheVersionBeforeCommitsBitExact) {
  Versions v = MakeVersions(1 << 16, 9);
  StartCluster(ConfigToml(3, 2, "16KiB", 2), v, 3);
  auto forward = PublishVersions(v);
  ASSERT_TRUE(forward.ok()) << forward.status().ToString();
  ASSERT_TRUE(forward->committed) << forward->abort_reason;
  Versions back{v.tensors, v.target, v.base};
  auto report = PublishVersions(back);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->target_version, forward->base_version);
  for (int i = 0; i < 3; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.base[t])) << "node n" << i + 1 << " tensor " << t;
    }
    EXPECT_EQ(agents_[i]->stats().refits_committed, 2u);
    EXPECT_EQ(agents_[i]->stats().version, forward->base_version);
  }
}

TEST_F(RelayTest, OneNodeAtTheWrongBaseAbortsEverywhere) {
  Versions v = MakeVersions(1 << 16, 2);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ConfigToml(5, 2, "32KiB", 2)));
  // n3 holds something else: its replica cannot apply the delta.
  stores_.assign(5, v.base);
  stores_[2][0][10] ^= std::byte{0x40};
  for (int i = 0; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v));
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed);
  EXPECT_NE(report->abort_reason.find("n3"), std::string::npos) << report->abort_reason;
  // Every node is back at (or never left) its base bytes.
  for (int i = 0; i < 5; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      std::vector<std::byte> expected = v.base[t];
      if (i == 2 && t == 0) expected[10] ^= std::byte{0x40};
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(expected)) << "node n" << i + 1 << " tensor " << t;
    }
    EXPECT_EQ(agents_[i]->stats().refits_committed, 0u);
  }
}

TEST_F(RelayTest, UnderPolicyAvailableAFailingNodeIsLeftOutAndTheRestCommit) {
  // As above, but with commit policy available: n3 (a leaf under n1) reports that
  // it cannot reach the target, n1 goes on without it, the version commits on the
  // other four, and n3 keeps what it holds.
  Versions v = MakeVersions(1 << 16, 2);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ConfigToml(5, 2, "32KiB", 2, "5s", "available")));
  stores_.assign(5, v.base);
  stores_[2][0][10] ^= std::byte{0x40};
  for (int i = 0; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v));
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  std::set<std::string> prepared;
  for (const auto& n : report->nodes) prepared.insert(n.node_id);
  EXPECT_EQ(prepared, (std::set<std::string>{"n1", "n2", "n4", "n5"}));
  for (int i = 0; i < 5; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      std::vector<std::byte> expected = i == 2 ? v.base[t] : v.target[t];
      if (i == 2 && t == 0) expected[10] ^= std::byte{0x40};
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(expected)) << "node n" << i + 1 << " tensor " << t;
    }
  }
  EXPECT_EQ(agents_[2]->stats().refits_committed, 0u);
}

// Every node at a wrong base, under `available`: each is left out, so no receiver
// prepared. Committing that would move the source's version and no store: it aborts.
TEST_F(RelayTest, UnderPolicyAvailableWithEveryNodeLeftOutNothingCommits) {
  Versions v = MakeVersions(1 << 14, 5);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ConfigToml(3, 2, "32KiB", 2, "5s", "available")));
  stores_.assign(3, v.base);
  for (auto& store : stores_) store[0][10] ^= std::byte{0x40};
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v));
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed) << "committed with no receiver prepared";
  EXPECT_TRUE(report->nodes.empty());
  EXPECT_NE(report->abort_reason.find("no receiver PREPARED"), std::string::npos)
      << report->abort_reason;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(agents_[i]->stats().refits_committed, 0u) << "n" << i + 1;
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      std::vector<std::byte> expected = v.base[t];
      if (t == 0) expected[10] ^= std::byte{0x40};
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(expected)) << "n" << i + 1 << " tensor " << t;
    }
  }
}

TEST_F(RelayTest, WrongTokenIsRefusedAndPublishFailsClearly) {
  Versions v = MakeVersions(1 << 12, 3);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ConfigToml(1, 1, "64KiB", 2, "1s")));
  stores_.assign(1, v.base);
  ASSERT_NO_FATAL_FAILURE(StartAgent(0, v, "not-the-token"));
  auto report = PublishVersions(v);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("n1"), std::string::npos) << report.status().ToString();
  EXPECT_EQ(Hash64(stores_[0][0]), Hash64(v.base[0]));
}

TEST_F(RelayTest, ThrottledChildBoundsItsParentsMemory) {
  // A chain src -> n1 -> n2 where n2's link is capped: n1 must not buffer more than
  // its credit window, however far the source could run ahead.
  Versions v = MakeVersions(1 << 20, 4);
  const int window = 2;
  const std::string toml = ConfigToml(2, 1, "8KiB", window);
  StartCluster(toml, v, 2, [&](int i) {
    auto inner = transport::MakeInprocTransport(network_);
    if (i != 1) return inner;
    transport::FaultPlan plan;
    plan.bandwidth_bytes_per_second = 1e6;
    return transport::WrapWithFaults(std::move(inner), plan);
  });
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_GT(report->delta.chunks, 10u);
  // A CHUNK message is at most the chunk size plus one more record and headers.
  const uint64_t max_message = 8 * 1024 + kPartitionBytes + 4096;
  const uint64_t peak = agents_[0]->stats().peak_held_bytes;
  EXPECT_GT(peak, 0u);
  EXPECT_LE(peak, (window + 1) * max_message) << "relay held " << peak << " bytes";
  for (size_t t = 0; t < v.tensors.size(); ++t)
    EXPECT_EQ(Hash64(stores_[1][t]), Hash64(v.target[t]));
}

TEST_F(RelayTest, LeafAppliesEarlyChunksBeforeTheSourceFinishesStreaming) {
  Versions v = MakeVersions(1 << 20, 5);
  StartCluster(ConfigToml(7, 2, "8KiB", 2), v, 7);
  // The deepest leaf in the plan.
  auto plan = topology::PlanTree(config_);
  ASSERT_TRUE(plan.ok());
  int leaf = 0, depth = -1;
  for (const auto& n : plan->nodes) {
    if (n.children.empty() && n.depth > depth) {
      depth = n.depth;
      leaf = std::stoi(n.id.substr(1)) - 1;
    }
  }
  ASSERT_GE(depth, 2);
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> done{false};
  std::atomic<Clock::rep> leaf_first{0};
  std::thread watcher([&] {
    while (!done && leaf_first == 0) {
      if (agents_[leaf]->stats().chunks_received > 0)
        leaf_first = Clock::now().time_since_epoch().count();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  Clock::rep last_sent = 0;
  uint64_t chunks_sent = 0;
  // Cap the source's own link so streaming takes a measurable time.
  transport::FaultPlan caps;
  caps.bandwidth_bytes_per_second = 1e6;
  auto report =
      PublishVersions(v, transport::WrapWithFaults(transport::MakeInprocTransport(network_), caps),
                      [&](const PublishProgress& p) {
                        last_sent = Clock::now().time_since_epoch().count();
                        chunks_sent = p.chunks_sent;
                      });
  done = true;
  watcher.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  ASSERT_GT(chunks_sent, 10u);
  ASSERT_NE(leaf_first.load(), 0);
  // The leaf, depth >= 2, had applied a chunk before the source handed over its last.
  EXPECT_LT(leaf_first.load(), last_sent)
      << "leaf first applied " << (leaf_first - last_sent) / 1000
      << " us after the source's last chunk";
}

TEST_F(RelayTest, AvailablePolicyCommitsWithoutAnAwayRelayWhichCatchesUpLater) {
  // Chain src -> n1 -> n2 -> n3, and n2 is down: n1 stops waiting for it after
  // the connect timeout, the version commits on n1, and n2 and n3 catch up from
  // n1's spool when n2 comes back.
  Versions v = MakeVersions(1 << 16, 6);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ConfigToml(3, 1, "8KiB", 2, "1s", "available")));
  stores_.assign(3, v.base);
  ASSERT_NO_FATAL_FAILURE(StartAgent(0, v));
  ASSERT_NO_FATAL_FAILURE(StartAgent(2, v));
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  ASSERT_EQ(report->nodes.size(), 1u);
  EXPECT_EQ(report->nodes[0].node_id, "n1");
  for (size_t t = 0; t < v.tensors.size(); ++t) {
    EXPECT_EQ(Hash64(stores_[0][t]), Hash64(v.target[t]));
    EXPECT_EQ(Hash64(stores_[2][t]), Hash64(v.base[t]))
        << "n3 cannot have moved without its parent";
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent(1, v));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline &&
         (agents_[2]->stats().refits_committed == 0 || agents_[1]->stats().refits_committed == 0)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int i : {1, 2}) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t]))
          << "n" << i + 1 << " did not catch up, tensor " << t;
    }
  }
}

// The step after `v`: its target becomes the base, with ~3% more BF16 elements changed.
Versions NextStep(const Versions& v, uint32_t seed) {
  Versions next{v.tensors, v.target, v.target};
  std::mt19937 rng(seed);
  for (size_t t = 0; t + 1 < next.tensors.size(); ++t) {
    for (size_t i = 0; i < next.target[t].size(); i += 2) {
      if (rng() % 100 < 3) next.target[t][i] ^= std::byte{2};
    }
  }
  return next;
}

// Chain src -> n1 -> n2 -> n3 (policy available). n2 and n3 are down for two refits
// (v0 -> v1 -> v2). Then n2 returns at v0 and n3 at v1. n1 replays the last refit
// (v1 -> v2) from its spool: n2 cannot catch up yet (no source is publishing to
// vouch for v0), while n3 applies it but never hears it committed. In the refit
// v2 -> v3 both first reach v2, then apply the delta: n2 by the two deltas the
// source kept (keep_deltas >= 2) or else by fetching every partition that differs
// (the source vouching for v0 from its decision log); n3 finds it holds v2 already.
// Returns n2's stats.
class CatchUpTest : public RelayTest {
 protected:
  NodeAgentStats TwoVersionsBehind(size_t keep_deltas) {
    std::vector<Versions> steps = {MakeVersions(1 << 15, 9)};
    steps.push_back(NextStep(steps[0], 10));
    steps.push_back(NextStep(steps[1], 11));
    const std::string scratch = ::testing::TempDir() + "/relay-catch-up-" +
                                std::to_string(getpid()) + "-" + std::to_string(keep_deltas);
    std::filesystem::remove_all(scratch);
    std::filesystem::create_directories(scratch);
    decision_log_ = scratch + "/decisions.log";
    history_dir_ = scratch + "/history";
    keep_deltas_ = keep_deltas;
    EXPECT_NO_FATAL_FAILURE(UseConfig(ConfigToml(3, 1, "8KiB", 2, "1s", "available")));
    stores_ = {steps[0].base, steps[0].base, steps[0].target};  // n3 is one behind, n2 two
    EXPECT_NO_FATAL_FAILURE(StartAgent(0, steps[0]));
    for (int k = 0; k < 2; ++k) {
      auto report = PublishVersions(steps[k]);
      EXPECT_TRUE(report.ok() && report->committed);
    }
    EXPECT_NO_FATAL_FAILURE(StartAgent(1, steps[0]));
    EXPECT_NO_FATAL_FAILURE(StartAgent(2, steps[0]));
    auto report = PublishVersions(steps[2]);
    std::filesystem::remove_all(scratch);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    if (!report.ok()) return {};
    EXPECT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(report->nodes_decided, 3u);
    for (int i = 0; i < 3; ++i) {
      for (size_t t = 0; t < steps[2].tensors.size(); ++t) {
        EXPECT_EQ(Hash64(stores_[i][t]), Hash64(steps[2].target[t]))
            << "n" << i + 1 << " tensor " << t;
      }
      EXPECT_EQ(agents_[i]->stats().version, report->target_version);
    }
    EXPECT_EQ(agents_[0]->stats().partitions_caught_up, 0u);  // n1 never fell behind
    EXPECT_EQ(agents_[0]->stats().deltas_caught_up, 0u);
    return agents_[1]->stats();
  }
};

TEST_F(CatchUpTest, RelayTwoVersionsBehindCatchesUpByTheChainOfKeptDeltas) {
  const NodeAgentStats n2 = TwoVersionsBehind(/*keep_deltas=*/4);
  EXPECT_EQ(n2.deltas_caught_up, 2u);
  EXPECT_EQ(n2.partitions_caught_up, 0u);
  // Two deltas of ~3% changes: far less than the tensors.
  EXPECT_LT(n2.catch_up_bytes, 3 * (uint64_t{1} << 15) * 2 / 2);
}

TEST_F(CatchUpTest, WithoutKeptDeltasItFetchesThePartitionsThatDiffer) {
  const NodeAgentStats n2 = TwoVersionsBehind(/*keep_deltas=*/0);
  EXPECT_EQ(n2.deltas_caught_up, 0u);
  EXPECT_GT(n2.partitions_caught_up, 0u);
  EXPECT_LE(n2.catch_up_bytes, 3 * (uint64_t{1} << 15) * 2);
}

TEST_F(CatchUpTest, OneKeptDeltaIsNotAChainFromTwoVersionsBackSoPartitionsAreUsed) {
  const NodeAgentStats n2 = TwoVersionsBehind(/*keep_deltas=*/1);
  EXPECT_EQ(n2.deltas_caught_up, 0u);
  EXPECT_GT(n2.partitions_caught_up, 0u);
}

TEST_F(RelayTest, ChildOfADeadRelayFailsOverToItsGrandparent) {
  // Chain src -> n1 -> n2 -> n3 with n2 down: n3 attaches to n1 (its failover
  // parent in the plan), and the version reaches n3 through n1 while n2 is
  // excused (commit policy available).
  Versions v = MakeVersions(1 << 16, 7);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ConfigToml(3, 1, "8KiB", 2, "6s", "available")));
  stores_.assign(3, v.base);
  for (int i : {0, 2}) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v));
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  std::set<std::string> prepared;
  for (const auto& n : report->nodes) prepared.insert(n.node_id);
  EXPECT_EQ(prepared, (std::set<std::string>{"n1", "n3"})) << "n3 should have prepared through n1";
  for (size_t t = 0; t < v.tensors.size(); ++t) {
    EXPECT_EQ(Hash64(stores_[0][t]), Hash64(v.target[t]));
    EXPECT_EQ(Hash64(stores_[2][t]), Hash64(v.target[t]))
        << "n3 did not get the version through n1";
    EXPECT_EQ(Hash64(stores_[1][t]), Hash64(v.base[t]));
  }
}

TEST_F(RelayTest, ChildOfADeadFirstRelayFailsOverToTheSource) {
  // Chain src -> n1 -> n2 -> n3 with n1 down: n2 attaches to the source and the
  // version reaches n2 and n3 (commit policy available).
  Versions v = MakeVersions(1 << 16, 8);
  ASSERT_NO_FATAL_FAILURE(UseConfig(ConfigToml(3, 1, "8KiB", 2, "6s", "available")));
  stores_.assign(3, v.base);
  for (int i : {1, 2}) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v));
  auto report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  std::set<std::string> prepared;
  for (const auto& n : report->nodes) prepared.insert(n.node_id);
  EXPECT_EQ(prepared, (std::set<std::string>{"n2", "n3"}));
  for (size_t t = 0; t < v.tensors.size(); ++t) {
    EXPECT_EQ(Hash64(stores_[0][t]), Hash64(v.base[t]));
    EXPECT_EQ(Hash64(stores_[1][t]), Hash64(v.target[t]));
    EXPECT_EQ(Hash64(stores_[2][t]), Hash64(v.target[t]));
  }
}

// A chunk whose records are well-formed but wrong (checksums recomputed) is refused
// by the leaf's check before write like a damaged chunk: nothing of it is applied,
// the leaf reconnects, the source replays what it lacks, and the refit commits
// bit-exactly.
// A record whose checksums pass but which does not take its partition to the
// announced target is the delta's fault, not the link's (issue 24): fetching the
// same bytes again cannot help. The node writes nothing, says FAILED (bad delta)
// once, without reconnecting, and the refit fails at once with its reason.
TEST_F(RelayTest, WrongRecordsAreRefusedBeforeWritingAndFailTheRefitAsABadDelta) {
  Versions v = MakeVersions(1 << 18, 12);
  StartCluster(ConfigToml(1, 1, "8KiB", 2), v, 1);
  auto source = std::make_unique<WrongRecordTransport>(transport::MakeInprocTransport(network_), 3);
  WrongRecordTransport* wrong = source.get();
  auto report = PublishVersions(v, std::move(source));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(wrong->tampered(), 1);
  EXPECT_FALSE(report->committed) << "committed a delta whose record misses its target";
  EXPECT_NE(report->abort_reason.find("bad delta"), std::string::npos) << report->abort_reason;
  EXPECT_NE(report->abort_reason.find("node 'n1'"), std::string::npos) << report->abort_reason;
  // A node that said FAILED is not waited for: it rolls back on its own.
  ASSERT_TRUE(WaitUntil([&] {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      if (Hash64(stores_[0][t]) != Hash64(v.base[t])) return false;
    }
    return true;
  }));
  for (size_t t = 0; t < v.tensors.size(); ++t) {
    EXPECT_EQ(Hash64(stores_[0][t]), Hash64(v.base[t])) << "tensor " << t;
  }
  EXPECT_EQ(agents_[0]->stats().parent_joins, 1u) << "it reconnected to fetch the same bytes";
}

// Staged (docs/serving.md): the wrong record is found while the delta is checked,
// before anything would be written; the relay and the leaf say FAILED, and neither
// store was ever touched (so it is at the base at once, with nothing to roll back).
TEST_F(RelayTest, StagedNodesRefuseAWrongRecordWithTheirWeightsNeverTouched) {
  staged_ = true;
  Versions v = MakeVersions(1 << 18, 14);
  StartCluster(ConfigToml(2, 1, "8KiB", 2), v, 2);
  auto source = std::make_unique<WrongRecordTransport>(transport::MakeInprocTransport(network_), 3);
  auto report = PublishVersions(v, std::move(source));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed);
  EXPECT_NE(report->abort_reason.find("bad delta"), std::string::npos) << report->abort_reason;
  for (int i = 0; i < 2; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.base[t])) << "node " << i << " tensor " << t;
    }
  }
  // The next publish of the same step commits, staged, bit-exact.
  report = PublishVersions(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  for (int i = 0; i < 2; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "node " << i << " tensor " << t;
    }
  }
}

TEST_F(RelayTest, WrongRecordsThroughRelaysFailTheRefitAndEveryNodeStaysAtTheBase) {
  // Chain src -> n1 -> n2 -> n3: a relay forwards a chunk before it applies it, so
  // the wrong copy reaches the whole chain; the refit fails and every node is left
  // exactly at the base.
  Versions v = MakeVersions(1 << 18, 13);
  StartCluster(ConfigToml(3, 1, "8KiB", 2), v, 3);
  auto source = std::make_unique<WrongRecordTransport>(transport::MakeInprocTransport(network_), 3);
  WrongRecordTransport* wrong = source.get();
  auto report = PublishVersions(v, std::move(source));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(wrong->tampered(), 1);
  EXPECT_FALSE(report->committed);
  EXPECT_NE(report->abort_reason.find("bad delta"), std::string::npos) << report->abort_reason;
  for (int i = 0; i < 3; ++i) {
    // A node that said FAILED is not waited for: it rolls back on its own.
    EXPECT_TRUE(WaitUntil([&] {
      for (size_t t = 0; t < v.tensors.size(); ++t) {
        if (Hash64(stores_[i][t]) != Hash64(v.base[t])) return false;
      }
      return true;
    })) << "n"
        << i + 1 << " never came back to the base";
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.base[t])) << "n" << i + 1 << " tensor " << t;
    }
  }
}

TEST_F(RelayTest, LinksThatResetMidStreamResumeWithOnlyWhatIsMissing) {
  // Both ends stay up, but the links keep breaking: a relay's own link every few
  // messages it sends, and the source's links every few it sends. Each time the
  // child rejoins, says which chunks it has applied, and is sent only the rest.
  Versions v = MakeVersions(1 << 20, 9);
  StartCluster(ConfigToml(2, 1, "8KiB", 2), v, 2, [&](int i) {
    if (i != 0) return transport::MakeInprocTransport(network_);
    transport::FaultPlan resets;
    resets.reset_after_messages = 8;
    return transport::WrapWithFaults(transport::MakeInprocTransport(network_), resets);
  });
  transport::FaultPlan source_resets;
  source_resets.reset_after_messages = 10;
  auto report = PublishVersions(
      v, transport::WrapWithFaults(transport::MakeInprocTransport(network_), source_resets));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes_decided, 2u);
  EXPECT_GT(report->delta.chunks, 10u);
  for (int i = 0; i < 2; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
    }
  }
  // Re-sent: at most what was in flight at each break (the window), never the
  // whole delta again.
  EXPECT_LT(agents_[0]->stats().chunk_bytes_received, 2 * report->delta.delta_bytes);
}

TEST_F(RelayTest, StalledLinksAreDroppedAfterTheIdleTimeoutAndResumeWithWhatIsMissing) {
  // The source's first two links to n1 hang (open, silent) after 12 messages: no
  // chunk, no heartbeat. Each time n1 notices the silence after the idle timeout,
  // drops the link and rejoins, and is sent only what it lacks.
  Versions v = MakeVersions(1 << 20, 12);
  StartCluster(ConfigToml(2, 1, "8KiB", 2, "5s", "all", "1s"), v, 2);
  transport::FaultPlan stall;
  stall.stall_after_messages = 12;
  stall.stall_links = 2;
  auto report = PublishVersions(
      v, transport::WrapWithFaults(transport::MakeInprocTransport(network_), stall));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes_decided, 2u);
  EXPECT_GT(report->delta.chunks, 24u);  // more than two links' worth
  for (int i = 0; i < 2; ++i) {
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      EXPECT_EQ(Hash64(stores_[i][t]), Hash64(v.target[t])) << "n" << i + 1 << " tensor " << t;
    }
  }
  EXPECT_GE(agents_[0]->stats().parent_joins, 3u);  // it did stall, more than once
  EXPECT_EQ(agents_[1]->stats().parent_joins, 1u);  // n1 -> n2 never stalled
  EXPECT_LT(agents_[0]->stats().chunk_bytes_received, 2 * report->delta.delta_bytes);
}

// The relay engine over each real backend on loopback: a relay killed mid-transfer
// (its transport shut down, so its links break) is failed over as on TCP.
struct BackendCase {
  std::string backend;
  std::string provider;
};

void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.backend << ":" << c.provider; }

class BackendFailoverTest : public RelayTest, public ::testing::WithParamInterface<BackendCase> {
 protected:
  std::unique_ptr<transport::Transport> Make(double bytes_per_second = 0) {
    transport::TransportOptions options;
    options.provider = GetParam().provider;
    options.net_device = "lo";  // loopback only
    options.connect_timeout = std::chrono::milliseconds(2000);
    auto t = transport::MakeTransport(GetParam().backend, options);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok() || bytes_per_second == 0) return t.ok() ? std::move(*t) : nullptr;
    transport::FaultPlan slow;
    slow.bandwidth_bytes_per_second = bytes_per_second;
    return transport::WrapWithFaults(std::move(*t), slow);
  }
};

TEST_P(BackendFailoverTest, RelayKilledMidTransferIsFailedOverAndTheVersionCommits) {
  // Chain src -> n1 -> n2 -> n3, policy available; the source's link is paced so
  // that n2 can be stopped while chunks still flow. n3 then attaches to n1.
  Versions v = MakeVersions(1 << 19, 13);
  // A fresh port range per run (below the ephemeral range): an earlier backend's
  // closed sockets may still hold the last one.
  const int base = 20000 + static_cast<int>(std::random_device{}() % 2000) * 4;
  ASSERT_NO_FATAL_FAILURE(
      UseConfig(ConfigToml(3, 1, "16KiB", 2, "6s", "available", "30s", "127.0.0.1", base)));
  stores_.assign(3, v.base);
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(StartAgent(i, v, kToken, Make()));
  std::thread killer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline && agents_[2]->stats().chunks_received < 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    agents_[1]->Stop();
  });
  auto report = PublishVersions(v, Make(/*bytes_per_second=*/256 << 10));
  killer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  std::set<std::string> prepared;
  for (const auto& n : report->nodes) prepared.insert(n.node_id);
  EXPECT_EQ(prepared, (std::set<std::string>{"n1", "n3"}));
  for (size_t t = 0; t < v.tensors.size(); ++t) {
    EXPECT_EQ(Hash64(stores_[0][t]), Hash64(v.target[t])) << "n1 tensor " << t;
    EXPECT_EQ(Hash64(stores_[2][t]), Hash64(v.target[t])) << "n3 tensor " << t;
  }
  EXPECT_GE(agents_[2]->stats().parent_joins, 2u);  // n2, then n1
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendFailoverTest,
                         ::testing::Values(BackendCase{"tcp", ""}, BackendCase{"ucx", "tcp"},
                                           BackendCase{"ofi", "tcp;ofi_rxm"}),
                         [](const ::testing::TestParamInfo<BackendCase>& info) {
                           return info.param.backend;
                         });

}  // namespace
}  // namespace deltacast::relay
