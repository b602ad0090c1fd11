// NodeStore's commits on a snapshot store (relay/store/snapshot_store.h): a committed delta
// is kept in the chain before the active version flips, and nothing of the weights is
// written back; a commit the chain cannot describe (a catch-up) writes a snapshot.
#include "apply/checkpoint_dir.h"
#include "common/crash_point.h"
#include "relay/store/node_store.h"
#include "relay/store/snapshot_store.h"

namespace deltacast::relay {

Status NodeStore::CommitDelta(const codec::Manifest& target) {
  if (!options_.snapshots) return replica_->Commit(target, apply::CommitDurability::kLogged);
  RETURN_IF_ERROR(KeepInflightDelta());
  CrashPoint("snapshot.kept");
  // The chain holds the version now: the private weights need no write-back.
  RETURN_IF_ERROR(replica_->Commit(target, apply::CommitDurability::kFlushed));
  options_.snapshots->MaybeBuild(replica_->version());
  return Status::Ok();
}

Status NodeStore::KeepInflightDelta() {
  if (!options_.snapshots || !replica_->inflight()) return Status::Ok();
  const apply::InflightDelta delta = *replica_->inflight();
  ASSIGN_OR_RETURN(auto spool, Spool::Open(options_.spool_dir, delta.target,
                                           /*remove_others=*/false));
  const std::vector<uint32_t> sequences = spool->sequences();
  if (sequences.empty() || sequences.back() + 1 != sequences.size()) {
    return Status::FailedPrecondition("the spool of the delta to " + delta.target.ShortHex() +
                                      " misses chunks: the snapshot store cannot keep it");
  }
  ChainLink link{delta.base, delta.target, replica_->manifest().partition_bytes,
                 static_cast<uint32_t>(sequences.size())};
  return options_.snapshots->Keep(spool->path(), link);
}

Status NodeStore::SnapshotBeforeCommit(const codec::Manifest& target) {
  if (!options_.snapshots) return Status::Ok();
  const auto* live = dynamic_cast<const apply::CheckpointDirStore*>(&replica_->store());
  if (!live) return Status::Internal("a snapshot store's weights are not a checkpoint");
  return options_.snapshots->SnapshotFrom(*live, target);
}

Status NodeStore::SnapshotBeforeCatchUpCommit() {
  if (!options_.snapshots || !replica_->inflight()) return Status::Ok();
  // The snapshot is written only from weights at the catch-up's target.
  ASSIGN_OR_RETURN(codec::Manifest now, replica_->HashStoreNow());
  if (now.VersionId() != replica_->inflight()->target) {
    return Status::FailedPrecondition("the store is not at the catch-up's target");
  }
  return SnapshotBeforeCommit(now);
}

}  // namespace deltacast::relay
