// What both memories share on the host: the checks a batch passes before any work.
#include "apply/device/piece_memory.h"

namespace deltacast::apply::device {
namespace {

std::string Segment(size_t k) { return "patch segment " + std::to_string(k); }

// a * b + c without wrapping, or false.
bool MulAdd(uint64_t a, uint64_t b, uint64_t c, uint64_t* out) {
  uint64_t m = 0;
  return !__builtin_mul_overflow(a, b, &m) && !__builtin_add_overflow(m, c, out);
}

}  // namespace

Status CheckBatch(const PatchBatch& batch) {
  for (size_t k = 0; k < batch.segments.size(); ++k) {
    const PatchSegment& s = batch.segments[k];
    const uint64_t e = s.element_size;
    if (e != 1 && e != 2 && e != 4 && e != 8) {
      return Status::Corrupt(Segment(k) + ": element size " + std::to_string(e) +
                             " (1, 2, 4 or 8); nothing was written");
    }
    if (s.kind != kSparseXor && s.kind != kDenseXor && s.kind != kLiteral) {
      return Status::Corrupt(Segment(k) + ": unknown kind " + std::to_string(s.kind) +
                             "; nothing was written");
    }
    if (s.run.base == nullptr) {
      return Status::Corrupt(Segment(k) + ": its run has no buffer; nothing was written");
    }
    // The run's extent in the partition and in the buffer, in elements.
    uint64_t part_end = 0, local_end = 0, row_bytes = 0;
    if (s.run.rows > 1 && s.run.dst_stride < s.run.len) {
      return Status::Corrupt(Segment(k) + ": rows of " + std::to_string(s.run.len) +
                             " elements every " + std::to_string(s.run.dst_stride) +
                             " overlap in the partition; nothing was written");
    }
    if (s.run.rows != 0 &&
        (!MulAdd(s.run.rows - 1, s.run.dst_stride, s.run.part_dst + s.run.len, &part_end) ||
         !MulAdd(s.run.rows - 1, s.run.src_stride, s.run.src + s.run.len, &local_end) ||
         !MulAdd(part_end, e, 0, &part_end) || !MulAdd(local_end, e, 0, &local_end) ||
         !MulAdd(s.run.len, e, 0, &row_bytes) ||
         reinterpret_cast<uint64_t>(s.run.base) + local_end < local_end)) {
      return Status::Corrupt(Segment(k) + ": its run's extent overflows; nothing was written");
    }
    if (s.kind == kSparseXor) {
      uint64_t words_end = 0, entries_end = 0;
      if (__builtin_add_overflow(s.first, s.count, &entries_end) ||
          entries_end > batch.positions.size() || !MulAdd(s.count, e, s.word_offset, &words_end) ||
          words_end > batch.words.size()) {
        return Status::Corrupt(Segment(k) + " reaches past its payload (entries [" +
                               std::to_string(s.first) + ", +" + std::to_string(s.count) + ") of " +
                               std::to_string(batch.positions.size()) + "); nothing was written");
      }
      continue;
    }
    uint64_t dense_end = 0;
    if (__builtin_add_overflow(s.dense_offset, part_end, &dense_end) ||
        dense_end > batch.dense.size()) {
      return Status::Corrupt(Segment(k) + ": its partition bytes end at " +
                             std::to_string(dense_end) + ", past the batch's " +
                             std::to_string(batch.dense.size()) + "; nothing was written");
    }
  }
  return Status::Ok();
}

}  // namespace deltacast::apply::device
