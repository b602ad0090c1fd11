#include "layout/internal/coverage.h"

#include <algorithm>
#include <string>
#include <vector>

#include "layout/placement.h"

namespace deltacast::layout::internal {
namespace {

struct Interval {
  uint64_t begin = 0, end = 0;
  uint32_t map = 0;
  int line = 0;
};

// Every row of every run, per canonical tensor, sorted by start. Runs come from
// other processes too (a producer's COVERAGE), so each is checked to lie inside its
// tensor before its rows are expanded.
Result<std::vector<std::vector<Interval>>> Rows(const std::vector<TensorSpec>& canonical,
                                                std::span<const RankRuns> ranks) {
  std::vector<std::vector<Interval>> rows(canonical.size());
  uint64_t total = 0;
  for (uint32_t m = 0; m < ranks.size(); ++m) {
    for (const Run& r : ranks[m].runs) {
      const bool rows_apart = r.count <= 1 || r.dst_stride >= r.len;
      if (r.canonical >= canonical.size() || r.count == 0 || r.len == 0 || !rows_apart ||
          r.dst_stride > canonical[r.canonical].ElementCount() ||
          r.DstEnd() > canonical[r.canonical].ElementCount()) {
        return Status::InvalidArgument(
            *ranks[m].name + ": a run " +
            (r.canonical < canonical.size()
                 ? "of canonical tensor '" + canonical[r.canonical].name + "' "
                 : "") +
            "does not lie inside its tensor (or its rows overlap)");
      }
      total += r.count;
      if (total > kMaxCheckedRows) {
        return Status::ResourceExhausted("more than " + std::to_string(kMaxCheckedRows) +
                                         " rows to check; check fewer ranks at a time");
      }
      for (uint64_t i = 0; i < r.count; ++i) {
        const uint64_t b = r.dst + i * r.dst_stride;
        rows[r.canonical].push_back({b, b + r.len, m, r.line});
      }
    }
  }
  for (auto& v : rows) {
    std::sort(v.begin(), v.end(),
              [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  }
  return rows;
}

std::string Who(const RankRuns& rank, int line) {
  return *rank.name + (line > 0 ? " rule at line " + std::to_string(line) : "");
}

}  // namespace

Status CheckOverlaps(const std::vector<TensorSpec>& canonical, std::span<const RankRuns> ranks) {
  ASSIGN_OR_RETURN(auto rows, Rows(canonical, ranks));
  for (size_t c = 0; c < rows.size(); ++c) {
    const Interval* widest = nullptr;
    for (const Interval& iv : rows[c]) {
      if (widest != nullptr && iv.begin < widest->end) {
        return Status::InvalidArgument("canonical tensor '" + canonical[c].name + "': element " +
                                       std::to_string(iv.begin) + " is covered twice, by " +
                                       Who(ranks[widest->map], widest->line) + " and by " +
                                       Who(ranks[iv.map], iv.line));
      }
      if (widest == nullptr || iv.end > widest->end) widest = &iv;
    }
  }
  return Status::Ok();
}

Status CheckGaps(const std::vector<TensorSpec>& canonical, std::span<const RankRuns> ranks) {
  ASSIGN_OR_RETURN(auto rows, Rows(canonical, ranks));
  for (size_t c = 0; c < rows.size(); ++c) {
    uint64_t covered = 0;
    const uint64_t n = canonical[c].ElementCount();
    auto gap = [&](uint64_t a, uint64_t b) {
      return Status::InvalidArgument("canonical tensor '" + canonical[c].name + "': elements [" +
                                     std::to_string(a) + ", " + std::to_string(b) + ") of " +
                                     std::to_string(n) +
                                     " are covered by no rank (no rule maps them)");
    };
    for (const Interval& iv : rows[c]) {
      if (iv.begin > covered) return gap(covered, iv.begin);
      covered = std::max(covered, iv.end);
    }
    if (covered < n) return gap(covered, n);
  }
  return Status::Ok();
}

}  // namespace deltacast::layout::internal
