// The root <-> producer messages round-trip, and every parser refuses truncation,
// trailing bytes and fields out of range.
#include "relay/producers/producer_protocol.h"

#include <gtest/gtest.h>

namespace deltacast::relay {
namespace {

void ExpectRefusesDamage(const std::vector<std::byte>& good,
                         const std::function<Status(ByteSpan)>& parse) {
  ASSERT_TRUE(parse(good).ok()) << parse(good).ToString();
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(parse(ByteSpan(good).first(cut)).ok()) << "truncated at " << cut;
  }
  auto longer = good;
  longer.push_back(std::byte{0});
  EXPECT_EQ(parse(longer).code(), StatusCode::kCorrupt);
}

TEST(ProducerProtocol, ProduceAndPull) {
  auto m = EncodeProduce({7, 4 << 20, 1 << 20, true});
  auto p = ParseProduce(m);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->refit_id, 7u);
  EXPECT_TRUE(p->hash_base);
  ExpectRefusesDamage(m, [](ByteSpan b) { return ParseProduce(b).status(); });
  m.back() = std::byte{2};  // flags beyond bit 0
  EXPECT_FALSE(ParseProduce(m).ok());
  auto pull = EncodePull({7, 3});
  EXPECT_EQ(ParsePull(pull)->messages, 3u);
  ExpectRefusesDamage(pull, [](ByteSpan b) { return ParsePull(b).status(); });
  EXPECT_FALSE(ParsePull(EncodeProduce({7, 1, 1, false})).ok());  // another type
}

TEST(ProducerProtocol, SplitAmaxes) {
  SplitAmaxes m;
  m.refit_id = 11;
  m.blocks = {{3, 17, 0x3c80, 0x3d00, 4096}, {5, 0, 0, 0x7fff, 1}};
  auto bytes = EncodeSplitAmaxes(m);
  auto p = ParseSplitAmaxes(bytes);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->refit_id, 11u);
  EXPECT_EQ(p->blocks, m.blocks);
  ExpectRefusesDamage(bytes, [](ByteSpan b) { return ParseSplitAmaxes(b).status(); });
  m.blocks[0].base = 0x8000;  // |x| has 15 bits
  EXPECT_FALSE(ParseSplitAmaxes(EncodeSplitAmaxes(m)).ok());
  EXPECT_TRUE(ParseSplitAmaxes(EncodeSplitAmaxes({12, {}})).ok());  // no split block
}

TEST(ProducerProtocol, CoverageWithBasePieces) {
  Coverage c;
  c.refit_id = 9;
  c.tensors = {{"a.weight", DType::kBF16, {4, 8}}, {"b", DType::kF32, {3}}};
  c.shares = {{0, 0, 16, 32}, {1, 0, 3, 3}};
  c.base_pieces = {PartitionHash{1, 2}, PartitionHash{3, 4}};
  c.layout_name = "rank-00001.toml (tp=1 pp=0 dp=0 ep=0)";
  layout::Run run;
  run.canonical = 1;
  run.dst = 1;
  run.dst_stride = 2;
  run.count = 1;
  run.len = 2;
  run.line = 12;
  c.runs = {run};
  auto m = EncodeCoverage(c);
  auto p = ParseCoverage(m);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->tensors, c.tensors);
  ASSERT_EQ(p->shares.size(), 2u);
  EXPECT_EQ(p->shares[0].covered, 16u);
  EXPECT_EQ(p->base_pieces, c.base_pieces);
  EXPECT_EQ(p->layout_name, c.layout_name);
  ASSERT_EQ(p->runs.size(), 1u);
  EXPECT_EQ(p->runs[0], run);  // local and src are not sent: zero on both ends
  ExpectRefusesDamage(m, [](ByteSpan b) { return ParseCoverage(b).status(); });
  c.shares[1].tensor = 5;  // names no tensor of the table
  EXPECT_FALSE(ParseCoverage(EncodeCoverage(c)).ok());
}

TEST(ProducerProtocol, ProducedBaseHashesPiecesEnd) {
  Produced p;
  p.refit_id = 1;
  p.chunks = 2;
  p.pieces = 1;
  p.piece_messages = 1;
  p.changes = {{0, 3, PartitionHash{5, 6}, true}};
  p.base_pieces = {PartitionHash{7, 8}, PartitionHash{9, 10}};
  auto m = EncodeProduced(p);
  ASSERT_TRUE(ParseProduced(m).ok());
  EXPECT_EQ(ParseProduced(m)->changes[0].mask, (PartitionHash{5, 6}));
  EXPECT_EQ(ParseProduced(m)->base_pieces, p.base_pieces);
  ExpectRefusesDamage(m, [](ByteSpan b) { return ParseProduced(b).status(); });

  auto h = EncodeBaseHashes({1, {PartitionHash{1, 1}, PartitionHash{}}});
  EXPECT_EQ(ParseBaseHashes(h)->hashes.size(), 2u);
  ExpectRefusesDamage(h, [](ByteSpan b) { return ParseBaseHashes(b).status(); });

  SharePiece piece;
  piece.tensor = 2;
  piece.partition = 4;
  piece.encoded.encoding = codec::Encoding::kSparseXor;
  piece.encoded.change_count = 3;
  piece.encoded.raw_size = 9;
  piece.encoded.payload = {std::byte{1}, std::byte{2}};
  auto pieces = EncodePieces(1, std::span<const SharePiece>(&piece, 1));
  auto parsed = ParsePieces(pieces);
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->second.size(), 1u);
  EXPECT_EQ(parsed->second[0].piece.payload.size(), 2u);
  ExpectRefusesDamage(pieces, [](ByteSpan b) { return ParsePieces(b).status(); });
  piece.encoded.encoding = codec::Encoding::kDenseXor;  // a piece is sparse or overwrite
  EXPECT_FALSE(ParsePieces(EncodePieces(1, std::span<const SharePiece>(&piece, 1))).ok());

  auto end = EncodeProduceEnd({1, false, "a producer died"});
  EXPECT_EQ(ParseProduceEnd(end)->reason, "a producer died");
  ExpectRefusesDamage(end, [](ByteSpan b) { return ParseProduceEnd(b).status(); });
}

}  // namespace
}  // namespace deltacast::relay
