#include "codec/delta_encoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codec/chunk.h"
#include "codec/manifest.h"
#include "codec/partition.h"
#include "common/hash.h"

namespace deltacast::codec {
namespace {

using Bytes = std::vector<std::byte>;
using ::testing::HasSubstr;

Bytes RandomBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = std::byte(static_cast<uint8_t>(rng()));
  return out;
}

std::function<ByteSpan(size_t)> DataOf(const std::vector<Bytes>& tensors) {
  return [&tensors](size_t i) { return ByteSpan(tensors[i]); };
}

// Bytes one record takes in a chunk (docs/wire-format.md, "Partition record").
size_t RecordBytes(const PartitionRecord& r) {
  return kRecordFixedBytes + r.tensor_name.size() + r.payload.size();
}

// Two in-memory versions of a small model and their manifests.
class DeltaEncoderTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kPartitionBytes = 256;

  void SetUp() override {
    std::mt19937_64 rng(77);
    tensors_ = {
        {"emb", DType::kBF16, {1000}},  // 8 partitions of 128 elements (the last 104)
        {"head", DType::kF32, {100}},   // 2 partitions
        {"norm", DType::kF16, {64}},    // 1 partition, unchanged
        {"steps", DType::kI64, {5}},    // 1 partition
        {"zeros", DType::kU8, {0}},     // no partitions
    };
    for (const auto& t : tensors_) base_.push_back(RandomBytes(t.ByteSize(), rng));
    target_ = base_;
    // emb: a few elements in partitions 0, 1, 3 and 7; 2, 4, 5 and 6 stay unchanged.
    for (size_t i : {0, 5, 127, 128, 300, 390, 999}) target_[0][2 * i] ^= std::byte{0x01};
    // head: re-initialised.
    target_[1] = RandomBytes(target_[1].size(), rng);
    // steps: one counter ticks.
    target_[3][8] ^= std::byte{0x01};
    Rehash();
  }

  void Rehash() {
    base_manifest_ = ComputeManifest(tensors_, DataOf(base_), kPartitionBytes, 2);
    target_manifest_ = ComputeManifest(tensors_, DataOf(target_), kPartitionBytes, 2);
  }

  // Partitions (tensor, element offset) whose bytes differ between base_ and target_.
  std::set<std::pair<std::string, uint64_t>> ChangedPartitions() const {
    std::set<std::pair<std::string, uint64_t>> out;
    for (const PartitionRef& p : PartitionTensors(tensors_, kPartitionBytes)) {
      const uint64_t e = ElementSize(tensors_[p.tensor].dtype);
      const ByteSpan a =
          ByteSpan(base_[p.tensor]).subspan(p.element_offset * e, p.element_count * e);
      const ByteSpan b =
          ByteSpan(target_[p.tensor]).subspan(p.element_offset * e, p.element_count * e);
      if (!std::equal(a.begin(), a.end(), b.begin())) {
        out.insert({tensors_[p.tensor].name, p.element_offset});
      }
    }
    return out;
  }

  // Elements whose bits differ between base_ and target_, counted one by one.
  uint64_t ChangedElements() const {
    uint64_t n = 0;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      const uint64_t e = ElementSize(tensors_[t].dtype);
      for (uint64_t i = 0; i < tensors_[t].ElementCount(); ++i) {
        n += !std::equal(base_[t].begin() + i * e, base_[t].begin() + (i + 1) * e,
                         target_[t].begin() + i * e);
      }
    }
    return n;
  }

  Status Encode(const DeltaEncoderOptions& options, std::vector<Bytes>& chunks,
                DeltaStats* stats = nullptr) {
    chunks.clear();
    return EncodeDelta(
        base_manifest_, target_manifest_, DataOf(base_), DataOf(target_), layout_, options,
        [&](std::vector<std::byte>&& chunk) {
          chunks.push_back(std::move(chunk));
          return Status::Ok();
        },
        stats);
  }

  std::vector<ChunkView> ParseAll(const std::vector<Bytes>& chunks) {
    std::vector<ChunkView> views;
    for (const Bytes& c : chunks) {
      auto view = ParseChunk(c);
      EXPECT_TRUE(view.ok()) << view.status().ToString();
      if (view.ok()) views.push_back(std::move(*view));
    }
    return views;
  }

  std::vector<TensorSpec> tensors_;
  std::vector<Bytes> base_, target_;
  Manifest base_manifest_, target_manifest_;
  Digest128 layout_ = Hash128(AsBytes("layout"));
};

TEST_F(DeltaEncoderTest, ChunksComeInOrderAndEndWithACorrectSummary) {
  DeltaEncoderOptions options;
  options.chunk_bytes = 400;
  options.threads = 2;
  std::vector<Bytes> chunks;
  DeltaStats stats;
  ASSERT_TRUE(Encode(options, chunks, &stats).ok());
  const std::vector<ChunkView> views = ParseAll(chunks);
  ASSERT_EQ(views.size(), chunks.size());
  ASSERT_GE(views.size(), 3u);

  const DeltaIdentity identity{base_manifest_.VersionId(), target_manifest_.VersionId(),
                               kPartitionBytes};
  uint64_t records = 0, changed = 0, bytes = 0;
  std::set<std::pair<std::string, uint64_t>> seen;
  std::pair<size_t, uint64_t> previous{0, 0};
  bool first = true;
  for (size_t i = 0; i + 1 < views.size(); ++i) {
    const ChunkView& v = views[i];
    EXPECT_EQ(v.kind, ChunkKind::kData) << i;
    EXPECT_EQ(v.sequence, i);
    EXPECT_EQ(v.identity, identity);
    for (const PartitionRecord& r : v.records) {
      ++records;
      changed += r.change_count;
      // Canonical order: by tensor (sorted by name), then by element offset.
      size_t t = 0;
      while (tensors_[t].name != r.tensor_name) ++t;
      const std::pair<size_t, uint64_t> at{t, r.element_offset};
      EXPECT_TRUE(first || previous < at) << r.tensor_name << " " << r.element_offset;
      previous = at;
      first = false;
      EXPECT_TRUE(seen.insert({std::string(r.tensor_name), r.element_offset}).second);
    }
    bytes += chunks[i].size();
  }
  const ChunkView& end = views.back();
  EXPECT_EQ(end.kind, ChunkKind::kEnd);
  EXPECT_EQ(end.identity, identity);
  EXPECT_EQ(end.sequence, views.size() - 1);
  EXPECT_EQ(end.summary.data_chunks, views.size() - 1);
  EXPECT_EQ(end.summary.records, records);
  EXPECT_EQ(end.summary.changed_elements, changed);
  EXPECT_EQ(end.summary.tensor_bytes, target_manifest_.TotalBytes());
  EXPECT_EQ(end.summary.target_layout, layout_);

  // Exactly the partitions whose bytes changed, each with every changed element.
  EXPECT_EQ(seen, ChangedPartitions());
  EXPECT_EQ(changed, ChangedElements());

  EXPECT_EQ(stats.chunks, views.size());
  EXPECT_EQ(stats.changed_partitions, records);
  EXPECT_EQ(stats.changed_elements, changed);
  EXPECT_EQ(stats.partitions, target_manifest_.PartitionTotal());
  EXPECT_EQ(stats.tensor_bytes, target_manifest_.TotalBytes());
  EXPECT_EQ(stats.delta_bytes, bytes + chunks.back().size());
  uint64_t by_encoding = 0;
  for (uint64_t n : stats.records_by_encoding) by_encoding += n;
  EXPECT_EQ(by_encoding, records);
}

// A reader that copies each partition into the encoder's buffers (a checkpoint
// directory's pread path) yields the very chunks the in-memory views do.
TEST_F(DeltaEncoderTest, CopyingReadersGiveTheSameChunksAsViews) {
  DeltaEncoderOptions options;
  options.chunk_bytes = 300;
  for (size_t threads : {size_t{1}, size_t{3}}) {
    options.threads = threads;
    std::vector<Bytes> expected;
    ASSERT_TRUE(Encode(options, expected).ok());
    std::atomic<uint64_t> copied{0};
    auto copying = [&](const std::vector<Bytes>& tensors) -> RangeReader {
      return [&tensors, &copied](size_t t, uint64_t offset, uint64_t length,
                                 MutableByteSpan buffer) -> Result<ByteSpan> {
        std::copy_n(tensors[t].begin() + offset, length, buffer.begin());
        copied += length;
        return ByteSpan(buffer.data(), length);
      };
    };
    std::vector<Bytes> chunks;
    ASSERT_TRUE(EncodeDelta(base_manifest_, target_manifest_, copying(base_), copying(target_),
                            layout_, options,
                            [&](std::vector<std::byte>&& chunk) {
                              chunks.push_back(std::move(chunk));
                              return Status::Ok();
                            })
                    .ok());
    EXPECT_EQ(chunks, expected) << threads << " threads";
    // Only changed partitions are read, each once from either version.
    uint64_t changed_bytes = 0;
    for (const auto& [name, offset] : ChangedPartitions()) {
      size_t t = 0;
      while (tensors_[t].name != name) ++t;
      const uint64_t e = ElementSize(tensors_[t].dtype);
      changed_bytes += std::min<uint64_t>(kPartitionBytes, tensors_[t].ByteSize() - offset * e);
    }
    EXPECT_EQ(copied.load(), 2 * changed_bytes);
  }
}

// Partitions larger than the encoder's read tile, read by a copying reader: the
// changes found tile by tile, wherever they fall (first and last element of a tile,
// a dense tile, an unchanged tile), make the very chunks the in-memory views make.
TEST(DeltaEncoderTiles, CopiedPartitionsComparedTileByTileGiveTheSameChunks) {
  constexpr uint64_t kPartition = 1 << 20;
  const std::vector<TensorSpec> tensors = {{"a", DType::kBF16, {1300000}},
                                           {"b", DType::kF32, {300000}}};
  std::mt19937_64 rng(9);
  std::vector<Bytes> base, target;
  for (const auto& t : tensors) base.push_back(RandomBytes(t.ByteSize(), rng));
  target = base;
  for (size_t i = 0; i < target[0].size(); i += 2) {
    if (rng() % 33 == 0) target[0][i] ^= std::byte{0x01};
  }
  const size_t tile = 128 << 10;
  for (size_t at : {tile - 2, tile, 3 * tile - 2, 5 * tile}) target[0][at] ^= std::byte{0x80};
  for (size_t i = 9 * tile; i < 10 * tile; ++i)
    target[0][i] = std::byte(static_cast<uint8_t>(rng()));
  for (size_t i = 0; i < target[1].size(); i += 4096) target[1][i] ^= std::byte{0x10};
  const Manifest mb = ComputeManifest(tensors, DataOf(base), kPartition, 2);
  const Manifest mt = ComputeManifest(tensors, DataOf(target), kPartition, 2);
  DeltaEncoderOptions options;
  options.threads = 1;
  auto collect = [&](const RangeReader& rb, const RangeReader& rt) {
    std::vector<Bytes> chunks;
    EXPECT_TRUE(EncodeDelta(mb, mt, rb, rt, {}, options, [&](std::vector<std::byte>&& c) {
                  chunks.push_back(std::move(c));
                  return Status::Ok();
                }).ok());
    return chunks;
  };
  auto copying = [](const std::vector<Bytes>& data) -> RangeReader {
    return [&data](size_t t, uint64_t offset, uint64_t length,
                   MutableByteSpan buffer) -> Result<ByteSpan> {
      std::copy_n(data[t].begin() + offset, length, buffer.begin());
      return ByteSpan(buffer.data(), length);
    };
  };
  // Fast mode builds most records from the tiles' changes alone and reads the
  // partition whole again where another encoding is worth trying (the random tile);
  // context mode reads every float partition whole again.
  for (CodecMode mode : {CodecMode::kFast, CodecMode::kContext}) {
    options.codec.mode = mode;
    const std::vector<Bytes> expected =
        collect(ReadFromSpans(DataOf(base)), ReadFromSpans(DataOf(target)));
    ASSERT_GE(expected.size(), 2u);
    EXPECT_EQ(collect(copying(base), copying(target)), expected);
  }
}

// A read that fails stops the encoder, which returns the reader's error naming the
// tensor and the version; nothing after the failing partition is handed on.
TEST_F(DeltaEncoderTest, AFailedReadStopsTheEncoder) {
  DeltaEncoderOptions options;
  options.chunk_bytes = 1;  // every record its own chunk
  options.threads = 2;
  RangeReader base = ReadFromSpans(DataOf(base_));
  auto views = DataOf(target_);
  RangeReader target = [&](size_t t, uint64_t offset, uint64_t length,
                           MutableByteSpan buffer) -> Result<ByteSpan> {
    if (tensors_[t].name == "head") return Status::IoError("disk says no");
    return ReadFromSpans(views)(t, offset, length, buffer);
  };
  std::vector<std::string> tensors_sent;
  const Status status = EncodeDelta(base_manifest_, target_manifest_, base, target, layout_,
                                    options, [&](std::vector<std::byte>&& chunk) {
                                      auto view = ParseChunk(chunk);
                                      EXPECT_TRUE(view.ok());
                                      for (const auto& r : view->records)
                                        tensors_sent.emplace_back(r.tensor_name);
                                      return Status::Ok();
                                    });
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("disk says no"));
  EXPECT_THAT(status.message(), HasSubstr("'head' of the target"));
  // "emb" sorts before "head": its records went out; nothing of "head" or after did.
  EXPECT_FALSE(tensors_sent.empty());
  for (const std::string& name : tensors_sent) EXPECT_EQ(name, "emb");
}

TEST_F(DeltaEncoderTest, RecordsRebuildTheTargetFromTheBase) {
  DeltaEncoderOptions options;
  options.chunk_bytes = 300;
  options.threads = 3;
  for (CodecMode mode : {CodecMode::kFast, CodecMode::kContext}) {
    options.codec.mode = mode;
    std::vector<Bytes> chunks;
    ASSERT_TRUE(Encode(options, chunks).ok());
    std::vector<Bytes> rebuilt = base_;
    CodecScratch scratch;
    for (const ChunkView& v : ParseAll(chunks)) {
      for (const PartitionRecord& r : v.records) {
        size_t t = 0;
        while (tensors_[t].name != r.tensor_name) ++t;
        const uint64_t e = ElementSize(r.dtype);
        MutableByteSpan part =
            MutableByteSpan(rebuilt[t]).subspan(r.element_offset * e, r.element_count * e);
        ASSERT_EQ(HashPartition(part), r.base_hash);
        ASSERT_TRUE(ApplyEncodedPartition(r.Coding(), part, scratch).ok());
        ASSERT_EQ(HashPartition(part), r.target_hash);
      }
    }
    for (size_t t = 0; t < tensors_.size(); ++t) {
      EXPECT_TRUE(rebuilt[t] == target_[t]) << tensors_[t].name;
    }
  }
}

TEST_F(DeltaEncoderTest, SmallChunkBytesGiveOneRecordPerChunk) {
  DeltaEncoderOptions options;
  options.chunk_bytes = 1;
  options.threads = 2;
  std::vector<Bytes> chunks;
  ASSERT_TRUE(Encode(options, chunks).ok());
  const auto views = ParseAll(chunks);
  ASSERT_EQ(views.size(), ChangedPartitions().size() + 1);
  for (size_t i = 0; i + 1 < views.size(); ++i) EXPECT_EQ(views[i].records.size(), 1u);

  options.chunk_bytes = 1ull << 30;
  ASSERT_TRUE(Encode(options, chunks).ok());
  const auto one = ParseAll(chunks);
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(one[0].records.size(), ChangedPartitions().size());
}

// A chunk is emitted as soon as it holds chunk_bytes, and not before.
TEST_F(DeltaEncoderTest, ChunksAreEmittedAsSoonAsTheyFill) {
  for (uint64_t limit : {200, 500, 900}) {
    DeltaEncoderOptions options;
    options.chunk_bytes = limit;
    options.threads = 2;
    std::vector<Bytes> chunks;
    ASSERT_TRUE(Encode(options, chunks).ok());
    const auto views = ParseAll(chunks);
    ASSERT_GE(views.size(), 2u);
    for (size_t i = 0; i + 2 < views.size(); ++i) {  // every data chunk but the last
      EXPECT_GE(views[i].size_bytes, limit) << "chunk " << i;
      EXPECT_LT(views[i].size_bytes - RecordBytes(views[i].records.back()), limit) << "chunk " << i;
    }
  }
}

TEST_F(DeltaEncoderTest, UnchangedPartitionsAreSkippedWithoutReadingThem) {
  // Identical versions: only an END chunk, and no tensor byte is read.
  target_ = base_;
  Rehash();
  size_t reads = 0;
  auto counting = [&](size_t i) {
    ++reads;
    return ByteSpan(base_[i]);
  };
  std::vector<Bytes> chunks;
  DeltaEncoderOptions options;
  options.threads = 2;
  ASSERT_TRUE(EncodeDelta(base_manifest_, target_manifest_, counting, counting, layout_, options,
                          [&](std::vector<std::byte>&& c) {
                            chunks.push_back(std::move(c));
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_EQ(reads, 0u);
  const auto views = ParseAll(chunks);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].kind, ChunkKind::kEnd);
  EXPECT_EQ(views[0].sequence, 0u);
  EXPECT_EQ(views[0].summary.data_chunks, 0u);
  EXPECT_EQ(views[0].summary.records, 0u);
  EXPECT_EQ(views[0].summary.changed_elements, 0u);
}

TEST_F(DeltaEncoderTest, ThreadCountsGiveByteIdenticalOutput) {
  // More partitions than the workers' window so results wrap around it.
  tensors_.push_back({"zz.big", DType::kBF16, {128 * 70}});
  std::mt19937_64 rng(5);
  base_.push_back(RandomBytes(tensors_.back().ByteSize(), rng));
  target_.push_back(base_.back());
  for (size_t i = 0; i < target_.back().size(); i += 37) target_.back()[i] ^= std::byte{0x02};
  Rehash();
  for (CodecMode mode : {CodecMode::kFast, CodecMode::kContext}) {
    DeltaEncoderOptions options;
    options.codec.mode = mode;
    options.chunk_bytes = 600;
    options.threads = 1;
    std::vector<Bytes> one, four, again, caller;
    ASSERT_TRUE(Encode(options, one).ok());
    options.threads = 4;
    ASSERT_TRUE(Encode(options, four).ok());
    ASSERT_TRUE(Encode(options, again).ok());
    options.on_calling_thread = true;  // the simulator's way: no worker thread
    ASSERT_TRUE(Encode(options, caller).ok());
    ASSERT_GT(one.size(), 5u);
    EXPECT_TRUE(one == four) << "1 and 4 threads differ";
    EXPECT_TRUE(four == again) << "two runs with 4 threads differ";
    EXPECT_TRUE(one == caller) << "the calling thread's encoding differs";
  }
}

TEST_F(DeltaEncoderTest, HeadroomFramesChunksInPlaceInTheBuffersLentForThem) {
  DeltaEncoderOptions options;
  options.chunk_bytes = 200;  // several data chunks
  options.threads = 1;
  std::vector<Bytes> plain;
  DeltaStats plain_stats;
  ASSERT_TRUE(Encode(options, plain, &plain_stats).ok());
  ASSERT_GT(plain.size(), 3u);

  options.chunk_headroom = 24;
  options.chunk_tailroom = 64;
  std::vector<const std::byte*> lent;  // each buffer chunk_buffer gave
  options.chunk_buffer = [&](size_t capacity) {
    std::vector<std::byte> buffer;
    buffer.reserve(capacity + 100);
    buffer.push_back(std::byte{0x55});  // contents are dropped
    lent.push_back(buffer.data());
    return buffer;
  };
  std::vector<Bytes> framed;
  std::vector<const std::byte*> built_in;  // each chunk's buffer
  DeltaStats stats;
  ASSERT_TRUE(EncodeDelta(
                  base_manifest_, target_manifest_, DataOf(base_), DataOf(target_), layout_,
                  options,
                  [&](std::vector<std::byte>&& chunk) {
                    built_in.push_back(chunk.data());
                    framed.push_back(std::move(chunk));
                    return Status::Ok();
                  },
                  &stats)
                  .ok());
  ASSERT_EQ(framed.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(framed[i].size(), 24 + plain[i].size()) << "chunk " << i;
    EXPECT_TRUE(std::equal(plain[i].begin(), plain[i].end(), framed[i].begin() + 24))
        << "chunk " << i << " differs after its headroom";
  }
  // Each data chunk was built in the buffer lent for it, and only those asked for
  // one (the END chunk is built apart).
  ASSERT_EQ(lent.size(), framed.size() - 1);
  for (size_t i = 0; i < lent.size(); ++i) {
    EXPECT_EQ(built_in[i], lent[i]) << "chunk " << i << " was not built in its buffer";
  }
  EXPECT_EQ(stats.delta_bytes, plain_stats.delta_bytes);  // chunk bytes, not headroom
  EXPECT_EQ(stats.chunks, plain_stats.chunks);
}

TEST_F(DeltaEncoderTest, MismatchedTensorTableIsRefused) {
  auto expect_refused = [&](const Manifest& base, const Manifest& target, const std::string& what) {
    size_t calls = 0;
    const Status s = EncodeDelta(base, target, DataOf(base_), DataOf(target_), layout_,
                                 DeltaEncoderOptions{}, [&](std::vector<std::byte>&&) {
                                   ++calls;
                                   return Status::Ok();
                                 });
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what << ": " << s.ToString();
    EXPECT_EQ(calls, 0u) << what;
  };
  Manifest other = target_manifest_;
  other.tensors[1].shape = {10, 10};  // same size, other shape
  expect_refused(base_manifest_, other, "shape");
  other = target_manifest_;
  other.tensors[1].dtype = DType::kI32;
  expect_refused(base_manifest_, other, "dtype");
  other = target_manifest_;
  other.tensors[1].name = "head2";
  expect_refused(base_manifest_, other, "name");
  other = target_manifest_;
  other.tensors.pop_back();
  other.partition_hashes.pop_back();
  expect_refused(base_manifest_, other, "count");
  expect_refused(other, target_manifest_, "count, other way");
  other = ComputeManifest(tensors_, DataOf(target_), kPartitionBytes * 2, 1);
  expect_refused(base_manifest_, other, "partition size");
}

// A record can carry a tensor name of at most kMaxTensorNameBytes; a longer one
// would give a delta that every receiver refuses (or, past 64 KiB, whose name length
// wraps), so the encoder refuses it before emitting anything.
TEST_F(DeltaEncoderTest, TensorNameTooLongForTheWireIsRefused) {
  for (size_t length : {kMaxTensorNameBytes, kMaxTensorNameBytes + 1, size_t{70000}}) {
    SCOPED_TRACE("name of " + std::to_string(length) + " bytes");
    std::vector<TensorSpec> tensors = {{std::string(length, 'w'), DType::kBF16, {64}}};
    std::mt19937_64 rng(1);
    const std::vector<Bytes> base = {RandomBytes(128, rng)};
    std::vector<Bytes> target = base;
    target[0][7] ^= std::byte{1};
    const Manifest a = ComputeManifest(tensors, DataOf(base), kPartitionBytes, 1);
    const Manifest b = ComputeManifest(tensors, DataOf(target), kPartitionBytes, 1);
    std::vector<Bytes> chunks;
    const Status s = EncodeDelta(a, b, DataOf(base), DataOf(target), layout_, DeltaEncoderOptions{},
                                 [&](std::vector<std::byte>&& c) {
                                   chunks.push_back(std::move(c));
                                   return Status::Ok();
                                 });
    if (length <= kMaxTensorNameBytes) {
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (const Bytes& c : chunks) EXPECT_TRUE(ParseChunk(c).ok());
    } else {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_TRUE(chunks.empty());
    }
  }
}

TEST_F(DeltaEncoderTest, SinkErrorStopsEncodingAndIsReturned) {
  DeltaEncoderOptions options;
  options.chunk_bytes = 1;  // one chunk per changed partition
  options.threads = 4;
  for (size_t fail_at : {size_t{0}, size_t{1}, ChangedPartitions().size()}) {
    size_t calls = 0;
    const Status s = EncodeDelta(base_manifest_, target_manifest_, DataOf(base_), DataOf(target_),
                                 layout_, options, [&](std::vector<std::byte>&&) {
                                   if (calls++ == fail_at) return Status::Unavailable("peer gone");
                                   return Status::Ok();
                                 });
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << "fail_at " << fail_at;
    EXPECT_THAT(s.message(), HasSubstr("peer gone"));
    EXPECT_EQ(calls, fail_at + 1) << "the sink was called after it failed";
  }
}

TEST_F(DeltaEncoderTest, BytesThatChangeWhileEncodingAreReported) {
  // The target manifest says partition 0 of emb changed, but the bytes read are the base's.
  Manifest lying = base_manifest_;
  lying.partition_hashes[0][0].lo ^= 1;
  std::vector<Bytes> chunks;
  const Status s = EncodeDelta(base_manifest_, lying, DataOf(base_), DataOf(base_), layout_,
                               DeltaEncoderOptions{}, [&](std::vector<std::byte>&& c) {
                                 chunks.push_back(std::move(c));
                                 return Status::Ok();
                               });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("'emb' changed while the delta was being encoded"));
  for (const Bytes& c : chunks) {
    auto v = ParseChunk(c);
    ASSERT_TRUE(v.ok());
    EXPECT_NE(v->kind, ChunkKind::kEnd) << "a failed delta must not be completed";
  }
}

TEST_F(DeltaEncoderTest, AStaleBaseManifestIsRefusedBeforeItsRecordIsSent) {
  // The base manifest is of bytes one element away from the base read (a stale cache,
  // a checkpoint changed since it was hashed): a record built from these bytes would
  // take receivers holding the manifest's version somewhere neither version is.
  std::vector<Bytes> other = base_;
  other[0][2] ^= std::byte{0x01};
  const Manifest stale = ComputeManifest(tensors_, DataOf(other), kPartitionBytes, 1);
  for (size_t threads : {size_t{0}, size_t{1}, size_t{3}}) {
    DeltaEncoderOptions options;
    options.threads = threads;
    options.on_calling_thread = threads == 0;
    std::vector<Bytes> chunks;
    const Status s = EncodeDelta(stale, target_manifest_, DataOf(base_), DataOf(target_), layout_,
                                 options, [&](std::vector<std::byte>&& c) {
                                   chunks.push_back(std::move(c));
                                   return Status::Ok();
                                 });
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("tensor 'emb' partition 0"));
    for (const Bytes& c : chunks) {
      auto v = ParseChunk(c);
      ASSERT_TRUE(v.ok());
      for (const auto& r : v->records) {
        EXPECT_FALSE(r.tensor_name == "emb" && r.element_offset == 0) << "the record was sent";
      }
      EXPECT_NE(v->kind, ChunkKind::kEnd) << "a failed delta must not be completed";
    }
  }
}

}  // namespace
}  // namespace deltacast::codec
