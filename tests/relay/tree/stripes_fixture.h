// The fixture of the striped-tree tests (stripes_test.cc, stripes_fault_test.cc):
// a Source serving S stripe trees and seven NodeAgents over loopback tcp, along
// plans given by the test, every node's transport wrapped to count what it sends.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "apply/host_store.h"
#include "codec/chunk.h"
#include "codec/manifest.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
#include "relay/wire/protocol.h"
#include "tests/relay/intercept_transport.h"
#include "topology/cluster_config.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"
#include "transport/factory.h"
#include "transport/fault_transport.h"

namespace deltacast::relay::stripes_test {

constexpr char kToken[] = "stripes-test-token";
constexpr uint64_t kPartitionBytes = 8 << 10;
constexpr int kReceivers = 7;

inline std::string ConfigToml(int base_port, const std::string& policy = "all",
                              const std::string& connect_timeout = "5s") {
  std::string toml =
      "[cluster]\nname = \"stripes-test\"\n\n[tree]\nfanout = 2\nchunk_size = \"4KiB\"\n"
      "window = 4\nconnect_timeout = \"" +
      connect_timeout + "\"\ncommit_timeout = \"20s\"\ncommit_policy = \"" + policy +
      "\"\n\n[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port) +
      "\nregion = \"r\"\nrole = \"source\"\n";
  for (int i = 1; i <= kReceivers; ++i) {
    toml += "\n[[node]]\nid = \"n" + std::to_string(i) +
            "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port + i) +
            "\nregion = \"r\"\nrole = \"receiver\"\n";
  }
  return toml;
}

// One stripe's tree: the receivers in `order` filled breadth-first, `fanout` children
// each, below the source; failover parent the grandparent. Hop transports as the
// config's single tree has them (every hop is alike here).
inline topology::TreePlan TreeOf(const topology::TreePlan& base,
                                 const std::vector<std::string>& order, int fanout) {
  topology::TreePlan tree = base;
  tree.nodes.clear();
  topology::PlannedNode root = *base.Find(base.source);
  root.children.clear();
  tree.nodes.push_back(root);
  std::map<std::string, size_t> at;  // index in tree.nodes
  at[base.source] = 0;
  for (size_t pos = 0; pos < order.size(); ++pos) {
    topology::PlannedNode node = *base.Find(order[pos]);
    const std::string parent =
        pos < static_cast<size_t>(fanout) ? base.source : order[pos / fanout - 1];
    node.parent = parent;
    node.children.clear();
    const topology::PlannedNode& p = tree.nodes[at.at(parent)];
    node.failover_parent = p.parent;  // nullopt below the source
    node.failover_transports = node.transports;
    node.depth = p.depth + 1;
    tree.nodes[at.at(parent)].children.push_back(node.id);
    at[node.id] = tree.nodes.size();
    tree.nodes.push_back(node);
  }
  return tree;
}

// Whether `count` tcp ports from `first` can be bound on 127.0.0.1 now.
inline bool PortsFree(int first, int count) {
  for (int port = first; port < first + count; ++port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    if (!bound) return false;
  }
  return true;
}

inline std::vector<std::string> Receivers() {
  std::vector<std::string> ids;
  for (int i = 1; i <= kReceivers; ++i) ids.push_back("n" + std::to_string(i));
  return ids;
}

struct Versions {
  std::vector<TensorSpec> tensors;
  std::vector<std::vector<std::byte>> base, target;
};

// ~`percent` % of the BF16 elements of each tensor change.
inline Versions MakeVersions(uint64_t elements_per_tensor, uint32_t seed, int percent = 20) {
  Versions v;
  std::mt19937 rng(seed);
  for (int t = 0; t < 3; ++t) {
    v.tensors.push_back(
        {"layer" + std::to_string(t) + ".weight", DType::kBF16, {elements_per_tensor}});
    std::vector<std::byte> b(elements_per_tensor * 2);
    for (auto& x : b) x = std::byte(rng());
    auto n = b;
    for (uint64_t i = 0; i < elements_per_tensor; ++i) {
      if (rng() % 100 < static_cast<uint32_t>(percent)) n[2 * i] ^= std::byte{1};
    }
    v.base.push_back(std::move(b));
    v.target.push_back(std::move(n));
  }
  return v;
}

inline std::unique_ptr<apply::WeightStore> Borrow(const std::vector<TensorSpec>& tensors,
                                                  std::vector<std::vector<std::byte>>& buffers) {
  std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], MutableByteSpan(buffers[i]));
  return std::move(*apply::HostStore::Borrow(std::move(spans)));
}

inline codec::Manifest ManifestOf(const apply::WeightStore& store) {
  return codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); }, kPartitionBytes, 1);
}

// What one node's transport sent: CHUNK messages by sequence (data chunks only)
// and their bytes, and END messages.
struct Sent {
  std::mutex mu;
  std::map<uint32_t, int> data_chunks;  // sequence -> times sent
  uint64_t data_bytes = 0;
  int ends = 0;
};

// Wraps a transport to count the CHUNK messages it sends, on every link.
class CountingTransport : public test_util::InterceptTransport {
 public:
  CountingTransport(std::unique_ptr<transport::Transport> inner, std::shared_ptr<Sent> sent)
      : InterceptTransport(std::move(inner), Hooks(std::move(sent))) {}

 private:
  static test_util::InterceptHooks Hooks(std::shared_ptr<Sent> sent) {
    test_util::InterceptHooks hooks;
    hooks.accepted_links = true;
    hooks.on_send = [sent](test_util::InterceptedLink&, transport::Message& message,
                           transport::SendHandler&) {
      Count(*sent, *message);
      return test_util::SendAction::kForward;
    };
    return hooks;
  }
  static void Count(Sent& sent, const std::vector<std::byte>& message) {
    auto type = PeekType(message);
    if (!type.ok() || *type != MessageType::kChunk) return;
    auto header = codec::PeekChunkHeader(ChunkOf(message));
    if (!header.ok()) return;
    std::lock_guard lock(sent.mu);
    if (header->kind == codec::ChunkKind::kEnd) {
      ++sent.ends;
      return;
    }
    ++sent.data_chunks[header->sequence];
    sent.data_bytes += message.size();
  }
};

class StripesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A fresh port range per run, below the ephemeral range (32768 up), whose
    // ports are free now: other tests on the machine take ports there too.
    for (int tries = 0; tries < 100; ++tries) {
      base_port_ = 20000 + static_cast<int>(std::random_device{}() % 1200) * 10;
      if (PortsFree(base_port_, kReceivers + 1)) break;
    }
    auto config = topology::ParseClusterConfig(ConfigToml(base_port_, policy_, connect_timeout_),
                                               "stripes-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    auto tree = topology::PlanTree(config_);
    ASSERT_TRUE(tree.ok()) << tree.status().ToString();
    base_tree_ = *tree;
  }

  // `orders[s]`: the receivers of stripe s's tree, breadth-first.
  void UsePlan(const std::vector<std::vector<std::string>>& orders) {
    plan_ = topology::StripedPlan{};
    plan_.source = "src";
    for (size_t s = 0; s < orders.size(); ++s) {
      topology::StripeTree stripe;
      stripe.index = static_cast<int>(s);
      stripe.root = "src";
      stripe.tree = TreeOf(base_tree_, orders[s], 2);
      plan_.stripes.push_back(std::move(stripe));
    }
  }
  // S stripes, stripe s's order the receivers rotated by 3s: with fanout 2 the first
  // three of each order are its interior nodes, so for S = 2 no node is interior twice.
  void UseRotatedPlan(int stripes) {
    std::vector<std::vector<std::string>> orders;
    for (int s = 0; s < stripes; ++s) {
      std::vector<std::string> order = Receivers();
      std::rotate(order.begin(), order.begin() + (3 * s) % kReceivers, order.end());
      orders.push_back(order);
    }
    UsePlan(orders);
  }

  std::unique_ptr<transport::Transport> Tcp(std::shared_ptr<Sent> sent) {
    transport::TransportOptions options;
    options.connect_timeout = std::chrono::milliseconds(2000);
    auto t = transport::MakeTransport("tcp", options);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::make_unique<CountingTransport>(std::move(*t), std::move(sent));
  }

  // Starts receiver n<i+1> over stores_[i].
  void StartAgent(int i, const Versions& v) {
    auto replica = apply::Replica::ForStore(Borrow(v.tensors, stores_[i]), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok());
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n" + std::to_string(i + 1);
    options.token = kToken;
    options.apply_threads = 1;
    if (auto hooks = engine_hooks_.find(i); hooks != engine_hooks_.end())
      options.engine_hooks = hooks->second;
    sent_[i] = std::make_shared<Sent>();
    auto transport = Tcp(sent_[i]);
    if (wrap_) transport = wrap_(i, std::move(transport));
    auto agent =
        NodeAgent::Start(std::move(options), std::move(*replica), std::move(transport), plan_);
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agents_[i] = std::move(*agent);
  }

  // Starts every receiver but those in `later`.
  void StartAgents(const Versions& v, const std::set<int>& later = {}) {
    if (stores_.empty()) stores_.assign(kReceivers, v.base);
    agents_.resize(kReceivers);
    sent_.resize(kReceivers);
    for (int i = 0; i < kReceivers; ++i) {
      if (later.contains(i)) continue;
      ASSERT_NO_FATAL_FAILURE(StartAgent(i, v));
    }
  }

  Result<PublishReport> Publish(Versions& v) {
    auto base = Borrow(v.tensors, v.base);
    auto target = Borrow(v.tensors, v.target);
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    // The decision log and kept deltas outlive each Source: a later one vouches for
    // the versions an earlier one committed (catch-up).
    options.decision_log = decision_log_;
    options.history_dir = history_dir_;
    options.keep_deltas = keep_deltas_;
    source_sent_ = std::make_shared<Sent>();
    auto transport = Tcp(source_sent_);
    if (source_bytes_per_second_ > 0) {
      transport::FaultPlan slow;
      slow.bandwidth_bytes_per_second = source_bytes_per_second_;
      transport = transport::WrapWithFaults(std::move(transport), slow);
    }
    auto source = Source::Start(options, std::move(transport), plan_);
    if (!source.ok()) return source.status();
    auto report = (*source)->Publish(*base, ManifestOf(*base), *target, ManifestOf(*target));
    (*source)->Stop();
    return report;
  }

  void TearDown() override {
    for (auto& a : agents_) {
      if (a) a->Stop();
    }
  }

  std::string policy_ = "all";
  std::string connect_timeout_ = "5s";
  // Wraps receiver i's transport (fault tests), if set.
  std::function<std::unique_ptr<transport::Transport>(int, std::unique_ptr<transport::Transport>)>
      wrap_;
  double source_bytes_per_second_ = 0;  // 0: the source's links are uncapped
  std::filesystem::path decision_log_;  // empty: none (the source knows only its base)
  std::filesystem::path history_dir_;   // empty: no deltas kept
  size_t keep_deltas_ = 0;
  // Receiver i's engine hooks, if any (a pause that fails: a node that cannot take part).
  std::map<int, EngineHooks> engine_hooks_;
  int base_port_ = 0;
  topology::ClusterConfig config_;
  topology::TreePlan base_tree_;
  topology::StripedPlan plan_;
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::vector<std::shared_ptr<Sent>> sent_;  // per receiver
  std::shared_ptr<Sent> source_sent_;
};

}  // namespace deltacast::relay::stripes_test
