// The striped plan the engine runs along for a config (topology/stripe_plan.h): the
// source and every agent plan the same one.
//
// Thread safety: a pure function of the config.
#pragma once

#include "common/status.h"
#include "topology/cluster_config.h"
#include "topology/stripe_plan.h"

namespace deltacast::relay {

Result<topology::StripedPlan> PlanStripesFor(const topology::ClusterConfig& config);

}  // namespace deltacast::relay
