// RefitChildren: what one node of the tree (a relay or the source) knows about its
// children during a refit: who is connected, who was adopted (a grandchild whose
// parent died), who is excused (policy `available`: away or failed, the version does
// not wait for it), who PREPARED with which reports, who confirmed the decision with
// how many nodes, and how long each absent child has been away. It decides nothing
// about the protocol: its owner asks it whom the refit still waits for and which
// children have been away too long, and acts.
//
// Phases: idle (no refit), streaming (BeginRefit .. Decided: absence is timed
// against the connect timeout by the owner), deciding (Decided .. EndRefit: an
// absent child is waited for until its deadline, then given up on: it learns the
// decision when it is back).
//
// Thread safety: none; one thread (or the owner's lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/runtime.h"
#include "relay/protocol.h"

namespace deltacast::relay {

class RefitChildren {
 public:
  using Clock = RuntimeClock;

  explicit RefitChildren(std::vector<std::string> planned);

  // Link events, whatever the phase. An adopted child counts while it is connected.
  void Joined(const std::string& child, bool adopted, Clock::time_point now);
  void Lost(const std::string& child, Clock::time_point now);

  // A refit begins: the last one's bookkeeping is forgotten; absent planned children
  // are timed from `now`.
  void BeginRefit(Clock::time_point now);
  // The decision is made: a planned child that is not connected (nor excused, nor
  // confirmed) is waited for until `now + grace`; one whose link drops later, for
  // `lost_grace` from then.
  void Decided(Clock::time_point now, std::chrono::milliseconds grace,
               std::chrono::milliseconds lost_grace);
  void EndRefit();
  bool streaming() const { return phase_ == Phase::kStreaming; }
  bool deciding() const { return phase_ == Phase::kDeciding; }

  // The refit stops waiting for `child` (and stops timing it) until the next one.
  void Excuse(const std::string& child);
  bool Excused(const std::string& child) const { return excused_.contains(child); }
  // A child that rejoined mid-refit is replayed what it lacks and prepares again.
  void Rejoined(const std::string& child) { prepared_.erase(child); }
  // Whether this is the child's first PREPARED (resp. confirmation) of the refit.
  bool Prepared(const std::string& child, const std::vector<NodeReport>& nodes);
  bool Confirmed(const std::string& child, uint32_t nodes,
                 const std::vector<PauseReport>& pauses = {});

  // Children the refit still waits for: planned ones not done, excused or given up
  // on, and adopted ones connected now that are not done.
  size_t AwaitingPrepared() const { return Awaiting(prepared_); }
  size_t AwaitingConfirmation() const { return Awaiting(confirmed_); }

  // Streaming: planned children away longer than `timeout`, not excused.
  std::vector<std::string> AwayLongerThan(Clock::time_point now,
                                          std::chrono::milliseconds timeout) const;
  // Deciding: the children whose deadline passed, now given up on.
  std::vector<std::string> GiveUpOnAway(Clock::time_point now);

  bool AllPlannedConnected() const { return connected_.size() == planned_.size(); }
  bool AnyConnected() const { return !connected_.empty() || !adopted_.empty(); }
  std::vector<std::string> AbsentPlanned() const;
  bool IsAdopted(const std::string& child) const { return adopted_.contains(child); }
  const std::vector<std::string>& planned() const { return planned_; }
  const std::vector<NodeReport>& reports() const { return reports_; }
  uint32_t confirmed_nodes() const { return confirmed_nodes_; }
  const std::vector<PauseReport>& pauses() const { return pauses_; }

 private:
  enum class Phase { kIdle, kStreaming, kDeciding };
  size_t Awaiting(const std::set<std::string>& done) const;
  bool IsPlanned(const std::string& child) const;

  std::vector<std::string> planned_;
  std::set<std::string> connected_;  // planned children with a link now
  std::set<std::string> adopted_;    // adopted children with a link now
  Phase phase_ = Phase::kIdle;
  std::chrono::milliseconds lost_grace_{0};
  // Refit-scoped.
  std::set<std::string> excused_;
  std::set<std::string> prepared_;
  std::set<std::string> confirmed_;
  std::set<std::string> given_up_;                       // deciding: not waited for
  std::map<std::string, Clock::time_point> away_since_;  // streaming
  std::map<std::string, Clock::time_point> away_until_;  // deciding
  std::vector<NodeReport> reports_;
  uint32_t confirmed_nodes_ = 0;
  std::vector<PauseReport> pauses_;  // the confirmed subtrees' engine pauses
};

}  // namespace deltacast::relay
