// Commit records (issue 32; docs/recovery.md, "The commit record"): the decision of
// each refit, kept in a linearisable store off the trainer's machine (etcd through
// [coordination]; the simulator's model), so the decision outlives that machine.
//
// Rules every user of a CommitRecordStore keeps:
//   * The source writes its decision by compare-and-set (Decide) before it sends the
//     decision to anyone, and then acts on the record that stands, which may be an
//     ABORT a standby coordinator wrote first. Its local decision log is a cache.
//   * A standby coordinator only ever writes ABORT, and only for a refit whose source
//     stopped renewing its announcement; a COMMIT that was written is never replaced.
//   * No record means no commit. An unknown outcome (kTimeout from Decide) is resolved
//     by Read before anything is sent.
//   * A record that does not parse, or names another cluster, refit or version than
//     the reader holds, is logged as an error and never followed.
//
// Thread safety: implementations are safe for concurrent use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace deltacast::relay {

struct CommitRecord {
  std::string cluster;  // [coordination] cluster: records of other clusters are refused
  uint64_t refit_id = 0;
  Digest128 base_version;
  Digest128 target_version;
  bool commit = false;
  std::string decided_by;  // "source" or "coordinator:<id>"
};

// Whether `r` is cluster `cluster`'s record of the delta `base` -> `target` and, when
// `refit_id` is given, of that refit. The one test every reader applies before it
// follows a record (a record that names anything else is refused).
inline bool RecordNames(const CommitRecord& r, const std::string& cluster, const Digest128& base,
                        const Digest128& target, std::optional<uint64_t> refit_id = std::nullopt) {
  return r.cluster == cluster && r.base_version == base && r.target_version == target &&
         (!refit_id || r.refit_id == *refit_id);
}

// A refit its source announced and has not decided yet. `source_alive` is false once
// the source has not renewed the announcement within the time to live it gave.
struct RefitInProgress {
  std::string cluster;
  uint64_t refit_id = 0;
  Digest128 base_version;
  Digest128 target_version;
  bool source_alive = true;
};

// What one Prune deleted.
struct PruneCounts {
  size_t records = 0;
  size_t announcements = 0;
};

class CommitRecordStore {
 public:
  virtual ~CommitRecordStore() = default;

  // Compare-and-set: writes `record` only if no record exists for its refit, and
  // returns the record that stands for that refit (this one, or the one written
  // before). kUnavailable: the store could not be reached and nothing was written.
  // kTimeout: the write may or may not have happened (Read before acting).
  virtual Result<CommitRecord> Decide(const CommitRecord& record) = 0;

  // The record of `refit_id` in this cluster; nullopt when none was written.
  virtual Result<std::optional<CommitRecord>> Read(uint64_t refit_id) = 0;

  // Up to `count` of the cluster's most recently written records, oldest first: a
  // source that lost its state learns the cluster's version and lineage from them.
  virtual Result<std::vector<CommitRecord>> Recent(size_t count) = 0;

  // The source announces a refit before its BEGIN goes out and renews it at least
  // every ttl_seconds / 3 until the decision is sent; then withdraws it.
  virtual Status Announce(const RefitInProgress& refit, double ttl_seconds) = 0;
  virtual Status Renew(uint64_t refit_id) = 0;
  virtual Status Withdraw(uint64_t refit_id) = 0;

  // Announced refits of this cluster that have no record yet.
  virtual Result<std::vector<RefitInProgress>> Undecided() = 0;

  // Deletes the cluster's records older than its newest `keep` (never one of those,
  // nor one written while it runs) and the announcements of refits that have a
  // record; never the announcement of a refit without one (it may be undecided).
  // A pruned record's announcement goes with it. Safe to run concurrently with
  // every other call; a failure part way leaves what is left as it was.
  virtual Result<PruneCounts> Prune(size_t keep) = 0;
};

}  // namespace deltacast::relay
