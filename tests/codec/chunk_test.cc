#include "codec/chunk.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "apply/delta_applier.h"
#include "apply/host_store.h"
#include "codec/change_detect.h"
#include "codec/manifest.h"
#include "codec/partition.h"
#include "codec/partition_codec.h"
#include "common/hash.h"

namespace deltacast::codec {
namespace {

using Bytes = std::vector<std::byte>;
using ::testing::HasSubstr;

// Header offsets (docs/wire-format.md, "Chunk header").
constexpr size_t kOffVersion = 4;
constexpr size_t kOffKind = 6;
constexpr size_t kOffFlags = 7;
constexpr size_t kOffBase = 8;
constexpr size_t kOffPartitionBytes = 40;
constexpr size_t kOffSequence = 48;
constexpr size_t kOffRecordCount = 52;
constexpr size_t kOffPayloadLength = 56;
constexpr size_t kOffPayloadHash = 64;
constexpr size_t kOffHeaderHash = 72;

// Makes the checksums match the (mutated) contents again, so a check behind them
// is what sees the mutation: payload hash = Hash64(payload), header hash = Hash64
// of the first 72 bytes.
void Reseal(Bytes& chunk) {
  StoreLE<uint64_t>(chunk.data() + kOffPayloadHash,
                    Hash64(ByteSpan(chunk).subspan(kChunkHeaderBytes)));
  StoreLE<uint64_t>(chunk.data() + kOffHeaderHash, Hash64(ByteSpan(chunk.data(), kOffHeaderHash)));
}

// Sets the header's payload length to what the chunk now holds, then reseals.
void ResealWithLength(Bytes& chunk) {
  StoreLE<uint64_t>(chunk.data() + kOffPayloadLength, chunk.size() - kChunkHeaderBytes);
  Reseal(chunk);
}

template <typename T>
void Put(Bytes& chunk, size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), chunk.size());
  StoreLE<T>(chunk.data() + offset, value);
}

// Fields of a record, in wire order after the name.
enum class Field {
  kNameLength,
  kDType,
  kEncoding,
  kEntropy,
  kReserved,
  kElementOffset,
  kElementCount,
  kChangeCount,
  kBaseHash,
  kTargetHash,
  kRawSize,
  kPayloadSize,
  kPayload,
};

// Byte offset of `field` of record `index` within a well-formed data chunk.
size_t FieldOffset(const Bytes& chunk, size_t index, Field field) {
  size_t at = kChunkHeaderBytes;
  for (size_t i = 0;; ++i) {
    const size_t name = LoadLE<uint16_t>(chunk.data() + at);
    const size_t fixed = at + 2 + name;  // dtype
    if (i == index) {
      switch (field) {
        case Field::kNameLength:
          return at;
        case Field::kDType:
          return fixed;
        case Field::kEncoding:
          return fixed + 1;
        case Field::kEntropy:
          return fixed + 2;
        case Field::kReserved:
          return fixed + 3;
        case Field::kElementOffset:
        case Field::kElementCount:
        case Field::kChangeCount:
        case Field::kBaseHash:  // 16 bytes; the hashes' low halves are what tests set
          return fixed + 4 +
                 8 * (static_cast<size_t>(field) - static_cast<size_t>(Field::kElementOffset));
        case Field::kTargetHash:
          return fixed + 4 + 3 * 8 + 16;
        case Field::kRawSize:
          return fixed + 4 + 3 * 8 + 32;
        case Field::kPayloadSize:
          return fixed + 4 + 4 * 8 + 32;
        case Field::kPayload:
          return fixed + 4 + 5 * 8 + 32;
      }
    }
    const uint64_t payload = LoadLE<uint64_t>(chunk.data() + fixed + 4 + 4 * 8 + 32);
    at = fixed + 4 + 5 * 8 + 32 + payload;
  }
}

Bytes RandomBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = std::byte(static_cast<uint8_t>(rng()));
  return out;
}

std::unique_ptr<apply::HostStore> MakeStore(const std::vector<TensorSpec>& tensors,
                                            const std::vector<Bytes>& data) {
  auto store = apply::HostStore::Create(tensors);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto span = (*store)->MutableTensorData(i);
    EXPECT_TRUE(span.ok());
    std::memcpy(span->data(), data[i].data(), data[i].size());
  }
  return std::move(*store);
}

// One data chunk holding a record of every encoding and entropy coder, for a
// small three-tensor model, plus everything needed to apply it.
class ChunkTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kPartitionBytes = 256;
  static constexpr uint32_t kSequence = 3;

  struct Planned {
    size_t tensor;
    uint64_t element_offset;
    Encoding encoding;
    EntropyCoder entropy;
  };

  void SetUp() override {
    std::mt19937_64 rng(2024);
    tensors_ = {{"a.weight", DType::kBF16, {300}},  // partitions at 0, 128, 256
                {"b.bias", DType::kF32, {40}},
                {"c.ids", DType::kI8, {50}}};
    for (const auto& t : tensors_) base_.push_back(RandomBytes(t.ByteSize(), rng));
    target_ = base_;
    // a.weight: sparse small changes, +-1 steps, then a rewritten tail.
    for (size_t i : {3, 40, 41, 100}) target_[0][2 * i] ^= std::byte{1};
    for (size_t i = 128; i < 256; i += 9) target_[0][2 * i] ^= std::byte{1};
    for (size_t i = 256; i < 300; ++i) target_[0][2 * i + 1] ^= std::byte{0x40};
    for (auto& b : target_[1]) b ^= std::byte{0x03};
    for (size_t i : {0, 7, 49}) target_[2][i] ^= std::byte{0xFF};

    auto data = [](const std::vector<Bytes>& v) {
      return [&v](size_t i) { return ByteSpan(v[i]); };
    };
    base_manifest_ = ComputeManifest(tensors_, data(base_), kPartitionBytes, 1);
    target_manifest_ = ComputeManifest(tensors_, data(target_), kPartitionBytes, 1);
    identity_ = {base_manifest_.VersionId(), target_manifest_.VersionId(), kPartitionBytes};

    const std::vector<Planned> plan = {
        {0, 0, Encoding::kSparseXor, EntropyCoder::kZstd},
        {0, 128, Encoding::kContextXor, EntropyCoder::kNone},
        {0, 256, Encoding::kLiteral, EntropyCoder::kNone},
        {1, 0, Encoding::kDenseXor, EntropyCoder::kLz4},
        {2, 0, Encoding::kOverwrite, EntropyCoder::kNone},
    };
    ChunkBuilder builder(identity_, kSequence);
    EXPECT_EQ(builder.record_count(), 0u);
    EXPECT_EQ(builder.size_bytes(), kChunkHeaderBytes);
    CodecScratch scratch;
    for (const Planned& p : plan) {
      const TensorSpec& info = tensors_[p.tensor];
      const uint64_t e = ElementSize(info.dtype);
      const uint64_t per = PartitionElements(info.dtype, kPartitionBytes);
      const uint64_t count = std::min(per, info.ElementCount() - p.element_offset);
      const ByteSpan a = ByteSpan(base_[p.tensor]).subspan(p.element_offset * e, count * e);
      const ByteSpan b = ByteSpan(target_[p.tensor]).subspan(p.element_offset * e, count * e);
      SparseChanges changes;
      FindChanges(a, b, static_cast<uint32_t>(e), changes);
      EncodeOptions options;
      options.entropy = p.entropy;
      auto encoded = EncodePartitionAs(p.encoding, info.dtype, a, b, changes, options, scratch);
      ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
      builder.Add(info.name, info.dtype, p.element_offset, count, HashPartition(a),
                  HashPartition(b), *encoded);
      expected_.push_back({info.name, info.dtype, p.element_offset, count, HashPartition(a),
                           HashPartition(b), *encoded});
    }
    EXPECT_EQ(builder.record_count(), plan.size());
    const size_t announced = builder.size_bytes();
    chunk_ = builder.Finish();
    EXPECT_EQ(chunk_.size(), announced);
    EXPECT_EQ(builder.record_count(), 0u);
    EXPECT_EQ(builder.size_bytes(), kChunkHeaderBytes);
  }

  static void ExpectCorrupt(const Bytes& chunk, const std::string& substring) {
    auto view = ParseChunk(chunk);
    ASSERT_FALSE(view.ok()) << "accepted; expected \"" << substring << "\"";
    EXPECT_EQ(view.status().code(), StatusCode::kCorrupt) << view.status().ToString();
    EXPECT_THAT(view.status().message(), HasSubstr(substring));
  }

  // Sets a record field (of T's width), reseals, and expects kCorrupt with `substring`.
  template <typename T>
  void ExpectFieldRefused(size_t record, Field field, T value, const std::string& substring) {
    SCOPED_TRACE("record " + std::to_string(record) + " field " +
                 std::to_string(static_cast<int>(field)) + " = " + std::to_string(value));
    Bytes chunk = chunk_;
    Put<T>(chunk, FieldOffset(chunk, record, field), value);
    Reseal(chunk);
    ExpectCorrupt(chunk, substring);
  }

  // Every partition of `store` holds exactly its base or its target bytes.
  void ExpectEveryPartitionAtBaseOrTarget(const apply::WeightStore& store) const {
    for (const PartitionRef& p : PartitionTensors(tensors_, kPartitionBytes)) {
      const uint64_t e = ElementSize(tensors_[p.tensor].dtype);
      const ByteSpan now =
          store.TensorData(p.tensor).subspan(p.element_offset * e, p.element_count * e);
      const ByteSpan a =
          ByteSpan(base_[p.tensor]).subspan(p.element_offset * e, p.element_count * e);
      const ByteSpan b =
          ByteSpan(target_[p.tensor]).subspan(p.element_offset * e, p.element_count * e);
      const bool at_base = std::equal(now.begin(), now.end(), a.begin());
      const bool at_target = std::equal(now.begin(), now.end(), b.begin());
      ASSERT_TRUE(at_base || at_target)
          << tensors_[p.tensor].name << " at " << p.element_offset << " is torn";
    }
  }

  struct ExpectedRecord {
    std::string name;
    DType dtype;
    uint64_t element_offset, element_count;
    PartitionHash base_hash, target_hash;
    EncodedPartition encoded;
  };

  std::vector<TensorSpec> tensors_;
  std::vector<Bytes> base_, target_;
  Manifest base_manifest_, target_manifest_;
  DeltaIdentity identity_;
  std::vector<ExpectedRecord> expected_;
  Bytes chunk_;
};

TEST_F(ChunkTest, RoundTripKeepsEveryFieldAndAppliesBitExactly) {
  auto view = ParseChunk(chunk_);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->kind, ChunkKind::kData);
  EXPECT_EQ(view->identity, identity_);
  EXPECT_EQ(view->sequence, kSequence);
  EXPECT_EQ(view->size_bytes, chunk_.size());
  ASSERT_EQ(view->records.size(), expected_.size());
  for (size_t i = 0; i < expected_.size(); ++i) {
    const PartitionRecord& got = view->records[i];
    const ExpectedRecord& want = expected_[i];
    SCOPED_TRACE("record " + std::to_string(i));
    EXPECT_EQ(got.tensor_name, want.name);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.encoding, want.encoded.encoding);
    EXPECT_EQ(got.entropy, want.encoded.entropy);
    EXPECT_EQ(got.element_offset, want.element_offset);
    EXPECT_EQ(got.element_count, want.element_count);
    EXPECT_EQ(got.change_count, want.encoded.change_count);
    EXPECT_EQ(got.base_hash, want.base_hash);
    EXPECT_EQ(got.target_hash, want.target_hash);
    EXPECT_EQ(got.raw_size, want.encoded.raw_size);
    ASSERT_EQ(got.payload.size(), want.encoded.payload.size());
    EXPECT_TRUE(std::equal(got.payload.begin(), got.payload.end(), want.encoded.payload.begin()));
  }
  // The plan covers every encoding.
  std::set<Encoding> encodings;
  for (const auto& r : view->records) encodings.insert(r.encoding);
  EXPECT_EQ(encodings.size(), 5u);

  auto store = MakeStore(tensors_, base_);
  apply::DeltaApplier applier(*store, base_manifest_, identity_, {1});
  ASSERT_TRUE(applier.ApplyChunk(*view).ok());
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const ByteSpan got = store->TensorData(t);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), target_[t].begin())) << tensors_[t].name;
    EXPECT_EQ(Hash64(got), Hash64(target_[t]));
  }
}

// A builder given a finished chunk's storage (garbage in it, more room than it has)
// builds in that memory, and the chunk's bytes are those of a fresh builder; once a
// record is in, storage offered is refused and the chunk is unchanged.
TEST_F(ChunkTest, RecycledStorageBuildsTheSameChunkInPlace) {
  for (size_t headroom : {size_t{0}, size_t{24}}) {
    auto build = [&](ChunkBuilder& builder) {
      for (const ExpectedRecord& r : expected_) {
        builder.Add(r.name, r.dtype, r.element_offset, r.element_count, r.base_hash, r.target_hash,
                    r.encoded);
      }
      return builder.Finish();
    };
    ChunkBuilder fresh(identity_, kSequence, headroom);
    const Bytes want = build(fresh);
    Bytes storage(want.size() + 4096, std::byte{0xAB});
    const std::byte* memory = storage.data();
    ChunkBuilder recycled(identity_, kSequence, headroom);
    recycled.Recycle(std::move(storage));
    const Bytes got = build(recycled);
    EXPECT_EQ(got, want) << "headroom " << headroom;
    EXPECT_EQ(got.data(), memory) << "built in the storage given";

    ChunkBuilder late(identity_, kSequence, headroom);
    late.Add(expected_[0].name, expected_[0].dtype, expected_[0].element_offset,
             expected_[0].element_count, expected_[0].base_hash, expected_[0].target_hash,
             expected_[0].encoded);
    Bytes refused(want.size() + 4096, std::byte{0xAB});
    late.Recycle(std::move(refused));
    for (size_t i = 1; i < expected_.size(); ++i) {
      const ExpectedRecord& r = expected_[i];
      late.Add(r.name, r.dtype, r.element_offset, r.element_count, r.base_hash, r.target_hash,
               r.encoded);
    }
    EXPECT_EQ(late.Finish(), want) << "headroom " << headroom;
  }
}

TEST_F(ChunkTest, HeaderLengthReaderValidatesTheHeaderAlone) {
  auto length = ParseChunkHeaderPayloadLength(ByteSpan(chunk_).first(kChunkHeaderBytes));
  ASSERT_TRUE(length.ok()) << length.status().ToString();
  EXPECT_EQ(*length, chunk_.size() - kChunkHeaderBytes);
  auto short_header = ParseChunkHeaderPayloadLength(ByteSpan(chunk_).first(kChunkHeaderBytes - 1));
  ASSERT_FALSE(short_header.ok());
  EXPECT_EQ(short_header.status().code(), StatusCode::kCorrupt);
  EXPECT_THAT(short_header.status().message(), HasSubstr("chunk header truncated"));
}

TEST_F(ChunkTest, BadMagic) {
  Bytes chunk = chunk_;
  chunk[0] ^= std::byte{0x01};
  ExpectCorrupt(chunk, "bad chunk magic");
  Reseal(chunk);
  ExpectCorrupt(chunk, "bad chunk magic");
}

TEST_F(ChunkTest, HeaderChecksumMismatch) {
  for (size_t offset : {kOffVersion, kOffBase, kOffSequence, kOffRecordCount, kOffHeaderHash}) {
    Bytes chunk = chunk_;
    chunk[offset] ^= std::byte{0x10};
    ExpectCorrupt(chunk, "chunk header checksum mismatch");
  }
}

TEST_F(ChunkTest, UnsupportedVersion) {
  // 1 is the format with xxh3-64 partition hashes: never misread as this one.
  for (uint16_t version : {0, 1, 3, 0xFFFF}) {
    Bytes chunk = chunk_;
    Put<uint16_t>(chunk, kOffVersion, version);
    Reseal(chunk);
    ExpectCorrupt(chunk, "unsupported wire format version " + std::to_string(version));
  }
}

TEST_F(ChunkTest, UnknownKind) {
  for (uint8_t kind : {0, 3, 0xFF}) {
    Bytes chunk = chunk_;
    chunk[kOffKind] = std::byte{kind};
    Reseal(chunk);
    ExpectCorrupt(chunk, "unknown chunk kind " + std::to_string(kind));
  }
}

TEST_F(ChunkTest, NonzeroFlags) {
  for (uint8_t flags : {1, 0x80}) {
    Bytes chunk = chunk_;
    chunk[kOffFlags] = std::byte{flags};
    Reseal(chunk);
    ExpectCorrupt(chunk, "reserved chunk flags are not zero");
  }
}

TEST_F(ChunkTest, PartitionSizeZeroOrTooBig) {
  for (uint64_t size : {uint64_t{0}, kMaxPartitionBytes + 1, UINT64_MAX}) {
    Bytes chunk = chunk_;
    Put<uint64_t>(chunk, kOffPartitionBytes, size);
    Reseal(chunk);
    ExpectCorrupt(chunk, "partition size " + std::to_string(size) + " is outside 1..");
  }
}

TEST_F(ChunkTest, PayloadLengthAboveTheCapIsRefusedFromTheHeaderAlone) {
  for (uint64_t length : {kMaxChunkPayloadBytes + 1, UINT64_MAX}) {
    Bytes chunk = chunk_;
    Put<uint64_t>(chunk, kOffPayloadLength, length);
    Reseal(chunk);
    ExpectCorrupt(chunk, "exceeds the cap");
    auto from_header = ParseChunkHeaderPayloadLength(ByteSpan(chunk).first(kChunkHeaderBytes));
    ASSERT_FALSE(from_header.ok());
    EXPECT_THAT(from_header.status().message(), HasSubstr("exceeds the cap"));
  }
}

TEST_F(ChunkTest, SizeMismatch) {
  Bytes shorter = chunk_;
  shorter.resize(shorter.size() - 1);
  ExpectCorrupt(shorter, "header declares");
  Bytes longer = chunk_;
  longer.push_back(std::byte{0});
  ExpectCorrupt(longer, "header declares");
}

TEST_F(ChunkTest, PayloadChecksumMismatch) {
  for (size_t offset : {kChunkHeaderBytes, chunk_.size() / 2, chunk_.size() - 1}) {
    Bytes chunk = chunk_;
    chunk[offset] ^= std::byte{0x04};
    ExpectCorrupt(chunk, "chunk payload checksum mismatch");
  }
}

// A relay's apply parses the buffer it verified on arrival without hashing the
// payload again; everything else is still checked.
TEST_F(ChunkTest, VerifiedChunkSkipsOnlyThePayloadHash) {
  auto whole = ParseChunk(chunk_);
  auto verified = ParseVerifiedChunk(chunk_);
  ASSERT_TRUE(whole.ok() && verified.ok()) << verified.status().ToString();
  ASSERT_EQ(verified->records.size(), whole->records.size());
  for (size_t i = 0; i < whole->records.size(); ++i) {
    EXPECT_EQ(verified->records[i].tensor_name, whole->records[i].tensor_name);
    EXPECT_EQ(verified->records[i].payload.data(), whole->records[i].payload.data());
  }
  // A flipped payload byte (the hash unchanged) passes only the verified parse: the
  // caller vouches for the payload.
  Bytes flipped = chunk_;
  flipped[chunk_.size() - 1] ^= std::byte{0x04};
  EXPECT_FALSE(ParseChunk(flipped).ok());
  EXPECT_TRUE(ParseVerifiedChunk(flipped).ok());
  // The header's checksum and the records' structure are still checked.
  Bytes header = chunk_;
  header[kOffSequence] ^= std::byte{0x10};
  auto bad_header = ParseVerifiedChunk(header);
  ASSERT_FALSE(bad_header.ok());
  EXPECT_THAT(bad_header.status().message(), HasSubstr("chunk header checksum mismatch"));
  Bytes trailing = chunk_;
  trailing.insert(trailing.end(), 3, std::byte{0});
  ResealWithLength(trailing);
  auto bad_records = ParseVerifiedChunk(trailing);
  ASSERT_FALSE(bad_records.ok());
  EXPECT_THAT(bad_records.status().message(), HasSubstr("trailing bytes after the last record"));
}

TEST_F(ChunkTest, ZeroRecords) {
  Bytes chunk = chunk_;
  Put<uint32_t>(chunk, kOffRecordCount, 0);
  Reseal(chunk);
  ExpectCorrupt(chunk, "data chunk carries no records");
}

TEST_F(ChunkTest, RecordCountTooLarge) {
  Bytes chunk = chunk_;
  Put<uint32_t>(chunk, kOffRecordCount, UINT32_MAX);
  Reseal(chunk);
  ExpectCorrupt(chunk, "cannot fit a payload");
  // One more record than the payload holds: the reader runs out at the next name.
  Put<uint32_t>(chunk, kOffRecordCount, static_cast<uint32_t>(expected_.size() + 1));
  Reseal(chunk);
  ExpectCorrupt(chunk, "record 5: truncated tensor name");
}

TEST_F(ChunkTest, TruncatedName) {
  ExpectFieldRefused<uint16_t>(0, Field::kNameLength, 0xFFFF, "record 0: truncated tensor name");
  const size_t last = FieldOffset(chunk_, 4, Field::kNameLength);
  const auto rest = static_cast<uint16_t>(chunk_.size() - last - 2);
  ExpectFieldRefused<uint16_t>(4, Field::kNameLength, rest + 1, "record 4: truncated tensor name");
}

TEST_F(ChunkTest, TruncatedRecordHeader) {
  // One record whose fixed fields are cut short (the payload still holds the
  // minimum a record takes, so the record count passes its bound).
  Bytes chunk(chunk_.begin(), chunk_.begin() + kChunkHeaderBytes + kRecordFixedBytes + 3);
  ASSERT_LT(chunk.size(), FieldOffset(chunk_, 0, Field::kPayloadSize) + 8);
  Put<uint32_t>(chunk, kOffRecordCount, 1);
  ResealWithLength(chunk);
  ExpectCorrupt(chunk, "record 0: truncated record header");
}

TEST_F(ChunkTest, NameLengthZeroOrTooLong) {
  ExpectFieldRefused<uint16_t>(1, Field::kNameLength, 0,
                               "chunk 3: record 1: tensor name length 0 is outside 1..1024");
  // The builder writes what it is given; the parser refuses a name over the limit.
  ChunkBuilder builder(identity_, 0);
  builder.Add(std::string(kMaxTensorNameBytes + 1, 'x'), DType::kBF16, 0, 128,
              expected_[0].base_hash, expected_[0].target_hash, expected_[0].encoded);
  ExpectCorrupt(builder.Finish(), "tensor name length 1025 is outside 1..1024");
  ChunkBuilder at_limit(identity_, 0);
  at_limit.Add(std::string(kMaxTensorNameBytes, 'x'), DType::kBF16, 0, 128, expected_[0].base_hash,
               expected_[0].target_hash, expected_[0].encoded);
  EXPECT_TRUE(ParseChunk(at_limit.Finish()).ok());
}

TEST_F(ChunkTest, UnknownDtypeEncodingOrEntropy) {
  ExpectFieldRefused<uint8_t>(0, Field::kDType, 0, "unknown dtype 0");
  // 16..19 are the newer safetensors dtypes (F8_E8M0 .. C64): 20 is the first unknown.
  ExpectFieldRefused<uint8_t>(2, Field::kDType, 20, "record 2: unknown dtype 20");
  ExpectFieldRefused<uint8_t>(0, Field::kEncoding, 0, "unknown encoding 0");
  ExpectFieldRefused<uint8_t>(3, Field::kEncoding, kMaxEncoding + 1,
                              "unknown encoding " + std::to_string(kMaxEncoding + 1));
  ExpectFieldRefused<uint8_t>(4, Field::kEntropy, 3, "record 4: unknown entropy coder 3");
  ExpectFieldRefused<uint8_t>(0, Field::kEntropy, 0xFF, "unknown entropy coder 255");
}

TEST_F(ChunkTest, ReservedByteNonzero) {
  ExpectFieldRefused<uint8_t>(1, Field::kReserved, 1, "record 1: reserved byte is 1, must be 0");
}

TEST_F(ChunkTest, ElementCountDoesNotFitThePartition) {
  // a.weight is BF16: 128 elements fill a 256-byte partition.
  ExpectFieldRefused<uint64_t>(0, Field::kElementCount, 0, "element count 0 does not fit");
  ExpectFieldRefused<uint64_t>(0, Field::kElementCount, 129, "element count 129 does not fit");
  ExpectFieldRefused<uint64_t>(0, Field::kElementCount, UINT64_MAX, "does not fit a partition");
  // Multiplying by the element size must not wrap around into range.
  ExpectFieldRefused<uint64_t>(3, Field::kElementCount, (uint64_t{1} << 62) + 1,
                               "does not fit a partition of 256 bytes");
}

TEST_F(ChunkTest, ChangeCountZeroOrAboveElements) {
  ExpectFieldRefused<uint64_t>(0, Field::kChangeCount, 0, "change count 0 is outside 1..128");
  ExpectFieldRefused<uint64_t>(0, Field::kChangeCount, 129, "change count 129 is outside 1..128");
  ExpectFieldRefused<uint64_t>(2, Field::kChangeCount, 45, "change count 45 is outside 1..44");
  ExpectFieldRefused<uint64_t>(4, Field::kChangeCount, UINT64_MAX, "change count");
}

TEST_F(ChunkTest, RawSizeAboveBound) {
  for (size_t r = 0; r < expected_.size(); ++r) {
    const ExpectedRecord& want = expected_[r];
    const uint64_t bound =
        MaxRawSize(want.encoded.encoding, want.element_count,
                   static_cast<uint32_t>(ElementSize(want.dtype)), want.encoded.change_count);
    ExpectFieldRefused<uint64_t>(r, Field::kRawSize, bound + 1, "exceeds the bound");
    ExpectFieldRefused<uint64_t>(r, Field::kRawSize, UINT64_MAX, "exceeds the bound");
  }
}

TEST_F(ChunkTest, ContextXorWithEntropyStage) {
  ASSERT_EQ(expected_[1].encoded.encoding, Encoding::kContextXor);
  ExpectFieldRefused<uint8_t>(1, Field::kEntropy, 1, "context-xor records take no entropy stage");
  ExpectFieldRefused<uint8_t>(1, Field::kEntropy, 2, "context-xor records take no entropy stage");
}

TEST_F(ChunkTest, PayloadPastEnd) {
  const uint64_t last = expected_.back().encoded.payload.size();
  ExpectFieldRefused<uint64_t>(4, Field::kPayloadSize, last + 1, "runs past the chunk");
  ExpectFieldRefused<uint64_t>(0, Field::kPayloadSize, UINT64_MAX, "runs past the chunk");
}

TEST_F(ChunkTest, TrailingBytes) {
  Bytes chunk = chunk_;
  chunk.insert(chunk.end(), 3, std::byte{0});
  ResealWithLength(chunk);
  ExpectCorrupt(chunk, "chunk 3: 3 trailing bytes after the last record");
  // Fewer records than the payload holds leaves the rest as trailing bytes.
  chunk = chunk_;
  Put<uint32_t>(chunk, kOffRecordCount, 4);
  Reseal(chunk);
  ExpectCorrupt(chunk, "trailing bytes");
}

TEST_F(ChunkTest, EveryTruncationIsRefusedEvenWhenResealed) {
  for (size_t n = 0; n < chunk_.size(); ++n) {
    Bytes chunk(chunk_.begin(), chunk_.begin() + n);
    EXPECT_FALSE(ParseChunk(chunk).ok()) << n;
    if (n >= kChunkHeaderBytes) {
      ResealWithLength(chunk);
      EXPECT_FALSE(ParseChunk(chunk).ok()) << n << " resealed";
    }
  }
}

// ---------------------------------------------------------------------------
// END chunks

class EndChunkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    identity_.base_version = Hash128(AsBytes("base"));
    identity_.target_version = Hash128(AsBytes("target"));
    identity_.partition_bytes = 4096;
    summary_.target_layout = Hash128(AsBytes("layout"));
    summary_.data_chunks = 7;
    summary_.records = 123;
    summary_.tensor_bytes = 1ull << 40;
    summary_.changed_elements = 456789;
    chunk_ = BuildEndChunk(identity_, 7, summary_);
  }

  static void ExpectCorrupt(const Bytes& chunk, const std::string& substring) {
    auto view = ParseChunk(chunk);
    ASSERT_FALSE(view.ok()) << "accepted; expected \"" << substring << "\"";
    EXPECT_EQ(view.status().code(), StatusCode::kCorrupt);
    EXPECT_THAT(view.status().message(), HasSubstr(substring));
  }

  DeltaIdentity identity_;
  DeltaSummary summary_;
  Bytes chunk_;
};

TEST_F(EndChunkTest, RoundTrip) {
  auto view = ParseChunk(chunk_);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->kind, ChunkKind::kEnd);
  EXPECT_EQ(view->identity, identity_);
  EXPECT_EQ(view->sequence, 7u);
  EXPECT_TRUE(view->records.empty());
  EXPECT_EQ(view->summary.target_layout, summary_.target_layout);
  EXPECT_EQ(view->summary.data_chunks, 7u);
  EXPECT_EQ(view->summary.records, 123u);
  EXPECT_EQ(view->summary.tensor_bytes, 1ull << 40);
  EXPECT_EQ(view->summary.changed_elements, 456789u);
  EXPECT_EQ(view->size_bytes, chunk_.size());

  // An empty delta: no data chunks at all.
  auto empty = ParseChunk(BuildEndChunk(identity_, 0, DeltaSummary{}));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->summary.data_chunks, 0u);
}

TEST_F(EndChunkTest, RecordsOrWrongSummarySize) {
  Bytes chunk = chunk_;
  Put<uint32_t>(chunk, kOffRecordCount, 1);
  Reseal(chunk);
  ExpectCorrupt(chunk, "END chunk must carry no records");
  chunk = chunk_;
  chunk.push_back(std::byte{0});
  ResealWithLength(chunk);
  ExpectCorrupt(chunk, "END chunk must carry no records and a 48-byte summary");
  chunk = chunk_;
  chunk.resize(chunk.size() - 1);
  ResealWithLength(chunk);
  ExpectCorrupt(chunk, "48-byte summary");
}

TEST_F(EndChunkTest, ReservedFieldNonzero) {
  Bytes chunk = chunk_;
  Put<uint32_t>(chunk, kChunkHeaderBytes + 16 + 4, 1);
  Reseal(chunk);
  ExpectCorrupt(chunk, "END chunk reserved field is not zero");
}

TEST_F(EndChunkTest, SequenceMustFollowTheDataChunks) {
  ExpectCorrupt(BuildEndChunk(identity_, 6, summary_), "does not follow its 7 data chunks");
  Bytes chunk = chunk_;
  Put<uint32_t>(chunk, kOffSequence, 8);
  Reseal(chunk);
  ExpectCorrupt(chunk, "END chunk sequence 8 does not follow");
}

TEST_F(EndChunkTest, HeaderChecksStillApply) {
  Bytes chunk = chunk_;
  chunk[kOffFlags] = std::byte{1};
  Reseal(chunk);
  ExpectCorrupt(chunk, "reserved chunk flags");
  chunk = chunk_;
  chunk[chunk.size() - 1] ^= std::byte{1};
  ExpectCorrupt(chunk, "payload checksum mismatch");
}

// ---------------------------------------------------------------------------
// Fuzz-style: random mutations of a valid chunk never crash the parser, and any
// that parse never leave a partition between versions when applied.

TEST_F(ChunkTest, RandomMutationsNeverCrashParseOrApply) {
  std::mt19937_64 rng(0xDE17A);
  const Field kFields[] = {Field::kNameLength,   Field::kDType,       Field::kEncoding,
                           Field::kEntropy,      Field::kReserved,    Field::kElementOffset,
                           Field::kElementCount, Field::kChangeCount, Field::kBaseHash,
                           Field::kTargetHash,   Field::kRawSize,     Field::kPayloadSize};
  auto base_store = MakeStore(tensors_, base_);
  size_t parsed = 0, applied_ok = 0;
  for (int iteration = 0; iteration < 2000; ++iteration) {
    Bytes chunk = chunk_;
    const size_t payload = chunk.size() - kChunkHeaderBytes;
    bool reseal = true;
    switch (rng() % 6) {
      case 0:  // a few bit flips in the payload
        for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
          const size_t at = kChunkHeaderBytes + rng() % payload;
          chunk[at] ^= std::byte(static_cast<uint8_t>(1u << (rng() % 8)));
        }
        break;
      case 1: {  // one record field set to an edge or random value
        const size_t record = rng() % expected_.size();
        const Field field = kFields[rng() % std::size(kFields)];
        const size_t at = FieldOffset(chunk_, record, field);
        const uint64_t current = field == Field::kNameLength ? LoadLE<uint16_t>(chunk.data() + at)
                                 : field <= Field::kReserved ? static_cast<uint8_t>(chunk[at])
                                                             : LoadLE<uint64_t>(chunk.data() + at);
        const uint64_t candidates[] = {
            0,          1,     current + 1, current - 1,
            UINT64_MAX, rng(), rng() % 512, current ^ (uint64_t{1} << (rng() % 64))};
        const uint64_t value = candidates[rng() % std::size(candidates)];
        if (field == Field::kNameLength) {
          StoreLE<uint16_t>(chunk.data() + at, static_cast<uint16_t>(value));
        } else if (field <= Field::kReserved) {
          chunk[at] = std::byte(static_cast<uint8_t>(value));
        } else {
          StoreLE<uint64_t>(chunk.data() + at, value);
        }
        break;
      }
      case 2:  // a bit flip anywhere, header included
        chunk[rng() % chunk.size()] ^= std::byte(static_cast<uint8_t>(1u << (rng() % 8)));
        break;
      case 3:  // a bit flip without resealing: always caught by a checksum
        chunk[rng() % chunk.size()] ^= std::byte(static_cast<uint8_t>(1u << (rng() % 8)));
        reseal = false;
        break;
      case 4:  // cut the payload short or let it run on
        if (rng() % 2) {
          chunk.resize(kChunkHeaderBytes + rng() % payload);
        } else {
          const Bytes extra = RandomBytes(1 + rng() % 40, rng);
          chunk.insert(chunk.end(), extra.begin(), extra.end());
        }
        StoreLE<uint64_t>(chunk.data() + kOffPayloadLength, chunk.size() - kChunkHeaderBytes);
        break;
      default: {  // remove or duplicate a run of payload bytes
        const size_t at = kChunkHeaderBytes + rng() % payload;
        const size_t n = std::min<size_t>(1 + rng() % 16, chunk.size() - at);
        if (rng() % 2) {
          chunk.erase(chunk.begin() + static_cast<ptrdiff_t>(at),
                      chunk.begin() + static_cast<ptrdiff_t>(at + n));
        } else {
          const Bytes run(chunk.begin() + static_cast<ptrdiff_t>(at),
                          chunk.begin() + static_cast<ptrdiff_t>(at + n));
          chunk.insert(chunk.begin() + static_cast<ptrdiff_t>(at), run.begin(), run.end());
        }
        StoreLE<uint64_t>(chunk.data() + kOffPayloadLength, chunk.size() - kChunkHeaderBytes);
        break;
      }
    }
    if (reseal) Reseal(chunk);
    auto view = ParseChunk(chunk);
    if (!reseal) {
      ASSERT_FALSE(view.ok()) << "iteration " << iteration << ": unsealed mutation accepted";
    }
    if (!view.ok()) {
      ASSERT_EQ(view.status().code(), StatusCode::kCorrupt) << view.status().ToString();
      ASSERT_FALSE(view.status().message().empty());
      continue;
    }
    ++parsed;
    auto store = apply::HostStore::CopyOf(*base_store);
    ASSERT_TRUE(store.ok());
    apply::DeltaApplier applier(**store, base_manifest_, identity_,
                                {1 + static_cast<size_t>(iteration % 2)});
    const Status s = applier.ApplyChunk(*view);
    applied_ok += s.ok();
    ASSERT_NO_FATAL_FAILURE(ExpectEveryPartitionAtBaseOrTarget(**store))
        << "iteration " << iteration << ": " << s.ToString();
  }
  // Both paths were exercised.
  EXPECT_GT(parsed, 100u);
  EXPECT_GT(applied_ok, 10u);
  EXPECT_LT(parsed, 2000u);
}

}  // namespace
}  // namespace deltacast::codec
