// Manifests and version ids that do not depend on anyone's layout: ranks that each
// hold a shard (row-parallel, fused QKV, random slices) hash only their own bytes,
// merge, and get exactly the manifest of the whole checkpoint.
#include "codec/manifest_builder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "codec/manifest.h"
#include "codec/partition.h"

namespace deltacast::codec {
namespace {

using Bytes = std::vector<std::byte>;

Bytes RandomBytes(size_t n, std::mt19937_64& rng) {
  Bytes out(n);
  for (auto& b : out) b = std::byte(static_cast<uint8_t>(rng()));
  return out;
}

// 200 bytes: not a multiple of any row, so rows straddle partitions, and tails vary.
constexpr uint64_t kPartitionBytes = 200;

Manifest Direct(const std::vector<TensorSpec>& tensors, const std::vector<Bytes>& data) {
  return ComputeManifest(
      tensors, [&](size_t i) { return ByteSpan(data[i]); }, kPartitionBytes, 1);
}

void ExpectSameManifest(const Manifest& got, const Manifest& want) {
  EXPECT_EQ(got.partition_hashes, want.partition_hashes);
  EXPECT_EQ(got.VersionId(), want.VersionId());
}

// Row split (o_proj, down_proj): rank r holds [O, K/tp], one strided run.
TEST(ManifestBuilderTest, RowParallelRanksMergeIntoTheCheckpointsManifest) {
  std::mt19937_64 rng(1);
  for (DType dtype : {DType::kU8, DType::kBF16, DType::kF32, DType::kF64}) {
    for (uint64_t tp : {1, 2, 3, 4, 8}) {
      const uint64_t rows = 17, cols = tp * 5;
      const uint64_t e = ElementSize(dtype);
      const std::vector<TensorSpec> tensors = {{"down_proj.weight", dtype, {rows, cols}}};
      const std::vector<Bytes> data = {RandomBytes(rows * cols * e, rng)};
      ManifestBuilder merged(tensors, kPartitionBytes);
      for (uint64_t r = 0; r < tp; ++r) {
        const uint64_t local = cols / tp;
        Bytes shard(rows * local * e);
        for (uint64_t i = 0; i < rows; ++i) {
          std::copy_n(data[0].begin() + (i * cols + r * local) * e, local * e,
                      shard.begin() + i * local * e);
        }
        ManifestBuilder rank(tensors, kPartitionBytes);
        ASSERT_TRUE(rank.AddRun(0, shard.data(), {rows, local, local * e, r * local, cols}).ok());
        ASSERT_TRUE(merged.Merge(rank).ok());
      }
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " tp " + std::to_string(tp));
      ExpectSameManifest(merged.Finish(), Direct(tensors, data));
    }
  }
}

// Fused QKV, ng >= tp: rank r holds G groups of [hpg q heads; 1 k head; 1 v head] of
// hd rows each; each part is a strided run into its canonical tensor.
TEST(ManifestBuilderTest, FusedQkvRanksMergeIntoTheCheckpointsManifest) {
  std::mt19937_64 rng(2);
  const uint64_t nh = 8, ng = 4, hd = 4, hidden = 6, tp = 2, hpg = nh / ng, groups = ng / tp;
  const DType dtype = DType::kBF16;
  const uint64_t row = hidden * 2;  // bytes of one row
  const std::vector<TensorSpec> tensors = {{"k_proj.weight", dtype, {ng * hd, hidden}},
                                           {"q_proj.weight", dtype, {nh * hd, hidden}},
                                           {"v_proj.weight", dtype, {ng * hd, hidden}}};
  const std::vector<Bytes> data = {RandomBytes(ng * hd * row, rng), RandomBytes(nh * hd * row, rng),
                                   RandomBytes(ng * hd * row, rng)};
  const Bytes &k = data[0], &q = data[1], &v = data[2];
  ManifestBuilder merged(tensors, kPartitionBytes);
  for (uint64_t r = 0; r < tp; ++r) {
    Bytes fused;
    for (uint64_t gl = 0; gl < groups; ++gl) {
      const uint64_t g = r * groups + gl;
      fused.insert(fused.end(), q.begin() + g * hpg * hd * row,
                   q.begin() + (g + 1) * hpg * hd * row);
      fused.insert(fused.end(), k.begin() + g * hd * row, k.begin() + (g + 1) * hd * row);
      fused.insert(fused.end(), v.begin() + g * hd * row, v.begin() + (g + 1) * hd * row);
    }
    const uint64_t block = (hpg + 2) * hd * row;
    const uint64_t g0 = r * groups;
    ManifestBuilder rank(tensors, kPartitionBytes);
    // Row by row, as a load plan would state them: count = rows of one part.
    for (uint64_t gl = 0; gl < groups; ++gl) {
      const std::byte* at = fused.data() + gl * block;
      const uint64_t g = g0 + gl;
      ASSERT_TRUE(rank.AddRun(1, at, {hpg * hd, hidden, row, g * hpg * hd * hidden, hidden}).ok());
      ASSERT_TRUE(
          rank.AddRun(0, at + hpg * hd * row, {hd, hidden, row, g * hd * hidden, hidden}).ok());
      ASSERT_TRUE(
          rank.AddRun(2, at + (hpg + 1) * hd * row, {hd, hidden, row, g * hd * hidden, hidden})
              .ok());
    }
    ASSERT_TRUE(merged.Merge(rank).ok());
  }
  ExpectSameManifest(merged.Finish(), Direct(tensors, data));
}

// Any split into 1-64 contiguous pieces, spread over builders merged in any order.
TEST(ManifestBuilderTest, RandomSlicesOverSeveralBuildersGiveTheSameVersionId) {
  std::mt19937_64 rng(3);
  const std::vector<TensorSpec> tensors = {{"a", DType::kBool, {333}},
                                           {"b", DType::kI16, {7, 31}},
                                           {"c", DType::kF8E4M3, {1}},
                                           {"d", DType::kU32, {250}},
                                           {"e", DType::kI64, {41}}};
  std::vector<Bytes> data;
  for (const auto& t : tensors) data.push_back(RandomBytes(t.ByteSize(), rng));
  const Manifest want = Direct(tensors, data);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<ManifestBuilder> ranks(1 + rng() % 4, ManifestBuilder(tensors, kPartitionBytes));
    for (size_t t = 0; t < tensors.size(); ++t) {
      const uint64_t n = tensors[t].ElementCount(), e = ElementSize(tensors[t].dtype);
      std::vector<uint64_t> cuts{0, n};
      const size_t pieces = std::min<uint64_t>(1 + rng() % 64, n);
      while (cuts.size() < pieces + 1) cuts.push_back(rng() % (n + 1));
      std::sort(cuts.begin(), cuts.end());
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        const ByteSpan piece = ByteSpan(data[t]).subspan(cuts[i] * e, (cuts[i + 1] - cuts[i]) * e);
        ASSERT_TRUE(ranks[rng() % ranks.size()].AddElements(t, cuts[i], piece).ok());
      }
    }
    std::shuffle(ranks.begin(), ranks.end(), rng);
    for (size_t i = 1; i < ranks.size(); ++i) ASSERT_TRUE(ranks[0].Merge(ranks[i]).ok());
    ExpectSameManifest(ranks[0].Finish(), want);
  }
}

TEST(ManifestBuilderTest, PiecesOutsideTheTensorAreRefused) {
  const std::vector<TensorSpec> tensors = {{"w", DType::kBF16, {10}}};
  ManifestBuilder b(tensors, kPartitionBytes);
  const Bytes four(4);
  EXPECT_EQ(b.AddElements(1, 0, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.AddElements(0, 9, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.AddElements(0, 0, ByteSpan(four).first(3)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.AddRun(0, four.data(), {2, 2, 4, 7, 2}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.AddRun(0, four.data(), {2, 2, 4, 0, 1}).code(), StatusCode::kInvalidArgument);
  ManifestBuilder other({{"w", DType::kBF16, {11}}}, kPartitionBytes);
  EXPECT_EQ(b.Merge(other).code(), StatusCode::kInvalidArgument);
  // Nothing added: the manifest is that of zeros.
  const Bytes zeros(20);
  ExpectSameManifest(b.Finish(), Direct(tensors, {zeros}));
}

}  // namespace
}  // namespace deltacast::codec
