// Interval checks over placement maps: no canonical element mapped twice, none
// left out. Rows of strided runs are expanded one by one, so checking a whole
// mesh costs memory per row (bounded: see kMaxCheckedRows).
#pragma once

#include <span>

#include "common/status.h"

namespace deltacast::layout {
class PlacementMap;
}

namespace deltacast::layout::internal {

inline constexpr uint64_t kMaxCheckedRows = uint64_t{1} << 26;

// kInvalidArgument naming the tensor, the first element mapped twice and both
// maps with their rules' lines.
Status CheckOverlaps(std::span<const PlacementMap* const> maps);
// kInvalidArgument naming the tensor and the first element range no map covers.
Status CheckGaps(std::span<const PlacementMap* const> maps);

}  // namespace deltacast::layout::internal
