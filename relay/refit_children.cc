#include "relay/refit_children.h"

#include <algorithm>

namespace deltacast::relay {

RefitChildren::RefitChildren(std::vector<std::string> planned) : planned_(std::move(planned)) {}

bool RefitChildren::IsPlanned(const std::string& child) const {
  return std::find(planned_.begin(), planned_.end(), child) != planned_.end();
}

void RefitChildren::Joined(const std::string& child, bool adopted, Clock::time_point) {
  (adopted ? adopted_ : connected_).insert(child);
  away_since_.erase(child);
  away_until_.erase(child);
}

void RefitChildren::Lost(const std::string& child, Clock::time_point now) {
  if (adopted_.erase(child)) return;  // not ours to wait for
  connected_.erase(child);
  if (phase_ == Phase::kStreaming && !excused_.contains(child)) away_since_[child] = now;
  if (phase_ == Phase::kDeciding && !confirmed_.contains(child) && !excused_.contains(child))
    away_until_[child] = now + lost_grace_;
}

void RefitChildren::BeginRefit(Clock::time_point now) {
  phase_ = Phase::kStreaming;
  excused_.clear();
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

void RefitChildren::Decided(Clock::time_point now, std::chrono::milliseconds grace,
                            std::chrono::milliseconds lost_grace) {
  phase_ = Phase::kDeciding;
  lost_grace_ = lost_grace;
  away_since_.clear();
  for (const auto& child : AbsentPlanned()) {
    if (!excused_.contains(child) && !confirmed_.contains(child)) away_until_[child] = now + grace;
  }
}

void RefitChildren::EndRefit() {
  phase_ = Phase::kIdle;
  away_since_.clear();
  away_until_.clear();
}

void RefitChildren::Excuse(const std::string& child) {
  excused_.insert(child);
  away_since_.erase(child);
  away_until_.erase(child);
}

bool RefitChildren::Prepared(const std::string& child, const std::vector<NodeReport>& nodes) {
  if (!prepared_.insert(child).second) return false;
  // A child that prepared again after rejoining reports its subtree again.
  std::erase_if(reports_, [&](const NodeReport& n) {
    return std::any_of(nodes.begin(), nodes.end(),
                       [&](const NodeReport& m) { return m.node_id == n.node_id; });
  });
  reports_.insert(reports_.end(), nodes.begin(), nodes.end());
  return true;
}

bool RefitChildren::Confirmed(const std::string& child, uint32_t nodes,
                              const std::vector<PauseReport>& pauses) {
  if (!confirmed_.insert(child).second) return false;
  confirmed_nodes_ += nodes;
  pauses_.insert(pauses_.end(), pauses.begin(), pauses.end());
  away_until_.erase(child);
  return true;
}

size_t RefitChildren::Awaiting(const std::set<std::string>& done) const {
  size_t waiting = 0;
  for (const auto& c : planned_) {
    waiting += !done.contains(c) && !excused_.contains(c) && !given_up_.contains(c);
  }
  for (const auto& c : adopted_) waiting += !done.contains(c) && !excused_.contains(c);
  return waiting;
}

std::vector<std::string> RefitChildren::AwayLongerThan(Clock::time_point now,
                                                       std::chrono::milliseconds timeout) const {
  std::vector<std::string> out;
  if (phase_ != Phase::kStreaming) return out;
  for (const auto& [child, since] : away_since_) {
    if (now - since > timeout) out.push_back(child);
  }
  return out;
}

std::vector<std::string> RefitChildren::GiveUpOnAway(Clock::time_point now) {
  std::vector<std::string> out;
  for (auto it = away_until_.begin(); it != away_until_.end();) {
    if (now < it->second) {
      ++it;
      continue;
    }
    given_up_.insert(it->first);
    out.push_back(it->first);
    it = away_until_.erase(it);
  }
  return out;
}

std::vector<std::string> RefitChildren::AbsentPlanned() const {
  std::vector<std::string> out;
  for (const auto& c : planned_) {
    if (!connected_.contains(c)) out.push_back(c);
  }
  return out;
}

}  // namespace deltacast::relay
