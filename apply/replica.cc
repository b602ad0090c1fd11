#include "apply/replica.h"

#include <algorithm>

#include "codec/partition.h"
#include "common/log.h"
#include "common/parallel.h"

namespace deltacast::apply {

Replica::Replica(std::unique_ptr<WeightStore> store, CheckpointDirStore* dir_store,
                 codec::Manifest manifest, std::optional<InflightDelta> inflight, size_t threads)
    : store_(std::move(store)),
      dir_store_(dir_store),
      manifest_(std::move(manifest)),
      version_(inflight ? inflight->base : manifest_.VersionId()),
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

codec::Manifest Replica::HashStore() const {
  const WeightStore& s = *store_;
  return codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, manifest_.partition_bytes, threads_);
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
    current = HashStore();
  } else if (state_) {
    RETURN_IF_ERROR(state_->WriteInflight(delta));
  }
  inflight_ = delta;
  // The journal says the store is cleanly at the base, or it was just hashed: the
  // manifest is what the store holds, so partitions at base apply in one pass.
  options.store_at_manifest = true;
  auto applier = std::make_unique<DeltaApplier>(*store_, std::move(current), identity, options);
  for (uint32_t sequence : applied_) applier->MarkApplied(sequence);
  return applier;
}

Result<CatchUp> Replica::BeginCatchUp(const codec::Manifest& target, ApplyOptions options) {
  if (target.partition_bytes != manifest_.partition_bytes) {
    return Status::InvalidArgument(
        "the catch-up target uses partitions of " + std::to_string(target.partition_bytes) +
        " bytes, this replica " + std::to_string(manifest_.partition_bytes));
  }
  if (target.tensors != store_->tensors() ||
      target.partition_hashes.size() != target.tensors.size()) {
    return Status::InvalidArgument(
        "the catch-up target's tensor table differs from this store's: it cannot be reached by "
        "overwriting partitions");
  }
  const Digest128 to = target.VersionId();
  codec::Manifest current = manifest_;
  if (inflight_) {
    // The bytes are a mix of the delta in flight: hash them as they are.
    current = HashStore();
  }
  const InflightDelta delta{inflight_ ? inflight_->base : version_, to};
  if (!(inflight_ && *inflight_ == delta)) {
    if (state_) {
      // The old delta's marks go first; then the in-flight record is replaced in one
      // atomic write, so a crash leaves one record or the other, never none.
      if (inflight_) RETURN_IF_ERROR(state_->ClearMarks());
      RETURN_IF_ERROR(state_->WriteInflight(delta));
    }
    ForgetInflight();
    inflight_ = delta;
  }
  CatchUp out;
  for (size_t t = 0; t < target.tensors.size(); ++t) {
    const codec::TensorInfo& info = target.tensors[t];
    const uint64_t per = codec::PartitionElements(info.dtype, manifest_.partition_bytes);
    const uint64_t e = ElementSize(info.dtype);
    for (size_t p = 0; p < target.partition_hashes[t].size(); ++p) {
      if (current.partition_hashes[t][p] == target.partition_hashes[t][p]) continue;
      const uint64_t offset = p * per;
      out.partitions.push_back({{info.name, offset},
                                std::min(per, info.ElementCount() - offset) * e,
                                target.partition_hashes[t][p]});
    }
  }
  if (options.threads == 0) options.threads = threads_;
  out.applier = std::make_unique<DeltaApplier>(
      *store_, std::move(current),
      codec::DeltaIdentity{delta.base, delta.target, manifest_.partition_bytes}, options);
  return out;
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
    SaveManifestCache(target);
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
  codec::Manifest manifest = HashStore();
  if (manifest.VersionId() != inflight_->target) {
    return Status::FailedPrecondition("the store is at " + manifest.VersionId().ShortHex() +
                                      ", not the target " + inflight_->target.ShortHex() +
                                      " it would commit");
  }
  return Commit(manifest);
}

Status Replica::BeginRollback() {
  if (!inflight_) return Status::Ok();
  if (state_) RETURN_IF_ERROR(state_->ClearMarks());
  applied_.clear();
  prepared_ = false;
  return Status::Ok();
}

Status Replica::Abort(DeltaApplier& applier) {
  RETURN_IF_ERROR(BeginRollback());
  RETURN_IF_ERROR(applier.Rollback());
  return FinishAbort();
}

void Replica::SaveManifestCache(const codec::Manifest& manifest) {
  // Only a cache (re-hashing rebuilds it): a full disk must not fail a commit or a
  // rollback. A stale cache is never used: it is checked against the files' stamps.
  Status saved = state_->SaveManifest(*dir_store_, manifest);
  if (!saved.ok()) log::Warn("manifest cache not written: " + saved.ToString());
}

Status Replica::FinishAbort() {
  // Re-hash rather than trust bookkeeping: aborts are rare, and a replica opened
  // mid-delta never had a manifest of its base bytes.
  codec::Manifest manifest = HashStore();
  if (inflight_ && manifest.VersionId() != inflight_->base) {
    return Status::FailedPrecondition("rollback incomplete: the store is at " +
                                      manifest.VersionId().ShortHex() + ", not the base " +
                                      inflight_->base.ShortHex());
  }
  if (state_) {
    // Clearing only removes files, so it works on a full disk, and frees room.
    RETURN_IF_ERROR(state_->ClearInflight());
    SaveManifestCache(manifest);
  }
  manifest_ = std::move(manifest);
  version_ = manifest_.VersionId();
  ForgetInflight();
  return Status::Ok();
}

}  // namespace deltacast::apply
