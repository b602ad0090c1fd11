#include "common/status.h"

#include <gtest/gtest.h>

#include "common/bytes.h"
#include "common/hash.h"

namespace deltacast {
namespace {

Result<int> ParsePositive(int v) {
  if (v <= 0) return Status::InvalidArgument("value " + std::to_string(v) + " is not positive");
  return v;
}

Result<int> Doubled(int v) {
  ASSIGN_OR_RETURN(int x, ParsePositive(v));
  return 2 * x;
}

TEST(StatusTest, ResultCarriesValueOrError) {
  EXPECT_EQ(*Doubled(4), 8);
  auto bad = Doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().ToString(), "INVALID_ARGUMENT: value -1 is not positive");
}

TEST(StatusTest, WithContextKeepsCode) {
  Status s = Status::Corrupt("bad magic").WithContext("chunk 3");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_EQ(s.message(), "chunk 3: bad magic");
}

TEST(ByteReaderTest, VarintRoundTripAndOverflow) {
  std::vector<std::byte> buf;
  ByteWriter w(buf);
  const uint64_t values[] = {0, 1, 127, 128, 300, uint64_t{1} << 35, ~uint64_t{0}};
  for (uint64_t v : values) w.PutVarint(v);
  ByteReader r(buf);
  for (uint64_t v : values) {
    uint64_t got = 0;
    ASSERT_TRUE(r.GetVarint(got));
    EXPECT_EQ(got, v);
  }
  uint64_t extra;
  EXPECT_FALSE(r.GetVarint(extra));

  // Eleven continuation bytes can never be a valid 64-bit varint.
  std::vector<std::byte> too_long(11, std::byte{0xff});
  ByteReader bad(too_long);
  EXPECT_FALSE(bad.GetVarint(extra));
}

TEST(ByteReaderTest, ReadsNeverPassTheEnd) {
  std::vector<std::byte> buf(3);
  ByteReader r(buf);
  uint32_t v;
  EXPECT_FALSE(r.Get(v));
  ByteSpan out;
  EXPECT_FALSE(r.GetBytes(4, out));
  EXPECT_TRUE(r.GetBytes(3, out));
}

TEST(HashTest, DigestHexRoundTrip) {
  Digest128 d = Hash128(AsBytes("deltacast"));
  auto parsed = Digest128::FromHex(d.ToHex());
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, d);
  EXPECT_FALSE(Digest128::FromHex("xyz").has_value());
  EXPECT_NE(Hash64(AsBytes("a")), Hash64(AsBytes("b")));
}

}  // namespace
}  // namespace deltacast
