// SnapshotStore: a receiver's checkpoint directory kept as a base snapshot plus the
// chain of deltas committed after it ([[node]] checkpoint = "snapshot";
// docs/recovery.md, "Snapshot stores"). The weights the node serves are a private
// mapping of the snapshot's files, patched in memory: committing a refit keeps its
// spool in the chain (O(delta) bytes), never writes the model, and the next refit
// waits for no write-back. A restart maps the snapshot and replays the chain, by
// hash, to the committed version. Now and then a thread of its own writes a newer
// snapshot (the old one copied at a bounded rate, the chain applied to the copy)
// and switches to it with one atomic rename. Under a simulated runtime
// (common/runtime.h) that build is a chain of timers on a queue of the runtime,
// one step at a time (the chain applied; each block written, at the paced rate in
// simulated time; the folder sealed and renamed; the switch), so a run replays
// from its seed and faults land between the steps.
//
// Layout, in DIR/.deltacast/ beside the node's journal:
//   snapshot          "snapshot <version hex>": the current snapshot (WriteFileAtomic)
//   snapshots/<hex>/  a checkpoint directory at that version, never written once
//                     named; its own .deltacast/manifest.bin caches its manifest.
//                     The first one hard-links DIR's files, which stay as given.
//   snapshots/<hex>.building/  a snapshot being built (removed on open)
//   chain/            relay/store/delta_history.h: delta-<target>.spool and `history`
//
// Thread safety: Keep, MaybeBuild and SnapshotFrom from one thread (the node's apply
// thread); the build runs on its own thread (simulated: the runtime's one thread);
// stats() from any thread.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "apply/checkpoint_dir.h"
#include "apply/replica.h"
#include "codec/manifest.h"
#include "common/hash.h"
#include "common/runtime.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "relay/store/delta_history.h"
#include "relay/wire/protocol.h"
#include "topology/cluster_config.h"

namespace deltacast::relay {

struct SnapshotPolicy {
  uint32_t every = topology::kDefaultSnapshotEvery;  // refits in the chain; 0: no limit
  uint32_t chain_percent = topology::kDefaultSnapshotChainPercent;  // of the model; 0: none
  uint64_t rate = topology::kDefaultSnapshotRate;  // bytes/s a build copies and flushes; 0: any
  bool background = true;  // false: builds only when asked (BuildNow), for tests
  // How much a build writes between two looks at the clock (and at Stop). The
  // simulator's models are small: it uses small blocks so a build spans many steps.
  uint64_t block_bytes = uint64_t{8} << 20;
};

class SnapshotStore {
 public:
  struct Stats {
    uint64_t snapshots_built = 0;
    uint64_t snapshot_bytes_written = 0;  // by builds (copies and flushes)
    double last_build_seconds = 0;
    Digest128 snapshot;  // the current snapshot's version
    size_t chain_links = 0;
    uint64_t chain_bytes = 0;
  };
  struct Opened {
    std::unique_ptr<apply::Replica> replica;
    // Shared: the node's store drives it, its opener may watch it (tests, bench).
    std::shared_ptr<SnapshotStore> store;
  };

  // Opens checkpoint directory `dir` as a snapshot store: the first time, its files
  // become the first snapshot (hard links); then the snapshot is mapped privately and
  // the committed chain replayed (each link verified by hash to its target). A
  // commit cut short between a snapshot switch and the active version is finished.
  // Errors: those of opening a checkpoint (ReadCheckpointLayout); kFailedPrecondition
  // for an in-place store with a delta in flight or a commit not written back
  // (finish it in place first); kCorrupt when the snapshot and the chain do not reach
  // the committed version (a chain file lost), naming both.
  static Result<Opened> Open(const std::filesystem::path& dir, uint64_t partition_bytes,
                             size_t threads, SnapshotPolicy policy);

  // Whether `dir` is a snapshot store (its snapshot pointer exists).
  static bool IsSnapshotStore(const std::filesystem::path& dir);

  // The committed version of snapshot store `dir`, rebuilt in memory: the snapshot
  // mapped privately and the chain replayed (a delta in flight is not). Nothing of
  // `dir` is written but, where it is stale (the folder was copied), the snapshot's
  // manifest cache. `manifest` gets its manifest. For materialize, verify, audit.
  static Result<std::unique_ptr<apply::CheckpointDirStore>> OpenCommitted(
      const std::filesystem::path& dir, uint64_t partition_bytes, size_t threads,
      codec::Manifest& manifest);

  // Writes `weights` (a kPrivate store over `weights.dir()`'s files) as checkpoint
  // directory `out`: every file of weights.dir() (config, index: byte for byte) with
  // the tensor bytes from memory, each file fsynced, at most `rate` bytes/s (0: any).
  // `out` must not exist or be empty. Returns the bytes written.
  static Result<uint64_t> WriteDirectory(const apply::CheckpointDirStore& weights,
                                         const std::filesystem::path& out, uint64_t rate);

  ~SnapshotStore();  // Stop()
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // The commit path, before the active version flips: keeps `spool_file` (every chunk
  // of committed delta `link`, END included) in the chain, durably. Then the version
  // can be rebuilt from disk.
  Status Keep(const std::filesystem::path& spool_file, const ChainLink& link);
  // After a commit to `committed`: starts a build in the background if the policy
  // asks for one and none is running. Never blocks on the disk.
  void MaybeBuild(const Digest128& committed);
  // Builds a snapshot at `committed` now, on the calling thread (tests). Simulated,
  // its steps run back to back, in no simulated time.
  Status BuildNow(const Digest128& committed);
  // A commit the chain cannot describe (a catch-up by partitions): writes `live`, the
  // weights at `manifest`'s version, as the new snapshot now and switches to it,
  // before the commit. O(model), on the caller's thread; waits for a running build.
  Status SnapshotFrom(const apply::CheckpointDirStore& live, const codec::Manifest& manifest);
  // Waits for a running build to finish. Simulated, runs its remaining steps now
  // (as WriteBack::Join does), in no simulated time.
  void WaitForBuild();
  // Stops a running build (its folder is removed on the next open) and joins it.
  // Simulated, drops it where it stands, as a dying process would.
  void Stop();
  Stats stats() const;
  // Whether a build is running. Takes no lock: callable from a crash point passed
  // with the store's mutex held (the simulator's).
  bool building() const { return building_.load(); }

 private:
  SnapshotStore(std::filesystem::path dir, uint64_t partition_bytes, size_t threads,
                SnapshotPolicy policy, Digest128 snapshot, uint64_t model_bytes);
  std::filesystem::path SnapshotDir(const Digest128& version) const;
  // A build's state between its steps (snapshot_store.cc).
  struct BuildJob;
  // Runs the next step of `job`: the chain up to its target applied to a private
  // mapping of the current snapshot; one block of it written beside it; the folder
  // sealed and renamed; the switch. Returns when the next step may run (the paced
  // rate), or nullopt once the build is done.
  Result<std::optional<RuntimeClock::time_point>> BuildStep(BuildJob& job);
  // Runs every step of `job` on this thread, sleeping to the paced rate (simulated:
  // not at all).
  Status RunBuild(BuildJob& job);
  // Simulated: the step of build `generation` at `at`, on queue_.
  void PostStep(uint64_t generation, RuntimeClock::time_point at);
  void EndSimBuild(const Status& status);
  // Names `version`'s folder (complete, fsynced) the snapshot, then drops the chain
  // before it and the old folder (unless the live weights map it).
  Status Switch(const Digest128& version);

  const std::filesystem::path dir_;  // the store's directory (its .deltacast/ holds the rest)
  const uint64_t partition_bytes_;
  const size_t threads_;
  const SnapshotPolicy policy_;
  const uint64_t model_bytes_;
  const Digest128 mapped_;  // the snapshot the live weights map (opened with the store)
  DeltaHistory chain_;
  mutable Mutex mu_;
  Digest128 snapshot_ GUARDED_BY(mu_);  // mu_
  Stats stats_ GUARDED_BY(mu_);         // mu_
  std::thread build_;
  std::atomic<bool> building_{false};
  std::atomic<bool> stop_{false};
  // Simulated (null without a runtime): the build's queue and the running build.
  Runtime* const sim_;
  uint64_t queue_ = 0;
  std::unique_ptr<BuildJob> job_;
  uint64_t generation_ = 0;  // of job_: a step posted for an older one does nothing
};

// Opens a receiver's checkpoint directory as its [[node]] `checkpoint` says: in
// place (apply::Replica::OpenCheckpointDir; no snapshot store) or as a snapshot
// store with the node's snapshot_* policy.
Result<SnapshotStore::Opened> OpenNodeCheckpoint(const std::filesystem::path& dir,
                                                 const topology::NodeConfig& node,
                                                 uint64_t partition_bytes, size_t threads);

}  // namespace deltacast::relay
