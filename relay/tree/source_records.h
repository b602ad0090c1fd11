// SourceRecords: the source's use of a CommitRecordStore (relay/tree/commit_record.h;
// docs/recovery.md, "The commit record"): it announces each refit before its BEGIN
// goes out and renews the announcement from a loop of its own (a slow store never
// stalls the links), decides by compare-and-set before the decision goes to anyone
// and says which decision stands, and brings a restarted source's decision log up to
// the records (the log is a cache of them).
//
// Thread safety: Announce, Withdraw, Decide, Resolve and Sync from the publishing
// thread, one at a time; ForTarget from any thread (the source's loop). Renewal runs
// on the object's own loop.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/event_loop.h"
#include "common/thread_annotations.h"
#include "relay/tree/commit_record.h"
#include "relay/tree/decision_log.h"

namespace deltacast::relay {

// The decision that stands for a refit once the source has asked the store.
struct StandingDecision {
  enum class Kind { kCommit, kAbort, kUnknown };
  Kind kind = Kind::kUnknown;
  // Why it is not the source's COMMIT: a coordinator's ABORT, the store down, ...
  std::string why;
  std::string decided_by;
};

class SourceRecords {
 public:
  // `store` may be null: then every call is a no-op that lets the source go on as
  // without a store (Decide answers what the source asked for).
  // `keep_records`: how many of the newest records each prune keeps ([coordination]
  // keep_records; at least topology::kRecordsReadOnRestart).
  SourceRecords(std::shared_ptr<CommitRecordStore> store, std::string cluster,
                std::chrono::milliseconds source_timeout, std::chrono::milliseconds poll_interval,
                size_t keep_records = 1000);
  ~SourceRecords();
  bool enabled() const { return store_ != nullptr; }

  // Announces `refit` (time to live: the source timeout) and renews it every
  // source_timeout / 6 until Withdraw. Once a renewal failed (the announcement may
  // have lapsed, and a coordinator decided), each renewal also reads the refit's
  // record and hands a record it finds to `decided` (on the renewal loop), so the
  // source stops waiting for a refit that was aborted without it. Fails with an error
  // naming the store; then nothing is announced.
  Status Announce(const RefitInProgress& refit,
                  std::function<void(const CommitRecord&)> decided = nullptr);
  // Stops renewing and withdraws the announcement; a failure is logged (the
  // announcement then lapses by itself). Then, on the renewal loop (off the refit's
  // critical path), prunes the store to the newest keep_records records.
  void Withdraw(uint64_t refit_id);
  // Prunes now, on the calling thread: records beyond the newest keep_records and
  // announcements of decided refits (CommitRecordStore::Prune). A failure is logged
  // and returned; it never fails a refit.
  Result<PruneCounts> Prune();

  // Compare-and-set of `mine` (the source's decision), then the record that stands,
  // within `bound`: kUnavailable (nothing written) tries ABORT instead, and with no
  // ABORT written either the refit is aborted all the same (only ABORT can be written
  // by anyone else); kTimeout (written or not) reads and decides again every poll
  // interval until the answer is known; still unknown at `bound`: kUnknown, and
  // nothing may be sent. A record that names other versions than `mine` stands for
  // nothing: ABORT (no COMMIT of this refit can stand either).
  StandingDecision Decide(const CommitRecord& mine, std::chrono::milliseconds bound);
  // The outcome of an earlier refit of this source that is not known here (a Decide
  // whose answer was lost): its record, else ABORT by compare-and-set (`abort` names
  // it), asked every poll interval within `bound`. The store out of reach is kUnknown,
  // never ABORT: the lost write may stand.
  StandingDecision Resolve(const CommitRecord& abort, std::chrono::milliseconds bound);

  // A (re)started source reads the store before anything else: every undecided refit
  // of the cluster is aborted by compare-and-set (a source holds no refit when it
  // syncs), and every recent record that `log` lacks is appended to it. Fails, with
  // nothing decided here, when the store cannot be reached. A record the log cannot
  // take (a full disk) goes to `uncached` when given, with every later one, in order
  // (the caller keeps them in memory and logs them before anything newer), else
  // fails the call.
  Status Sync(const std::filesystem::path& log, std::vector<LoggedDecision>* uncached = nullptr);

  // The record of the delta to `target` that a (re)joining child still holds in
  // flight: among the recent records, else an undecided refit to it, aborted here by
  // compare-and-set. nullopt: no record and no announcement of it anywhere.
  Result<std::optional<CommitRecord>> ForTarget(const Digest128& target);

  // Whether `r` is the record of this cluster's refit `refit_id` from `base` to `target`.
  bool Names(const CommitRecord& r, uint64_t refit_id, const Digest128& base,
             const Digest128& target) const;
  const std::string& cluster() const { return cluster_; }

 private:
  void RenewTick();
  StandingDecision Follow(const CommitRecord& standing, const CommitRecord& mine) const;
  // Waits `d` (simulated time under the simulator).
  void Pause(std::chrono::milliseconds d);

  const std::shared_ptr<CommitRecordStore> store_;
  const std::string cluster_;
  const std::chrono::milliseconds source_timeout_;
  const std::chrono::milliseconds poll_interval_;
  const size_t keep_records_;
  Mutex mu_;
  CondVar cv_;
  uint64_t announced_ GUARDED_BY(mu_) = 0;  // the refit being renewed (0: none)
  bool renewal_failed_ GUARDED_BY(mu_) = false;
  std::function<void(const CommitRecord&)> decided_ GUARDED_BY(mu_);
  std::unique_ptr<EventLoop> renew_loop_;  // only with a store
};

// The name a record gives as its writer when the source wrote it.
inline constexpr char kDecidedBySource[] = "source";

}  // namespace deltacast::relay
