// Strided runs: the unit of a placement map (../shared/LAYOUTS.md, "Runs"). A run
// is `count` rows of `len` contiguous elements; row i lies at local element
// src + i * src_stride of one local (shard) tensor and at canonical element
// dst + i * dst_stride of one canonical tensor. Every common layout is a few runs
// per local tensor; a changed local index maps to canonical coordinates with a scan
// of its tensor's runs and a divide.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "layout/description.h"

namespace deltacast::layout {

struct Run {
  uint32_t local = 0;      // index into PlacementMap::locals
  uint32_t canonical = 0;  // index into PlacementMap::canonical
  uint64_t src = 0;
  uint64_t src_stride = 0;
  uint64_t dst = 0;
  uint64_t dst_stride = 0;
  uint64_t count = 0;
  uint64_t len = 0;
  Value value = Value::kBits;  // anything else is residual
  // Which copy of replicated elements this is: 0 the one a producer scans (the
  // only one in a scan map); in a load plan, other replicas' runs carry distinct
  // numbers, each number's runs over all ranks holding one whole copy.
  uint32_t copy = 0;
  int line = 0;  // the rule it came from, for messages

  uint64_t Elements() const { return count * len; }
  // One past the last element, in local / canonical coordinates (count > 0).
  uint64_t SrcEnd() const { return src + (count - 1) * src_stride + len; }
  uint64_t DstEnd() const { return dst + (count - 1) * dst_stride + len; }
  bool operator==(const Run&) const = default;
};

// The part of one row range of a run that lies in an element range.
struct RowPiece {
  uint64_t first_row = 0;
  uint64_t rows = 0;
  uint64_t offset = 0;  // within each row
  uint64_t len = 0;
};

// The pieces of rows (start + i * stride, len elements each, i < count) that lie in
// [begin, end): at most a partial first row, whole middle rows and a partial last
// row. Rows must not overlap (stride >= len, or count == 1).
std::vector<RowPiece> ClipRows(uint64_t start, uint64_t stride, uint64_t len, uint64_t count,
                               uint64_t begin, uint64_t end);

// The parts of `run` whose local elements lie in [begin, end), with src shifted to
// src - begin + rebase (so the local range becomes a tensor of its own).
std::vector<Run> ClipSource(const Run& run, uint64_t begin, uint64_t end, uint64_t rebase);
// The parts of `run` whose canonical elements lie in [begin, end).
std::vector<Run> ClipDestination(const Run& run, uint64_t begin, uint64_t end);

// Merges neighbours in place: contiguous continuations into longer rows, rows of
// equal length at constant strides into one strided run. Order is kept.
void Coalesce(std::vector<Run>& runs);

// Where local element `index` lies if `run` covers it: (canonical element).
std::optional<uint64_t> Project(const Run& run, uint64_t index);

}  // namespace deltacast::layout
