// What the public API's implementation shares: the config's internals and the
// conversions between public and internal types. Not installed.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apply/host_store.h"
#include "coord/etcd_commit_records.h"
#include "deltacast/config.h"
#include "deltacast/source.h"
#include "deltacast/tensor.h"
#include "relay/tree/publisher.h"
#include "topology/cluster_config.h"

namespace deltacast {

struct Config::Impl {
  topology::ClusterConfig cluster;
};

namespace api {

// A store over the caller's tensors (borrowed, written in place).
Result<std::unique_ptr<apply::WeightStore>> BorrowTensors(const std::vector<TensorView>& tensors);

PublishReport ToPublic(const relay::PublishReport& report);

// The commit record store of the config's [coordination] (docs/recovery.md, "The
// commit record") on a source's or a node's options, as the CLI does; without the
// table the options stay as they are. Fails on etcd credentials half set in the
// environment. Contacts nobody.
template <typename Options>
Status AttachCommitRecords(const topology::ClusterConfig& cluster, Options& options) {
  if (!cluster.coordination || options.commit_records) return Status::Ok();
  ASSIGN_OR_RETURN(options.commit_records, coord::MakeCommitRecordStore(cluster));
  options.source_timeout = cluster.coordination->source_timeout;
  options.poll_interval = cluster.coordination->poll_interval;
  return Status::Ok();
}

}  // namespace api
}  // namespace deltacast
