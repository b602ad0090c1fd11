// The [limits] and [security] tables of a cluster config (topology/cluster_config.h),
// parsed apart from the rest of the file so each stays small.
//
// Thread safety: pure functions.
#pragma once

#include <toml++/toml.h>

#include <string_view>

#include "common/status.h"
#include "topology/cluster_config.h"

namespace deltacast::topology::internal {

// Parses root's [limits] and [security], if present, into `config`. Errors are
// kInvalidArgument "SOURCE:LINE: ..." naming the key and the value. Relative paths
// in [security] are made relative to the directory of `source_name`.
Status ParseLimitsAndSecurity(const toml::table& root, std::string_view source_name,
                              ClusterConfig& config);

}  // namespace deltacast::topology::internal
