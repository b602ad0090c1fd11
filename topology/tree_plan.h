// The relay tree: who forwards the delta to whom. Every agent and the publisher plan
// it from the same config and must agree, so the plan depends only on the config's
// content: never on the order of entries in the file, hash-map iteration or the host.
//
// Shape rules:
//   * One WAN crossing per region. For each region other than the source's, a gateway
//     (highest uplink, tie: smallest id; among the nodes with gateway = true when the
//     region lists any) is a child of the source; the rest of that region hangs below
//     its gateway. Nodes of the source's region (senders too) hang below the source.
//   * Inside a region, a k-ary tree filled breadth-first, nodes ordered by uplink
//     (descending) then id, so the fastest uplinks relay and the slowest are leaves.
//     The source's egress is shared by its in-region children and all gateways.
//   * A manual `parent` in the config wins; such nodes are left out of the k-ary fill
//     and out of gateway choice, and an edge it creates across regions is a WAN edge.
//   * Children of a node are listed by uplink (descending) then id; `nodes` is the
//     breadth-first order from the source in that child order.
//   * Failover parent: the grandparent (none for the source and its children).
//
// Model (pipelined cut-through; delta D bytes, chunk c = min(chunk_size, D)):
//   edge bps   = min(parent uplink / parent's child count,
//                    the child region's per-flow cap (flow_bandwidth, at most its
//                    wan_bandwidth) if the edge crosses regions,
//                    window * chunk_size * 8 / (2 * edge latency))   <- credit window
//   edge latency = hop_latency (+ the child region's wan_latency on a WAN edge)
//   T(node)    = (D + depth * c) / (min edge bps on its path / 8) + sum of edge latencies
//   T(plan)    = max over nodes (the slowest root-to-leaf path).
// Fanout "auto" tries every k from 1 to the largest number of nodes planned below one
// region's root (larger k give the same tree; a lower bound, uplink / min(k, m) at
// each region's root, ends the search early) and keeps the smallest k whose T(plan)
// for a kAutoFanoutReferenceBytes delta is within kFanoutTieTolerance of the best:
// the tolerance keeps last-bit floating-point differences between builds from
// changing the choice.
//
// Thread safety: TreePlan is a value; concurrent const use is safe. PlanTree is
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "topology/cluster_config.h"

namespace deltacast::topology {

// The delta size "auto" fanout is chosen for. Large enough that bandwidth, not
// per-hop latency, dominates, as it does for real refits (hundreds of MiB to tens of
// GiB); the plan does not change with the size actually sent.
inline constexpr uint64_t kAutoFanoutReferenceBytes = uint64_t{1} << 30;
// Relative difference in predicted time below which two fanouts count as equal.
inline constexpr double kFanoutTieTolerance = 1e-9;

struct PlannedNode {
  std::string id;
  std::string region;
  std::optional<std::string> parent;  // nullopt only for the source
  std::vector<std::string> children;  // uplink descending, then id
  std::optional<std::string> failover_parent;
  // Transports of the edge from the parent / from the failover parent, preference
  // order (HopTransports); the first is the one used unless it fails to connect.
  std::vector<std::string> transports;
  std::vector<std::string> failover_transports;
  int depth = 0;               // edges from the source
  bool crosses_wan = false;    // the edge from its parent enters another region
  bool manual_parent = false;  // the parent came from the config, not the planner
  double link_bps = 0;         // the edge from its parent, bits/s; 0 for the source
  double link_latency_s = 0;   // one-way latency of that edge
  double path_bps = 0;         // min link_bps from the source to here; +inf for the source
  double path_latency_s = 0;   // sum of link latencies from the source to here
};

struct TreePlan {
  std::string source;
  std::vector<PlannedNode> nodes;  // breadth-first from the source; nodes[0] is the source
  int fanout_used = 0;
  bool fanout_auto = false;
  uint64_t chunk_size = 0;

  // nullptr when no node has that id. Valid while `nodes` is unchanged.
  const PlannedNode* Find(std::string_view id) const;
  // The model's time until every node has a `delta_bytes` delta (see the header comment).
  double PredictSeconds(uint64_t delta_bytes) const;
  // The model's time until `node` has it.
  double PredictSecondsTo(const PlannedNode& node, uint64_t delta_bytes) const;
  // The node that finishes last (ties: first in `nodes`); the source for a 1-node plan.
  const PlannedNode& SlowestNode(uint64_t delta_bytes) const;
  // A digest of the tree's shape (every node's parent and failover parent). Agents
  // can compare it when they connect, so one planned from a different config is
  // refused instead of relaying along a tree the others do not know.
  Digest128 Fingerprint() const;
};

// Plans the tree for a config (validating it first: kInvalidArgument as
// ValidateClusterConfig gives; also kInvalidArgument when a planned or failover edge
// joins two nodes that share no transport). Uses the config's fanout, or picks one for "auto".
Result<TreePlan> PlanTree(const ClusterConfig& config);

// The same with the fanout forced to `fanout` (>= 1), whatever the config says; for
// comparisons ("what would fanout 4 cost?").
Result<TreePlan> PlanTreeWithFanout(const ClusterConfig& config, int fanout);

}  // namespace deltacast::topology
