// InMemoryCommitRecords: a CommitRecordStore (relay/tree/commit_record.h) held in this
// process's memory, linearisable because every call runs under one mutex. It is the
// model of the replicated store that in-process tests and the simulator use: time
// comes from RuntimeClock, so announcements expire in simulated time under the
// simulator, and a fault switch makes the store unreachable or loses the answers of
// Decide, as a real store's clients see it.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "relay/tree/commit_record.h"

namespace deltacast::relay {

class InMemoryCommitRecords final : public CommitRecordStore {
 public:
  enum class Fault {
    kNone,
    // Every call fails with kUnavailable and writes nothing.
    kUnavailable,
    // Decide writes as usual but answers kTimeout (the reply was lost); the other
    // calls answer as usual.
    kOutcomeLost,
    // The next Decide writes and answers kTimeout, and the store is unreachable from
    // then on (kUnavailable): the writer cannot learn its outcome until it is back.
    kOutcomeLostThenUnavailable,
  };
  struct Counts {
    uint64_t decides = 0;      // Decide calls answered (any answer)
    uint64_t written = 0;      // records written
    uint64_t unavailable = 0;  // calls refused by the kUnavailable fault
    uint64_t lost = 0;         // Decide answers lost by the kOutcomeLost fault
  };

  // Records of `cluster` only: a Decide or Announce naming another cluster is refused
  // (kInvalidArgument), as a store scoped to one cluster's prefix would.
  explicit InMemoryCommitRecords(std::string cluster);

  Result<CommitRecord> Decide(const CommitRecord& record) override;
  Result<std::optional<CommitRecord>> Read(uint64_t refit_id) override;
  Result<std::vector<CommitRecord>> Recent(size_t count) override;
  Status Announce(const RefitInProgress& refit, double ttl_seconds) override;
  Status Renew(uint64_t refit_id) override;
  Status Withdraw(uint64_t refit_id) override;
  Result<std::vector<RefitInProgress>> Undecided() override;
  Result<PruneCounts> Prune(size_t keep) override;

  void SetFault(Fault fault);
  Fault fault() const;
  Counts counts() const;
  // Every record written, in the order written (for checkers).
  std::vector<CommitRecord> All() const;
  // Replaces the record of `refit_id` with `record` as given, unchecked: what a
  // writer that does not keep the rules (another cluster's, a bug, a hand edit) could
  // leave under the key. For tests of the readers' checks.
  void OverwriteUnchecked(uint64_t refit_id, const CommitRecord& record);

 private:
  struct Announced {
    RefitInProgress refit;
    RuntimeClock::duration ttl{};
    RuntimeClock::time_point expires;
  };
  Status Reachable() REQUIRES(mu_);

  const std::string cluster_;
  mutable Mutex mu_;
  Fault fault_ GUARDED_BY(mu_) = Fault::kNone;
  Counts counts_ GUARDED_BY(mu_);
  std::map<uint64_t, CommitRecord> records_ GUARDED_BY(mu_);
  std::vector<uint64_t> written_order_ GUARDED_BY(mu_);
  std::map<uint64_t, Announced> announced_ GUARDED_BY(mu_);
};

}  // namespace deltacast::relay
