// A relay node's refit, decision half: COMMIT or ABORT from the parent (passed down
// first), the local commit or rollback, the outcome of a delta left in flight by an
// earlier refit, and the confirmations gathered from the subtree before this node
// reports COMMITTED or ABORTED up (docs/protocol.md, docs/recovery.md).
#include <fmt/core.h>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "relay/tree/node_impl.h"
#include "relay/tree/stripe_links.h"

namespace deltacast::relay {

bool NodeAgent::Impl::Trusted(const Status& status, std::string_view what, uint32_t stripe) {
  if (status.ok()) return true;
  // The parent forwards what the source signed; anything else came from the parent
  // itself or from whoever sits on the link: never applied, never committed.
  ParentLink& up = *parents_[stripe];
  log::Error(fmt::format("{}: refusing {} from {}: {}", options_.node_id, what, up.current(),
                         status.message()));
  up.ProtocolError(status.message());
  return false;
}

transport::Message NodeAgent::Impl::DecisionFor(MessageType type) const {
  if (refit_ && refit_->decision_message) return refit_->decision_message;
  return transport::MakeMessage(
      EncodeDecision(type, {refit_->id, refit_->identity.target_version}));
}

// Every stripe carries the decision: the first copy is acted on, the others are
// duplicates (answered on their own link where the parent there waits for an answer).
void NodeAgent::Impl::OnDecision(uint32_t stripe, MessageType type, ByteSpan bytes) {
  ParentLink& up = *parents_[stripe];
  auto d = ParseDecision(bytes);
  if (!d.ok()) return up.ProtocolError(d.status().message());
  log::Debug(fmt::format("{}: {} of refit {} from {}", options_.node_id, MessageTypeName(type),
                         d->refit_id, up.current()));
  if (options_.verify_key &&
      !Trusted(VerifyDecision(*options_.verify_key, type, *d), MessageTypeName(type), stripe)) {
    return;
  }
  HandleDecision(stripe, type, *d,
                 transport::MakeMessage(std::vector<std::byte>(bytes.begin(), bytes.end())));
}

void NodeAgent::Impl::HandleDecision(uint32_t stripe, MessageType type, const Decision& decision,
                                     transport::Message message) {
  ParentLink& up = *parents_[stripe];
  const Decision* d = &decision;
  const ByteSpan bytes(*message);
  if (!deferred_begin_.empty()) {
    // The decision of a refit whose BEGIN waits (behind the store's recovery, a
    // resolution or a catch-up): it runs right after that BEGIN. Held as a decision
    // for the recovery instead, it ran before the BEGIN, found no such refit and was
    // dropped, and the parent waited its commit timeout for this node's confirmation
    // (the simulator's seed 72955: a node back from a power loss rejoined mid-refit).
    auto waiting = ParseBegin(deferred_begin_);
    if (waiting.ok() && waiting->refit_id == d->refit_id) {
      deferred_decisions_.emplace_back(stripe, message);
      return;
    }
  }
  if (type == MessageType::kAbort &&
      (catch_up_failed_refit_ == d->refit_id || FailedHere(d->refit_id)) &&
      (!refit_ || refit_->id != d->refit_id) &&
      !(journal_.inflight && journal_.inflight->target == d->target_version)) {
    // The ABORT of a refit this node said FAILED to and has left (it could not catch
    // up to its base, or failed the refit and has since moved on): nothing of it to
    // undo, so confirmed at once, even while the store is being mended. A parent of
    // another stripe, which never saw that FAILED, waits for it (the simulator's
    // --stripes seed 24633 waited 20 s on an ABORT ignored as "not ours").
    up.Send(EncodeOutcome(MessageType::kAborted, {d->refit_id, 1, {}}));
    return;
  }
  if (recovery_.active()) {
    // The store is being mended to its committed version: confirm nothing before.
    std::erase_if(decisions_awaiting_recovery_,
                  [&](const AwaitingRecovery& d) { return d.stripe == stripe; });
    decisions_awaiting_recovery_.push_back(
        {stripe, type, std::vector<std::byte>(bytes.begin(), bytes.end())});
    return;
  }
  if (const std::optional<bool> committed = PastRefit(d->refit_id, d->target_version)) {
    // The decision of a refit this node is past (finished here, or committed and
    // gone on from), from a parent that lags behind (the end of the replay
    // OnStaleBegin let through) or repeats it: confirmed on its link, with this
    // node's subtree there if the refit is still the current one. Not acted on: a
    // COMMIT taken for one this node "committed before a restart" switched it off
    // the refit it is in.
    if (*committed != (type == MessageType::kCommit)) return;  // no such thing: decisions are final
    const bool current = refit_ && refit_->id == d->refit_id;
    up.Send(
        EncodeOutcome(*committed ? MessageType::kCommitted : MessageType::kAborted,
                      {d->refit_id, 1 + (current ? subtree(stripe).confirmed_nodes() : 0), {}}));
    return;
  }
  if (type == MessageType::kCommit && journal_.version == d->target_version && !journal_.inflight) {
    if (refit_ && refit_->id == d->refit_id && refit_->phase == Phase::kDone) {
      // A repeated COMMIT: confirm again.
      up.Send(EncodeOutcome(MessageType::kCommitted,
                            {d->refit_id, 1 + subtree(stripe).confirmed_nodes(), {}}));
      return;
    }
    if (!refit_ || refit_->id != d->refit_id) {
      // We committed before a restart and never confirmed: our subtree's
      // confirmations were lost with us, so gather them again.
      NewRefit();
      refit_->id = d->refit_id;
      refit_->identity.target_version = d->target_version;
      refit_->phase = Phase::kCommitting;
      refit_->decided = Clock::now();
      refit_->local_outcome_done = true;
      refit_->decision_message = message;
      {
        MutexLock lock(stats_mu_);
        stats_.version = journal_.version;
      }
      downstream_.Broadcast(message);
      // Our children's links died with our previous life: one that is not back
      // within the time a child keeps trying us has failed over (and confirmed
      // there) or is down, and learns the decision when it is back.
      ForEachSubtree([&](Subtree& t) {
        t.BeginRefit(d->refit_id, Clock::now());
        t.Decided(Clock::now(), ParentLink::kFailoverAfter);
      });
      ExcuseChildrenWithout(d->target_version);
      MaybeOutcome();
      return;
    }
  }
  if (!refit_ || refit_->id != d->refit_id) {
    if (journal_.inflight && journal_.inflight->target == d->target_version)
      return Resolve(type, *d, message);
    log::Debug(fmt::format("{}: ignoring {} of refit {}, which is not ours", options_.node_id,
                           MessageTypeName(type), d->refit_id));
    return;
  }
  Refit& r = *refit_;
  if (r.phase == Phase::kDone && !r.outcome_error.ok()) {
    // Its local commit (or rollback) failed: a parent that sends the decision again
    // (a relay back from a restart, gathering confirmations anew) is told at once
    // (the simulator's seed 102601 waited its commit timeout for this one's).
    up.Send(EncodeFailed(Failed{r.id, options_.node_id, r.outcome_error.ToString()}));
    return;
  }
  if (r.phase != Phase::kStreaming) {
    // Striped: this stripe's outcome may have gone up already, to a parent that then
    // restarted and sends the decision again to gather confirmations anew, while
    // another stripe's children still hold this refit here. Answer it again (the
    // simulator's --stripes seed 17: relays of different stripes waited on each
    // other until the commit timeout). With one stripe the outcome goes up only as
    // the refit ends: nothing to answer here.
    const bool same = (type == MessageType::kCommit) == (r.phase == Phase::kCommitting);
    if (same && r.phase != Phase::kDone && r.local_outcome_done && r.outcome_on[stripe]) {
      r.outcome_on[stripe] = false;
      SendOutcome(stripe);
    }
    return;  // a duplicate
  }
  if (type == MessageType::kCommit && !r.local_error.ok()) {
    // Committed without this node, which cannot reach the target: say so (again)
    // at once, so the parent stops waiting for its confirmation; it catches up at a
    // later refit. The parent may never have had the first FAILED: a relay that
    // restarted after the decision is sent the COMMIT alone and gathers its
    // children's confirmations anew (the simulator's seed 71629 waited its commit
    // timeout for this node's).
    log::Warn(fmt::format("{}: refit {} committed without this node ({}); telling {}",
                          options_.node_id, r.id, r.local_error.ToString(), up.current()));
    up.Send(EncodeFailed(Failed{r.id, options_.node_id, r.local_error.ToString()}));
    return;
  }
  r.decision_message = message;
  if (type == MessageType::kCommit && !r.prepared_sent) {
    // Replayed right behind the chunks we lacked: decide once they are applied
    // (MaybePrepared; at once if they are, the children's PREPAREDs moot now).
    if (r.end_received) {
      r.pending_decision = type;
      ForEachSubtree([](Subtree& t) { t.CommitWaitsForThisNode(); });
      return MaybePrepared();
    }
    // Every chunk the parent sends comes before its decision, and the END did not:
    // the parent resolved a delta it does not hold whole (it was down while the
    // refit committed). Reach the target the way Resolve does.
    return CommitByCatchingUp(*d, message);
  }
  Decide(type);
}

// The delta of the current refit committed, but this node cannot finish it from
// the chunks its parent has: it tells its children and catches up to the target
// (by the kept deltas, else by the partitions that differ).
void NodeAgent::Impl::CommitByCatchingUp(const Decision& d, transport::Message message) {
  Refit& r = *refit_;
  r.decision_message = message;
  log::Warn(fmt::format(
      "{}: refit {} committed, but not every chunk of it reached this node; catching up",
      options_.node_id, r.id));
  r.phase = Phase::kCommitting;
  r.decided = Clock::now();
  r.resolution = true;  // a child that rejoins is sent the decision, not the delta
  r.commits_by_catch_up = true;
  downstream_.DropQueued();
  if (!(r.decided_by_record && options_.verify_key)) downstream_.Broadcast(message);
  ForEachSubtree([](Subtree& t) { t.Decided(Clock::now()); });
  store_.DropRefit();  // the catch-up resumes the delta
  if (!catch_up_.active()) return catch_up_.Start(d.target_version, r.id, /*resolving=*/true);
  catch_up_.Resolves(r.id);
}

// The outcome of a delta this node had in flight from an earlier refit (it
// restarted, or the source died before deciding): commit it if the source
// committed it, else roll it back (presumed abort). Children in the same state
// learn it from us. A BEGIN that arrives meanwhile waits (OnBegin).
void NodeAgent::Impl::Resolve(MessageType type, const Decision& d, transport::Message message,
                              bool from_record) {
  log::Info(fmt::format("{}: delta {} -> {} left in flight is resolved: {}", options_.node_id,
                        journal_.inflight->base.ShortHex(), d.target_version.ShortHex(),
                        MessageTypeName(type)));
  // The refit that streamed this delta here, under a source since lost, ends with
  // this decision: its BEGIN replayed later by a stripe parent that lags behind is
  // past, not a refit to run again (the simulator's --stripes seed 4789: run again,
  // its base taken for the cluster's version sent the node back over the commit it
  // had made since).
  std::optional<uint64_t> streamed_by;
  if (refit_ && refit_->id != d.refit_id && refit_->phase != Phase::kDone &&
      refit_->identity.base_version == journal_.inflight->base &&
      refit_->identity.target_version == d.target_version) {
    streamed_by = refit_->id;
  }
  if (!streamed_by && type == MessageType::kAbort && stripes() > 1) {
    // No refit of it runs here (this node restarted since): the spool names the refit
    // whose BEGIN opened it. ABORT says no refit to that target committed and none
    // streams it now, so that refit is over as well, and a stripe parent that lags
    // behind in it (it was in it when its source died) replays a BEGIN that is past
    // here (the simulator's --stripes seed 10324: run as new, it took the node off the
    // refit the restarted source was streaming, which waited its commit timeout).
    const uint64_t noted = Spool::RefitOf(options_.spool_dir, d.target_version);
    if (noted != 0 && noted != d.refit_id) streamed_by = noted;
  }
  ReportBeforeMovingOn(fmt::format("the delta to {} is resolved", d.target_version.ShortHex()));
  // A refit this node streamed and failed (its parents left it out) is over here
  // now: never begun again (OnBegin), so what it still owed children of it is dropped
  // below and never sent (the simulator's --stripes seed 77266: a child that had
  // joined for it got its BEGIN, then nothing, and waited the commit timeout).
  const uint64_t abandoned =
      refit_ && refit_->phase == Phase::kStreaming && FailedHere(refit_->id) ? refit_->id : 0;
  NewRefit();
  refit_->id = d.refit_id;
  refit_->resolves_refit = streamed_by;
  refit_->identity = {journal_.inflight->base, d.target_version, 0};
  refit_->decided = Clock::now();
  refit_->resolution = true;
  refit_->decided_by_record = from_record;
  refit_->decision_message = message;
  downstream_.DropQueued();
  if (abandoned != 0) downstream_.RefuseLinksMidRefit(abandoned, LeftOutReason(abandoned));
  if (!(from_record && options_.verify_key)) downstream_.Broadcast(message);
  ForEachSubtree([&](Subtree& t) {
    t.BeginRefit(d.refit_id, Clock::now());
    t.Decided(Clock::now());
  });
  ExcuseChildrenWithout(d.target_version);
  const uint64_t id = d.refit_id;
  if (type == MessageType::kCommit && !journal_.prepared) {
    // It committed without us: reach it by fetching what differs.
    refit_->phase = Phase::kCommitting;
    refit_->commits_by_catch_up = true;
    if (!catch_up_.active()) return catch_up_.Start(d.target_version, id, /*resolving=*/true);
    // Already catching up (to this version or past it): report when it is done.
    catch_up_.Resolves(id);
    return;
  }
  if (type == MessageType::kCommit) {
    refit_->phase = Phase::kCommitting;
    store_.CommitPrepared(
        [this, id](const Status& s, const Digest128& v) { OnLocalOutcome(id, s, v); });
    return;
  }
  refit_->phase = Phase::kAborting;
  if (catch_up_.active()) {
    // Catching up past the delta's base, over what it holds of the delta: the store
    // goes to the cluster's version by that, and the rollback is moot. Run alongside,
    // it took back the catch-up's engine pause and record of what is in flight, and
    // the catch-up wrote its partitions into weights the engine was serving (the
    // simulator's --stripes seed 83090). Reported once the catch-up ends.
    catch_up_.Resolves(id);
    return;
  }
  auto spool = Spool::Open(options_.spool_dir, d.target_version, /*remove_others=*/false);
  rollback_.Start(id, spool.ok() ? std::shared_ptr<Spool>(std::move(*spool)) : nullptr);
}

// A refit known here from its decision alone (a resolution, or this node came back
// after committing it): a child that joined before and holds neither its delta nor
// its target (adopted from a parent that never had the refit, say) ignores the
// decision, so it is not waited for, as when it joins after (OnChildJoined). Else the
// refit waited until the child left (the simulator's seed 18830: 9.8 s) or the commit
// timeout (seed 14756, a resolution).
void NodeAgent::Impl::ExcuseChildrenWithout(const Digest128& target) {
  for (const auto& [child, holds] : child_holds_) {
    if (holds.first != target && holds.second != target) subtree(StripeOfLink(child)).Excuse(child);
  }
}

void NodeAgent::Impl::TellChildren(MessageType type) {
  if (refit_->decided_by_record && options_.verify_key) return;
  downstream_.Broadcast(DecisionFor(type));
}

void NodeAgent::Impl::Decide(MessageType type) {
  if (type != MessageType::kCommit) return StartAbort();
  Refit& r = *refit_;
  r.phase = Phase::kCommitting;
  r.decided = Clock::now();
  TellChildren(MessageType::kCommit);
  ForEachSubtree([](Subtree& t) { t.Decided(Clock::now()); });
  if (r.local_prepared)
    r.hold_seconds = std::chrono::duration<double>(r.decided - r.prepared_at).count();
  const uint64_t id = r.id;
  store_.Commit(
      id, [this, id](const Status& s, const Digest128& v, const NodeStore::CommitTimes& times) {
        if (refit_ && refit_->id == id) refit_->pause_seconds = times.pause_seconds;
        OnLocalOutcome(id, s, v);
      });
}

void NodeAgent::Impl::StartAbort() {
  Refit& r = *refit_;
  if (r.phase == Phase::kAborting) return;
  r.phase = Phase::kAborting;
  r.decided = Clock::now();
  downstream_.DropQueued();
  TellChildren(MessageType::kAbort);
  ForEachSubtree([](Subtree& t) { t.Decided(Clock::now()); });
  rollback_.Start(r.id, r.spool);
}

void NodeAgent::Impl::OnLocalOutcome(uint64_t id, const Status& status, const Digest128& version) {
  if (!refit_ || refit_->id != id) return;
  if (!status.ok()) {
    log::Error(fmt::format("{}: refit {}: {} failed locally: {}", options_.node_id, id,
                           refit_->phase == Phase::kCommitting ? "commit" : "rollback",
                           status.ToString()));
    refit_->outcome_error = status.WithContext(
        refit_->phase == Phase::kCommitting ? "commit failed locally" : "rollback failed locally");
  }
  refit_->local_outcome_done = true;
  claimed_ = {};  // committed or rolled back: what it had applied of the delta is moot
  {
    MutexLock lock(stats_mu_);
    stats_.version = version;
  }
  MaybeOutcome();
}

void NodeAgent::Impl::OnChildConfirmed(const std::string& child, ByteSpan bytes) {
  if (!refit_) return;
  auto o = ParseOutcome(bytes);
  if (!o.ok() || o->refit_id != refit_->id) return;
  subtree(StripeOfLink(child)).OnConfirmed(child, o->nodes, o->pauses);
}

// The outcome goes up each stripe once this node's own is done and that stripe's
// children confirmed (per stripe: trees whose interior nodes differ never wait on
// each other); the refit is done here once it went up every stripe.
void NodeAgent::Impl::MaybeOutcome() {
  Refit& r = *refit_;
  if (!r.local_outcome_done || r.phase == Phase::kDone) return;
  // The next refit's BEGIN is waiting: the parent has moved on (see OnBegin).
  if (!deferred_begin_.empty()) return ReportOutcome();
  std::vector<uint32_t> ready;
  bool all = true;
  for (uint32_t s = 0; s < stripes(); ++s) {
    if (r.outcome_on[s]) continue;
    if (subtree(s).confirmed() || (r.phase == Phase::kAborting && !downstream_.AllConnected(s))) {
      ready.push_back(s);
    } else {
      all = false;
    }
  }
  // The last stripes go up from ReportOutcome, after the refit is counted here.
  if (all) return ReportOutcome();
  for (uint32_t s : ready) SendOutcome(s);
}

// Decided and done here, only confirmations from below outstanding, and the node
// moves on to another refit (`next` says which): waiting longer would only hold that
// one up, so what it has goes up now, on every stripe it has not gone up yet. A
// resolution that replaced such a refit sent nothing more on those stripes, and
// their parents waited for this node's outcome until their timeout (the
// simulator's --stripes seed 12317: a rollback that failed, its FAILED held for a
// child's confirmation, then an older delta's COMMIT came).
void NodeAgent::Impl::ReportBeforeMovingOn(const std::string& next) {
  if (!refit_ || refit_->phase == Phase::kDone || refit_->phase == Phase::kStreaming ||
      !refit_->local_outcome_done) {
    return;
  }
  size_t awaiting = 0;
  ForEachSubtree([&](Subtree& t) { awaiting += t.AwaitingConfirmation(); });
  log::Info(fmt::format("{}: {}; reporting refit {} without {} confirmations", options_.node_id,
                        next, refit_->id, awaiting));
  ReportOutcome();
}

void NodeAgent::Impl::SendOutcome(uint32_t stripe) {
  Refit& r = *refit_;
  if (r.outcome_on[stripe]) return;
  r.outcome_on[stripe] = true;
  const bool committed = r.phase == Phase::kCommitting;
  if (r.outcome_error.ok()) {
    Outcome outcome{r.id, 1 + subtree(stripe).confirmed_nodes(), subtree(stripe).pauses()};
    outcome.pauses.push_back({options_.node_id, r.pause_seconds, r.hold_seconds});
    parents_[stripe]->Send(
        EncodeOutcome(committed ? MessageType::kCommitted : MessageType::kAborted, outcome));
  } else {
    // Not at the decided version: say so, and the parent stops waiting for this
    // subtree at once (a decided parent excuses a child that says FAILED); this node
    // resolves its delta at a later refit.
    parents_[stripe]->Send(
        EncodeFailed(Failed{r.id, options_.node_id, r.outcome_error.ToString()}));
  }
}

void NodeAgent::Impl::ReportOutcome() {
  Refit& r = *refit_;
  if (r.phase == Phase::kDone) return;
  const bool committed = r.phase == Phase::kCommitting;
  committed_last_ = committed;
  if (options_.on_outcome) options_.on_outcome(r.id, r.identity.target_version, committed);
  ForEachSubtree([](Subtree& t) { t.EndRefit(); });
  // Counted before the parent hears it, so stats() agrees with what the source reports.
  const NodeAgentStats s = [&] {
    MutexLock lock(stats_mu_);
    (committed ? stats_.refits_committed : stats_.refits_aborted)++;
    stats_.last_pause_seconds = r.pause_seconds;
    stats_.last_prepared_hold_seconds = r.hold_seconds;
    stats_.pause_seconds_total += r.pause_seconds;
    return stats_;
  }();
  for (uint32_t s = 0; s < stripes(); ++s) SendOutcome(s);
  r.phase = Phase::kDone;
  // Done for good here, unless its local commit or rollback failed (then a replayed
  // BEGIN or decision is told FAILED again, above).
  if (r.outcome_error.ok()) {
    NoteFinished(r.id, committed);
    if (r.resolves_refit) NoteFinished(*r.resolves_refit, committed);
  }
  RunDeferredBegin();
  log::Info(fmt::format(
      "{}: refit {} {}: version {}, received {} B ({:.2f} MiB) in {} chunks, resent {} B, "
      "refetched {}, repair {} B, {} partitions applied, apply {:.2f} s, engine paused {:.4f} "
      "s, prepared delta held {:.2f} s, total {:.2f} s, peak held {:.2f} MiB, {} children",
      options_.node_id, r.id, committed ? "committed" : "aborted", s.version.ShortHex(),
      r.chunk_bytes, double(r.chunk_bytes) / (1 << 20), r.chunks, r.resent_bytes, refetches_,
      r.repair_bytes, r.partitions_applied, r.apply_seconds, r.pause_seconds, r.hold_seconds,
      std::chrono::duration<double>(Clock::now() - r.start).count(),
      double(s.peak_held_bytes) / (1 << 20), self_.children.size()));
}

}  // namespace deltacast::relay
