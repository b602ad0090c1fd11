// StandbyCoordinator: decides, for good, the refits whose source was lost. Every poll
// interval it lists the cluster's undecided refits in the commit record store
// (relay/tree/commit_record.h) and writes ABORT, by the store's compare-and-set, for
// each whose source stopped renewing its announcement. It never writes COMMIT, and an
// ABORT of its own never replaces a record that stands: the source's COMMIT, if it
// was written first, wins. Nodes learn the outcome from the record (NodeAgentOptions::
// commit_records); a source that comes back reads it and follows it.
//
// Thread safety: Start/Stop from one thread; PollOnce from any thread; stats() from
// any thread. Polls run on the coordinator's own loop.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "common/thread_annotations.h"
#include "relay/tree/commit_record.h"

namespace deltacast::relay {

struct CoordinatorStats {
  uint64_t polls = 0;                 // Undecided() answered
  uint64_t poll_failures = 0;         // the store could not be read
  uint64_t aborts_written = 0;        // ABORTs of this coordinator's that stand
  uint64_t found_decided = 0;         // refits it would abort, found decided by someone else first
  std::vector<CommitRecord> decided;  // the records that stood after its writes, in order
};

class StandbyCoordinator {
 public:
  // `id` names it in the records it writes ("coordinator:<id>"); `cluster` is the
  // cluster it serves: refits the store lists for another are logged and left alone.
  StandbyCoordinator(std::shared_ptr<CommitRecordStore> store, std::string cluster, std::string id,
                     std::chrono::milliseconds poll_interval);
  ~StandbyCoordinator();  // Stop()

  // Polls every poll interval from now on, on a loop of its own.
  void Start();
  void Stop();
  // One poll, on the calling thread: the refits it aborted (the records that stand).
  Result<std::vector<CommitRecord>> PollOnce();
  CoordinatorStats stats() const;
  std::string decided_by() const { return "coordinator:" + id_; }

 private:
  const std::shared_ptr<CommitRecordStore> store_;
  const std::string cluster_;
  const std::string id_;
  const std::chrono::milliseconds poll_interval_;
  mutable Mutex mu_;
  CoordinatorStats stats_ GUARDED_BY(mu_);
  std::unique_ptr<EventLoop> loop_;
};

}  // namespace deltacast::relay
