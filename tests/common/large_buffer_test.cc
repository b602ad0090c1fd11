#include "common/large_buffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>

namespace deltacast {
namespace {

// Sizes below, at and above the threshold, and ones that straddle 2 MiB boundaries
// unevenly: whatever the advice did, the buffer is exactly as asked and all zero.
TEST(LargeBufferTest, IsZeroFilledAndExactlyAsLargeAsAsked) {
  for (const size_t size : {size_t{0}, size_t{4095}, kLargeBufferBytes - 1, kLargeBufferBytes,
                            (size_t{4} << 20) + 257, (size_t{6} << 20) + 12345}) {
    auto buffer = NewLargeBuffer(size);
    ASSERT_NE(buffer, nullptr);
    EXPECT_EQ(buffer->size(), size);
    EXPECT_EQ(buffer->capacity(), size) << "no hidden over-allocation at " << size;
    EXPECT_TRUE(
        std::all_of(buffer->begin(), buffer->end(), [](std::byte b) { return b == std::byte{0}; }))
        << "not zero at " << size;
    // Every byte is writable, the last one included.
    std::fill(buffer->begin(), buffer->end(), std::byte{0x5a});
    if (size > 0) {
      EXPECT_EQ(buffer->back(), std::byte{0x5a});
    }
  }
}

TEST(LargeBufferTest, BuffersDoNotOverlap) {
  auto a = NewLargeBuffer(size_t{3} << 20);
  auto b = NewLargeBuffer(size_t{3} << 20);
  std::fill(a->begin(), a->end(), std::byte{1});
  std::fill(b->begin(), b->end(), std::byte{2});
  EXPECT_TRUE(std::all_of(a->begin(), a->end(), [](std::byte x) { return x == std::byte{1}; }));
  EXPECT_TRUE(std::all_of(b->begin(), b->end(), [](std::byte x) { return x == std::byte{2}; }));
}

}  // namespace
}  // namespace deltacast
