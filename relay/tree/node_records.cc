// A relay node and the commit record (docs/recovery.md, "The commit record"): a
// refit that has had no decision from the parent for the source timeout (the source
// lost, or the links to it) is looked up in the store every poll interval; a record
// that names this node's refit, base and target is followed as the parent's decision
// would be. Reads run on records_loop_, never on the node's loop.
#include <fmt/core.h>

#include "common/log.h"
#include "relay/tree/node_impl.h"

namespace deltacast::relay {

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
  if (record.cluster != options_.config.name || record.refit_id != r.id ||
      record.base_version != r.identity.base_version ||
      record.target_version != r.identity.target_version) {
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

}  // namespace deltacast::relay
