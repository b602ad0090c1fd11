// The steps both planners share (tree_plan.cc: one tree; stripe_plan.cc: a tree per
// stripe): the order children relay in, the "no common transport" error, and the walk
// that turns a parent map into a TreePlan.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "topology/cluster_config.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {

// Nodes are named by their index in config.nodes; kNoParent marks a root (or a node
// outside a stripe's tree).
inline constexpr size_t kNoParent = std::numeric_limits<size_t>::max();

// Faster uplinks first so they relay; ids break ties so the order is the same on
// every agent whatever the file order.
bool FasterFirst(const NodeConfig& a, const NodeConfig& b);

// The config error for a hop whose ends list no transport in common; `edge` is "",
// "failover " or "feed "; `stripe` names the stripe's tree where there are several.
Status NoCommonTransport(const ClusterConfig& config, const NodeConfig& parent,
                         const NodeConfig& child, std::string_view edge,
                         std::optional<int> stripe = std::nullopt);

// Every node's children under `parent_of`, fastest first.
std::vector<std::vector<size_t>> ChildrenFastestFirst(const ClusterConfig& config,
                                                      const std::vector<size_t>& parent_of);

// One hop's modelled link (the planners model rates differently).
struct HopRate {
  double bps = 0;
  double latency_s = 0;
};

// The TreePlan of a parent map, breadth first from `root` (the nodes it reaches, in
// the order they are visited): each node's failover parent is its grandparent, else
// `root_failover` (a node below the root; nullptr: none). `hop(child, parent)` gives
// a hop's link.
Result<TreePlan> WalkTree(const ClusterConfig& config, const std::vector<size_t>& parent_of,
                          size_t root, const NodeConfig* root_failover, int fanout,
                          std::optional<int> stripe,
                          const std::function<HopRate(size_t child, size_t parent)>& hop);

}  // namespace deltacast::topology
