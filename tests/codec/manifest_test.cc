#include "codec/manifest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/hash.h"

namespace deltacast::codec {
namespace {

using ::testing::HasSubstr;

Manifest Sample() {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorSpec> tensors = {{"a", DType::kBF16, {300}}, {"b", DType::kU8, {5}}};
  std::mt19937_64 rng(1);
  for (const auto& t : tensors) {
    std::vector<std::byte> bytes(t.ByteSize());
    for (auto& b : bytes) b = std::byte(static_cast<uint8_t>(rng()));
    data.push_back(bytes);
  }
  return ComputeManifest(
      tensors, [&](size_t i) { return ByteSpan(data[i]); }, 256, 1);
}

TEST(ManifestTest, SerializedFormRoundTripsWithItsSixteenBytePartitionHashes) {
  const Manifest m = Sample();
  ASSERT_EQ(m.partition_hashes[0].size(), 3u);  // 600 bytes in partitions of 256
  const auto bytes = m.Serialize();
  auto parsed = Manifest::Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->tensors, m.tensors);
  EXPECT_EQ(parsed->partition_hashes, m.partition_hashes);
  EXPECT_EQ(parsed->VersionId(), m.VersionId());
  // Any single changed hash bit changes the version id.
  Manifest other = m;
  other.partition_hashes[1][0].hi ^= 1ull << 40;
  EXPECT_NE(other.VersionId(), m.VersionId());
}

// Hashing through a reader that copies each partition into the thread's buffer gives
// the manifest the in-memory views give, on any number of threads; a failed read
// fails the manifest instead of leaving a hash out.
TEST(ManifestTest, ComputedThroughACopyingReaderOrFailingWithIt) {
  std::vector<TensorSpec> tensors = {
      {"a", DType::kBF16, {3000}}, {"b", DType::kU8, {5}}, {"c", DType::kF32, {0}}};
  std::vector<std::vector<std::byte>> data;
  std::mt19937_64 rng(2);
  for (const auto& t : tensors) {
    std::vector<std::byte> bytes(t.ByteSize());
    for (auto& b : bytes) b = std::byte(static_cast<uint8_t>(rng()));
    data.push_back(bytes);
  }
  const Manifest expected = ComputeManifest(
      tensors, [&](size_t i) { return ByteSpan(data[i]); }, 256, 1);
  RangeReader copying = [&](size_t t, uint64_t offset, uint64_t length,
                            MutableByteSpan buffer) -> Result<ByteSpan> {
    std::copy_n(data[t].begin() + offset, length, buffer.begin());
    return ByteSpan(buffer.data(), length);
  };
  for (size_t threads : {size_t{1}, size_t{4}}) {
    auto m = ComputeManifest(tensors, copying, 256, threads);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->partition_hashes, expected.partition_hashes) << threads;
    EXPECT_EQ(m->VersionId(), expected.VersionId());
  }
  RangeReader failing = [&](size_t t, uint64_t offset, uint64_t length,
                            MutableByteSpan buffer) -> Result<ByteSpan> {
    if (t == 0 && offset >= 2048) return Status::IoError("read of a: no");
    return copying(t, offset, length, buffer);
  };
  auto m = ComputeManifest(tensors, failing, 256, 3);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kIoError);
  EXPECT_THAT(m.status().message(), HasSubstr("read of a: no"));
}

// A manifest of format 1 (xxh3-64 partition hashes) is never read as format 2:
// Parse says which version it is, and callers hash the store again.
TEST(ManifestTest, FormatOneIsAVersionMismatchNotAMisread) {
  std::vector<std::byte> old;
  ByteWriter w(old);
  w.Put<uint32_t>(0x464D4344);  // "DCMF"
  w.Put<uint16_t>(1);
  w.Put<uint16_t>(0);
  w.Put<uint64_t>(256);
  w.Put<uint64_t>(1);
  w.Put<uint16_t>(1);
  w.PutString("a");
  w.Put<uint8_t>(static_cast<uint8_t>(DType::kU8));
  w.Put<uint8_t>(1);
  w.Put<uint64_t>(4);
  w.Put<uint64_t>(0x1234);  // one xxh3-64 hash
  w.Put<uint64_t>(Hash64(old));
  auto parsed = Manifest::Parse(old);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(parsed.status().message(), HasSubstr("format version 1"));
}

TEST(ManifestTest, TruncatedHashesAreCorrupt) {
  auto bytes = Sample().Serialize();
  bytes.resize(bytes.size() - 8 - 8);  // drop half a hash and the checksum
  ByteWriter(bytes).Put<uint64_t>(Hash64(bytes));
  auto parsed = Manifest::Parse(bytes);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace deltacast::codec
