#include "relay/tree/subtree.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"
#include "relay/tree/stripe_links.h"

namespace deltacast::relay {

Subtree::Subtree(std::vector<std::string> planned, Rules rules, Owner owner)
    : planned_(std::move(planned)), rules_(std::move(rules)), owner_(std::move(owner)) {}

bool Subtree::IsPlanned(const std::string& child) const {
  return std::find(planned_.begin(), planned_.end(), child) != planned_.end();
}

// ---- links -------------------------------------------------------------------------

void Subtree::Joined(const std::string& child, bool adopted, Clock::time_point) {
  (adopted ? adopted_ : connected_).insert(child);
  refused_.erase(child);
  away_since_.erase(child);
  away_until_.erase(child);
}

void Subtree::Lost(const std::string& child, Clock::time_point now) {
  if (adopted_.erase(child)) {
    // Not ours to wait for: the refit may now be prepared or confirmed (else a relay
    // whose last awaited confirmation was an adopted child's that died waited its
    // commit timeout: the simulator's seeds 3684, 12423).
    if (phase_ != Phase::kIdle) Changed();
    return;
  }
  connected_.erase(child);
  if (phase_ == Phase::kStreaming && !excused_.contains(child)) away_since_[child] = now;
  if (phase_ == Phase::kDeciding && !confirmed_.contains(child) && !excused_.contains(child))
    away_until_[child] = now + rules_.connect_timeout;
}

void Subtree::Refused(const std::string& child, const std::string& reason) {
  refused_[child] = reason;
}

std::string Subtree::RefusalOf(const std::string& child) const {
  auto it = refused_.find(child);
  return it == refused_.end() ? "" : " (its last attempt was refused: " + it->second + ")";
}

// ---- phases ------------------------------------------------------------------------

void Subtree::BeginRefit(uint64_t refit_id, Clock::time_point now) {
  // A refit begun again (a relay that began it behind a failed catch-up, committed
  // its held delta from before, then began it once more) keeps the children it left
  // out of it: they said FAILED once and are sent nothing more of it (Downstream
  // keeps them excused too); waited for again, they held this stripe's PREPARED to
  // the commit timeout (the simulator's --stripes seed 20749).
  excused_.clear();
  for (const auto& [child, refits] : left_out_of_) {
    if (std::find(refits.begin(), refits.end(), refit_id) != refits.end()) excused_.insert(child);
  }
  phase_ = Phase::kStreaming;
  refit_id_ = refit_id;
  failed_here_ = false;
  commit_waits_ = false;
  failed_child_.clear();
  prepared_.clear();
  confirmed_.clear();
  given_up_.clear();
  away_since_.clear();
  away_until_.clear();
  reports_.clear();
  confirmed_nodes_ = 0;
  pauses_.clear();
  for (const auto& child : AbsentPlanned()) away_since_[child] = now;
}

void Subtree::Decided(Clock::time_point now, std::optional<std::chrono::milliseconds> grace) {
  phase_ = Phase::kDeciding;
  commit_waits_ = false;
  away_since_.clear();
  for (const auto& child : AbsentPlanned()) {
    if (!excused_.contains(child) && !confirmed_.contains(child))
      away_until_[child] = now + grace.value_or(rules_.connect_timeout);
  }
}

void Subtree::EndRefit() {
  phase_ = Phase::kIdle;
  away_since_.clear();
  away_until_.clear();
}

void Subtree::CommitWaitsForThisNode() {
  commit_waits_ = true;
  if (failed_child_.empty() || excused_.contains(failed_child_)) return;
  // This node said the child could not take part, but the refit committed above
  // all the same: the child is not waited for (it catches up later); this node
  // prepares and commits without it. Else its parent, decided, ignores the FAILED
  // passed up and waits its commit timeout (the simulator's seed 12141).
  Excuse(failed_child_);
  owner_.leave_out(failed_child_);
  Changed();
}

Status Subtree::GoOnWithoutAbsent() {
  const std::vector<std::string> absent = AbsentPlanned();
  if (absent.empty()) return Status::Ok();
  std::string missing;
  for (const auto& c : absent) {
    auto refused = refused_.find(c);
    missing += (missing.empty() ? "" : ", ") + c +
               (refused != refused_.end() ? " (refused: " + refused->second + ")"
                                          : " (never connected: not started, or unreachable)");
  }
  const bool any = !connected_.empty() || !adopted_.empty();
  const bool weightless = std::all_of(
      absent.begin(), absent.end(), [&](const std::string& c) { return weightless_.contains(c); });
  const bool available = rules_.policy == topology::CommitPolicy::kAvailable;
  if ((!available && !weightless) || !any) {
    return Status::Unavailable("children did not join within " +
                               std::to_string(rules_.connect_timeout.count()) + " ms: " + missing);
  }
  log::Warn(rules_.log_prefix + "children did not join; the refit goes on without them (" +
            (available ? "commit policy available" : "they hold no weights") + "): " + missing);
  for (const auto& c : absent) {
    Excuse(c);
    owner_.leave_out(c);
  }
  Changed();
  return Status::Ok();
}

// ---- what the children say ---------------------------------------------------------

void Subtree::OnPrepared(const std::string& child, const std::vector<NodeReport>& nodes) {
  if (!prepared_.insert(child).second) return;
  // A child that prepared again after rejoining reports its subtree again.
  std::erase_if(reports_, [&](const NodeReport& n) {
    return std::any_of(nodes.begin(), nodes.end(),
                       [&](const NodeReport& m) { return m.node_id == n.node_id; });
  });
  reports_.insert(reports_.end(), nodes.begin(), nodes.end());
  Changed();
}

void Subtree::OnFailed(const std::string& child, const Failed& failed) {
  // `child` is the link's key ("n4#1" on stripe 1): its node's own FAILED names the
  // node (the simulator's --stripes seed 1: a relay waited the commit timeout for a
  // stripe-1 child that had said FAILED).
  const bool own = failed.node_id == NodeOfLink(child);
  if (own && (phase_ != Phase::kStreaming || commit_waits_)) {
    // The decision is known: its confirmation will not come (it rejoined and cannot
    // apply the delta: a full disk), and a FAILED sent up would fail nothing. Not
    // waited for; it catches up at a later refit (the simulator's seed 1699).
    log::Warn(fmt::format("{}child {} cannot reach the {} target ({}); not waiting for it",
                          rules_.log_prefix, child, commit_waits_ ? "committed" : "decided",
                          log::Escape(failed.reason)));
    Excuse(child);
    if (commit_waits_) owner_.leave_out(child);
    return Changed();
  }
  if (own && failed.kind == FailureKind::kNode && MayGoOnWithout()) {
    GoOnWithout(child, fmt::format("child {} cannot reach the target ({})", child,
                                   log::Escape(failed.reason)));
    return;
  }
  if (own) failed_child_ = child;
  Fail(failed, "node '" + failed.node_id + "': " + log::Escape(failed.reason));
}

bool Subtree::CannotTakePart(const std::string& child, const std::string& why) {
  if (MayGoOnWithout()) {
    GoOnWithout(child, why);
    return true;
  }
  Fail(Failed{refit_id_, NodeOfLink(child), why}, why);
  return false;
}

bool Subtree::MayGoOnWithout() const {
  return rules_.policy == topology::CommitPolicy::kAvailable && phase_ == Phase::kStreaming;
}

// Like an absent child: the version goes on without it and its subtree, which catch
// up at a later refit.
void Subtree::GoOnWithout(const std::string& child, const std::string& why) {
  LeaveOut(child, why + "; refit " + std::to_string(refit_id_) +
                      " goes on without it (commit policy available)");
  Changed();
}

void Subtree::OnConfirmed(const std::string& child, uint32_t nodes,
                          const std::vector<PauseReport>& pauses) {
  if (!confirmed_.insert(child).second) return;
  confirmed_nodes_ += nodes;
  pauses_.insert(pauses_.end(), pauses.begin(), pauses.end());
  away_until_.erase(child);
  Changed();
}

Subtree::Rejoin Subtree::Rejoined(const std::string& child, const Hello& hello,
                                  const Digest128& target, std::optional<bool> committed) {
  const bool holds_delta = hello.inflight_target == target;
  if (!holds_delta && hello.active_version == target && committed == true) {
    // It committed, then lost the link before confirming: COMMIT again makes it
    // gather its subtree's confirmations and answer.
    return Rejoin::kDecisionAgain;
  }
  if (!holds_delta && committed == false) {
    // An aborted delta it does not hold: nothing to undo, and nothing to wait for (it
    // would never confirm a refit it never began: the simulator's seed 1255).
    OnConfirmed(child, 1);
    return Rejoin::kNothing;
  }
  prepared_.erase(child);  // it prepares again
  return Rejoin::kReplay;
}

void Subtree::Excuse(const std::string& child) {
  excused_.insert(child);
  std::deque<uint64_t>& refits = left_out_of_[child];
  if (std::find(refits.begin(), refits.end(), refit_id_) == refits.end())
    refits.push_back(refit_id_);
  if (refits.size() > kLeftOutKept) refits.pop_front();
  away_since_.erase(child);
  away_until_.erase(child);
}

// ---- the clock -----------------------------------------------------------------------

void Subtree::Tick(Clock::time_point now) {
  if (phase_ == Phase::kDeciding) {
    bool gave_up = false;
    for (auto it = away_until_.begin(); it != away_until_.end();) {
      if (now < it->second) {
        ++it;
        continue;
      }
      log::Warn(
          fmt::format("{}child {} is away; it learns the decision of refit {} when it is back",
                      rules_.log_prefix, it->first, refit_id_));
      given_up_.insert(it->first);
      it = away_until_.erase(it);
      gave_up = true;
    }
    if (gave_up) Changed();
    return;
  }
  if (phase_ != Phase::kStreaming) return;
  std::vector<std::string> away;
  for (const auto& [child, since] : away_since_) {
    if (now - since > rules_.connect_timeout) away.push_back(child);
  }
  bool left_out = false;
  for (const auto& child : away) {
    const bool weightless = weightless_.contains(child);
    if (rules_.policy == topology::CommitPolicy::kAvailable || failed_here_ || weightless) {
      // It does not block the version: it catches up when it is back (its parent
      // replays the refit and its decision). One without weights has nothing to catch
      // up; its children failed over past it.
      LeaveOut(child,
               fmt::format("child {} is away; refit {} goes on without it ({})", child, refit_id_,
                           failed_here_ ? "the refit failed here anyway"
                           : weightless ? "it holds no weights"
                                        : "commit policy available"));
      left_out = true;
      continue;
    }
    const std::string why =
        "child '" + child + "' has been away longer than the connect timeout" + RefusalOf(child);
    // The FAILED names the node, not the link ("n6#2" on stripe 2): a node id with
    // the stripe's suffix is no valid node id, and every parent up the tree dropped
    // the message as malformed while the source waited out the commit timeout (the
    // simulator's --stripes seed 11347, policy `all`, an interior node not started).
    Fail(Failed{refit_id_, NodeOfLink(child), why}, why);
  }
  if (left_out) Changed();
}

// ---- helpers -------------------------------------------------------------------------

void Subtree::LeaveOut(const std::string& child, const std::string& why) {
  log::Warn(rules_.log_prefix + why);
  Excuse(child);
  owner_.leave_out(child);
}

void Subtree::Fail(const Failed& failed, const std::string& why) {
  failed_here_ = true;
  owner_.fail(failed, why);
}

void Subtree::Changed() const {
  if (owner_.changed) owner_.changed();
}

size_t Subtree::Awaiting(const std::set<std::string>& done) const {
  size_t waiting = 0;
  ForEachAwaited(done, [&](const std::string&) { ++waiting; });
  return waiting;
}

std::vector<std::string> Subtree::Unconfirmed() const {
  std::vector<std::string> out;
  ForEachAwaited(confirmed_, [&](const std::string& c) { out.push_back(c); });
  return out;
}

std::vector<std::string> Subtree::AbsentPlanned() const {
  std::vector<std::string> out;
  for (const auto& c : planned_) {
    if (!connected_.contains(c)) out.push_back(c);
  }
  return out;
}

// ---- striped relays -------------------------------------------------------------

namespace {

// Each node's first entry over every stripe's subtree: a node in several stripes (or
// twice in one, confirmed to its parent and, failed over, to its grandparent) once.
template <typename Entry, typename EntriesOf>
std::vector<Entry> FirstPerNode(const std::vector<std::unique_ptr<Subtree>>& trees,
                                EntriesOf entries_of) {
  std::vector<Entry> all;
  std::set<std::string> seen;
  for (const auto& t : trees) {
    for (const Entry& e : entries_of(*t)) {
      if (seen.insert(e.node_id).second) all.push_back(e);
    }
  }
  return all;
}

}  // namespace

std::vector<NodeReport> MergedReports(const std::vector<std::unique_ptr<Subtree>>& trees) {
  return FirstPerNode<NodeReport>(
      trees, [](const Subtree& t) -> const auto& { return t.reports(); });
}

std::vector<PauseReport> MergedPauses(const std::vector<std::unique_ptr<Subtree>>& trees) {
  return FirstPerNode<PauseReport>(
      trees, [](const Subtree& t) -> const auto& { return t.pauses(); });
}

uint32_t NodesConfirmed(const std::vector<std::unique_ptr<Subtree>>& trees) {
  if (trees.size() == 1) return trees.front()->confirmed_nodes();
  return static_cast<uint32_t>(MergedPauses(trees).size());
}

}  // namespace deltacast::relay
