#include "relay/tree/decision_log.h"

#include <fmt/core.h>

#include <sstream>

#include "common/file_util.h"

namespace deltacast::relay {

Status RecordDecision(const std::filesystem::path& log, const LoggedDecision& d) {
  if (log.empty()) return Status::Ok();
  if (log.has_parent_path()) RETURN_IF_ERROR(CreateDirectoriesDurably(log.parent_path()));
  return AppendLineDurably(log, fmt::format("refit {} {} {} {}", d.refit_id, d.base, d.target,
                                            d.commit ? "COMMIT" : "ABORT"));
}

std::vector<LoggedDecision> ReadDecisions(const std::filesystem::path& log) {
  std::vector<LoggedDecision> out;
  auto bytes = ReadFile(log, uint64_t{64} << 20);
  if (!bytes.ok()) return out;
  std::istringstream lines{std::string(AsChars(*bytes))};
  std::string word, decision;
  LoggedDecision d;
  while (lines >> word >> d.refit_id >> d.base >> d.target >> decision) {
    if (word != "refit") continue;
    d.commit = decision == "COMMIT";
    out.push_back(d);
  }
  return out;
}

std::optional<LoggedDecision> RecordedDecision(const std::filesystem::path& log,
                                               const Digest128& target) {
  std::optional<LoggedDecision> found;
  for (const LoggedDecision& d : ReadDecisions(log)) {
    if (d.target == target.ToHex()) found = d;
  }
  return found;
}

bool InLineage(const std::vector<LoggedDecision>& decisions, const Digest128& current_base,
               const Digest128& version) {
  const std::string hex = version.ToHex();
  bool committed_any = false;
  for (const LoggedDecision& d : decisions) {
    if (!d.commit) continue;
    if ((!committed_any && d.base == hex) || d.target == hex) return true;
    committed_any = true;
  }
  return !committed_any && version == current_base;
}

}  // namespace deltacast::relay
