// The element code shared by the host and the CUDA memories (apply/device/segments.h)
// against the host's own paths: placement against layout::Project, and the row hash a
// GPU thread computes against the host's fast strided-run hash, on random runs, odd
// offsets and every tail length.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "apply/device/segments.h"
#include "common/partition_hash.h"
#include "layout/runs.h"

namespace deltacast::apply::device {
namespace {

PartitionHash Of(gf128::Gf128 g) { return {g.lo, g.hi}; }

TEST(DeviceSegmentsTest, LocalElementAgreesWithTheLayoutsProjection) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    layout::Run r;
    r.len = 1 + rng() % 9;
    r.count = 1 + rng() % 6;
    r.dst_stride = r.len + rng() % 5;
    r.src_stride = r.len + rng() % 4;
    r.src = rng() % 7;
    r.dst = rng() % 11;
    PlacedRun p{nullptr, r.dst, r.dst_stride, r.len, r.count, r.src, r.src_stride};
    std::vector<int> seen(r.SrcEnd() + 1, 0);
    for (uint64_t e = 0; e < r.DstEnd() + 3; ++e) {
      uint64_t local = 0;
      if (!LocalElement(p, e, &local)) continue;
      ASSERT_LT(local, seen.size());
      auto back = layout::Project(r, local);
      ASSERT_TRUE(back.has_value());
      EXPECT_EQ(*back, e);
      ++seen[local];
    }
    uint64_t held = 0;
    for (int s : seen) held += s;
    EXPECT_EQ(held, r.Elements());
  }
}

TEST(DeviceSegmentsTest, RowHashesGiveTheHostsStridedRunHash) {
  std::mt19937_64 rng(5);
  std::vector<unsigned char> buffer(4096);
  for (auto& b : buffer) b = static_cast<unsigned char>(rng());
  for (uint32_t element_size : {1u, 2u, 4u, 8u}) {
    for (int trial = 0; trial < 60; ++trial) {
      PlacedRun run;
      run.base = buffer.data();
      run.len = 1 + rng() % 37;
      run.rows = 1 + rng() % 5;
      run.src_stride = run.len + rng() % 9;
      run.dst_stride = run.len + rng() % 13;
      run.src = rng() % 17;
      run.part_dst = rng() % 23;
      ASSERT_LE((run.src + (run.rows - 1) * run.src_stride + run.len) * element_size,
                buffer.size());
      const uint64_t e = element_size;
      const StridedRun host{run.rows, run.len * e, run.src_stride * e, run.part_dst * e,
                            run.dst_stride * e};
      const PartitionHash want =
          HashStridedRun(reinterpret_cast<const std::byte*>(buffer.data()) + run.src * e, host);
      // Split each row at a random byte, as threads would.
      PartitionHash got;
      for (uint64_t r = 0; r < run.rows; ++r) {
        const uint64_t bytes = run.len * e, cut = rng() % (bytes + 1);
        got ^= Of(RowPieceHash(run, element_size, r, 0, cut));
        got ^= Of(RowPieceHash(run, element_size, r, cut, bytes));
      }
      EXPECT_EQ(got, want) << "element size " << element_size << " trial " << trial;
    }
  }
}

TEST(DeviceSegmentsTest, SparseEntriesMustIncreaseAndLieInTheRun) {
  PlacedRun run{nullptr, 4, 10, 3, 2, 0, 3};  // holds partition elements 4..6 and 14..16
  PatchSegment s;
  s.run = run;
  s.count = 3;
  const uint32_t good[] = {4, 6, 15};
  const uint32_t repeated[] = {4, 6, 6};
  const uint32_t outside[] = {4, 7, 15};
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(SparseEntryValid(s, good, i));
  EXPECT_FALSE(SparseEntryValid(s, repeated, 2));
  EXPECT_FALSE(SparseEntryValid(s, outside, 1));
}

// The word path a GPU thread takes for aligned dense rows writes what the byte path
// writes.
TEST(DeviceSegmentsTest, DenseWordsWriteWhatDenseBytesWrite) {
  std::mt19937_64 rng(9);
  alignas(16) unsigned char dense[1024];
  for (auto& b : dense) b = static_cast<unsigned char>(rng());
  for (uint32_t kind : {uint32_t{kDenseXor}, uint32_t{kLiteral}}) {
    for (int trial = 0; trial < 40; ++trial) {
      alignas(16) unsigned char by_bytes[2048], by_words[2048];
      for (auto& b : by_bytes) b = static_cast<unsigned char>(rng());
      std::copy(std::begin(by_bytes), std::end(by_bytes), by_words);
      PatchSegment s;
      s.kind = kind;
      s.element_size = 2;
      s.run = {nullptr, 4 * (rng() % 8), 0, 4 * (1 + rng() % 8), 1 + rng() % 4, 4 * (rng() % 8), 0};
      s.run.dst_stride = s.run.len + 4 * (rng() % 4);
      s.run.src_stride = s.run.len + 4 * (rng() % 4);
      const uint64_t row_bytes = s.run.len * 2;
      s.run.base = by_bytes;
      ASSERT_TRUE(DenseWordAligned(s, dense));
      for (uint64_t r = 0; r < s.run.rows; ++r) ApplyDenseBytes(s, dense, r, 0, row_bytes);
      s.run.base = by_words;
      for (uint64_t r = 0; r < s.run.rows; ++r) {
        for (uint64_t w = 0; w < row_bytes / 8; ++w) ApplyDenseWord(s, dense, r, w);
      }
      EXPECT_TRUE(std::equal(std::begin(by_bytes), std::end(by_bytes), by_words));
    }
  }
  PatchSegment odd;
  odd.element_size = 2;
  odd.run = {nullptr, 1, 0, 4, 1, 0, 0};  // starts mid-word in the payload
  EXPECT_FALSE(DenseWordAligned(odd, dense));
}

// What the hash kernel computes: each piece placed with alpha^k from a table of
// alpha^(2^i) gives the reference's bits (RowPieceHash, which calls Pow).
TEST(DeviceSegmentsTest, PiecesPlacedByThePowersTableGiveTheReferenceBits) {
  gf128::Gf128 powers[kAlphaPowers];
  powers[0] = gf128::kAlpha;
  for (int i = 1; i < kAlphaPowers; ++i) powers[i] = gf128::Mul(powers[i - 1], powers[i - 1]);
  std::mt19937_64 rng(17);
  for (uint64_t k : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{262143},
                     uint64_t{1} << 40, rng(), rng()}) {
    const gf128::Gf128 want = gf128::Pow(gf128::kAlpha, k), got = AlphaPowerFromTable(powers, k);
    EXPECT_TRUE(gf128::Equal(got, want)) << k;
  }
  std::vector<unsigned char> buffer(20000);
  for (auto& b : buffer) b = static_cast<unsigned char>(rng());
  for (int trial = 0; trial < 200; ++trial) {
    PlacedRun run;
    run.base = buffer.data();
    const uint32_t e = 1u << (rng() % 4);
    run.len = 1 + rng() % 600;
    run.rows = 1 + rng() % 3;
    run.src_stride = run.len + rng() % 40;
    run.dst_stride = run.len + rng() % 70;
    run.src = rng() % 100;
    run.part_dst = rng() % 5000;
    ASSERT_LE((run.src + (run.rows - 1) * run.src_stride + run.len) * e, buffer.size());
    const uint64_t row = rng() % run.rows, row_bytes = run.len * e;
    const uint64_t from = rng() % row_bytes, to = from + rng() % (row_bytes - from + 1);
    EXPECT_TRUE(gf128::Equal(RowPieceHashByTable(run, e, row, from, to, powers),
                             RowPieceHash(run, e, row, from, to)))
        << "trial " << trial;
  }
}

// A launch's blocks find their segments: every block of segment k (and none of the
// empty ones) maps to k.
TEST(DeviceSegmentsTest, BlocksFindTheirSegments) {
  std::mt19937_64 rng(19);
  for (int trial = 0; trial < 50; ++trial) {
    const uint32_t n = 1 + rng() % 40;
    std::vector<uint32_t> first(n + 1), blocks(n);
    for (uint32_t k = 0; k < n; ++k) {
      blocks[k] = rng() % 4 == 0 ? 0 : 1 + rng() % 9;
      first[k + 1] = first[k] + blocks[k];
    }
    for (uint32_t b = 0; b < first[n]; ++b) {
      const uint32_t k = SegmentOfBlock(first.data(), n, b);
      ASSERT_LT(k, n);
      EXPECT_GE(b, first[k]);
      EXPECT_LT(b, first[k + 1]) << "block " << b << " in an empty segment";
    }
  }
}

}  // namespace
}  // namespace deltacast::apply::device
