// ManifestBuilder: a manifest computed from pieces of the tensors, each hashed where
// it lies (a training rank's shard, one GPU's slice of a node), with no gather.
// Partition hashes compose (common/partition_hash.h): every piece contributes to the
// partitions it overlaps at its canonical position, builders of different ranks
// merge by XOR, and the result is the manifest, and so the version id, of the whole
// checkpoint, whoever held which bytes.
//
// Covering every element exactly once is the caller's part (a placement map's iota
// test, ../shared/LAYOUTS.md, checks a layout); the builder cannot tell a gap from
// zeros.
//
// Thread safety: a builder is used by one thread; build one per thread or rank and
// Merge them.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/manifest.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/partition_hash.h"
#include "common/status.h"
#include "deltacast/tensor.h"

namespace deltacast::codec {

class ManifestBuilder {
 public:
  // `tensors` in canonical (name) order, as in a Manifest.
  ManifestBuilder(std::vector<TensorSpec> tensors, uint64_t partition_bytes);

  // `bytes` are the canonical elements [element_offset, element_offset + n) of tensor
  // `tensor` (n = bytes.size() / element size). kInvalidArgument (nothing added) for
  // a range outside the tensor or a length that is not whole elements.
  Status AddElements(size_t tensor, uint64_t element_offset, ByteSpan bytes);

  // `count` rows of `row_elements` elements: row r is read at
  // src + r * src_stride_bytes and holds the canonical elements starting at
  // dst_element + r * dst_stride_elements (a row-parallel shard, one part of a fused
  // QKV shard). Rows in one partition cost one power multiplication each on top of
  // hashing their bytes.
  struct Run {
    uint64_t count = 0;
    uint64_t row_elements = 0;
    uint64_t src_stride_bytes = 0;
    uint64_t dst_element = 0;
    uint64_t dst_stride_elements = 0;
  };
  Status AddRun(size_t tensor, const std::byte* src, const Run& run);

  // Adds the pieces of `other` (same tensors and partition size, else
  // kInvalidArgument).
  Status Merge(const ManifestBuilder& other);

  // The manifest of the pieces added so far.
  Manifest Finish() const;

 private:
  void AddBytes(size_t tensor, uint64_t byte_offset, ByteSpan bytes);

  std::vector<TensorSpec> tensors_;
  uint64_t partition_bytes_;
  std::vector<std::vector<PartitionHash>> sums_;  // [tensor][partition], without L(n)
};

}  // namespace deltacast::codec
