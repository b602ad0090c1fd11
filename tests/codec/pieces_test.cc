// Pieces records: a partition whose elements several producers hold (a row-split
// shard) arrives as one record made of each producer's own sparse-XOR or overwrite
// piece; receivers check and apply it like any record.
#include <gtest/gtest.h>

#include <random>

#include "codec/change_detect.h"
#include "codec/chunk.h"
#include "codec/partition_codec.h"
#include "common/partition_hash.h"

namespace deltacast::codec {
namespace {

struct Case {
  std::vector<std::byte> base, target;
  std::vector<EncodedPartition> pieces;
};

// A BF16 partition of `rows` x `cols`, split by columns over `producers` (as a row
// split holds it); ~5% of elements change; producer p encodes its columns as
// overwrite when `overwrite_from` <= p.
Case MakeCase(uint32_t rows, uint32_t cols, uint32_t producers, uint32_t overwrite_from,
              uint32_t seed) {
  Case c;
  std::mt19937 rng(seed);
  const size_t n = size_t{rows} * cols;
  c.base.resize(2 * n);
  for (auto& b : c.base) b = std::byte(rng());
  c.target = c.base;
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 20 == 0) c.target[2 * i] ^= std::byte(1 + rng() % 255);
  }
  CodecScratch scratch;
  EncodeOptions options;
  const uint32_t w = cols / producers;
  for (uint32_t p = 0; p < producers; ++p) {
    SparseChanges mine;
    mine.element_size = 2;
    std::vector<std::byte> words;
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t k = p * w; k < (p + 1) * w; ++k) {
        const size_t i = size_t{r} * cols + k;
        if (c.base[2 * i] == c.target[2 * i] && c.base[2 * i + 1] == c.target[2 * i + 1]) continue;
        mine.positions.push_back(static_cast<uint32_t>(i));
        mine.xors.push_back(c.base[2 * i] ^ c.target[2 * i]);
        mine.xors.push_back(c.base[2 * i + 1] ^ c.target[2 * i + 1]);
        words.push_back(c.target[2 * i]);
        words.push_back(c.target[2 * i + 1]);
      }
    }
    const Encoding e = p >= overwrite_from ? Encoding::kOverwrite : Encoding::kSparseXor;
    c.pieces.push_back(EncodeChanges(e, DType::kBF16, mine, words.data(), options, scratch));
  }
  return c;
}

EncodedPartition Combine(const Case& c) {
  std::vector<const EncodedPartition*> ptrs;
  for (const auto& p : c.pieces) ptrs.push_back(&p);
  return CombinePieces(ptrs);
}

RecordCoding Coding(const Case& c, const EncodedPartition& e) {
  return {DType::kBF16,
          e.encoding,
          e.entropy,
          e.change_count,
          e.raw_size,
          e.payload,
          HashPartition(c.base),
          HashPartition(c.target)};
}

TEST(Pieces, InterleavedPiecesApplyToTheTarget) {
  for (uint32_t overwrite_from : {3u, 1u, 0u}) {
    Case c = MakeCase(64, 96, 3, overwrite_from, 7 + overwrite_from);
    const EncodedPartition combined = Combine(c);
    EXPECT_EQ(combined.encoding, Encoding::kPieces);
    // Through a chunk, as a receiver gets it.
    ChunkBuilder builder(DeltaIdentity{{}, {}, c.base.size()}, 0);
    builder.Add("w", DType::kBF16, 0, c.base.size() / 2, HashPartition(c.base),
                HashPartition(c.target), combined);
    const std::vector<std::byte> chunk = builder.Finish();
    auto view = ParseChunk(chunk);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    std::vector<std::byte> data = c.base;
    CodecScratch scratch;
    Status s = ApplyEncodedPartition(view->records[0].Coding(), data, scratch);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(data, c.target);
  }
}

TEST(Pieces, OverlappingPiecesAreRefused) {
  Case c = MakeCase(16, 32, 2, 2, 3);
  c.pieces[1] = c.pieces[0];  // the same positions twice
  EncodedPartition combined = Combine(c);
  std::vector<std::byte> data = c.base;
  CodecScratch scratch;
  RecordCoding coding = Coding(c, combined);
  Status s = ApplyEncodedPartition(coding, data, scratch);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_EQ(data, c.base);
}

TEST(Pieces, AWrongPieceFailsTheCheckBeforeWriting) {
  Case c = MakeCase(16, 32, 2, 2, 4);
  Case other = MakeCase(16, 32, 2, 2, 5);  // another step's piece for producer 1
  c.pieces[1] = other.pieces[1];
  EncodedPartition combined = Combine(c);
  std::vector<std::byte> data = c.base;
  CodecScratch scratch;
  Status s = ApplyEncodedPartition(Coding(c, combined), data, scratch);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("refused before writing"), std::string::npos) << s.message();
  EXPECT_EQ(data, c.base);
}

TEST(Pieces, MalformedPayloadsAreCorrupt) {
  Case c = MakeCase(16, 32, 2, 2, 6);
  EncodedPartition combined = Combine(c);
  CodecScratch scratch;
  auto refused = [&](EncodedPartition e) {
    std::vector<std::byte> data = c.base;
    Status s = ApplyEncodedPartition(Coding(c, e), data, scratch);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
    EXPECT_EQ(data, c.base);
  };
  EncodedPartition one = combined;
  one.payload[0] = std::byte{1};  // a single piece is a plain record, never pieces
  refused(one);
  EncodedPartition counts = combined;
  counts.change_count -= 1;
  refused(counts);
  EncodedPartition truncated = combined;
  truncated.payload.resize(truncated.payload.size() - 3);
  refused(truncated);
  EncodedPartition nested = combined;
  nested.payload[4] = std::byte{static_cast<uint8_t>(Encoding::kDenseXor)};
  refused(nested);
}

}  // namespace
}  // namespace deltacast::codec
