#include "relay/tree/source_records.h"

#include <fmt/core.h>

#include <algorithm>
#include <set>

#include "common/log.h"
#include "common/runtime.h"
#include "relay/tree/decision_log.h"
#include "topology/coordination_config.h"

namespace deltacast::relay {
namespace {

// How many recent records a restarted source reads: the cluster's lineage for
// catch-up and the outcome of any delta a child may still hold. Pruning keeps at
// least these ([coordination] keep_records).
constexpr size_t kRecentRecords = topology::kRecordsReadOnRestart;

std::chrono::milliseconds RenewPeriod(std::chrono::milliseconds source_timeout) {
  return std::clamp(source_timeout / 6, std::chrono::milliseconds(10),
                    std::chrono::milliseconds(1000));
}

std::string Describe(const CommitRecord& r) {
  return fmt::format("refit {} of cluster '{}' {} -> {}: {} by {}", r.refit_id, r.cluster,
                     r.base_version.ShortHex(), r.target_version.ShortHex(),
                     r.commit ? "COMMIT" : "ABORT", r.decided_by);
}

}  // namespace

SourceRecords::SourceRecords(std::shared_ptr<CommitRecordStore> store, std::string cluster,
                             std::chrono::milliseconds source_timeout,
                             std::chrono::milliseconds poll_interval, size_t keep_records)
    : store_(std::move(store)),
      cluster_(std::move(cluster)),
      source_timeout_(source_timeout),
      poll_interval_(poll_interval),
      keep_records_(std::max(keep_records, kRecentRecords)) {
  if (!store_) return;
  renew_loop_ =
      std::make_unique<EventLoop>([this] { RenewTick(); }, RenewPeriod(source_timeout_), "renew");
  renew_loop_->Start();
}

SourceRecords::~SourceRecords() {
  if (renew_loop_) renew_loop_->Stop();
}

Status SourceRecords::Announce(const RefitInProgress& refit,
                               std::function<void(const CommitRecord&)> decided) {
  if (!store_) return Status::Ok();
  Status announced =
      store_->Announce(refit, std::chrono::duration<double>(source_timeout_).count());
  if (!announced.ok()) {
    return announced.WithContext(
        fmt::format("refit {} could not be announced to the commit record store (nothing was sent)",
                    refit.refit_id));
  }
  MutexLock lock(mu_);
  announced_ = refit.refit_id;
  renewal_failed_ = false;
  decided_ = std::move(decided);
  return Status::Ok();
}

void SourceRecords::RenewTick() {
  uint64_t id = 0;
  bool failed = false;
  std::function<void(const CommitRecord&)> decided;
  {
    MutexLock lock(mu_);
    id = announced_;
    failed = renewal_failed_;
    decided = decided_;
  }
  if (id == 0) return;
  Status renewed = store_->Renew(id);
  if (!renewed.ok()) {
    if (renewed.code() != StatusCode::kNotFound) {
      log::Warn(fmt::format("refit {}: the commit record store did not take the renewal: {}", id,
                            renewed.ToString()));
    }
    failed = true;
    MutexLock lock(mu_);
    if (announced_ == id) renewal_failed_ = true;
  }
  if (!failed || !decided) return;
  // The announcement may have lapsed: a coordinator may have decided the refit.
  Result<std::optional<CommitRecord>> read = store_->Read(id);
  if (read.ok() && read->has_value()) decided(**read);
}

void SourceRecords::Withdraw(uint64_t refit_id) {
  if (!store_) return;
  {
    MutexLock lock(mu_);
    if (announced_ == refit_id) {
      announced_ = 0;
      decided_ = nullptr;
    }
  }
  Status withdrawn = store_->Withdraw(refit_id);
  if (!withdrawn.ok()) {
    log::Warn(fmt::format("refit {}: announcement not withdrawn ({}); it lapses by itself",
                          refit_id, withdrawn.ToString()));
  }
  // The decision is sent: prune behind it, on the renewal loop, so a slow store
  // never holds up the refit's confirmations (the next renewal waits behind it,
  // and none is due: nothing is announced now).
  renew_loop_->Post([this] { (void)Prune(); });
}

Result<PruneCounts> SourceRecords::Prune() {
  if (!store_) return PruneCounts{};
  Result<PruneCounts> pruned = store_->Prune(keep_records_);
  if (!pruned.ok()) {
    log::Warn(fmt::format("the commit record store was not pruned to its newest {} records: {}",
                          keep_records_, pruned.status().ToString()));
    return pruned;
  }
  if (pruned->records > 0 || pruned->announcements > 0) {
    log::Info(
        fmt::format("commit record store pruned: {} records older than the newest {}, {} "
                    "announcements of decided refits",
                    pruned->records, keep_records_, pruned->announcements));
  }
  return pruned;
}

bool SourceRecords::Names(const CommitRecord& r, uint64_t refit_id, const Digest128& base,
                          const Digest128& target) const {
  return RecordNames(r, cluster_, base, target, refit_id);
}

StandingDecision SourceRecords::Follow(const CommitRecord& standing,
                                       const CommitRecord& mine) const {
  StandingDecision out;
  out.decided_by = standing.decided_by;
  if (!Names(standing, mine.refit_id, mine.base_version, mine.target_version)) {
    log::Error(fmt::format(
        "refit {}: the commit record store holds a record that names something else ({}); "
        "it is not followed, and the refit is aborted",
        mine.refit_id, Describe(standing)));
    out.kind = StandingDecision::Kind::kAbort;
    out.why = "the commit record names another refit or version: " + Describe(standing);
    return out;
  }
  if (standing.commit) {
    out.kind = StandingDecision::Kind::kCommit;
    return out;
  }
  out.kind = StandingDecision::Kind::kAbort;
  if (standing.decided_by != kDecidedBySource || mine.commit) {
    out.why = fmt::format("the commit record says ABORT, written by {}", standing.decided_by);
  }
  return out;
}

void SourceRecords::Pause(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  (void)WaitFor(cv_, lock, d, [] { return false; });
}

StandingDecision SourceRecords::Decide(const CommitRecord& mine, std::chrono::milliseconds bound) {
  if (!store_) {
    StandingDecision out;
    out.kind = mine.commit ? StandingDecision::Kind::kCommit : StandingDecision::Kind::kAbort;
    out.decided_by = mine.decided_by;
    return out;
  }
  const auto deadline = RuntimeClock::now() + bound;
  Result<CommitRecord> decided = store_->Decide(mine);
  if (decided.ok()) return Follow(*decided, mine);
  if (decided.status().code() != StatusCode::kTimeout) {
    // Nothing was written (or the store refused it outright): no COMMIT of ours stands.
    log::Warn(fmt::format("refit {}: the commit record store refused the decision: {}",
                          mine.refit_id, decided.status().ToString()));
    StandingDecision out;
    out.kind = StandingDecision::Kind::kAbort;
    out.why = "the commit record store could not record the decision (" +
              decided.status().ToString() + ")";
    out.decided_by = kDecidedBySource;
    if (mine.commit) {
      // Say ABORT where it lasts, if the store takes that now; whatever stands then
      // (only an ABORT can) is followed.
      CommitRecord abort = mine;
      abort.commit = false;
      Result<CommitRecord> aborted = store_->Decide(abort);
      if (aborted.ok()) {
        StandingDecision followed = Follow(*aborted, mine);
        if (followed.kind == StandingDecision::Kind::kAbort && followed.why.empty()) {
          followed.why = out.why;
        }
        return followed;
      }
    }
    return out;
  }
  // Written or not: ask until the answer is known. A Decide of the same record again
  // is safe either way (it writes only where nothing stands).
  log::Warn(fmt::format("refit {}: the commit record store's answer was lost ({}); asking again",
                        mine.refit_id, decided.status().ToString()));
  for (;;) {
    Result<std::optional<CommitRecord>> read = store_->Read(mine.refit_id);
    if (read.ok() && read->has_value()) return Follow(**read, mine);
    if (read.ok()) {
      decided = store_->Decide(mine);
      if (decided.ok()) return Follow(*decided, mine);
    }
    if (RuntimeClock::now() + poll_interval_ > deadline) break;
    Pause(poll_interval_);
  }
  StandingDecision out;
  out.kind = StandingDecision::Kind::kUnknown;
  out.why = "the commit record store did not say whether the decision was written";
  return out;
}

StandingDecision SourceRecords::Resolve(const CommitRecord& abort,
                                        std::chrono::milliseconds bound) {
  StandingDecision unknown;
  unknown.kind = StandingDecision::Kind::kUnknown;
  unknown.why = "the commit record store cannot be read";
  if (!store_) return unknown;
  // Unlike a first decision, a failure here says nothing: the earlier write whose
  // answer was lost may stand. Only a record, or an ABORT written now, is an outcome.
  const auto deadline = RuntimeClock::now() + bound;
  for (;;) {
    Result<std::optional<CommitRecord>> read = store_->Read(abort.refit_id);
    if (read.ok() && read->has_value()) return Follow(**read, abort);
    if (read.ok()) {
      Result<CommitRecord> decided = store_->Decide(abort);
      if (decided.ok()) return Follow(*decided, abort);
    }
    if (RuntimeClock::now() + poll_interval_ > deadline) return unknown;
    Pause(poll_interval_);
  }
}

Status SourceRecords::Sync(const std::filesystem::path& log_path,
                           std::vector<LoggedDecision>* uncached) {
  if (!store_) return Status::Ok();
  ASSIGN_OR_RETURN(std::vector<RefitInProgress> undecided, store_->Undecided());
  for (const RefitInProgress& refit : undecided) {
    if (refit.cluster != cluster_) {
      log::Error(fmt::format("the commit record store lists refit {} of cluster '{}': ignored",
                             refit.refit_id, refit.cluster));
      continue;
    }
    CommitRecord abort{cluster_, refit.refit_id,  refit.base_version, refit.target_version,
                       false,    kDecidedBySource};
    ASSIGN_OR_RETURN(CommitRecord standing, store_->Decide(abort));
    log::Info(fmt::format("refit {} was left undecided: the record now says {}", refit.refit_id,
                          Describe(standing)));
    (void)store_->Withdraw(refit.refit_id);
  }
  ASSIGN_OR_RETURN(std::vector<CommitRecord> recent, store_->Recent(kRecentRecords));
  std::set<uint64_t> logged;
  for (const LoggedDecision& d : ReadDecisions(log_path)) logged.insert(d.refit_id);
  for (const CommitRecord& r : recent) {
    if (r.cluster != cluster_ || r.base_version.IsZero() || r.target_version.IsZero()) {
      log::Error("the commit record store holds a record that is not this cluster's: " +
                 Describe(r) + " (ignored)");
      continue;
    }
    if (logged.count(r.refit_id)) continue;
    const LoggedDecision d{r.refit_id, r.base_version.ToHex(), r.target_version.ToHex(), r.commit};
    // Once one record waits in memory, the later ones wait behind it: the log keeps
    // the records' order (the lineage).
    if (uncached && !uncached->empty()) {
      uncached->push_back(d);
      continue;
    }
    Status cached = RecordDecision(log_path, d);
    if (!cached.ok() && !uncached) return cached;
    if (!cached.ok()) {
      log::Warn("decision log not brought up to " + Describe(r) + ": " + cached.ToString() +
                " (kept in memory)");
      uncached->push_back(d);
      continue;
    }
    log::Info("decision log brought up to the commit record: " + Describe(r));
  }
  return Status::Ok();
}

Result<std::optional<CommitRecord>> SourceRecords::ForTarget(const Digest128& target) {
  if (!store_) return std::optional<CommitRecord>();
  ASSIGN_OR_RETURN(std::vector<CommitRecord> recent, store_->Recent(kRecentRecords));
  for (auto it = recent.rbegin(); it != recent.rend(); ++it) {
    if (it->cluster == cluster_ && it->target_version == target) {
      return std::optional<CommitRecord>(*it);
    }
  }
  ASSIGN_OR_RETURN(std::vector<RefitInProgress> undecided, store_->Undecided());
  for (const RefitInProgress& refit : undecided) {
    if (refit.cluster != cluster_ || refit.target_version != target) continue;
    CommitRecord abort{cluster_, refit.refit_id,  refit.base_version, refit.target_version,
                       false,    kDecidedBySource};
    ASSIGN_OR_RETURN(CommitRecord standing, store_->Decide(abort));
    return std::optional<CommitRecord>(standing);
  }
  return std::optional<CommitRecord>();
}

}  // namespace deltacast::relay
