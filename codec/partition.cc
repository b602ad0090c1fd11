#include "codec/partition.h"

#include <algorithm>

namespace deltacast::codec {

uint64_t PartitionElements(DType dtype, uint64_t partition_bytes) {
  return std::max<uint64_t>(1, partition_bytes / ElementSize(dtype));
}

uint64_t PartitionCount(const TensorSpec& tensor, uint64_t partition_bytes) {
  const uint64_t per = PartitionElements(tensor.dtype, partition_bytes);
  return (tensor.ElementCount() + per - 1) / per;
}

PartitionRef PartitionAt(const TensorSpec& tensor, uint32_t tensor_index, uint64_t index,
                         uint64_t partition_bytes) {
  const uint64_t per = PartitionElements(tensor.dtype, partition_bytes);
  const uint64_t offset = index * per;
  return {tensor_index, offset, std::min(per, tensor.ElementCount() - offset)};
}

std::vector<PartitionRef> PartitionTensors(const std::vector<TensorSpec>& tensors,
                                           uint64_t partition_bytes) {
  std::vector<PartitionRef> out;
  for (uint32_t t = 0; t < tensors.size(); ++t) {
    const uint64_t count = PartitionCount(tensors[t], partition_bytes);
    for (uint64_t i = 0; i < count; ++i)
      out.push_back(PartitionAt(tensors[t], t, i, partition_bytes));
  }
  return out;
}

}  // namespace deltacast::codec
