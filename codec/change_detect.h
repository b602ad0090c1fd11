// Change detection: finds the elements whose stored bits differ between two
// partitions. This is the hot loop of encoding and runs near memory bandwidth.
//
// Thread safety: pure function.
#pragma once

#include "codec/changes.h"
#include "common/bytes.h"

namespace deltacast::codec {

// Fills `out` with every element of `base` vs `target` whose bits differ.
// Preconditions: equal sizes, a multiple of element_size (1, 2, 4 or 8), and fewer
// than 2^32 elements.
void FindChanges(ByteSpan base, ByteSpan target, uint32_t element_size, SparseChanges& out);

}  // namespace deltacast::codec
