// Parses the [coordination] table of a cluster config (topology/coordination_config.h).
//
// Thread safety: pure functions.
#pragma once

#include <toml++/toml.h>

#include <string_view>

#include "common/status.h"
#include "topology/cluster_config.h"

namespace deltacast::topology::internal {

// Parses root's [coordination], if present, into config.coordination. Errors are
// kInvalidArgument "SOURCE:LINE: [coordination] ..." naming the key and the value.
// Relative TLS paths are resolved against source_name's folder.
Status ParseCoordination(const toml::table& root, std::string_view source_name,
                         ClusterConfig& config);

}  // namespace deltacast::topology::internal
