#include "deltacast/node.h"

#include <algorithm>

#include "api/internal.h"
#include "apply/planned_store.h"
#include "common/log.h"
#include "layout/description.h"
#include "layout/engine.h"
#include "quant/engine_config.h"
#include "relay/producers/shard_input.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/setup.h"

namespace deltacast {
namespace {

// The node's options from the public ones; its weights are `parts` (a replica the
// caller opened, or a checkpoint directory), the rest is wired by the relay's
// composition root (relay/tree/setup.h). `on_gpus`: the weights lie in GPU memory.
// Chunks are entropy-coded, so they are decoded on the host whatever the transport
// could reach: GPUDirect would not save a copy. What reaches the GPUs goes through
// each memory's pinned staging ring; the transport's device-memory capability is
// logged once, so a deployment sees which.
Result<std::unique_ptr<relay::NodeAgent>> StartAgent(const Config& config, NodeOptions options,
                                                     relay::NodeParts parts, bool on_gpus = false) {
  relay::NodeAgentOptions agent;
  agent.config = config.impl().cluster;
  agent.node_id = options.node_id;
  agent.token = options.token;
  agent.apply_threads = options.apply_threads;
  agent.spool_dir = options.spool_dir;
  topology::NodeConfig* node = nullptr;
  for (topology::NodeConfig& n : agent.config.nodes) {
    if (n.id == options.node_id) node = &n;
  }
  if (node == nullptr) {
    return Status::InvalidArgument("node '" + options.node_id + "' is not in " +
                                   agent.config.source_file.string());
  }
  if (!options.apply_mode.empty()) {
    if (options.apply_mode != "on-arrival" && options.apply_mode != "staged") {
      return Status::InvalidArgument("NodeOptions::apply_mode = \"" + options.apply_mode +
                                     "\": must be \"on-arrival\" or \"staged\"");
    }
    node->apply_mode = options.apply_mode == "staged" ? topology::ApplyMode::kStaged
                                                      : topology::ApplyMode::kOnArrival;
  }
  if (!options.checkpoint.empty()) {
    if (options.checkpoint != "in-place" && options.checkpoint != "snapshot") {
      return Status::InvalidArgument("NodeOptions::checkpoint = \"" + options.checkpoint +
                                     "\": must be \"in-place\" or \"snapshot\"");
    }
    node->checkpoint = options.checkpoint == "snapshot" ? topology::CheckpointMode::kSnapshot
                                                        : topology::CheckpointMode::kInPlace;
  }
  if (on_gpus) {
    auto transport = relay::MakeNodeTransports(agent.config, *node);
    if (!transport.ok()) return transport.status();
    const transport::Capabilities& caps = (*transport)->capabilities();
    const bool device = std::find(caps.memory_types.begin(), caps.memory_types.end(),
                                  transport::MemoryType::kCudaDevice) != caps.memory_types.end();
    log::Info("node " + options.node_id + ": weights on GPUs; transport " + caps.backend +
              (device ? " can move GPU memory, but chunks are decoded on the host"
                      : " moves host memory only") +
              ": chunks land in host memory and patches reach the GPUs through pinned staging");
    parts.transport = std::move(*transport);
  }
  agent.engine_hooks = {std::move(options.pause_engine), std::move(options.resume_engine),
                        options.hook_timeout};
  if (options.on_commit) {
    agent.on_commit = [on_commit = std::move(options.on_commit)](const relay::CommitEvent& e) {
      on_commit({e.refit_id, e.version.ToHex(), e.changed_tensors});
    };
  }
  RETURN_IF_ERROR(api::AttachCommitRecords(agent.config, agent));
  return relay::StartConfiguredNode(std::move(agent), std::move(parts));
}

// The planned store over `gpus`: one memory per GPU, its plan from its layout.
Result<std::unique_ptr<apply::WeightStore>> PlanGpus(std::vector<GpuWeights> gpus) {
  if (gpus.empty()) return Status::InvalidArgument("no GPUs given");
  std::vector<TensorSpec> canonical;
  std::vector<apply::PlannedStore::PartSpec> parts;
  for (size_t g = 0; g < gpus.size(); ++g) {
    GpuWeights& gpu = gpus[g];
    const std::string where = "GPU " + std::to_string(g) + " (layout " + gpu.layout.string() + ")";
    auto description = layout::LoadLayout(gpu.layout);
    if (!description.ok()) return description.status().WithContext(where);
    if (g == 0) {
      auto table = relay::LoadCanonicalTable(gpu.layout.parent_path() / description->canonical);
      if (!table.ok()) return table.status().WithContext(where);
      for (const auto& t : *table) canonical.push_back({t.name, t.dtype, t.shape});
    }
    apply::PlannedStore::PartSpec part;
    if (gpu.device < 0) {
      part.memory = apply::device::NewHostPieceMemory("host" + std::to_string(g));
    } else {
      auto memory = apply::device::NewCudaPieceMemory(gpu.device);
      if (!memory.ok()) return memory.status().WithContext(where);
      part.memory = std::move(*memory);
    }
    part.layout = std::move(*description);
    part.stream = gpu.stream;
    for (const TensorView& t : gpu.parameters) {
      if (t.bytes.size() != t.spec.ByteSize()) {
        return Status::InvalidArgument(where + ": parameter '" + t.spec.name + "' has " +
                                       std::to_string(t.bytes.size()) + " bytes, its shape " +
                                       std::to_string(t.spec.ByteSize()));
      }
      part.locals.push_back({t.spec.name, t.spec.dtype, t.spec.shape});
      part.addresses.push_back(t.bytes.data());
    }
    parts.push_back(std::move(part));
  }
  auto store = apply::PlannedStore::Create(std::move(canonical), std::move(parts));
  if (!store.ok()) return store.status();
  return std::unique_ptr<apply::WeightStore>(std::move(*store));
}

}  // namespace

struct Node::Impl {
  std::unique_ptr<relay::NodeAgent> agent;
};

Result<std::unique_ptr<Node>> Node::Start(const Config& config, NodeOptions options,
                                          std::vector<TensorView> weights) {
  auto store = api::BorrowTensors(weights);
  if (!store.ok()) return store.status().WithContext("weights");
  auto replica = apply::Replica::ForStore(std::move(*store), codec::kDefaultPartitionBytes,
                                          options.apply_threads);
  if (!replica.ok()) return replica.status();
  auto agent =
      StartAgent(config, std::move(options), relay::NodeParts::Weights(std::move(*replica)));
  if (!agent.ok()) return agent.status();
  return std::unique_ptr<Node>(new Node(std::make_unique<Impl>(Impl{std::move(*agent)})));
}

Result<std::unique_ptr<Node>> Node::StartOnGpus(const Config& config, NodeOptions options,
                                                std::vector<GpuWeights> gpus) {
  const bool cuda =
      std::any_of(gpus.begin(), gpus.end(), [](const GpuWeights& g) { return g.device >= 0; });
  auto store = PlanGpus(std::move(gpus));
  if (!store.ok()) return store.status();
  auto replica = apply::Replica::ForStore(std::move(*store), codec::kDefaultPartitionBytes,
                                          options.apply_threads);
  if (!replica.ok()) return replica.status();
  auto agent =
      StartAgent(config, std::move(options), relay::NodeParts::Weights(std::move(*replica)), cuda);
  if (!agent.ok()) return agent.status();
  return std::unique_ptr<Node>(new Node(std::make_unique<Impl>(Impl{std::move(*agent)})));
}

Result<std::unique_ptr<Node>> Node::StartOnCheckpoint(const Config& config, NodeOptions options,
                                                      const std::filesystem::path& dir) {
  auto agent = StartAgent(config, std::move(options), relay::NodeParts::Checkpoint(dir));
  if (!agent.ok()) return agent.status();
  return std::unique_ptr<Node>(new Node(std::make_unique<Impl>(Impl{std::move(*agent)})));
}

Result<std::vector<std::filesystem::path>> WriteEngineLayouts(const EngineLayoutOptions& options) {
  auto engine = layout::ParseEngine(options.engine);
  if (!engine) {
    return Status::InvalidArgument("engine '" + options.engine + "': must be vllm or sglang");
  }
  auto config = quant::LoadEngineConfig(options.config);
  if (!config.ok()) return config.status();
  const std::filesystem::path canonical =
      options.canonical.empty() ? options.config.parent_path() : options.canonical;
  return layout::WriteEngineLayouts(*config, {*engine, options.tp, options.dp, options.ep},
                                    canonical.empty() ? "." : canonical, options.out_dir);
}

Node::Node(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Node::~Node() { Stop(); }
void Node::Stop() {
  if (impl_) impl_->agent->Stop();
}
std::string Node::listen_address() const { return impl_->agent->listen_address(); }

namespace {

std::vector<TensorMismatch> Mismatches(const codec::ManifestDiff& diff) {
  std::vector<TensorMismatch> out;
  if (diff.partition_bytes_differ) out.push_back({"", diff.Describe(0)});
  for (const auto& t : diff.tensors) out.push_back({t.name, t.Detail()});
  return out;
}

}  // namespace

Status Node::WaitForJoin(std::chrono::milliseconds timeout) const {
  const relay::JoinCheck::State state = impl_->agent->WaitForJoin(timeout);
  if (state.status.code() == StatusCode::kUnavailable && !state.joined) {
    return Status::Unavailable("not joined to its parent within " +
                               std::to_string(timeout.count()) +
                               " ms (the parent is not started, or unreachable)");
  }
  return state.status;
}

Result<VerifyReport> Node::Verify() {
  auto check = impl_->agent->Verify();
  if (!check.ok()) return check.status();
  VerifyReport report;
  report.version = check->version.ToHex();
  report.tensors = check->tensors;
  report.partitions = check->partitions;
  report.mismatches = Mismatches(check->diff);
  report.summary = check->diff.Describe();
  return report;
}

NodeStats Node::stats() const {
  const relay::NodeAgentStats s = impl_->agent->stats();
  NodeStats out;
  out.refits_committed = s.refits_committed;
  out.refits_aborted = s.refits_aborted;
  out.chunk_bytes_received = s.chunk_bytes_received;
  out.chunk_bytes_resent = s.chunk_bytes_resent;
  out.parent_joins = s.parent_joins;
  out.partitions_repaired = s.partitions_repaired;
  out.partitions_caught_up = s.partitions_caught_up;
  out.deltas_caught_up = s.deltas_caught_up;
  out.version = s.version.ToHex();
  out.last_pause_seconds = s.last_pause_seconds;
  out.last_prepared_hold_seconds = s.last_prepared_hold_seconds;
  out.pause_seconds_total = s.pause_seconds_total;
  // The engine keeps one entry even with one stripe; that one is the totals.
  if (s.stripe_chunks.size() > 1) {
    out.stripes.resize(s.stripe_chunks.size());
    for (size_t i = 0; i < out.stripes.size(); ++i) {
      out.stripes[i] = {s.stripe_chunks[i], s.stripe_chunk_bytes_resent[i],
                        s.stripe_parent_joins[i]};
    }
  }
  return out;
}

}  // namespace deltacast
