// The composition roots: from the cluster config to a running receiver (its
// [[node]] entry, its weights, its transports, the source's verify key, its spool)
// and to a source's options (its signing key, its state directory), in one place for
// the CLI, the public API and the simulator. Each caller hands what it has made
// itself (weights in GPU memory, a simulated network) and the rest is made here.
//
// Thread safety: plain functions; callable from any thread.
#pragma once

#include <filesystem>
#include <memory>

#include "apply/replica.h"
#include "common/status.h"
#include "relay/store/snapshot_store.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publish_options.h"
#include "relay/tree/sender_agent.h"
#include "transport/transport.h"

namespace deltacast::relay {

// What a node starts from besides its NodeAgentOptions.
struct NodeParts {
  // Its weights: `replica` when the caller opened them (host buffers, GPUs, a
  // simulated disk), else the checkpoint directory `checkpoint`, opened as its
  // [[node]] `checkpoint` mode says (relay/store/snapshot_store.h).
  std::filesystem::path checkpoint;
  std::unique_ptr<apply::Replica> replica;
  // Its links: the config's transports for this node unless given.
  std::unique_ptr<transport::Transport> transport;

  static NodeParts Checkpoint(std::filesystem::path dir) {
    NodeParts p;
    p.checkpoint = std::move(dir);
    return p;
  }
  static NodeParts Weights(std::unique_ptr<apply::Replica> replica,
                           std::unique_ptr<transport::Transport> transport = nullptr) {
    NodeParts p;
    p.replica = std::move(replica);
    p.transport = std::move(transport);
    return p;
  }
};

// Starts `options.node_id` of `options.config`. Refused with kInvalidArgument when the
// config has no such node. The verify key comes from the config's [security] unless
// options.verify_key is set; the spool defaults to the checkpoint directory's state
// folder (.deltacast/spool), which survives restarts.
Result<std::unique_ptr<NodeAgent>> StartConfiguredNode(NodeAgentOptions options, NodeParts parts);

// Starts `options.node_id`, a sender that roots a stripe (relay/tree/sender_agent.h):
// its transports from the config unless `transport` is given, the verify key from
// [security] unless options.verify_key is set. kInvalidArgument when the node is not
// such a sender.
Result<std::unique_ptr<SenderAgent>> StartConfiguredSender(
    SenderAgentOptions options, std::unique_ptr<transport::Transport> transport = nullptr);

// A source's options from the config: its signing key from [security], its state
// (decision log, spool, kept deltas) in `state_dir` when given (PublishOptions::
// UseStateDir), the last `keep_deltas` committed deltas kept there.
Result<PublishOptions> ConfiguredPublishOptions(const topology::ClusterConfig& config,
                                                std::string token,
                                                const std::filesystem::path& state_dir,
                                                size_t keep_deltas);

}  // namespace deltacast::relay
