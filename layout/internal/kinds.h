// The TP part of each rule kind: the runs from a TP-local tensor's index space to
// canonical tensors, and the TP-local shape the rule implies (../shared/LAYOUTS.md,
// "Runs"). Stage offsets, experts, FSDP and flat buffers are composed on top in
// placement.cc.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "layout/description.h"
#include "layout/runs.h"

namespace deltacast::layout::internal {

// One canonical target of a rule: its index in the map's table and the shape the
// kind sees (a slab of a stacked expert tensor: the shape without dim 0), at
// element `base` of the canonical tensor.
struct Target {
  uint32_t index = 0;
  std::vector<uint64_t> shape;
  uint64_t base = 0;
  std::string name;
};

struct TpRuns {
  std::vector<uint64_t> local_shape;  // the TP-local tensor's shape
  std::vector<Run> runs;              // src in the TP-local tensor's element space
  // qkv_heads with kv_heads < tp: each KV head lies on `kv_replicas` ranks, this one
  // being replica `kv_index` of its head; the runs into targets 1 and 2 (k, v) are
  // copies of that head.
  uint64_t kv_replicas = 1;
  uint64_t kv_index = 0;
};

// `axis` / `coord`: the TP axis size and this rank's coordinate on it. Errors are
// plain messages; the caller prefixes where.
Result<TpRuns> KindRuns(const Rule& rule, const ModelDims& model,
                        const std::vector<Target>& targets, uint64_t axis, uint64_t coord);

}  // namespace deltacast::layout::internal
