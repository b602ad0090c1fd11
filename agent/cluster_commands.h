// The relay-tree subcommands: plan, agent and publish. Like agent/commands.h, each
// Run function prints its report and returns the process exit status.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "codec/partition_codec.h"
#include "common/progress.h"
#include "relay/tree/publisher.h"
#include "topology/cluster_config.h"

namespace deltacast::agent {

struct PlanArgs {
  std::filesystem::path config;
  uint64_t delta_bytes = uint64_t{1} << 30;
  bool json = false;
  int stripes = 0;  // 0: the config's [tree] stripes; else plan this many (what would S cost?)
};
int RunPlan(const PlanArgs& args);

struct AgentArgs {
  std::filesystem::path config;
  std::string node;
  std::filesystem::path store;
  size_t threads = 0;
  bool progress = true;  // a bar on a terminal while it catches up
};
// Runs until SIGINT or SIGTERM.
int RunAgent(const AgentArgs& args);

// One half of a bucket bridge (relay/bucket/bucket_bridge.h, docs/object-store.md): the
// uplink beside the source, or the downlink on the region gateway's host.
struct BucketBridgeArgs {
  std::filesystem::path config;
  std::string node;             // the bridge node
  std::filesystem::path state;  // its spool; empty: a temporary folder
  bool uplink = true;
};
// Runs until SIGINT or SIGTERM.
int RunBucketBridge(const BucketBridgeArgs& args);

struct PublishArgs {
  std::filesystem::path config, base, target;
  // The source's own state (decision log, spool); default: .deltacast-source
  // beside NEW, which successive checkpoints of one trainer share.
  std::filesystem::path state_dir;
  size_t keep_deltas = 4;  // committed deltas kept for nodes that catch up
  codec::EncodeOptions codec;
  size_t threads = 0;
  bool json = false;
  bool progress = true;  // a progress line on a terminal
  // A serving description (docs/fp8.md): BASE and NEW (or the producers' shards)
  // are BF16, and the delta between their FP8 serving twins is shipped.
  std::filesystem::path serving;
};
// Exit status 0 when the version committed everywhere, 1 otherwise.
int RunPublish(const PublishArgs& args);

// What RunPublish and the producers' publish (agent/produce_commands.h) share: the
// source's options (its state beside `new_version` unless --state-dir; its signing
// key, which fails to load with an error), and printing the report (text, or JSON
// with `extra_json`'s keys added), whose exit status it returns.
// Sets options.on_progress to draw a progress bar on a terminal (not with --json
// or --no-progress); Finish the bar when the publish returns.
std::shared_ptr<progress::Progress> AttachPublishProgress(const PublishArgs& args,
                                                          relay::PublishOptions& options);

Result<deltacast::relay::PublishOptions> MakePublishOptions(
    const PublishArgs& args, const topology::ClusterConfig& config, const std::string& token,
    const std::filesystem::path& new_version);
int ReportPublish(const deltacast::relay::PublishReport& report, bool json,
                  const std::string& extra_json);

struct ServeArgs {
  std::filesystem::path config;
  std::filesystem::path state_dir;  // the source's decision log, spool and kept deltas
  size_t keep_deltas = 4;
  codec::EncodeOptions codec;
  size_t threads = 0;
  bool json = false;
};
// A long-running source: its children join once and stay. Reads checkpoint
// directories from stdin, one per line ("DIR" or "DIR fast|context"): the first is
// the version the cluster holds, each later one is published from the last committed
// one, and its report printed.
// Exit status 0 at end of input when every publish committed, 1 otherwise.
int RunServe(const ServeArgs& args);

struct CertsArgs {
  std::filesystem::path config;
  std::filesystem::path out;
  int days = 825;
  std::vector<std::string> producers;  // producer ids that get a certificate too
};
// Writes the cluster CA, a key and certificate per node (and per producer named),
// and the source's signing
// key pair into `out` (keeping what is already there), and prints the [security]
// table that names them.
int RunCerts(const CertsArgs& args);

}  // namespace deltacast::agent
