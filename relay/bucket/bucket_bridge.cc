#include "relay/bucket/bucket_bridge.h"

#include <cstdlib>

#include "common/thread_annotations.h"
#include "relay/bucket/internal/bucket_io.h"
#include "topology/objstore_config.h"
#include "topology/tree_plan.h"

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
  options.poll_max = o.poll_max;
  options.request_timeout = o.request_timeout;
  return options;
}

namespace internal {

Result<topology::StripedPlan> PlanBridgeHalf(const BucketBridgeOptions& options,
                                             std::string_view half) {
  if (!topology::IsBridge(options.config, options.node_id)) {
    return Status::InvalidArgument(
        fmt::format("{}: '{}' is not one of [objstore] bridges", half, options.node_id));
  }
  ASSIGN_OR_RETURN(topology::StripedPlan plan, topology::PlanStripes(options.config));
  for (const topology::StripeTree& stripe : plan.stripes) {
    RETURN_IF_ERROR(topology::CheckBridgePlan(options.config, stripe.tree));
    if (!stripe.tree.Find(options.node_id)) {
      return Status::InvalidArgument(
          fmt::format("{}: no node '{}' in the plan", half, options.node_id));
    }
  }
  return plan;
}

std::vector<std::byte> ToBytes(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

BucketBridgeStats BucketIo::Stats() const {
  MutexLock lock(mu_);
  BucketBridgeStats out = stats_;
  out.requests = client_->requests();
  return out;
}

void BucketIo::BadObject(const std::string& key, const std::string& why) {
  MutexLock lock(mu_);
  if (stats_.bad_objects++ % 20 == 0) {
    log::Warn(fmt::format("{}: object '{}' refused: {}", who_, key, why));
  }
}

void BucketIo::EndRefit(uint64_t refit_id) {
  const objstore::RequestCounts now = client_->requests();
  const auto t = std::chrono::steady_clock::now();
  objstore::RequestCounts spent;
  double seconds = 0;
  {
    MutexLock lock(mu_);
    spent = now - at_last_end_;
    seconds = std::chrono::duration<double>(t - last_end_).count();
    at_last_end_ = now;
    last_end_ = t;
    stats_.last_refit_requests = spent;
  }
  log::Info(fmt::format("{}: refit {}: requests {} seconds={:.3f}", who_, refit_id,
                        spent.ToString(), seconds));
}

}  // namespace internal

}  // namespace deltacast::relay
