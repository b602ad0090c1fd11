// Change detection: finds the elements whose stored bits differ between two
// partitions. This is the hot loop of encoding and runs near memory bandwidth.
//
// Thread safety: pure function.
#pragma once

#include "codec/changes.h"
#include "common/bytes.h"
#include "common/partition_hash.h"

namespace deltacast::codec {

// Fills `out` with every element of `base` vs `target` whose bits differ.
// Preconditions: equal sizes, a multiple of element_size (1, 2, 4 or 8), and fewer
// than 2^32 elements.
void FindChanges(ByteSpan base, ByteSpan target, uint32_t element_size, SparseChanges& out);

// FindChanges that appends to `out` (what it holds is kept; it must be of
// element_size), numbering the elements of `base` from first_position: for a
// partition compared one tile at a time. Same preconditions, and first_position plus
// the element count must stay below 2^32.
void FindChangesAppend(ByteSpan base, ByteSpan target, uint32_t element_size,
                       uint32_t first_position, SparseChanges& out);

// FindChanges that also proves what it compared against: returns HashPiece(base,
// hash_offset), the base bytes' contribution to their partition's hash at byte
// `hash_offset`. Each tile of the base is hashed right after it is compared, while it
// is still in cache, so the proof costs no second trip to memory (a producer's base
// check, docs/producers.md). Same preconditions as FindChanges.
PartitionHash FindChangesHashingBase(ByteSpan base, ByteSpan target, uint32_t element_size,
                                     uint64_t hash_offset, SparseChanges& out);

}  // namespace deltacast::codec
