#include "relay/tree/coordinator.h"

#include <fmt/core.h>

#include "common/log.h"

namespace deltacast::relay {

StandbyCoordinator::StandbyCoordinator(std::shared_ptr<CommitRecordStore> store,
                                       std::string cluster, std::string id,
                                       std::chrono::milliseconds poll_interval)
    : store_(std::move(store)),
      cluster_(std::move(cluster)),
      id_(std::move(id)),
      poll_interval_(poll_interval) {}

StandbyCoordinator::~StandbyCoordinator() { Stop(); }

void StandbyCoordinator::Start() {
  if (loop_) return;
  loop_ = std::make_unique<EventLoop>(
      [this] {
        auto polled = PollOnce();
        if (!polled.ok()) {
          log::Warn(fmt::format("coordinator {}: the commit record store cannot be read: {}", id_,
                                polled.status().ToString()));
        }
      },
      poll_interval_, "coordinator");
  loop_->Start();
  log::Info(fmt::format("coordinator {} of cluster '{}' watching refits every {} ms", id_, cluster_,
                        poll_interval_.count()));
}

void StandbyCoordinator::Stop() {
  if (loop_) loop_->Stop();
}

Result<std::vector<CommitRecord>> StandbyCoordinator::PollOnce() {
  auto undecided = store_->Undecided();
  {
    MutexLock lock(mu_);
    ++(undecided.ok() ? stats_.polls : stats_.poll_failures);
  }
  if (!undecided.ok()) return undecided.status();
  std::vector<CommitRecord> decided;
  for (const RefitInProgress& refit : *undecided) {
    if (refit.cluster != cluster_) {
      log::Error(fmt::format(
          "coordinator {}: the store lists refit {} of cluster '{}', not '{}': left alone", id_,
          refit.refit_id, refit.cluster, cluster_));
      continue;
    }
    if (refit.source_alive) continue;
    const CommitRecord abort{cluster_, refit.refit_id, refit.base_version, refit.target_version,
                             false,    decided_by()};
    auto standing = store_->Decide(abort);
    if (!standing.ok()) {
      // kTimeout: it may stand; the next poll finds the refit decided or not.
      log::Warn(fmt::format("coordinator {}: ABORT of refit {} not known to be written: {}", id_,
                            refit.refit_id, standing.status().ToString()));
      continue;
    }
    const bool ours = standing->decided_by == abort.decided_by && !standing->commit;
    log::Warn(fmt::format(
        "coordinator {}: refit {} ({} -> {}) of cluster '{}': its source stopped renewing; "
        "the record says {} (written by {})",
        id_, refit.refit_id, refit.base_version.ShortHex(), refit.target_version.ShortHex(),
        cluster_, standing->commit ? "COMMIT" : "ABORT", standing->decided_by));
    MutexLock lock(mu_);
    ++(ours ? stats_.aborts_written : stats_.found_decided);
    stats_.decided.push_back(*standing);
    decided.push_back(*standing);
  }
  return decided;
}

CoordinatorStats StandbyCoordinator::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

}  // namespace deltacast::relay
