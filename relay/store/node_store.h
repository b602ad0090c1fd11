// NodeStore: a relay node's replica, driven from its own apply thread. Every change
// to the node's weights (begin, apply, finish, repair, commit, roll back, catch up,
// reconcile) and every read of them for a child is ordered there, in the order it
// was asked for; each completion is posted back to the node's event loop. So
// applying never blocks the loop that forwards chunks, and the replica has exactly
// one driver.
//
// Data chunks of the refit are the exception to one-at-a-time: the apply thread
// hands each to a pool of apply workers (niced below the event loops, so
// forwarding gets the CPU first), where chunks apply side by side (the applier
// keeps each partition to one record at a time) and share the workers for their
// records. Anything else waits for the chunks in flight first, so it sees the
// effect of every chunk asked for before it.
//
// Durability (docs/recovery.md, "Durability"): a chunk is fsynced into the spool
// before it is applied and journaled as applied after, with no flush of the store;
// PREPARED flushes nothing either. After a commit the store is written back on a
// thread of its own (WriteBack) while the journal notes it unflushed; the next
// refit waits for that write-back before it writes. After a restart that found the
// note, Reconcile brings the store back to the committed version; a resumed delta
// re-applies its journaled chunks from the spool (their writes may be lost too).
//
// Staged apply (Options::mode, docs/serving.md): chunks are spooled, checked and
// decoded as they come (DeltaApplier::StageChunk), nothing is written, and PREPARED
// means this node holds a verified delta from its base to the target. Commit then
// pauses the engine (EngineHooks), writes the held records, verifies them, commits
// and resumes it. Any other write to the weights (catch-up, rollback of a delta a
// restart found applied, recovery) also runs between the hooks. The journal is the
// one of apply-on-arrival (a chunk journaled is durable in the spool and need not be
// sent again), so a restart at any point recovers as there: a prepared delta is
// committed from the spool by hash (CommitPrepared, then Reconcile), an aborted one
// reverted by hash.
//
// Owns: the replica, the apply thread and workers, the hook thread, the write-back, the applier of
// the refit in progress, of a catch-up, and of a reconcile. The node's loop thread
// keeps a mirror of the replica's journal (Journal), refreshed after every change.
//
// Thread safety: call from the node's loop thread; completions run on it.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "apply/replica.h"
#include "codec/chunk.h"
#include "codec/manifest.h"
#include "codec/manifest_diff.h"
#include "common/event_loop.h"
#include "common/hash.h"
#include "common/parallel.h"
#include "common/thread_annotations.h"
#include "relay/store/spool.h"
#include "relay/store/write_back.h"
#include "relay/wire/protocol.h"
#include "topology/cluster_config.h"
#include "transport/transport.h"

namespace deltacast::relay {

// What a node's user is told once a version is active (NodeAgentOptions::on_commit).
struct CommitEvent {
  uint64_t refit_id = 0;
  Digest128 version;                         // now active
  std::vector<std::string> changed_tensors;  // canonical names, sorted
};

class SnapshotStore;

// What an inference engine serving from the node's weights is told around every
// write to them (staged apply: the commit's apply; apply-on-arrival: from a
// refit's first write to its commit or rollback). Both run on the node's hook
// thread, one at a time, never together with a write. `pause` returns once the engine
// no longer reads the weights (an error: nothing is written and the commit fails
// here); `resume` once they are whole again, at one version. A pause that has not
// returned within `timeout` fails the write the same way; `resume` then runs
// after it returns, so the engine is never left paused by a late pause.
struct EngineHooks {
  std::function<Status()> pause;
  std::function<void()> resume;
  std::chrono::milliseconds timeout{10'000};
};

class NodeStore {
 public:
  // A received chunk on its way to the apply workers, its checksums verified on
  // arrival (so the apply parses the buffer without hashing its payload again:
  // codec::ParseVerifiedChunk). The node keeps its buffer only while it still
  // forwards it (which credit bounds); once it drops it, the worker reads the chunk
  // back from the spool (and checks it whole). So however far applying lags, the
  // apply path holds at most the credit window of chunks plus the ones being
  // applied (one per worker), and a slow apply never holds back the children.
  class ChunkSlot {
   public:
    ChunkSlot(transport::Message message, codec::ChunkKind kind)
        : message_(std::move(message)), kind_(kind) {}
    // The buffer, or null once dropped.
    transport::Message Take() const {
      MutexLock lock(mu_);
      return message_;
    }
    void Drop() {
      MutexLock lock(mu_);
      message_.reset();
    }
    codec::ChunkKind kind() const { return kind_; }

   private:
    mutable Mutex mu_;
    transport::Message message_ GUARDED_BY(mu_);
    const codec::ChunkKind kind_;
  };

  // What the replica's journal says, mirrored for the loop thread (HELLO, catch-up).
  struct Journal {
    Digest128 version;
    std::optional<apply::InflightDelta> inflight;
    bool prepared = false;
    std::set<uint32_t> applied;
    // The last commit's writes may not all be on disk (its write-back has not
    // finished); with needs_reconcile they were not checked since a restart.
    std::optional<apply::InflightDelta> unflushed;
    bool needs_reconcile = false;
  };
  // What applying one chunk of the refit (or a repair) left behind.
  struct ApplyResult {
    Status status;
    uint32_t sequence = 0;
    bool end = false;  // the END chunk: the delta was verified (or torn, below)
    // The chunk failed the applier's check before write (well-formed, wrong records):
    // nothing of it was written; it is fetched again like a damaged one.
    bool refused = false;
    bool chunk_applied = false;  // a data chunk went through the applier
    bool repaired = false;       // a torn partition was written
    uint64_t applied = 0;        // partitions applied, once verified
    double seconds = 0;
    // How the apply thread spent `seconds` (common/thread_time.h): on a CPU, waiting
    // for one, and blocked (the spool's fsync, writes the kernel held back to write
    // dirty pages to disk, the journal).
    double cpu_seconds = 0;
    double runnable_seconds = 0;
    double blocked_seconds = 0;
    // END only: the applier's totals (apply::ApplyReport), and the final check of
    // the whole delta against the target manifest.
    double check_seconds = 0;
    double write_seconds = 0;
    double finish_seconds = 0;
    std::vector<Fetch> torn;  // END only: torn partitions to fetch literally (no ids)
  };
  using Done = std::function<void(const Status&)>;
  using Outcome = std::function<void(const Status&, const Digest128& version)>;

  struct Options {
    size_t apply_threads = 1;  // >= 1
    // Where the node spools chunks (NodeAgentOptions::spool_dir): read to re-apply
    // a delta's chunks after a restart.
    std::filesystem::path spool_dir;
    // How long after a commit its write-back starts (WriteBack).
    std::chrono::milliseconds write_back_delay{0};
    topology::ApplyMode mode = topology::ApplyMode::kOnArrival;
    uint64_t staged_memory = topology::kDefaultStagedMemory;  // decoded records and chunks held
    EngineHooks hooks;
    // A snapshot store's (relay/store/snapshot_store.h; the replica's weights are then its
    // private mapping): a commit keeps the delta's spool in its chain instead of
    // writing the weights back. Null: in place, or a store without files.
    std::shared_ptr<SnapshotStore> snapshots;
  };
  // What a commit's write took: the engine paused (hooks given or not: the time
  // the weights were being written, between the hooks where there are hooks).
  struct CommitTimes {
    double pause_seconds = 0;
  };
  using CommitDone =
      std::function<void(const Status&, const Digest128& version, const CommitTimes&)>;
  // `loop` is the node's loop: every completion is posted there. `on_journal` gets
  // the mirror after every change; `on_commit` runs on the apply thread after a
  // refit commits.
  NodeStore(std::unique_ptr<apply::Replica> replica, Options options, EventLoop& loop,
            std::function<void(const Journal&)> on_journal,
            std::function<void(const CommitEvent&)> on_commit);
  ~NodeStore();  // Stop()
  void Start();
  // Runs what was asked, then joins the apply thread and workers. A write-back
  // still running is waited for; one still waiting out its delay is dropped (the
  // journal keeps noting the store unflushed). Idempotent.
  void Stop();
  Journal journal() const;  // the replica's journal now; call before Start only

  // ---- the refit ---------------------------------------------------------
  // Starts (or resumes) applying refit `id`'s delta; a replica already at the
  // target with nothing in flight needs nothing and is prepared at END. Waits for
  // the last commit's write-back first. A resumed delta's journaled chunks are
  // applied again from `spool` (by hash: what is at target is skipped).
  // `manifest_digest` (all zero: none) is BEGIN's SHA-256 of the target manifest:
  // END's verification fails unless the derived manifest has it.
  void BeginRefit(uint64_t id, const codec::DeltaIdentity& identity,
                  const std::array<uint8_t, 32>& manifest_digest, std::shared_ptr<Spool> spool,
                  Done done);
  // Applies one chunk of refit `id` after making `spool` durable (a chunk is on disk
  // before it changes a partition); `chunk` must already be appended to `spool`,
  // from which it is read back if its buffer was dropped. The END chunk verifies the
  // whole delta and journals PREPARED, or returns the torn partitions.
  void ApplyChunk(uint64_t id, uint32_t sequence, std::shared_ptr<ChunkSlot> chunk,
                  std::shared_ptr<Spool> spool, std::function<void(const ApplyResult&)> done);
  // Writes a torn partition's literal target bytes; once none is torn and END came,
  // verifies the delta as ApplyChunk(END) does.
  void Repair(uint64_t id, apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
              std::function<void(const ApplyResult&)> done);
  // Commits refit `id`'s verified target; then on_commit. Staged: pauses the
  // engine, writes the held delta, verifies it and commits, resumes the engine; if
  // the engine does not pause, nothing is written and the delta stays held for
  // another Commit(id) (until the next BeginRefit or DropRefit).
  void Commit(uint64_t id, CommitDone done);
  // Commits a delta left in flight by an earlier run that journaled PREPARED. If the
  // store hashes to its target, at once; if writes were lost with the machine, the
  // commit is made ahead of the bytes (the version is durable by the spool) and the
  // journal then asks for a reconcile.
  void CommitPrepared(Outcome done);

  // ---- reconcile -----------------------------------------------------------
  // After a restart whose journal noted the last commit unflushed (needs_reconcile):
  // hashes the store, applies that delta's chunks again from the spool, and returns
  // the partitions that still differ from the committed version (to fetch by hash:
  // RepairReconciled). With none left it finishes: the store is flushed and the
  // note cleared. kFailedPrecondition if the committed manifest is not cached.
  void Reconcile(std::function<void(const Status&, std::vector<Fetch>)> done);
  // Writes one partition's bytes (verified against `hash` first); `finished` once
  // none differs (the reconcile is over).
  void RepairReconciled(apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
                        PartitionHash hash, std::function<void(const Status&, bool finished)> done);
  // Forgets the refit in progress (nothing is undone).
  void DropRefit();

  // ---- rollback ----------------------------------------------------------
  // Reverts the delta in flight to its base: the in-memory undo of this run, then
  // the records in `spool`; the partitions neither can restore are returned, to be
  // fetched (WriteBase) before FinishRollback.
  void Revert(std::shared_ptr<Spool> spool,
              std::function<void(Result<std::vector<apply::DeltaApplier::NeedsBase>>)> done);
  void WriteBase(apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
                 PartitionHash hash, Done done);
  // Clears the in-flight record once the whole store hashes to the base, unless
  // `prior` (a revert or base write that failed) says otherwise.
  void FinishRollback(Status prior, Outcome done);

  // ---- catch-up (node_store_catch_up.cc) ------------------------------------
  // Chain of kept deltas: begins (or resumes) `link`, reporting the chunks already
  // journaled; applies and journals one of its chunks; verifies and commits it.
  void BeginLink(const ChainLink& link,
                 std::function<void(const Status&, std::set<uint32_t>)> done);
  void ApplyLinkChunk(uint32_t sequence, std::shared_ptr<std::vector<std::byte>> message,
                      std::function<void(const Status&, std::optional<codec::DeltaSummary>)> done);
  void FinishLink(codec::DeltaSummary summary, Done done);
  // Partitions that differ: journals a catch-up to `target` and lists what to fetch;
  // writes one verified partition; commits once the store hashes to the target.
  void BeginCatchUp(codec::Manifest target,
                    std::function<void(const Status&, std::vector<apply::CatchUpPartition>)> done);
  void WriteCatchUp(apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
                    PartitionHash hash, Done done);
  void CommitCatchUp(Done done);
  // Ends a catch-up that did not commit. One by partitions that began on a settled
  // store with nothing in flight and wrote no partition leaves it as it was: the
  // in-flight record cleared and the engine resumed. Otherwise what it wrote stays in
  // flight and the engine paused, until a catch-up or refit that succeeds.
  void DropCatchUp();

  // ---- checks (node_store_checks.cc) ---------------------------------------
  // What the store's active version is checked as, and how it differs.
  struct Check {
    Digest128 version;  // the active version
    uint64_t tensors = 0;
    uint64_t partitions = 0;
    codec::ManifestDiff diff;
  };
  // The active version and its serialized manifest; no manifest (null) while a
  // delta or catch-up is in flight (the bytes are then a mix of versions).
  void ActiveManifest(
      std::function<void(Digest128, std::shared_ptr<const std::vector<std::byte>>)> done);
  // How the active version's manifest (hashed when the node opened or last
  // committed) differs from `reference`, a parent's: what a node that joins reports.
  void CompareWith(codec::Manifest reference, std::function<void(Result<Check>)> done);
  // Hashes every partition now and compares with the active version's manifest:
  // the audit of what landed (Node::Verify). kFailedPrecondition while a delta or
  // catch-up is in flight.
  void Verify(std::function<void(Result<Check>)> done);

  // ---- reads for children ------------------------------------------------
  // The bytes of a partition if the store holds them at the wanted hash.
  void FindPartition(Fetch fetch, std::function<void(std::optional<std::vector<std::byte>>)> done);

 private:
  struct RefitState;
  struct ReconcileState;
  // Apply thread: a data chunk goes to the workers; anything else runs here.
  void DispatchChunk(uint64_t id, uint32_t sequence, std::shared_ptr<ChunkSlot> chunk,
                     std::shared_ptr<Spool> spool, std::function<void(const ApplyResult&)> done);
  // A data chunk's message and the view of it.
  struct TakenChunk {
    transport::Message message;
    codec::ChunkView view;
  };
  static Result<TakenChunk> TakeChunk(const ChunkSlot& chunk, uint32_t sequence, Spool* spool);
  // A worker: makes the spool durable, writes (on arrival) or stages one data chunk,
  // and journals it.
  ApplyResult ApplyData(apply::DeltaApplier& applier, uint32_t sequence, const ChunkSlot& chunk,
                        Spool* spool);
  bool WriteChunk(apply::DeltaApplier& applier, uint32_t sequence, const TakenChunk& chunk,
                  ApplyResult& result);
  ApplyResult FinishRefit();
  // node_store_staged.cc. Checks and decodes one data chunk without writing, and
  // holds it for the commit.
  bool StageChunk(apply::DeltaApplier& applier, uint32_t sequence, const TakenChunk& chunk,
                  ApplyResult& result);
  // Apply thread, at a staged commit: writes every held chunk, returns the target
  // the store verified at (or an error; torn partitions: the commit goes ahead of
  // the bytes and Reconcile mends them).
  Status ApplyStaged();
  // Apply thread: runs the engine's pause hook (once: a paused engine stays paused
  // until ResumeEngine) before a write to the weights; returns how long it is
  // paused on ResumeEngine. `store_at_target`: a staged delta in flight was written
  // and verified, so the engine may serve before the commit is journaled.
  Status PauseEngine();
  double ResumeEngine(bool store_at_target = false);
  // Runs `hook` on the hook thread, waiting at most the hooks' timeout.
  Status RunPauseHook();
  // Apply thread: waits until no data chunk is being applied.
  void WaitForChunks();
  // Apply thread: waits for the last commit's write-back and clears the journal's
  // note of it. An error (the flush failed) keeps the note.
  Status Settle();
  // node_store_snapshot.cc. Commits the refit's verified target: in place, noted
  // unflushed for the write-back; on a snapshot store, kept in the chain first.
  Status CommitDelta(const codec::Manifest& target);
  // Snapshot store: keeps the spool of the delta in flight in the chain (before
  // any commit of it). Nothing to do in place.
  Status KeepInflightDelta();
  // Snapshot store: a commit the chain cannot describe (a catch-up) writes the
  // weights, at `target`, as the new snapshot first. Nothing to do in place.
  Status SnapshotBeforeCommit(const codec::Manifest& target);
  // The same for a catch-up by partitions, once the weights hash to its target.
  Status SnapshotBeforeCatchUpCommit();
  apply::ApplyOptions RefitOptions() const;
  void PostJournal();
  template <typename F>
  void Reply(F f) {
    loop_.Post(std::move(f));
  }

  std::unique_ptr<apply::Replica> replica_;
  Options options_;
  EventLoop& loop_;
  std::function<void(const Journal&)> on_journal_;
  std::function<void(const CommitEvent&)> on_commit_;
  // Apply-thread state (workers read refit_ while their chunks run; it changes only
  // when none does).
  std::unique_ptr<RefitState> refit_;
  std::unique_ptr<apply::DeltaApplier> catch_up_applier_;
  // The catch-up by partitions began on the committed version, nothing in flight,
  // and has written nothing yet (DropCatchUp).
  bool catch_up_untouched_ = false;
  std::unique_ptr<ReconcileState> reconcile_;
  WriteBack write_back_;
  // The replica's journal and refit_->changed_tensors, which workers update.
  mutable Mutex journal_mu_;
  Mutex chunks_mu_;
  CondVar chunks_done_;
  size_t chunks_in_flight_ GUARDED_BY(chunks_mu_) = 0;
  // The refit whose END came while a refused chunk was still to be fetched again
  // (0: none): its delta is verified once that chunk applies, which may come after
  // the END on a new link. Read by workers.
  std::atomic<uint64_t> end_waits_for_refused_{0};
  std::unique_ptr<WorkerPool> workers_;
  // Staged apply: what the held chunks may take (decoded records and chunk buffers).
  std::atomic<int64_t> staged_budget_{0};
  Mutex staged_mu_;             // RefitState::staged, which workers fill
  bool engine_paused_ = false;  // apply thread
  std::chrono::steady_clock::time_point paused_at_;
  // Runs the engine hooks, so a hook that hangs holds up only itself.
  EventLoop hook_loop_;
  // Declared last: stopped before the state it uses goes away.
  EventLoop apply_loop_;
};

}  // namespace deltacast::relay
