#include "bench/fanout_cluster.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "apply/host_store.h"
#include "apply/replica.h"
#include "bench/bench_util.h"
#include "codec/chunk.h"
#include "common/hash.h"
#include "common/parallel.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "relay/tree/source.h"
#include "relay/wire/protocol.h"
#include "topology/cluster_config.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"
#include "transport/factory.h"
#include "transport/fault_transport.h"

namespace dc = deltacast;

namespace deltacast::bench::fanout {
namespace {

constexpr char kToken[] = "fanout-bench-token";
// Elements per weight tensor of the synthetic model (8 MiB of BF16), and of the
// norm-like tensor that follows each.
constexpr uint64_t kTensorElements = uint64_t{4} << 20;
constexpr uint64_t kNormElements = 4096;

}  // namespace

void Die(const std::string& what) {
  fmt::print(stderr, "fanout bench: {}\n", what);
  std::exit(1);
}

SyntheticModel DrawModel(uint64_t params, uint64_t seed) {
  SyntheticModel model;
  for (uint64_t left = params, block = 0; left > 0; ++block) {
    const uint64_t n = std::min(left, kTensorElements);
    model.tensors.push_back(
        {fmt::format("model.layers.{:04}.weight", block), dc::DType::kBF16, {n}});
    model.tensors.push_back({fmt::format("model.layers.{:04}.x_norm.weight", block),
                             dc::DType::kBF16,
                             {kNormElements}});
    left -= n;
  }
  model.elements.resize(model.tensors.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (size_t w = 0; w < dc::DefaultThreadCount(); ++w) {
    workers.emplace_back([&] {
      for (size_t t; (t = next++) < model.tensors.size();) {
        const bool norm = t % 2 == 1;
        model.elements[t] =
            dc::bench::DrawElements(seed * 1'000'003 + t, model.tensors[t].ElementCount(), norm);
      }
    });
  }
  for (auto& w : workers) w.join();
  return model;
}

std::map<std::string, uint64_t> TensorHashes(const dc::apply::WeightStore& store) {
  std::map<std::string, uint64_t> hashes;
  for (size_t i = 0; i < store.tensors().size(); ++i)
    hashes[store.tensors()[i].name] = dc::Hash64(store.TensorData(i));
  return hashes;
}

namespace {

void Finalize(Checkpoint& c, uint64_t partition_bytes) {
  const auto& store = *c.store;
  c.manifest = dc::codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); }, partition_bytes,
      dc::DefaultThreadCount());
  c.tensor_hashes = TensorHashes(store);
}

Checkpoint Borrowing(const std::vector<dc::TensorSpec>& tensors,
                     std::vector<std::vector<std::byte>> buffers, uint64_t partition_bytes) {
  Checkpoint c;
  c.buffers = std::move(buffers);
  std::vector<std::pair<dc::TensorSpec, dc::MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], dc::MutableByteSpan(c.buffers[i]));
  c.store = Check(dc::apply::HostStore::Borrow(std::move(spans)), "borrow checkpoint");
  Finalize(c, partition_bytes);
  return c;
}

}  // namespace

// The model's BF16 image after one step of learning rate `lr` (0: the base).
Checkpoint StepCheckpoint(const SyntheticModel& model, double lr, uint64_t partition_bytes) {
  std::vector<std::vector<std::byte>> buffers(model.tensors.size());
  std::vector<uint16_t> base, target;
  for (size_t t = 0; t < model.tensors.size(); ++t) {
    dc::bench::StepBf16(model.elements[t], lr, base, target);
    buffers[t].resize(target.size() * 2);
    std::memcpy(buffers[t].data(), target.data(), buffers[t].size());  // little-endian BF16
  }
  return Borrowing(model.tensors, std::move(buffers), partition_bytes);
}

// All-zero tensors: the base of a "full" transfer, where every partition changes.
Checkpoint ZeroCheckpoint(const std::vector<dc::TensorSpec>& tensors, uint64_t partition_bytes) {
  Checkpoint c;
  c.store = Check(dc::apply::HostStore::Create(tensors), "zero checkpoint");
  Finalize(c, partition_bytes);
  return c;
}

// Random bytes, for the throughput run: the entropy stage cannot shrink them, so
// the wire carries the whole checkpoint.
Checkpoint RandomCheckpoint(uint64_t bytes, uint64_t seed, uint64_t partition_bytes) {
  std::vector<dc::TensorSpec> tensors;
  std::vector<std::vector<std::byte>> buffers;
  dc::bench::Rng rng(seed);
  const uint64_t per_tensor = uint64_t{64} << 20;
  for (uint64_t left = bytes, i = 0; left > 0; ++i) {
    const uint64_t n = std::min(left, per_tensor);
    tensors.push_back({fmt::format("blob.{:04}", i), dc::DType::kBF16, {n / 2}});
    std::vector<std::byte> b(n / 2 * 2);
    for (size_t k = 0; k + 8 <= b.size(); k += 8) {
      const uint64_t v = rng.Next();
      std::memcpy(b.data() + k, &v, 8);
    }
    buffers.push_back(std::move(b));
    left -= n;
  }
  return Borrowing(tensors, std::move(buffers), partition_bytes);
}

// ---- one cluster, one refit ------------------------------------------------

std::string_view UplinkModelName(UplinkModel m) {
  switch (m) {
    case UplinkModel::kShared:
      return "shared";
    case UplinkModel::kPerConnection:
      return "per_connection";
    case UplinkModel::kUncapped:
      return "uncapped";
  }
  return "?";
}

std::string ScenarioName(const Scenario& s) {
  if (s.topology == "striped") return "striped(" + std::to_string(s.stripes) + ")";
  if (s.topology != "tree") return s.topology;
  return "tree(" + (s.fanout ? std::to_string(*s.fanout) : std::string("auto")) + ")";
}

// The cluster config: "src" and receivers "n01".."nNN" on consecutive ports of
// 127.0.0.1, every uplink at the link rate.
std::string ConfigToml(int receivers, int fanout, int base_port, const ClusterParams& p,
                       int stripes) {
  // The planner needs an uplink; an uncapped run plans with a nominal 10 Gbit/s.
  const double uplink_bits = p.link_bytes_per_second > 0 ? p.link_bytes_per_second * 8 : 10e9;
  std::string toml = "[cluster]\nname = \"fanout-bench\"\n\n[tree]\n";
  toml += "fanout = " + (fanout > 0 ? std::to_string(fanout) : std::string("\"auto\"")) + "\n";
  toml += fmt::format("chunk_size = \"{}B\"\nwindow = {}\n", p.chunk_bytes, p.window);
  toml += "connect_timeout = \"20s\"\nidle_timeout = \"60s\"\ncommit_timeout = \"300s\"\n";
  toml += fmt::format("default_uplink = \"{:.0f}bit\"\n", uplink_bits);
  if (stripes > 1) toml += fmt::format("stripes = {}\n", stripes);
  auto node = [&](const std::string& id, int port, const char* role) {
    toml += fmt::format(
        "\n[[node]]\nid = \"{}\"\nhost = \"127.0.0.1\"\nport = {}\nregion = \"local\"\nrole = "
        "\"{}\"\n",
        id, port, role);
  };
  node("src", base_port, "source");
  for (int i = 1; i <= receivers; ++i) node(fmt::format("n{:02}", i), base_port + i, "receiver");
  return toml;
}

namespace {

// What one node's uplink carried: bytes of the CHUNK messages it sent.
using UploadCounter = std::shared_ptr<std::atomic<uint64_t>>;

// Wraps a transport to count the CHUNK bytes its connections send.
class UploadMeter : public dc::transport::Transport {
 public:
  UploadMeter(std::unique_ptr<dc::transport::Transport> inner, UploadCounter sent)
      : inner_(std::move(inner)), sent_(std::move(sent)) {}
  const dc::transport::Capabilities& capabilities() const override {
    return inner_->capabilities();
  }
  dc::Result<std::string> Listen(const std::string& address,
                                 dc::transport::AcceptHandler on_accept) override {
    return inner_->Listen(address, [sent = sent_, on_accept](auto connection) {
      on_accept(std::make_unique<Link>(std::move(connection), sent));
    });
  }
  void Connect(const std::string& address, dc::transport::ConnectHandler on_done) override {
    inner_->Connect(address, [sent = sent_, on_done](auto connection) {
      if (!connection.ok()) return on_done(std::move(connection));
      on_done(std::unique_ptr<dc::transport::Connection>(
          std::make_unique<Link>(std::move(*connection), sent)));
    });
  }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  class Link : public dc::transport::Connection {
   public:
    Link(std::unique_ptr<dc::transport::Connection> inner, UploadCounter sent)
        : inner_(std::move(inner)), sent_(std::move(sent)) {}
    void Start(dc::transport::MessageHandler on_message,
               dc::transport::CloseHandler on_closed) override {
      inner_->Start(std::move(on_message), std::move(on_closed));
    }
    void Send(dc::transport::Message message, dc::transport::SendHandler on_sent) override {
      auto type = dc::relay::PeekType(*message);
      if (type.ok() && *type == dc::relay::MessageType::kChunk) *sent_ += message->size();
      inner_->Send(std::move(message), std::move(on_sent));
    }
    uint64_t QueuedBytes() const override { return inner_->QueuedBytes(); }
    void Close() override { inner_->Close(); }
    void Abort() override { inner_->Abort(); }
    std::string PeerAddress() const override { return inner_->PeerAddress(); }
    std::string PeerIdentity() const override { return inner_->PeerIdentity(); }
    void Authenticated() override { inner_->Authenticated(); }

   private:
    std::unique_ptr<dc::transport::Connection> inner_;
    UploadCounter sent_;
  };
  std::unique_ptr<dc::transport::Transport> inner_;
  UploadCounter sent_;
};

// The transport of one node (--transport), each connection paced per the uplink model.
std::unique_ptr<dc::transport::Transport> NodeTransport(const ClusterParams& p, UplinkModel model,
                                                        size_t children) {
  dc::transport::TransportOptions options;
  options.provider = p.provider;
  options.net_device = "lo";  // a loopback benchmark: nothing leaves lo
  auto tcp = Check(dc::transport::MakeTransport(p.transport, options), "transport");
  const double link_bytes_per_second = p.link_bytes_per_second;
  if (model == UplinkModel::kUncapped) return tcp;
  dc::transport::FaultPlan plan;
  plan.bandwidth_bytes_per_second = link_bytes_per_second;
  if (model == UplinkModel::kShared && children > 1)
    plan.bandwidth_bytes_per_second /= double(children);
  return dc::transport::WrapWithFaults(std::move(tcp), plan);
}

// Where the nodes of this process spool the chunks they forward: one folder per
// node, so agents sharing a process (or another benchmark on the machine) never
// open the same spool file. Removed after every cluster.
std::filesystem::path SpoolRoot() {
  return std::filesystem::temp_directory_path() /
         fmt::format("deltacast-fanout-bench-{}", getpid());
}

// Index of receiver "nNN" in a Cluster.
size_t ReceiverIndex(const std::string& id) { return std::stoul(id.substr(1)) - 1; }

struct Cluster {
  std::vector<std::unique_ptr<dc::relay::NodeAgent>> agents;  // [i]: receiver n(i+1)
  std::map<std::string, UploadCounter> uploads;               // by node id, "src" too
  // Each agent's store, owned by its replica inside the agent: valid while the
  // agent lives. Read only once the refit committed (the agent is idle then).
  std::vector<const dc::apply::WeightStore*> stores;

  void Stop() {
    for (auto& a : agents) {
      if (a) a->Stop();
    }
    agents.clear();
    stores.clear();
    std::error_code ignored;
    std::filesystem::remove_all(SpoolRoot(), ignored);
  }
};

// Starts every receiver at `base`. False (everything stopped) when a port is
// taken; dies on any other error.
// A node's children in every stripe's tree: the links its uplink is shared by.
size_t ChildLinks(const dc::topology::StripedPlan& plan, const std::string& id) {
  size_t links = 0;
  for (const auto& stripe : plan.stripes) links += stripe.tree.Find(id)->children.size();
  return links;
}

bool StartReceivers(const dc::topology::ClusterConfig& config,
                    const dc::topology::StripedPlan& striped, const Scenario& s,
                    const ClusterParams& p, const Checkpoint& base, Cluster& cluster) {
  const dc::topology::TreePlan& plan = striped.stripes.front().tree;
  // Copies and manifests first, so the agents then start (and join) within
  // milliseconds of each other and of the source.
  std::vector<std::unique_ptr<dc::apply::Replica>> replicas;
  for (int i = 0; i < s.receivers; ++i) {
    auto store = Check(dc::apply::HostStore::CopyOf(*base.store), "copy base");
    cluster.stores.push_back(store.get());
    replicas.push_back(Check(
        dc::apply::Replica::ForStore(std::move(store), p.partition_bytes, dc::DefaultThreadCount()),
        "replica"));
  }
  cluster.agents.resize(s.receivers);
  // Breadth-first, so each parent listens before its children try to join.
  for (size_t k = 1; k < plan.nodes.size(); ++k) {
    const auto& node = plan.nodes[k];
    const size_t i = ReceiverIndex(node.id);
    dc::relay::NodeAgentOptions options;
    options.config = config;
    options.node_id = node.id;
    options.token = kToken;
    options.apply_threads = p.apply_threads;
    options.spool_dir = SpoolRoot() / node.id;
    auto& sent = cluster.uploads[node.id];
    sent = std::make_shared<std::atomic<uint64_t>>(0);
    auto agent = dc::relay::NodeAgent::Start(
        std::move(options), std::move(replicas[i]),
        std::make_unique<UploadMeter>(NodeTransport(p, s.model, ChildLinks(striped, node.id)),
                                      sent),
        striped);
    if (!agent.ok()) {
      fmt::print(stderr, "fanout bench: {} cannot start ({}); retrying on other ports\n", node.id,
                 agent.status().ToString());
      cluster.Stop();
      return false;
    }
    cluster.agents[i] = std::move(*agent);
  }
  return true;
}

// Waits up to 20 s until every receiver has joined its parent in every stripe (its
// stats count a join per stripe), so the publish measures a refit over a joined
// tree, as every refit after a deployment's first runs, not the tree's forming (a
// fresh cluster's deeper relays were still joining when the source began). Returns
// whether they all had.
bool WaitForTree(const Cluster& cluster) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (const auto& agent : cluster.agents) {
    while (true) {
      const auto joins = agent->stats().stripe_parent_joins;
      if (!joins.empty() && std::find(joins.begin(), joins.end(), 0u) == joins.end()) break;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return true;
}

// An agent sends COMMITTED to its parent before it counts the commit in its own
// stats (NodeAgent::Impl::ReportOutcome), so when Publish returns the stats of the
// last agents may still lag by a moment. Waits up to 5 s for them; returns how many
// agents lagged.
int WaitForStats(const Cluster& cluster, const dc::Digest128& target) {
  int lagged = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (const auto& agent : cluster.agents) {
    bool late = false;
    while (Clock::now() < deadline) {
      const auto stats = agent->stats();
      if (stats.version == target && stats.refits_committed == 1) break;
      late = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    lagged += late;
  }
  return lagged;
}

// Every receiver committed the target and holds exactly its bytes; dies otherwise.
// Returns how many agents' stats lagged the commit (see WaitForStats).
int VerifyBitExact(const Cluster& cluster, const dc::relay::PublishReport& report,
                   const Checkpoint& target, const std::string& what) {
  if (!report.committed) Die(what + ": refit did not commit: " + report.abort_reason);
  if (report.nodes_decided != cluster.agents.size()) {
    Die(fmt::format("{}: {} of {} nodes confirmed the decision", what, report.nodes_decided,
                    cluster.agents.size()));
  }
  const int lagged = WaitForStats(cluster, report.target_version);
  for (size_t i = 0; i < cluster.agents.size(); ++i) {
    const auto stats = cluster.agents[i]->stats();
    if (stats.version != report.target_version || stats.refits_committed != 1) {
      Die(fmt::format("{}: agent {} is at version {} after {} commits", what, i,
                      stats.version.ShortHex(), stats.refits_committed));
    }
    if (TensorHashes(*cluster.stores[i]) != target.tensor_hashes) {
      Die(fmt::format("{}: agent {} holds bytes that differ from the target", what, i));
    }
  }
  return lagged;
}

int PlanDepth(const dc::topology::TreePlan& plan) {
  int depth = 0;
  for (const auto& n : plan.nodes) depth = std::max(depth, n.depth);
  return depth;
}

// A random first port for a cluster of `nodes` consecutive ports: in 30000..60000
// but below the kernel's ephemeral range where it can (outgoing connections take
// ports from there, and a listener there collides with them now and then).
int RandomBasePort(int nodes, std::mt19937& rng) {
  int low = 30000, high = 60000;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int ephemeral_low = 0, ephemeral_high = 0;
  if (range >> ephemeral_low >> ephemeral_high && ephemeral_low - nodes - 1 > low + 1000) {
    high = ephemeral_low - 1;
  }
  return std::uniform_int_distribution<int>(low, high - nodes)(rng);
}

}  // namespace

// One fresh cluster, one refit base -> target, checked bit-exact.
RunResult RunCluster(const Scenario& s, const ClusterParams& p, const Checkpoint& base,
                     const Checkpoint& target, std::mt19937& rng) {
  const std::string what =
      fmt::format("{} N={}{}", ScenarioName(s), s.receivers, s.full ? " full" : "");
  for (int attempt = 1; attempt <= 8; ++attempt) {
    const int base_port = RandomBasePort(s.receivers + 1, rng);
    const std::string toml = ConfigToml(s.receivers, s.fanout.value_or(0), base_port, p, s.stripes);
    const auto config =
        Check(dc::topology::ParseClusterConfig(toml, "fanout-bench.toml"), "config");
    const auto striped = Check(dc::topology::PlanStripes(config), "plan");
    if (static_cast<int>(striped.stripes.size()) != s.stripes) {
      Die(fmt::format("{}: planned {} stripes, not {}", what, striped.stripes.size(), s.stripes));
    }
    const dc::topology::TreePlan& plan = striped.stripes.front().tree;
    Cluster cluster;
    if (!StartReceivers(config, striped, s, p, base, cluster)) continue;

    dc::relay::PublishOptions options;
    options.config = config;
    options.token = kToken;
    options.encode_threads = p.encode_threads;
    options.spool_dir = SpoolRoot() / "src";
    const size_t source_children = ChildLinks(striped, plan.source);
    auto& source_sent = cluster.uploads[plan.source];
    source_sent = std::make_shared<std::atomic<uint64_t>>(0);
    double cpu = 0;
    double wall = 0;
    bool tree_joined = false;
    // Publish (relay/tree/publisher.h) along the striped plan, from a source that
    // listens first and publishes once the tree has joined.
    auto published = [&]() -> dc::Result<dc::relay::PublishReport> {
      auto source = dc::relay::Source::Start(
          options,
          std::make_unique<UploadMeter>(NodeTransport(p, s.model, source_children), source_sent),
          striped);
      if (!source.ok()) return source.status();
      tree_joined = WaitForTree(cluster);
      const double cpu0 = CpuSeconds();
      const auto t0 = Clock::now();
      auto report = (*source)->Publish(*base.store, base.manifest, *target.store, target.manifest);
      wall = Seconds(t0);
      cpu = CpuSeconds() - cpu0;
      (*source)->Stop();
      return report;
    }();
    if (!published.ok()) {
      cluster.Stop();
      if (published.status().message().find("cannot listen") != std::string::npos) continue;
      Die(what + ": publish failed: " + published.status().ToString());
    }
    const dc::relay::PublishReport& report = *published;
    const int lagged = VerifyBitExact(cluster, report, target, what);

    RunResult r;
    r.scenario = s;
    r.fanout_used = plan.fanout_used;
    r.depth = PlanDepth(plan);
    r.source_link_bytes_per_second =
        s.model == UplinkModel::kShared
            ? p.link_bytes_per_second / double(std::max<size_t>(1, source_children))
            : p.link_bytes_per_second;
    r.delta_bytes = report.delta.delta_bytes;
    r.checkpoint_bytes = target.manifest.TotalBytes();
    r.chunks = report.delta.chunks;
    r.changed_elements = report.delta.changed_elements;
    r.seconds = report.seconds;
    r.prepare_seconds = report.prepare_seconds;
    r.stream_seconds = report.stream_seconds;
    r.first_chunk_seconds = report.first_chunk_seconds;
    r.tree_joined = tree_joined;
    r.planner_seconds = striped.PredictSeconds(r.delta_bytes);
    r.stripes = static_cast<int>(striped.stripes.size());
    for (const auto& n : plan.nodes) {
      r.max_upload_copies =
          std::max(r.max_upload_copies, double(ChildLinks(striped, n.id)) / r.stripes);
    }
    for (const auto& [id, sent] : cluster.uploads) r.upload_bytes[id] = sent->load();
    r.cpu_seconds = cpu;
    r.wall_seconds = wall;
    for (const auto& a : cluster.agents)
      r.peak_held_bytes = std::max(r.peak_held_bytes, a->stats().peak_held_bytes);
    r.attempts = attempt;
    r.stats_lagged = lagged;
    r.max_children = 0;
    for (const auto& n : plan.nodes)
      r.max_children = std::max(r.max_children, int(ChildLinks(striped, n.id)));
    cluster.Stop();
    return r;
  }
  Die(what + ": no free ports after 8 attempts");
}

double LoadAverage() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

// Runs `s` `repeats` times, each on a fresh cluster, and keeps the run with the
// median seconds: the machine is shared, so one run is noisy.
RunResult RunMedian(const Scenario& s, const ClusterParams& p, const Checkpoint& base,
                    const Checkpoint& target, double rate, int repeats, std::mt19937& rng) {
  std::vector<RunResult> samples;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const double load = LoadAverage();
    samples.push_back(RunCluster(s, p, base, target, rng));
    samples.back().load_average = load;
  }
  std::sort(samples.begin(), samples.end(),
            [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
  RunResult median = samples[samples.size() / 2];
  for (const auto& r : samples) median.samples_seconds.push_back(r.seconds);
  median.change_rate = rate;
  PrintRun(median, p.link_bytes_per_second);
  return median;
}

// The least time the links allow: under the shared model the busiest uplink must
// send the delta once per child; with per-connection caps every link moves it once.
double UplinkLowerBound(const RunResult& r, double link) {
  const double one = double(r.delta_bytes) / link;
  return r.scenario.model == UplinkModel::kShared ? one * std::max(1.0, r.max_upload_copies) : one;
}

void PrintRun(const RunResult& r, double link) {
  fmt::print(stderr,
             "{:>10} N={:<2} f={:<2} {:<14} {:>5} rate {:.3f}: {:>8} B in {:>4} chunks, {:.3f} s "
             "(prepare {:.3f}, "
             "bound {:.3f}), cpu {:.2f} s ({:.2f} cores), peak held {} B\n",
             ScenarioName(r.scenario), r.scenario.receivers, r.fanout_used,
             UplinkModelName(r.scenario.model), r.scenario.full ? "full" : "delta", r.change_rate,
             r.delta_bytes, r.chunks, r.seconds, r.prepare_seconds, UplinkLowerBound(r, link),
             r.cpu_seconds, r.cpu_seconds / r.wall_seconds, r.peak_held_bytes);
}

}  // namespace deltacast::bench::fanout
