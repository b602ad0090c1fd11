// Check before write (codec::DecodeAndCheckRecord): a record is shown to take its
// partition from the base hash to the target hash before a byte is written, from the
// mask alone for XOR records and from the old values at the written positions for
// overwrite; the prediction always equals hashing the applied result.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "codec/change_detect.h"
#include "codec/context_coder.h"
#include "codec/partition_codec.h"
#include "common/partition_hash.h"

namespace deltacast::codec {
namespace {

using Bytes = std::vector<std::byte>;
using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::kBool,   DType::kU8,  DType::kI8,  DType::kF8E4M3,
                                DType::kF8E5M2, DType::kI16, DType::kU16, DType::kF16,
                                DType::kBF16,   DType::kI32, DType::kU32, DType::kF32,
                                DType::kI64,    DType::kU64, DType::kF64};

Bytes RandomBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = std::byte(static_cast<uint8_t>(rng()));
  return out;
}

// `base` with `count` distinct elements changed by small nonzero XOR words.
Bytes Change(const Bytes& base, uint32_t e, size_t count, std::mt19937_64& rng) {
  std::vector<size_t> order(base.size() / e);
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  Bytes out = base;
  for (size_t k = 0; k < std::min(count, order.size()); ++k) {
    out[order[k] * e] ^= std::byte(static_cast<uint8_t>(1 + rng() % 3));
  }
  return out;
}

std::vector<Encoding> EncodingsFor(DType dtype) {
  std::vector<Encoding> out = {Encoding::kSparseXor, Encoding::kDenseXor, Encoding::kOverwrite,
                               Encoding::kLiteral};
  if (ContextModeSupports(dtype)) out.push_back(Encoding::kContextXor);
  return out;
}

struct Case {
  Bytes base, target;
  EncodedPartition encoded;
  RecordCoding coding;
};

Case Make(DType dtype, Encoding encoding, EntropyCoder entropy, size_t elements, size_t changes,
          std::mt19937_64& rng) {
  const uint32_t e = static_cast<uint32_t>(ElementSize(dtype));
  Case c;
  c.base = RandomBytes(elements * e, rng);
  c.target = Change(c.base, e, changes, rng);
  SparseChanges found;
  FindChanges(c.base, c.target, e, found);
  EncodeOptions options;
  options.entropy = entropy;
  CodecScratch scratch;
  auto encoded = EncodePartitionAs(encoding, dtype, c.base, c.target, found, options, scratch);
  EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
  c.encoded = std::move(*encoded);
  c.coding = {dtype,
              c.encoded.encoding,
              c.encoded.entropy,
              c.encoded.change_count,
              c.encoded.raw_size,
              c.encoded.payload,
              HashPartition(c.base),
              HashPartition(c.target)};
  return c;
}

// The hash the decoded record predicts for the result, computed as the check does.
PartitionHash Predicted(const DecodedRecord& d, const PartitionHash& base_hash) {
  switch (d.form) {
    case DecodedRecord::Form::kWholeTarget:
      return HashPartition(d.whole);
    case DecodedRecord::Form::kDenseMask:
      return base_hash ^ HashPiece(d.whole, 0);
    case DecodedRecord::Form::kChanges:
      break;
  }
  return base_hash ^
         HashSparseMask(d.changes.positions, d.changes.xors.data(), d.changes.element_size);
}

TEST(RecordCheckTest, MaskCheckAgreesWithApplyingAndRehashing) {
  std::mt19937_64 rng(1);
  for (DType dtype : kAllDTypes) {
    const uint32_t e = static_cast<uint32_t>(ElementSize(dtype));
    for (Encoding encoding : EncodingsFor(dtype)) {
      for (EntropyCoder entropy : {EntropyCoder::kNone, EntropyCoder::kZstd}) {
        if (encoding == Encoding::kContextXor && entropy != EntropyCoder::kNone) continue;
        for (size_t changes : {1, 7, 150}) {
          SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + std::string(EncodingName(encoding)) +
                       " changes " + std::to_string(changes));
          const size_t elements = 1 + rng() % 700 + changes;
          Case c = Make(dtype, encoding, entropy, elements, changes, rng);
          CodecScratch scratch;
          DecodedRecord decoded;
          ASSERT_TRUE(DecodeAndCheckRecord(c.coding, c.base, decoded, scratch).ok());
          const PartitionHash predicted = Predicted(decoded, c.coding.base_hash);
          Bytes data = c.base;
          ASSERT_TRUE(ApplyDecodedRecord(decoded, data, c.coding.target_hash).ok());
          EXPECT_TRUE(data == c.target);
          EXPECT_EQ(HashPartition(data), predicted);
          EXPECT_EQ(predicted, c.coding.target_hash);
          if (decoded.form != DecodedRecord::Form::kChanges) continue;
          // A wrong mask predicts exactly the hash its bytes would have, which is not
          // the target: what the check refuses.
          DecodedRecord wrong = decoded;
          const size_t i = rng() % wrong.changes.size();
          wrong.changes.xors[i * e + rng() % e] ^= std::byte{0x40};
          Bytes applied = c.base;
          for (size_t k = 0; k < wrong.changes.size(); ++k) {
            for (uint32_t b = 0; b < e; ++b) {
              applied[size_t{wrong.changes.positions[k]} * e + b] ^= wrong.changes.xors[k * e + b];
            }
          }
          EXPECT_EQ(Predicted(wrong, c.coding.base_hash), HashPartition(applied));
          EXPECT_NE(Predicted(wrong, c.coding.base_hash), c.coding.target_hash);
        }
      }
    }
  }
}

// XOR records are checked from the mask alone: the bytes passed as the base are not
// read (the caller's hash of the partition says whether it is at base).
TEST(RecordCheckTest, XorRecordsAreCheckedFromTheMaskAlone) {
  std::mt19937_64 rng(2);
  for (Encoding encoding : {Encoding::kSparseXor, Encoding::kDenseXor}) {
    Case c = Make(DType::kBF16, encoding, EntropyCoder::kZstd, 4096, 300, rng);
    const Bytes unrelated = RandomBytes(c.base.size(), rng);
    CodecScratch scratch;
    DecodedRecord decoded;
    EXPECT_TRUE(DecodeAndCheckRecord(c.coding, unrelated, decoded, scratch).ok())
        << EncodingName(encoding);
    RecordCoding wrong = c.coding;
    wrong.target_hash.hi ^= 1ull << 63;
    const Status s = DecodeAndCheckRecord(wrong, unrelated, decoded, scratch);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt);
    EXPECT_THAT(s.message(), HasSubstr("refused before writing"));
  }
}

// Overwrite records are checked with the old values at the positions they write,
// and only those: a different old value there fails the check; elsewhere it cannot
// be seen (the caller's base hash of the whole partition covers that).
TEST(RecordCheckTest, OverwriteIsCheckedWithTheOldValuesAtTheWrittenPositions) {
  std::mt19937_64 rng(3);
  Case c = Make(DType::kF32, Encoding::kOverwrite, EntropyCoder::kNone, 512, 20, rng);
  CodecScratch scratch;
  DecodedRecord decoded;
  ASSERT_TRUE(DecodeAndCheckRecord(c.coding, c.base, decoded, scratch).ok());
  const uint32_t written = decoded.changes.positions[3];
  uint32_t untouched = 0;
  while (std::find(decoded.changes.positions.begin(), decoded.changes.positions.end(), untouched) !=
         decoded.changes.positions.end()) {
    ++untouched;
  }
  Bytes other = c.base;
  other[written * 4 + 1] ^= std::byte{0x10};
  const Status s = DecodeAndCheckRecord(c.coding, other, decoded, scratch);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("does not hash to its target"));
  other = c.base;
  other[untouched * 4] ^= std::byte{0x10};
  EXPECT_TRUE(DecodeAndCheckRecord(c.coding, other, decoded, scratch).ok());
}

// One bit flipped anywhere in a record's payload or hashes: refused before the
// partition changes, for every encoding and entropy stage.
TEST(RecordCheckTest, EveryBitFlipInAPayloadOrTargetHashIsRefusedBeforeWriting) {
  std::mt19937_64 rng(4);
  for (Encoding encoding : EncodingsFor(DType::kBF16)) {
    for (EntropyCoder entropy : {EntropyCoder::kNone, EntropyCoder::kLz4}) {
      if (encoding == Encoding::kContextXor && entropy != EntropyCoder::kNone) continue;
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " entropy " +
                   std::to_string(static_cast<int>(entropy)));
      Case c = Make(DType::kBF16, encoding, entropy, 96, 9, rng);
      size_t refused = 0, flips = 0;
      for (size_t bit = 0; bit < 8 * c.encoded.payload.size() + 128; ++bit) {
        Bytes payload = c.encoded.payload;
        RecordCoding coding = c.coding;
        if (bit < 8 * payload.size()) {
          payload[bit / 8] ^= std::byte(static_cast<uint8_t>(1u << (bit % 8)));
          coding.payload = payload;
        } else {
          const size_t b = bit - 8 * payload.size();
          (b < 64 ? coding.target_hash.lo : coding.target_hash.hi) ^= 1ull << (b % 64);
        }
        Bytes data = c.base;
        CodecScratch scratch;
        const Status s = ApplyEncodedPartition(coding, data, scratch);
        ++flips;
        refused += !s.ok();
        ASSERT_TRUE(!s.ok() || data == c.target) << "bit " << bit << " applied a wrong record";
        ASSERT_TRUE(s.ok() || data == c.base) << "bit " << bit << " changed the partition";
      }
      // Stored sections have no slack: every flip is refused. An lz4 block may have
      // a bit whose flip decodes to the same bytes; such a flip passes, correctly.
      if (entropy == EntropyCoder::kNone) {
        EXPECT_EQ(refused, flips);
      } else {
        EXPECT_GE(refused * 10, flips * 9) << refused << " of " << flips;
      }
    }
  }
}

// Applying writes and hashes a partition window by window (64 KiB): partitions of
// many windows, of a length that is no multiple of a window or of a 16-byte block,
// end bit-exact at the target for every encoding.
TEST(RecordCheckTest, OnePassApplyOfPartitionsOfManyWindowsIsBitExact) {
  std::mt19937_64 rng(7);
  for (DType dtype : {DType::kU8, DType::kBF16, DType::kF32, DType::kI64}) {
    const uint32_t e = static_cast<uint32_t>(ElementSize(dtype));
    for (Encoding encoding : EncodingsFor(dtype)) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + std::string(EncodingName(encoding)));
      const size_t elements = (size_t{300} << 10) / e + 3;  // ~300 KiB: 5 windows and a bit
      Case c = Make(dtype, encoding, EntropyCoder::kZstd, elements, elements / 30, rng);
      Bytes data = c.base;
      CodecScratch scratch;
      const Status s = ApplyEncodedPartition(c.coding, data, scratch);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(data == c.target);
      EXPECT_EQ(HashPartition(data), c.coding.target_hash);
    }
  }
}

// A record applied to bytes that are not its base (a store whose manifest was wrong)
// misses the target when the stored result is hashed, and leaves the bytes exactly
// as they were: XOR is undone, a literal's old bytes are put back.
TEST(RecordCheckTest, ApplyThatMissesItsTargetLeavesTheBytesAsTheyWere) {
  std::mt19937_64 rng(8);
  for (size_t kib : {1, 200}) {
    for (Encoding encoding : EncodingsFor(DType::kBF16)) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + std::to_string(kib) + " KiB");
      const size_t elements = kib * 512 + 1;
      Case c = Make(DType::kBF16, encoding, EntropyCoder::kZstd, elements, elements / 20, rng);
      CodecScratch scratch;
      DecodedRecord decoded;
      ASSERT_TRUE(DecodeAndCheckRecord(c.coding, c.base, decoded, scratch).ok());
      // Not the base: one element of the first and of the last window differs.
      Bytes other = c.base;
      other[0] ^= std::byte{0x40};
      other[other.size() - 1] ^= std::byte{0x40};
      // A literal reaches its target from any bytes; ask it for another target.
      const PartitionHash wanted = encoding == Encoding::kLiteral
                                       ? c.coding.target_hash ^ PartitionHash { 1, 0 }
                                       : c.coding.target_hash;
      Bytes data = other;
      const Status s = ApplyDecodedRecord(decoded, data, wanted, scratch);
      EXPECT_EQ(s.code(), StatusCode::kCorrupt);
      EXPECT_TRUE(data == other);
      // The decoded record is intact: it still applies to the base.
      data = c.base;
      ASSERT_TRUE(ApplyDecodedRecord(decoded, data, c.coding.target_hash, scratch).ok());
      EXPECT_TRUE(data == c.target);
    }
  }
}

}  // namespace
}  // namespace deltacast::codec
