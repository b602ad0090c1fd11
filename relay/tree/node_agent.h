// NodeAgent: one inference node of the relay tree. It listens for its children,
// joins its parent, and for each refit: receives chunks, forwards each to its
// children the moment it has it (the very buffer, cut-through), applies it to its
// replica on an apply thread, grants its parent credit as chunks are released,
// reports PREPARED once it and its whole subtree verified the target, and takes
// part in the two-phase commit (docs/protocol.md).
//
// This is the public embedding API for receivers: give it a Replica over your own
// buffers (apply::Replica::ForStore) and a commit callback.
//
// Thread safety: Start/Stop from one thread; stats() from any thread. Callbacks run
// on the agent's apply thread.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apply/replica.h"
#include "common/hash.h"
#include "common/status.h"
#include "relay/store/node_store.h"
#include "relay/tree/commit_record.h"
#include "relay/tree/join_check.h"
#include "relay/wire/signing.h"
#include "topology/cluster_config.h"
#include "transport/transport.h"

namespace deltacast::topology {
struct StripedPlan;  // topology/stripe_plan.h
}  // namespace deltacast::topology

namespace deltacast::relay {

struct CatchUpProgress;

using CommitCallback = std::function<void(const CommitEvent&)>;  // node_store.h

struct NodeAgentOptions {
  topology::ClusterConfig config;
  std::string node_id;
  std::string token;         // the cluster's shared secret
  size_t apply_threads = 0;  // 0 = all cores
  CommitCallback on_commit;  // optional
  // Where the agent spools the chunks it receives (replays to children that
  // rejoin, rollback from the records themselves); empty = a per-process
  // directory under the system temporary directory. Give a checkpoint directory's
  // agent a path inside it, so the spool survives a restart with the store.
  std::filesystem::path spool_dir;
  // The source's Ed25519 public key ([security] verify_key): with it, the node
  // applies and commits only what the source signed (BEGIN, every CHUNK, COMMIT and
  // ABORT) and refuses the rest; null: nothing is checked.
  std::shared_ptr<const VerifyKey> verify_key;
  // How long after a commit the store's pages are written back (docs/recovery.md,
  // "Durability"); the next refit starts a pending write-back at once. Tests use a
  // long delay to leave a commit's pages unflushed, as a machine crash finds them.
  std::chrono::milliseconds write_back_delay{0};
  // Called around every write to the weights (NodeStore, EngineHooks): an engine
  // serving from them pauses; with [[node]] apply = "staged" that is only the
  // commit's apply.
  EngineHooks engine_hooks;
  // The replica's snapshot store, when it was opened as one (SnapshotStore::Open:
  // [[node]] checkpoint = "snapshot"); null: in place, or a store without files.
  std::shared_ptr<SnapshotStore> snapshots;
  // How a catch-up to a version this node missed is coming along (relay/tree/catch_up.h);
  // on the node's loop thread, so it must not block. Optional.
  std::function<void(const CatchUpProgress&)> on_catch_up_progress;
  // The commit record store ([coordination]; docs/recovery.md, "The commit record"):
  // a node whose refit has had no decision for `source_timeout` reads the refit's
  // record every `poll_interval` and follows a record that names its refit, base and
  // target, as it would its parent's decision (a record is trusted through the store's
  // TLS and authentication, not the source's signature). Shared with whoever else
  // uses the store in the process. Null: the node waits for its parent, as before.
  std::shared_ptr<CommitRecordStore> commit_records;
  std::chrono::milliseconds source_timeout{10'000};
  std::chrono::milliseconds poll_interval{1'000};
  // Called as the node reports a refit's outcome up (committed or aborted; the
  // simulator's checks compare it with the record). On the loop thread. Optional.
  std::function<void(uint64_t refit_id, const Digest128& target, bool committed)> on_outcome;
};

struct NodeAgentStats {
  uint64_t refits_committed = 0;
  uint64_t refits_aborted = 0;
  uint64_t chunks_received = 0;
  uint64_t chunk_bytes_received = 0;  // CHUNK payload bytes, replays included
  // CHUNK bytes this node already had when they came: listed as applied in its
  // HELLO, or received before on the same parent link during the same refit.
  // Sent for nothing; a correct parent never does it.
  uint64_t chunk_bytes_resent = 0;
  uint64_t peak_held_bytes = 0;  // most chunk bytes held at once (received, not yet released)
  uint64_t partitions_repaired = 0;
  // BEGINs of the delta this node held in flight, streamed anew (a restarted root):
  // it rolled back what it applied of the lost stream first (docs/protocol.md,
  // "Chunk identity").
  uint64_t stream_rollbacks = 0;
  // Deltas held in flight from before a restart, settled (committed, caught up to
  // or rolled back) from the commit record because no parent decided them within
  // source_timeout (docs/recovery.md, "The commit record").
  uint64_t held_settled_from_record = 0;
  uint64_t parent_joins = 0;  // times it joined a parent (1 + reconnects)
  // Per stripe s (one entry when not striped; docs/protocol.md, "Stripes"): the
  // CHUNK messages that came on its parent link (data and END, replays included),
  // the bytes of those this node had already (as chunk_bytes_resent), and the times
  // it joined that stripe's parent.
  std::vector<uint64_t> stripe_chunks;
  std::vector<uint64_t> stripe_chunk_bytes_resent;
  std::vector<uint64_t> stripe_parent_joins;
  // Requests up the tree (FETCH, catch-up's requests, its children's routed up) sent
  // on each stripe's parent link, and of them, those sent again because the link they
  // went on first dropped.
  std::vector<uint64_t> stripe_up_requests;
  uint64_t up_requests_resent = 0;
  uint64_t partitions_caught_up = 0;  // overwritten to reach a version this node missed
  uint64_t deltas_caught_up = 0;      // kept deltas applied to reach such a version
  uint64_t catch_up_bytes = 0;
  // Restarts that found the last commit's writes possibly lost and mended the store
  // (docs/recovery.md, "Durability"), and the partitions fetched for that (the rest
  // came back from the spool).
  uint64_t stores_recovered = 0;
  uint64_t partitions_recovered = 0;
  // The last refit (committed or aborted): how long the engine was paused for its
  // writes (NodeStore::CommitTimes), and how long this node held a prepared delta
  // before the decision came.
  double last_pause_seconds = 0;
  double last_prepared_hold_seconds = 0;
  double pause_seconds_total = 0;
  // The last commit's writes are not all known to be on disk yet (its write-back
  // is pending or running, or a restart has yet to reconcile it).
  bool store_unflushed = false;
  // The store is being mended to `version` (a crash tore it, or a commit was made
  // ahead of its bytes): its bytes are not all at it yet, and it confirms nothing.
  bool store_mending = false;
  Digest128 version;
};

class NodeAgent {
 public:
  // Starts listening on the node's configured address and joining its parent.
  // Returns once listening; fails if the node is unknown or not a receiver, or the
  // address cannot be bound.
  static Result<std::unique_ptr<NodeAgent>> Start(NodeAgentOptions options,
                                                  std::unique_ptr<apply::Replica> replica,
                                                  std::unique_ptr<transport::Transport> transport);
  // The same along a plan given (every stripe's tree) instead of the config's
  // (PlanStripes): for tests that need a tree of a given shape. The source and every
  // agent must be given the same plan, over the config's nodes.
  static Result<std::unique_ptr<NodeAgent>> Start(NodeAgentOptions options,
                                                  std::unique_ptr<apply::Replica> replica,
                                                  std::unique_ptr<transport::Transport> transport,
                                                  const topology::StripedPlan& plan);
  ~NodeAgent();  // Stop()
  // Closes every link and joins the agent's threads. Idempotent.
  void Stop();
  NodeAgentStats stats() const;
  const std::string& listen_address() const;
  // What joining the parent found (relay/tree/join_check.h): waits until the first
  // version check is done or the parent refused this node, at most `timeout`.
  JoinCheck::State WaitForJoin(std::chrono::milliseconds timeout) const;
  // Hashes the weights now and compares them with the active version (NodeStore::
  // Verify); blocks. Not from a callback of this agent.
  Result<NodeStore::Check> Verify();

  class Impl;

 private:
  explicit NodeAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::relay
