#include "codec/context_coder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bench/realistic_step.h"
#include "quant/fp8_element.h"

namespace deltacast::codec {
namespace {

// Partition contents as a byte vector built from words of the dtype's width.
template <typename Word>
std::vector<std::byte> ToBytes(const std::vector<Word>& words) {
  std::vector<std::byte> out(words.size() * sizeof(Word));
  if (!words.empty()) std::memcpy(out.data(), words.data(), out.size());
  return out;
}

template <typename Word>
SparseChanges Diff(const std::vector<Word>& base, const std::vector<Word>& target) {
  SparseChanges c;
  c.element_size = sizeof(Word);
  for (size_t i = 0; i < base.size(); ++i) {
    const Word x = static_cast<Word>(base[i] ^ target[i]);
    if (x == 0) continue;
    c.positions.push_back(static_cast<uint32_t>(i));
    const size_t at = c.xors.size();
    c.xors.resize(at + sizeof(Word));
    std::memcpy(c.xors.data() + at, &x, sizeof(Word));
  }
  return c;
}

// Encodes, decodes and checks that applying the decoded XORs to the base gives
// the target bit for bit. Returns the payload size.
template <typename Word>
size_t ExpectRoundTrip(DType dtype, const std::vector<Word>& base,
                       const std::vector<Word>& target) {
  const SparseChanges changes = Diff(base, target);
  const auto base_bytes = ToBytes(base);
  auto payload = ContextEncode(dtype, base_bytes, changes);
  EXPECT_TRUE(payload.ok()) << payload.status().ToString();
  if (!payload.ok()) return 0;
  SparseChanges decoded;
  Status s = ContextDecode(dtype, *payload, base_bytes, changes.size(), decoded);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(decoded.element_size, sizeof(Word));
  EXPECT_EQ(decoded.positions, changes.positions);
  EXPECT_EQ(decoded.xors, changes.xors);
  std::vector<Word> rebuilt = base;
  for (size_t j = 0; j < decoded.size() && j < changes.size(); ++j) {
    Word x;
    std::memcpy(&x, decoded.xors.data() + j * sizeof(Word), sizeof(Word));
    rebuilt[decoded.positions[j]] ^= x;
  }
  EXPECT_TRUE(rebuilt == target);
  return payload->size();
}

// Bit patterns that a float codec must not disturb.
std::vector<uint16_t> SpecialBf16() {
  return {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x00FF, 0x3F7F, 0x3F80,
          0xBF80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FFF,
          0xFFFF, 0x7FBF, 0x3C00, 0x3C01, 0x3BFF, 0x7F7E, 0x0100, 0x4000};
}
std::vector<uint16_t> SpecialF16() {
  return {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3BFF, 0x3C00, 0xBC00, 0x7BFF,
          0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7FFF, 0xFFFF, 0x7BFE, 0x3555};
}
std::vector<uint32_t> SpecialF32() {
  return {0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000,
          0x3F7FFFFF, 0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
          0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF,
          0x7FA5A5A5, 0x7F7FFFFE, 0x3C23D70A, 0xBC23D70A};
}

// Every (base, target) pair of special patterns, one per element: sign flips,
// NaN payload changes, +1 unit in the last place carrying into the exponent,
// max-magnitude steps into infinity and NaN, denormal <-> normal.
template <typename Word>
void AllPairs(const std::vector<Word>& special, std::vector<Word>& base,
              std::vector<Word>& target) {
  for (Word a : special) {
    for (Word b : special) {
      base.push_back(a);
      target.push_back(b);
    }
  }
}

TEST(ContextCoderTest, SupportsOnlyFloatDtypesItModels) {
  EXPECT_TRUE(ContextModeSupports(DType::kBF16));
  EXPECT_TRUE(ContextModeSupports(DType::kF16));
  EXPECT_TRUE(ContextModeSupports(DType::kF32));
  EXPECT_FALSE(ContextModeSupports(DType::kU8));
  EXPECT_FALSE(ContextModeSupports(DType::kF64));
  EXPECT_TRUE(ContextModeSupports(DType::kF8E4M3));
  EXPECT_TRUE(ContextModeSupports(DType::kF8E5M2));
  EXPECT_FALSE(ContextModeSupports(DType::kF8E8M0));
  EXPECT_FALSE(ContextModeSupports(DType::kI16));
  EXPECT_FALSE(ContextModeSupports(static_cast<DType>(0)));
  EXPECT_FALSE(ContextModeSupports(static_cast<DType>(200)));
}

TEST(ContextCoderTest, SpecialBitPatternsRoundTripInEveryDtype) {
  {
    std::vector<uint16_t> base, target;
    AllPairs(SpecialBf16(), base, target);
    ExpectRoundTrip(DType::kBF16, base, target);
  }
  {
    std::vector<uint16_t> base, target;
    AllPairs(SpecialF16(), base, target);
    ExpectRoundTrip(DType::kF16, base, target);
  }
  {
    std::vector<uint32_t> base, target;
    AllPairs(SpecialF32(), base, target);
    ExpectRoundTrip(DType::kF32, base, target);
  }
}

// FP8 has 256 patterns: every one against every other (NaNs, +-0, subnormals, the
// largest finite values and, in E5M2, infinities) in one partition.
TEST(ContextCoderTest, EveryFp8PairRoundTrips) {
  std::vector<uint8_t> every(256);
  for (int i = 0; i < 256; ++i) every[i] = static_cast<uint8_t>(i);
  for (DType dtype : {DType::kF8E4M3, DType::kF8E5M2}) {
    std::vector<uint8_t> base, target;
    AllPairs(every, base, target);
    ExpectRoundTrip(dtype, base, target);
  }
}

// An AdamW-like step of block-scaled E4M3 weights (one scale per 128 elements, from
// each step's own amax, as the serving twin has): exact, and the element's exponent
// predicts which bytes change, so context mode beats the order-0 entropy of the
// changed positions and XOR bytes.
TEST(ContextCoderTest, RealisticFp8StepRoundTripsBelowOrder0Entropy) {
  const double lr = bench::CalibrateLr(0.03);
  const auto elements = bench::DrawElements(7, 1 << 20, false);
  std::vector<float> before, after;
  for (const auto& e : elements) {
    before.push_back(e.w);
    after.push_back(e.w - static_cast<float>(lr) * e.update);
  }
  auto quantize = [](const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size());
    for (size_t b = 0; b < v.size(); b += 128) {
      float amax = 0;
      for (size_t i = b; i < b + 128; ++i) amax = std::max(amax, std::abs(v[i]));
      const float multiplier = quant::kE4m3Max / std::max(amax, quant::kAmaxFloor);
      for (size_t i = b; i < b + 128; ++i) out[i] = quant::E4m3FromFloat(v[i] * multiplier);
    }
    return out;
  };
  const std::vector<uint8_t> base = quantize(before), target = quantize(after);
  const SparseChanges changes = Diff(base, target);
  ASSERT_GT(changes.size(), 100u);
  const size_t payload = ExpectRoundTrip(DType::kF8E4M3, base, target);
  // Order-0 entropy of the change flags plus that of the changed XOR bytes.
  const double n = static_cast<double>(base.size()), k = static_cast<double>(changes.size());
  const double p = k / n;
  double flag_bits = -n * (p * std::log2(p) + (1 - p) * std::log2(1 - p));
  std::array<double, 256> counts{};
  for (std::byte x : changes.xors) counts[static_cast<uint8_t>(x)] += 1;
  double xor_bits = 0;
  for (double c : counts) {
    if (c > 0) xor_bits -= c * std::log2(c / k);
  }
  const double order0_bytes = (flag_bits + xor_bits) / 8;
  RecordProperty("changed_fraction", std::to_string(p));
  RecordProperty("ratio_to_order0", std::to_string(payload / order0_bytes));
  EXPECT_LT(static_cast<double>(payload), 0.9 * order0_bytes)
      << payload << " payload bytes for " << changes.size() << " changes vs order-0 "
      << order0_bytes;
}

TEST(ContextCoderTest, OneUlpStepsAcrossExponentAndIntoInfinityAndNan) {
  // Magnitude +-1 at every binade edge, and max-magnitude words going up.
  std::vector<uint16_t> base, target;
  for (uint32_t m = 0; m < 0x8000; m += 0x7F) {
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const auto a = static_cast<uint16_t>(m | sign);
      if ((m & 0x7FFF) < 0x7FFF) {
        base.push_back(a);
        target.push_back(static_cast<uint16_t>(a + 1));
      }
      if ((m & 0x7FFF) > 0) {
        base.push_back(a);
        target.push_back(static_cast<uint16_t>(a - 1));
      }
    }
  }
  base.push_back(0x7F7F);  // max finite -> +inf
  target.push_back(0x7F80);
  base.push_back(0x7FFE);  // NaN -> largest NaN payload
  target.push_back(0x7FFF);
  base.push_back(0x0000);  // +0 -> largest magnitude in one step
  target.push_back(0x7FFF);
  base.push_back(0x7FFF);  // and back
  target.push_back(0x0000);
  ExpectRoundTrip(DType::kBF16, base, target);
  ExpectRoundTrip(DType::kF16, base, target);
}

TEST(ContextCoderTest, NoChangeEveryChangeAndEndsOnly) {
  std::mt19937 gen(7);
  std::vector<uint16_t> base(5000);
  for (auto& w : base) w = static_cast<uint16_t>(gen());
  // No change: a payload with nothing but its framing.
  EXPECT_LE(ExpectRoundTrip(DType::kBF16, base, base), 8u);
  // Every element changed.
  std::vector<uint16_t> target = base;
  for (auto& w : target) w = static_cast<uint16_t>(w ^ 1);
  ExpectRoundTrip(DType::kBF16, base, target);
  // First only, last only, first and last.
  target = base;
  target.front() ^= 0x8000;
  ExpectRoundTrip(DType::kBF16, base, target);
  target = base;
  target.back() ^= 0x0101;
  ExpectRoundTrip(DType::kBF16, base, target);
  target.front() ^= 0x0001;
  ExpectRoundTrip(DType::kBF16, base, target);
  // One-element and empty partitions.
  ExpectRoundTrip(DType::kF32, std::vector<uint32_t>{0x3F800000},
                  std::vector<uint32_t>{0xBF800000});
  ExpectRoundTrip(DType::kF32, std::vector<uint32_t>{}, std::vector<uint32_t>{});
}

TEST(ContextCoderTest, ChangesAroundTheFlagWarmupBoundary) {
  // The change flags switch to settled model updates at element 2^17.
  constexpr size_t kWarmup = size_t{1} << 17;
  std::mt19937 gen(5);
  std::vector<uint16_t> base(kWarmup + 1000);
  for (auto& w : base) w = static_cast<uint16_t>(0x3C00 + gen() % 0x400);
  for (const std::vector<size_t>& at : std::vector<std::vector<size_t>>{
           {kWarmup - 1, kWarmup, kWarmup + 1, base.size() - 1}, {kWarmup}, {kWarmup + 999}}) {
    std::vector<uint16_t> target = base;
    for (size_t i : at) target[i] = static_cast<uint16_t>(target[i] + 1);
    ExpectRoundTrip(DType::kBF16, base, target);
  }
}

TEST(ContextCoderTest, RandomGarbageRoundTrips) {
  std::mt19937_64 gen(11);
  for (int trial = 0; trial < 6; ++trial) {
    const size_t n = 1 + gen() % 20000;
    std::vector<uint16_t> b16(n), t16(n);
    std::vector<uint32_t> b32(n), t32(n);
    const uint64_t keep = gen() % 4;  // 0: all random; else mostly unchanged
    for (size_t i = 0; i < n; ++i) {
      b16[i] = static_cast<uint16_t>(gen());
      t16[i] = (keep && gen() % 4) ? b16[i] : static_cast<uint16_t>(gen());
      b32[i] = static_cast<uint32_t>(gen());
      t32[i] = (keep && gen() % 4) ? b32[i] : static_cast<uint32_t>(gen());
    }
    ExpectRoundTrip(DType::kBF16, b16, t16);
    ExpectRoundTrip(DType::kF16, b16, t16);
    ExpectRoundTrip(DType::kF32, b32, t32);
  }
}

// The simulated training step of bench/realistic_step.h at a 3 % change rate.
struct RealisticStep {
  std::vector<std::vector<uint16_t>> base, target;
  bench::Order0Entropy entropy;
};

const RealisticStep& Realistic3Percent() {
  static const RealisticStep* step = [] {
    auto* s = new RealisticStep;
    const double lr = bench::CalibrateLr(0.03);
    for (int p = 0; p < 4; ++p) {
      const bool norm = p == 3;  // a norm-like tensor after three matrices
      const auto elements = bench::DrawElements(100 + p, norm ? 8192 : (2u << 20), norm);
      s->base.emplace_back();
      s->target.emplace_back();
      bench::StepBf16(elements, lr, s->base.back(), s->target.back());
      s->entropy.AddBf16(s->base.back(), s->target.back());
    }
    return s;
  }();
  return *step;
}

TEST(ContextCoderTest, RealisticBf16StepBeatsOrder0EntropyByTwentyPercent) {
  const RealisticStep& step = Realistic3Percent();
  size_t payload = 0;
  for (size_t p = 0; p < step.base.size(); ++p) {
    payload += ExpectRoundTrip(DType::kBF16, step.base[p], step.target[p]);
  }
  const double rate = static_cast<double>(step.entropy.changes()) / (3 * (2u << 20) + 8192);
  EXPECT_NEAR(rate, 0.03, 0.005);
  const double ratio = payload / step.entropy.Bytes();
  RecordProperty("ratio_to_order0", std::to_string(ratio));
  EXPECT_LE(ratio, 0.80) << payload << " payload bytes vs order-0 entropy " << step.entropy.Bytes()
                         << " bytes";
}

TEST(ContextCoderTest, RealisticF16AndF32StepsRoundTrip) {
  const double lr = bench::CalibrateLr(0.03);
  const auto elements = bench::DrawElements(5, 300000, false);
  std::vector<uint16_t> b16, t16;
  std::vector<uint32_t> b32, t32;
  for (const auto& e : elements) {
    const float after = e.w - static_cast<float>(lr) * e.update;
    b32.push_back(std::bit_cast<uint32_t>(e.w));
    t32.push_back(std::bit_cast<uint32_t>(after));
    b16.push_back(std::bit_cast<uint16_t>(static_cast<_Float16>(e.w)));
    t16.push_back(std::bit_cast<uint16_t>(static_cast<_Float16>(after)));
  }
  ExpectRoundTrip(DType::kF16, b16, t16);
  ExpectRoundTrip(DType::kF32, b32, t32);
}

TEST(ContextCoderTest, IsDeterministic) {
  const RealisticStep& step = Realistic3Percent();
  const auto base = ToBytes(step.base[3]);
  const auto changes = Diff(step.base[3], step.target[3]);
  auto a = ContextEncode(DType::kBF16, base, changes);
  auto b = ContextEncode(DType::kBF16, base, changes);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

// A realistic payload and what it was made from, for the malformed-input tests.
struct Encoded {
  std::vector<std::byte> base;
  SparseChanges changes;
  std::vector<std::byte> payload;
};

Encoded SmallRealistic() {
  const RealisticStep& step = Realistic3Percent();
  Encoded e;
  const std::vector<uint16_t> base(step.base[0].begin(), step.base[0].begin() + 20000);
  const std::vector<uint16_t> target(step.target[0].begin(), step.target[0].begin() + 20000);
  e.base = ToBytes(base);
  e.changes = Diff(base, target);
  auto payload = ContextEncode(DType::kBF16, e.base, e.changes);
  EXPECT_TRUE(payload.ok());
  e.payload = std::move(*payload);
  return e;
}

// What any decode of untrusted input must leave: an error and nothing, or
// exactly `count` well-formed changes.
void ExpectCorruptOrWellFormed(const Status& s, const SparseChanges& out, uint64_t count,
                               size_t elements) {
  if (!s.ok()) {
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
    EXPECT_EQ(out.size(), 0u);
    EXPECT_TRUE(out.xors.empty());
    return;
  }
  ASSERT_EQ(out.size(), count);
  ASSERT_EQ(out.xors.size(), count * out.element_size);
  for (size_t j = 0; j < out.size(); ++j) {
    EXPECT_LT(out.positions[j], elements);
    if (j > 0) {
      EXPECT_GT(out.positions[j], out.positions[j - 1]);
    }
    bool nonzero = false;
    for (uint32_t b = 0; b < out.element_size; ++b) {
      nonzero |= out.xors[j * out.element_size + b] != std::byte{0};
    }
    EXPECT_TRUE(nonzero) << "change " << j << " has a zero XOR word";
  }
}

TEST(ContextCoderTest, TruncatedPayloadIsCorrupt) {
  const Encoded e = SmallRealistic();
  SparseChanges out;
  for (size_t len = 0; len < e.payload.size(); ++len) {
    Status s =
        ContextDecode(DType::kBF16, ByteSpan(e.payload).first(len), e.base, e.changes.size(), out);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << "prefix of " << len << " bytes";
    EXPECT_EQ(out.size(), 0u);
  }
}

TEST(ContextCoderTest, TrailingBytesAreCorrupt) {
  const Encoded e = SmallRealistic();
  for (std::byte extra : {std::byte{0}, std::byte{0x5A}}) {
    auto longer = e.payload;
    longer.push_back(extra);
    SparseChanges out;
    Status s = ContextDecode(DType::kBF16, longer, e.base, e.changes.size(), out);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt);
    EXPECT_NE(s.message().find("trailing"), std::string::npos) << s.ToString();
  }
}

TEST(ContextCoderTest, WrongChangeCountIsCorrupt) {
  const Encoded e = SmallRealistic();
  const uint64_t n = e.changes.size();
  for (uint64_t count : {uint64_t{0}, n - 1, n + 1, uint64_t{10000}, uint64_t{20000},
                         uint64_t{20001}, uint64_t{1} << 62, ~uint64_t{0}}) {
    SparseChanges out;
    Status s = ContextDecode(DType::kBF16, e.payload, e.base, count, out);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << "count " << count;
    EXPECT_EQ(out.size(), 0u);
  }
}

TEST(ContextCoderTest, FlippedBytesNeverCrash) {
  const Encoded e = SmallRealistic();
  size_t rejected = 0;
  for (size_t i = 0; i < e.payload.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      auto bad = e.payload;
      bad[i] ^= std::byte{mask};
      SparseChanges out;
      Status s = ContextDecode(DType::kBF16, bad, e.base, e.changes.size(), out);
      ExpectCorruptOrWellFormed(s, out, e.changes.size(), 20000);
      rejected += !s.ok();
    }
  }
  // Range-coder streams have little redundancy, but the framing, the change
  // count and the end-of-stream check catch most damage.
  EXPECT_GT(rejected, e.payload.size() * 3 * 9 / 10);
}

TEST(ContextCoderTest, RandomPayloadsNeverCrash) {
  std::mt19937_64 gen(3);
  std::vector<uint32_t> base32(3000);
  for (auto& w : base32) w = static_cast<uint32_t>(gen());
  const auto base = ToBytes(base32);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::byte> payload(gen() % 300);
    for (auto& b : payload) b = std::byte(static_cast<uint8_t>(gen()));
    if (payload.size() >= 2 && trial % 2 == 0) {
      payload[0] = std::byte{kContextFormatVersion};
      payload[1] = std::byte{static_cast<uint8_t>(trial % 4 == 0 ? DType::kF32 : DType::kBF16)};
    }
    const DType dtype = trial % 4 == 0 ? DType::kF32 : DType::kBF16;
    const uint64_t count = gen() % 2000;
    SparseChanges out;
    Status s = ContextDecode(dtype, payload, base, count, out);
    ExpectCorruptOrWellFormed(s, out, count, base.size() / ElementSize(dtype));
  }
}

TEST(ContextCoderTest, WrongVersionOrDtypeIsCorrupt) {
  const Encoded e = SmallRealistic();
  SparseChanges out;
  auto bad = e.payload;
  bad[0] = std::byte{kContextFormatVersion + 1};
  EXPECT_EQ(ContextDecode(DType::kBF16, bad, e.base, e.changes.size(), out).code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(ContextDecode(DType::kF16, e.payload, e.base, e.changes.size(), out).code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(ContextDecode(DType::kBF16, {}, e.base, 0, out).code(), StatusCode::kCorrupt);
}

TEST(ContextCoderTest, RejectsMalformedArguments) {
  const Encoded e = SmallRealistic();
  SparseChanges out;
  // Unsupported dtype, base not a whole number of elements.
  EXPECT_EQ(ContextEncode(DType::kU16, e.base, e.changes).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ContextDecode(DType::kI16, e.payload, e.base, e.changes.size(), out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ContextDecode(static_cast<DType>(0), e.payload, e.base, e.changes.size(), out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ContextEncode(static_cast<DType>(99), e.base, e.changes).status().code(),
            StatusCode::kInvalidArgument);
  const ByteSpan odd = ByteSpan(e.base).first(e.base.size() - 1);
  EXPECT_EQ(ContextEncode(DType::kBF16, odd, e.changes).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ContextDecode(DType::kBF16, e.payload, odd, e.changes.size(), out).code(),
            StatusCode::kInvalidArgument);
  // Element size that does not match the dtype.
  EXPECT_EQ(ContextEncode(DType::kF32, e.base, e.changes).status().code(),
            StatusCode::kInvalidArgument);

  auto bad = e.changes;
  bad.positions.back() = 20000;  // beyond the partition
  EXPECT_EQ(ContextEncode(DType::kBF16, e.base, bad).status().code(), StatusCode::kInvalidArgument);
  bad = e.changes;
  std::swap(bad.positions[0], bad.positions[1]);  // not increasing
  EXPECT_EQ(ContextEncode(DType::kBF16, e.base, bad).status().code(), StatusCode::kInvalidArgument);
  bad = e.changes;
  bad.positions[1] = bad.positions[0];  // repeated
  EXPECT_EQ(ContextEncode(DType::kBF16, e.base, bad).status().code(), StatusCode::kInvalidArgument);
  bad = e.changes;
  bad.xors[2] = bad.xors[3] = std::byte{0};  // zero XOR word
  EXPECT_EQ(ContextEncode(DType::kBF16, e.base, bad).status().code(), StatusCode::kInvalidArgument);
  bad = e.changes;
  bad.xors.pop_back();
  EXPECT_EQ(ContextEncode(DType::kBF16, e.base, bad).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltacast::codec
