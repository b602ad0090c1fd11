// Human- and machine-readable renderings of a TreePlan, for `deltacast plan`.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "topology/cluster_config.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {

// The tree drawn with two spaces of indentation per level. Each node line gives its
// region, address, uplink, parent and edge bandwidth (with a WAN marker and the
// added latency on WAN edges, "manual" for a configured parent), failover parent,
// children and the model's time until it has a `delta_bytes` delta; a header gives
// the fanout, the regions and their gateways, and the predicted refit time.
// `plan` must come from PlanTree(config).
std::string FormatPlanText(const TreePlan& plan, const ClusterConfig& config, uint64_t delta_bytes);

// The same as one JSON object (bandwidths in bits/s, times in seconds, latencies in
// ms); see plan_format.cc for the keys. Ends without a newline.
std::string FormatPlanJson(const TreePlan& plan, const ClusterConfig& config, uint64_t delta_bytes);

}  // namespace deltacast::topology
