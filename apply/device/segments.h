// The element-level work of a device store, written once for the host and the GPU:
// where a partition's canonical element lies in one memory (a placed run of the load
// plan), the sparse and dense patches of one segment, and the partition-hash
// contribution of one row of a run. The host memory (host_piece_memory.cc) loops over
// these functions; the CUDA kernels (cuda_piece_memory.cu) run one thread per entry
// or per block of them, so both produce the same bytes and the same hash bits.
//
// Plain structs and constexpr functions on integers and raw pointers only (no STL),
// marked DELTACAST_HD so nvcc compiles them for the device.
//
// Thread safety: pure functions; concurrent patches must touch disjoint elements.
#pragma once

#include <cstdint>

#include "common/gf128.h"

namespace deltacast::apply::device {

// A run of the load plan clipped to one partition, in elements: row r holds
// partition elements [part_dst + r * dst_stride, + len) and lies at local elements
// src + r * src_stride of a buffer whose first byte is `base` (a device address on a
// GPU). Rows do not overlap in the partition.
struct PlacedRun {
  unsigned char* base = nullptr;
  uint64_t part_dst = 0;
  uint64_t dst_stride = 0;
  uint64_t len = 0;
  uint64_t rows = 0;
  uint64_t src = 0;
  uint64_t src_stride = 0;
};

enum SegmentKind : uint32_t {
  kSparseXor = 0,  // positions + XOR words
  kDenseXor = 1,   // the partition's XOR mask, whole
  kLiteral = 2,    // the partition's target bytes, whole
};

// One record's part in one run. Sparse: entries [first, first + count) of the
// batch's positions (partition element indices, strictly increasing within the
// segment) and their words at words + word_offset + i * element_size. Dense and
// literal: the partition's bytes at dense + dense_offset, in canonical order.
struct PatchSegment {
  PlacedRun run;
  uint32_t kind = kSparseXor;
  uint32_t element_size = 1;
  uint64_t first = 0;
  uint64_t count = 0;
  uint64_t word_offset = 0;
  uint64_t dense_offset = 0;
};

// Where partition element `e` lies in `run`: its local element index, or false if
// the run does not hold it.
DELTACAST_HD constexpr bool LocalElement(const PlacedRun& run, uint64_t e, uint64_t* local) {
  if (e < run.part_dst) return false;
  const uint64_t d = e - run.part_dst;
  const uint64_t row = run.rows <= 1 ? 0 : d / run.dst_stride;
  const uint64_t col = d - row * (run.rows <= 1 ? 0 : run.dst_stride);
  if (row >= run.rows || col >= run.len) return false;
  *local = run.src + row * run.src_stride + col;
  return true;
}

// Whether entry i of a sparse segment may be applied: its position is greater than
// the one before it (unique and sorted) and the run holds it. A false anywhere in a
// segment refuses the whole batch before anything is written.
DELTACAST_HD constexpr bool SparseEntryValid(const PatchSegment& s, const uint32_t* positions,
                                             uint64_t i) {
  const uint64_t at = s.first + i;
  if (i > 0 && positions[at] <= positions[at - 1]) return false;
  uint64_t local = 0;
  return LocalElement(s.run, positions[at], &local);
}

// XORs entry i's word into its element (checked valid first).
DELTACAST_HD constexpr void ApplySparseEntry(const PatchSegment& s, const uint32_t* positions,
                                             const unsigned char* words, uint64_t i) {
  uint64_t local = 0;
  LocalElement(s.run, positions[s.first + i], &local);
  unsigned char* dst = s.run.base + local * s.element_size;
  const unsigned char* w = words + s.word_offset + i * s.element_size;
  for (uint32_t k = 0; k < s.element_size; ++k) dst[k] ^= w[k];
}

// Dense XOR or literal write of bytes [from, to) of row `row` (within the row).
DELTACAST_HD constexpr void ApplyDenseBytes(const PatchSegment& s, const unsigned char* dense,
                                            uint64_t row, uint64_t from, uint64_t to) {
  const uint64_t e = s.element_size;
  unsigned char* dst = s.run.base + (s.run.src + row * s.run.src_stride) * e;
  const unsigned char* src = dense + s.dense_offset + (s.run.part_dst + row * s.run.dst_stride) * e;
  if (s.kind == kDenseXor) {
    for (uint64_t b = from; b < to; ++b) dst[b] ^= src[b];
  } else {
    for (uint64_t b = from; b < to; ++b) dst[b] = src[b];
  }
}

// Whether a dense segment's rows can be written in aligned 8-byte words (with
// `dense` as its payload's first byte): every row starts on a word boundary in the
// buffer and in the payload, and rows are whole words.
DELTACAST_HD inline bool DenseWordAligned(const PatchSegment& s, const unsigned char* dense) {
  const uint64_t e = s.element_size;
  const uint64_t dst = reinterpret_cast<uint64_t>(s.run.base) + s.run.src * e;
  const uint64_t src = reinterpret_cast<uint64_t>(dense) + s.dense_offset + s.run.part_dst * e;
  const uint64_t rows = s.run.rows > 1 ? (s.run.src_stride * e) | (s.run.dst_stride * e) : 0;
  return ((dst | src | rows | (s.run.len * e)) & 7) == 0;
}

// ApplyDenseBytes for word `w` of row `row` of an aligned segment (DenseWordAligned).
DELTACAST_HD inline void ApplyDenseWord(const PatchSegment& s, const unsigned char* dense,
                                        uint64_t row, uint64_t w) {
  const uint64_t e = s.element_size;
  auto* dst = reinterpret_cast<uint64_t*>(s.run.base + (s.run.src + row * s.run.src_stride) * e);
  const auto* src = reinterpret_cast<const uint64_t*>(
      dense + s.dense_offset + (s.run.part_dst + row * s.run.dst_stride) * e);
  dst[w] = s.kind == kDenseXor ? dst[w] ^ src[w] : src[w];
}

// The linear hash contribution of bytes [from, to) of row `row` of `run`, where they
// lie in the partition. Contributions of disjoint byte ranges combine by XOR, so a
// device may split rows among threads any way it likes.
DELTACAST_HD constexpr gf128::Gf128 RowPieceHash(const PlacedRun& run, uint32_t element_size,
                                                 uint64_t row, uint64_t from, uint64_t to) {
  const uint64_t e = element_size;
  const unsigned char* p = run.base + (run.src + row * run.src_stride) * e;
  const uint64_t offset = (run.part_dst + row * run.dst_stride) * e;
  return gf128::PieceReference(p + from, to - from, offset + from);
}

// alpha^k from a table of alpha^(2^i), i < 64 (one multiplication per set bit of k
// instead of Pow's squarings): what a kernel uses to place a piece's Horner sum.
inline constexpr int kAlphaPowers = 64;
DELTACAST_HD constexpr gf128::Gf128 AlphaPowerFromTable(const gf128::Gf128* powers, uint64_t k) {
  gf128::Gf128 r = gf128::kOne;
  for (int i = 0; k != 0; ++i, k >>= 1) {
    if (k & 1) r = gf128::Mul(r, powers[i]);
  }
  return r;
}

// RowPieceHash with alpha^k taken from `powers` (AlphaPowerFromTable): the same bits.
DELTACAST_HD constexpr gf128::Gf128 RowPieceHashByTable(const PlacedRun& run, uint32_t element_size,
                                                        uint64_t row, uint64_t from, uint64_t to,
                                                        const gf128::Gf128* powers) {
  if (to <= from) return {};
  const uint64_t e = element_size;
  const unsigned char* p = run.base + (run.src + row * run.src_stride) * e;
  const uint64_t offset = (run.part_dst + row * run.dst_stride) * e + from;
  return gf128::Mul(gf128::PieceHorner(p + from, to - from, offset),
                    AlphaPowerFromTable(powers, offset / 16));
}

// The pieces of a hash segment: rows of `row_bytes` cut into `piece`-byte pieces.
DELTACAST_HD constexpr uint64_t PiecesPerRow(uint64_t row_bytes, uint64_t piece) {
  return row_bytes == 0 ? 0 : (row_bytes + piece - 1) / piece;
}

// The segment that block `block` of a launch works on, given each segment's first
// block (first[0] = 0, increasing, n segments; first[n] = the grid size): the last
// segment whose first block is <= block. Empty segments (equal firsts) are skipped.
DELTACAST_HD constexpr uint32_t SegmentOfBlock(const uint32_t* first, uint32_t n, uint32_t block) {
  uint32_t lo = 0, hi = n;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (first[mid] <= block) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace deltacast::apply::device
