// Parses the [objstore] table of a cluster config (topology/objstore_config.h).
//
// Thread safety: pure functions.
#pragma once

#include <toml++/toml.h>

#include <string_view>

#include "common/status.h"
#include "topology/cluster_config.h"

namespace deltacast::topology::internal {

// Parses root's [objstore], if present, into config.objstore. Errors are
// kInvalidArgument "SOURCE:LINE: [objstore] ..." naming the key and the value.
Status ParseObjectStore(const toml::table& root, std::string_view source_name,
                        ClusterConfig& config);

}  // namespace deltacast::topology::internal
