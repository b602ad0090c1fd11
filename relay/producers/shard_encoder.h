// The shard encoder: a producer's work on its own share of the model, with no
// gather and no other producer's bytes (docs/producers.md). It compares the
// share's previous and new local tensors run by run (layout/runs.h), projects the
// changed positions to canonical partitions, computes each partition's mask
// contribution (common/partition_hash.h: O(changed words)), and encodes:
// - a partition the share covers whole: a complete record (sparse-XOR, or the
//   best encoding when the partition is one contiguous run; overwrite for
//   residual values), in self-contained chunks whose version ids the root fills in;
// - a partition it covers in part (a row split, a rank boundary): a piece (its own
//   sparse-XOR or overwrite encoding) the root combines with the other producers'
//   pieces into one pieces record (codec::CombinePieces).
// Residual runs (value transforms) are converted to canonical values on both
// versions of this share's own elements and compared there.
//
// Thread safety: the functions run their own worker threads and return when done;
// the inputs must not change meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "apply/device/piece_memory.h"
#include "codec/partition_codec.h"
#include "common/bytes.h"
#include "common/partition_hash.h"
#include "common/status.h"
#include "layout/placement.h"

namespace deltacast::relay {

// A producer's share: its map and the bytes of its local tensors (index into
// map.locals()) at the previous and the new version.
//
// A share in GPU memory sets `memory` and the two address functions instead of
// `base` and `target`: it is hashed and compared where it lies (PieceMemory::Hash,
// FindChanges), only changed positions and XOR words reach the host, and every record
// is sparse-XOR (the bytes a dense or literal encoding needs stay on the GPU). Value
// transforms (residual runs) are not supported there.
struct ShareInput {
  const layout::PlacementMap* map = nullptr;
  std::function<ByteSpan(uint32_t local)> base;
  std::function<ByteSpan(uint32_t local)> target;
  apply::device::PieceMemory* memory = nullptr;
  std::function<const std::byte*(uint32_t local)> base_address = {};
  std::function<const std::byte*(uint32_t local)> target_address = {};
};

// A canonical partition the share covers some element of.
struct PartitionShare {
  uint32_t tensor = 0;  // index into map.canonical() (sorted by name: manifest order)
  uint64_t partition = 0;
  uint64_t covered = 0;  // elements of it this share holds
  uint64_t length = 0;   // elements of the partition
  bool Whole() const { return covered == length; }
};

// Every partition the share touches, in canonical order. Cheap: from the runs.
std::vector<PartitionShare> ShareCoverage(const layout::PlacementMap& map,
                                          uint64_t partition_bytes);

// The base contribution of the share to each partition of `coverage` (parallel to
// it): a hash pass over the previous version's share. For a partition covered
// whole, CombinePieces({contribution}, bytes) is its hash.
Result<std::vector<PartitionHash>> HashShare(const ShareInput& input,
                                             const std::vector<PartitionShare>& coverage,
                                             uint64_t partition_bytes, size_t threads);

struct SharePiece {
  uint32_t tensor = 0;
  uint64_t partition = 0;
  PartitionHash mask;  // its contribution to the partition's change
  codec::EncodedPartition encoded;
};

struct ShareChange {
  uint32_t tensor = 0;
  uint64_t partition = 0;
  PartitionHash mask;  // H(target piece) ^ H(base piece) at its canonical offsets
  bool whole = false;  // sent as a record in `chunks`, else as a piece
};

struct ShareStats {
  uint64_t local_bytes = 0;  // bytes of the new version compared
  uint64_t changed_elements = 0;
  uint64_t records = 0;  // whole-partition records
  uint64_t chunk_bytes = 0;
  uint64_t piece_bytes = 0;  // encoded piece payloads
  double seconds = 0;
};

struct EncodedShare {
  // Data chunks of whole-partition records; their identity and sequence are zero
  // until the root stamps them (RestampChunk).
  std::vector<std::vector<std::byte>> chunks;
  std::vector<SharePiece> pieces;    // partitions covered in part, canonical order
  std::vector<ShareChange> changes;  // every changed partition, canonical order
  // The share's base contribution to each partition of its coverage (parallel to
  // it), hashed in the compare pass: what the root checks against the base version
  // (the proof that the share compared against the bytes the tree holds).
  std::vector<PartitionHash> base_pieces;
  ShareStats stats;
};

struct ShareEncodeOptions {
  codec::EncodeOptions codec;
  uint64_t chunk_bytes = 4ull << 20;
  uint64_t partition_bytes = 4ull << 20;
  size_t threads = 0;  // 0 = all cores
};

// Encodes the share. `base_hashes` is parallel to `coverage` and holds the full base
// hash of each partition covered whole (the root's manifest; others are ignored).
// kInvalidArgument if `coverage` is not the share's (ShareCoverage) or a local
// tensor's bytes have the wrong size.
Result<EncodedShare> EncodeShare(const ShareInput& input,
                                 const std::vector<PartitionShare>& coverage,
                                 std::span<const PartitionHash> base_hashes,
                                 const ShareEncodeOptions& options);

}  // namespace deltacast::relay
