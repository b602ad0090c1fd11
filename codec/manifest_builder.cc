#include "codec/manifest_builder.h"

#include <string>

#include "codec/partition.h"

namespace deltacast::codec {

ManifestBuilder::ManifestBuilder(std::vector<TensorSpec> tensors, uint64_t partition_bytes)
    : tensors_(std::move(tensors)), partition_bytes_(partition_bytes) {
  sums_.resize(tensors_.size());
  for (size_t t = 0; t < tensors_.size(); ++t) {
    sums_[t].resize(PartitionCount(tensors_[t], partition_bytes_));
  }
}

void ManifestBuilder::AddBytes(size_t tensor, uint64_t byte_offset, ByteSpan bytes) {
  const uint64_t e = ElementSize(tensors_[tensor].dtype);
  const uint64_t part = PartitionElements(tensors_[tensor].dtype, partition_bytes_) * e;
  while (!bytes.empty()) {
    const uint64_t p = byte_offset / part;
    const uint64_t within = byte_offset % part;
    const uint64_t take = std::min<uint64_t>(part - within, bytes.size());
    sums_[tensor][p] ^= HashPiece(bytes.first(take), within);
    bytes = bytes.subspan(take);
    byte_offset += take;
  }
}

Status ManifestBuilder::AddElements(size_t tensor, uint64_t element_offset, ByteSpan bytes) {
  if (tensor >= tensors_.size()) {
    return Status::InvalidArgument("no tensor " + std::to_string(tensor));
  }
  const TensorSpec& info = tensors_[tensor];
  const uint64_t e = ElementSize(info.dtype);
  const uint64_t n = bytes.size() / e;
  if (bytes.size() % e != 0 || element_offset > info.ElementCount() ||
      n > info.ElementCount() - element_offset) {
    return Status::InvalidArgument(std::to_string(bytes.size()) + " bytes at element " +
                                   std::to_string(element_offset) + " do not fit tensor '" +
                                   info.name + "'");
  }
  AddBytes(tensor, element_offset * e, bytes);
  return Status::Ok();
}

Status ManifestBuilder::AddRun(size_t tensor, const std::byte* src, const Run& run) {
  if (tensor >= tensors_.size()) {
    return Status::InvalidArgument("no tensor " + std::to_string(tensor));
  }
  if (run.count == 0 || run.row_elements == 0) return Status::Ok();
  const TensorSpec& info = tensors_[tensor];
  const uint64_t last = run.dst_element + (run.count - 1) * run.dst_stride_elements;
  if ((run.count > 1 && run.dst_stride_elements < run.row_elements) || last > info.ElementCount() ||
      run.row_elements > info.ElementCount() - last) {
    return Status::InvalidArgument("a run of " + std::to_string(run.count) + " rows of " +
                                   std::to_string(run.row_elements) + " elements overlaps or " +
                                   "does not fit tensor '" + info.name + "'");
  }
  const uint64_t e = ElementSize(info.dtype);
  const uint64_t part = PartitionElements(info.dtype, partition_bytes_) * e;
  const uint64_t len = run.row_elements * e, dst = run.dst_element * e;
  const uint64_t stride = run.dst_stride_elements * e;
  auto row_at = [&](uint64_t r) { return dst + r * stride; };
  auto inside = [&](uint64_t r, uint64_t p) {
    return row_at(r) / part == p && (row_at(r) + len - 1) / part == p;
  };
  for (uint64_t r = 0; r < run.count;) {
    const uint64_t p = row_at(r) / part;
    if (!inside(r, p)) {  // the row crosses a partition boundary: split it
      AddBytes(tensor, row_at(r), ByteSpan(src + r * run.src_stride_bytes, len));
      ++r;
      continue;
    }
    uint64_t end = r + 1;
    while (end < run.count && inside(end, p)) ++end;
    sums_[tensor][p] ^= HashStridedRun(
        src + r * run.src_stride_bytes,
        StridedRun{end - r, len, run.src_stride_bytes, row_at(r) - p * part, stride});
    r = end;
  }
  return Status::Ok();
}

Status ManifestBuilder::Merge(const ManifestBuilder& other) {
  if (other.tensors_ != tensors_ || other.partition_bytes_ != partition_bytes_) {
    return Status::InvalidArgument("builders of different tensor tables do not merge");
  }
  for (size_t t = 0; t < sums_.size(); ++t) {
    for (size_t p = 0; p < sums_[t].size(); ++p) sums_[t][p] ^= other.sums_[t][p];
  }
  return Status::Ok();
}

Manifest ManifestBuilder::Finish() const {
  Manifest m;
  m.partition_bytes = partition_bytes_;
  m.tensors = tensors_;
  m.partition_hashes = sums_;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    for (size_t p = 0; p < sums_[t].size(); ++p) {
      const PartitionRef ref =
          PartitionAt(tensors_[t], static_cast<uint32_t>(t), p, partition_bytes_);
      m.partition_hashes[t][p] ^=
          PartitionLengthTerm(ref.element_count * ElementSize(tensors_[t].dtype));
    }
  }
  return m;
}

}  // namespace deltacast::codec
