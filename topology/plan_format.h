// Human- and machine-readable renderings of a TreePlan, for `deltacast plan`.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "topology/cluster_config.h"
#include "topology/stripe_plan.h"
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

// Every stripe of a striped plan (topology/stripe_plan.h). One stripe: FormatPlanText
// of its tree, then each node's upload per refit. Several: a header (the stripes,
// their roots and feeds, the regions with their per-flow caps and the gateway each
// stripe enters by, the predicted refit time under the per-node and per-flow caps,
// each node's upload per refit in deltas), then every stripe's tree drawn as
// FormatPlanText draws one, with each node's time until it has that stripe.
// `plan` must come from PlanStripes(config) or PlanStripesWithCount(config, S).
std::string FormatStripedPlanText(const StripedPlan& plan, const ClusterConfig& config,
                                  uint64_t delta_bytes);

// The same as one JSON object. One stripe: FormatPlanJson's keys, plus stripe_count,
// stripes_auto, fingerprint and upload_share ({node: deltas}). Several: cluster,
// config, source, stripe_count, stripes_auto, fingerprint, chunk_size, window,
// hop_latency_ms, commit_policy, delta_bytes, stripe_bytes, predicted_seconds,
// slowest ({stripe, node}), upload_share, regions[{name, nodes, source_region,
// wan_bps, flow_bps, wan_latency_ms, gateways (by stripe)}], stripes[{index, root,
// feeder, feeder_transports, feed_bps, fanout, fanout_auto, fingerprint,
// predicted_seconds, nodes (FormatPlanJson's node objects, predicted_seconds for
// this stripe)}]. Ends without a newline.
std::string FormatStripedPlanJson(const StripedPlan& plan, const ClusterConfig& config,
                                  uint64_t delta_bytes);

}  // namespace deltacast::topology
