// Subtree: the parent half of the two-phase commit, in one place. A parent (the
// source, every relay node, a bucket bridge's downlink) owns one for its children
// and tells it what happens: links joining and dropping, refits beginning and being
// decided, the children's PREPARED, FAILED and confirmations, and the clock. The
// Subtree keeps the bookkeeping (who is connected, adopted, excused, prepared,
// confirmed, how long each absent child has been away) and applies the rules:
//   - streaming, a child away longer than the connect timeout fails the refit here
//     (policy `all`), or is left out of it (`available`, a child that holds no
//     weights, or once the refit failed here anyway: chunks queued for it would
//     only hold the parent's credit);
//   - streaming, a child that cannot reach the target (its own FAILED, or a replay
//     that would lack chunks) fails the refit (`all`) or is left out (`available`);
//     a FAILED from further below always fails it;
//   - once the decision is known (decided here, or a COMMIT from above waits for
//     this node to prepare), a child that FAILs is not waited for: it catches up
//     at a later refit;
//   - after the decision, an absent child is waited for until its deadline, then
//     given up on: it learns the decision when it is back;
//   - a child that rejoins mid-refit is replayed what it lacks and prepares again;
//     one that holds nothing of an aborted delta has nothing to undo;
//   - the subtree is prepared (resp. confirmed) once no child is awaited.
// It reports what the parent must act on through Owner: leave a child out (stop
// holding chunks for it), pass a failure up (or, at the source, abort), and
// "changed" (the subtree may now be prepared or confirmed: check prepared() and
// confirmed()). Callbacks run at the end of the call that caused them.
//
// Phases: idle (no refit), streaming (BeginRefit .. Decided), deciding (Decided ..
// EndRefit).
//
// Thread safety: none; one thread (or the owner's lock, held across callbacks).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/runtime.h"
#include "common/status.h"
#include "relay/wire/protocol.h"
#include "topology/cluster_config.h"

namespace deltacast::relay {

class Subtree {
 public:
  using Clock = RuntimeClock;

  struct Rules {
    topology::CommitPolicy policy = topology::CommitPolicy::kAll;
    std::chrono::milliseconds connect_timeout{10000};
    std::string log_prefix;  // ahead of every log line: "n3: ", "bucket downlink eu1: "
  };
  struct Owner {
    // The refit goes on without `child`: stop holding chunks for it.
    std::function<void(const std::string& child)> leave_out;
    // The refit fails in this subtree. `failed` is what goes up the tree (a node's
    // FAILED); `why` says it in one line, for a parent that reports it itself.
    std::function<void(const Failed& failed, const std::string& why)> fail;
    // The subtree may now be prepared or confirmed.
    std::function<void()> changed;
  };
  // What a child that (re)joined mid-refit is sent.
  enum class Rejoin {
    kDecisionAgain,  // it holds the committed target: COMMIT again, it confirms
    kNothing,        // the delta was aborted and it holds none of it
    kReplay,         // BEGIN, the chunks it lacks, and the decision if there is one
  };

  Subtree(std::vector<std::string> planned, Rules rules, Owner owner);

  // ---- links, whatever the phase. An adopted child counts while it is connected.
  void Joined(const std::string& child, bool adopted, Clock::time_point now);
  void Lost(const std::string& child, Clock::time_point now);
  // A child's last HELLO was refused (said when it is reported away).
  void Refused(const std::string& child, const std::string& reason);

  // ---- the refit's phases.
  // The last refit's bookkeeping is forgotten; absent planned children are timed
  // from `now`.
  void BeginRefit(uint64_t refit_id, Clock::time_point now);
  // The decision is made here: a planned child that is not connected (nor excused,
  // nor confirmed) is waited for until `now + grace` (default: the connect
  // timeout); one whose link drops later, for the connect timeout from then.
  void Decided(Clock::time_point now, std::optional<std::chrono::milliseconds> grace = {});
  void EndRefit();
  // A COMMIT from above waits for this node to prepare (a replay after a restart):
  // a child whose own FAILED this node passed up, and any that FAILs from now on,
  // is not waited for.
  void CommitWaitsForThisNode();
  // The refit failed here for a reason of the owner's own (its FAILED went up).
  void FailedHere() { failed_here_ = true; }
  // Before BEGIN (the source): the planned children that have not joined. Under
  // `available`, with any child connected, they are left out; else the refit
  // cannot start.
  Status GoOnWithoutAbsent();

  // ---- what the children say and do.
  void OnPrepared(const std::string& child, const std::vector<NodeReport>& nodes);
  void OnFailed(const std::string& child, const Failed& failed);
  void OnConfirmed(const std::string& child, uint32_t nodes,
                   const std::vector<PauseReport>& pauses = {});
  // `child` cannot reach the target in this refit, for a reason the parent found
  // (say, its replay would lack chunks). Whether it was left out.
  bool CannotTakePart(const std::string& child, const std::string& why);
  // A child joined while a refit to `target` is known here; `committed` is the
  // decision, if made.
  Rejoin Rejoined(const std::string& child, const Hello& hello, const Digest128& target,
                  std::optional<bool> committed);
  // The refit stops waiting for `child` (and stops timing it) until the next one;
  // for reasons of the owner's own (it knows the child cannot take part).
  void Excuse(const std::string& child);
  // `child` holds no weights (a sender the source feeds: sender_agent.h): away longer
  // than the connect timeout, or absent at the start, it is left out under either
  // policy. Its children fail over past it, and the refit still commits only once
  // every receiver has prepared. For the whole life of this object.
  void HoldsNoWeights(const std::string& child) { weightless_.insert(child); }
  // The clock: absent children are timed (streaming) or given up on (deciding).
  void Tick(Clock::time_point now);

  // ---- what the parent acts on.
  bool prepared() const { return Awaiting(prepared_) == 0; }
  bool confirmed() const { return Awaiting(confirmed_) == 0; }
  size_t AwaitingConfirmation() const { return Awaiting(confirmed_); }
  // The children (link keys) whose confirmation is awaited, for the log.
  std::vector<std::string> Unconfirmed() const;
  bool streaming() const { return phase_ == Phase::kStreaming; }
  bool deciding() const { return phase_ == Phase::kDeciding; }
  bool AllPlannedConnected() const { return connected_.size() == planned_.size(); }
  bool IsAdopted(const std::string& child) const { return adopted_.contains(child); }
  bool Excused(const std::string& child) const { return excused_.contains(child); }
  const std::vector<std::string>& planned() const { return planned_; }
  const std::vector<NodeReport>& reports() const { return reports_; }
  uint32_t confirmed_nodes() const { return confirmed_nodes_; }
  const std::vector<PauseReport>& pauses() const { return pauses_; }

 private:
  enum class Phase { kIdle, kStreaming, kDeciding };
  // Runs `f` on each child not in `done` that is still waited for: planned and
  // neither excused nor given up, or adopted and not excused.
  template <class F>
  void ForEachAwaited(const std::set<std::string>& done, F&& f) const {
    for (const auto& c : planned_) {
      if (!done.contains(c) && !excused_.contains(c) && !given_up_.contains(c)) f(c);
    }
    for (const auto& c : adopted_) {
      if (!done.contains(c) && !excused_.contains(c)) f(c);
    }
  }
  size_t Awaiting(const std::set<std::string>& done) const;
  bool IsPlanned(const std::string& child) const;
  std::vector<std::string> AbsentPlanned() const;
  bool MayGoOnWithout() const;  // a child that cannot take part is left out
  void GoOnWithout(const std::string& child, const std::string& why);
  void LeaveOut(const std::string& child, const std::string& why);
  void Fail(const Failed& failed, const std::string& why);
  std::string RefusalOf(const std::string& child) const;
  void Changed() const;

  std::vector<std::string> planned_;
  Rules rules_;
  Owner owner_;
  std::set<std::string> connected_;             // planned children with a link now
  std::set<std::string> adopted_;               // adopted children with a link now
  std::map<std::string, std::string> refused_;  // the last refused HELLO of each child
  std::set<std::string> weightless_;            // HoldsNoWeights
  Phase phase_ = Phase::kIdle;
  // Refit-scoped.
  uint64_t refit_id_ = 0;
  bool failed_here_ = false;
  bool commit_waits_ = false;  // CommitWaitsForThisNode
  std::string failed_child_;   // the child whose own FAILED went up from here
  std::set<std::string> excused_;
  // Each child's last refits it was excused from (BeginRefit): a refit begun again
  // may come after another (a held delta's, resolved in between).
  static constexpr size_t kLeftOutKept = 4;
  std::map<std::string, std::deque<uint64_t>> left_out_of_;
  std::set<std::string> prepared_;
  std::set<std::string> confirmed_;
  std::set<std::string> given_up_;                       // deciding: not waited for
  std::map<std::string, Clock::time_point> away_since_;  // streaming
  std::map<std::string, Clock::time_point> away_until_;  // deciding
  std::vector<NodeReport> reports_;
  uint32_t confirmed_nodes_ = 0;
  std::vector<PauseReport> pauses_;  // the confirmed subtrees' engine pauses
};

// What a striped relay's subtrees (one per stripe) report together. A node reports up
// every stripe it is in, and one stripe may hold a node twice (it confirmed to its
// parent and, failed over, to its grandparent: the simulator's --stripes seed 19), so
// each node counts once: the PREPARED reports and pause reports merged by node, and
// the nodes that confirmed (one tree: its own count; striped: the distinct nodes of
// the pause reports, which every confirming node adds).
std::vector<NodeReport> MergedReports(const std::vector<std::unique_ptr<Subtree>>& trees);
std::vector<PauseReport> MergedPauses(const std::vector<std::unique_ptr<Subtree>>& trees);
uint32_t NodesConfirmed(const std::vector<std::unique_ptr<Subtree>>& trees);

}  // namespace deltacast::relay
