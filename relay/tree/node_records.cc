// A relay node and the commit record (docs/recovery.md, "The commit record"): a
// refit that has had no decision from the parent for the source timeout (the source
// lost, or the links to it) is looked up in the store every poll interval; a record
// that names this node's refit, base and target is followed as the parent's decision
// would be. Reads run on records_loop_, never on the node's loop.
//
// A delta held in flight from before a restart (no refit of it here, so nothing to
// read by the refit's BEGIN) is settled the same way once no parent decided it for
// the source timeout: a source whose machine is lost for good never will.
#include <fmt/core.h>

#include "common/log.h"
#include "relay/tree/node_impl.h"
#include "topology/coordination_config.h"

namespace deltacast::relay {
namespace {

// The record that settles the held delta `held` of cluster `cluster`: by `refit_id`
// when the spool kept it (Spool::RefitOf), else by base and target among the recent
// records. nullopt: undecided (wait). Runs on records_loop_.
Result<std::optional<CommitRecord>> FindHeldRecord(CommitRecordStore& store,
                                                   const std::string& cluster,
                                                   const apply::InflightDelta& held,
                                                   uint64_t refit_id) {
  if (refit_id != 0) return store.Read(refit_id);
  // The refit is unknown (a spool noted by an older version). An announced refit of
  // this very delta that is still undecided may be the one held: wait for its record
  // rather than follow an older refit's.
  ASSIGN_OR_RETURN(std::vector<RefitInProgress> undecided, store.Undecided());
  for (const RefitInProgress& r : undecided) {
    if (r.cluster == cluster && r.base_version == held.base && r.target_version == held.target) {
      return std::optional<CommitRecord>();
    }
  }
  ASSIGN_OR_RETURN(std::vector<CommitRecord> recent, store.Recent(topology::kRecordsReadOnRestart));
  // Several refits may have streamed the same base -> target (an aborted one, then
  // one that committed). A COMMIT among them wins: the held delta verified to the
  // target's bytes, so committing it reaches a version the cluster committed whichever
  // refit streamed it, while rolling back a delta whose refit committed would undo a
  // PREPARED this node may have sent, and the source counted, for that COMMIT.
  std::optional<CommitRecord> found;
  for (const CommitRecord& r : recent) {  // oldest first: the newest match stays
    if (!RecordNames(r, cluster, held.base, held.target)) continue;
    if (!found || r.commit || !found->commit) found = r;
  }
  return found;
}

}  // namespace

void NodeAgent::Impl::PollRecord(Clock::time_point now) {
  if (!records_loop_ || record_read_pending_ || now < next_record_read_) return;
  const Refit& r = *refit_;
  // Undecided, from a BEGIN of its own (a resolution has no refit record to read by id).
  if (r.phase != Phase::kStreaming || r.resolution || r.stream_rollback) return;
  const Clock::time_point quiet_since =
      r.local_prepared ? std::max(r.start, r.prepared_at) : r.start;
  if (now - quiet_since < options_.source_timeout) return;
  record_read_pending_ = true;
  next_record_read_ = now + options_.poll_interval;
  const uint64_t id = r.id;
  records_loop_->Post([this, id, store = options_.commit_records] {
    auto read = store->Read(id);
    loop_.Post([this, id, read = std::move(read)] { OnRecord(id, read); });
  });
}

void NodeAgent::Impl::OnRecord(uint64_t refit_id, const Result<std::optional<CommitRecord>>& read) {
  record_read_pending_ = false;
  if (stopped_ || !refit_ || refit_->id != refit_id || refit_->phase != Phase::kStreaming) return;
  if (!read.ok()) {
    log::Warn(fmt::format("{}: refit {}: the commit record cannot be read: {}", options_.node_id,
                          refit_id, read.status().ToString()));
    return;
  }
  if (!read->has_value()) return;  // undecided: the parent or the record will say
  const CommitRecord& record = **read;
  const Refit& r = *refit_;
  if (!RecordNames(record, options_.config.name, r.identity.base_version, r.identity.target_version,
                   r.id)) {
    if (record_refused_for_ == r.id) return;  // said once; read again, never followed
    record_refused_for_ = r.id;
    log::Error(fmt::format(
        "{}: refit {} ({} -> {}): the commit record names cluster '{}', refit {}, {} -> {}: "
        "not followed",
        options_.node_id, r.id, r.identity.base_version.ShortHex(),
        r.identity.target_version.ShortHex(), record.cluster, record.refit_id,
        record.base_version.ShortHex(), record.target_version.ShortHex()));
    return;
  }
  // A decision that waits behind the store's recovery or a deferred BEGIN is replayed
  // through the signature check, which an unsigned one would fail: read again later.
  if (recovery_.active() || !deferred_begin_.empty()) return;
  const MessageType type = record.commit ? MessageType::kCommit : MessageType::kAbort;
  log::Warn(
      fmt::format("{}: refit {}: no decision from {} for {} ms; the commit record says {} "
                  "(written by {}): following it",
                  options_.node_id, r.id, parent_.current(), options_.source_timeout.count(),
                  MessageTypeName(type), record.decided_by));
  refit_->decided_by_record = true;
  const Decision d{r.id, r.identity.target_version};
  HandleDecision(0, type, d, transport::MakeMessage(EncodeDecision(type, d)));
}

bool NodeAgent::Impl::HoldsUndecidedDelta() const {
  if (!journal_.inflight) return false;
  // A refit of this life decides what it streamed (PollRecord reads its record).
  if (refit_ && (refit_->phase != Phase::kDone ||
                 refit_->identity.target_version == journal_.inflight->target)) {
    return false;
  }
  // Mending the store, catching up, or a BEGIN waiting to run: that comes first.
  return !recovery_.active() && !journal_.needs_reconcile && !catch_up_.active() &&
         deferred_begin_.empty();
}

void NodeAgent::Impl::PollHeldRecord(Clock::time_point now) {
  if (!records_loop_ || record_read_pending_) return;
  if (!HoldsUndecidedDelta()) {
    held_undecided_since_.reset();
    return;
  }
  if (!held_undecided_since_) held_undecided_since_ = now;
  if (now - *held_undecided_since_ < options_.source_timeout || now < next_record_read_) return;
  record_read_pending_ = true;
  next_record_read_ = now + options_.poll_interval;
  const apply::InflightDelta held = *journal_.inflight;
  const uint64_t refit_id = Spool::RefitOf(options_.spool_dir, held.target);
  records_loop_->Post(
      [this, held, refit_id, store = options_.commit_records, cluster = options_.config.name] {
        auto found = FindHeldRecord(*store, cluster, held, refit_id);
        loop_.Post([this, held, refit_id, found = std::move(found)] {
          OnHeldRecord(held, refit_id, found);
        });
      });
}

void NodeAgent::Impl::OnHeldRecord(const apply::InflightDelta& held, uint64_t refit_id,
                                   const Result<std::optional<CommitRecord>>& found) {
  record_read_pending_ = false;
  if (stopped_ || !HoldsUndecidedDelta() || *journal_.inflight != held) return;
  if (!found.ok()) {
    log::Warn(fmt::format("{}: held delta {} -> {}: the commit record cannot be read: {}",
                          options_.node_id, held.base.ShortHex(), held.target.ShortHex(),
                          found.status().ToString()));
    return;
  }
  if (!found->has_value()) return;  // undecided: the parent or the record will say
  const CommitRecord& record = **found;
  const std::optional<uint64_t> known_refit =
      refit_id != 0 ? std::optional<uint64_t>(refit_id) : std::nullopt;
  if (!RecordNames(record, options_.config.name, held.base, held.target, known_refit)) {
    if (record_refused_for_ == record.refit_id) return;  // said once; never followed
    record_refused_for_ = record.refit_id;
    log::Error(fmt::format(
        "{}: held delta {} -> {} (refit {}): the commit record names cluster '{}', refit {}, "
        "{} -> {}: not followed",
        options_.node_id, held.base.ShortHex(), held.target.ShortHex(),
        refit_id == 0 ? std::string("unknown") : std::to_string(refit_id), record.cluster,
        record.refit_id, record.base_version.ShortHex(), record.target_version.ShortHex()));
    return;
  }
  if (held_followed_refit_ == record.refit_id) return;  // followed; its outcome failed here
  held_followed_refit_ = record.refit_id;
  const MessageType type = record.commit ? MessageType::kCommit : MessageType::kAbort;
  log::Warn(fmt::format(
      "{}: held delta {} -> {} had no decision from a parent for {} ms; the commit record of "
      "refit {} says {} (written by {}): following it",
      options_.node_id, held.base.ShortHex(), held.target.ShortHex(),
      options_.source_timeout.count(), record.refit_id, MessageTypeName(type), record.decided_by));
  {
    MutexLock lock(stats_mu_);
    ++stats_.held_settled_from_record;
  }
  const Decision d{record.refit_id, held.target};
  Resolve(type, d, transport::MakeMessage(EncodeDecision(type, d)), /*from_record=*/true);
}

}  // namespace deltacast::relay
