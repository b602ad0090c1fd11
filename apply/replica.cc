#include "apply/replica.h"

#include <algorithm>

#include "codec/partition.h"
#include "common/log.h"
#include "common/parallel.h"

namespace deltacast::apply {

Replica::Replica(std::unique_ptr<WeightStore> store, CheckpointDirStore* dir_store,
                 const std::filesystem::path& journal_dir, codec::Manifest manifest,
                 std::optional<InflightDelta> inflight, size_t threads)
    : store_(std::move(store)),
      dir_store_(dir_store),
      manifest_(std::move(manifest)),
      version_(inflight ? inflight->base : manifest_.VersionId()),
      inflight_(inflight),
      threads_(threads) {
  if (dir_store_) state_.emplace(journal_dir);
}

Result<std::unique_ptr<Replica>> Replica::OpenCheckpointDir(const std::filesystem::path& dir,
                                                            uint64_t partition_bytes,
                                                            size_t threads) {
  threads = threads ? threads : DefaultThreadCount();
  if (std::filesystem::exists(dir / kStateDirName / kSnapshotPointerName)) {
    // Its files are the first snapshot's (hard links): patching them would break it.
    return Status::FailedPrecondition(
        dir.string() +
        " is a snapshot store (checkpoint = \"snapshot\"): its files are not its "
        "committed version; open it in that mode, or `deltacast materialize` it");
  }
  ASSIGN_OR_RETURN(auto store,
                   CheckpointDirStore::Open(dir, CheckpointDirStore::Access::kReadWrite));
  CheckpointState state(dir);
  ASSIGN_OR_RETURN(std::optional<InflightDelta> inflight, state.ReadInflight());
  ASSIGN_OR_RETURN(std::optional<InflightDelta> unflushed, state.ReadUnflushed());
  if (unflushed && inflight) {
    // A commit was cut short: noted unflushed, then (maybe) the active version, then
    // the in-flight record cleared.
    ASSIGN_OR_RETURN(std::optional<Digest128> active, state.ReadActive());
    if (*unflushed == *inflight && active == inflight->target) {
      // It got past the active version: it committed. Finish clearing.
      RETURN_IF_ERROR(state.ClearInflight());
      inflight.reset();
    } else {
      // Not committed: the delta in flight (re-verified by hash on resume) covers
      // every page the note would.
      RETURN_IF_ERROR(state.ClearUnflushed());
      unflushed.reset();
    }
  }
  // With writes possibly lost, the cached manifest of the committed version is what
  // the store is checked against (Reconcile): it must not be replaced by a hash of
  // whatever the disk holds now.
  std::optional<codec::Manifest> committed;
  if (unflushed) {
    ASSIGN_OR_RETURN(committed, state.LoadManifestOf(unflushed->target, partition_bytes));
  }
  codec::Manifest manifest;
  if (committed) {
    manifest = std::move(*committed);
  } else {
    ASSIGN_OR_RETURN(manifest, state.LoadOrComputeManifest(*store, partition_bytes, threads));
  }
  CheckpointDirStore* raw = store.get();
  auto replica = std::unique_ptr<Replica>(
      new Replica(std::move(store), raw, dir, std::move(manifest), inflight, threads));
  if (inflight) {
    ASSIGN_OR_RETURN(replica->applied_, state.ReadApplied());
    ASSIGN_OR_RETURN(replica->prepared_, state.ReadPrepared());
  }
  if (unflushed) {
    // Writes of the last commit may have been lost with the machine: the store is
    // checked (Reconcile) before it is used. The manifest loaded above may describe
    // bytes that are not there.
    replica->unflushed_ = unflushed;
    replica->needs_reconcile_ = true;
    replica->version_ = unflushed->target;
  }
  return replica;
}

Result<std::unique_ptr<Replica>> Replica::ForStore(std::unique_ptr<WeightStore> store,
                                                   uint64_t partition_bytes, size_t threads) {
  threads = threads ? threads : DefaultThreadCount();
  ASSIGN_OR_RETURN(codec::Manifest manifest, HashWeightStore(*store, partition_bytes, threads));
  return std::unique_ptr<Replica>(
      new Replica(std::move(store), nullptr, {}, std::move(manifest), std::nullopt, threads));
}

Result<std::unique_ptr<Replica>> Replica::OpenOverJournal(std::unique_ptr<CheckpointDirStore> store,
                                                          const std::filesystem::path& journal_dir,
                                                          codec::Manifest manifest,
                                                          size_t threads) {
  threads = threads ? threads : DefaultThreadCount();
  CheckpointState state(journal_dir);
  ASSIGN_OR_RETURN(std::optional<InflightDelta> unflushed, state.ReadUnflushed());
  ASSIGN_OR_RETURN(std::optional<InflightDelta> inflight, state.ReadInflight());
  if (unflushed) {
    // A commit made ahead of its bytes (CommitAhead, after a restart) notes it; the
    // chain kept the delta first, so the weights rebuilt from it are at what
    // `active` says: nothing is left to reconcile. Cut short before the in-flight
    // record was cleared, the commit is finished as in place.
    ASSIGN_OR_RETURN(std::optional<Digest128> active, state.ReadActive());
    if (inflight && *unflushed == *inflight && active == inflight->target) {
      RETURN_IF_ERROR(state.ClearInflight());
      inflight.reset();
    }
    RETURN_IF_ERROR(state.ClearUnflushed());
  }
  CheckpointDirStore* raw = store.get();
  auto replica = std::unique_ptr<Replica>(
      new Replica(std::move(store), raw, journal_dir, std::move(manifest), inflight, threads));
  if (inflight) {
    ASSIGN_OR_RETURN(replica->applied_, state.ReadApplied());
    ASSIGN_OR_RETURN(replica->prepared_, state.ReadPrepared());
  }
  return replica;
}

Result<codec::Manifest> Replica::HashStore() const {
  return HashWeightStore(*store_, manifest_.partition_bytes, threads_);
}

Result<std::unique_ptr<DeltaApplier>> Replica::Begin(const codec::DeltaIdentity& identity,
                                                     ApplyOptions options) {
  const InflightDelta delta{identity.base_version, identity.target_version};
  RETURN_IF_ERROR(CheckSettled());
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
    ASSIGN_OR_RETURN(current, HashStore());
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
  // A store left unchecked by a machine crash (needs_reconcile) may be caught up
  // instead of reconciled: the catch-up goes by the hashes of the bytes there are.
  const bool unchecked = needs_reconcile_;
  if (!unchecked) RETURN_IF_ERROR(CheckSettled());
  const Digest128 to = target.VersionId();
  codec::Manifest current = manifest_;
  if (inflight_ || unchecked) {
    // The bytes are a mix of the delta in flight, or torn: hash them as they are.
    ASSIGN_OR_RETURN(current, HashStore());
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
  if (unchecked) {
    // After the in-flight record: a crash between the two reopens with both, which
    // keeps the delta in flight (re-hashed on resume) and clears the note.
    if (state_) RETURN_IF_ERROR(state_->ClearUnflushed());
    unflushed_.reset();
    needs_reconcile_ = false;
  }
  CatchUp out;
  for (size_t t = 0; t < target.tensors.size(); ++t) {
    const TensorSpec& info = target.tensors[t];
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

Status Replica::CheckSettled() const {
  if (needs_reconcile_) {
    return Status::FailedPrecondition(
        "the store's last commit (" + unflushed_->target.ShortHex() +
        ") may not be on disk and has not been checked since: reconcile it first (its agent "
        "does on start)");
  }
  if (unflushed_) {
    return Status::FailedPrecondition("the write-back of the last commit (" +
                                      unflushed_->target.ShortHex() + ") has not finished");
  }
  return Status::Ok();
}

Status Replica::SaveManifestCacheOrFail(const codec::Manifest& manifest) {
  return state_->SaveManifest(*dir_store_, manifest);
}

Status Replica::Commit(const codec::Manifest& target, CommitDurability durability) {
  if (!inflight_ || target.VersionId() != inflight_->target) {
    return Status::FailedPrecondition("commit of a version that is not the delta in flight");
  }
  bool logged = false;
  if (state_) {
    if (durability == CommitDurability::kLogged) {
      // Recovery re-hashes the store against this manifest, so it must be on disk
      // before the note that sends recovery looking for it.
      Status noted = SaveManifestCacheOrFail(target);
      if (noted.ok()) noted = state_->WriteUnflushed(*inflight_);
      logged = noted.ok();
      if (!logged) {
        log::Warn("cannot note the commit as unflushed (" + noted.ToString() +
                  "); flushing the store before it instead");
        RETURN_IF_ERROR(store_->FlushAll());
      }
    } else {
      // Cheap when the applier flushed as it went (the kernel writes dirty pages
      // only), and it makes sure of writes earlier runs left in the page cache.
      RETURN_IF_ERROR(store_->FlushAll());
      SaveManifestCache(target);
    }
    RETURN_IF_ERROR(state_->WriteActive(inflight_->target));
    RETURN_IF_ERROR(state_->ClearInflight());
  }
  if (logged) unflushed_ = *inflight_;
  manifest_ = target;
  version_ = inflight_->target;
  ForgetInflight();
  return Status::Ok();
}

Status Replica::CommitAhead(const codec::Manifest& target) {
  if (!inflight_ || target.VersionId() != inflight_->target) {
    return Status::FailedPrecondition("commit of a version that is not the delta in flight");
  }
  if (!state_) return Status::FailedPrecondition("a store without a journal cannot commit ahead");
  RETURN_IF_ERROR(SaveManifestCacheOrFail(target));
  RETURN_IF_ERROR(state_->WriteUnflushed(*inflight_));
  RETURN_IF_ERROR(state_->WriteActive(inflight_->target));
  RETURN_IF_ERROR(state_->ClearInflight());
  unflushed_ = *inflight_;
  needs_reconcile_ = true;
  version_ = inflight_->target;
  ForgetInflight();
  return Status::Ok();
}

Status Replica::MarkFlushed(const Digest128& target) {
  if (!unflushed_ || unflushed_->target != target || needs_reconcile_) return Status::Ok();
  if (state_) RETURN_IF_ERROR(state_->ClearUnflushed());
  unflushed_.reset();
  return Status::Ok();
}

Result<Reconcile> Replica::BeginReconcile(ApplyOptions options) {
  if (!unflushed_) return Status::FailedPrecondition("no commit to reconcile");
  ASSIGN_OR_RETURN(std::optional<codec::Manifest> target,
                   state_->LoadManifestOf(unflushed_->target, manifest_.partition_bytes));
  if (!target || target->tensors != store_->tensors()) {
    return Status::FailedPrecondition("the manifest of committed version " +
                                      unflushed_->target.ShortHex() + " is not cached in " +
                                      dir_store_->dir().string() +
                                      ", so the store cannot be checked against it");
  }
  if (options.threads == 0) options.threads = threads_;
  options.store_at_manifest = true;  // just hashed
  Reconcile out;
  ASSIGN_OR_RETURN(codec::Manifest now, HashStore());
  out.applier = std::make_unique<DeltaApplier>(
      *store_, std::move(now),
      codec::DeltaIdentity{unflushed_->base, unflushed_->target, manifest_.partition_bytes},
      options);
  out.target = std::move(*target);
  return out;
}

Status Replica::FinishReconcile(const codec::Manifest& now) {
  if (!unflushed_) return Status::Ok();
  if (now.VersionId() != unflushed_->target) {
    return Status::FailedPrecondition("the store is at " + now.VersionId().ShortHex() +
                                      ", not the committed " + unflushed_->target.ShortHex());
  }
  RETURN_IF_ERROR(store_->FlushAll());
  RETURN_IF_ERROR(state_->ClearUnflushed());
  SaveManifestCache(now);
  manifest_ = now;
  version_ = unflushed_->target;
  unflushed_.reset();
  needs_reconcile_ = false;
  return Status::Ok();
}

Status Replica::CommitFromStore() {
  if (!inflight_) return Status::FailedPrecondition("no delta in flight");
  ASSIGN_OR_RETURN(codec::Manifest manifest, HashStore());
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
  ASSIGN_OR_RETURN(codec::Manifest manifest, HashStore());
  if (inflight_ && manifest.VersionId() != inflight_->base) {
    return Status::FailedPrecondition("rollback incomplete: the store is at " +
                                      manifest.VersionId().ShortHex() + ", not the base " +
                                      inflight_->base.ShortHex());
  }
  if (state_) {
    // The base's bytes are durable before the delta stops being in flight.
    RETURN_IF_ERROR(store_->FlushAll());
    // Clearing only removes files, so it works on a full disk, and frees room.
    RETURN_IF_ERROR(state_->ClearInflight());
    SaveManifestCache(manifest);
  }
  manifest_ = std::move(manifest);
  version_ = manifest_.VersionId();
  ForgetInflight();
  return Status::Ok();
}

Status Replica::DropUnwritten() {
  if (!inflight_) return Status::Ok();
  // Nothing of the delta was written: the store is its base, byte for byte, and the
  // manifest this replica holds is still that of its bytes.
  if (state_) RETURN_IF_ERROR(state_->ClearInflight());
  ForgetInflight();
  return Status::Ok();
}

}  // namespace deltacast::apply
