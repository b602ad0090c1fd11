#include "apply/replica.h"

#include "common/parallel.h"

namespace deltacast::apply {

Replica::Replica(std::unique_ptr<WeightStore> store, CheckpointDirStore* dir_store,
                 codec::Manifest manifest, std::optional<InflightDelta> inflight, size_t threads)
    : store_(std::move(store)),
      dir_store_(dir_store),
      manifest_(std::move(manifest)),
      version_(manifest_.VersionId()),
      inflight_(inflight),
      threads_(threads) {
  if (dir_store_) state_.emplace(dir_store_->dir());
}

Result<std::unique_ptr<Replica>> Replica::OpenCheckpointDir(const std::filesystem::path& dir,
                                                            uint64_t partition_bytes,
                                                            size_t threads) {
  threads = threads ? threads : DefaultThreadCount();
  ASSIGN_OR_RETURN(auto store,
                   CheckpointDirStore::Open(dir, CheckpointDirStore::Access::kReadWrite));
  CheckpointState state(dir);
  ASSIGN_OR_RETURN(std::optional<InflightDelta> inflight, state.ReadInflight());
  ASSIGN_OR_RETURN(codec::Manifest manifest,
                   state.LoadOrComputeManifest(*store, partition_bytes, threads));
  CheckpointDirStore* raw = store.get();
  auto replica = std::unique_ptr<Replica>(
      new Replica(std::move(store), raw, std::move(manifest), inflight, threads));
  if (inflight) {
    ASSIGN_OR_RETURN(replica->applied_, state.ReadApplied());
    ASSIGN_OR_RETURN(replica->prepared_, state.ReadPrepared());
  }
  return replica;
}

Result<std::unique_ptr<Replica>> Replica::ForStore(std::unique_ptr<WeightStore> store,
                                                   uint64_t partition_bytes, size_t threads) {
  threads = threads ? threads : DefaultThreadCount();
  const WeightStore& s = *store;
  codec::Manifest manifest = codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, partition_bytes, threads);
  return std::unique_ptr<Replica>(
      new Replica(std::move(store), nullptr, std::move(manifest), std::nullopt, threads));
}

Result<std::unique_ptr<DeltaApplier>> Replica::Begin(const codec::DeltaIdentity& identity,
                                                     ApplyOptions options) {
  const InflightDelta delta{identity.base_version, identity.target_version};
  if (inflight_ && !(*inflight_ == delta)) {
    return Status::FailedPrecondition(
        "an unfinished delta " + inflight_->base.ShortHex() + " -> " +
        inflight_->target.ShortHex() + " is in flight; finish it before " +
        identity.base_version.ShortHex() + " -> " + identity.target_version.ShortHex());
  }
  if (!inflight_ && version_ != identity.base_version) {
    return Status::VersionMismatch(
        "this replica is at version " + version_.ShortHex() + ", but the delta applies to base " +
        identity.base_version.ShortHex() + " (target " + identity.target_version.ShortHex() + ")");
  }
  if (manifest_.partition_bytes != identity.partition_bytes) {
    return Status::Unsupported("the delta uses partitions of " +
                               std::to_string(identity.partition_bytes) + " bytes, this replica " +
                               std::to_string(manifest_.partition_bytes));
  }
  if (options.threads == 0) options.threads = threads_;
  codec::Manifest current = manifest_;
  if (inflight_) {
    // Resuming: partitions applied earlier (journaled chunks, which are not
    // replayed) are at target only in the bytes, so hash the bytes as they are.
    // Every record of the delta that is replayed sets its partition's target hash,
    // and the partitions it does not name are equal in base and target.
    const WeightStore& s = *store_;
    current = codec::ComputeManifest(
        s.tensors(), [&](size_t i) { return s.TensorData(i); }, manifest_.partition_bytes,
        threads_);
  } else if (state_) {
    RETURN_IF_ERROR(state_->WriteInflight(delta));
  }
  inflight_ = delta;
  auto applier = std::make_unique<DeltaApplier>(*store_, std::move(current), identity, options);
  for (uint32_t sequence : applied_) applier->MarkApplied(sequence);
  return applier;
}

Status Replica::RecordApplied(uint32_t sequence) {
  if (!inflight_) return Status::FailedPrecondition("no delta in flight");
  if (state_) RETURN_IF_ERROR(state_->AppendApplied(sequence));
  applied_.insert(sequence);
  return Status::Ok();
}

Status Replica::RecordPrepared() {
  if (!inflight_) return Status::FailedPrecondition("no delta in flight");
  if (state_) RETURN_IF_ERROR(state_->WritePrepared());
  prepared_ = true;
  return Status::Ok();
}

void Replica::ForgetInflight() {
  inflight_.reset();
  applied_.clear();
  prepared_ = false;
}

Status Replica::Commit(const codec::Manifest& target) {
  if (!inflight_ || target.VersionId() != inflight_->target) {
    return Status::FailedPrecondition("commit of a version that is not the delta in flight");
  }
  if (state_) {
    RETURN_IF_ERROR(state_->SaveManifest(*dir_store_, target));
    RETURN_IF_ERROR(state_->WriteActive(inflight_->target));
    RETURN_IF_ERROR(state_->ClearInflight());
  }
  manifest_ = target;
  version_ = inflight_->target;
  ForgetInflight();
  return Status::Ok();
}

Status Replica::CommitFromStore() {
  if (!inflight_) return Status::FailedPrecondition("no delta in flight");
  const WeightStore& s = *store_;
  codec::Manifest manifest = codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, manifest_.partition_bytes, threads_);
  if (manifest.VersionId() != inflight_->target) {
    return Status::FailedPrecondition("the store is at " + manifest.VersionId().ShortHex() +
                                      ", not the target " + inflight_->target.ShortHex() +
                                      " it would commit");
  }
  return Commit(manifest);
}

Status Replica::Abort(DeltaApplier& applier) {
  RETURN_IF_ERROR(applier.Rollback());
  return FinishAbort();
}

Status Replica::FinishAbort() {
  // Re-hash rather than trust bookkeeping: aborts are rare, and a replica opened
  // mid-delta never had a manifest of its base bytes.
  const WeightStore& s = *store_;
  codec::Manifest manifest = codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, manifest_.partition_bytes, threads_);
  if (inflight_ && manifest.VersionId() != inflight_->base) {
    return Status::FailedPrecondition("rollback incomplete: the store is at " +
                                      manifest.VersionId().ShortHex() + ", not the base " +
                                      inflight_->base.ShortHex());
  }
  if (state_) {
    RETURN_IF_ERROR(state_->SaveManifest(*dir_store_, manifest));
    RETURN_IF_ERROR(state_->ClearInflight());
  }
  manifest_ = std::move(manifest);
  version_ = manifest_.VersionId();
  ForgetInflight();
  return Status::Ok();
}

}  // namespace deltacast::apply
