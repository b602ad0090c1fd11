// The source's decision log: one line per refit, "refit ID BASE TARGET COMMIT|ABORT"
// (hex versions), appended and fsynced before the decision is sent to anyone, so a
// source that restarts knows every decision it may have sent (docs/recovery.md).
// From it come the outcome of a delta a node still holds in flight (none recorded:
// presumed abort) and the cluster's lineage, the versions a catch-up may go between.
//
// Thread safety: free functions; concurrent appends to one log are not supported.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace deltacast::relay {

struct LoggedDecision {
  uint64_t refit_id = 0;
  std::string base, target;  // hex
  bool commit = false;
};

// Appends one decision durably; an empty path records nothing.
Status RecordDecision(const std::filesystem::path& log, const LoggedDecision& decision);
// Every decision in the log, oldest first; none if it cannot be read.
std::vector<LoggedDecision> ReadDecisions(const std::filesystem::path& log);
// The last decision recorded for the delta to `target`, if any.
std::optional<LoggedDecision> RecordedDecision(const std::filesystem::path& log,
                                               const Digest128& target);
// Whether `version` is one this cluster committed: the base of its first committed
// refit (where the cluster started) or the target of any committed refit; with
// nothing committed yet, only `current_base`. A base the trainer published from that
// never committed (an aborted target) is not.
bool InLineage(const std::vector<LoggedDecision>& decisions, const Digest128& current_base,
               const Digest128& version);

}  // namespace deltacast::relay
