// NodeStore's private state of a refit and of a reconcile, shared by its source
// files (node_store.cc, node_store_staged.cc). Not for other users.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "apply/replica.h"
#include "relay/store/node_store.h"

namespace deltacast::relay {

// The applier of the refit in progress and what it has seen (apply thread).
struct NodeStore::RefitState {
  uint64_t id = 0;
  bool at_target = false;  // the replica already holds the target: nothing to apply
  std::unique_ptr<apply::DeltaApplier> applier;
  std::optional<codec::DeltaSummary> summary;
  std::optional<codec::Manifest> target;
  std::set<std::string> changed_tensors;      // under journal_mu_
  std::array<uint8_t, 32> manifest_digest{};  // all zero: not checked
  // Staged apply: this refit writes at Commit. `untouched`: nothing of the delta
  // was ever written (it began here, not resumed from a run that may have applied
  // it): an abort only drops it.
  bool staged = false;
  bool untouched = false;
  std::shared_ptr<Spool> spool;  // staged: where chunks not held in memory are read back
  struct Held {
    std::shared_ptr<apply::StagedChunk> records;
    transport::Message message;  // null: read back from the spool
  };
  std::map<uint32_t, Held> held;  // staged chunks, by sequence; under staged_mu_
  double paused_seconds = 0;      // staged: the pause, when it ended before the commit's journal
};

// A reconcile in progress (apply thread).
struct NodeStore::ReconcileState {
  apply::Reconcile reconcile;
  std::set<apply::PartitionKey> pending;  // partitions that still differ from the target
};

}  // namespace deltacast::relay
