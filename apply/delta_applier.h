// DeltaApplier: applies the chunks of one delta to a WeightStore, in any order and
// in parallel, partition by partition, never leaving a partition between versions
// on a bad input.
//
// Per record: at the target hash a partition is skipped (so re-applying a chunk is a
// no-op); at the base hash it is patched and verified against the target hash (a
// mismatch is undone); at any other hash it is torn (a crash mid-apply, or outside
// interference) and is reported for repair, never patched: XOR is never replayed
// blindly. Patching writes each window of the partition and hashes the stored bytes
// while they are in cache (codec::ApplyDecodedRecord), so verifying costs no second
// pass. Where the caller vouches that the manifest is what the store holds
// (ApplyOptions::store_at_manifest: the journal says the store is cleanly at the
// base, or it was just hashed), a partition the manifest has at the record's base is
// patched without hashing it first: one pass over its memory in all. If the stored
// result then misses the target the patch is undone (the bytes are exactly as they
// were) and the partition is classified by hashing after all, so a wrong manifest
// costs time, never a wrong byte. Otherwise each partition is hashed first.
//
// Check before write: before any byte of a chunk is written, its records are decoded
// and checked to take the base hash to the target hash (codec::DecodeAndCheckRecord:
// XOR and literal records from the record alone, whatever their partition holds;
// overwrite and context-XOR records, which decode against the old bytes, when their
// partition is at base). One record that fails refuses the whole chunk, like a
// damaged one: nothing of it is written and it does not count as received, so the
// caller fetches it again (WasRefused).
//
// Staged apply (the mode a node serving from its weights runs in: relay/store/node_store.h):
// StageChunk does ApplyChunk's validation and check before write and writes
// nothing; FinishStaged proves that the staged records take the base to the target;
// at commit each chunk is applied with the records its staging decoded, so the
// write is all that is left to do.
//
// Thread safety: ApplyChunk and StageChunk may be called from several threads at once (chunks of
// one delta apply in parallel); a chunk that names a partition another call is
// writing waits for it, so each partition sees one record at a time. The applier
// also runs its own worker threads within each call. Every other method must not
// run concurrently with ApplyChunk or with each other (the caller serializes them:
// relay/store/node_store.h waits for the chunks in flight first).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "apply/weight_store.h"
#include "codec/chunk.h"
#include "codec/manifest.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace deltacast::apply {

struct ApplyOptions {
  size_t threads = 0;  // 0 = all cores
  // Keeps what Rollback needs (the XOR words of each patched partition, or its old
  // bytes for dense and literal records) in memory until Finish or Rollback.
  bool keep_undo = false;
  // With keep_undo: what the delta's own records can restore is not kept (XOR
  // records are self-inverse and decodable without the base: RevertChunk applies
  // them again), and the old values of the others (overwrite, literal, context-XOR)
  // only up to kMaxUndoBytes in all; beyond that their base bytes are fetched. So a
  // node holding a delta in its spool keeps memory bounded whatever the model size.
  bool undo_from_records = false;
  // The caller vouches that the manifest given to the applier is the hash of the
  // store's bytes as they are (the journal says the store is cleanly at it, or it
  // was just hashed): partitions it has at a record's base are patched without a
  // hash before (see the class comment). Without it every partition is hashed first.
  bool store_at_manifest = false;
  // Finish makes the patched partitions durable (WeightStore::Flush) before it
  // returns. Off where durability comes from a log of the delta instead (a relay
  // node's spool: docs/recovery.md, "Durability"), so no page is written back
  // before PREPARED.
  bool flush_on_finish = true;
  // Where the records of a chunk run: this pool's ParallelFor, shared by every
  // ApplyChunk in flight (the pool must outlive the applier); null: `threads`
  // threads of the call's own.
  WorkerPool* pool = nullptr;
};

// A partition of the store, named in canonical coordinates.
struct PartitionKey {
  std::string tensor;
  uint64_t element_offset = 0;
  auto operator<=>(const PartitionKey&) const = default;
};

// A chunk checked and decoded ahead of its write (staged apply): its records'
// decoded forms, where the caller's memory budget held them.
struct StagedChunk {
  uint32_t sequence = 0;
  std::vector<codec::DecodedRecord> decoded;  // one per record of the chunk
  std::vector<char> held;                     // decoded[i] is valid
  uint64_t held_bytes = 0;                    // what the held records take
};

struct ApplyReport {
  uint64_t chunks = 0;
  uint64_t records = 0;
  uint64_t applied = 0;            // patched from base to target
  uint64_t already_at_target = 0;  // skipped
  uint64_t changed_elements = 0;
  uint64_t chunk_bytes = 0;
  uint64_t refused_chunks = 0;     // failed the check before write (nothing written)
  std::vector<PartitionKey> torn;  // neither base nor target: need literal repair
  double seconds = 0;
  // Of `seconds` (host stores; summed over chunks, which may overlap): validating,
  // decoding and checking that each record leads to its target hash before anything
  // is written, and writing the records into the store (where a disk-backed store
  // waits when the kernel holds writes back to flush dirty pages).
  double check_seconds = 0;
  double write_seconds = 0;
};

class DeltaApplier {
 public:
  // The most memory of undo kept with ApplyOptions::undo_from_records.
  static constexpr uint64_t kMaxUndoBytes = uint64_t{256} << 20;

  // `base_manifest` is the store's manifest at the delta's base version; its tensor
  // table must match the store's. The store must outlive the applier.
  DeltaApplier(WeightStore& store, codec::Manifest base_manifest,
               const codec::DeltaIdentity& identity, ApplyOptions options = {});

  // Validates `chunk` completely (identity, every record against the store's tensor
  // table and partitioning, no partition named twice) and checks every record that
  // will be applied (above) before touching any byte, then applies its records.
  // A validation error leaves the store unchanged. A record whose payload is
  // malformed or that does not take its base hash to its target hash refuses the
  // chunk: kCorrupt, the store unchanged, WasRefused(sequence) true until the chunk
  // applies. A record whose stored result still fails the target hash (the store
  // changed under the applier) leaves its partition at base and fails the call
  // after the chunk's other records are done.
  Status ApplyChunk(const codec::ChunkView& chunk);

  // Staged apply: validates and checks `chunk` exactly as ApplyChunk does and
  // writes nothing. The store is only read, by the records whose check decodes
  // against the base bytes (overwrite, context-XOR) where the manifest has their
  // partition at base (serving does not disturb them); a partition it has elsewhere
  // (a resumed delta that wrote it) is classified again when written. Decoded records
  // are kept in the result while `budget` (bytes, shared by the caller's staged
  // chunks, taken from as records are held) lasts; the rest are decoded again when
  // written. A refused chunk: as ApplyChunk (kCorrupt, WasRefused).
  Result<StagedChunk> StageChunk(const codec::ChunkView& chunk, std::atomic<int64_t>& budget);
  // The target manifest the staged chunks lead to: every data chunk staged, and
  // the base manifest with every staged record's target hash is the target version
  // (kCorrupt otherwise). Nothing is written; the store is still at the base.
  Result<codec::Manifest> FinishStaged(const codec::DeltaSummary& summary);
  // ApplyChunk with the records `staged` decoded (moved out of it); records it did
  // not hold are decoded here.
  Status ApplyChunk(const codec::ChunkView& chunk, StagedChunk* staged);

  // Whether chunk `sequence` was refused by the check before write and has not been
  // applied since: fetch it again (and do not Finish without it).
  bool WasRefused(uint32_t sequence) const;
  bool HasRefusedChunks() const;

  // Called with the END chunk's summary once every data chunk was applied: checks
  // that all data chunks and records arrived and no partition is torn, flushes the
  // patched partitions to durable storage (ApplyOptions::flush_on_finish), and returns the target
  // manifest (base manifest with the applied partitions' target hashes), whose version id must be
  // the delta's target. On error the store keeps what was applied; a later run
  // resumes (at-target partitions are skipped).
  Result<codec::Manifest> Finish(const codec::DeltaSummary& summary);

  // Counts chunk `sequence` as received without applying it: a resumed delta's
  // journaled chunks, whose partitions are already at target.
  void MarkApplied(uint32_t sequence);

  // Makes every partition patched so far durable (WeightStore::Flush). Blocks.
  Status FlushApplied();

  // What the applier knows the store holds now: the manifest it was given, with the
  // hash of every partition it has patched, repaired or written since.
  codec::Manifest current_manifest() const;

  // Partitions found torn so far, in canonical order.
  std::vector<PartitionKey> torn() const;
  // The target hash the delta gives for torn partition `key` (zero if not torn).
  PartitionHash TornTargetHash(const PartitionKey& key) const;
  const codec::DeltaIdentity& identity() const { return identity_; }

  // Repairs torn partition `key` with literal target bytes: `literal` must hash to
  // the target hash the delta gave for it (else kCorrupt, nothing written). Writes
  // and flushes the partition, then counts it as applied.
  Status Repair(const PartitionKey& key, ByteSpan literal);
  // Repair with the bytes of the same partition in `source` (a store at the target).
  Status RepairFrom(const WeightStore& source, const PartitionKey& key);

  // Returns every partition this applier patched to its base bytes (verified by
  // the base hash) and flushes it. Needs ApplyOptions::keep_undo. Partitions
  // repaired with literal bytes cannot be rolled back and make this fail.
  Status Rollback();

  // A partition that rollback cannot restore locally: its base bytes must be
  // fetched (they hash to base_hash).
  struct NeedsBase {
    PartitionKey key;
    PartitionHash base_hash;
    uint64_t byte_length = 0;
  };
  // Rolls the partitions `chunk` names back to their base bytes using the records
  // themselves, for when no undo was kept (a node restarted mid-delta): a partition
  // at base is left alone; at target, XOR records (self-inverse, and decodable
  // without the base) are applied again and verified against the base hash; any
  // other partition (torn, or an encoding that needs the base to decode) is added
  // to `needs_base`. Validates the chunk like ApplyChunk.
  Status RevertChunk(const codec::ChunkView& chunk, std::vector<NeedsBase>& needs_base);

  // Writes `bytes` over partition `key` if they hash to `expected_hash`
  // (kCorrupt otherwise, nothing written), and flushes it.
  Status WriteVerified(const PartitionKey& key, ByteSpan bytes, const PartitionHash& expected_hash);

  const ApplyReport& report() const { return report_; }

 private:
  struct Located {
    size_t tensor = 0;
    uint64_t partition_index = 0;
    uint64_t byte_offset = 0;
    uint64_t byte_length = 0;
  };
  Result<Located> Locate(const codec::PartitionRecord& record) const;
  // The identity, every record's partition, and no partition named twice.
  Result<std::vector<Located>> LocateChunk(const codec::ChunkView& chunk) const;
  void ForEach(size_t count, const std::function<void(size_t)>& fn) const;
  // Whether to keep the undo of `record` (reserving its bytes of the budget).
  bool KeepUndo(const codec::PartitionRecord& record, const Located& where);
  void ReleaseUndo(const codec::PartitionRecord& record, const Located& where);
  void Claim(const std::vector<std::pair<size_t, uint64_t>>& partitions);
  void Release(const std::vector<std::pair<size_t, uint64_t>>& partitions);

  WeightStore& store_;
  codec::Manifest manifest_ GUARDED_BY(mu_);  // becomes the target manifest as records apply
  codec::DeltaIdentity identity_;
  ApplyOptions options_;
  ApplyReport report_ GUARDED_BY(mu_);
  std::set<uint32_t> sequences_seen_ GUARDED_BY(mu_);
  std::set<uint32_t> refused_ GUARDED_BY(mu_);  // refused by the check, not applied since
  std::map<PartitionKey, PartitionHash> torn_ GUARDED_BY(mu_);  // -> target hash
  // Partitions (tensor, partition index) some ApplyChunk call is working on.
  std::set<std::pair<size_t, uint64_t>> claimed_ GUARDED_BY(mu_);
  CondVar claims_released_;
  // Decoded records held from the check to the write of one chunk: one set per
  // ApplyChunk in flight, reused so steady state does not allocate.
  std::vector<std::vector<codec::DecodedRecord>> decoded_pool_ GUARDED_BY(mu_);
  struct Undo {
    Located where;
    PartitionHash base_hash;
    PartitionHash target_hash;
    codec::SparseChanges xors;         // XOR words applied, or
    std::vector<std::byte> old_bytes;  // the bytes before (dense and literal records)
  };

  // What one chunk's records came to, gathered by either path and booked by Conclude.
  struct ChunkOutcome {
    explicit ChunkOutcome(size_t n, bool keep_undo)
        : errors(n), torn(n, 0), patched(n, 0), kept(n, 0), undo(keep_undo ? n : 0) {}
    std::vector<Status> errors;
    std::vector<char> torn, patched, kept;
    std::vector<Undo> undo;
    uint64_t applied = 0, skipped = 0, changed = 0;
    double check_seconds = 0, write_seconds = 0;  // ApplyReport's, for this chunk
  };
  Status Conclude(const codec::ChunkView& chunk, const std::vector<Located>& located,
                  ChunkOutcome& outcome, std::chrono::steady_clock::time_point start);
  // Refuses chunk `sequence` for `error` of the check before write.
  Status Refuse(uint32_t sequence, const Status& error);

  // The same work for a store reached through PartitionAccess (GPU memory, a load
  // plan): delta_applier_parts.cc. Records are decoded and checked on the host and
  // written in one ApplyPatches call per chunk; hashes are computed where the bytes lie.
  Status ApplyChunkByParts(PartitionAccess& access, const codec::ChunkView& chunk,
                           const std::vector<Located>& located, StagedChunk* staged,
                           std::chrono::steady_clock::time_point start);
  Status RollbackByParts(PartitionAccess& access) REQUIRES(mu_);
  // RevertChunk's work for one record; `needs_base` as there.
  Status RevertByParts(PartitionAccess& access, const codec::PartitionRecord& record,
                       const Located& where, std::vector<NeedsBase>& needs_base);
  // Writes `bytes` at byte `offset` of tensor `tensor`, by either path.
  Status WriteBytes(size_t tensor, uint64_t offset, ByteSpan bytes);

  // Staged apply: the chunks staged, and the base manifest with their records'
  // target hashes (set by the first StageChunk).
  std::set<uint32_t> staged_seen_ GUARDED_BY(mu_);
  std::optional<codec::Manifest> staged_target_ GUARDED_BY(mu_);

  std::vector<Located> dirty_ GUARDED_BY(mu_);  // applied partitions not yet flushed
  std::vector<Undo> undo_ GUARDED_BY(mu_);
  std::atomic<uint64_t> undo_bytes_{0};  // reserved under undo_from_records
  bool repaired_ GUARDED_BY(mu_) = false;
  mutable Mutex mu_;
};

}  // namespace deltacast::apply
