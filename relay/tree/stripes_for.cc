#include "relay/tree/stripes_for.h"

#include "topology/tree_plan.h"

namespace deltacast::relay {

// Until the striped planner (topology::PlanStripes) is merged: one tree, today's.
Result<topology::StripedPlan> PlanStripesFor(const topology::ClusterConfig& config) {
  ASSIGN_OR_RETURN(topology::TreePlan tree, topology::PlanTree(config));
  topology::StripedPlan plan;
  plan.stripes.push_back(topology::StripeTree{0, tree.source, std::move(tree)});
  return plan;
}

}  // namespace deltacast::relay
