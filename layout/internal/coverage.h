// Interval checks over placement maps: no canonical element mapped twice, none
// left out. Rows of strided runs are expanded one by one, so checking a whole
// mesh costs memory per row (bounded: see kMaxCheckedRows).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "deltacast/tensor.h"
#include "layout/runs.h"

namespace deltacast::layout::internal {

inline constexpr uint64_t kMaxCheckedRows = uint64_t{1} << 26;

// One rank's runs as the checks see them: where they land in canonical
// coordinates (`local` and `src` are not looked at), and a name for messages.
struct RankRuns {
  const std::string* name = nullptr;
  std::span<const Run> runs;
};

// kInvalidArgument naming the tensor, the first element mapped twice and both
// ranks with their rules' lines.
Status CheckOverlaps(const std::vector<TensorSpec>& canonical, std::span<const RankRuns> ranks);
// kInvalidArgument naming the tensor and the first element range no rank covers.
Status CheckGaps(const std::vector<TensorSpec>& canonical, std::span<const RankRuns> ranks);

}  // namespace deltacast::layout::internal
