// A relay node's refit, subtree half: a local failure said up every stripe (and the
// children it can no longer serve sent to their failover parents), PREPARED once this
// node and a stripe's subtree verified the target, and children that (re)join
// mid-refit replayed what they lack. The streaming half is node_refit.cc, the
// decision half node_outcome.cc.
#include <fmt/core.h>

#include <algorithm>

#include "common/crash_point.h"
#include "common/elapsed.h"
#include "common/log.h"
#include "relay/tree/node_impl.h"
#include "relay/tree/replay.h"
#include "relay/tree/stripe_links.h"

namespace deltacast::relay {

// ---- prepare ------------------------------------------------------------------------

void NodeAgent::Impl::LocalFailure(uint64_t id, const Status& status, FailureKind kind) {
  if (!refit_ || refit_->id != id || !refit_->local_error.ok()) return;
  refit_->local_error = status;
  log::Error(fmt::format("{}: refit {} cannot reach the target: {}", options_.node_id, id,
                         status.ToString()));
  // A base this node does not hold: what joining found says which weights differ.
  const std::string note = status.code() == StatusCode::kVersionMismatch
                               ? join_.NoteFor(refit_->identity.base_version)
                               : "";
  SendFailed(Failed{id, options_.node_id, status.ToString() + note, kind});
}

void NodeAgent::Impl::SendFailed(const Failed& failed) {
  if (!refit_) return;
  // Once is enough, except that this node's own failure goes up even after a
  // child's: a parent that has decided excuses only the child whose FAILED names
  // itself (the simulator's seed 17492: a child's FAILED, forwarded before the
  // replayed COMMIT came, hid this node's own and its parent waited the commit timeout).
  const bool own = failed.node_id == options_.node_id;
  if (refit_->failed_sent && (!own || refit_->failed->node_id == options_.node_id)) return;
  refit_->failed_sent = true;
  refit_->failed = failed;
  if (own && failed.kind == FailureKind::kNode) NoteFailedHere(failed.refit_id);
  ForEachSubtree([](Subtree& t) { t.FailedHere(); });
  // Up every stripe: each parent stops waiting for this subtree.
  SendUpAll(EncodeFailed(failed));
  ShedChildrenIfLeftOut();
}

bool NodeAgent::Impl::LeftOutOfStreamingRefit() const {
  return stripes() > 1 &&
         options_.config.tree.commit_policy == topology::CommitPolicy::kAvailable && refit_ &&
         refit_->phase == Phase::kStreaming && refit_->failed &&
         refit_->failed->node_id == options_.node_id && refit_->failed->kind == FailureKind::kNode;
}

std::string NodeAgent::Impl::LeftOutReason(uint64_t refit_id) const {
  return fmt::format("'{}' cannot take part in refit {}; join your failover parent",
                     options_.node_id, refit_id);
}

// Its parents leave this node out (policy `available`) and stop streaming to it. With
// one tree its subtree is left out with it; striped, its children's other stripes'
// parents still wait for them, and its children on a stripe whose END it lacks would
// wait for chunks that never come until the commit timeout (the simulator's
// --stripes seeds 6, 50 and most of the known ones). Refused, they fail over to their
// failover parents, which replay them the refit; they come home between refits. The
// children of a stripe whose END came have been forwarded all of it.
void NodeAgent::Impl::ShedChildrenIfLeftOut() {
  const bool streaming = refit_ && refit_->phase == Phase::kStreaming;
  if (LeftOutOfStreamingRefit() && refit_->id != shed_refit_) {
    std::set<uint32_t> lacking;
    for (uint32_t s = 0; s < stripes(); ++s) {
      if (!refit_->ends.contains(s)) lacking.insert(s);
    }
    if (lacking.empty()) return;
    shed_refit_ = refit_->id;
    log::Warn(fmt::format("{}: left out of refit {}: its children fail over", options_.node_id,
                          refit_->id));
    return downstream_.Shed(LeftOutReason(refit_->id), std::move(lacking), refit_->id);
  }
  // Left out until the refit is decided here or another begins (a BEGIN replayed for
  // the same refit does not bring back what this node's parents stopped sending).
  if (!downstream_.shedding() || (streaming && refit_->id == shed_refit_)) return;
  downstream_.Shed(std::nullopt);
}

void NodeAgent::Impl::GiveUpOnAwayStripe(Clock::time_point now) {
  if (stripes() < 2 || options_.config.tree.commit_policy != topology::CommitPolicy::kAvailable ||
      !refit_ || refit_->phase != Phase::kStreaming || refit_->resolution ||
      !refit_->local_error.ok()) {
    return;
  }
  // As long as its parent there waits for it, and its failover parent had its turn
  // (ParentLink dials it after kFailoverAfter and the planned one again after twice that).
  const auto timeout = std::max<std::chrono::milliseconds>(options_.config.tree.connect_timeout,
                                                           2 * ParentLink::kFailoverAfter);
  for (uint32_t s = 0; s < stripes(); ++s) {
    // A parent there that has not begun this refit on the link serves it nothing
    // either: one left out of the refit, one not in it at all, a source that cannot
    // replay it (the simulator's --stripes seeds 10284, 10298 waited the commit
    // timeout for a node whose stripe parent was joined but silent).
    const bool served = parents_[s]->joined() && begin_on_[s] == refit_->id;
    if (refit_->ends.contains(s) || served) continue;
    if (ShedByEveryParent(s)) {
      // Each said so itself: nothing of this stripe can come in this refit, and
      // waiting out the timeout below would hold every other stripe's parents, level
      // after level down the stripe (the simulator's --stripes seed 10284).
      return LocalFailure(
          refit_->id, Status::Unavailable(fmt::format(
                          "every parent of stripe {} ({}{}) is left out of this refit: its "
                          "chunks of this refit cannot come",
                          s, *selves_[s].parent,
                          selves_[s].failover_parent ? ", " + *selves_[s].failover_parent : "")));
    }
    const auto since = std::max(stripe_away_since_[s].value_or(refit_->start), refit_->start);
    if (now - since <= timeout) continue;
    return LocalFailure(refit_->id,
                        Status::Unavailable(fmt::format(
                            "no parent of stripe {} has served this refit for {} ms: its chunks "
                            "of this refit cannot come",
                            s, timeout.count())));
  }
}

bool NodeAgent::Impl::ShedByEveryParent(uint32_t stripe) const {
  const auto shed = [&](const std::optional<std::string>& parent) {
    auto it = parent ? shed_by_[stripe].find(*parent) : shed_by_[stripe].end();
    return it != shed_by_[stripe].end() && it->second == refit_->id;
  };
  const topology::PlannedNode& self = selves_[stripe];
  return shed(self.parent) && (!self.failover_parent || shed(self.failover_parent));
}

// PREPARED goes up each stripe once this node verified the target and that stripe's
// children have prepared: per stripe, so trees whose interior nodes differ never
// wait on each other.
void NodeAgent::Impl::MaybePrepared() {
  Refit& r = *refit_;
  if (!r.local_prepared || !r.local_error.ok()) return;
  NodeReport self{options_.node_id, r.chunk_bytes, SecondsSince(r.start), r.partitions_applied};
  self.receive_seconds = r.receive_seconds;
  self.check_seconds = r.check_seconds + r.finish_seconds;
  self.write_seconds = r.write_seconds;
  self.apply_cpu_seconds = r.apply_cpu_seconds;
  self.cpu_wait_seconds = r.apply_runnable_seconds;
  self.disk_wait_seconds = r.apply_blocked_seconds;
  bool sent = false;
  for (uint32_t s = 0; s < stripes(); ++s) {
    if (r.prepared_on[s]) continue;
    if (!subtree(s).prepared() && r.phase == Phase::kStreaming) continue;
    r.prepared_on[s] = true;
    Prepared prepared{r.id, subtree(s).reports()};
    prepared.nodes.push_back(self);
    parents_[s]->Send(EncodePrepared(prepared));
    log::Info(fmt::format("{}: refit {}: prepared with {} nodes below{}", options_.node_id, r.id,
                          prepared.nodes.size() - 1,
                          stripes() > 1 ? " in stripe " + std::to_string(s) : ""));
    sent = true;
  }
  if (sent && !r.prepared_sent) {
    r.prepared_sent = true;
    CrashPoint("agent.prepared");
  }
  if (r.pending_decision) {
    // Decided already (the COMMIT came right behind the chunks this node lacked):
    // its own apply was all it waited for. Its children's PREPAREDs are moot now; a
    // child that has the decision too never sends one (it catches up instead), and
    // waiting for it held this node, and its parents' commit timeout, for good (the
    // simulator's --stripes seed 29488).
    const MessageType decision = *r.pending_decision;
    r.pending_decision.reset();
    Decide(decision);
  }
}

void NodeAgent::Impl::OnChildPrepared(const std::string& child, ByteSpan bytes) {
  if (!refit_) return;
  auto p = ParsePrepared(bytes);
  if (!p.ok() || p->refit_id != refit_->id) return;
  subtree(StripeOfLink(child)).OnPrepared(child, p->nodes);
}

void NodeAgent::Impl::OnChildFailed(const std::string& child, ByteSpan bytes) {
  if (!refit_) return;
  auto f = ParseFailed(bytes);
  if (f.ok() && f->refit_id == refit_->id) subtree(StripeOfLink(child)).OnFailed(child, *f);
}

// The parent half of the commit is the Subtree's; the node acts on what it reports.
Subtree::Owner NodeAgent::Impl::SubtreeOwner() {
  Subtree::Owner owner;
  owner.leave_out = [this](const std::string& child) { downstream_.Excuse(child); };
  owner.fail = [this](const Failed& failed, const std::string&) { SendFailed(failed); };
  owner.changed = [this] {
    if (!refit_) return;
    // Every stripe's subtree is in the same phase.
    if (subtree(0).streaming()) return MaybePrepared();
    if (subtree(0).deciding()) MaybeOutcome();
  };
  return owner;
}

// ---- children that (re)join ------------------------------------------------------

// A child (re)joined. If it missed part of the current refit, queue for it: BEGIN,
// the spooled chunks it has not applied, and the decision if one was made.
void NodeAgent::Impl::OnChildJoined(const std::string& child, const Hello& hello) {
  const bool adopted = downstream_.IsAdopted(child);
  Subtree& tree = subtree(StripeOfLink(child));
  tree.Joined(child, adopted, Clock::now());
  child_holds_[child] = {hello.active_version, hello.inflight_target};
  // Told on every stripe's link: the child checks the first it gets after it joined.
  TellVersion(child, hello);
  if (adopted) {
    log::Info(fmt::format("{}: adopted {}, whose parent is unreachable", options_.node_id, child));
  }
  if (!refit_) return;
  Refit& r = *refit_;
  // Rolling back another stream of the delta: the child is sent the BEGIN that
  // waits, and does the same.
  if (r.stream_rollback) return;
  if (r.decided_by_record && options_.verify_key && r.phase != Phase::kStreaming) {
    // Decided from the commit record: there is no signed decision to send, and the
    // child would refuse an unsigned one. A child that holds the delta reads the
    // record itself and confirms; one that does not has nothing to do in this refit.
    if (hello.inflight_target != r.identity.target_version) {
      subtree(StripeOfLink(child)).Excuse(child);
      return MaybeOutcome();
    }
    return;
  }
  const bool committed =
      r.phase == Phase::kCommitting || (r.phase == Phase::kDone && committed_last_);
  const Digest128& target = r.identity.target_version;
  if (r.resolution || (committed && r.begin.refit_id != r.id)) {
    // Known here from its decision alone (a resolution, or this node came back after
    // committing it): there is no BEGIN nor chunk to replay. A child that holds the
    // delta (or, committed, its target) is sent the decision alone: it resolves its
    // delta, or confirms again. A replay would send it an empty BEGIN, which it
    // passes down, and its children then never confirm (the simulator's seed 14756
    // waited the commit timeout). A child with neither cannot reach the target in
    // this refit: not waited for; it catches up at a later one.
    if (hello.inflight_target == target || (committed && hello.active_version == target)) {
      return downstream_.Requeue(
          child, {Downstream::Outgoing::Control(
                     DecisionFor(committed ? MessageType::kCommit : MessageType::kAbort))});
    }
    log::Warn(
        fmt::format("{}: child {} rejoined without refit {}'s delta, which this node "
                    "knows only from its decision; not waiting for it",
                    options_.node_id, child, r.id));
    tree.Excuse(child);
    return MaybeOutcome();
  }
  if (LeftOutOfStreamingRefit() && r.unspooled.contains(StripeOfLink(child))) {
    // Its spool lacks chunks of the stripe (the full disk that left it out): the
    // replay from here would stop short of the END, and the child would wait for it
    // to the commit timeout (the simulator's --stripes seed 29931: "replaying 0
    // chunks"). Refused like the children shed at the failure, it fails over and is
    // replayed the refit there. (A whole spool replays as for any relay: its
    // failover parent may be down, seed 11328.)
    return downstream_.RefuseForRefit(child, LeftOutReason(r.id), r.id);
  }
  std::optional<bool> decided;
  if (committed) decided = true;
  if (r.phase == Phase::kAborting || (r.phase == Phase::kDone && !committed_last_)) decided = false;
  switch (tree.Rejoined(child, hello, target, decided)) {
    case Subtree::Rejoin::kDecisionAgain:
      return downstream_.Requeue(
          child, {Downstream::Outgoing::Control(DecisionFor(MessageType::kCommit))});
    case Subtree::Rejoin::kNothing:
      return;
    case Subtree::Rejoin::kReplay:
      break;
  }
  transport::Message decision;
  if (decided) decision = DecisionFor(*decided ? MessageType::kCommit : MessageType::kAbort);
  Replay replay = ReplayFor(hello, r.begin, r.spool, decision);
  log::Info(fmt::format("{}: child {} rejoined during refit {}: replaying {} chunks it lacks",
                        options_.node_id, child, r.id, replay.chunks));
  downstream_.Requeue(child, std::move(replay.messages));
}

}  // namespace deltacast::relay
