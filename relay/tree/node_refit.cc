// A relay node's refit, streaming half: BEGIN, each CHUNK verified, forwarded to the
// children (the very buffer, before anything local), spooled and applied; torn
// partitions repaired. The subtree half (PREPARED, failures, children that rejoin) is
// node_subtree.cc, the decision half node_outcome.cc.
#include <fmt/core.h>

#include <algorithm>

#include "codec/chunk.h"
#include "common/crash_point.h"
#include "common/elapsed.h"
#include "common/log.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "relay/tree/node_impl.h"
#include "relay/tree/replay.h"
#include "relay/tree/stripe_links.h"

namespace deltacast::relay {

void NodeAgent::Impl::OnBegin(ByteSpan bytes) {
  auto begin = ParseBegin(bytes);
  if (!begin.ok()) return parent_.ProtocolError(begin.status().message());
  log::Debug(fmt::format("{}: BEGIN of refit {} ({} -> {}) from {}", options_.node_id,
                         begin->refit_id, begin->base_version.ShortHex(),
                         begin->target_version.ShortHex(), parent_.current()));
  const uint32_t stripe = begin->stripe;  // checked against its link's (OnParentMessage)
  ParentLink& up = *parents_[stripe];
  if (options_.verify_key && !Trusted(VerifyBegin(*options_.verify_key, *begin), "BEGIN", stripe)) {
    return;
  }
  // (A refit committed here that is still the current one is answered below, with
  // its subtree's reports: more than prepared.)
  // A refit this node never finished whose base is exactly what it holds is new,
  // even when its target is a version this node held before (a trainer that
  // publishes a step back: A -> B, then B -> A): only its id says it is past then.
  const bool runs_from_here = !journal_.inflight && journal_.version == begin->base_version &&
                              !FinishedRefit(begin->refit_id) &&
                              !(refit_ && refit_->id == begin->refit_id);
  if (const std::optional<bool> committed = PastRefit(begin->refit_id, begin->target_version);
      committed && !runs_from_here && !(*committed && refit_ && refit_->id == begin->refit_id)) {
    return OnStaleBegin(stripe, *begin, *committed);
  }
  if (const std::optional<bool> same_base = BegunBeforeOurs(*begin)) {
    // From the same base it aborted (a COMMIT would have moved the base); from
    // another it was decided either way, and this node is not told which.
    if (*same_base) NoteFinished(begin->refit_id, /*committed=*/false);
    return OnStaleBegin(stripe, *begin, /*committed=*/false);
  }
  if (auto waiting = ParseBegin(deferred_begin_);
      waiting.ok() && waiting->refit_id != begin->refit_id && DecidedBefore(*begin, *waiting)) {
    // Decided before the BEGIN that waits here (behind a catch-up, say): it does not
    // take that one's place. Taking it, the node ran a lagging parent's decided
    // refit, and the live one's parent waited its commit timeout (the simulator's
    // --stripes seed 25425).
    const bool committed = begin->target_version == waiting->base_version;
    if (!committed) NoteFinished(begin->refit_id, /*committed=*/false);
    return OnStaleBegin(stripe, *begin, committed);
  }
  // Begun later from this node's refit's base, which is still streaming here: this
  // node's refit aborted, and a replay of it after this node has gone on from `begin`
  // is past (it would catch up to the old base, backwards). (One decided here is noted
  // as it finishes.)
  if (SupersedesStreaming(*begin)) {
    const codec::DeltaIdentity& ours = refit_->identity;
    NoteFinished(refit_->id, /*committed=*/false);
    if (journal_.inflight && journal_.inflight->base == ours.base_version &&
        journal_.inflight->target == ours.target_version &&
        ours.target_version != begin->target_version) {
      // It holds that refit's delta in flight, which nobody will decide for it now
      // (its parents have gone on): rolled back here, from its own spool, before the
      // BEGIN runs. Taken for a node behind, it caught up to the base it holds, by
      // fetching from parents that may not serve it (the simulator's --stripes seed
      // 14890: the catch-up failed, the BEGIN then failed on the delta in flight, and
      // the node stayed a version behind with its engine paused).
      return RollBackSuperseded(*begin, bytes);
    }
  }
  if (FailedHere(begin->refit_id) && !(refit_ && refit_->id == begin->refit_id) && stripes() > 1) {
    // This node said it cannot take part in this refit, and its parents left it out
    // (stopped streaming to it, its children sent away); it has since moved on (a
    // held delta resolved, a catch-up). Begun again, it would wait for stripes that
    // nobody streams to it while a parent that adopts it waits for its PREPARED (the
    // simulator's --stripes seeds 10474, 10552): FAILED again on this link, and the
    // node catches up at the next refit.
    log::Warn(fmt::format("{}: refit {} failed here already; not beginning it again",
                          options_.node_id, begin->refit_id));
    up.Send(EncodeFailed(Failed{begin->refit_id, options_.node_id,
                                "this node failed this refit already and left it"}));
    return;
  }
  if (refit_ && refit_->id == begin->refit_id &&
      !(refit_->phase == Phase::kDone && !committed_last_)) {
    // A replay after a reconnect, or this refit's BEGIN on another stripe: what
    // follows on this link is what we lack.
    GrantWindow(stripe);
    if (refit_->phase == Phase::kStreaming) {
      refit_->prepared_on[stripe] = false;
      refit_->prepared_sent = std::find(refit_->prepared_on.begin(), refit_->prepared_on.end(),
                                        true) != refit_->prepared_on.end();
      if (refit_->failed) up.Send(EncodeFailed(*refit_->failed));
      // Prepared already: say so now. The replay may hold no END to prompt it (a
      // source that could not spool the refit: the simulator's seed 1838 waited the
      // commit timeout for this PREPARED).
      MaybePrepared();
    } else if (!refit_->outcome_error.ok()) {
      // Decided, but this node could not commit (or roll back) locally: it is not at
      // the version it would claim. FAILED again, at once: the parent stops waiting
      // for it (the simulator's seed 110590 claimed PREPARED here, ignored the
      // replayed COMMIT as a duplicate and held its parent to the commit timeout).
      up.Send(EncodeFailed(Failed{refit_->id, options_.node_id, refit_->outcome_error.ToString()}));
    } else if (refit_->phase == Phase::kAborting) {
      // Rolling it back (its ABORT came first on another stripe, or from the record):
      // not prepared, nor committed; the ABORT reaches this link's parent from
      // above, and ABORTED follows once the rollback is done (the simulator's
      // --stripes seed 42 sent PREPARED here, claiming a refit it was aborting).
    } else if (refit_->commits_by_catch_up && !refit_->local_outcome_done) {
      // Committed (by its parent, or the commit record), and reaching the target by
      // a catch-up: it holds neither the verified delta nor the target yet, and the
      // catch-up may fail. COMMITTED, or FAILED, goes up once it ends (the
      // simulator's --stripes --coord seeds 32, 153, 258, 359, 464, 473 sent
      // PREPARED here, to a failover parent replaying the refit, then failed).
    } else {
      // We committed this refit (with our whole subtree) before our parent
      // restarted: more than prepared; say so, and confirm when it commits.
      Prepared prepared{refit_->id, subtree(stripe).reports()};
      prepared.nodes.push_back({options_.node_id, refit_->chunk_bytes, SecondsSince(refit_->start),
                                refit_->partitions_applied});
      up.Send(EncodePrepared(prepared));
    }
    return;
  }
  // The parent has moved on (it begins a refit only after the last one ended).
  ReportBeforeMovingOn(fmt::format("refit {} begins", begin->refit_id));
  if (refit_ && refit_->phase != Phase::kDone && refit_->phase != Phase::kStreaming) {
    // The previous delta is still being committed or rolled back (a source that
    // restarted resolves it right before beginning the next): begin after it.
    DeferBegin(bytes);
    return;
  }
  if (refit_ && refit_->phase == Phase::kDone && committed_last_ && !refit_->outcome_error.ok() &&
      retried_commit_ != refit_->id && journal_.prepared && journal_.inflight &&
      journal_.inflight->target == begin->base_version) {
    // The last refit committed, and this node holds its verified delta, but could
    // not write it (its engine did not pause): commit it now, then begin.
    retried_commit_ = refit_->id;
    log::Warn(fmt::format("{}: committing the delta to {} it could not write at refit {} first",
                          options_.node_id, begin->base_version.ShortHex(), refit_->id));
    DeferBegin(bytes);
    store_.Commit(refit_->id, [this](const Status& status, const Digest128& version,
                                     const NodeStore::CommitTimes& times) {
      if (!status.ok()) {
        log::Error(fmt::format("{}: the held delta still could not be committed: {}",
                               options_.node_id, status.ToString()));
      }
      {
        MutexLock lock(stats_mu_);
        stats_.version = version;
        // The engine paused for that refit's write now: its pause is reported with
        // the refits' (the refit itself reported none, having failed locally).
        stats_.last_pause_seconds = times.pause_seconds;
        stats_.pause_seconds_total += times.pause_seconds;
      }
      RunDeferredBegin();
    });
    return;
  }
  if (journal_.needs_reconcile && !recovery_.active() && !catch_up_.active() && !Behind(*begin) &&
      recovery_tried_for_ != begin->refit_id) {
    // A recovery that failed waits for its retry (the engine did not pause): try it
    // now, once for this BEGIN, which runs after it (a refit over an unchecked
    // store fails at once: the simulator's seed 10014 failed its last refit so).
    recovery_tried_for_ = begin->refit_id;
    recovery_retry_at_.reset();
    recovery_.Start();
  }
  if (recovery_.active() && !Behind(*begin)) {
    if (catch_up_failed_refit_ == begin->refit_id) {
      // It tried to catch up to this refit's base and could not (its disk refused
      // the journal, or nobody serves it): it cannot take part, so it says FAILED
      // now, and the parent acts on it at once. Held behind the recovery that the
      // failed catch-up restarted, of a version the tree has left, the BEGIN
      // waited for good and the publish its commit timeout twice (the simulator's
      // seeds 117639, 117642).
      log::Warn(fmt::format("{}: refit {}: cannot take part, the catch-up to its base failed",
                            options_.node_id, begin->refit_id));
      // Its parents excuse it from the refit and send it no more of it: not begun
      // again here, as for any refit it failed (begun after a later catch-up worked,
      // it waited for a stripe whose parent had excused it: --stripes seed 76273).
      NoteFailedHere(begin->refit_id);
      // Children that this node began the refit for before (it ran the BEGIN once
      // the catch-up failed, then its held delta was resolved, which ended that run)
      // wait for the rest of it from here: refused, they fail over to a parent that
      // streams it (the simulator's --stripes seed 132973 waited its commit timeout).
      downstream_.RefuseLinksMidRefit(begin->refit_id, LeftOutReason(begin->refit_id));
      SendUpAll(EncodeFailed(
          Failed{begin->refit_id, options_.node_id,
                 "could not catch up to the refit's base " + begin->base_version.ShortHex() + ": " +
                     catch_up_failure_.ToString() + join_.NoteFor(begin->base_version)}));
      return;
    }
    // The store is being brought back to its committed version first.
    DeferBegin(bytes);
    return;
  }
  if (recovery_.active()) {
    // The tree has moved past the version this node is mending: bytes of it may be
    // nowhere up the tree now (a partition torn by a machine crash and changed since
    // is never served). Catch up to the base the others hold instead: it goes by the
    // hashes of the bytes there are. The decision the recovery held back is for a
    // refit the parent has finished.
    log::Warn(fmt::format("{}: refit {} begins from {}; catching up to it instead of mending {}",
                          options_.node_id, begin->refit_id, begin->base_version.ShortHex(),
                          journal_.version.ShortHex()));
    recovery_.Abandon();
    decisions_awaiting_recovery_.clear();
  }
  if (catch_up_.active() || Behind(*begin)) {
    // First reach the base everybody else holds; the BEGIN runs after.
    DeferBegin(bytes);
    if (!catch_up_.active())
      catch_up_.Start(begin->base_version, begin->refit_id, /*resolving=*/false);
    return;
  }
  const uint64_t held_stream = Spool::StreamOf(options_.spool_dir, begin->target_version);
  const bool same_delta_inflight = journal_.inflight &&
                                   journal_.inflight->base == begin->base_version &&
                                   journal_.inflight->target == begin->target_version;
  // What it applied: the journal, and the spool too, which is ahead of the journal
  // this thread last saw (a chunk is spooled before it is applied).
  if (same_delta_inflight && held_stream != begin->stream_id &&
      (!journal_.applied.empty() || journal_.prepared ||
       Spool::HoldsChunks(options_.spool_dir, begin->target_version))) {
    if (stream_rollback_for_ != begin->refit_id) return RollBackAnotherStream(*begin, bytes);
    // Its rollback failed: it cannot take this stream (its journal names the other
    // one's chunks). FAILED, and the ABORT resolves the delta it holds.
    SendUpAll(
        EncodeFailed(Failed{begin->refit_id, options_.node_id,
                            "could not roll back what it holds of another stream of this delta"}));
    return;
  }
  NewRefit();
  refit_->id = begin->refit_id;
  ShedChildrenIfLeftOut();  // children refused for another refit take part in this one
  refit_->begin = *begin;
  refit_->identity = {begin->base_version, begin->target_version, begin->partition_bytes};
  for (auto& carried : received_on_link_) carried.clear();
  // Other deltas' spools stay until the last commit's writes are flushed (the apply
  // thread removes them): recovering those writes may need them. This delta's own
  // spool is kept only if this node holds some of the delta (in flight: a resume) or
  // all of it (committed: children may still need it); else what it holds is left
  // from a refit of the same delta this node rolled back, whose chunk N need not be
  // this refit's chunk N (a root merges producers' chunks as they come).
  // Only chunks of this stream: another stream's sequence N is another chunk. What
  // this node applied of one was rolled back above; a committed delta's spool is
  // kept while its writes are unflushed (a reconcile redoes them from it), and not
  // replayed.
  const bool same_stream = held_stream == begin->stream_id;
  const bool holds_delta = journal_.inflight
                               ? journal_.inflight->target == begin->target_version && same_stream
                               : journal_.version == begin->target_version &&
                                     (same_stream || journal_.unflushed.has_value());
  auto spool = holds_delta
                   ? Spool::Open(options_.spool_dir, begin->target_version, /*remove_others=*/false)
                   : Spool::OpenEmpty(options_.spool_dir, begin->target_version);
  // Opened empty: its chunks will be this stream's (noted before any is applied).
  if (spool.ok() && !holds_delta) {
    if (Status noted = (*spool)->RecordStream(begin->stream_id, begin->refit_id); !noted.ok())
      spool = noted;
  }
  if (spool.ok()) {
    refit_->spool = std::move(*spool);
  } else {
    LocalFailure(refit_->id, spool.status().WithContext("spool"));
  }
  log::Info(fmt::format("{}: refit {} begins: {} -> {}", options_.node_id, refit_->id,
                        begin->base_version.ShortHex(), begin->target_version.ShortHex()));
  downstream_.BeginRefit(begin->refit_id, begin->stream_id);
  downstream_.BroadcastBegin(*begin);
  // Resuming: the chunks held from before are not sent again by the parent, so the
  // children connected now get them from here (a child that joined before this BEGIN
  // was replayed nothing: this node had no refit then). Found by faults.relay_kill_resend:
  // a relay restarted mid-delta whose child rejoined it first ended the refit one
  // chunk short.
  if (holds_delta && same_stream && refit_->spool)
    downstream_.QueueHeld(HeldChunks(*begin, refit_->spool));
  ForEachSubtree([&](Subtree& t) { t.BeginRefit(refit_->id, Clock::now()); });
  const uint64_t id = refit_->id;
  store_.BeginRefit(id, refit_->identity, begin->manifest_digest, refit_->spool,
                    [this, id](const Status& status) {
                      if (!status.ok()) LocalFailure(id, status);
                    });
  // Every stripe whose BEGIN came (this one, and any that came while it waited).
  for (uint32_t s = 0; s < stripes(); ++s) {
    if (begin_on_[s] == id) GrantWindow(s);
  }
  RejoinForEarlyChunks(id);
}

// Chunks of refit `refit_id` came on a link before the refit began here (its BEGIN
// waited behind a catch-up, or an earlier start of it failed): dropped, or taken by
// what came before, and the parent that sent them sends nothing more; this node
// waited for them until the commit timeout (the simulator's --stripes seed 10474: a
// failover parent replayed two chunks to a node whose in-flight delta it had just
// resolved, and which began the refit again after catching up). Rejoining, the node
// says what it holds and is replayed the rest.
void NodeAgent::Impl::RejoinForEarlyChunks(uint64_t refit_id) {
  for (uint32_t s = 0; s < stripes(); ++s) {
    if (std::exchange(chunk_of_[s], 0) != refit_id) continue;
    log::Info(
        fmt::format("{}: chunks of refit {} came from {} before it began here; rejoining "
                    "for them",
                    options_.node_id, refit_id, parents_[s]->current()));
    parents_[s]->Drop(Status::Unavailable("rejoining for chunks that came before the refit began"));
  }
}

// A BEGIN of the delta this node holds in flight, but streamed anew (a root
// restarted mid-refit): the chunks it applied were numbered by the lost stream, so
// neither its journal nor its spool names this stream's chunks. The lost stream was
// never decided (a root logs its decision before it sends it), so this node does
// what a presumed abort does: rolls back from its spool, then runs the BEGIN from
// the base, taking the new stream whole. Nothing is sent down: its children hold
// the same stream and do the same when this node passes the BEGIN on.
void NodeAgent::Impl::RollBackAnotherStream(const Begin& begin, ByteSpan bytes) {
  log::Warn(fmt::format(
      "{}: refit {} streams delta {} -> {} anew (stream {:016x}; this node holds {} chunks of "
      "stream {:016x}): rolling back what it applied first",
      options_.node_id, begin.refit_id, begin.base_version.ShortHex(),
      begin.target_version.ShortHex(), begin.stream_id, journal_.applied.size(),
      Spool::StreamOf(options_.spool_dir, begin.target_version)));
  stream_rollback_for_ = begin.refit_id;
  {
    MutexLock lock(stats_mu_);
    ++stats_.stream_rollbacks;
  }
  RollBackHeldDelta(begin, bytes);
}

void NodeAgent::Impl::RollBackSuperseded(const Begin& begin, ByteSpan bytes) {
  log::Warn(fmt::format(
      "{}: refit {} from {} was begun after refit {}, which streams here: that one aborted; "
      "rolling back its delta to {} first",
      options_.node_id, begin.refit_id, begin.base_version.ShortHex(), refit_->id,
      journal_.inflight->target.ShortHex()));
  RollBackHeldDelta(begin, bytes);
}

void NodeAgent::Impl::RollBackHeldDelta(const Begin& begin, ByteSpan bytes) {
  const Digest128 held_target = journal_.inflight->target;
  DeferBegin(bytes);
  downstream_.DropQueued();
  // Its own refit id, known to nobody else: the ABORTED it reports is ignored above.
  const uint64_t id = begin.refit_id ^ 0x53545245414dULL;  // "STREAM"
  NewRefit();
  refit_->id = id;
  refit_->identity = {journal_.inflight->base, held_target, begin.partition_bytes};
  refit_->decided = Clock::now();
  refit_->stream_rollback = true;
  refit_->phase = Phase::kAborting;
  ForEachSubtree([&](Subtree& t) {
    t.BeginRefit(id, Clock::now());
    t.Decided(Clock::now());
  });
  claimed_ = {};
  auto spool = Spool::Open(options_.spool_dir, held_target, /*remove_others=*/false);
  rollback_.Start(id, spool.ok() ? std::shared_ptr<Spool>(std::move(*spool)) : nullptr);
}

std::optional<bool> NodeAgent::Impl::FinishedRefit(uint64_t refit_id) const {
  for (const auto& [id, committed] : finished_refits_) {
    if (id == refit_id) return committed;
  }
  return std::nullopt;
}

std::optional<bool> NodeAgent::Impl::PastRefit(uint64_t refit_id, const Digest128& target) const {
  if (const std::optional<bool> finished = FinishedRefit(refit_id)) return finished;
  if (refit_ && refit_->id == refit_id) return std::nullopt;
  // Its target is the base of the delta this node holds in flight, or of the refit
  // it is in while it holds that version or committed that refit: it committed the
  // version (before a restart, by catching up, or through another stripe's parent)
  // and went on from it. (A node whose catch-up failed runs a refit whose base it
  // does not hold: it is behind, not past.)
  if (journal_.inflight && journal_.inflight->base == target) return true;
  if (refit_ && refit_->identity.base_version == target &&
      (journal_.version == target || (refit_->phase == Phase::kDone && committed_last_))) {
    return true;
  }
  return std::nullopt;
}

// A BEGIN of a refit this node is past (PastRefit: committed or aborted, and
// decisions are final): a parent that lags behind replays it to this node, which
// rejoined it (that parent is still in the refit while another stripe's moved
// on), or it is the replay behind an ABORT that another stripe brought first. Run
// again, it switched the node off the refit it is in (the next one) or began an
// aborted one anew and passed the BEGIN down; a relay that is its child's child in
// another stripe then got it back and began it again: BEGINs, chunks and ENDs went
// round those links until the task budget ran out, and a node told to catch up to
// the stale refit's base wrote it over the version that committed meanwhile (the
// simulator's --stripes seeds 284, 1201). Only this link's parent is answered:
// credit, so its replay drains (the chunks are dropped, OnChunk) and the decision
// queued behind them comes (confirmed in HandleDecision).
void NodeAgent::Impl::OnStaleBegin(uint32_t stripe, const Begin& begin, bool committed) {
  ParentLink& up = *parents_[stripe];
  log::Info(fmt::format("{}: refit {} {} here already; not running its BEGIN from {} again",
                        options_.node_id, begin.refit_id, committed ? "committed" : "aborted",
                        up.current()));
  stale_on_[stripe] = begin.refit_id;
  up.Send(EncodeCredit({static_cast<uint32_t>(options_.config.tree.window), begin.refit_id}));
  // Committed through this refit here (not only at its target by a catch-up or
  // before a restart): more than prepared; a parent that has not decided yet may be
  // waiting for it.
  if (!committed || FinishedRefit(begin.refit_id) != true) return;
  Prepared prepared{begin.refit_id, {}};
  prepared.nodes.push_back({options_.node_id, 0, 0, 0});
  up.Send(EncodePrepared(prepared));
}

// A parent that lags behind (still in refit A when the source has decided it and
// begun B, or a dead source's A) replays A to a node that rejoins it. From the
// versions alone A and B cannot be ordered when they share a base: the node took
// whichever BEGIN came last, caught up to its base (dropping the other's delta in
// flight) and ran it, and the parents of the one it left waited out the commit
// timeout (the simulator's --stripes seeds 10476, 10776, 11633; 2637 the other way
// round); and a node behind, at A's base, ran A for B (10803). The source's clock
// orders them: it begins a refit only once the last is decided, so a refit begun
// before the one this node is in is decided, and is never run here: the node
// reaches the current base by a catch-up, if it must. And a COMMIT moves the base,
// so of two refits from one base the earlier aborted.
bool NodeAgent::Impl::OrderedAgainstOurs(const Begin& b) const {
  return refit_ && refit_->begin.refit_id == refit_->id && refit_->id != b.refit_id &&
         b.begun_at_us != 0 && refit_->begin.begun_at_us != 0;
}

std::optional<bool> NodeAgent::Impl::BegunBeforeOurs(const Begin& b) const {
  if (!OrderedAgainstOurs(b) || b.begun_at_us >= refit_->begin.begun_at_us) return std::nullopt;
  if (refit_->begin.base_version == b.base_version) return true;
  // Across bases only while this node's refit is in progress: between refits a BEGIN
  // from another base runs as before, so a source whose clock stepped back (a restart
  // on a host whose clock was set back) is not refused for good.
  if (refit_->phase != Phase::kDone) return false;
  return std::nullopt;
}

bool NodeAgent::Impl::DecidedBefore(const Begin& earlier, const Begin& later) {
  // `later` goes on from its target: it committed first. From one base: the source's
  // clock orders them, and the earlier aborted (a COMMIT would have moved the base).
  if (earlier.target_version == later.base_version) return true;
  return earlier.base_version == later.base_version && earlier.begun_at_us != 0 &&
         earlier.begun_at_us < later.begun_at_us;
}

bool NodeAgent::Impl::SupersedesStreaming(const Begin& b) const {
  return OrderedAgainstOurs(b) && b.begun_at_us >= refit_->begin.begun_at_us &&
         refit_->begin.base_version == b.base_version && refit_->phase == Phase::kStreaming &&
         !FinishedRefit(refit_->id);
}

void NodeAgent::Impl::NoteFinished(uint64_t refit_id, bool committed) {
  finished_refits_.emplace_back(refit_id, committed);
  while (finished_refits_.size() > kFinishedKept) finished_refits_.pop_front();
}

// Whether this node holds neither the refit's base nor its target, nor the refit
// itself in flight: it missed a version the cluster committed.
bool NodeAgent::Impl::Behind(const Begin& b) const {
  if (catch_up_failed_refit_ == b.refit_id) return false;  // tried: let BEGIN report it
  if (journal_.inflight) {
    return !(journal_.inflight->base == b.base_version &&
             journal_.inflight->target == b.target_version);
  }
  return journal_.version != b.base_version && journal_.version != b.target_version;
}

void NodeAgent::Impl::OnChunk(uint32_t stripe, const transport::Message& received) {
  ParentLink& up = *parents_[stripe];
  if (stale_on_[stripe] != 0 ||
      (refit_ && begin_on_[stripe] != 0 && begin_on_[stripe] != refit_->id)) {
    // A chunk of another refit than this node's: a replay of one it is past
    // (OnStaleBegin), or of the last one, whose BEGIN came on this link before
    // another stripe's parent began the next. Not this refit's chunk N, so neither
    // applied, spooled nor passed down: taken for it, a replayed END went down again
    // to children that had this refit's END of that number, and into the spool,
    // from which a snapshot store's chain then did not rebuild ("chunk 1 belongs to
    // another delta": the simulator's --stripes seed 1053). Its credit lets the
    // decision queued behind it come.
    return up.Send(
        EncodeCredit({1, stale_on_[stripe] != 0 ? stale_on_[stripe] : begin_on_[stripe]}));
  }
  if (refit_ && refit_->phase == Phase::kAborting) {
    // A replay of the refit this node is rolling back (it rejoined): not needed,
    // but its credit keeps the parent's queue, and the decision behind it, moving.
    return up.Send(EncodeCredit({1, refit_->id}));
  }
  if (!refit_) return up.ProtocolError("CHUNK outside a refit");
  Refit& r = *refit_;
  transport::Message message = received;
  if (FaultPoint("agent.corrupt_chunk")) {  // fault-injection tests: a bit flipped in transit
    auto copy = std::make_shared<std::vector<std::byte>>(*received);
    // The chunk's last byte, not the signature after it (which is checked only
    // with a verify key): the chunk's own checksums must catch the damage.
    if (copy->size() > kMessageHeaderBytes + kSignatureBytes) {
      (*copy)[copy->size() - kSignatureBytes - 1] ^= std::byte{0x10};
    }
    message = copy;
  }
  // Verified before it is forwarded, spooled or applied: a damaged chunk is fetched
  // again (reconnecting makes the parent replay what we lack), never used.
  Status intact = codec::VerifyChunkChecksums(ChunkOf(*message));
  if (intact.ok() && options_.verify_key) {
    intact = VerifyChunkMessage(*options_.verify_key, *message);
    if (!intact.ok()) return (void)Trusted(intact, "a CHUNK", stripe);
  }
  auto header = codec::PeekChunkHeader(ChunkOf(*message));
  if (!intact.ok() || !header.ok()) {
    log::Warn(fmt::format("{}: a chunk from {} failed its checks ({}); fetching it again",
                          options_.node_id, up.current(),
                          (intact.ok() ? header.status() : intact).ToString()));
    ++refetches_;
    return up.Drop(Status::Corrupt("damaged chunk"));
  }
  const bool data = header->kind == codec::ChunkKind::kData;
  if (!StripeCarries(stripe, stripes(), header->sequence, data)) {
    // Only its stripe's parent sends a chunk: from any other it is an unplanned
    // parent's, refused like one.
    return up.ProtocolError(fmt::format("chunk {} travels on stripe {}, not on stripe {}",
                                        header->sequence, header->sequence % stripes(), stripe));
  }
  // Every refit's chunks follow its BEGIN on a link: a chunk of another delta here is
  // a parent's mistake, never this refit's chunk N (an END of another delta, taken for
  // this one's, said a stripe had all its chunks: the simulator's --stripes seed 70276,
  // when its network reordered a link).
  const codec::DeltaIdentity& ours = r.identity;
  if ((!ours.base_version.IsZero() && header->identity.base_version != ours.base_version) ||
      (!ours.target_version.IsZero() && header->identity.target_version != ours.target_version)) {
    return up.ProtocolError(fmt::format(
        "chunk {} belongs to delta {} -> {}, not to refit {}'s {} -> {}", header->sequence,
        header->identity.base_version.ShortHex(), header->identity.target_version.ShortHex(), r.id,
        ours.base_version.ShortHex(), ours.target_version.ShortHex()));
  }
  ++r.chunks;
  // Timeline marks (scripts/bench-regions reads them): the first chunk and the END.
  if (r.chunks == 1) log::Info(fmt::format("{}: refit {}: first chunk", options_.node_id, r.id));
  // Every stripe carries the END after its own data chunks: once each has come, so
  // has every chunk (each link delivers in order).
  bool apply = true;
  if (!data) {
    const bool first_all = r.ends.insert(stripe).second && r.ends.size() == stripes();
    apply = r.ends.size() == stripes();
    if (first_all) {
      r.end_received = true;
      r.receive_seconds = SecondsSince(r.start);
      log::Info(fmt::format("{}: refit {}: END received", options_.node_id, r.id));
    }
  }
  const uint64_t payload = message->size() - kMessageHeaderBytes;
  r.chunk_bytes += payload;
  // Chunk N of another stream of the delta is another chunk (a restarted root).
  const bool same_stream =
      claimed_.stream == 0 || r.begin.stream_id == 0 || claimed_.stream == r.begin.stream_id;
  const bool had_it = (header->identity.target_version == claimed_.target && same_stream &&
                       claimed_.applied.contains(header->sequence)) ||
                      !received_on_link_[stripe].insert(header->sequence).second;
  if (had_it) {
    r.resent_bytes += payload;
    log::Warn(fmt::format("{}: chunk {} of refit {} sent again, though this node had it",
                          options_.node_id, header->sequence, r.id));
  }
  {
    MutexLock lock(stats_mu_);
    stats_.chunk_bytes_received += payload;
    if (had_it) stats_.chunk_bytes_resent += payload;
    ++stats_.stripe_chunks[stripe];
    if (had_it) stats_.stripe_chunk_bytes_resent[stripe] += payload;
  }
  CrashPoint("agent.chunk_received");
  HoldChunk(message->size());
  // Released once handed to every child AND spooled: then this node needs the
  // buffer no more (the apply reads the chunk back from the spool if it has not
  // taken it yet), so it has room for another and the parent gets credit. Applying
  // is off the tree's critical path: a node that applies slowly does not slow its
  // subtree, and its memory stays bounded by the window.
  auto slot = std::make_shared<NodeStore::ChunkSlot>(message, header->kind);
  auto pending = std::make_shared<int>(2);
  const uint64_t id = r.id;
  const size_t size = message->size();
  auto release = [this, pending, id, size, slot, stripe] {
    if (--*pending > 0) return;
    slot->Drop();
    ReleaseChunk(size);
    // Credit is owed whatever the phase: a replay to a node that already finished
    // this refit still has a decision queued behind its chunks.
    if (refit_ && refit_->id == id) parents_[stripe]->Send(EncodeCredit({1, id}));
  };
  // Forward first: the children need nothing of this node's (spool, fsync, apply)
  // to use a verified chunk, so none of it adds to the latency of a hop. Not once the
  // refit is decided here (a replay to this node after it rejoined): its children
  // were sent the decision, one that rejoins is replayed from this node's spool, and
  // forwarding would only send them what they had, down every hop below (the
  // simulator's seed 6628).
  if (r.phase == Phase::kStreaming) {
    // Down this stripe's links only (the END too: another stripe's links may still
    // be carrying their data chunks).
    downstream_.BroadcastChunk(message, {header->identity.target_version, header->sequence, data},
                               release, stripe);
  } else {
    release();
  }
  bool spooled = true;
  if (r.spool) {
    // Into the page cache here; the apply worker makes it durable before the
    // chunk's partitions are touched.
    Status appended = r.spool->Append(header->sequence, *message);
    if (!appended.ok()) {
      spooled = false;
      LocalFailure(r.id, appended.WithContext("spool"));
    }
  } else {
    spooled = false;
  }
  if (!spooled) {
    r.unspooled.insert(stripe);
    return release();  // never applied unless it can be undone from the spool
  }
  if (!apply) return release();  // an END before the other stripes' ENDs: not yet
  if (data) r.data_taken.insert(header->sequence);
  store_.ApplyChunk(
      id, header->sequence, slot, r.spool,
      [this, id](const NodeStore::ApplyResult& result) { OnChunkApplied(id, result); });
  release();
}

void NodeAgent::Impl::OnChunkApplied(uint64_t id, const NodeStore::ApplyResult& result) {
  if (result.chunk_applied || result.repaired) {
    MutexLock lock(stats_mu_);
    stats_.chunks_received += result.chunk_applied;
    stats_.partitions_repaired += result.repaired;
  }
  if (!refit_ || refit_->id != id) return;
  refit_->apply_seconds += result.seconds;
  refit_->apply_cpu_seconds += result.cpu_seconds;
  refit_->apply_runnable_seconds += result.runnable_seconds;
  refit_->apply_blocked_seconds += result.blocked_seconds;
  if (result.end) {
    refit_->check_seconds = result.check_seconds;
    refit_->write_seconds = result.write_seconds;
    refit_->finish_seconds = result.finish_seconds;
  }
  if (result.refused) {
    // A record that passed the chunk's checksums (and signature) but cannot take its
    // partition from the base to the target BEGIN announced: the bytes are what the
    // root sent, so fetching them again would only fetch the same mistake. The delta
    // is bad, not the link: refuse to prepare, once, and say so (nothing was written).
    return LocalFailure(id, Status::Corrupt("bad delta: " + result.status.ToString()),
                        FailureKind::kBadDelta);
  }
  if (!result.status.ok()) return LocalFailure(id, result.status);
  if (!result.torn.empty()) return RequestRepairs(result);
  if (result.end && refit_->local_error.ok()) {
    refit_->local_prepared = true;
    refit_->prepared_at = Clock::now();
    refit_->partitions_applied = result.applied;
    MaybePrepared();
  }
}

// ---- repair: torn partitions get literal target bytes from up the tree ----------

void NodeAgent::Impl::RequestRepairs(const NodeStore::ApplyResult& result) {
  const uint64_t id = refit_->id;
  for (const Fetch& fetch : result.torn) {
    // Asked once: a link that drops is UpRequests' to mend (it asks another joined
    // parent), and an END replayed on a rejoin finds the partition still torn.
    if (!refit_->repairs_asked.emplace(fetch.tensor, fetch.element_offset).second) continue;
    log::Warn(fmt::format("{}: partition '{}' at element {} is torn; fetching its target bytes",
                          options_.node_id, log::Escape(fetch.tensor), fetch.element_offset));
    requests_.FetchPartition(
        fetch, [this, id, fetch](const PartitionData& data) { OnRepairBytes(id, fetch, data); });
  }
}

void NodeAgent::Impl::OnRepairBytes(uint64_t id, const Fetch& fetch, const PartitionData& data) {
  if (!refit_ || refit_->id != id) return;
  refit_->repairs_asked.erase({fetch.tensor, fetch.element_offset});
  refit_->repair_bytes += data.bytes.size();
  if (!data.found) {
    return LocalFailure(id, Status::Unavailable("no node up the tree has the bytes to repair '" +
                                                fetch.tensor + "'"));
  }
  auto owned = std::make_shared<std::vector<std::byte>>(data.bytes.begin(), data.bytes.end());
  store_.Repair(id, {fetch.tensor, fetch.element_offset}, owned,
                [this, id](const NodeStore::ApplyResult& result) { OnChunkApplied(id, result); });
}

}  // namespace deltacast::relay
