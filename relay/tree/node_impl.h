// NodeAgent::Impl (private to relay/): one relay node's refit state machine, and the
// parts it wires together. The parts own their state: ParentLink (the link to the
// parent and rejoining), Downstream (links to children), RefitChildren (what the
// children did in this refit), UpRequests (requests up the tree: repair bytes,
// routed catch-up requests), CatchUp, Rollback, StoreRecovery (a store whose last
// commit's writes may be lost), NodeStore (the replica on the apply thread). What stays here is the
// refit as this node sees it: receive, forward, apply, prepare (node_refit.cc), and decisions and
// outcome (node_outcome.cc); node_agent.cc routes messages and ticks.
//
// Striped trees (docs/protocol.md, "Stripes"): one ParentLink and one Subtree per
// stripe (this node's parent and children in that stripe's tree); one Downstream
// (children of every stripe, by link key), one store, one spool. A chunk goes down
// only its own stripe's links; PREPARED and the outcome go up each stripe once that
// stripe's children have sent theirs; the decision is acted on at its first copy.
// Requests up the tree (repair, catch-up) go to a joined stripe's parent (UpLink:
// stripe 0's when joined), and move to another if their link drops. The join check
// follows the first stripe whose parent says ACTIVE_VERSION.
//
// Thread safety: all of it runs on loop_, but stats() (any thread, under stats_mu_).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "relay/store/node_store.h"
#include "relay/store/spool.h"
#include "relay/tree/catch_up.h"
#include "relay/tree/downstream.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/parent_link.h"
#include "relay/tree/rollback.h"
#include "relay/tree/store_recovery.h"
#include "relay/tree/subtree.h"
#include "relay/tree/up_link.h"
#include "relay/tree/up_requests.h"
#include "relay/wire/protocol.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"

namespace deltacast::relay {

class NodeAgent::Impl {
 public:
  using Clock = RuntimeClock;

  Impl(NodeAgentOptions options, std::unique_ptr<apply::Replica> replica,
       std::unique_ptr<transport::Transport> transport, topology::StripedPlan plan);
  ~Impl();  // Stop()
  Status Listen();
  void Stop();
  NodeAgentStats stats() const;
  const std::string& listen_address() const { return listen_address_; }
  const JoinCheck& join_check() const { return join_; }
  Result<NodeStore::Check> Verify();

 private:
  enum class Phase { kStreaming, kCommitting, kAborting, kDone };

  // One refit as this node sees it. Its children's part is in subtree_.
  struct Refit {
    uint64_t id = 0;
    Begin begin;
    codec::DeltaIdentity identity;
    Phase phase = Phase::kStreaming;
    Status local_error;  // why this node cannot reach the target
    bool local_prepared = false;
    bool end_received = false;  // the END chunk came: every chunk the parent sends came
    bool resolution = false;    // resolving an earlier refit's delta; there is no BEGIN
    // Committed, and reaching the target by a catch-up (the delta did not all come
    // here): neither prepared nor at the target until that ends.
    bool commits_by_catch_up = false;
    // A resolution's: the refit of this life that streamed the delta here and that it
    // ends (noted finished with it, so a lagging parent's replay of it is past).
    std::optional<uint64_t> resolves_refit;
    // Rolling back what another stream of the delta left in flight, before the
    // deferred BEGIN that streams it anew (RollBackAnotherStream).
    bool stream_rollback = false;
    bool prepared_sent = false;     // PREPARED went up on some stripe
    std::vector<char> prepared_on;  // per stripe: PREPARED went up there
    std::vector<char> outcome_on;   // per stripe: COMMITTED / ABORTED (or FAILED) went up there
    // The stripes whose END came. The END goes to the store only once every
    // stripe's has come (then every data chunk has).
    std::set<uint32_t> ends;
    // The stripes of which a chunk came that this node could not spool (a full
    // disk): a replay from its spool would lack it.
    std::set<uint32_t> unspooled;
    // The data chunks spooled and handed to the apply in this refit: this node's
    // whatever the journal this thread last saw says yet (MakeHello).
    std::set<uint32_t> data_taken;
    bool failed_sent = false;
    // The FAILED sent up (this node's or a child's): sent again on a replayed BEGIN,
    // as the link it went on may have dropped before it arrived.
    std::optional<Failed> failed;
    std::optional<MessageType> pending_decision;  // arrived before we had prepared
    // Decided by the commit record (the parent was silent): with signatures checked,
    // the children are not sent the unsigned decision; they read the record too.
    bool decided_by_record = false;
    // The decision as the source signed it, once this node has it: what it forwards
    // to its children and replays to those that rejoin.
    transport::Message decision_message;
    bool local_outcome_done = false;
    // Why the local commit or rollback failed (a full disk under `active`): then this
    // node says FAILED, not COMMITTED / ABORTED, and again on a replayed BEGIN.
    Status outcome_error;
    Clock::time_point start = Clock::now();
    Clock::time_point decided;
    Clock::time_point prepared_at;  // the local delta verified (PREPARED's half from here)
    double apply_seconds = 0;
    // The engine's pause for this refit's writes, and how long the prepared delta was
    // held before the decision (staged apply: the engine served all along).
    double pause_seconds = 0;
    double hold_seconds = 0;
    // The phases of this node's prepare, for PREPARED (NodeReport): BEGIN to END
    // received; the apply thread's CPU, waiting for a CPU and blocked time (summed
    // over chunks); the applier's check-before-write and write totals; the final
    // check against the target manifest.
    double receive_seconds = 0;
    double apply_cpu_seconds = 0;
    double apply_runnable_seconds = 0;
    double apply_blocked_seconds = 0;
    double check_seconds = 0;
    double write_seconds = 0;
    double finish_seconds = 0;
    uint64_t chunk_bytes = 0;
    uint64_t resent_bytes = 0;  // of chunk_bytes: chunks this node had already
    uint64_t chunks = 0;
    uint64_t partitions_applied = 0;
    uint64_t repair_bytes = 0;  // literal partition bytes fetched for torn partitions
    // Torn partitions (tensor, element) whose bytes are asked for and not yet come:
    // an END replayed on a rejoin finds them still torn, and must not ask twice (the
    // request is UpRequests' to send again; a second answer would repair a partition
    // that is no longer torn, and fail).
    std::set<std::pair<std::string, uint64_t>> repairs_asked;
    // Every chunk received, durably before it is applied: for replays to children
    // that rejoin, and so this node can roll the delta back from its own records.
    std::shared_ptr<Spool> spool;
  };

  // What the last HELLO said this node had applied, so chunks a parent sends
  // anyway are counted (stats_.chunk_bytes_resent).
  struct Claimed {
    Digest128 target;
    std::set<uint32_t> applied;
    uint64_t stream = 0;  // the stream that numbered them (0: not known)
  };

  // node_agent.cc: wiring.
  Downstream::Events DownstreamEvents();
  ParentLink::Events ParentEvents(uint32_t stripe);
  uint32_t stripes() const { return static_cast<uint32_t>(parents_.size()); }
  Subtree& subtree(uint32_t stripe) { return *subtrees_[stripe]; }
  template <typename F>
  void ForEachSubtree(F f) {
    for (auto& t : subtrees_) f(*t);
  }
  // Sends `bytes` up every stripe's parent link.
  void SendUpAll(const std::vector<std::byte>& bytes);
  // Grants the parent of `stripe` a window of credit for the current refit, once per
  // link and refit.
  void GrantWindow(uint32_t stripe);
  void Tick();
  Hello MakeHello(uint32_t stripe);
  void OnParentJoined(uint32_t stripe);
  void OnParentLost(uint32_t stripe, const Status& why);
  void OnParentMessage(uint32_t stripe, MessageType type, const transport::Message& message);
  // ACTIVE_VERSION from `stripe`'s parent: compares this node's weights with the
  // version that parent holds.
  void OnParentVersion(uint32_t stripe, ByteSpan bytes);
  // Whether a parent of any stripe but `except` is joined.
  bool OtherParentJoined(uint32_t except) const;
  UpLink MakeUpLink();
  // Tells a child that joined the version this node holds (its manifest if the
  // child's differs).
  void TellVersion(const std::string& child, const Hello& hello);
  // Why `child` is not here, for a FAILED: the refusal of its last HELLO, if any.
  void OnChildLost(const std::string& child);
  void OnChildMessage(const std::string& child, MessageType type, ByteSpan bytes);
  void OnChildFetch(const std::string& child, ByteSpan bytes);
  void OnCatchUpFinished(const CatchUp::Result& result);
  void OnJournal(const NodeStore::Journal& journal);
  void OnRecovered(const Status& status, uint64_t fetched);
  // Holds a BEGIN until what runs first is done (see the definition).
  void DeferBegin(ByteSpan begin);
  void RunDeferredBegin();
  void RejoinForEarlyChunks(uint64_t refit_id);
  void ReportBeforeMovingOn(const std::string& next);
  void HoldChunk(size_t bytes);
  void ReleaseChunk(size_t bytes) { held_bytes_ -= bytes; }

  // node_refit.cc: receive, forward, apply, prepare.
  void OnBegin(ByteSpan bytes);
  bool Behind(const Begin& b) const;
  // Whether refit `refit_id` finished here in this life, and if so whether it
  // committed (finished_refits_).
  std::optional<bool> FinishedRefit(uint64_t refit_id) const;
  // Whether this node is past refit `refit_id` to `target` (it finished it in this
  // life, or holds its target and went on from it), and if so whether that refit
  // committed.
  std::optional<bool> PastRefit(uint64_t refit_id, const Digest128& target) const;
  // A BEGIN of a refit this node is past, on `stripe`'s link: answered, never run again.
  void OnStaleBegin(uint32_t stripe, const Begin& begin, bool committed);
  // Whether `b` and the refit this node is in (or last ran) are two refits whose
  // BEGINs both say when the source began them (docs/protocol.md, "Refits in order").
  bool OrderedAgainstOurs(const Begin& b) const;
  // Whether the source began `b` before the refit this node is in, or before the one
  // it last ran from the same base (then it was decided before that began: never run
  // here), and if so whether from the same base (then it aborted).
  std::optional<bool> BegunBeforeOurs(const Begin& b) const;
  // Whether the source decided refit `earlier` before it began `later`: `later` goes
  // on from `earlier`'s target, or both are from one base and `earlier` was begun first.
  static bool DecidedBefore(const Begin& earlier, const Begin& later);
  // Whether the source began `b` after this node's refit, from its base, while that
  // refit still streams here: this node's refit aborted.
  bool SupersedesStreaming(const Begin& b) const;
  void NoteFinished(uint64_t refit_id, bool committed);
  void OnChunk(uint32_t stripe, const transport::Message& received);
  void OnChunkApplied(uint64_t id, const NodeStore::ApplyResult& result);
  void RequestRepairs(const NodeStore::ApplyResult& result);
  void OnRepairBytes(uint64_t id, const Fetch& fetch, const PartitionData& data);
  void LocalFailure(uint64_t id, const Status& status, FailureKind kind = FailureKind::kNode);
  void SendFailed(const Failed& failed);
  void MaybePrepared();
  // Striped, policy `available`: whether this node's own failure leaves it out of the
  // streaming refit (its parents stopped streaming to it).
  bool LeftOutOfStreamingRefit() const;
  // What its children are told when refused for it.
  std::string LeftOutReason(uint64_t refit_id) const;
  // While it is, its children are refused so that they fail over (Downstream::Shed).
  void ShedChildrenIfLeftOut();
  // Striped, policy `available`: a stripe whose parents have been away longer than
  // the connect timeout (and the failover's turn) while the refit streams, its END
  // not in, leaves this node out there, as its parent there leaves it out: it cannot
  // prepare, so it says FAILED up the other stripes, whose parents would wait for it.
  void GiveUpOnAwayStripe(Clock::time_point now);
  // Whether every parent this node may join in `stripe` (the planned one and its
  // failover parent) refused it because it cannot serve the current refit there.
  bool ShedByEveryParent(uint32_t stripe) const;
  void OnChildPrepared(const std::string& child, ByteSpan bytes);
  void OnChildFailed(const std::string& child, ByteSpan bytes);
  void OnChildJoined(const std::string& child, const Hello& hello);
  Subtree::Owner SubtreeOwner();
  // A fresh refit_, its per-stripe state sized.
  void NewRefit();
  std::vector<std::unique_ptr<Subtree>> MakeSubtrees();
  std::vector<std::unique_ptr<ParentLink>> MakeParents();

  // node_records.cc: the commit record, read when the parent is silent.
  void PollRecord(Clock::time_point now);
  void OnRecord(uint64_t refit_id, const Result<std::optional<CommitRecord>>& read);
  // A delta held in flight with no refit here (from before a restart) whose parent
  // has not decided it for source_timeout: its record, by the refit id kept with
  // the spool, else by base and target among the recent records.
  void PollHeldRecord(Clock::time_point now);
  void OnHeldRecord(const apply::InflightDelta& held, uint64_t refit_id,
                    const Result<std::optional<CommitRecord>>& found);
  // Whether this node holds a delta in flight that no refit of it here decides.
  bool HoldsUndecidedDelta() const;

  // node_outcome.cc: decisions and outcome.
  // `stripe`: the link it came on (replies go back there).
  void OnDecision(uint32_t stripe, MessageType type, ByteSpan bytes);
  // A decision as checked (signed, or from the record): what OnDecision does next.
  // `stripe`: the link whose parent is answered (stripe 0 for a decision from the record).
  void HandleDecision(uint32_t stripe, MessageType type, const Decision& d,
                      transport::Message message);
  // Sends the refit's decision on to the children, unless it came from the record in
  // a cluster that checks signatures (they read the record themselves).
  void TellChildren(MessageType type);
  // `from_record`: decided by the commit record, not a parent (with signatures
  // checked, the unsigned decision is not sent on to the children).
  void Resolve(MessageType type, const Decision& d, transport::Message message,
               bool from_record = false);
  void RollBackAnotherStream(const Begin& begin, ByteSpan bytes);
  // `begin` supersedes the refit streaming here (SupersedesStreaming), whose delta
  // this node holds in flight: that delta is rolled back, then `begin` runs.
  void RollBackSuperseded(const Begin& begin, ByteSpan bytes);
  // Both: rolls back the delta in flight (journal_.inflight) as a refit of its own,
  // known to nobody else, and defers `begin` (`bytes`) until that is done.
  void RollBackHeldDelta(const Begin& begin, ByteSpan bytes);
  void CommitByCatchingUp(const Decision& d, transport::Message message);
  void ExcuseChildrenWithout(const Digest128& target);
  // The refit's decision for the children: as received, else (unsigned clusters
  // only) encoded here.
  transport::Message DecisionFor(MessageType type) const;
  // Whether `status` of a signature check lets the message through; logs and
  // drops the parent link when not.
  bool Trusted(const Status& status, std::string_view what, uint32_t stripe = 0);
  void Decide(MessageType type);
  void StartAbort();
  void OnLocalOutcome(uint64_t id, const Status& status, const Digest128& version);
  void OnChildConfirmed(const std::string& child, ByteSpan bytes);
  void MaybeOutcome();
  // Sends this node's outcome up `stripe` (once per refit and stripe).
  void SendOutcome(uint32_t stripe);
  void ReportOutcome();

  NodeAgentOptions options_;
  topology::StripedPlan striped_;
  topology::TreePlan plan_;     // stripe 0's tree (the only one when not striped)
  topology::PlannedNode self_;  // this node in stripe 0's tree
  // This node in each stripe's tree (ParentLink keeps a reference: never resized).
  std::vector<topology::PlannedNode> selves_;
  std::unique_ptr<transport::Transport> transport_;
  std::string listen_address_;

  // Loop-thread state.
  std::optional<Refit> refit_;
  // The refit whose children this node refused (ShedChildrenIfLeftOut); 0: none.
  uint64_t shed_refit_ = 0;
  // The refits this node failed itself (FAILED, kind node) in this life, newest last
  // (at most kFinishedKept): one kept alone was replaced by a stale refit failed
  // after it, which was then begun again (the simulator's --stripes seed 76273).
  std::deque<uint64_t> failed_refits_;
  bool FailedHere(uint64_t refit_id) const {
    return std::find(failed_refits_.begin(), failed_refits_.end(), refit_id) !=
           failed_refits_.end();
  }
  void NoteFailedHere(uint64_t refit_id) {
    if (FailedHere(refit_id)) return;
    failed_refits_.push_back(refit_id);
    while (failed_refits_.size() > kFinishedKept) failed_refits_.pop_front();
  }
  bool committed_last_ = false;
  std::vector<std::byte> deferred_begin_;  // a BEGIN that waits for a resolution or catch-up
  uint64_t parent_begins_ = 0;             // BEGINs the parent sent; a newer one supersedes
  uint64_t last_parent_begin_ = 0;         // the refit of the last counted one (stripes repeat it)
  // Per stripe: the refit of the last BEGIN that stripe's link carried, and the refit
  // that link was granted its window for (0: none since it joined).
  std::vector<uint64_t> begin_on_;
  std::vector<uint64_t> window_on_;
  // The refits finished here in this life, newest last (at most kFinishedKept), and
  // whether each committed: a BEGIN or decision of one of them comes from a parent
  // that lags behind (or repeats itself) and is answered, never run again.
  static constexpr size_t kFinishedKept = 16;
  std::deque<std::pair<uint64_t, bool>> finished_refits_;
  // Per stripe: the finished refit whose BEGIN that link carried last (0: none). Its
  // chunks are dropped, with credit, so the decision queued behind them comes.
  std::vector<uint64_t> stale_on_;
  // Per stripe: the refit of the BEGIN that link carried when a chunk last came on
  // it (0: none). A refit that begins here after chunks of it came (its BEGIN waited
  // behind a catch-up, or an earlier start of it failed) lacks them: the link rejoins
  // so that its parent replays them (RejoinForEarlyChunks).
  std::vector<uint64_t> chunk_of_;
  // Per stripe: the parents (planned, failover) that refused this node because they
  // cannot serve a refit there (left out of it: Downstream::Shed), and that refit.
  std::vector<std::map<std::string, uint64_t>> shed_by_;
  uint64_t catch_up_failed_refit_ = 0;  // its BEGIN then runs (and fails) as usual
  uint64_t retried_commit_ = 0;         // the refit whose failed local commit was tried again
  Status catch_up_failure_;             // why that catch-up failed
  // COMMIT / ABORT of the deferred BEGIN's refit that came while it waited (the
  // parent may decide before this node began: a catch-up that fails takes a
  // while); run right after that BEGIN, in order.
  std::vector<std::pair<uint32_t, transport::Message>> deferred_decisions_;  // (stripe, decision)
  // Decisions that wait for the store's recovery (a node confirms a version only once
  // its bytes are at it), in the order they came: the last of each stripe's link. One
  // kept for all, a COMMIT that came on another stripe meanwhile replaced it, and
  // that stripe's parent waited for a confirmation that never came (the simulator's
  // --stripes seed 63749).
  struct AwaitingRecovery {
    uint32_t stripe = 0;
    MessageType type = MessageType::kCommit;
    std::vector<std::byte> message;
  };
  std::vector<AwaitingRecovery> decisions_awaiting_recovery_;
  // A recovery of the store that failed (the engine did not pause, the disk refused
  // a write) starts again from this time, between refits (Tick).
  std::optional<Clock::time_point> recovery_retry_at_;
  uint64_t recovery_tried_for_ = 0;   // the BEGIN a recovery was last started for
  uint64_t stream_rollback_for_ = 0;  // the BEGIN another stream was last rolled back for
  NodeStore::Journal journal_;        // the replica's journal, mirrored
  Claimed claimed_;
  JoinCheck join_;  // what joining the parent found
  // The stripe whose parent's ACTIVE_VERSION the join check follows: the first to
  // say it (kNone until one has, and again once that link drops). The others' are
  // not checked: one check, never waiting on a given stripe.
  uint32_t version_stripe_ = UpLink::kNone;
  // What each connected child's HELLO said it holds: (active version, delta in flight).
  std::map<std::string, std::pair<Digest128, Digest128>> child_holds_;
  // Per stripe: chunks the current parent link carried this refit.
  std::vector<std::set<uint32_t>> received_on_link_;
  Clock::time_point next_heartbeat_ = Clock::now();
  uint64_t held_bytes_ = 0;
  uint64_t refetches_ = 0;  // damaged chunks fetched again
  // The commit record: a read in flight on records_loop_, and when the next may go.
  bool record_read_pending_ = false;
  uint64_t record_refused_for_ = 0;  // the refit whose record was refused (logged once)
  Clock::time_point next_record_read_{};
  // The held delta's record (PollHeldRecord): since when it has waited undecided
  // here, and the refit whose record this life followed (never followed twice).
  std::optional<Clock::time_point> held_undecided_since_;
  uint64_t held_followed_refit_ = 0;

  mutable Mutex stats_mu_;
  NodeAgentStats stats_ GUARDED_BY(stats_mu_);
  std::atomic<bool> stopped_{false};
  SpoolDir spool_dir_;  // released on Stop

  // The parts. Declared after the state they use and before the loop, which is
  // stopped first and destroyed last.
  EventLoop loop_;
  NodeStore store_;
  Downstream downstream_;
  std::vector<std::unique_ptr<ParentLink>> parents_;  // per stripe
  ParentLink& parent_;                                // stripe 0's (named in logs)
  std::vector<std::unique_ptr<Subtree>> subtrees_;    // per stripe
  UpLink up_;                                         // which parent answers requests up the tree
  UpRequests requests_;

  // Per stripe: since when no parent of that stripe has been joined (nullopt: one is).
  std::vector<std::optional<Clock::time_point>> stripe_away_since_ =
      std::vector<std::optional<Clock::time_point>>(parents_.size(), Clock::now());
  // Per stripe: stripe_away_since_ as it was when the last link joined (a parent that
  // welcomes this node and then refuses it for the refit never served it).
  std::vector<std::optional<Clock::time_point>> stripe_away_before_join_ =
      std::vector<std::optional<Clock::time_point>>(parents_.size());
  CatchUp catch_up_;
  Rollback rollback_;
  StoreRecovery recovery_;
  // Reads of the commit record, off the loop (a store that is slow to answer never
  // stalls the links); only with a store. Stopped before loop_.
  std::unique_ptr<EventLoop> records_loop_;
};

}  // namespace deltacast::relay
