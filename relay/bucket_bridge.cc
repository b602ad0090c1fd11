#include "relay/bucket_bridge.h"

#include <cstdlib>

namespace deltacast::relay {

Result<BucketBridgeOptions> BridgeOptionsFromConfig(const topology::ClusterConfig& config,
                                                    const std::string& node_id, std::string token) {
  if (!config.objstore) {
    return Status::InvalidArgument(config.source_file.string() +
                                   ": no [objstore] table: no bucket to bridge through");
  }
  if (!topology::IsBridge(config, node_id)) {
    return Status::InvalidArgument(config.source_file.string() + ": node '" + node_id +
                                   "' is not one of [objstore] bridges");
  }
  const topology::ObjectStoreConfig& o = *config.objstore;
  BucketBridgeOptions options;
  options.config = config;
  options.node_id = node_id;
  options.token = std::move(token);
  options.s3.endpoint = o.endpoint;
  options.s3.bucket = o.bucket;
  options.s3.region = o.region;
  for (const auto& [name, out] : {std::pair{&o.access_key_env, &options.s3.access_key},
                                  std::pair{&o.secret_key_env, &options.s3.secret_key}}) {
    const char* value = std::getenv(name->c_str());
    if (!value || !*value) {
      return Status::FailedPrecondition("[objstore]: the environment variable " + *name +
                                        " (the bucket's key) is not set");
    }
    *out = value;
  }
  options.prefix = o.prefix;
  options.parallel = static_cast<size_t>(o.parallel);
  options.keep_refits = static_cast<size_t>(o.keep_refits);
  options.poll = o.poll;
  return options;
}

}  // namespace deltacast::relay
