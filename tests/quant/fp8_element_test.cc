// Golden vectors of the element arithmetic (fp8_element.h): E4M3FN codes worked out
// by hand from the format (1 sign, 4 exponent bits biased by 7, 3 mantissa bits,
// 0x7F / 0xFF the only NaNs, no infinity) and c10's conversion rules, and block
// scales computed with numpy's IEEE FP32 arithmetic.
#include "quant/fp8_element.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace deltacast::quant {
namespace {

float F(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t B(float f) { return std::bit_cast<uint32_t>(f); }

TEST(E4m3FromFloat, ZerosKeepTheirSign) {
  EXPECT_EQ(E4m3FromFloat(0.0f), 0x00);
  EXPECT_EQ(E4m3FromFloat(-0.0f), 0x80);
  EXPECT_EQ(E4m3FromFloat(1e-40f), 0x00);  // an FP32 subnormal rounds to zero
  EXPECT_EQ(E4m3FromFloat(-1e-40f), 0x80);
}

TEST(E4m3FromFloat, ExactValues) {
  EXPECT_EQ(E4m3FromFloat(1.0f), 0x38);
  EXPECT_EQ(E4m3FromFloat(-1.5f), 0xBC);
  EXPECT_EQ(E4m3FromFloat(2.0f), 0x40);
  EXPECT_EQ(E4m3FromFloat(448.0f), 0x7E);
  EXPECT_EQ(E4m3FromFloat(-448.0f), 0xFE);
  EXPECT_EQ(E4m3FromFloat(0.015625f), 0x08);     // 2^-6, the smallest normal
  EXPECT_EQ(E4m3FromFloat(0.001953125f), 0x01);  // 2^-9, the smallest subnormal
  EXPECT_EQ(E4m3FromFloat(7.0f / 512), 0x07);    // the largest subnormal
}

TEST(E4m3FromFloat, TiesGoToEven) {
  EXPECT_EQ(E4m3FromFloat(1.0625f), 0x38);  // 1 | 1.125: even is 1
  EXPECT_EQ(E4m3FromFloat(1.1875f), 0x3A);  // 1.125 | 1.25: even is 1.25
  EXPECT_EQ(E4m3FromFloat(1.9375f), 0x40);  // 1.875 | 2: the carry moves the exponent
  EXPECT_EQ(E4m3FromFloat(-1.0625f), 0xB8);
  // Just off a tie rounds to the nearer code.
  EXPECT_EQ(E4m3FromFloat(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(E4m3FromFloat(std::nextafter(1.1875f, 0.0f)), 0x39);
}

TEST(E4m3FromFloat, SubnormalTies) {
  EXPECT_EQ(E4m3FromFloat(1.0f / 1024), 0x00);  // 0 | 2^-9: even is 0
  EXPECT_EQ(E4m3FromFloat(std::nextafter(1.0f / 1024, 1.0f)), 0x01);
  EXPECT_EQ(E4m3FromFloat(3.0f / 1024), 0x02);   // 1 | 2 (x 2^-9): even is 2
  EXPECT_EQ(E4m3FromFloat(5.0f / 1024), 0x02);   // 2 | 3: even is 2
  EXPECT_EQ(E4m3FromFloat(15.0f / 1024), 0x08);  // 7 | 8: 8 is 2^-6, a normal code
  EXPECT_EQ(E4m3FromFloat(-3.0f / 1024), 0x82);
}

TEST(E4m3FromFloat, PastTheTopIsNanAsC10Rounds) {
  EXPECT_EQ(E4m3FromFloat(464.0f), 0x7E);  // 448 | 480: a tie, even is 448
  EXPECT_EQ(E4m3FromFloat(std::nextafter(464.0f, 0.0f)), 0x7E);
  EXPECT_EQ(E4m3FromFloat(std::nextafter(464.0f, 1e9f)), 0x7F);  // rounds into the NaN code
  EXPECT_EQ(E4m3FromFloat(std::nextafter(480.0f, 0.0f)), 0x7F);
  EXPECT_EQ(E4m3FromFloat(480.0f), 0x7F);
  EXPECT_EQ(E4m3FromFloat(1e30f), 0x7F);
  EXPECT_EQ(E4m3FromFloat(-500.0f), 0xFF);
  EXPECT_EQ(E4m3FromFloat(std::numeric_limits<float>::infinity()), 0x7F);
  EXPECT_EQ(E4m3FromFloat(-std::numeric_limits<float>::infinity()), 0xFF);
  EXPECT_EQ(E4m3FromFloat(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(E4m3FromFloat(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(E4m3FromFloat(F(0x7F800001u)), 0x7F);  // a signalling NaN
}

// Every code round-trips, and every midpoint between neighbouring codes goes to the
// even one, while the floats just beside it go to the nearer one.
TEST(E4m3FromFloat, EveryCodeAndEveryMidpoint) {
  for (uint32_t c = 0; c < 0x7E; ++c) {
    const float lo = E4m3ToFloat(static_cast<uint8_t>(c));
    const float hi = E4m3ToFloat(static_cast<uint8_t>(c + 1));
    ASSERT_EQ(E4m3FromFloat(lo), c) << c;
    ASSERT_EQ(E4m3FromFloat(-lo), c | 0x80) << c;
    const float mid = (lo + hi) / 2;  // exact: both have few mantissa bits
    ASSERT_EQ(E4m3FromFloat(mid), (c % 2 == 0) ? c : c + 1) << c;
    ASSERT_EQ(E4m3FromFloat(std::nextafter(mid, 0.0f)), c) << c;
    ASSERT_EQ(E4m3FromFloat(std::nextafter(mid, 1e9f)), c + 1) << c;
  }
  EXPECT_EQ(E4m3FromFloat(E4m3ToFloat(0x7E)), 0x7E);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xFF)));
}

TEST(CeilToUe8m0, PowersOfTwoStayOthersRoundUp) {
  EXPECT_EQ(CeilToUe8m0(1.0f), 1.0f);
  EXPECT_EQ(CeilToUe8m0(std::nextafter(1.0f, 2.0f)), 2.0f);
  EXPECT_EQ(CeilToUe8m0(0.75f), 1.0f);
  EXPECT_EQ(CeilToUe8m0(0x1p-20f), 0x1p-20f);
  EXPECT_EQ(B(CeilToUe8m0(1e-45f)), 1u << 23);  // clamped to the smallest normal
}

TEST(ScaleOfBlock, ZeroBlockGetsTheFloor) {
  // amax 0 is clamped to 1e-4f; numpy: float32(1e-4) / float32(448) = 0x346FACAD.
  const BlockScale s = ScaleOfBlock(0, ScaleFormat::kF32, Multiplier::kReciprocalOfScale);
  EXPECT_EQ(B(s.scale_inv), 0x346FACADu);
  EXPECT_EQ(s.multiplier, 1.0f / s.scale_inv);
  // UE8M0: 1e-4 / 448 = 2.23e-7 lies in (2^-23, 2^-22]: the scale is 2^-22.
  const BlockScale u = ScaleOfBlock(0, ScaleFormat::kUe8m0, Multiplier::kReciprocalOfScale);
  EXPECT_EQ(u.scale_inv, 0x1p-22f);
  EXPECT_EQ(u.multiplier, 0x1p22f);
}

TEST(ScaleOfBlock, TheTwoMultipliersRoundDifferently) {
  // Values from numpy FP32: amax 1.0 (BF16 0x3F80) has scale fl(1/448) = 0x3B124925;
  // fl(1 / scale) = 0x43DFFFFF (447.99997) while fl(fl(1/1) * 448) = 448 exactly.
  const BlockScale a = ScaleOfBlock(0x3F80, ScaleFormat::kF32, Multiplier::kReciprocalOfScale);
  EXPECT_EQ(B(a.scale_inv), 0x3B124925u);
  EXPECT_EQ(B(a.multiplier), 0x43DFFFFFu);
  const BlockScale b = ScaleOfBlock(0x3F80, ScaleFormat::kF32, Multiplier::kMaxOverAmax);
  EXPECT_EQ(B(b.scale_inv), 0x3B124925u);
  EXPECT_EQ(B(b.multiplier), 0x43E00000u);
  // amax 0x38D5 (1.0157e-4): 0x4A869C3E against 0x4A869C3F.
  EXPECT_EQ(B(ScaleOfBlock(0x38D5, ScaleFormat::kF32, Multiplier::kReciprocalOfScale).multiplier),
            0x4A869C3Eu);
  EXPECT_EQ(B(ScaleOfBlock(0x38D5, ScaleFormat::kF32, Multiplier::kMaxOverAmax).multiplier),
            0x4A869C3Fu);
}

TEST(ScaleOfBlock, Ue8m0ScaleIsAPowerOfTwoAtOrAboveAmaxOver448) {
  // amax 448 -> scale exactly 1; amax 450 (BF16 0x43E1) -> 1.0045 -> 2.
  EXPECT_EQ(ScaleOfBlock(0x43E0, ScaleFormat::kUe8m0, Multiplier::kReciprocalOfScale).scale_inv,
            1.0f);
  EXPECT_EQ(ScaleOfBlock(0x43E1, ScaleFormat::kUe8m0, Multiplier::kReciprocalOfScale).scale_inv,
            2.0f);
  EXPECT_EQ(ScaleOfBlock(0x43E1, ScaleFormat::kUe8m0, Multiplier::kReciprocalOfScale).multiplier,
            0.5f);
}

}  // namespace
}  // namespace deltacast::quant
