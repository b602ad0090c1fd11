// The host PieceMemory: the reference implementation of the element code's loops,
// and the memory of a planned store on a machine without a GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "apply/device/piece_memory.h"
#include "codec/change_detect.h"

namespace deltacast::apply::device {
namespace {

std::string BadEntry(size_t segment, const PatchSegment& s, uint64_t i, const uint32_t* positions) {
  return "patch segment " + std::to_string(segment) + ": entry " + std::to_string(i) +
         " (position " + std::to_string(positions[s.first + i]) +
         ") is out of order, repeated or outside its run; nothing was written";
}

std::string Address(const std::byte* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", static_cast<const void*>(p));
  return text;
}

class HostPieceMemory final : public PieceMemory {
 public:
  explicit HostPieceMemory(std::string name) : name_(std::move(name)) {}
  ~HostPieceMemory() override {
    for (void* p : owned_) std::free(p);
  }

  const std::string& name() const override { return name_; }

  Result<std::byte*> Allocate(uint64_t bytes) override {
    void* p = std::calloc(bytes == 0 ? 1 : bytes, 1);
    if (p == nullptr) {
      return Status::ResourceExhausted(name_ + ": cannot allocate " + std::to_string(bytes) +
                                       " bytes");
    }
    owned_.push_back(p);
    return static_cast<std::byte*>(p);
  }

  Status CheckRegion(const std::byte* p, uint64_t bytes, uint32_t alignment) override {
    if (p == nullptr) return Status::InvalidArgument(name_ + ": a null buffer");
    if (alignment > 1 && reinterpret_cast<uintptr_t>(p) % alignment != 0) {
      return Status::InvalidArgument(name_ + ": buffer " + Address(p) + " is not aligned to " +
                                     std::to_string(alignment) + " bytes");
    }
    if (reinterpret_cast<uintptr_t>(p) + bytes < bytes) {
      return Status::InvalidArgument(name_ + ": buffer " + Address(p) + " of " +
                                     std::to_string(bytes) + " bytes wraps the address space");
    }
    return Status::Ok();
  }

  Status AwaitStream(uintptr_t) override { return Status::Ok(); }  // no streams

  Status Patch(const PatchBatch& batch) override {
    RETURN_IF_ERROR(CheckBatch(batch));
    const uint32_t* positions = batch.positions.data();
    for (size_t k = 0; k < batch.segments.size(); ++k) {
      const PatchSegment& s = batch.segments[k];
      if (s.kind != kSparseXor) continue;
      for (uint64_t i = 0; i < s.count; ++i) {
        if (!SparseEntryValid(s, positions, i))
          return Status::Corrupt(BadEntry(k, s, i, positions));
      }
    }
    const auto* words = reinterpret_cast<const unsigned char*>(batch.words.data());
    const auto* dense = reinterpret_cast<const unsigned char*>(batch.dense.data());
    for (const PatchSegment& s : batch.segments) {
      if (s.kind == kSparseXor) {
        for (uint64_t i = 0; i < s.count; ++i) ApplySparseEntry(s, positions, words, i);
      } else {
        const uint64_t row_bytes = s.run.len * s.element_size;
        const bool words = DenseWordAligned(s, dense);
        for (uint64_t r = 0; r < s.run.rows; ++r) {
          if (!words) {
            ApplyDenseBytes(s, dense, r, 0, row_bytes);
            continue;
          }
          for (uint64_t w = 0; w < row_bytes / 8; ++w) ApplyDenseWord(s, dense, r, w);
        }
      }
    }
    return Status::Ok();
  }

  Status Sync() override { return Status::Ok(); }  // Patch works at once

  Status QueueHashes(std::span<const HashSegment> segments, size_t slots) override {
    pending_.assign(slots, PartitionHash{});
    for (const HashSegment& h : segments) {
      if (h.slot >= slots) return Status::InvalidArgument(name_ + ": hash slot out of range");
      const uint64_t e = h.element_size;
      const StridedRun run{h.run.rows, h.run.len * e, h.run.src_stride * e, h.run.part_dst * e,
                           h.run.dst_stride * e};
      pending_[h.slot] ^=
          HashStridedRun(reinterpret_cast<const std::byte*>(h.run.base) + h.run.src * e, run);
    }
    return Status::Ok();
  }
  Status CollectHashes(std::span<PartitionHash> out) override {
    if (out.size() != pending_.size()) {
      return Status::InvalidArgument(name_ + ": " + std::to_string(out.size()) +
                                     " hash slots collected, " + std::to_string(pending_.size()) +
                                     " queued");
    }
    for (size_t k = 0; k < out.size(); ++k) out[k] ^= pending_[k];
    pending_.clear();
    return Status::Ok();
  }

  Status FindChanges(const std::byte* base, const std::byte* target, uint64_t count,
                     uint32_t element_size, ChangeList& out) override {
    out.clear();
    out.element_size = element_size;
    if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8) {
      return Status::InvalidArgument(name_ + ": element size " + std::to_string(element_size));
    }
    RETURN_IF_ERROR(CheckRegion(base, count * element_size, element_size));
    RETURN_IF_ERROR(CheckRegion(target, count * element_size, element_size));
    // codec::FindChanges numbers elements with 32 bits: compare in blocks below that.
    constexpr uint64_t kBlock = uint64_t{1} << 30;
    codec::SparseChanges block;
    for (uint64_t first = 0; first < count; first += kBlock) {
      const uint64_t n = std::min(kBlock, count - first);
      codec::FindChanges(ByteSpan(base + first * element_size, n * element_size),
                         ByteSpan(target + first * element_size, n * element_size), element_size,
                         block);
      for (uint32_t p : block.positions) out.positions.push_back(first + p);
      out.xors.insert(out.xors.end(), block.xors.begin(), block.xors.end());
    }
    return Status::Ok();
  }

  Status ReadRows(const std::byte* src, uint64_t src_pitch, std::byte* dst, uint64_t dst_pitch,
                  uint64_t width, uint64_t rows) override {
    for (uint64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_pitch, src + r * src_pitch, width);
    return Status::Ok();
  }
  Status WriteRows(const std::byte* src, uint64_t src_pitch, std::byte* dst, uint64_t dst_pitch,
                   uint64_t width, uint64_t rows) override {
    for (uint64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_pitch, src + r * src_pitch, width);
    return Status::Ok();
  }

 private:
  std::string name_;
  std::vector<void*> owned_;
  std::vector<PartitionHash> pending_;  // queued hashes, computed at once
};

}  // namespace

std::unique_ptr<PieceMemory> NewHostPieceMemory(std::string name) {
  return std::make_unique<HostPieceMemory>(std::move(name));
}

}  // namespace deltacast::apply::device
