#include "codec/partition_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "codec/change_detect.h"
#include "codec/context_coder.h"
#include "common/hash.h"

namespace deltacast::codec {
namespace {

using Bytes = std::vector<std::byte>;
using ::testing::HasSubstr;

constexpr std::array<DType, 15> kAllDTypes = {
    DType::kBool, DType::kU8,  DType::kI8,  DType::kF8E4M3, DType::kF8E5M2,
    DType::kI16,  DType::kU16, DType::kF16, DType::kBF16,   DType::kI32,
    DType::kU32,  DType::kF32, DType::kI64, DType::kU64,    DType::kF64,
};
constexpr std::array<EntropyCoder, 3> kAllEntropy = {EntropyCoder::kNone, EntropyCoder::kZstd,
                                                     EntropyCoder::kLz4};

uint32_t SizeOf(DType dtype) { return static_cast<uint32_t>(ElementSize(dtype)); }

std::string EntropyName(EntropyCoder coder) {
  switch (coder) {
    case EntropyCoder::kNone:
      return "none";
    case EntropyCoder::kZstd:
      return "zstd";
    case EntropyCoder::kLz4:
      return "lz4";
  }
  return "?";
}

// The encodings EncodePartitionAs accepts for `dtype`.
std::vector<Encoding> EncodingsFor(DType dtype) {
  std::vector<Encoding> out = {Encoding::kSparseXor, Encoding::kDenseXor, Encoding::kOverwrite,
                               Encoding::kLiteral};
  if (ContextModeSupports(dtype)) out.push_back(Encoding::kContextXor);
  return out;
}

uint64_t WordMask(uint32_t element_size) {
  return element_size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * element_size)) - 1;
}

Bytes RandomBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = std::byte(static_cast<uint8_t>(rng()));
  return out;
}

// Low-entropy bytes, so the entropy stage has something to win on.
Bytes StructuredBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = std::byte(static_cast<uint8_t>((i % 7) + (rng() % 16 == 0 ? 1 : 0)));
  }
  return out;
}

// `base` with exactly `count` distinct elements changed. Small XOR words when
// `small` (compressible, as real training steps are), else random nonzero ones.
Bytes ChangeElements(const Bytes& base, uint32_t e, size_t count, bool small,
                     std::mt19937_64& rng) {
  const size_t n = base.size() / e;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  order.resize(count);
  Bytes out = base;
  for (size_t i : order) {
    uint64_t x = 0;
    while (x == 0) x = (small ? rng() % 4 : rng()) & WordMask(e);
    for (uint32_t k = 0; k < e; ++k) {
      out[i * e + k] ^= std::byte(static_cast<uint8_t>(x >> (8 * k)));
    }
  }
  return out;
}

Bytes WordsToBytes(const std::vector<uint64_t>& words, uint32_t e) {
  Bytes out(words.size() * e);
  for (size_t i = 0; i < words.size(); ++i) {
    for (uint32_t k = 0; k < e; ++k) {
      out[i * e + k] = std::byte(static_cast<uint8_t>(words[i] >> (8 * k)));
    }
  }
  return out;
}

// What FindChanges must produce, one element at a time.
SparseChanges NaiveChanges(ByteSpan base, ByteSpan target, uint32_t e) {
  SparseChanges out;
  out.element_size = e;
  for (size_t i = 0; i < base.size() / e; ++i) {
    if (std::memcmp(base.data() + i * e, target.data() + i * e, e) == 0) continue;
    out.positions.push_back(static_cast<uint32_t>(i));
    for (uint32_t k = 0; k < e; ++k) out.xors.push_back(base[i * e + k] ^ target[i * e + k]);
  }
  return out;
}

RecordCoding CodingOf(DType dtype, const EncodedPartition& encoded, const PartitionHash& base_hash,
                      const PartitionHash& target_hash) {
  return {
      dtype,           encoded.encoding, encoded.entropy, encoded.change_count, encoded.raw_size,
      encoded.payload, base_hash,        target_hash};
}

// Applies `encoded` to a copy of `base` and expects exactly `target`, compared by
// bytes and by hash.
void ExpectRoundTrip(DType dtype, const Bytes& base, const Bytes& target,
                     const EncodedPartition& encoded) {
  Bytes data = base;
  CodecScratch scratch;
  const Status s = ApplyEncodedPartition(
      CodingOf(dtype, encoded, HashPartition(base), HashPartition(target)), data, scratch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(data == target) << "bytes differ from the target";
  EXPECT_EQ(HashPartition(data), HashPartition(target));
}

// Applies `coding` to a copy of `data` and expects a failure that leaves every
// byte exactly as it was.
void ExpectRefused(const RecordCoding& coding, const Bytes& data, std::string_view substring = "") {
  Bytes copy = data;
  CodecScratch scratch;
  const Status s = ApplyEncodedPartition(coding, copy, scratch);
  EXPECT_FALSE(s.ok()) << "a malformed record was applied";
  if (!s.ok()) {
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  }
  EXPECT_THAT(s.message(), HasSubstr(std::string(substring)));
  EXPECT_TRUE(copy == data) << "a refused record changed the partition: " << s.ToString();
}

// ---------------------------------------------------------------------------
// FindChanges

TEST(FindChangesTest, MatchesNaiveReferenceOnRandomData) {
  std::mt19937_64 rng(42);
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    for (int trial = 0; trial < 150; ++trial) {
      // Small partitions, and some spanning several 4 KiB stripes of the kernel.
      const size_t n = trial % 3 == 0 ? rng() % (12000 / e) : rng() % 300;
      // Start at an arbitrary address so unaligned loads are exercised too.
      const size_t shift = rng() % 16;
      const Bytes base_buffer = RandomBytes(shift + n * e, rng);
      Bytes target_buffer = base_buffer;
      const double p = std::array<double, 5>{0.0, 0.005, 0.05, 0.5, 1.0}[trial % 5];
      std::bernoulli_distribution flip(p);
      for (size_t i = shift; i < target_buffer.size(); ++i) {
        if (flip(rng)) target_buffer[i] ^= std::byte(static_cast<uint8_t>(1 + rng() % 255));
      }
      const ByteSpan base = ByteSpan(base_buffer).subspan(shift);
      const ByteSpan target = ByteSpan(target_buffer).subspan(shift);
      SparseChanges got;
      got.positions = {7, 8, 9};  // stale contents must be cleared
      got.xors.assign(24, std::byte{1});
      FindChanges(base, target, e, got);
      const SparseChanges want = NaiveChanges(base, target, e);
      ASSERT_EQ(got.element_size, e);
      ASSERT_EQ(got.positions, want.positions) << "e=" << e << " n=" << n << " p=" << p;
      ASSERT_TRUE(got.xors == want.xors) << "e=" << e << " n=" << n << " p=" << p;
    }
  }
}

// Every single byte flip, at every position of every 64-byte block and of the tail,
// is reported as exactly one change of the element holding that byte.
TEST(FindChangesTest, EverySingleByteFlipIsFoundAtItsElement) {
  std::mt19937_64 rng(7);
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    const size_t n = 3 * 64 / e + 5;  // three full blocks and a tail
    const Bytes base = RandomBytes(n * e, rng);
    SparseChanges got;
    for (size_t b = 0; b < base.size(); ++b) {
      Bytes target = base;
      target[b] ^= std::byte{0x80};
      FindChanges(base, target, e, got);
      ASSERT_EQ(got.size(), 1u) << "e=" << e << " byte " << b;
      EXPECT_EQ(got.positions[0], b / e);
      for (uint32_t k = 0; k < e; ++k) {
        EXPECT_EQ(got.xors[k], k == b % e ? std::byte{0x80} : std::byte{0})
            << "e=" << e << " byte " << b;
      }
    }
  }
}

TEST(FindChangesTest, EmptyAndIdenticalPartitionsHaveNoChanges) {
  std::mt19937_64 rng(3);
  SparseChanges got;
  FindChanges(ByteSpan(), ByteSpan(), 4, got);
  EXPECT_EQ(got.size(), 0u);
  const Bytes same = RandomBytes(1000, rng);
  FindChanges(same, same, 8, got);
  EXPECT_EQ(got.size(), 0u);
  EXPECT_TRUE(got.xors.empty());
}

// ---------------------------------------------------------------------------
// Round trips: every dtype x every entropy coder x every encoding.

class PartitionCodecRoundTripTest
    : public ::testing::TestWithParam<std::tuple<DType, EntropyCoder>> {};

TEST_P(PartitionCodecRoundTripTest, EveryEncodingRoundTripsBitExactly) {
  const auto [dtype, entropy] = GetParam();
  const uint32_t e = SizeOf(dtype);
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 31 + static_cast<uint64_t>(entropy));
  EncodeOptions options;
  options.entropy = entropy;
  CodecScratch scratch;
  std::set<Encoding> entropy_coded;  // encodings whose entropy stage was kept at least once

  // Element counts chosen so most partitions are not a multiple of 64 bytes.
  for (size_t n : {1, 2, 3, 31, 33, 63, 65, 100, 257}) {
    for (bool structured : {false, true}) {
      const Bytes base = structured ? StructuredBytes(n * e, rng) : RandomBytes(n * e, rng);
      for (size_t changes : {size_t{1}, n / 7 + 1, n}) {
        const Bytes target = ChangeElements(base, e, changes, structured, rng);
        SparseChanges found;
        FindChanges(base, target, e, found);
        ASSERT_EQ(found.size(), changes);
        for (Encoding encoding : EncodingsFor(dtype)) {
          SCOPED_TRACE(std::string(EncodingName(encoding)) + " n=" + std::to_string(n) +
                       " changes=" + std::to_string(changes) +
                       (structured ? " structured" : " random"));
          auto encoded = EncodePartitionAs(encoding, dtype, base, target, found, options, scratch);
          ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
          EXPECT_EQ(encoded->encoding, encoding);
          EXPECT_EQ(encoded->change_count, changes);
          if (encoding == Encoding::kContextXor) {
            EXPECT_EQ(encoded->entropy, EntropyCoder::kNone);
            EXPECT_EQ(encoded->raw_size, 0u);
          } else {
            EXPECT_LE(encoded->raw_size, MaxRawSize(encoding, n, e, changes));
            EXPECT_TRUE(encoded->entropy == entropy || encoded->entropy == EntropyCoder::kNone);
            if (entropy == EntropyCoder::kNone) {
              EXPECT_EQ(encoded->entropy, EntropyCoder::kNone);
              EXPECT_GE(encoded->payload.size(), encoded->raw_size);
            } else if (encoded->payload.size() < encoded->raw_size) {
              entropy_coded.insert(encoding);
            }
          }
          ExpectRoundTrip(dtype, base, target, *encoded);
        }
        for (bool every : {false, true}) {
          for (CodecMode mode : {CodecMode::kFast, CodecMode::kContext}) {
            options.try_every_encoding = every;
            options.mode = mode;
            auto best = EncodePartition(dtype, base, target, options, scratch);
            ASSERT_TRUE(best.has_value());
            EXPECT_EQ(best->change_count, changes);
            ExpectRoundTrip(dtype, base, target, *best);
          }
        }
        options.try_every_encoding = false;
        options.mode = CodecMode::kFast;
      }
    }
  }
  if (entropy != EntropyCoder::kNone) {
    // Otherwise the decompression paths above were never exercised.
    for (Encoding encoding :
         {Encoding::kSparseXor, Encoding::kDenseXor, Encoding::kOverwrite, Encoding::kLiteral}) {
      EXPECT_EQ(entropy_coded.count(encoding), 1u)
          << EncodingName(encoding) << " never kept its entropy stage";
    }
  }
}

TEST_P(PartitionCodecRoundTripTest, UnchangedPartitionEncodesToNothing) {
  const auto [dtype, entropy] = GetParam();
  std::mt19937_64 rng(5);
  const Bytes base = RandomBytes(37 * SizeOf(dtype), rng);
  EncodeOptions options;
  options.entropy = entropy;
  options.try_every_encoding = true;
  CodecScratch scratch;
  EXPECT_FALSE(EncodePartition(dtype, base, base, options, scratch).has_value());
}

INSTANTIATE_TEST_SUITE_P(
    AllDTypesAllCoders, PartitionCodecRoundTripTest,
    ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllEntropy)),
    [](const ::testing::TestParamInfo<PartitionCodecRoundTripTest::ParamType>& info) {
      std::string name(DTypeName(std::get<0>(info.param)));
      name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
      return name + "_" + EntropyName(std::get<1>(info.param));
    });

TEST(PartitionCodecTest, ContextXorIsUnsupportedForDtypesItDoesNotModel) {
  std::mt19937_64 rng(9);
  CodecScratch scratch;
  for (DType dtype : kAllDTypes) {
    const uint32_t e = SizeOf(dtype);
    const Bytes base = RandomBytes(16 * e, rng);
    const Bytes target = ChangeElements(base, e, 3, false, rng);
    SparseChanges found;
    FindChanges(base, target, e, found);
    auto encoded =
        EncodePartitionAs(Encoding::kContextXor, dtype, base, target, found, {}, scratch);
    const bool supported = dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32 ||
                           dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
    EXPECT_EQ(encoded.ok(), supported) << DTypeName(dtype);
    if (!supported) {
      EXPECT_EQ(encoded.status().code(), StatusCode::kUnsupported);
    }
  }
}

// ---------------------------------------------------------------------------
// Adversarial bit patterns.

// Words whose bits matter to float formats of that width: signed zeros, infinities,
// NaNs with payloads (quiet and signalling), denormals, extremes, all ones.
std::vector<uint64_t> SpecialWords(uint32_t e) {
  switch (e) {
    case 1:  // FP8 E4M3 / E5M2 and small integers
      return {0x00, 0x80, 0x7F, 0xFF, 0x7C, 0xFC, 0x7D, 0x7E, 0x01, 0x81, 0x08, 0x77};
    case 2:  // F16 and BF16
      return {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x7F80, 0xFF80, 0x7FC0,
              0x7F81, 0xFFFF, 0x0001, 0x83FF, 0x807F, 0x7BFF, 0x7F7F, 0x3C00, 0x3F80};
    case 4:
      return {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001,
              0x7F800001, 0xFFFFFFFF, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x3F800000};
    default:
      return {0x0000000000000000, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
              0x7FF8000000000000, 0x7FF8000000000001, 0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF,
              0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x7FEFFFFFFFFFFFFF, 0x3FF0000000000000};
  }
}

TEST(PartitionCodecTest, AdversarialBitPatternsRoundTripInEveryDtypeEncodingAndCoder) {
  CodecScratch scratch;
  for (DType dtype : kAllDTypes) {
    const uint32_t e = SizeOf(dtype);
    const std::vector<uint64_t> special = SpecialWords(e);
    // Every ordered pair (a -> b), including a == b (unchanged elements between).
    std::vector<uint64_t> from, to;
    size_t expected_changes = 0;
    for (uint64_t a : special) {
      for (uint64_t b : special) {
        from.push_back(a);
        to.push_back(b);
        expected_changes += a != b;
      }
    }
    const Bytes base = WordsToBytes(from, e);
    const Bytes target = WordsToBytes(to, e);
    SparseChanges found;
    FindChanges(base, target, e, found);
    ASSERT_EQ(found.size(), expected_changes) << DTypeName(dtype);
    for (EntropyCoder entropy : kAllEntropy) {
      EncodeOptions options;
      options.entropy = entropy;
      for (Encoding encoding : EncodingsFor(dtype)) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + std::string(EncodingName(encoding)) +
                     " " + EntropyName(entropy));
        auto encoded = EncodePartitionAs(encoding, dtype, base, target, found, options, scratch);
        ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
        ExpectRoundTrip(dtype, base, target, *encoded);
        // And back: the reverse delta restores every odd pattern too.
        SparseChanges back;
        FindChanges(target, base, e, back);
        auto reverse = EncodePartitionAs(encoding, dtype, target, base, back, options, scratch);
        ASSERT_TRUE(reverse.ok()) << reverse.status().ToString();
        ExpectRoundTrip(dtype, target, base, *reverse);
      }
    }
  }
}

TEST(PartitionCodecTest, NegativeZeroAndNanPayloadsCountAsChanges) {
  struct Case {
    DType dtype;
    uint64_t from, to;
  };
  const std::vector<Case> cases = {
      {DType::kF16, 0x0000, 0x8000},           // +0.0 -> -0.0
      {DType::kBF16, 0x8000, 0x0000},          // -0.0 -> +0.0
      {DType::kF32, 0x00000000, 0x80000000},   // +0.0 -> -0.0
      {DType::kF64, 0x0, 0x8000000000000000},  // +0.0 -> -0.0
      {DType::kF32, 0x7FC00001, 0x7FC00002},   // NaN -> NaN with another payload
      {DType::kBF16, 0x7FC1, 0xFFC1},          // NaN -> negative NaN
      {DType::kF16, 0x0001, 0x0000},           // smallest denormal -> +0.0
      {DType::kF8E4M3, 0x00, 0x80},            // FP8 +0 -> -0
  };
  CodecScratch scratch;
  for (const Case& c : cases) {
    const uint32_t e = SizeOf(c.dtype);
    std::vector<uint64_t> from(45, c.from), to(45, c.from);
    to[44] = c.to;  // the last element: in the tail after the last full 64-byte block
    to[3] = c.to;
    const Bytes base = WordsToBytes(from, e);
    const Bytes target = WordsToBytes(to, e);
    for (bool every : {false, true}) {
      EncodeOptions options;
      options.try_every_encoding = every;
      auto encoded = EncodePartition(c.dtype, base, target, options, scratch);
      ASSERT_TRUE(encoded.has_value()) << DTypeName(c.dtype) << " change not detected";
      EXPECT_EQ(encoded->change_count, 2u) << DTypeName(c.dtype);
      ExpectRoundTrip(c.dtype, base, target, *encoded);
    }
  }
}

// ---------------------------------------------------------------------------
// Malformed records: every one is refused and the partition is left exactly as
// it was.

class MalformedPartitionTest : public ::testing::Test {
 protected:
  static constexpr DType kDType = DType::kBF16;
  static constexpr uint32_t kE = 2;
  static constexpr size_t kElements = 201;  // 402 bytes: not a multiple of 64

  void SetUp() override {
    std::mt19937_64 rng(11);
    base_ = StructuredBytes(kElements * kE, rng);
    target_ = ChangeElements(base_, kE, 12, true, rng);
    target_[2 * 200] = base_[2 * 200] ^ std::byte{0x01};  // the last element always changes
    FindChanges(base_, target_, kE, changes_);
  }

  EncodedPartition Encode(Encoding encoding, EntropyCoder entropy) {
    EncodeOptions options;
    options.entropy = entropy;
    auto encoded = EncodePartitionAs(encoding, kDType, base_, target_, changes_, options, scratch_);
    EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
    return encoded.ok() ? *encoded : EncodedPartition{};
  }

  RecordCoding Coding(const EncodedPartition& encoded) const {
    return CodingOf(kDType, encoded, HashPartition(base_), HashPartition(target_));
  }

  // A sparse-xor record written from hand-made changes, which EncodePartitionAs
  // serializes without checking them: how a malformed record reaches the wire.
  // The payload lives in crafted_ until the next call.
  RecordCoding CraftSparse(const std::vector<uint32_t>& positions,
                           const std::vector<uint16_t>& words, const PartitionHash& target_hash,
                           EntropyCoder entropy = EntropyCoder::kNone) {
    SparseChanges changes;
    changes.element_size = kE;
    changes.positions = positions;
    for (uint16_t w : words) {
      changes.xors.push_back(std::byte(static_cast<uint8_t>(w)));
      changes.xors.push_back(std::byte(static_cast<uint8_t>(w >> 8)));
    }
    EncodeOptions options;
    options.entropy = entropy;
    auto encoded =
        EncodePartitionAs(Encoding::kSparseXor, kDType, base_, base_, changes, options, scratch_);
    EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
    crafted_ = encoded.ok() ? *encoded : EncodedPartition{};
    return CodingOf(kDType, crafted_, HashPartition(base_), target_hash);
  }

  Bytes base_, target_;
  SparseChanges changes_;
  CodecScratch scratch_;
  EncodedPartition crafted_;
};

constexpr std::array<Encoding, 5> kBf16Encodings = {Encoding::kSparseXor, Encoding::kDenseXor,
                                                    Encoding::kOverwrite, Encoding::kLiteral,
                                                    Encoding::kContextXor};

TEST_F(MalformedPartitionTest, ValidRecordsApplyAsAControl) {
  for (Encoding encoding : kBf16Encodings) {
    for (EntropyCoder entropy : kAllEntropy) {
      ExpectRoundTrip(kDType, base_, target_, Encode(encoding, entropy));
    }
  }
}

TEST_F(MalformedPartitionTest, TruncatedPayloadIsRefused) {
  for (Encoding encoding : kBf16Encodings) {
    for (EntropyCoder entropy : kAllEntropy) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + EntropyName(entropy));
      const EncodedPartition encoded = Encode(encoding, entropy);
      ASSERT_FALSE(encoded.payload.empty());
      for (size_t keep : {size_t{0}, encoded.payload.size() / 2, encoded.payload.size() - 1}) {
        RecordCoding coding = Coding(encoded);
        coding.payload = ByteSpan(encoded.payload).first(keep);
        ExpectRefused(coding, base_);
      }
      // Bytes past the end of a well-formed payload are refused as well.
      Bytes longer = encoded.payload;
      longer.push_back(std::byte{0});
      RecordCoding coding = Coding(encoded);
      coding.payload = longer;
      ExpectRefused(coding, base_);
    }
  }
}

TEST_F(MalformedPartitionTest, BitFlippedPayloadIsRefusedOrStillExact) {
  for (Encoding encoding : kBf16Encodings) {
    for (EntropyCoder entropy : kAllEntropy) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + EntropyName(entropy));
      const EncodedPartition encoded = Encode(encoding, entropy);
      size_t refused = 0, flips = 0;
      const size_t bits = encoded.payload.size() * 8;
      const size_t step = std::max<size_t>(1, bits / 1500);
      for (size_t bit = 0; bit < bits; bit += step) {
        Bytes flipped = encoded.payload;
        flipped[bit / 8] ^= std::byte(static_cast<uint8_t>(1u << (bit % 8)));
        RecordCoding coding = Coding(encoded);
        coding.payload = flipped;
        Bytes data = base_;
        const Status s = ApplyEncodedPartition(coding, data, scratch_);
        ++flips;
        if (s.ok()) {
          // Possible only where the flipped bit does not matter to the decoder.
          ASSERT_TRUE(data == target_) << "bit " << bit << " applied to wrong bytes";
        } else {
          ++refused;
          ASSERT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
          ASSERT_TRUE(data == base_) << "bit " << bit << ": refused but changed: " << s.ToString();
        }
      }
      EXPECT_GT(refused, flips * 9 / 10);
    }
  }
}

TEST_F(MalformedPartitionTest, WrongRawSizeIsRefused) {
  for (Encoding encoding : kBf16Encodings) {
    for (EntropyCoder entropy : kAllEntropy) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + EntropyName(entropy));
      const EncodedPartition encoded = Encode(encoding, entropy);
      RecordCoding coding = Coding(encoded);
      coding.raw_size = encoded.raw_size + 1;
      ExpectRefused(coding, base_);
      if (encoded.raw_size > 0) {
        coding.raw_size = encoded.raw_size - 1;
        ExpectRefused(coding, base_);
        coding.raw_size = 0;
        ExpectRefused(coding, base_);
      }
      coding.raw_size = UINT64_MAX;  // refused before anything is allocated
      ExpectRefused(coding, base_);
    }
  }
}

TEST_F(MalformedPartitionTest, RawSizeAboveTheEncodingsBoundIsRefusedBeforeDecoding) {
  for (Encoding encoding :
       {Encoding::kSparseXor, Encoding::kOverwrite, Encoding::kDenseXor, Encoding::kLiteral}) {
    const EncodedPartition encoded = Encode(encoding, EntropyCoder::kZstd);
    RecordCoding coding = Coding(encoded);
    coding.raw_size = MaxRawSize(encoding, kElements, kE, encoded.change_count) + 1;
    ExpectRefused(coding, base_, "above the bound");
  }
}

TEST_F(MalformedPartitionTest, ChangeCountTooBigIsRefused) {
  for (Encoding encoding : kBf16Encodings) {
    const EncodedPartition encoded = Encode(encoding, EntropyCoder::kNone);
    RecordCoding coding = Coding(encoded);
    coding.change_count = kElements + 1;
    ExpectRefused(coding, base_, "changes in a partition of 201 elements");
    coding.change_count = UINT64_MAX;
    ExpectRefused(coding, base_);
  }
  // Sparse encodings carry exactly change_count entries: one more or fewer is malformed.
  for (Encoding encoding : {Encoding::kSparseXor, Encoding::kOverwrite, Encoding::kContextXor}) {
    for (EntropyCoder entropy : kAllEntropy) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + EntropyName(entropy));
      const EncodedPartition encoded = Encode(encoding, entropy);
      RecordCoding coding = Coding(encoded);
      coding.change_count = encoded.change_count + 1;
      ExpectRefused(coding, base_);
      coding.change_count = encoded.change_count - 1;
      ExpectRefused(coding, base_);
      coding.change_count = 0;
      ExpectRefused(coding, base_);
    }
  }
}

TEST_F(MalformedPartitionTest, SparseGapPastTheEndIsRefused) {
  const PartitionHash any = HashPartition(target_);
  for (EntropyCoder entropy : kAllEntropy) {
    SCOPED_TRACE(EntropyName(entropy));
    ExpectRefused(CraftSparse({kElements}, {1}, any, entropy), base_, "beyond the partition");
    ExpectRefused(CraftSparse({150, 201}, {1, 1}, any, entropy), base_, "beyond the partition");
    ExpectRefused(CraftSparse({3, 1u << 31}, {1, 1}, any, entropy), base_, "beyond the partition");
    // Positions out of order make the encoder write a gap that wraps past 2^32.
    ExpectRefused(CraftSparse({9, 4}, {1, 1}, any, entropy), base_, "beyond the partition");
  }
  // Control: the last element itself is in bounds and applies.
  Bytes expected = base_;
  expected[2 * 150 + 1] ^= std::byte{1};
  expected[2 * 200] ^= std::byte{1};
  Bytes data = base_;
  const Status s = ApplyEncodedPartition(
      CraftSparse({150, 200}, {0x0100, 1}, HashPartition(expected)), data, scratch_);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(data == expected);
}

// A record for a partition of 201 elements, applied to one of 200, must not reach
// past the end (its last element changed) nor succeed.
TEST_F(MalformedPartitionTest, RecordForALongerPartitionIsRefused) {
  const Bytes shorter(base_.begin(), base_.end() - kE);
  for (Encoding encoding : kBf16Encodings) {
    for (EntropyCoder entropy : kAllEntropy) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + EntropyName(entropy));
      ExpectRefused(Coding(Encode(encoding, entropy)), shorter);
    }
  }
}

TEST_F(MalformedPartitionTest, ZeroXorWordIsRefused) {
  for (EntropyCoder entropy : kAllEntropy) {
    ExpectRefused(CraftSparse({5, 6}, {0x0101, 0}, HashPartition(base_), entropy), base_,
                  "zero XOR word");
    // Even when the claimed target is the base itself (an all-zero change).
    ExpectRefused(CraftSparse({5}, {0}, HashPartition(base_), entropy), base_, "zero XOR word");
  }
}

TEST_F(MalformedPartitionTest, TargetHashMismatchLeavesTheBaseBytes) {
  for (Encoding encoding : kBf16Encodings) {
    for (EntropyCoder entropy : kAllEntropy) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + EntropyName(entropy));
      const EncodedPartition encoded = Encode(encoding, entropy);
      RecordCoding coding = Coding(encoded);
      coding.target_hash.lo ^= 1;
      ExpectRefused(coding, base_, "does not hash to its target");
    }
  }
}

// Applied to bytes that are not its base, a record that depends on the base
// yields the wrong hash and must restore exactly the bytes it was given (for XOR and
// overwrite, by undoing). A literal record does not depend on the base at all.
TEST_F(MalformedPartitionTest, RecordAppliedToTheWrongBaseLeavesThoseBytes) {
  std::mt19937_64 rng(13);
  const Bytes other = ChangeElements(base_, kE, 5, false, rng);
  for (Encoding encoding : kBf16Encodings) {
    if (encoding == Encoding::kLiteral) continue;
    for (EntropyCoder entropy : kAllEntropy) {
      SCOPED_TRACE(std::string(EncodingName(encoding)) + " " + EntropyName(entropy));
      ExpectRefused(Coding(Encode(encoding, entropy)), other);
    }
  }
}

TEST_F(MalformedPartitionTest, UnknownEntropyCoderIsRefused) {
  for (EntropyCoder stored_with : kAllEntropy) {
    SCOPED_TRACE(EntropyName(stored_with));
    const EncodedPartition encoded = Encode(Encoding::kSparseXor, stored_with);
    RecordCoding coding = Coding(encoded);
    coding.entropy = static_cast<EntropyCoder>(7);
    ExpectRefused(coding, base_);
  }
}

TEST_F(MalformedPartitionTest, UnknownEncodingOrContextMisuseIsRefused) {
  for (uint8_t bad : {0, 6, 255}) {
    RecordCoding unknown{kDType, static_cast<Encoding>(bad), EntropyCoder::kNone,   1, 0,
                         {},     HashPartition(base_),       HashPartition(target_)};
    ExpectRefused(unknown, base_);
  }

  const EncodedPartition encoded = Encode(Encoding::kContextXor, EntropyCoder::kNone);
  RecordCoding context = Coding(encoded);
  context.raw_size = 1;
  ExpectRefused(context, base_, "raw size 0");
  context.raw_size = 0;
  context.dtype = DType::kU16;  // same width, but not a dtype the context coder models
  ExpectRefused(context, base_, "unsupported dtype");
}

}  // namespace
}  // namespace deltacast::codec
