// NodeStore: a relay node's replica, driven on its own apply thread. Every change
// to the node's weights (begin, apply, finish, repair, commit, roll back, catch up)
// and every read of them for a child runs there, in the order it was asked for;
// each completion is posted back to the node's event loop. So applying never
// blocks the loop that forwards chunks, and the replica has exactly one driver.
//
// Owns: the replica, the apply thread, the applier of the refit in progress and the
// applier of a catch-up in progress. The node's loop thread keeps a mirror of the
// replica's journal (Journal), refreshed after every change.
//
// Thread safety: call from the node's loop thread; completions run on it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "apply/replica.h"
#include "codec/chunk.h"
#include "codec/manifest.h"
#include "relay/event_loop.h"
#include "relay/protocol.h"
#include "relay/spool.h"
#include "transport/transport.h"

namespace deltacast::relay {

struct CommitEvent;

class NodeStore {
 public:
  // What the replica's journal says, mirrored for the loop thread (HELLO, catch-up).
  struct Journal {
    Digest128 version;
    std::optional<apply::InflightDelta> inflight;
    bool prepared = false;
    std::set<uint32_t> applied;
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
    std::vector<Fetch> torn;  // END only: torn partitions to fetch literally (no ids)
  };
  using Done = std::function<void(const Status&)>;
  using Outcome = std::function<void(const Status&, const Digest128& version)>;

  // `loop` is the node's loop: every completion is posted there. `on_journal` gets
  // the mirror after every change; `on_commit` runs on the apply thread after a
  // refit commits.
  NodeStore(std::unique_ptr<apply::Replica> replica, size_t apply_threads, EventLoop& loop,
            std::function<void(const Journal&)> on_journal,
            std::function<void(const CommitEvent&)> on_commit);
  ~NodeStore();  // Stop()
  void Start();
  // Runs what was asked, then joins the apply thread. Idempotent.
  void Stop();
  Journal journal() const;  // the replica's journal now; call before Start only

  // ---- the refit ---------------------------------------------------------
  // Starts (or resumes) applying refit `id`'s delta; a replica already at the
  // target with nothing in flight needs nothing and is prepared at END.
  // `manifest_digest` (all zero: none) is BEGIN's SHA-256 of the target manifest:
  // END's verification fails unless the derived manifest has it.
  void BeginRefit(uint64_t id, const codec::DeltaIdentity& identity,
                  const std::array<uint8_t, 32>& manifest_digest, Done done);
  // Applies one chunk of refit `id` after making `spool` durable (a chunk is on disk
  // before it changes a partition). The END chunk verifies the whole delta and
  // journals PREPARED, or returns the torn partitions.
  void ApplyChunk(uint64_t id, uint32_t sequence, transport::Message message,
                  std::shared_ptr<Spool> spool, std::function<void(const ApplyResult&)> done);
  // Writes a torn partition's literal target bytes; once none is torn and END came,
  // verifies the delta as ApplyChunk(END) does.
  void Repair(uint64_t id, apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
              std::function<void(const ApplyResult&)> done);
  // Commits refit `id`'s verified target; then on_commit.
  void Commit(uint64_t id, Outcome done);
  // Commits a delta left in flight by an earlier run that journaled PREPARED: only
  // if the store hashes exactly to its target.
  void CommitPrepared(Outcome done);
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

  // ---- catch-up ----------------------------------------------------------
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
  void DropCatchUp();

  // ---- reads for children ------------------------------------------------
  // The bytes of a partition if the store holds them at the wanted hash.
  void FindPartition(Fetch fetch, std::function<void(std::optional<std::vector<std::byte>>)> done);

 private:
  struct RefitState;
  ApplyResult ApplyOne(uint64_t id, uint32_t sequence, const transport::Message& message);
  ApplyResult FinishRefit();
  void PostJournal();
  template <typename F>
  void Reply(F f) {
    loop_.Post(std::move(f));
  }

  std::unique_ptr<apply::Replica> replica_;
  size_t apply_threads_;
  EventLoop& loop_;
  std::function<void(const Journal&)> on_journal_;
  std::function<void(const CommitEvent&)> on_commit_;
  // Apply-thread state.
  std::unique_ptr<RefitState> refit_;
  std::unique_ptr<apply::DeltaApplier> catch_up_applier_;
  // Declared last: stopped before the state it uses goes away.
  EventLoop apply_loop_;
};

}  // namespace deltacast::relay
