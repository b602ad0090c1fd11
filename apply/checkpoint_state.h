// The `.deltacast/` directory inside a checkpoint directory: the cached manifest,
// the active version, and the delta in flight. docs/recovery.md says which file is
// written when, and how each write is made durable.
//
// Thread safety: not thread-safe; one process patches a checkpoint at a time.
#pragma once

#include <filesystem>
#include <optional>
#include <set>

#include "apply/checkpoint_dir.h"
#include "codec/manifest.h"
#include "common/hash.h"
#include "common/status.h"

namespace deltacast::apply {

inline constexpr std::string_view kStateDirName = ".deltacast";
// In a snapshot store's .deltacast/: names its current snapshot (relay/store/snapshot_store.h).
inline constexpr std::string_view kSnapshotPointerName = "snapshot";

// A delta whose apply has started and not yet finished.
struct InflightDelta {
  Digest128 base;
  Digest128 target;
  bool operator==(const InflightDelta&) const = default;
};

class CheckpointState {
 public:
  explicit CheckpointState(const std::filesystem::path& checkpoint_dir);

  // The manifest from the cache when every file still has the size, mtime and inode
  // it had when the cache was written; otherwise computed (hashing every partition)
  // and cached. A cache that cannot be written (read-only directory) is skipped.
  Result<codec::Manifest> LoadOrComputeManifest(const CheckpointDirStore& store,
                                                uint64_t partition_bytes, size_t threads);
  // Caches `manifest` as the store's current one (after a patch made it so).
  Status SaveManifest(const CheckpointDirStore& store, const codec::Manifest& manifest);

  Result<std::optional<InflightDelta>> ReadInflight() const;
  Status WriteInflight(const InflightDelta& inflight);
  // Removes the in-flight record with its applied and prepared marks.
  Status ClearInflight();
  // Removes the applied and prepared marks, keeping the in-flight record (before it
  // is replaced by another: the marks belong to the old one).
  Status ClearMarks();

  // Sequence numbers of the in-flight delta's chunks whose partitions are applied
  // and flushed; appended (and fsynced) one per chunk, so a restart resumes after
  // them. A torn last line (a crash mid-append) is ignored.
  Status AppendApplied(uint32_t sequence);
  Result<std::set<uint32_t>> ReadApplied() const;
  // Marks the in-flight delta PREPARED (every partition verified and flushed):
  // after a restart the node must ask for the outcome, never guess it.
  Status WritePrepared();
  Result<bool> ReadPrepared() const;

  // The cached manifest if it is the manifest of `version`, whatever the files'
  // stamps say: after a machine crash they prove nothing either way, and the
  // version id (checked here) binds every partition hash. nullopt when there is no
  // such cache. For recovery, which re-hashes the store against it.
  Result<std::optional<codec::Manifest>> LoadManifestOf(const Digest128& version,
                                                        uint64_t partition_bytes) const;

  // The committed delta whose writes may not all be on disk yet (its records are
  // in the node's spool): written before `active` when a commit leaves the store's
  // write-back for later, removed once every page is flushed. While it exists,
  // a restart re-hashes the store and mends it from the spool and the tree.
  Result<std::optional<InflightDelta>> ReadUnflushed() const;
  Status WriteUnflushed(const InflightDelta& delta);
  Status ClearUnflushed();

  Result<std::optional<Digest128>> ReadActive() const;
  // Durably records `version` as active (write tmp, fsync, rename, fsync dir).
  Status WriteActive(const Digest128& version);

 private:
  Status EnsureDir();
  std::filesystem::path dir_;  // <checkpoint>/.deltacast
};

}  // namespace deltacast::apply
