// The producer data path without a network: each rank of a synthetic training job
// encodes its own shard pair (relay/producers/shard_encoder.h), the root combines their hash
// pieces into manifests and their chunks and pieces into one delta
// (relay/producers/merge.h), and that delta takes the canonical step to the next one byte for
// byte. The manifests must equal the ones hashed from the canonical checkpoints:
// version ids do not depend on who held which bytes.
#include "relay/producers/merge.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/delta_applier.h"
#include "apply/host_store.h"
#include "codec/manifest.h"
#include "relay/producers/shard_encoder.h"
#include "relay/producers/shard_input.h"
#include "relay/wire/protocol.h"
#include "tests/temp_dir.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;

struct Rank {
  std::unique_ptr<ShardFile> base, target;
  RankPlacement placement;
  ShareInput input;
  std::unique_ptr<apply::device::PieceMemory> memory;  // a share served as on a GPU
  ShareReport report;
  EncodedShare encoded;
};

constexpr uint64_t kPartitionBytes = 64 << 10;  // small: many shared partitions

codec::Manifest Hashed(const apply::WeightStore& s) {
  return codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, kPartitionBytes, 2);
}

// `device`: each rank's share goes through a PieceMemory as a GPU share does
// (compared and hashed where it lies, only the changes reach the encoder); the host
// memory runs the same path the CUDA one does, so the merged delta must be as exact.
void RunJob(const std::string& shards, uint64_t experts, uint64_t params,
            codec::CodecMode mode = codec::CodecMode::kFast, bool device = false) {
  test_util::TempDir dir{"merge_test"};
  agent::SynthOptions o;
  o.out_dir = dir.path();
  o.params = params;
  o.steps = 1;
  o.seed = 11;
  o.threads = 2;
  o.experts = experts;
  o.shards = *agent::ParseShardSpec(shards);
  auto synth = agent::Synthesize(o);
  ASSERT_TRUE(synth.ok()) << synth.status().ToString();
  const uint64_t ranks = static_cast<uint64_t>(synth->shard_ranks);

  std::vector<std::unique_ptr<Rank>> rs;
  for (uint64_t r = 0; r < ranks; ++r) {
    auto rank = std::make_unique<Rank>();
    const std::string stem = agent::RankFileStem(r);
    auto base = ShardFile::Open(agent::ShardDirOf(dir.path() / "step0") / (stem + ".safetensors"));
    auto target =
        ShardFile::Open(agent::ShardDirOf(dir.path() / "step1") / (stem + ".safetensors"));
    ASSERT_TRUE(base.ok() && target.ok());
    rank->base = std::move(*base);
    rank->target = std::move(*target);
    auto p = LoadRankPlacement(agent::ShardDirOf(dir.path() / "step1") / (stem + ".toml"),
                               rank->target->tensors());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    rank->placement = std::move(*p);
    Rank* raw = rank.get();
    rank->input = {&raw->placement.map, [raw](uint32_t i) { return raw->base->TensorData(i); },
                   [raw](uint32_t i) { return raw->target->TensorData(i); }};
    if (device) {
      rank->memory = apply::device::NewHostPieceMemory();
      // Host bytes stay for the few tensors whose values are transformed (norms).
      rank->input = {&raw->placement.map,
                     rank->input.base,
                     rank->input.target,
                     raw->memory.get(),
                     [raw](uint32_t i) { return raw->base->TensorData(i).data(); },
                     [raw](uint32_t i) { return raw->target->TensorData(i).data(); }};
    }
    rank->report.producer = stem;
    rank->report.coverage = ShareCoverage(rank->placement.map, kPartitionBytes);
    rank->report.base_pieces = *HashShare(rank->input, rank->report.coverage, kPartitionBytes, 1);
    rs.push_back(std::move(rank));
  }
  std::vector<const ShareReport*> reports;
  for (auto& r : rs) reports.push_back(&r->report);
  const auto& canonical = rs[0]->placement.canonical;
  Status covered = CheckShares(canonical, kPartitionBytes, reports);
  ASSERT_TRUE(covered.ok()) << covered.ToString();
  auto base_manifest = CombineBaseManifest(canonical, kPartitionBytes, reports);
  ASSERT_TRUE(base_manifest.ok()) << base_manifest.status().ToString();

  using Access = apply::CheckpointDirStore::Access;
  auto step0 = apply::CheckpointDirStore::Open(dir.path() / "step0", Access::kReadOnly);
  auto step1 = apply::CheckpointDirStore::Open(dir.path() / "step1", Access::kReadOnly);
  ASSERT_TRUE(step0.ok() && step1.ok());
  const codec::Manifest want_base = Hashed(**step0), want_target = Hashed(**step1);
  EXPECT_EQ(base_manifest->VersionId(), want_base.VersionId());

  ShareEncodeOptions options;
  options.partition_bytes = kPartitionBytes;
  options.chunk_bytes = 256 << 10;
  options.threads = 2;
  options.codec.mode = mode;
  for (auto& r : rs) {
    std::vector<PartitionHash> base_hashes;
    for (const auto& c : r->report.coverage) {
      base_hashes.push_back(c.Whole() ? base_manifest->partition_hashes[c.tensor][c.partition]
                                      : PartitionHash{});
    }
    auto encoded = EncodeShare(r->input, r->report.coverage, base_hashes, options);
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    r->encoded = std::move(*encoded);
    // The compare pass's base proof (row by row, or a tile of packed rows at a
    // time) is the separate hash pass's, piece for piece.
    EXPECT_EQ(r->encoded.base_pieces, r->report.base_pieces) << r->report.producer;
    r->report.changes = r->encoded.changes;
  }
  auto target_manifest = CombineTargetManifest(*base_manifest, reports);
  ASSERT_TRUE(target_manifest.ok());
  EXPECT_EQ(target_manifest->VersionId(), want_target.VersionId());

  std::vector<std::vector<std::byte>> delta;
  DeltaMerger merger(*base_manifest, *target_manifest, options.chunk_bytes,
                     [&](std::vector<std::byte> m) {
                       const ByteSpan chunk = ChunkOf(m);
                       delta.emplace_back(chunk.begin(), chunk.end());
                       return Status::Ok();
                     });
  merger.ExpectPieces(reports);
  uint64_t changed = 0, pieces = 0;
  // Interleave the producers, as their streams arrive at the root.
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (auto& r : rs) {
      if (i < r->encoded.chunks.size()) {
        ASSERT_TRUE(merger.AddChunk(r->encoded.chunks[i]).ok());
        any = true;
      }
      if (i < r->encoded.pieces.size()) {
        auto& p = r->encoded.pieces[i];
        ++pieces;
        const codec::PieceView view{p.encoded.encoding, p.encoded.entropy, p.encoded.change_count,
                                    p.encoded.raw_size, p.encoded.payload};
        ASSERT_TRUE(merger.AddPiece(p.tensor, p.partition, view, nullptr).ok());
        any = true;
      }
    }
    if (!any) break;
  }
  for (auto& r : rs) changed += r->encoded.stats.changed_elements;
  codec::DeltaStats stats;
  ASSERT_TRUE(merger.Finish(changed, &stats).ok());
  if (ranks > 1) {
    EXPECT_GT(pieces, 0u);
    // Partitions several ranks changed arrive as one pieces record.
    EXPECT_GT(stats.records_by_encoding[static_cast<size_t>(codec::Encoding::kPieces)], 0u);
  }

  // A receiver at step0 applies the merged delta.
  auto store = apply::HostStore::CopyOf(**step0);
  ASSERT_TRUE(store.ok());
  apply::DeltaApplier applier(**store, want_base, merger.identity());
  for (size_t i = 0; i + 1 < delta.size(); ++i) {
    auto view = codec::ParseChunk(delta[i]);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Status s = applier.ApplyChunk(*view);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  auto end = codec::ParseChunk(delta.back());
  ASSERT_TRUE(end.ok());
  auto reached = applier.Finish(end->summary);
  ASSERT_TRUE(reached.ok()) << reached.status().ToString();
  EXPECT_EQ(reached->VersionId(), want_target.VersionId());
  for (size_t t = 0; t < (*step1)->tensors().size(); ++t) {
    const ByteSpan want = (*step1)->TensorData(t), got = (*store)->TensorData(t);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin(), got.end()))
        << (*step1)->tensors()[t].name;
  }
}

TEST(ProducerMerge, SharesThatMissOrDoubleAPartitionAreRefusedByName) {
  const std::vector<TensorSpec> table = {{"w", DType::kBF16, {64}}};  // 128 B
  ShareReport a{"rank-00000", {{0, 0, 40, 64}}, {}, {}, {}};
  ShareReport b{"rank-00001", {{0, 0, 20, 64}}, {}, {}, {}};
  const ShareReport* gap[] = {&a, &b};
  Status s = CheckShares(table, 1 << 10, gap);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor 'w' partition 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("a gap"), std::string::npos);
  EXPECT_NE(s.message().find("rank-00001 (20)"), std::string::npos);
  b.coverage[0].covered = 30;
  const ShareReport* overlap[] = {&a, &b};
  s = CheckShares(table, 1 << 10, overlap);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("an overlap"), std::string::npos) << s.message();
  b.coverage[0].covered = 24;
  const ShareReport* exact[] = {&a, &b};
  EXPECT_TRUE(CheckShares(table, 1 << 10, exact).ok());
}

TEST(ProducerMerge, LlamaGqaTensorPipelineDataParallel) { RunJob("tp=2,pp=2,dp=2", 0, 5'000'000); }
TEST(ProducerMerge, MoeWithExpertParallel) { RunJob("ep=2,tp=2", 4, 3'000'000); }
TEST(ProducerMerge, Fsdp2) { RunJob("fsdp=3", 0, 3'000'000); }
TEST(ProducerMerge, OneProducerHoldingEverything) { RunJob("tp=1", 0, 3'000'000); }
TEST(ProducerMerge, SharesComparedWhereTheyLie) {
  RunJob("tp=2,pp=2,dp=2", 0, 5'000'000, codec::CodecMode::kFast, true);
}
TEST(ProducerMerge, ContextMode) { RunJob("tp=2", 0, 3'000'000, codec::CodecMode::kContext); }

TEST(ProducerMerge, BaseProofsMustCombineToTheBaseManifestNamingWhoseDoesNot) {
  // Tensor w: one partition split between two producers; tensor x: one producer's.
  const std::vector<TensorSpec> table = {{"w", DType::kBF16, {64}}, {"x", DType::kBF16, {64}}};
  std::vector<std::byte> w(128), x(128);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = std::byte(i * 7 + 1);
    x[i] = std::byte(i * 5 + 3);
  }
  codec::Manifest base = codec::ComputeManifest(
      table, [&](size_t t) { return ByteSpan(t == 0 ? w : x); }, 1 << 10, 1);
  ShareReport a{"rank-00000", {{0, 0, 40, 64}, {1, 0, 64, 64}}, {}, {}, {}};
  ShareReport b{"rank-00001", {{0, 0, 24, 64}}, {}, {}, {}};
  a.proof = {HashPiece(ByteSpan(w).first(80), 0), HashPiece(x, 0)};
  b.proof = {HashPiece(ByteSpan(w).subspan(80), 80)};
  const ShareReport* both[] = {&a, &b};
  const std::vector<std::byte> one_ulp = {std::byte{1}, std::byte{0}};
  EXPECT_TRUE(CheckBaseProof(base, both).ok()) << CheckBaseProof(base, both).ToString();

  // Rank 0 compared x against one element's worth of other bytes.
  a.proof[1] ^= HashPiece(one_ulp, 10);
  Status s = CheckBaseProof(base, both);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("producer rank-00000 compared against another base"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("tensor 'x' partition 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("nothing was sent"), std::string::npos) << s.message();

  // A shared partition: both producers are named.
  a.proof[1] = HashPiece(x, 0);
  b.proof[0] ^= HashPiece(one_ulp, 90);
  s = CheckBaseProof(base, both);
  EXPECT_NE(s.message().find("one of producers rank-00000, rank-00001"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("tensor 'w' partition 0"), std::string::npos) << s.message();

  // No proof at all is refused too.
  b.proof.clear();
  EXPECT_FALSE(CheckBaseProof(base, both).ok());
}

}  // namespace
}  // namespace deltacast::relay
