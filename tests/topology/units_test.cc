#include "topology/units.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace deltacast::topology {
namespace {

using ::testing::HasSubstr;

TEST(UnitsTest, SizesInBinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseSize("4MiB"), 4u << 20);
  EXPECT_EQ(*ParseSize("512KiB"), 512u << 10);
  EXPECT_EQ(*ParseSize("1 GiB"), 1u << 30);
  EXPECT_EQ(*ParseSize("40G"), 40ull << 30);
  EXPECT_EQ(*ParseSize("1.5KiB"), 1536u);
  EXPECT_EQ(*ParseSize("2MB"), 2'000'000u);
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("7B"), 7u);
}

TEST(UnitsTest, BadSizesAreRejectedWithTheText) {
  for (const char* bad : {"", "MiB", "4mib", "4 Mb", "-1MiB", "0.3B", "inf", "nan", "4  MiB",
                          "1e30TiB", "+4MiB", "4MiB extra"}) {
    Result<uint64_t> r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("\"") + bad + "\"")) << bad;
  }
}

TEST(UnitsTest, BandwidthsInBitsAndBytesPerSecond) {
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1Gbit"), 1e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("100Mbit"), 1e8);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("10Gbps"), 1e10);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("2.5 Gbit/s"), 2.5e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1GB/s"), 8e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("100MB/s"), 8e8);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1MiB/s"), 8.0 * 1024 * 1024);
}

TEST(UnitsTest, BadBandwidthsAreRejected) {
  // "GBps" would be bytes in some tools and bits in others: refused rather than guessed.
  for (const char* bad : {"10", "10G", "10GBps", "10gbit", "0Gbit", "-1Gbit", "fast"}) {
    EXPECT_FALSE(ParseBandwidth(bad).ok()) << bad;
  }
}

TEST(UnitsTest, Durations) {
  EXPECT_EQ(ParseDuration("1ms")->count(), 1);
  EXPECT_EQ(ParseDuration("10s")->count(), 10'000);
  EXPECT_EQ(ParseDuration("1.5s")->count(), 1'500);
  EXPECT_EQ(ParseDuration("2m")->count(), 120'000);
  EXPECT_EQ(ParseDuration("0ms")->count(), 0);
  for (const char* bad : {"10", "0.5ms", "1us", "-1s", "1 day", "10000000h"}) {
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
  }
}

TEST(UnitsTest, Formatting) {
  EXPECT_EQ(FormatSize(4u << 20), "4 MiB");
  EXPECT_EQ(FormatSize(1536), "1.5 KiB");
  EXPECT_EQ(FormatSize(40ull << 30), "40 GiB");
  EXPECT_EQ(FormatBandwidth(1e10), "10 Gbit/s");
  EXPECT_EQ(FormatBandwidth(2.5e9), "2.5 Gbit/s");
  EXPECT_EQ(FormatBandwidth(8e8), "800 Mbit/s");
  EXPECT_EQ(FormatDuration(std::chrono::milliseconds(80)), "80ms");
  EXPECT_EQ(FormatDuration(std::chrono::milliseconds(120'000)), "120s");
  EXPECT_EQ(FormatDuration(std::chrono::milliseconds(1'500)), "1.5s");
  EXPECT_EQ(FormatSeconds(0.25), "250.0 ms");
  EXPECT_EQ(FormatSeconds(12.345), "12.35 s");
}

}  // namespace
}  // namespace deltacast::topology
