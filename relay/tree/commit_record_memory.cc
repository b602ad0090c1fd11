#include "relay/tree/commit_record_memory.h"

#include <fmt/core.h>

#include <algorithm>

namespace deltacast::relay {

InMemoryCommitRecords::InMemoryCommitRecords(std::string cluster) : cluster_(std::move(cluster)) {}

Status InMemoryCommitRecords::Reachable() {
  if (fault_ != Fault::kUnavailable) return Status::Ok();
  ++counts_.unavailable;
  return Status::Unavailable("commit record store (in memory) is unavailable (fault injected)");
}

Result<CommitRecord> InMemoryCommitRecords::Decide(const CommitRecord& record) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  if (record.cluster != cluster_) {
    return Status::InvalidArgument(
        fmt::format("commit record of cluster '{}' refused by the store of cluster '{}'",
                    record.cluster, cluster_));
  }
  ++counts_.decides;
  auto [it, inserted] = records_.emplace(record.refit_id, record);
  if (inserted) {
    ++counts_.written;
    written_order_.push_back(record.refit_id);
    announced_.erase(record.refit_id);
  }
  if (fault_ == Fault::kOutcomeLost || fault_ == Fault::kOutcomeLostThenUnavailable) {
    ++counts_.lost;
    if (fault_ == Fault::kOutcomeLostThenUnavailable) fault_ = Fault::kUnavailable;
    return Status::Timeout(fmt::format(
        "commit record store (in memory): the answer to the decision of refit {} was lost "
        "(fault injected)",
        record.refit_id));
  }
  return it->second;
}

Result<std::optional<CommitRecord>> InMemoryCommitRecords::Read(uint64_t refit_id) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  auto it = records_.find(refit_id);
  if (it == records_.end()) return std::optional<CommitRecord>();
  return std::optional<CommitRecord>(it->second);
}

Result<std::vector<CommitRecord>> InMemoryCommitRecords::Recent(size_t count) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  std::vector<CommitRecord> out;
  const size_t from = written_order_.size() > count ? written_order_.size() - count : 0;
  for (size_t i = from; i < written_order_.size(); ++i) {
    out.push_back(records_.at(written_order_[i]));
  }
  return out;
}

Status InMemoryCommitRecords::Announce(const RefitInProgress& refit, double ttl_seconds) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  if (refit.cluster != cluster_) {
    return Status::InvalidArgument(fmt::format(
        "refit of cluster '{}' announced to the store of cluster '{}'", refit.cluster, cluster_));
  }
  if (!(ttl_seconds > 0)) return Status::InvalidArgument("announcement with no time to live");
  Announced a;
  a.refit = refit;
  a.ttl = std::chrono::duration_cast<RuntimeClock::duration>(
      std::chrono::duration<double>(ttl_seconds));
  a.expires = RuntimeClock::now() + a.ttl;
  announced_[refit.refit_id] = a;
  return Status::Ok();
}

Status InMemoryCommitRecords::Renew(uint64_t refit_id) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  auto it = announced_.find(refit_id);
  if (it == announced_.end()) {
    return Status::NotFound(
        fmt::format("refit {} is not announced (decided or withdrawn)", refit_id));
  }
  it->second.expires = RuntimeClock::now() + it->second.ttl;
  return Status::Ok();
}

Status InMemoryCommitRecords::Withdraw(uint64_t refit_id) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  announced_.erase(refit_id);
  return Status::Ok();
}

Result<std::vector<RefitInProgress>> InMemoryCommitRecords::Undecided() {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  const auto now = RuntimeClock::now();
  std::vector<RefitInProgress> out;
  for (const auto& [id, a] : announced_) {
    if (records_.count(id)) continue;
    RefitInProgress r = a.refit;
    r.source_alive = now < a.expires;
    out.push_back(r);
  }
  return out;
}

Result<PruneCounts> InMemoryCommitRecords::Prune(size_t keep) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(Reachable());
  PruneCounts pruned;
  // Announcements of decided refits first, as etcd's Prune does.
  for (auto it = announced_.begin(); it != announced_.end();) {
    if (records_.count(it->first)) {
      it = announced_.erase(it);
      ++pruned.announcements;
    } else {
      ++it;
    }
  }
  if (written_order_.size() <= keep) return pruned;
  const size_t drop = written_order_.size() - keep;
  for (size_t i = 0; i < drop; ++i) {
    records_.erase(written_order_[i]);
    pruned.announcements += announced_.erase(written_order_[i]);
  }
  written_order_.erase(written_order_.begin(),
                       written_order_.begin() + static_cast<std::ptrdiff_t>(drop));
  pruned.records = drop;
  return pruned;
}

void InMemoryCommitRecords::SetFault(Fault fault) {
  MutexLock lock(mu_);
  fault_ = fault;
}

InMemoryCommitRecords::Fault InMemoryCommitRecords::fault() const {
  MutexLock lock(mu_);
  return fault_;
}

InMemoryCommitRecords::Counts InMemoryCommitRecords::counts() const {
  MutexLock lock(mu_);
  return counts_;
}

std::vector<CommitRecord> InMemoryCommitRecords::All() const {
  MutexLock lock(mu_);
  std::vector<CommitRecord> out;
  for (uint64_t id : written_order_) out.push_back(records_.at(id));
  return out;
}

void InMemoryCommitRecords::OverwriteUnchecked(uint64_t refit_id, const CommitRecord& record) {
  MutexLock lock(mu_);
  if (!records_.count(refit_id)) written_order_.push_back(refit_id);
  records_[refit_id] = record;
  announced_.erase(refit_id);
}

}  // namespace deltacast::relay
