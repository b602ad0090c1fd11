#include "codec/manifest_diff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace deltacast::codec {
namespace {

using ::testing::HasSubstr;

struct Weights {
  std::vector<TensorSpec> tensors;
  std::vector<std::vector<std::byte>> data;

  Manifest Hash(uint64_t partition_bytes = 256) const {
    return ComputeManifest(
        tensors, [&](size_t i) { return ByteSpan(data[i]); }, partition_bytes, 1);
  }
};

Weights Sample() {
  Weights w;
  w.tensors = {{"a", DType::kBF16, {1000}}, {"b", DType::kU8, {5}}, {"c", DType::kF32, {4, 8}}};
  std::mt19937_64 rng(7);
  for (const auto& t : w.tensors) {
    std::vector<std::byte> bytes(t.ByteSize());
    for (auto& b : bytes) b = std::byte(static_cast<uint8_t>(rng()));
    w.data.push_back(bytes);
  }
  return w;
}

TEST(ManifestDiffTest, IdenticalManifestsHaveNoDifference) {
  const Manifest m = Sample().Hash();
  const ManifestDiff diff = DiffManifests(m, m);
  EXPECT_TRUE(diff.empty());
  EXPECT_EQ(diff.Describe(), "no difference");
}

TEST(ManifestDiffTest, FlippedBitsAreNamedByTensorAndPartitionRuns) {
  const Weights reference = Sample();
  Weights mine = reference;
  // 'a' is 2000 bytes: partitions of 256 -> 8. Flip bits in partitions 1, 2 and 6.
  for (size_t at : {300, 600, 1600}) mine.data[0][at] ^= std::byte{0x01};
  const ManifestDiff diff = DiffManifests(reference.Hash(), mine.Hash());
  ASSERT_EQ(diff.tensors.size(), 1u);
  const TensorDifference& d = diff.tensors[0];
  EXPECT_EQ(d.kind, TensorDifference::Kind::kBits);
  EXPECT_EQ(d.name, "a");
  EXPECT_EQ(d.partitions, 8u);
  EXPECT_EQ(d.DifferingPartitions(), 3u);
  ASSERT_EQ(d.partition_runs.size(), 2u);
  EXPECT_EQ(d.partition_runs[0], (std::pair<uint64_t, uint64_t>{1, 2}));
  EXPECT_EQ(d.partition_runs[1], (std::pair<uint64_t, uint64_t>{6, 6}));
  EXPECT_EQ(d.Describe(), "'a': bits differ in partitions 1..2, 6 (3 of 8)");
}

TEST(ManifestDiffTest, DtypeShapeMissingAndExtraTensorsAreNamed) {
  const Weights reference = Sample();
  Weights mine = reference;
  mine.tensors[0].dtype = DType::kF16;  // same bytes, another dtype
  mine.tensors[2].shape = {8, 4};       // transposed
  mine.tensors[1].name = "b_renamed";   // 'b' missing, 'b_renamed' extra
  const ManifestDiff diff = DiffManifests(reference.Hash(), mine.Hash());
  ASSERT_EQ(diff.tensors.size(), 4u);
  const std::string text = diff.Describe();
  EXPECT_THAT(text, HasSubstr("'a': dtype F16, expected BF16"));
  EXPECT_THAT(text, HasSubstr("'b': missing"));
  EXPECT_THAT(text, HasSubstr("'b_renamed': not in the reference"));
  EXPECT_THAT(text, HasSubstr("'c': shape [8, 4], expected [4, 8]"));
}

TEST(ManifestDiffTest, ATruncatedTensorIsAShapeDifference) {
  const Weights reference = Sample();
  Weights mine = reference;
  mine.tensors[0].shape = {999};
  mine.data[0].resize(mine.tensors[0].ByteSize());
  const ManifestDiff diff = DiffManifests(reference.Hash(), mine.Hash());
  ASSERT_EQ(diff.tensors.size(), 1u);
  EXPECT_EQ(diff.tensors[0].Describe(), "'a': shape [999], expected [1000]");
}

TEST(ManifestDiffTest, AnotherPartitionSizeComparesOnlyTheTensorTables) {
  const Weights w = Sample();
  const ManifestDiff diff = DiffManifests(w.Hash(256), w.Hash(512));
  EXPECT_TRUE(diff.partition_bytes_differ);
  EXPECT_TRUE(diff.tensors.empty());
  EXPECT_THAT(diff.Describe(), HasSubstr("partition size 512 bytes, expected 256"));
}

TEST(ManifestDiffTest, LongSummariesAreCut) {
  Weights reference;
  for (int i = 0; i < 20; ++i) {
    reference.tensors.push_back({"t" + std::to_string(100 + i), DType::kU8, {4}});
    reference.data.emplace_back(4);
  }
  Weights mine = reference;
  for (auto& d : mine.data) d[0] = std::byte{1};
  const ManifestDiff diff = DiffManifests(reference.Hash(), mine.Hash());
  EXPECT_EQ(diff.tensors.size(), 20u);
  EXPECT_THAT(diff.Describe(3), HasSubstr("and 17 more tensors"));
}

}  // namespace
}  // namespace deltacast::codec
