#include "apply/host_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "apply/checkpoint_dir.h"
#include "apply/safetensors.h"
#include "tests/apply/test_util.h"

namespace deltacast::apply {
namespace {

using ::deltacast::apply::testing::Pattern;
using ::deltacast::apply::testing::ScratchDir;
using ::testing::HasSubstr;

TEST(HostStoreTest, CreateOwnsZeroedBuffersSortedByName) {
  auto store = HostStore::Create({{"b", DType::kBF16, {3, 5}},
                                  {"a", DType::kF64, {2}},
                                  {"empty", DType::kF32, {0, 7}},
                                  {"scalar", DType::kU8, {}}});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  HostStore& s = **store;
  ASSERT_EQ(s.tensors().size(), 4u);
  EXPECT_EQ(s.tensors()[0].name, "a");
  EXPECT_EQ(s.tensors()[1].name, "b");
  EXPECT_EQ(s.tensors()[2].name, "empty");
  EXPECT_EQ(s.tensors()[3].name, "scalar");
  const size_t sizes[] = {16, 30, 0, 1};
  for (size_t i = 0; i < 4; ++i) {
    const ByteSpan data = s.TensorData(i);
    ASSERT_EQ(data.size(), sizes[i]);
    for (std::byte b : data) EXPECT_EQ(b, std::byte{0});
  }
  auto b = s.MutableTensorData(1);
  ASSERT_TRUE(b.ok());
  (*b)[29] = std::byte{7};
  EXPECT_EQ(s.TensorData(1)[29], std::byte{7});
  EXPECT_TRUE(s.LayoutId().IsZero());
  EXPECT_EQ(s.FindTensor("scalar"), 3u);
  EXPECT_EQ(s.FindTensor("nope"), std::nullopt);
}

TEST(HostStoreTest, CreateRejectsDuplicatesAndOverflow) {
  auto dup = HostStore::Create({{"a", DType::kU8, {1}}, {"a", DType::kU8, {2}}});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.status().message(), HasSubstr("duplicate tensor name 'a'"));

  auto huge = HostStore::Create({{"h", DType::kF32, {1ull << 62}}});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().message(), HasSubstr("overflows"));
}

TEST(HostStoreTest, BorrowWritesIntoEmbedderBuffers) {
  std::vector<std::byte> x(8), y(6);
  auto store = HostStore::Borrow({{{"y", DType::kI16, {3}}, y}, {{"x", DType::kF32, {2}}, x}});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_EQ((*store)->tensors()[0].name, "x");
  EXPECT_EQ((*store)->TensorData(0).data(), x.data());
  auto data = (*store)->MutableTensorData(1);
  ASSERT_TRUE(data.ok());
  (*data)[5] = std::byte{9};
  EXPECT_EQ(y[5], std::byte{9});
  EXPECT_TRUE((*store)->Flush(1, 0, 6).ok());
}

TEST(HostStoreTest, BorrowChecksSizesAndNames) {
  std::vector<std::byte> buf(8);
  auto wrong = HostStore::Borrow({{{"x", DType::kF32, {3}}, buf}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("buffer of 8 bytes, but its shape needs 12"));

  auto dup = HostStore::Borrow({{{"x", DType::kF32, {2}}, buf}, {{"x", DType::kU8, {8}}, buf}});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
}

TEST(HostStoreTest, FlushIsANoOpThatChecksTheRange) {
  auto store = HostStore::Create({{"a", DType::kU16, {4}}});
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->Flush(0, 0, 8).ok());
  EXPECT_TRUE((*store)->Flush(0, 3, 5).ok());
  EXPECT_EQ((*store)->Flush(0, 3, 6).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Flush(1, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->MutableTensorData(1).status().code(), StatusCode::kInvalidArgument);
}

TEST(HostStoreTest, CopyOfCheckpointIsEqualAndIndependent) {
  ScratchDir dir;
  const std::vector<TensorSpec> tensors = {
      {"w", DType::kBF16, {4, 4}}, {"b", DType::kF32, {4}}, {"e", DType::kF16, {0}}};
  auto writer = SafetensorsWriter::Create(dir.path() / "model.safetensors", tensors);
  ASSERT_TRUE(writer.ok());
  for (const auto& t : tensors) ASSERT_TRUE((*writer)->Append(Pattern(t.ByteSize(), 5)).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto source = CheckpointDirStore::Open(dir.path(), CheckpointDirStore::Access::kReadOnly);
  ASSERT_TRUE(source.ok()) << source.status().ToString();

  auto copy = HostStore::CopyOf(**source);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  ASSERT_EQ((*copy)->tensors(), (*source)->tensors());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ByteSpan a = (*source)->TensorData(i);
    const ByteSpan b = (*copy)->TensorData(i);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
    if (!b.empty()) {
      EXPECT_NE(a.data(), b.data());
    }
  }
  auto w = (*copy)->MutableTensorData(*(*copy)->FindTensor("w"));
  ASSERT_TRUE(w.ok());
  const std::byte before = (*source)->TensorData(*(*source)->FindTensor("w"))[0];
  (*w)[0] = ~before;
  EXPECT_EQ((*source)->TensorData(*(*source)->FindTensor("w"))[0], before);
}

}  // namespace
}  // namespace deltacast::apply
