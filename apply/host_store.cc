#include "apply/host_store.h"

#include <algorithm>
#include <cstring>

#include "apply/internal/input_util.h"

namespace deltacast::apply {
namespace {

using internal::Quote;

// The tensor's size in bytes, or kInvalidArgument when it overflows 64 bits.
Result<uint64_t> ByteSizeOf(const TensorSpec& info) {
  auto bytes = internal::CheckedByteSize(info.dtype, info.shape);
  if (!bytes) {
    return Status::InvalidArgument("tensor " + Quote(info.name) + ": size overflows 64 bits");
  }
  return *bytes;
}

Status CheckNamesUnique(const std::vector<TensorSpec>& sorted) {
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1].name == sorted[i].name) {
      return Status::InvalidArgument("duplicate tensor name " + Quote(sorted[i].name));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<HostStore>> HostStore::Create(std::vector<TensorSpec> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  RETURN_IF_ERROR(CheckNamesUnique(tensors));
  std::vector<MutableByteSpan> data;
  std::vector<Buffer> owned;
  data.reserve(tensors.size());
  owned.reserve(tensors.size());
  for (const auto& t : tensors) {
    ASSIGN_OR_RETURN(const uint64_t bytes, ByteSizeOf(t));
    Buffer buffer;
    if (bytes > 0) {
      buffer.reset(static_cast<std::byte*>(std::calloc(static_cast<size_t>(bytes), 1)));
      if (!buffer) {
        return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) +
                                         " bytes for tensor " + Quote(t.name));
      }
    }
    data.emplace_back(buffer.get(), static_cast<size_t>(bytes));
    owned.push_back(std::move(buffer));
  }
  return std::unique_ptr<HostStore>(
      new HostStore(std::move(tensors), std::move(data), std::move(owned)));
}

Result<std::unique_ptr<HostStore>> HostStore::Borrow(
    std::vector<std::pair<TensorSpec, MutableByteSpan>> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.first.name < b.first.name; });
  std::vector<TensorSpec> infos;
  std::vector<MutableByteSpan> data;
  infos.reserve(tensors.size());
  data.reserve(tensors.size());
  for (auto& [info, span] : tensors) {
    ASSIGN_OR_RETURN(const uint64_t bytes, ByteSizeOf(info));
    if (span.size() != bytes) {
      return Status::InvalidArgument("tensor " + Quote(info.name) + ": buffer of " +
                                     std::to_string(span.size()) + " bytes, but its shape needs " +
                                     std::to_string(bytes));
    }
    infos.push_back(std::move(info));
    data.push_back(span);
  }
  RETURN_IF_ERROR(CheckNamesUnique(infos));
  return std::unique_ptr<HostStore>(new HostStore(std::move(infos), std::move(data), {}));
}

Result<std::unique_ptr<HostStore>> HostStore::CopyOf(const WeightStore& other) {
  ASSIGN_OR_RETURN(std::unique_ptr<HostStore> copy, Create(other.tensors()));
  // `other` lists its tensors sorted by name, so indices line up.
  for (size_t i = 0; i < copy->tensors_.size(); ++i) {
    const ByteSpan src = other.TensorData(i);
    if (src.size() != copy->data_[i].size()) {
      return Status::Internal("tensor " + Quote(copy->tensors_[i].name) + ": source store has " +
                              std::to_string(src.size()) + " bytes, its shape says " +
                              std::to_string(copy->data_[i].size()));
    }
    if (!src.empty()) std::memcpy(copy->data_[i].data(), src.data(), src.size());
  }
  return copy;
}

HostStore::HostStore(std::vector<TensorSpec> tensors, std::vector<MutableByteSpan> data,
                     std::vector<Buffer> owned)
    : tensors_(std::move(tensors)), data_(std::move(data)), owned_(std::move(owned)) {}

HostStore::~HostStore() = default;

ByteSpan HostStore::TensorData(size_t index) const {
  if (index >= data_.size()) return {};
  return data_[index];
}

Result<MutableByteSpan> HostStore::MutableTensorData(size_t index) {
  if (index >= data_.size()) {
    return Status::InvalidArgument("tensor index " + std::to_string(index) + " out of range (" +
                                   std::to_string(data_.size()) + " tensors)");
  }
  return data_[index];
}

Status HostStore::Flush(size_t index, uint64_t offset, uint64_t length) {
  if (index >= data_.size()) {
    return Status::InvalidArgument("tensor index " + std::to_string(index) + " out of range (" +
                                   std::to_string(data_.size()) + " tensors)");
  }
  const uint64_t bytes = data_[index].size();
  if (offset > bytes || length > bytes - offset) {
    return Status::InvalidArgument("flush of bytes [" + std::to_string(offset) + ", +" +
                                   std::to_string(length) + ") outside tensor " +
                                   Quote(tensors_[index].name) + " of " + std::to_string(bytes) +
                                   " bytes");
  }
  return Status::Ok();
}

}  // namespace deltacast::apply
