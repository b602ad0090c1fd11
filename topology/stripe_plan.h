// Striped relay trees (issue 31; docs/architecture.md, "Striped trees"): the delta's
// partitions are split into S stripes, and each stripe crosses its own tree over the
// same receivers, from its own root on the trainer side. Planned so that each
// receiver is interior in at most one stripe's tree where it can be, and the WAN
// edges of different stripes land on different gateway hosts of a region when it
// lists several: the WAN carries S flows and every node's uplink about one copy.
//
// S = 1 is exactly today's tree (PlanTree), so a config that says nothing about
// stripes plans and behaves as before. Like PlanTree, the plan depends only on the
// config's content; every agent and the publisher plan it and must agree.
//
// Thread safety: StripedPlan is a value; PlanStripes is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/cluster_config.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {

struct StripeTree {
  int index = 0;     // 0 .. S-1
  std::string root;  // the node that sends this stripe: the source, or a sender node
  TreePlan tree;     // over every receiver; tree.nodes[0] is `root`
};

struct StripedPlan {
  std::vector<StripeTree> stripes;  // S >= 1, by index

  // The stripe that carries a partition (by its index in the target manifest).
  int StripeOf(uint64_t partition) const { return static_cast<int>(partition % stripes.size()); }
  // Predicted bytes each node uploads per refit, as a multiple of the delta's size
  // (single tree: an interior node k x, a leaf 0; striped: about 1 x each).
  std::map<std::string, double> UploadShare() const;
  // The model's time until every node has every stripe of a `delta_bytes` delta,
  // under the per-node and per-flow caps of the config.
  double PredictSeconds(uint64_t delta_bytes) const;
  // A digest of every stripe's tree (TreePlan::Fingerprint in stripe order).
  Digest128 Fingerprint() const;
};

// Plans the stripes for a config: validates it as PlanTree does; S from the config
// ([tree] stripes) or picked by the planner. kInvalidArgument names what is wrong.
Result<StripedPlan> PlanStripes(const ClusterConfig& config);

}  // namespace deltacast::topology
