#include "apply/delta_applier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apply/host_store.h"
#include "codec/change_detect.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "codec/partition.h"
#include "common/hash.h"
#include "common/parallel.h"
#include "common/partition_hash.h"

namespace deltacast::apply {
namespace {

using Bytes = std::vector<std::byte>;
using codec::ChunkView;
using ::testing::HasSubstr;

Bytes RandomBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = std::byte(static_cast<uint8_t>(rng()));
  return out;
}

// A base and a target version of a small mixed-dtype model in HostStores, and the
// delta between them as separate chunks.
class DeltaApplierTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kPartitionBytes = 256;

  void SetUp() override {
    std::mt19937_64 rng(99);
    tensors_ = {
        {"a.emb", DType::kBF16, {20, 50}},  // 1000 elements: 8 partitions of 128
        {"b.head", DType::kF32, {100}},     // 2 partitions
        {"c.mask", DType::kBool, {300}},    // 2 partitions
        {"d.step", DType::kI64, {3}},       // 1 partition
        {"e.norm", DType::kF16, {64}},      // 1 partition, unchanged
    };
    for (const auto& t : tensors_) base_.push_back(RandomBytes(t.ByteSize(), rng));
    target_ = base_;
    for (size_t i = 0; i < 1000; i += 13) target_[0][2 * i] ^= std::byte{0x01};  // every partition
    for (size_t i = 0; i < 100; i += 3) target_[1][4 * i + 3] ^= std::byte{0x80};  // sign flips
    target_[2][299] ^= std::byte{0x01};
    target_[3][0] ^= std::byte{0x01};

    base_store_ = MakeStore(base_);
    target_store_ = MakeStore(target_);
    base_manifest_ = ManifestOf(*base_store_);
    target_manifest_ = ManifestOf(*target_store_);
    identity_ = {base_manifest_.VersionId(), target_manifest_.VersionId(), kPartitionBytes};

    codec::DeltaEncoderOptions options;
    options.chunk_bytes = 300;
    options.threads = 2;
    const Status s = codec::EncodeDelta(
        base_manifest_, target_manifest_, [&](size_t i) { return base_store_->TensorData(i); },
        [&](size_t i) { return target_store_->TensorData(i); }, Digest128{}, options,
        [&](std::vector<std::byte>&& chunk) {
          chunks_.push_back(std::move(chunk));
          return Status::Ok();
        });
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (const Bytes& c : chunks_) {
      auto view = codec::ParseChunk(c);
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      views_.push_back(std::move(*view));
    }
    ASSERT_EQ(views_.back().kind, codec::ChunkKind::kEnd);
    summary_ = views_.back().summary;
    views_.pop_back();
    ASSERT_GE(views_.size(), 4u);
  }

  std::unique_ptr<HostStore> MakeStore(const std::vector<Bytes>& data) const {
    auto store = HostStore::Create(tensors_);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      auto span = (*store)->MutableTensorData(i);
      EXPECT_TRUE(span.ok());
      std::memcpy(span->data(), data[i].data(), data[i].size());
    }
    return std::move(*store);
  }

  static codec::Manifest ManifestOf(const WeightStore& store) {
    return codec::ComputeManifest(
        store.tensors(), [&](size_t i) { return store.TensorData(i); }, kPartitionBytes, 1);
  }

  static std::vector<Bytes> Snapshot(const WeightStore& store) {
    std::vector<Bytes> out;
    for (size_t i = 0; i < store.tensors().size(); ++i) {
      const ByteSpan d = store.TensorData(i);
      out.emplace_back(d.begin(), d.end());
    }
    return out;
  }

  // Every tensor equals the target, by bytes and by hash.
  void ExpectAtTarget(const WeightStore& store) const {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const ByteSpan d = store.TensorData(i);
      EXPECT_EQ(Hash64(d), Hash64(target_[i])) << tensors_[i].name;
      EXPECT_TRUE(std::equal(d.begin(), d.end(), target_[i].begin())) << tensors_[i].name;
    }
  }

  // A data chunk of the delta holding `records` (copied from the real chunks, with
  // `mutate` applied to the last), to craft chunks with invalid records.
  Bytes ChunkOf(std::vector<codec::PartitionRecord> records, uint32_t sequence = 0) const {
    codec::ChunkBuilder builder(identity_, sequence);
    for (const auto& r : records) {
      codec::EncodedPartition encoded;
      encoded.encoding = r.encoding;
      encoded.entropy = r.entropy;
      encoded.change_count = r.change_count;
      encoded.raw_size = r.raw_size;
      encoded.payload.assign(r.payload.begin(), r.payload.end());
      builder.Add(r.tensor_name, r.dtype, r.element_offset, r.element_count, r.base_hash,
                  r.target_hash, encoded);
    }
    return builder.Finish();
  }

  // The record for partition `element_offset` of `tensor`.
  codec::PartitionRecord RecordFor(std::string_view tensor, uint64_t element_offset) const {
    for (const auto& v : views_) {
      for (const auto& r : v.records) {
        if (r.tensor_name == tensor && r.element_offset == element_offset) return r;
      }
    }
    ADD_FAILURE() << "no record for " << tensor << " at " << element_offset;
    return {};
  }

  // Flips a byte of partition (tensor, element_offset) in `store`.
  static void Tear(HostStore& store, size_t tensor, uint64_t byte) {
    auto span = store.MutableTensorData(tensor);
    ASSERT_TRUE(span.ok());
    (*span)[byte] ^= std::byte{0x5A};
  }

  std::vector<TensorSpec> tensors_;
  std::vector<Bytes> base_, target_;
  std::unique_ptr<HostStore> base_store_, target_store_;
  codec::Manifest base_manifest_, target_manifest_;
  codec::DeltaIdentity identity_;
  std::vector<Bytes> chunks_;
  std::vector<ChunkView> views_;  // data chunks only
  codec::DeltaSummary summary_;
};

TEST_F(DeltaApplierTest, ShuffledChunksApplyBitExactly) {
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<size_t> order(views_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::mt19937_64 rng(round);
    std::shuffle(order.begin(), order.end(), rng);
    auto store = MakeStore(base_);
    DeltaApplier applier(*store, base_manifest_, identity_, {round % 2 ? 4u : 1u});
    for (size_t i : order) {
      const Status s = applier.ApplyChunk(views_[i]);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    auto manifest = applier.Finish(summary_);
    ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
    EXPECT_EQ(manifest->VersionId(), identity_.target_version);
    EXPECT_EQ(manifest->partition_hashes, target_manifest_.partition_hashes);
    ExpectAtTarget(*store);
    EXPECT_EQ(applier.report().chunks, views_.size());
    EXPECT_EQ(applier.report().records, summary_.records);
    EXPECT_EQ(applier.report().applied, summary_.records);
    EXPECT_EQ(applier.report().already_at_target, 0u);
    EXPECT_EQ(applier.report().changed_elements, summary_.changed_elements);
    EXPECT_TRUE(applier.torn().empty());
  }
}

// With a manifest the caller vouches for (a store cleanly at the base), partitions
// at base are written and hashed in one pass; the store itself, hashed afterwards,
// is at the target.
TEST_F(DeltaApplierTest, OnePassAtAVouchedManifestIsBitExact) {
  for (const bool pooled : {false, true}) {
    SCOPED_TRACE(pooled ? "worker pool" : "own threads");
    WorkerPool pool(3);
    auto store = MakeStore(base_);
    ApplyOptions options;
    options.threads = 2;
    options.store_at_manifest = true;
    if (pooled) options.pool = &pool;
    DeltaApplier applier(*store, base_manifest_, identity_, options);
    for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
    auto manifest = applier.Finish(summary_);
    ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
    EXPECT_EQ(ManifestOf(*store).VersionId(), identity_.target_version);
    ExpectAtTarget(*store);
    EXPECT_EQ(applier.report().applied, summary_.records);
    EXPECT_EQ(applier.report().already_at_target, 0u);
  }
}

// A vouched manifest that is wrong costs time, never a byte: a partition it has at
// base that is torn is reported torn with its bytes exactly as they were, one that
// is already at the target is skipped, and everything else reaches the target.
TEST_F(DeltaApplierTest, OnePassWithAWrongManifestFallsBackToHashing) {
  auto store = MakeStore(base_);
  Tear(*store, 0, 600);  // a.emb partition 2 (bytes 512..767): torn
  {
    auto span = store->MutableTensorData(0);  // a.emb partition 0 (bytes 0..255): at target
    ASSERT_TRUE(span.ok());
    std::memcpy(span->data(), target_[0].data(), 256);
  }
  const std::vector<Bytes> before = Snapshot(*store);
  ApplyOptions options;
  options.threads = 2;
  options.store_at_manifest = true;
  DeltaApplier applier(*store, base_manifest_, identity_, options);
  for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
  EXPECT_EQ(applier.torn(), (std::vector<PartitionKey>{{"a.emb", 256}}));
  const ByteSpan part = store->TensorData(0).subspan(512, 256);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), before[0].begin() + 512));
  EXPECT_EQ(applier.report().already_at_target, 1u);
  EXPECT_EQ(applier.report().applied, summary_.records - 2);
  ASSERT_TRUE(applier.RepairFrom(*target_store_, {"a.emb", 256}).ok());
  auto manifest = applier.Finish(summary_);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  ExpectAtTarget(*store);
}

// Chunks of one delta applied from several threads at once, each thread sending
// every chunk in its own order (so each chunk is also applied several times over,
// concurrently with itself): every partition is patched exactly once and the store
// ends at the target.
TEST_F(DeltaApplierTest, ChunksAppliedConcurrentlyAreBitExact) {
  for (const bool vouched : {false, true}) {
    SCOPED_TRACE(vouched ? "vouched manifest" : "hash first");
    WorkerPool pool(2);
    auto store = MakeStore(base_);
    ApplyOptions options;
    options.store_at_manifest = vouched;
    options.pool = &pool;
    DeltaApplier applier(*store, base_manifest_, identity_, options);
    constexpr int kThreads = 4;
    std::vector<std::thread> threads;
    std::vector<Status> failures(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<size_t> order(views_.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::mt19937_64 rng(t);
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t i : order) {
          const Status s = applier.ApplyChunk(views_[i]);
          if (!s.ok() && failures[t].ok()) failures[t] = s;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const Status& s : failures) ASSERT_TRUE(s.ok()) << s.ToString();
    auto manifest = applier.Finish(summary_);
    ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
    ExpectAtTarget(*store);
    EXPECT_EQ(applier.report().applied, summary_.records);
    EXPECT_EQ(applier.report().already_at_target, (kThreads - 1) * summary_.records);
    EXPECT_TRUE(applier.torn().empty());
  }
}

TEST_F(DeltaApplierTest, ApplyingAChunkTwiceIsANoOp) {
  auto store = MakeStore(base_);
  DeltaApplier applier(*store, base_manifest_, identity_, {2});
  ASSERT_TRUE(applier.ApplyChunk(views_[0]).ok());
  const std::vector<Bytes> after_once = Snapshot(*store);
  ASSERT_TRUE(applier.ApplyChunk(views_[0]).ok());
  EXPECT_TRUE(Snapshot(*store) == after_once);
  EXPECT_EQ(applier.report().applied, views_[0].records.size());
  EXPECT_EQ(applier.report().already_at_target, views_[0].records.size());
  for (size_t i = 1; i < views_.size(); ++i) ASSERT_TRUE(applier.ApplyChunk(views_[i]).ok());
  auto manifest = applier.Finish(summary_);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  EXPECT_EQ(manifest->VersionId(), identity_.target_version);
  ExpectAtTarget(*store);

  // A whole delta applied again to a store already at target changes nothing.
  DeltaApplier again(*store, base_manifest_, identity_, {2});
  for (const auto& v : views_) ASSERT_TRUE(again.ApplyChunk(v).ok());
  EXPECT_EQ(again.report().applied, 0u);
  EXPECT_EQ(again.report().already_at_target, summary_.records);
  auto again_manifest = again.Finish(summary_);
  ASSERT_TRUE(again_manifest.ok()) << again_manifest.status().ToString();
  EXPECT_EQ(again_manifest->VersionId(), identity_.target_version);
  ExpectAtTarget(*store);
}

TEST_F(DeltaApplierTest, WrongIdentityIsAVersionMismatchAndWritesNothing) {
  std::vector<codec::DeltaIdentity> wrong(3, identity_);
  wrong[0].base_version = Hash128(AsBytes("some other base"));
  wrong[1].target_version = Hash128(AsBytes("some other target"));
  wrong[2].partition_bytes = 2 * kPartitionBytes;
  for (const auto& identity : wrong) {
    auto store = MakeStore(base_);
    DeltaApplier applier(*store, base_manifest_, identity, {2});
    for (const auto& v : views_) {
      const Status s = applier.ApplyChunk(v);
      EXPECT_EQ(s.code(), StatusCode::kVersionMismatch) << s.ToString();
    }
    EXPECT_TRUE(Snapshot(*store) == base_);
    EXPECT_EQ(applier.report().chunks, 0u);
  }
}

TEST_F(DeltaApplierTest, EndChunkIsNotAppliedAsData) {
  auto store = MakeStore(base_);
  DeltaApplier applier(*store, base_manifest_, identity_);
  auto end = codec::ParseChunk(chunks_.back());
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(applier.ApplyChunk(*end).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Snapshot(*store) == base_);
}

// A chunk with one bad record is refused as a whole: not even the valid records
// before it are written.
TEST_F(DeltaApplierTest, InvalidRecordRefusesTheWholeChunk) {
  struct Case {
    std::string what;
    StatusCode code;
    std::string message;
    std::function<void(codec::PartitionRecord&)> mutate;
  };
  std::vector<std::string> names_storage = {"a.emb.missing", "zzz"};
  const std::vector<Case> cases = {
      {"unknown tensor", StatusCode::kNotFound, "which this store lacks",
       [&](codec::PartitionRecord& r) { r.tensor_name = names_storage[0]; }},
      {"tensor after the last", StatusCode::kNotFound, "'zzz'",
       [&](codec::PartitionRecord& r) { r.tensor_name = names_storage[1]; }},
      {"wrong dtype", StatusCode::kCorrupt, "is F32 here but I32 in the delta",
       [](codec::PartitionRecord& r) { r.dtype = DType::kI32; }},
      {"misaligned offset", StatusCode::kCorrupt, "is not a partition start",
       [](codec::PartitionRecord& r) { r.element_offset += 1; }},
      {"offset past the end", StatusCode::kCorrupt, "is not a partition start",
       [](codec::PartitionRecord& r) { r.element_offset = 128; }},
      {"wrong element count", StatusCode::kCorrupt, "has 36 elements, the delta says 35",
       [](codec::PartitionRecord& r) { r.element_count -= 1; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // Two valid records (other tensors), then the bad one (b.head at element 64).
    codec::PartitionRecord bad = RecordFor("b.head", 64);
    c.mutate(bad);
    const Bytes chunk = ChunkOf({RecordFor("a.emb", 0), RecordFor("c.mask", 256), bad});
    auto view = codec::ParseChunk(chunk);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    auto store = MakeStore(base_);
    DeltaApplier applier(*store, base_manifest_, identity_, {2});
    const Status s = applier.ApplyChunk(*view);
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_TRUE(Snapshot(*store) == base_) << "a refused chunk wrote something";
    EXPECT_EQ(applier.report().records, 0u);
  }
}

// The encoder never names a partition twice in one chunk. A chunk that does is
// malformed: applied in parallel, its two records would patch the same bytes at
// once. It is refused before any write.
TEST_F(DeltaApplierTest, ChunkNamingAPartitionTwiceIsRefused) {
  const codec::PartitionRecord twice = RecordFor("a.emb", 128);
  const Bytes chunk = ChunkOf({RecordFor("c.mask", 256), twice, RecordFor("b.head", 0), twice});
  auto view = codec::ParseChunk(chunk);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  for (size_t threads : {1, 4}) {
    auto store = MakeStore(base_);
    DeltaApplier applier(*store, base_manifest_, identity_, {threads});
    const Status s = applier.ApplyChunk(*view);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("'a.emb'"));
    EXPECT_THAT(s.message(), HasSubstr("twice"));
    EXPECT_TRUE(Snapshot(*store) == base_) << "a refused chunk wrote something";
  }
}

// A record whose result would fail its target hash is caught before anything is
// written (check before write): the whole chunk is refused, like a damaged one, so
// the chunk's other records are not applied either, and Finish refuses to call the
// store at the target. (Before the check existed the bad record was undone after
// the fact and the others stayed applied.)
TEST_F(DeltaApplierTest, RecordFailingItsTargetHashStaysAtBase) {
  codec::PartitionRecord bad = RecordFor("b.head", 0);
  bad.target_hash.lo ^= 1;
  const Bytes chunk = ChunkOf({RecordFor("a.emb", 0), bad});
  auto view = codec::ParseChunk(chunk);
  ASSERT_TRUE(view.ok());
  auto store = MakeStore(base_);
  DeltaApplier applier(*store, base_manifest_, identity_, {2});
  const Status s = applier.ApplyChunk(*view);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("'b.head' partition at element 0"));
  EXPECT_TRUE(Snapshot(*store) == base_) << "a refused chunk wrote something";
  EXPECT_TRUE(applier.WasRefused(0));
  EXPECT_EQ(applier.report().refused_chunks, 1u);
  codec::DeltaSummary one = summary_;
  one.data_chunks = 1;
  auto manifest = applier.Finish(one);
  ASSERT_FALSE(manifest.ok());
  EXPECT_THAT(manifest.status().message(), HasSubstr("received 0 of 1"));
}

// A peer that sends well-formed but wrong records: one bit flipped anywhere in the
// records of a valid chunk, its checksums recomputed so only the records' meaning is
// wrong. The chunk is refused (or, for a flipped base hash, its partition reported
// torn) before any store byte changes; the same chunk unflipped then applies.
TEST_F(DeltaApplierTest, OneBitFlippedInAResealedChunkIsRefusedBeforeAnyWrite) {
  // Every encoding, stored without an entropy stage so each payload bit means a bit
  // of a word, a gap or a section length.
  struct Pick {
    size_t tensor;
    uint64_t element_offset;
    codec::Encoding encoding;
  };
  const Pick picks[] = {{0, 0, codec::Encoding::kSparseXor},
                        {0, 128, codec::Encoding::kContextXor},
                        {0, 256, codec::Encoding::kOverwrite},
                        {1, 0, codec::Encoding::kDenseXor},
                        {2, 256, codec::Encoding::kLiteral}};
  codec::ChunkBuilder builder(identity_, 0);
  codec::CodecScratch scratch;
  for (const Pick& p : picks) {
    const TensorSpec& info = tensors_[p.tensor];
    const uint64_t e = ElementSize(info.dtype);
    const uint64_t per = codec::PartitionElements(info.dtype, kPartitionBytes);
    const uint64_t count = std::min(per, info.ElementCount() - p.element_offset);
    const ByteSpan a = ByteSpan(base_[p.tensor]).subspan(p.element_offset * e, count * e);
    const ByteSpan b = ByteSpan(target_[p.tensor]).subspan(p.element_offset * e, count * e);
    codec::SparseChanges changes;
    codec::FindChanges(a, b, static_cast<uint32_t>(e), changes);
    codec::EncodeOptions options;
    options.entropy = codec::EntropyCoder::kNone;
    auto encoded =
        codec::EncodePartitionAs(p.encoding, info.dtype, a, b, changes, options, scratch);
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    builder.Add(info.name, info.dtype, p.element_offset, count, HashPartition(a), HashPartition(b),
                *encoded);
  }
  const Bytes good = builder.Finish();
  auto good_view = codec::ParseChunk(good);
  ASSERT_TRUE(good_view.ok()) << good_view.status().ToString();
  // Where each record's payload and target hash lie in the chunk.
  std::vector<std::pair<size_t, size_t>> must_refuse;  // [from, to) byte ranges
  for (const auto& r : good_view->records) {
    const size_t payload = static_cast<size_t>(r.payload.data() - good.data());
    must_refuse.push_back({payload - 32, payload - 16});  // target hash
    must_refuse.push_back({payload, payload + r.payload.size()});
    // XOR records are checked from the mask and both hashes, before the store is
    // read: a wrong base hash is refused too. (Literal, overwrite and context-XOR
    // records see the partition as torn.)
    if (r.encoding == codec::Encoding::kSparseXor || r.encoding == codec::Encoding::kDenseXor) {
      must_refuse.push_back({payload - 48, payload - 32});
    }
  }
  auto in_must_refuse = [&](size_t at) {
    for (const auto& [from, to] : must_refuse) {
      if (at >= from && at < to) return true;
    }
    return false;
  };
  size_t refused = 0, torn = 0, invalid = 0, unparsed = 0, equivalent = 0;
  for (size_t bit = 8 * codec::kChunkHeaderBytes; bit < 8 * good.size(); ++bit) {
    Bytes chunk = good;
    chunk[bit / 8] ^= std::byte(static_cast<uint8_t>(1u << (bit % 8)));
    // Reseal: payload hash at 64, header hash (of bytes 0..71) at 72.
    StoreLE<uint64_t>(chunk.data() + 64, Hash64(ByteSpan(chunk).subspan(codec::kChunkHeaderBytes)));
    StoreLE<uint64_t>(chunk.data() + 72, Hash64(ByteSpan(chunk.data(), 72)));
    auto view = codec::ParseChunk(chunk);
    if (!view.ok()) {
      ++unparsed;
      continue;
    }
    auto store = MakeStore(base_);
    DeltaApplier applier(*store, base_manifest_, identity_, {1 + bit % 2});
    const Status s = applier.ApplyChunk(*view);
    // Whatever the flip, no partition is left at anything but its base or target.
    for (const Pick& p : picks) {
      const TensorSpec& info = tensors_[p.tensor];
      const uint64_t e = ElementSize(info.dtype);
      const uint64_t per = codec::PartitionElements(info.dtype, kPartitionBytes);
      const uint64_t n = std::min(per, info.ElementCount() - p.element_offset) * e;
      const ByteSpan now = store->TensorData(p.tensor).subspan(p.element_offset * e, n);
      const auto at = static_cast<ptrdiff_t>(p.element_offset * e);
      ASSERT_TRUE(std::equal(now.begin(), now.end(), target_[p.tensor].begin() + at) ||
                  std::equal(now.begin(), now.end(), base_[p.tensor].begin() + at))
          << "bit " << bit << " left a partition at neither version: " << s.ToString();
    }
    if (applier.WasRefused(0)) {
      ++refused;
      EXPECT_EQ(s.code(), StatusCode::kCorrupt);
      ASSERT_TRUE(Snapshot(*store) == base_) << "bit " << bit << ": a refused chunk wrote";
    } else if (!s.ok()) {
      ++invalid;  // a header field that names another partition, dtype or tensor
      ASSERT_TRUE(Snapshot(*store) == base_) << "bit " << bit << ": an invalid chunk wrote";
    } else if (!applier.torn().empty()) {
      ++torn;  // a flipped base hash: that partition is reported, the others apply
      ASSERT_EQ(applier.torn().size(), 1u);
    } else {
      ++equivalent;  // the flip kept the meaning: the chunk applied, all at target
    }
    if (in_must_refuse(bit / 8)) {
      ASSERT_TRUE(applier.WasRefused(0)) << "bit " << bit;
    }
  }
  EXPECT_GT(refused, 1000u);
  // The base-hash bits of the other three records, and offsets moved to another
  // partition of the tensor.
  EXPECT_GE(torn, 3u * 128);
  EXPECT_GT(invalid + unparsed, 0u);
  // The entropy-coder byte of records whose sections are all stored, and the change
  // count of dense and literal records (statistics only): a few dozen bits at most.
  EXPECT_LE(equivalent, 64u);
  // The chunk as sent applies.
  auto store = MakeStore(base_);
  DeltaApplier applier(*store, base_manifest_, identity_, {2});
  ASSERT_TRUE(applier.ApplyChunk(*good_view).ok());
  EXPECT_EQ(applier.report().applied, 5u);
}

TEST_F(DeltaApplierTest, TornPartitionIsReportedNeverPatchedThenRepaired) {
  auto store = MakeStore(base_);
  // a.emb partition 2 (elements 256..383, bytes 512..767) is neither base nor target.
  Tear(*store, 0, 600);
  Tear(*store, 0, 601);
  const std::vector<Bytes> torn_bytes = Snapshot(*store);
  const PartitionKey key{"a.emb", 256};

  DeltaApplier applier(*store, base_manifest_, identity_, {4});
  for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
  EXPECT_EQ(applier.torn(), std::vector<PartitionKey>{key});
  // Never patched: its bytes are exactly as torn.
  const ByteSpan part = store->TensorData(0).subspan(512, 256);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), torn_bytes[0].begin() + 512));
  EXPECT_EQ(applier.report().applied, summary_.records - 1);

  auto finish = applier.Finish(summary_);
  ASSERT_FALSE(finish.ok());
  EXPECT_EQ(finish.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(finish.status().message(), HasSubstr("'a.emb' at element 256"));
  EXPECT_EQ(applier.report().torn, std::vector<PartitionKey>{key});

  // Wrong bytes are refused and write nothing: the base bytes, the torn bytes, the
  // wrong length, and a partition that is not torn.
  const std::vector<Bytes> before = Snapshot(*store);
  const ByteSpan target_part = ByteSpan(target_[0]).subspan(512, 256);
  EXPECT_EQ(applier.Repair(key, ByteSpan(base_[0]).subspan(512, 256)).code(), StatusCode::kCorrupt);
  EXPECT_EQ(applier.Repair(key, ByteSpan(torn_bytes[0]).subspan(512, 256)).code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(applier.Repair(key, target_part.first(255)).code(), StatusCode::kCorrupt);
  EXPECT_EQ(applier.Repair(PartitionKey{"a.emb", 0}, ByteSpan(target_[0]).first(256)).code(),
            StatusCode::kNotFound);
  EXPECT_TRUE(Snapshot(*store) == before);
  EXPECT_EQ(applier.torn().size(), 1u);

  ASSERT_TRUE(applier.Repair(key, target_part).ok());
  EXPECT_TRUE(applier.torn().empty());
  auto manifest = applier.Finish(summary_);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  EXPECT_EQ(manifest->VersionId(), identity_.target_version);
  ExpectAtTarget(*store);
}

TEST_F(DeltaApplierTest, RepairFromAStoreAtTheTarget) {
  auto store = MakeStore(base_);
  Tear(*store, 1, 4 * 70);  // b.head partition 1 (elements 64..99), the short last one
  Tear(*store, 3, 23);      // d.step's only partition
  DeltaApplier applier(*store, base_manifest_, identity_, {1});
  for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
  const std::vector<PartitionKey> torn = applier.torn();
  ASSERT_EQ(torn, (std::vector<PartitionKey>{{"b.head", 64}, {"d.step", 0}}));
  // A source at the base has the wrong bytes; one of another shape lacks the tensor.
  EXPECT_EQ(applier.RepairFrom(*base_store_, torn[0]).code(), StatusCode::kCorrupt);
  auto other = HostStore::Create({{"b.head", DType::kF32, {99}}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(applier.RepairFrom(**other, torn[0]).code(), StatusCode::kNotFound);
  for (const auto& key : torn) ASSERT_TRUE(applier.RepairFrom(*target_store_, key).ok());
  auto manifest = applier.Finish(summary_);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  EXPECT_EQ(manifest->VersionId(), identity_.target_version);
  ExpectAtTarget(*store);
}

TEST_F(DeltaApplierTest, FinishWithAMissingChunkIsIncomplete) {
  for (size_t missing = 0; missing < views_.size(); ++missing) {
    auto store = MakeStore(base_);
    DeltaApplier applier(*store, base_manifest_, identity_, {2});
    for (size_t i = 0; i < views_.size(); ++i) {
      if (i == missing) continue;
      ASSERT_TRUE(applier.ApplyChunk(views_[i]).ok());
    }
    auto manifest = applier.Finish(summary_);
    ASSERT_FALSE(manifest.ok()) << "missing chunk " << missing;
    EXPECT_EQ(manifest.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(manifest.status().message(), HasSubstr("incomplete"));
    // The missing chunk arrives late: now it completes.
    ASSERT_TRUE(applier.ApplyChunk(views_[missing]).ok());
    auto done = applier.Finish(summary_);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(done->VersionId(), identity_.target_version);
    ExpectAtTarget(*store);
  }
}

TEST_F(DeltaApplierTest, ChunkWithASequenceBeyondTheSummaryIsIncomplete) {
  // All records, but one chunk claims a sequence the END chunk does not cover.
  auto store = MakeStore(base_);
  DeltaApplier applier(*store, base_manifest_, identity_, {2});
  for (size_t i = 0; i + 1 < views_.size(); ++i) ASSERT_TRUE(applier.ApplyChunk(views_[i]).ok());
  ChunkView late = views_.back();
  late.sequence = summary_.data_chunks;
  ASSERT_TRUE(applier.ApplyChunk(late).ok());
  auto manifest = applier.Finish(summary_);
  ASSERT_FALSE(manifest.ok());
  EXPECT_THAT(manifest.status().message(), HasSubstr("incomplete"));
}

TEST_F(DeltaApplierTest, RollbackRestoresTheBaseBitExactly) {
  auto store = MakeStore(base_);
  ApplyOptions options;
  options.threads = 2;
  options.keep_undo = true;
  DeltaApplier applier(*store, base_manifest_, identity_, options);
  // Part of the delta, one chunk twice (its second pass skips at-target partitions).
  for (size_t i = 0; i < views_.size(); i += 2) ASSERT_TRUE(applier.ApplyChunk(views_[i]).ok());
  ASSERT_TRUE(applier.ApplyChunk(views_[0]).ok());
  ASSERT_FALSE(Snapshot(*store) == base_);
  ASSERT_TRUE(applier.Rollback().ok());
  EXPECT_TRUE(Snapshot(*store) == base_);
  EXPECT_EQ(ManifestOf(*store).VersionId(), identity_.base_version);

  // Without undo records there is nothing to roll back with.
  DeltaApplier plain(*store, base_manifest_, identity_, {2});
  ASSERT_TRUE(plain.ApplyChunk(views_[0]).ok());
  EXPECT_EQ(plain.Rollback().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace deltacast::apply

namespace deltacast::apply {
namespace {

// Staged apply: every chunk is checked and decoded with the store only read, the
// staged records lead to the target manifest, and the write at the end (with the
// records held, or decoded again when the budget held none) is bit-exact, for the
// fast encodings and for the context ones, which decode against the base bytes.
TEST_F(DeltaApplierTest, StagedChunksWriteNothingUntilAppliedThenAreBitExact) {
  for (const bool context : {false, true}) {
    std::vector<Bytes> chunks;
    std::vector<ChunkView> views;
    codec::DeltaSummary summary = summary_;
    if (context) {
      codec::DeltaEncoderOptions options;
      options.chunk_bytes = 300;
      options.threads = 1;
      options.codec.mode = codec::CodecMode::kContext;
      options.codec.try_every_encoding = true;
      ASSERT_TRUE(codec::EncodeDelta(
                      base_manifest_, target_manifest_,
                      [&](size_t i) { return base_store_->TensorData(i); },
                      [&](size_t i) { return target_store_->TensorData(i); }, Digest128{}, options,
                      [&](std::vector<std::byte>&& chunk) {
                        chunks.push_back(std::move(chunk));
                        return Status::Ok();
                      })
                      .ok());
      for (const Bytes& c : chunks) views.push_back(*codec::ParseChunk(c));
      summary = views.back().summary;
      views.pop_back();
    } else {
      views = views_;
    }
    bool needs_base = false;
    for (const auto& v : views) {
      for (const auto& r : v.records) needs_base |= codec::RecordNeedsBase(r.encoding);
    }
    EXPECT_EQ(needs_base, context);
    for (const int64_t budget_bytes : {int64_t{1} << 30, int64_t{0}}) {
      SCOPED_TRACE(std::string(context ? "context" : "fast") +
                   (budget_bytes ? ", held" : ", decoded again"));
      auto store = MakeStore(base_);
      ApplyOptions options;
      options.threads = 2;
      options.store_at_manifest = true;
      DeltaApplier applier(*store, base_manifest_, identity_, options);
      std::atomic<int64_t> budget{budget_bytes};
      std::vector<StagedChunk> staged;
      for (const auto& v : views) {
        auto s = applier.StageChunk(v, budget);
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        staged.push_back(std::move(*s));
        EXPECT_EQ(staged.back().held_bytes > 0, budget_bytes > 0);
      }
      EXPECT_EQ(Snapshot(*store), base_) << "staging wrote to the store";
      auto target = applier.FinishStaged(summary);
      ASSERT_TRUE(target.ok()) << target.status().ToString();
      EXPECT_EQ(target->VersionId(), identity_.target_version);
      EXPECT_EQ(Snapshot(*store), base_);
      for (size_t c = 0; c < views.size(); ++c) {
        ASSERT_TRUE(applier.ApplyChunk(views[c], &staged[c]).ok());
      }
      auto written = applier.Finish(summary);
      ASSERT_TRUE(written.ok()) << written.status().ToString();
      ExpectAtTarget(*store);
    }
  }
}

// A staged delta that is missing a chunk, or whose record misses its target hash,
// is refused before anything is written.
TEST_F(DeltaApplierTest, StagingRefusesAnIncompleteOrWrongDeltaWithTheStoreUntouched) {
  auto store = MakeStore(base_);
  DeltaApplier applier(*store, base_manifest_, identity_, ApplyOptions{2});
  std::atomic<int64_t> budget{int64_t{1} << 30};
  for (size_t c = 1; c < views_.size(); ++c)
    ASSERT_TRUE(applier.StageChunk(views_[c], budget).ok());
  auto incomplete = applier.FinishStaged(summary_);
  EXPECT_EQ(incomplete.status().code(), StatusCode::kFailedPrecondition);
  codec::PartitionRecord wrong = views_[0].records[0];
  PartitionHash target = wrong.target_hash;
  target.lo ^= 1;
  wrong.target_hash = target;
  const Bytes bad = ChunkOf({wrong}, 0);
  auto refused = applier.StageChunk(*codec::ParseChunk(bad), budget);
  EXPECT_EQ(refused.status().code(), StatusCode::kCorrupt) << refused.status().ToString();
  EXPECT_TRUE(applier.WasRefused(0));
  EXPECT_EQ(Snapshot(*store), base_);
}

}  // namespace
}  // namespace deltacast::apply
