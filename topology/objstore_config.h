// The [objstore] table of a cluster config: the S3-compatible bucket that bridge
// nodes carry their hop through (docs/object-store.md).
//
//   [objstore]  endpoint ("http://host:port" or https, required), bucket (required),
//               region (SigV4 signing region, default "us-east-1"), prefix (of every
//               key, default the cluster name), access_key_env / secret_key_env (the
//               NAMES of the environment variables holding the keys; default
//               "DELTACAST_S3_ACCESS_KEY" / "DELTACAST_S3_SECRET_KEY"), bridges
//               (required: ids of receiver nodes whose hop from their parent is the
//               bucket), parallel (S3 requests in flight, default 8), keep_refits
//               (committed refits kept for catch-up, default 4), poll (how often the
//               bucket is asked for news while some is due, default "20ms"), poll_max
//               (the longest wait between polls once none came for a while, default
//               "250ms"; at least poll), request_timeout (how long a region node's
//               FETCH / FETCH_MANIFEST passed up through the bucket waits for the
//               source's answer before it is answered "not found", default "30s").
// A bridge node's planned children (its region's gateway) must sit in its region;
// the bridge runs as two processes, `deltacast bucket-uplink` beside the source and
// `deltacast bucket-downlink` on the gateway's host, which listens on the bridge
// node's address.
//
// Thread safety: values and pure functions.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace deltacast::topology {

struct ClusterConfig;
struct TreePlan;

struct ObjectStoreConfig {
  std::string endpoint;
  std::string bucket;
  std::string region = "us-east-1";
  std::string prefix;  // empty in the file: the cluster name
  std::string access_key_env = "DELTACAST_S3_ACCESS_KEY";
  std::string secret_key_env = "DELTACAST_S3_SECRET_KEY";
  std::vector<std::string> bridges;
  int parallel = 8;
  int keep_refits = 4;
  std::chrono::milliseconds poll{20};
  std::chrono::milliseconds poll_max{250};
  std::chrono::milliseconds request_timeout{30000};
  int line = 0;  // of [objstore]
};

// Whether `node_id` is one of the config's bridge nodes.
bool IsBridge(const ClusterConfig& config, std::string_view node_id);

// The checks that need the nodes: bridges name distinct receiver nodes. (That a
// bridge's children share its region is a property of the plan: CheckBridgePlan.)
// ValidateClusterConfig runs it.
Status ValidateObjectStoreConfig(const ClusterConfig& config);

// kInvalidArgument naming the node unless every planned child of every bridge sits
// in the bridge's region (its downlink listens on that region's gateway host) and
// every bridge has a child. The bridges run it before they start; `deltacast plan`
// prints it.
Status CheckBridgePlan(const ClusterConfig& config, const TreePlan& plan);

}  // namespace deltacast::topology
