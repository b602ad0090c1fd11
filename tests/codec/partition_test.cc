#include "codec/partition.h"

#include <gtest/gtest.h>

namespace deltacast::codec {
namespace {

TEST(PartitionTest, ElementAlignedAndCoversTensor) {
  TensorSpec t{"w", DType::kBF16, {3, 1000}};
  auto parts = PartitionTensors({t}, 1000);  // 500 BF16 elements a partition
  ASSERT_EQ(parts.size(), 6u);
  uint64_t next = 0;
  for (const auto& p : parts) {
    EXPECT_EQ(p.element_offset, next);
    next += p.element_count;
  }
  EXPECT_EQ(next, 3000u);
}

TEST(PartitionTest, LastPartitionIsShortAndTinyPartitionSizeStillHoldsOneElement) {
  TensorSpec t{"w", DType::kF64, {10}};
  auto parts = PartitionTensors({t}, 3);
  ASSERT_EQ(parts.size(), 10u);
  EXPECT_EQ(parts.back().element_count, 1u);
  TensorSpec u{"u", DType::kF32, {10}};
  auto up = PartitionTensors({u}, 16);
  ASSERT_EQ(up.size(), 3u);
  EXPECT_EQ(up[2].element_count, 2u);
}

TEST(PartitionTest, EmptyTensorHasNoPartitions) {
  TensorSpec t{"empty", DType::kBF16, {0, 4}};
  EXPECT_TRUE(PartitionTensors({t}, 64).empty());
}

}  // namespace
}  // namespace deltacast::codec
