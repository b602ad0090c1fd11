// What the public API's implementation shares: the config's internals and the
// conversions between public and internal types. Not installed.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apply/host_store.h"
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

}  // namespace api
}  // namespace deltacast
