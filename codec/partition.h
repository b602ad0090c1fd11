// Partitions: contiguous, element-aligned byte ranges of one tensor; the unit of
// hashing, apply, resume and repair. Every node computes the same partitions from
// the tensor table and the partition size alone.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "deltacast/tensor.h"

namespace deltacast::codec {

// 4 MiB: small enough that a torn partition is cheap to repair, large enough that
// per-partition metadata is negligible next to its payload.
inline constexpr uint64_t kDefaultPartitionBytes = 4ull << 20;

struct PartitionRef {
  uint32_t tensor = 0;          // index into the tensor table
  uint64_t element_offset = 0;  // first element
  uint64_t element_count = 0;
};

// Elements per full partition of a tensor of `dtype` (at least 1).
uint64_t PartitionElements(DType dtype, uint64_t partition_bytes);

// Number of partitions of `tensor` (0 for an empty tensor).
uint64_t PartitionCount(const TensorSpec& tensor, uint64_t partition_bytes);

// The `index`-th partition of tensor `tensor_index`.
PartitionRef PartitionAt(const TensorSpec& tensor, uint32_t tensor_index, uint64_t index,
                         uint64_t partition_bytes);

// All partitions of all tensors, tensor by tensor, in canonical order.
std::vector<PartitionRef> PartitionTensors(const std::vector<TensorSpec>& tensors,
                                           uint64_t partition_bytes);

}  // namespace deltacast::codec
