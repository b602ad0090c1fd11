#include "codec/manifest.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "common/parallel.h"
#include "common/thread_annotations.h"

namespace deltacast::codec {
namespace {
constexpr uint32_t kManifestMagic = 0x464D4344;  // "DCMF"
// 2: 16-byte partition hashes (common/partition_hash.h); 1 had xxh3-64.
constexpr uint16_t kManifestVersion = 2;
constexpr size_t kMaxDims = 16;
}  // namespace

Digest128 Manifest::VersionId() const {
  Hasher128 h;
  h.UpdateString("deltacast-version-v2");
  h.UpdateValue<uint64_t>(partition_bytes);
  h.UpdateValue<uint64_t>(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    h.UpdateString(tensors[t].name);
    h.UpdateValue<uint8_t>(static_cast<uint8_t>(tensors[t].dtype));
    h.UpdateValue<uint64_t>(tensors[t].shape.size());
    for (uint64_t d : tensors[t].shape) h.UpdateValue<uint64_t>(d);
    for (const PartitionHash& p : partition_hashes[t]) {
      h.UpdateValue<uint64_t>(p.lo);
      h.UpdateValue<uint64_t>(p.hi);
    }
  }
  return h.Finish();
}

uint64_t Manifest::TotalBytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.ByteSize();
  return total;
}

uint64_t Manifest::PartitionTotal() const {
  uint64_t total = 0;
  for (const auto& p : partition_hashes) total += p.size();
  return total;
}

std::vector<std::byte> Manifest::Serialize() const {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.Put<uint32_t>(kManifestMagic);
  w.Put<uint16_t>(kManifestVersion);
  w.Put<uint16_t>(0);
  w.Put<uint64_t>(partition_bytes);
  w.Put<uint64_t>(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    w.Put<uint16_t>(static_cast<uint16_t>(tensors[t].name.size()));
    w.PutString(tensors[t].name);
    w.Put<uint8_t>(static_cast<uint8_t>(tensors[t].dtype));
    w.Put<uint8_t>(static_cast<uint8_t>(tensors[t].shape.size()));
    for (uint64_t d : tensors[t].shape) w.Put<uint64_t>(d);
    for (const PartitionHash& p : partition_hashes[t]) {
      w.Put<uint64_t>(p.lo);
      w.Put<uint64_t>(p.hi);
    }
  }
  w.Put<uint64_t>(Hash64(out));
  return out;
}

Result<Manifest> Manifest::Parse(ByteSpan bytes) {
  if (bytes.size() < 8 ||
      LoadLE<uint64_t>(bytes.data() + bytes.size() - 8) != Hash64(bytes.first(bytes.size() - 8))) {
    return Status::Corrupt("manifest checksum mismatch");
  }
  ByteReader r(bytes.first(bytes.size() - 8));
  uint32_t magic;
  uint16_t version, reserved;
  uint64_t tensor_count;
  Manifest m;
  if (!r.Get(magic) || magic != kManifestMagic) return Status::Corrupt("manifest: bad magic");
  if (!r.Get(version) || !r.Get(reserved)) return Status::Corrupt("manifest: truncated header");
  if (version != kManifestVersion) {
    return Status::VersionMismatch("manifest format version " + std::to_string(version) +
                                   " (this build reads version " +
                                   std::to_string(kManifestVersion) + ")");
  }
  if (reserved != 0) return Status::Corrupt("manifest: reserved field is not zero");
  if (!r.Get(m.partition_bytes) || m.partition_bytes == 0 || !r.Get(tensor_count) ||
      tensor_count > r.remaining()) {
    return Status::Corrupt("manifest: truncated header");
  }
  for (uint64_t t = 0; t < tensor_count; ++t) {
    uint16_t name_length;
    ByteSpan name;
    uint8_t dtype, dims;
    TensorSpec info;
    if (!r.Get(name_length) || !r.GetBytes(name_length, name) || !r.Get(dtype) || !r.Get(dims) ||
        dims > kMaxDims) {
      return Status::Corrupt("manifest: truncated tensor " + std::to_string(t));
    }
    auto parsed = DTypeFromWire(dtype);
    if (!parsed) return Status::Corrupt("manifest: unknown dtype " + std::to_string(dtype));
    info.name = std::string(AsChars(name));
    info.dtype = *parsed;
    info.shape.resize(dims);
    for (auto& d : info.shape) {
      if (!r.Get(d)) return Status::Corrupt("manifest: truncated shape of " + info.name);
    }
    if (!m.tensors.empty() && !(m.tensors.back().name < info.name)) {
      return Status::Corrupt("manifest: tensors out of order at " + info.name);
    }
    const uint64_t partitions = PartitionCount(info, m.partition_bytes);
    if (partitions > r.remaining() / PartitionHash::kBytes)
      return Status::Corrupt("manifest: truncated hashes of " + info.name);
    std::vector<PartitionHash> hashes(partitions);
    for (auto& p : hashes) (void)r.Get(p.lo), (void)r.Get(p.hi);
    m.tensors.push_back(std::move(info));
    m.partition_hashes.push_back(std::move(hashes));
  }
  if (r.remaining() != 0) return Status::Corrupt("manifest: trailing bytes");
  return m;
}

Manifest ComputeManifest(const std::vector<TensorSpec>& tensors,
                         const std::function<ByteSpan(size_t)>& tensor_data,
                         uint64_t partition_bytes, size_t threads) {
  Manifest m;
  m.partition_bytes = partition_bytes;
  m.tensors = tensors;
  m.partition_hashes.resize(tensors.size());
  std::vector<PartitionRef> parts = PartitionTensors(tensors, partition_bytes);
  for (size_t t = 0; t < tensors.size(); ++t) {
    m.partition_hashes[t].resize(PartitionCount(tensors[t], partition_bytes));
  }
  ParallelFor(parts.size(), threads, [&](size_t i) {
    const PartitionRef& p = parts[i];
    const uint64_t e = ElementSize(tensors[p.tensor].dtype);
    const ByteSpan bytes = tensor_data(p.tensor).subspan(p.element_offset * e, p.element_count * e);
    const uint64_t per = PartitionElements(tensors[p.tensor].dtype, partition_bytes);
    m.partition_hashes[p.tensor][p.element_offset / per] = HashPartition(bytes);
  });
  return m;
}

Result<Manifest> ComputeManifest(const std::vector<TensorSpec>& tensors, const RangeReader& read,
                                 uint64_t partition_bytes, size_t threads) {
  Manifest m;
  m.partition_bytes = partition_bytes;
  m.tensors = tensors;
  m.partition_hashes.resize(tensors.size());
  const std::vector<PartitionRef> parts = PartitionTensors(tensors, partition_bytes);
  for (size_t t = 0; t < tensors.size(); ++t) {
    m.partition_hashes[t].resize(PartitionCount(tensors[t], partition_bytes));
  }
  threads = std::clamp<size_t>(threads, 1, std::max<size_t>(parts.size(), 1));
  std::atomic<size_t> next{0};
  Mutex mu;
  Status first_error;
  // One scratch buffer per thread, reused for every partition it reads: a fresh
  // buffer per partition would fault in its pages each time.
  ParallelFor(threads, threads, [&](size_t) {
    std::vector<std::byte> scratch;
    for (size_t i = next++; i < parts.size(); i = next++) {
      const PartitionRef& p = parts[i];
      const uint64_t e = ElementSize(tensors[p.tensor].dtype);
      const uint64_t length = p.element_count * e;
      if (scratch.size() < length) scratch.resize(length);
      Result<ByteSpan> bytes = read(p.tensor, p.element_offset * e, length, scratch);
      if (!bytes.ok()) {
        MutexLock lock(mu);
        if (first_error.ok()) first_error = bytes.status();
        next = parts.size();  // the others stop after their current partition
        return;
      }
      const uint64_t per = PartitionElements(tensors[p.tensor].dtype, partition_bytes);
      m.partition_hashes[p.tensor][p.element_offset / per] = HashPartition(*bytes);
    }
  });
  if (!first_error.ok()) return first_error.WithContext("hashing the checkpoint");
  return m;
}

}  // namespace deltacast::codec
