// EtcdCommitRecords: the CommitRecordStore (relay/tree/commit_record.h) kept in etcd
// through [coordination] (docs/recovery.md, "The commit record", "In etcd").
//
// Keys, under P = <prefix>/<cluster>/ and with the refit id as 16 lowercase hex
// digits:
//   P records/<id>    the decision: JSON {"format":1, "cluster", "refit_id" (hex),
//                     "base_version", "target_version" (32 hex), "outcome" ("commit" |
//                     "abort"), "decided_by"}. Created once, by a transaction that
//                     succeeds only while the key does not exist; never changed.
//   P announced/<id>  the refit the source announced (JSON {"format":1, "cluster",
//                     "refit_id", "base_version", "target_version"}); durable, so a
//                     refit whose source died is still found.
//   P alive/<id>      the same JSON, attached to a lease of the announcement's time to
//                     live: it disappears when the source stops renewing it.
// Undecided() = announced without a record; source_alive = alive/<id> exists.
//
// A record (or announcement) that does not parse, or names another cluster or refit
// than its key, is logged as an error (once per stored version of the key) and
// treated as absent: Read returns nullopt, Recent and Undecided leave it out, Decide
// returns kCorrupt (it stands, so nothing else can be written, and it is never
// followed: an operator deletes the key; docs/recovery.md).
//
// Errors are EtcdClient's (coord/etcd_client.h): kUnavailable means nothing was sent,
// kTimeout that the outcome is unknown.
//
// Thread safety: every method is thread-safe and blocks for one or two etcd requests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "coord/etcd_client.h"
#include "relay/tree/commit_record.h"
#include "topology/cluster_config.h"

namespace deltacast::coord {

// Bumped when a record's JSON changes incompatibly; readers refuse other formats.
inline constexpr int kCommitRecordFormat = 1;

class EtcdCommitRecords : public relay::CommitRecordStore {
 public:
  // `prefix` as in [coordination] ("/deltacast"), `cluster` the [cluster] name.
  EtcdCommitRecords(std::unique_ptr<EtcdClient> client, std::string prefix, std::string cluster);
  ~EtcdCommitRecords() override;

  Result<relay::CommitRecord> Decide(const relay::CommitRecord& record) override;
  Result<std::optional<relay::CommitRecord>> Read(uint64_t refit_id) override;
  Result<std::vector<relay::CommitRecord>> Recent(size_t count) override;
  Status Announce(const relay::RefitInProgress& refit, double ttl_seconds) override;
  // A lease that lapsed (the source was silent past its time to live) is replaced by a
  // new one and a warning logged: a standby coordinator may already have aborted the
  // refit, which Decide then reports. kNotFound for a refit this object did not
  // announce.
  Status Renew(uint64_t refit_id) override;
  // Deletes the announcement only once the refit's record exists (one transaction);
  // kFailedPrecondition, leaving it in place, when there is none.
  Status Withdraw(uint64_t refit_id) override;
  Result<std::vector<relay::RefitInProgress>> Undecided() override;
  // Records: one keys-only range of records/ newest first (by mod_revision: a record
  // is never changed, so that is the order written); those past the newest `keep`
  // are deleted by key, each with its announced/ and alive/ keys, in transactions of
  // at most 100 operations (etcd's default limit is 128). Announcements: each one whose record
  // exists is deleted by a transaction that runs only while that record exists.
  Result<relay::PruneCounts> Prune(size_t keep) override;

  // The keys, for tests and docs: P records/<id>, P announced/<id>, P alive/<id>.
  std::string RecordKey(uint64_t refit_id) const;
  std::string AnnouncedKey(uint64_t refit_id) const;
  std::string AliveKey(uint64_t refit_id) const;

  EtcdClient& client() { return *client_; }

 private:
  struct Announcement {
    int64_t lease = 0;
    int64_t ttl_seconds = 0;
    std::string value;
  };

  // The record in `kv`, or nullopt after logging why it is not followed.
  std::optional<relay::CommitRecord> ParseRecord(const KeyValue& kv, uint64_t refit_id);
  std::optional<relay::RefitInProgress> ParseAnnouncement(const KeyValue& kv, uint64_t refit_id);
  // Logs `message` unless it was logged for this key at this mod_revision already
  // (the coordinator polls: one bad key must not flood the log).
  void LogOnce(const KeyValue& kv, const std::string& message);

  std::unique_ptr<EtcdClient> client_;
  const std::string base_;  // "<prefix>/<cluster>/"
  const std::string cluster_;

  Mutex mu_;
  std::map<uint64_t, Announcement> announced_ GUARDED_BY(mu_);
  std::set<std::pair<std::string, int64_t>> logged_ GUARDED_BY(mu_);
};

// The CommitRecordStore of `config`'s [coordination]: EtcdCommitRecords with the
// credentials from the environment. kInvalidArgument without a [coordination] table
// or with half the credentials. Contacts nobody.
Result<std::shared_ptr<relay::CommitRecordStore>> MakeCommitRecordStore(
    const topology::ClusterConfig& config);

}  // namespace deltacast::coord
