// Embedding deltacast: a trainer and a rollout worker in one program.
//
// The trainer publishes its weights as in-memory tensors; the rollout worker runs a
// NodeAgent whose store is its own buffers (here plain vectors; in a real system,
// the inference engine's weight buffers). When a version commits, the worker's
// callback learns which tensors changed, so it can reload just those.
//
// Run: build/bin/deltacast_example_embed   (exit status 0 when the worker ends up
// bit-identical to the trainer).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "relay/node_agent.h"
#include "relay/publisher.h"
#include "apply/host_store.h"
#include "codec/manifest.h"
#include "topology/cluster_config.h"
#include "transport/tcp/tcp_transport.h"

namespace dc = deltacast;

namespace {

// One source and one receiver on loopback; ports picked from the process id so
// concurrent runs do not collide.
std::string ClusterToml() {
  // Below the ephemeral port range (32768+), so no outgoing connection holds it.
  const int port = 29600 + static_cast<int>(::getpid() % 1500) * 2;
  return "[cluster]\nname = \"embed\"\n[tree]\nconnect_timeout = \"10s\"\n"
         "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(port) +
         "\nrole = \"source\"\n"
         "[[node]]\nid = \"worker\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(port + 1) + "\n";
}

using Buffers = std::vector<std::vector<std::byte>>;

std::unique_ptr<dc::apply::WeightStore> Over(const std::vector<dc::codec::TensorInfo>& tensors,
                                             Buffers& buffers) {
  std::vector<std::pair<dc::codec::TensorInfo, dc::MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], dc::MutableByteSpan(buffers[i]));
  auto store = dc::apply::HostStore::Borrow(std::move(spans));
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*store);
}

dc::codec::Manifest ManifestOf(const dc::apply::WeightStore& s) {
  return dc::codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, dc::codec::kDefaultPartitionBytes, 0);
}

}  // namespace

int main() {
  // The model: two BF16 matrices and a norm, step k and step k+1 of training.
  const std::vector<dc::codec::TensorInfo> tensors = {
      {"model.layers.0.mlp.up_proj.weight", dc::DType::kBF16, {1024, 1024}},
      {"model.layers.0.self_attn.q_proj.weight", dc::DType::kBF16, {1024, 1024}},
      {"model.norm.weight", dc::DType::kBF16, {1024}}};
  std::mt19937 rng(7);
  Buffers step_k, step_k1;
  for (const auto& t : tensors) {
    std::vector<std::byte> bytes(t.ByteSize());
    for (auto& b : bytes) b = std::byte(rng());
    step_k.push_back(bytes);
    // About 2% of the matrices' elements move by one unit in the last place.
    if (t.name != "model.norm.weight") {
      for (size_t i = 0; i < bytes.size(); i += 2) {
        if (rng() % 50 == 0) bytes[i] ^= std::byte{1};
      }
    }
    step_k1.push_back(bytes);
  }

  auto config = dc::topology::ParseClusterConfig(ClusterToml(), "embed.toml");
  if (!config.ok()) return std::fprintf(stderr, "%s\n", config.status().ToString().c_str()), 1;
  const std::string token = "example-token";

  // Rollout worker: its own buffers hold step k; the agent patches them in place.
  Buffers worker_weights = step_k;
  auto replica = dc::apply::Replica::ForStore(Over(tensors, worker_weights),
                                              dc::codec::kDefaultPartitionBytes, 0);
  dc::relay::NodeAgentOptions worker_options;
  worker_options.config = *config;
  worker_options.node_id = "worker";
  worker_options.token = token;
  worker_options.on_commit = [](const dc::relay::CommitEvent& e) {
    std::printf("worker: version %s committed; reload:", e.version.ShortHex().c_str());
    for (const auto& name : e.changed_tensors) std::printf(" %s", name.c_str());
    std::printf("\n");
  };
  auto worker = dc::relay::NodeAgent::Start(std::move(worker_options), std::move(*replica),
                                            std::move(*dc::transport::MakeTcpTransport()));
  if (!worker.ok())
    return std::fprintf(stderr, "worker: %s\n", worker.status().ToString().c_str()), 1;

  // Trainer: publishes step k -> step k+1 from its own buffers.
  auto base = Over(tensors, step_k);
  auto target = Over(tensors, step_k1);
  dc::relay::PublishOptions options;
  options.config = *config;
  options.token = token;
  auto report = dc::relay::Publish(options, *base, ManifestOf(*base), *target, ManifestOf(*target),
                                   std::move(*dc::transport::MakeTcpTransport()));
  (*worker)->Stop();
  if (!report.ok())
    return std::fprintf(stderr, "publish: %s\n", report.status().ToString().c_str()), 1;
  std::printf("trainer: refit %s, %llu delta bytes for %llu bytes of weights\n",
              report->committed ? "committed" : ("aborted: " + report->abort_reason).c_str(),
              static_cast<unsigned long long>(report->delta.delta_bytes),
              static_cast<unsigned long long>(report->delta.tensor_bytes));
  const bool identical = worker_weights == step_k1;
  std::printf("worker weights %s the trainer's step k+1\n",
              identical ? "are bit-identical to" : "DIFFER from");
  return report->committed && identical ? 0 : 1;
}
