// Replica: one node's copy of the weights together with its version state: the
// active version and its manifest, and the delta in flight. Everything that
// changes a node's weights goes through a Replica, so the version rules live in one
// place: a delta applies only on top of its base, the active version flips only
// after every partition verified, and an aborted delta is rolled back.
//
// For a checkpoint directory the state is durable under DIR/.deltacast/
// (docs/recovery.md); for other stores (an embedder's buffers) it is in memory.
//
// Thread safety: not thread-safe; one owner drives a replica.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/delta_applier.h"
#include "apply/weight_store.h"
#include "codec/chunk.h"
#include "codec/manifest.h"
#include "common/status.h"

namespace deltacast::apply {

// A partition a catch-up must overwrite: its coordinates and the target's hash.
struct CatchUpPartition {
  PartitionKey key;
  uint64_t byte_length = 0;
  PartitionHash target_hash;
};

// A catch-up in progress: the applier writes the target's bytes (WriteVerified).
struct CatchUp {
  std::unique_ptr<DeltaApplier> applier;
  std::vector<CatchUpPartition> partitions;  // those whose bytes differ from the target
};

// How a commit leaves the store's pages (docs/recovery.md, "Durability").
enum class CommitDurability {
  // Every write is durable already (the applier flushed it): nothing to note.
  kFlushed,
  // Writes may still be only in the page cache: the version is durable through the
  // delta's chunks in the node's spool and the decision. The journal notes it
  // (`unflushed`) until MarkFlushed; a restart before that reconciles.
  kLogged,
};

// Bringing a store whose writes since its last flush may be lost (a machine crash)
// back to its committed version: `applier` (a delta from the unflushed delta's
// base to its target, over a manifest of what the store holds now, hashed) applies
// the delta's chunks again from the spool (a partition at base is patched, one at
// target skipped, any other left torn); whatever still differs from `target` is
// written with bytes fetched by hash (applier->WriteVerified); then FinishReconcile.
struct Reconcile {
  std::unique_ptr<DeltaApplier> applier;
  codec::Manifest target;  // the committed version's manifest
};

class Replica {
 public:
  // Opens checkpoint directory `dir` read-write. Its manifest comes from the cache
  // when the files are unchanged, else is computed (hashing every partition).
  static Result<std::unique_ptr<Replica>> OpenCheckpointDir(const std::filesystem::path& dir,
                                                            uint64_t partition_bytes,
                                                            size_t threads);
  // A snapshot store's replica (relay/store/snapshot_store.h): `store` (kPrivate) holds the
  // bytes of `manifest` in memory, the snapshot with the committed chain replayed;
  // the journal is `journal_dir`/.deltacast/, as for a directory. A commit noted
  // unflushed (made ahead of its bytes) is done: the note is cleared. The caller
  // (relay/store/snapshot_store.h) has rebuilt `manifest` to the journal's active version.
  static Result<std::unique_ptr<Replica>> OpenOverJournal(std::unique_ptr<CheckpointDirStore> store,
                                                          const std::filesystem::path& journal_dir,
                                                          codec::Manifest manifest, size_t threads);
  // Wraps any store; version state is kept in memory only.
  static Result<std::unique_ptr<Replica>> ForStore(std::unique_ptr<WeightStore> store,
                                                   uint64_t partition_bytes, size_t threads);

  WeightStore& store() { return *store_; }
  const WeightStore& store() const { return *store_; }
  // The manifest of the store's current bytes when no delta is in flight.
  const codec::Manifest& manifest() const { return manifest_; }
  // The last version the store committed: with a delta in flight, its base (the
  // bytes are then a mix of base and target partitions).
  Digest128 version() const { return version_; }
  const std::optional<InflightDelta>& inflight() const { return inflight_; }
  // Chunks of the in-flight delta already applied and flushed (journaled), and
  // whether it was PREPARED; both survive a restart for a directory.
  const std::set<uint32_t>& applied_chunks() const { return applied_; }
  bool prepared() const { return prepared_; }
  // The committed delta whose writes may not all be durable (CommitDurability::kLogged
  // until MarkFlushed), and whether this process has not yet checked the store
  // against it (it was found at open, or a commit was made ahead of the bytes):
  // then Reconcile before anything else changes the store.
  const std::optional<InflightDelta>& unflushed() const { return unflushed_; }
  bool needs_reconcile() const { return needs_reconcile_; }

  // The manifest of the store's bytes as they are, hashing every partition.
  Result<codec::Manifest> HashStoreNow() const { return HashStore(); }

  // Journals chunk `sequence` of the in-flight delta as applied (its writes need not
  // be flushed where a spool holds the chunk: a resume re-applies it from there).
  Status RecordApplied(uint32_t sequence);
  // Journals the in-flight delta as PREPARED; call before saying so to anyone.
  Status RecordPrepared();

  // Starts applying `identity`, or resumes it if it is the delta in flight.
  // kVersionMismatch (nothing written) if the active version is not its base;
  // kFailedPrecondition if another delta is in flight. Records the delta as in
  // flight before returning (durably for a directory). The replica must outlive
  // the applier.
  Result<std::unique_ptr<DeltaApplier>> Begin(const codec::DeltaIdentity& identity,
                                              ApplyOptions options);

  // Starts (or resumes) bringing the store to `target`, the manifest of a version
  // committed elsewhere that this replica missed (it was down for one or more
  // refits), whatever it holds now: its active version, or the mix of a delta left
  // in flight, which this replaces. Journals a delta in flight to the target (so a
  // restart resumes the catch-up) and returns the partitions to overwrite with the
  // target's bytes (CatchUp::applier->WriteVerified); then call CommitFromStore.
  // kInvalidArgument (nothing written) if the target's tensors or partition size
  // differ from the store's. A catch-up is never rolled back: its target is already
  // committed. A store that needs_reconcile() may be caught up instead: its bytes are
  // hashed as they are, and the reconcile is given up (the note cleared).
  Result<CatchUp> BeginCatchUp(const codec::Manifest& target, ApplyOptions options);

  // Makes `target` (what DeltaApplier::Finish returned) the active version:
  // caches its manifest, flips the active version atomically and durably, and
  // clears the in-flight record. With kFlushed the store is flushed first (cheap if
  // the applier flushed as it went). With kLogged the journal first notes the delta as
  // unflushed (if the manifest cannot be cached, which recovery would need, the
  // store is flushed instead and nothing is noted).
  Status Commit(const codec::Manifest& target,
                CommitDurability durability = CommitDurability::kFlushed);
  // Commits the delta in flight as kLogged although the store's bytes are not all
  // at `target` yet (a PREPARED node whose pages were lost in a machine crash: the
  // version is durable by its spool and the decision): needs_reconcile() is then
  // true. `target` must be the manifest of the delta's target.
  Status CommitAhead(const codec::Manifest& target);
  // The store is flushed up to the commit of `target`: the journal's unflushed note
  // goes (if it names `target`). Call after WeightStore::FlushAll.
  Status MarkFlushed(const Digest128& target);

  // Starts reconciling (see Reconcile): needs unflushed(). Hashes every partition.
  // kFailedPrecondition if the committed version's manifest is not cached.
  Result<Reconcile> BeginReconcile(ApplyOptions options);
  // Ends it once `now` (the applier's current manifest) is the committed version:
  // flushes the store and clears the unflushed note. kFailedPrecondition (nothing
  // changed) if the store is not there yet.
  Status FinishReconcile(const codec::Manifest& now);

  // Marks the delta in flight as being rolled back: from now on none of its chunks
  // counts as applied (a rollback that stops half-way must not leave reverted
  // partitions listed as at target) and it is no longer PREPARED.
  Status BeginRollback();

  // Rolls `applier`'s partitions back to the base (its in-memory undo) and clears
  // the in-flight record; the active version stays the base.
  Status Abort(DeltaApplier& applier);
  // Ends the delta in flight that never wrote a byte to the store (a staged delta
  // dropped before its commit, begun by this process: the caller vouches for it):
  // clears the in-flight record without hashing the store.
  Status DropUnwritten();
  // Commits the in-flight delta after a restart lost its verified manifest:
  // re-hashes the store and commits only if it is exactly at the target version
  // (else kFailedPrecondition, nothing changed).
  Status CommitFromStore();
  // Ends an aborted delta whose partitions were restored by other means (records
  // reverted, base bytes fetched): re-hashes the store and clears the in-flight
  // record only if it is back at the base version (else kFailedPrecondition).
  Status FinishAbort();

 private:
  // `journal_dir`: where .deltacast/ is (for a directory, the directory itself).
  Replica(std::unique_ptr<WeightStore> store, CheckpointDirStore* dir_store,
          const std::filesystem::path& journal_dir, codec::Manifest manifest,
          std::optional<InflightDelta> inflight, size_t threads);
  Status SaveManifestCacheOrFail(const codec::Manifest& manifest);
  // kFailedPrecondition while the last commit is unflushed or unreconciled: a new
  // delta must not write over pages whose write-back could still be lost.
  Status CheckSettled() const;

  void ForgetInflight();
  // The manifest of the store's bytes as they are (hashing every partition).
  Result<codec::Manifest> HashStore() const;
  void SaveManifestCache(const codec::Manifest& manifest);

  std::unique_ptr<WeightStore> store_;
  CheckpointDirStore* dir_store_ = nullptr;  // store_ itself when it is a directory
  std::optional<CheckpointState> state_;     // set for directories
  codec::Manifest manifest_;
  Digest128 version_;
  std::optional<InflightDelta> inflight_;
  std::set<uint32_t> applied_;
  bool prepared_ = false;
  std::optional<InflightDelta> unflushed_;
  bool needs_reconcile_ = false;
  size_t threads_;
};

}  // namespace deltacast::apply
