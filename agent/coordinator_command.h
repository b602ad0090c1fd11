// The commit record store in the commands (docs/recovery.md, "The commit record"):
// with a [coordination] table the source (publish) and every agent use the etcd
// store it names, and `deltacast coordinator` runs a standby coordinator against it.
//
// Thread safety: each call runs on the calling thread plus the store's and the
// coordinator's own.
#pragma once

#include <filesystem>
#include <string>

#include "common/status.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publish_options.h"
#include "topology/cluster_config.h"

namespace deltacast::agent {

// Sets options.commit_records (and its source_timeout and poll_interval) from
// [coordination]; without the table leaves them as they are (no store). Fails on
// credentials half set in the environment. Contacts nobody.
Status AttachCommitRecords(const topology::ClusterConfig& config, relay::PublishOptions& options);
Status AttachCommitRecords(const topology::ClusterConfig& config, relay::NodeAgentOptions& options);

struct CoordinatorArgs {
  std::filesystem::path config;
  std::string id;  // names it in the records it writes ("coordinator:<id>")
};
// Runs a standby coordinator (relay/tree/coordinator.h) until SIGINT or SIGTERM.
// Needs [coordination]; each ABORT it writes is logged (relay/tree/coordinator.cc).
int RunCoordinator(const CoordinatorArgs& args);

}  // namespace deltacast::agent
