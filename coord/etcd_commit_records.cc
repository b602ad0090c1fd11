#include "coord/etcd_commit_records.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/log.h"

namespace deltacast::coord {
namespace {

using json = nlohmann::json;
using relay::CommitRecord;
using relay::RefitInProgress;

constexpr std::string_view kRecords = "records/";
constexpr std::string_view kAnnounced = "announced/";
constexpr std::string_view kAlive = "alive/";
// etcd refuses a transaction of more than 128 operations (--max-txn-ops).
constexpr size_t kMaxTxnOps = 100;

std::string IdHex(uint64_t id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, id >>= 4) out[static_cast<size_t>(i)] = kDigits[id & 15];
  return out;
}

std::optional<uint64_t> ParseIdHex(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

std::string RecordJson(const CommitRecord& r) {
  return json{{"format", kCommitRecordFormat},
              {"cluster", r.cluster},
              {"refit_id", IdHex(r.refit_id)},
              {"base_version", r.base_version.ToHex()},
              {"target_version", r.target_version.ToHex()},
              {"outcome", r.commit ? "commit" : "abort"},
              {"decided_by", r.decided_by}}
      .dump();
}

std::string AnnouncementJson(const RefitInProgress& r) {
  return json{{"format", kCommitRecordFormat},
              {"cluster", r.cluster},
              {"refit_id", IdHex(r.refit_id)},
              {"base_version", r.base_version.ToHex()},
              {"target_version", r.target_version.ToHex()}}
      .dump();
}

// The fields records and announcements share; an error names the first that is wrong.
Status ParseCommon(const json& j, std::string_view cluster, uint64_t refit_id, Digest128& base,
                   Digest128& target) {
  if (!j.is_object()) return Status::Corrupt("not a JSON object");
  if (!j.contains("format") || !j["format"].is_number_integer() ||
      j["format"].get<int64_t>() != kCommitRecordFormat) {
    return Status::Corrupt("format is not " + std::to_string(kCommitRecordFormat));
  }
  auto string_field = [&](const char* name) -> std::optional<std::string> {
    const auto it = j.find(name);
    if (it == j.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto c = string_field("cluster");
  if (!c) return Status::Corrupt("no cluster");
  if (*c != cluster) {
    return Status::Corrupt("names cluster \"" + log::Escape(*c) + "\", not \"" +
                           log::Escape(cluster) + "\"");
  }
  const auto id = string_field("refit_id");
  const auto parsed = id ? ParseIdHex(*id) : std::nullopt;
  if (!parsed) return Status::Corrupt("refit_id is not 16 hex digits");
  if (*parsed != refit_id) {
    return Status::Corrupt("names refit " + *id + ", not " + IdHex(refit_id) + " as its key says");
  }
  const auto b = string_field("base_version");
  const auto t = string_field("target_version");
  const auto bd = b ? Digest128::FromHex(*b) : std::nullopt;
  const auto td = t ? Digest128::FromHex(*t) : std::nullopt;
  if (!bd) return Status::Corrupt("base_version is not 32 hex digits");
  if (!td) return Status::Corrupt("target_version is not 32 hex digits");
  base = *bd;
  target = *td;
  return Status::Ok();
}

std::string Describe(const CommitRecord& r) {
  return "refit " + IdHex(r.refit_id) + " " + r.base_version.ShortHex() + " -> " +
         r.target_version.ShortHex() + " " + (r.commit ? "COMMIT" : "ABORT") + " by " +
         log::Escape(r.decided_by);
}

}  // namespace

EtcdCommitRecords::EtcdCommitRecords(std::unique_ptr<EtcdClient> client, std::string prefix,
                                     std::string cluster)
    : client_(std::move(client)),
      base_((prefix.ends_with("/") ? prefix : prefix + "/") + cluster + "/"),
      cluster_(std::move(cluster)) {}

EtcdCommitRecords::~EtcdCommitRecords() = default;

std::string EtcdCommitRecords::RecordKey(uint64_t id) const {
  return base_ + std::string(kRecords) + IdHex(id);
}
std::string EtcdCommitRecords::AnnouncedKey(uint64_t id) const {
  return base_ + std::string(kAnnounced) + IdHex(id);
}
std::string EtcdCommitRecords::AliveKey(uint64_t id) const {
  return base_ + std::string(kAlive) + IdHex(id);
}

void EtcdCommitRecords::LogOnce(const KeyValue& kv, const std::string& message) {
  {
    MutexLock lock(mu_);
    if (!logged_.emplace(kv.key, kv.mod_revision).second) return;
  }
  log::Error(message);
}

std::optional<CommitRecord> EtcdCommitRecords::ParseRecord(const KeyValue& kv, uint64_t refit_id) {
  CommitRecord r;
  r.cluster = cluster_;
  r.refit_id = refit_id;
  const json j = json::parse(kv.value, nullptr, false);
  Status s = ParseCommon(j, cluster_, refit_id, r.base_version, r.target_version);
  if (s.ok()) {
    const auto outcome = j.find("outcome");
    const auto by = j.find("decided_by");
    if (outcome == j.end() || !outcome->is_string() ||
        (*outcome != "commit" && *outcome != "abort")) {
      s = Status::Corrupt("outcome is not \"commit\" or \"abort\"");
    } else if (by == j.end() || !by->is_string() || by->get<std::string>().empty()) {
      s = Status::Corrupt("no decided_by");
    } else {
      r.commit = *outcome == "commit";
      r.decided_by = by->get<std::string>();
    }
  }
  if (!s.ok()) {
    LogOnce(kv, "commit record " + log::Escape(kv.key) + " (etcd revision " +
                    std::to_string(kv.mod_revision) + "): " + s.message() +
                    "; ignored and never followed");
    return std::nullopt;
  }
  return r;
}

std::optional<RefitInProgress> EtcdCommitRecords::ParseAnnouncement(const KeyValue& kv,
                                                                    uint64_t refit_id) {
  RefitInProgress r;
  r.cluster = cluster_;
  r.refit_id = refit_id;
  const Status s = ParseCommon(json::parse(kv.value, nullptr, false), cluster_, refit_id,
                               r.base_version, r.target_version);
  if (!s.ok()) {
    LogOnce(kv, "refit announcement " + log::Escape(kv.key) + ": " + s.message() + "; ignored");
    return std::nullopt;
  }
  return r;
}

Result<CommitRecord> EtcdCommitRecords::Decide(const CommitRecord& record) {
  if (record.cluster != cluster_) {
    return Status::InvalidArgument("commit record for cluster \"" + record.cluster +
                                   "\" given to the store of cluster \"" + cluster_ + "\"");
  }
  if (record.decided_by.empty()) return Status::InvalidArgument("commit record without decided_by");
  const std::string key = RecordKey(record.refit_id);
  ASSIGN_OR_RETURN(std::optional<KeyValue> existing,
                   client_->CreateIfAbsent(key, RecordJson(record)));
  if (!existing) {
    log::Info("commit record written: " + Describe(record));
    return record;
  }
  std::optional<CommitRecord> standing = ParseRecord(*existing, record.refit_id);
  if (!standing) {
    return Status::Corrupt("the commit record of refit " + IdHex(record.refit_id) +
                           " in etcd is unreadable (" + key +
                           "): it stands and is not followed; an operator deletes it");
  }
  if (standing->base_version != record.base_version ||
      standing->target_version != record.target_version) {
    const std::string message = "the commit record of refit " + IdHex(record.refit_id) +
                                " in etcd names " + standing->base_version.ShortHex() + " -> " +
                                standing->target_version.ShortHex() + ", not " +
                                record.base_version.ShortHex() + " -> " +
                                record.target_version.ShortHex() + ": not followed";
    LogOnce(*existing, message);
    return Status::Corrupt(message);
  }
  if (standing->commit != record.commit) {
    log::Warn("commit record of refit " + IdHex(record.refit_id) + " already stands: " +
              Describe(*standing) + " (" + (record.commit ? "COMMIT" : "ABORT") + " by " +
              log::Escape(record.decided_by) + " not written)");
  }
  return *standing;
}

Result<std::optional<CommitRecord>> EtcdCommitRecords::Read(uint64_t refit_id) {
  ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, client_->Range(RecordKey(refit_id)));
  if (kvs.empty()) return std::optional<CommitRecord>();
  return ParseRecord(kvs[0], refit_id);
}

Result<std::vector<CommitRecord>> EtcdCommitRecords::Recent(size_t count) {
  std::vector<CommitRecord> out;
  if (count == 0) return out;
  const std::string prefix = base_ + std::string(kRecords);
  RangeOptions options;
  options.range_end = PrefixEnd(prefix);
  options.limit = static_cast<int64_t>(count);
  options.newest_first = true;
  ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, client_->Range(prefix, options));
  for (const KeyValue& kv : kvs) {
    const std::optional<uint64_t> id = ParseIdHex(std::string_view(kv.key).substr(prefix.size()));
    if (!id) {
      LogOnce(kv, "commit record key " + log::Escape(kv.key) +
                      " does not end in 16 hex digits; ignored and never followed");
      continue;
    }
    if (auto r = ParseRecord(kv, *id)) out.push_back(std::move(*r));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

Status EtcdCommitRecords::Announce(const RefitInProgress& refit, double ttl_seconds) {
  if (refit.cluster != cluster_) {
    return Status::InvalidArgument("refit of cluster \"" + refit.cluster +
                                   "\" announced to the store of cluster \"" + cluster_ + "\"");
  }
  if (!(ttl_seconds > 0)) return Status::InvalidArgument("announcement ttl must be positive");
  const int64_t ttl = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ttl_seconds)));
  ASSIGN_OR_RETURN(const int64_t lease, client_->LeaseGrant(ttl));
  const std::string value = AnnouncementJson(refit);
  std::vector<TxnOp> ops(2);
  ops[0].key = AnnouncedKey(refit.refit_id);
  ops[0].value = value;
  ops[1].key = AliveKey(refit.refit_id);
  ops[1].value = value;
  ops[1].lease = lease;
  auto written = client_->Txn({}, {}, ops);
  if (!written.ok()) {
    (void)client_->LeaseRevoke(lease);  // best effort: it expires by itself anyway
    return written.status();
  }
  int64_t replaced = 0;
  {
    MutexLock lock(mu_);
    Announcement& a = announced_[refit.refit_id];
    replaced = a.lease;
    a = Announcement{lease, ttl, value};
  }
  if (replaced != 0) (void)client_->LeaseRevoke(replaced);
  return Status::Ok();
}

Status EtcdCommitRecords::Renew(uint64_t refit_id) {
  Announcement a;
  {
    MutexLock lock(mu_);
    const auto it = announced_.find(refit_id);
    if (it == announced_.end()) {
      return Status::NotFound("refit " + IdHex(refit_id) + " was not announced here");
    }
    a = it->second;
  }
  auto kept = client_->LeaseKeepAlive(a.lease);
  if (kept.ok()) return Status::Ok();
  if (kept.status().code() != StatusCode::kNotFound) return kept.status();
  log::Warn("the announcement of refit " + IdHex(refit_id) + " lapsed (not renewed within " +
            std::to_string(a.ttl_seconds) +
            "s): a standby coordinator may have aborted it; announcing it alive again");
  ASSIGN_OR_RETURN(const int64_t lease, client_->LeaseGrant(a.ttl_seconds));
  if (Status put = client_->Put(AliveKey(refit_id), a.value, lease); !put.ok()) {
    (void)client_->LeaseRevoke(lease);
    return put;
  }
  MutexLock lock(mu_);
  if (auto it = announced_.find(refit_id); it != announced_.end()) it->second.lease = lease;
  return Status::Ok();
}

Status EtcdCommitRecords::Withdraw(uint64_t refit_id) {
  std::vector<TxnOp> ops(2);
  ops[0].kind = TxnOp::Kind::kDelete;
  ops[0].key = AnnouncedKey(refit_id);
  ops[1].kind = TxnOp::Kind::kDelete;
  ops[1].key = AliveKey(refit_id);
  ASSIGN_OR_RETURN(TxnResult done, client_->Txn({RecordKey(refit_id)}, {}, ops));
  if (!done.succeeded) {
    return Status::FailedPrecondition("refit " + IdHex(refit_id) +
                                      " has no commit record: its announcement stays");
  }
  int64_t lease = 0;
  {
    MutexLock lock(mu_);
    if (auto it = announced_.find(refit_id); it != announced_.end()) {
      lease = it->second.lease;
      announced_.erase(it);
    }
  }
  if (lease != 0) {
    if (Status s = client_->LeaseRevoke(lease); !s.ok()) {
      log::Warn("refit " + IdHex(refit_id) +
                " withdrawn; its lease not revoked (it expires): " + s.ToString());
    }
  }
  return Status::Ok();
}

Result<std::vector<RefitInProgress>> EtcdCommitRecords::Undecided() {
  const std::string announced_prefix = base_ + std::string(kAnnounced);
  const std::string alive_prefix = base_ + std::string(kAlive);
  // Both ranges in one transaction: the same revision, so an announcement and its
  // alive key are seen together.
  std::vector<TxnOp> ranges(2);
  ranges[0].kind = TxnOp::Kind::kRange;
  ranges[0].key = announced_prefix;
  ranges[0].range.range_end = PrefixEnd(announced_prefix);
  ranges[1].kind = TxnOp::Kind::kRange;
  ranges[1].key = alive_prefix;
  ranges[1].range.range_end = PrefixEnd(alive_prefix);
  ranges[1].range.keys_only = true;
  ASSIGN_OR_RETURN(TxnResult seen, client_->Txn({}, {}, ranges));
  if (!seen.succeeded || seen.ranges.size() != 2) {
    return Status::Corrupt("etcd: an unconditional transaction did not run");
  }
  std::set<std::string> alive;
  for (const KeyValue& kv : seen.ranges[1]) alive.insert(kv.key.substr(alive_prefix.size()));
  std::vector<RefitInProgress> candidates;
  for (const KeyValue& kv : seen.ranges[0]) {
    const std::string suffix = kv.key.substr(announced_prefix.size());
    const std::optional<uint64_t> id = ParseIdHex(suffix);
    if (!id) {
      LogOnce(kv, "refit announcement key " + log::Escape(kv.key) +
                      " does not end in 16 hex digits; ignored");
      continue;
    }
    std::optional<RefitInProgress> r = ParseAnnouncement(kv, *id);
    if (!r) continue;
    r->source_alive = alive.contains(suffix);
    candidates.push_back(std::move(*r));
  }
  // Which of them have a record: one keys-only range per refit, batched.
  std::vector<RefitInProgress> out;
  for (size_t at = 0; at < candidates.size(); at += kMaxTxnOps) {
    const size_t end = std::min(candidates.size(), at + kMaxTxnOps);
    std::vector<TxnOp> reads(end - at);
    for (size_t i = at; i < end; ++i) {
      reads[i - at].kind = TxnOp::Kind::kRange;
      reads[i - at].key = RecordKey(candidates[i].refit_id);
      reads[i - at].range.keys_only = true;
    }
    ASSIGN_OR_RETURN(TxnResult records, client_->Txn({}, {}, reads));
    if (!records.succeeded || records.ranges.size() != reads.size()) {
      return Status::Corrupt("etcd: an unconditional transaction did not run");
    }
    for (size_t i = at; i < end; ++i) {
      if (records.ranges[i - at].empty()) out.push_back(std::move(candidates[i]));
    }
  }
  return out;
}

Result<relay::PruneCounts> EtcdCommitRecords::Prune(size_t keep) {
  relay::PruneCounts pruned;
  // Announcements of decided refits (a Withdraw that failed): each deleted only while
  // its record exists, so an undecided refit's announcement is never lost. Before the
  // records: once a record is gone, an announcement left of its refit would read as
  // undecided.
  const std::string announced_prefix = base_ + std::string(kAnnounced);
  RangeOptions announced_range;
  announced_range.range_end = PrefixEnd(announced_prefix);
  announced_range.keys_only = true;
  ASSIGN_OR_RETURN(std::vector<KeyValue> announced,
                   client_->Range(announced_prefix, announced_range));
  for (const KeyValue& kv : announced) {
    const std::optional<uint64_t> id =
        ParseIdHex(std::string_view(kv.key).substr(announced_prefix.size()));
    if (!id) continue;  // Undecided logs it
    std::vector<TxnOp> ops(2);
    ops[0].kind = TxnOp::Kind::kDelete;
    ops[0].key = AnnouncedKey(*id);
    ops[1].kind = TxnOp::Kind::kDelete;
    ops[1].key = AliveKey(*id);
    ASSIGN_OR_RETURN(TxnResult done, client_->Txn({RecordKey(*id)}, {}, ops));
    if (done.succeeded) ++pruned.announcements;
  }
  // Records past the newest `keep`. One written after this range is newer than every
  // key in it, so it is never among those deleted.
  const std::string records_prefix = base_ + std::string(kRecords);
  RangeOptions records_range;
  records_range.range_end = PrefixEnd(records_prefix);
  records_range.keys_only = true;
  records_range.newest_first = true;
  ASSIGN_OR_RETURN(std::vector<KeyValue> records, client_->Range(records_prefix, records_range));
  if (records.size() <= keep) return pruned;
  std::vector<std::string> old;
  for (size_t i = keep; i < records.size(); ++i) old.push_back(records[i].key);
  constexpr size_t kOpsPerRecord = 3;  // the record, its announced/ and alive/ keys
  for (size_t at = 0; at < old.size(); at += kMaxTxnOps / kOpsPerRecord) {
    const size_t end = std::min(old.size(), at + kMaxTxnOps / kOpsPerRecord);
    std::vector<TxnOp> ops;
    for (size_t i = at; i < end; ++i) {
      TxnOp del;
      del.kind = TxnOp::Kind::kDelete;
      del.key = old[i];
      ops.push_back(del);
      // A key that does not end in a refit id has no announcement to go with it.
      if (const auto id = ParseIdHex(std::string_view(old[i]).substr(records_prefix.size()))) {
        del.key = AnnouncedKey(*id);
        ops.push_back(del);
        del.key = AliveKey(*id);
        ops.push_back(del);
      }
    }
    ASSIGN_OR_RETURN(TxnResult done, client_->Txn({}, {}, ops));
    if (!done.succeeded) return Status::Corrupt("etcd: an unconditional transaction did not run");
    pruned.records += end - at;
  }
  return pruned;
}

Result<std::shared_ptr<relay::CommitRecordStore>> MakeCommitRecordStore(
    const topology::ClusterConfig& config) {
  if (!config.coordination) {
    return Status::InvalidArgument(config.source_file.string() +
                                   ": no [coordination] table: no commit record store");
  }
  ASSIGN_OR_RETURN(EtcdOptions options, EtcdOptionsFromConfig(*config.coordination));
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Create(std::move(options)));
  return std::shared_ptr<relay::CommitRecordStore>(std::make_shared<EtcdCommitRecords>(
      std::move(client), config.coordination->prefix, config.name));
}

}  // namespace deltacast::coord
