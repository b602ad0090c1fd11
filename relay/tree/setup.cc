#include "relay/tree/setup.h"

#include <fmt/format.h>

#include "apply/checkpoint_state.h"
#include "codec/partition.h"
#include "common/log.h"
#include "relay/tree/configured_keys.h"
#include "relay/tree/node_transports.h"

namespace deltacast::relay {

Result<std::unique_ptr<NodeAgent>> StartConfiguredNode(NodeAgentOptions options, NodeParts parts) {
  const topology::NodeConfig* node = options.config.FindNode(options.node_id);
  if (node == nullptr) {
    return Status::InvalidArgument("node '" + options.node_id + "' is not in " +
                                   options.config.source_file.string());
  }
  if (!parts.replica) {
    auto opened = OpenNodeCheckpoint(parts.checkpoint, *node, codec::kDefaultPartitionBytes,
                                     options.apply_threads);
    if (!opened.ok()) return opened.status().WithContext("store " + parts.checkpoint.string());
    parts.replica = std::move(opened->replica);
    options.snapshots = std::move(opened->store);
  }
  if (const auto& inflight = parts.replica->inflight()) {
    log::Warn(
        fmt::format("{}: its weights hold an unfinished delta {} -> {}; it resumes when "
                    "the source resends it",
                    options.node_id, inflight->base.ShortHex(), inflight->target.ShortHex()));
  }
  if (options.spool_dir.empty() && !parts.checkpoint.empty()) {
    options.spool_dir = parts.checkpoint / apply::kStateDirName / "spool";
  }
  if (!parts.transport) {
    ASSIGN_OR_RETURN(parts.transport, MakeNodeTransports(options.config, *node));
  }
  if (!options.verify_key) {
    ASSIGN_OR_RETURN(options.verify_key, LoadConfiguredVerifyKey(options.config));
  }
  return NodeAgent::Start(std::move(options), std::move(parts.replica), std::move(parts.transport));
}

Result<std::unique_ptr<SenderAgent>> StartConfiguredSender(
    SenderAgentOptions options, std::unique_ptr<transport::Transport> transport) {
  const topology::NodeConfig* node = options.config.FindNode(options.node_id);
  if (node == nullptr) {
    return Status::InvalidArgument("node '" + options.node_id + "' is not in " +
                                   options.config.source_file.string());
  }
  if (!transport) {
    ASSIGN_OR_RETURN(transport, MakeNodeTransports(options.config, *node));
  }
  if (!options.verify_key) {
    ASSIGN_OR_RETURN(options.verify_key, LoadConfiguredVerifyKey(options.config));
  }
  return SenderAgent::Start(std::move(options), std::move(transport));
}

Result<PublishOptions> ConfiguredPublishOptions(const topology::ClusterConfig& config,
                                                std::string token,
                                                const std::filesystem::path& state_dir,
                                                size_t keep_deltas) {
  PublishOptions options;
  options.config = config;
  options.token = std::move(token);
  ASSIGN_OR_RETURN(options.signing_key, LoadConfiguredSigningKey(config));
  if (!state_dir.empty()) options.UseStateDir(state_dir);
  options.keep_deltas = keep_deltas;
  return options;
}

}  // namespace deltacast::relay
