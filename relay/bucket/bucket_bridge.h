// The two halves of a bucket bridge (docs/object-store.md): BucketUplink joins the
// source as the bridge node and writes what it is sent into the bucket;
// BucketDownlink listens as that node for the region's gateway and serves it from
// the bucket. Between them the hop source -> bridge node is an S3 bucket, and the
// region needs no inbound connection from the source's side.
//
// Thread safety: Start/Stop from one thread; stats() from any. Each half runs its
// protocol on its own EventLoop thread and its S3 requests on a worker pool.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "common/status.h"
#include "objstore/s3_client.h"
#include "relay/wire/signing.h"
#include "topology/cluster_config.h"
#include "transport/transport.h"

namespace deltacast::relay {

struct BucketBridgeOptions {
  topology::ClusterConfig config;
  std::string node_id;  // the bridge node (listed in [objstore] bridges)
  std::string token;    // the cluster's shared secret
  objstore::S3Options s3;
  std::string prefix;      // keys start with prefix/node_id/
  size_t parallel = 8;     // S3 requests in flight
  size_t keep_refits = 4;  // committed refits kept for catch-up (uplink)
  // How often the bucket is asked for news while some is expected; without news
  // for a while, polls back off to poll_max (docs/object-store.md, "Polling").
  std::chrono::milliseconds poll{20};
  std::chrono::milliseconds poll_max{250};
  // Downlink: how long a child's FETCH / FETCH_MANIFEST passed up through the bucket
  // waits for the source's answer before it is answered "not found"
  // ([objstore] request_timeout).
  std::chrono::milliseconds request_timeout{30000};
  // The uplink's spool (chunks it may have to write again); the downlink's (for
  // children that rejoin). Empty: a per-process temporary folder.
  std::filesystem::path spool_dir;
  // Downlink: the source's public key; BEGIN and decisions from the bucket are
  // sent down only if they verify (chunks are checked by every node anyway).
  std::shared_ptr<const VerifyKey> verify_key;
};

// The bridge options for `node_id` from the config's [objstore] section, the S3
// keys read from the environment variables it names. kInvalidArgument if the
// config has no [objstore] or `node_id` is not one of its bridges;
// kFailedPrecondition if a key variable is unset.
Result<BucketBridgeOptions> BridgeOptionsFromConfig(const topology::ClusterConfig& config,
                                                    const std::string& node_id, std::string token);

struct BucketBridgeStats {
  uint64_t refits = 0;
  uint64_t objects_written = 0;
  uint64_t objects_read = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t retries = 0;          // S3 requests that failed and were tried again
  uint64_t bad_objects = 0;      // objects that failed their checks
  uint64_t stale_decisions = 0;  // decision objects of another refit, ignored
  uint64_t refetches = 0;        // chunks written again on a downlink's request
  // The request channel (relay/bucket/bucket_requests.h). Downlink: children's FETCH /
  // FETCH_MANIFEST written as request objects, answers passed down, requests
  // answered "not found" after request_timeout, or at once (too many in flight).
  // Uplink: request objects sent up to the source, answers written.
  uint64_t requests_up = 0;
  uint64_t answers = 0;
  uint64_t requests_timed_out = 0;
  uint64_t requests_refused = 0;
  objstore::RequestCounts requests;  // every S3 request so far
  // Those of the last refit that ended here: since the refit before it ended, so
  // the idle polls between refits count too.
  objstore::RequestCounts last_refit_requests;
};

class BucketUplink {
 public:
  // Dials the source (through the plan's parent of `node_id`). Fails if the node is
  // not a bridge or the bucket cannot be reached.
  static Result<std::unique_ptr<BucketUplink>> Start(
      BucketBridgeOptions options, std::unique_ptr<transport::Transport> transport);
  ~BucketUplink();  // Stop()
  void Stop();
  BucketBridgeStats stats() const;
  class Impl;

 private:
  explicit BucketUplink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class BucketDownlink {
 public:
  // Listens on the bridge node's address for its planned children. Fails if the
  // node is not a bridge, the address cannot be bound or the bucket not reached.
  static Result<std::unique_ptr<BucketDownlink>> Start(
      BucketBridgeOptions options, std::unique_ptr<transport::Transport> transport);
  ~BucketDownlink();  // Stop()
  void Stop();
  BucketBridgeStats stats() const;
  const std::string& listen_address() const;
  class Impl;

 private:
  explicit BucketDownlink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::relay
