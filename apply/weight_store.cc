#include "apply/weight_store.h"

#include <algorithm>
#include <string>

#include "codec/partition.h"

namespace deltacast::apply {

std::optional<size_t> WeightStore::FindTensor(std::string_view name) const {
  const auto& all = tensors();
  auto it = std::lower_bound(all.begin(), all.end(), name,
                             [](const TensorSpec& t, std::string_view n) { return t.name < n; });
  if (it == all.end() || it->name != name) return std::nullopt;
  return static_cast<size_t>(it - all.begin());
}

namespace {

Status CheckRange(const WeightStore& store, size_t index, uint64_t offset, uint64_t length) {
  if (index >= store.tensors().size()) {
    return Status::InvalidArgument("tensor index " + std::to_string(index) + " out of range (" +
                                   std::to_string(store.tensors().size()) + " tensors)");
  }
  const uint64_t size = store.tensors()[index].ByteSize();
  if (offset > size || length > size - offset) {
    return Status::InvalidArgument("bytes [" + std::to_string(offset) + ", +" +
                                   std::to_string(length) + ") lie outside tensor '" +
                                   store.tensors()[index].name + "'");
  }
  return Status::Ok();
}

}  // namespace

Result<ByteSpan> WeightStore::ReadRange(size_t index, uint64_t offset, uint64_t length,
                                        MutableByteSpan buffer) const {
  RETURN_IF_ERROR(CheckRange(*this, index, offset, length));
  if (PartitionAccess* access = partition_access()) {
    if (buffer.size() < length) {
      return Status::InvalidArgument("a buffer of " + std::to_string(buffer.size()) +
                                     " bytes cannot take " + std::to_string(length));
    }
    const MutableByteSpan out = buffer.first(length);
    RETURN_IF_ERROR(access->ReadPartition(index, offset, out));
    return ByteSpan(out);
  }
  return TensorData(index).subspan(offset, length);
}

codec::RangeReader RangeReaderOf(const WeightStore& store) {
  return [&store](size_t index, uint64_t offset, uint64_t length, MutableByteSpan buffer) {
    return store.ReadRange(index, offset, length, buffer);
  };
}

Status WeightStore::FlushAll() {
  for (size_t i = 0; i < tensors().size(); ++i)
    RETURN_IF_ERROR(Flush(i, 0, tensors()[i].ByteSize()));
  return Status::Ok();
}

Status PartitionAccess::HashPartitions(std::span<const PartitionRef> partitions,
                                       std::span<PartitionHash> out) {
  if (out.size() != partitions.size()) return Status::InvalidArgument("one hash per partition");
  for (size_t k = 0; k < partitions.size(); ++k) {
    ASSIGN_OR_RETURN(
        out[k], HashPartition(partitions[k].tensor, partitions[k].offset, partitions[k].length));
  }
  return Status::Ok();
}

Result<codec::Manifest> HashWeightStore(const WeightStore& store, uint64_t partition_bytes,
                                        size_t threads) {
  PartitionAccess* access = store.partition_access();
  if (access == nullptr) {
    return codec::ComputeManifest(store.tensors(), RangeReaderOf(store), partition_bytes, threads);
  }
  codec::Manifest m;
  m.partition_bytes = partition_bytes;
  m.tensors = store.tensors();
  // Every partition of the store, hashed in batches (one launch per GPU each).
  constexpr size_t kBatch = 4096;
  std::vector<PartitionAccess::PartitionRef> refs;
  std::vector<PartitionHash*> into;
  std::vector<PartitionHash> hashes;
  auto flush = [&]() -> Status {
    hashes.assign(refs.size(), PartitionHash{});
    RETURN_IF_ERROR(access->HashPartitions(refs, hashes));
    for (size_t k = 0; k < refs.size(); ++k) *into[k] = hashes[k];
    refs.clear();
    into.clear();
    return Status::Ok();
  };
  m.partition_hashes.resize(m.tensors.size());
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    m.partition_hashes[t].resize(codec::PartitionCount(m.tensors[t], partition_bytes));
  }
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const TensorSpec& info = m.tensors[t];
    const uint64_t per =
        codec::PartitionElements(info.dtype, partition_bytes) * ElementSize(info.dtype);
    const uint64_t bytes = info.ByteSize();
    for (uint64_t p = 0; p < m.partition_hashes[t].size(); ++p) {
      const uint64_t off = p * per;
      refs.push_back({t, off, std::min(per, bytes - off)});
      into.push_back(&m.partition_hashes[t][p]);
      if (refs.size() == kBatch) RETURN_IF_ERROR(flush());
    }
  }
  if (!refs.empty()) RETURN_IF_ERROR(flush());
  return m;
}

Result<std::vector<std::byte>> ReadStoreBytes(const WeightStore& store, size_t index,
                                              uint64_t offset, uint64_t length) {
  RETURN_IF_ERROR(CheckRange(store, index, offset, length));
  std::vector<std::byte> out(length);
  if (PartitionAccess* access = store.partition_access()) {
    RETURN_IF_ERROR(access->ReadPartition(index, offset, out));
  } else {
    const ByteSpan data = store.TensorData(index).subspan(offset, length);
    std::copy(data.begin(), data.end(), out.begin());
  }
  return out;
}

}  // namespace deltacast::apply
