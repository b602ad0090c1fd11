// Manifest: the tensor table of a checkpoint and the hash of every partition
// (common/partition_hash.h: composable, so it does not depend on who held which
// bytes), from which its version id is derived. Two stores with the same version
// id hold the same tensor bytes; a delta names the version ids it goes between.
//
// Thread safety: a Manifest is a value; ComputeManifest runs its own threads.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "codec/partition.h"
#include "codec/range_reader.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/partition_hash.h"
#include "common/status.h"
#include "deltacast/tensor.h"

namespace deltacast::codec {

struct Manifest {
  uint64_t partition_bytes = kDefaultPartitionBytes;
  std::vector<TensorSpec> tensors;                           // sorted by name
  std::vector<std::vector<PartitionHash>> partition_hashes;  // [tensor][partition]

  // xxh3-128 over the partition size, every tensor's name, dtype and shape, and
  // every partition hash, in canonical order.
  Digest128 VersionId() const;
  uint64_t TotalBytes() const;
  uint64_t PartitionTotal() const;

  // A compact binary form for the manifest cache and MANIFEST messages
  // (docs/wire-format.md, "Manifest"). Parse refuses other format versions with
  // kVersionMismatch (a cache written by an older build: hash the store again) and
  // anything malformed with kCorrupt.
  std::vector<std::byte> Serialize() const;
  static Result<Manifest> Parse(ByteSpan bytes);
};

// Hashes every partition of `tensors`; tensor_data(i) returns tensor i's bytes.
// Blocks; runs on `threads` threads.
Manifest ComputeManifest(const std::vector<TensorSpec>& tensors,
                         const std::function<ByteSpan(size_t)>& tensor_data,
                         uint64_t partition_bytes, size_t threads);

// The same through a RangeReader (a checkpoint directory copies each partition
// into a buffer of the thread's own instead of touching its mapping). Fails with
// the first read error: no manifest is made of partitions that were not read.
Result<Manifest> ComputeManifest(const std::vector<TensorSpec>& tensors, const RangeReader& read,
                                 uint64_t partition_bytes, size_t threads);

}  // namespace deltacast::codec
