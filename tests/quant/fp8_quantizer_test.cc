// The CPU block quantizer (and, where a GPU is present, the CUDA kernel) on whole
// tensors: block scales from each block's own amax, edge blocks cut short, zero
// blocks, refusals that name the element. Byte-for-byte agreement with the
// independent Python reference is tests/python/test_fp8_reference.py's job.
#include "quant/fp8_quantizer.h"

#include <gtest/gtest.h>

#include "tests/quant/fp8_test_util.h"

namespace deltacast::quant {
namespace {

TEST(Fp8Schemes, TableIsConsistent) {
  ASSERT_FALSE(Fp8Schemes().empty());
  EXPECT_EQ(Fp8Schemes().front().name, "fp8_e4m3_block128");
  for (const Fp8Scheme& s : Fp8Schemes()) {
    EXPECT_EQ(FindFp8Scheme(s.name), &s);
    EXPECT_FALSE(s.reference.empty()) << s.name;
    // A power-of-two scale only makes sense with the multiplier that is its inverse.
    if (s.scale_format == ScaleFormat::kUe8m0) {
      EXPECT_EQ(s.multiplier, Multiplier::kReciprocalOfScale) << s.name;
      EXPECT_EQ(s.scale_fmt, "ue8m0") << s.name;
    }
  }
  EXPECT_EQ(FindFp8Scheme("fp8_e4m3_block64"), nullptr);
  EXPECT_EQ(Scheme("fp8_e4m3_block128").ScaleShape(130, 200), (std::vector<uint64_t>{2, 2}));
  EXPECT_EQ(Scheme("fp8_e4m3_block128").ScaleShape(128, 256), (std::vector<uint64_t>{1, 2}));
}

// Each block's scale comes from its own elements only, edge blocks included.
TEST(QuantizeFp8, EdgeBlocksUseTheirOwnAmax) {
  const uint64_t rows = 130, cols = 200;  // blocks: 128 x 128, 128 x 72, 2 x 128, 2 x 72
  std::vector<uint16_t> x(rows * cols, Bf16(0.5f));
  x[0 * cols + 0] = Bf16(-3.0f);       // block (0, 0)
  x[5 * cols + 150] = Bf16(7.0f);      // block (0, 1)
  x[129 * cols + 3] = Bf16(-0.25f);    // block (1, 0): its largest |x| is 0.5 anyway
  x[128 * cols + 199] = Bf16(100.0f);  // block (1, 1), the last element of the tensor
  ASSERT_TRUE(CheckFinite("w", x, rows, cols).ok());
  const Fp8Scheme& scheme = Scheme("fp8_e4m3_block128");
  auto q = QuantizeFp8(scheme, "w", x, rows, cols);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->scale_rows, 2u);
  ASSERT_EQ(q->scale_cols, 2u);
  EXPECT_EQ(q->scale_inv[0], 3.0f / 448.0f);
  EXPECT_EQ(q->scale_inv[1], 7.0f / 448.0f);
  EXPECT_EQ(q->scale_inv[2], 0.5f / 448.0f);
  EXPECT_EQ(q->scale_inv[3], 100.0f / 448.0f);
  // The amax element of each block lands on (or next to) 448.
  EXPECT_EQ(q->weight[0], 0xFE);
  EXPECT_EQ(q->weight[5 * cols + 150], 0x7E);
  EXPECT_EQ(q->weight[128 * cols + 199], 0x7E);
  // Everything else is the element arithmetic with its block's multiplier.
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < cols; ++c) {
      const float scale = q->scale_inv[(r / 128) * 2 + c / 128];
      ASSERT_EQ(q->weight[r * cols + c], QuantizeElement(x[r * cols + c], 1.0f / scale))
          << r << "," << c;
    }
  }
}

TEST(QuantizeFp8, ZeroBlocksKeepSignedZerosAndGetTheFloorScale) {
  const uint64_t rows = 3, cols = 5;
  std::vector<uint16_t> x(rows * cols, 0x0000);
  x[4] = 0x8000;  // -0.0
  x[7] = 0x0001;  // the smallest BF16 subnormal: far below the floor's E4M3 step
  x[8] = 0x8001;
  for (const Fp8Scheme& scheme : Fp8Schemes()) {
    auto q = QuantizeFp8(scheme, "z", x, rows, cols);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_EQ(q->scale_inv.size(), 1u);
    EXPECT_EQ(q->scale_inv[0], ScaleOfBlock(0, scheme.scale_format, scheme.multiplier).scale_inv);
    for (uint64_t i = 0; i < rows * cols; ++i) {
      EXPECT_EQ(q->weight[i], (x[i] & 0x8000) ? 0x80 : 0x00) << scheme.name << " " << i;
    }
  }
}

TEST(QuantizeFp8, NanAndInfAreRefusedNamingTheElement) {
  const uint64_t rows = 200, cols = 300;
  const Fp8Scheme& scheme = Scheme("fp8_e4m3_block128");
  struct Case {
    uint16_t bits;
    const char* word;
  };
  for (const Case c :
       {Case{0x7FC0, "NaN"}, Case{0xFFC1, "NaN"}, Case{0x7F80, "Inf"}, Case{0xFF80, "-Inf"}}) {
    std::vector<uint16_t> x = RandomWeights(rows * cols, 1);
    x[150 * cols + 299] = c.bits;
    auto q = QuantizeFp8(scheme, "model.layers.0.mlp.up_proj.weight", x, rows, cols);
    ASSERT_FALSE(q.ok());
    EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
    const std::string m = q.status().message();
    EXPECT_NE(m.find("'model.layers.0.mlp.up_proj.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("[150, 299]"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string(" is ") + c.word + " "), std::string::npos) << m;
  }
}

TEST(QuantizeFp8, SizesThatDoNotMatchAreRefused) {
  const Fp8Scheme& scheme = Scheme("fp8_e4m3_block128");
  std::vector<uint16_t> x(10);
  std::vector<uint8_t> w(10);
  std::vector<float> s(1);
  EXPECT_EQ(QuantizeFp8(scheme, "t", x, 2, 6, w, s).code(), StatusCode::kInvalidArgument);
  std::vector<float> two(2);
  EXPECT_EQ(QuantizeFp8(scheme, "t", x, 2, 5, w, two).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(QuantizeFp8(scheme, "t", x, 2, 5, w, s).ok());
}

constexpr Fp8CpuLoops kVectorPaths[] = {Fp8CpuLoops::kAvx2, Fp8CpuLoops::kAvx512};

// The AVX2 and AVX-512 loops (where the CPU has them) and the baseline loops write
// the same bytes.
TEST(QuantizeFp8, VectorPathsAgree) {
  const uint64_t rows = 257, cols = 389;
  const std::vector<uint16_t> x = RandomWeights(rows * cols, 7);
  for (const Fp8Scheme& scheme : Fp8Schemes()) {
    ForceFp8BaselinePath(true);
    auto base = QuantizeFp8(scheme, "t", x, rows, cols);
    ASSERT_TRUE(base.ok());
    for (const Fp8CpuLoops path : kVectorPaths) {
      LimitFp8CpuPath(path);
      auto fast = QuantizeFp8(scheme, "t", x, rows, cols);
      ASSERT_TRUE(fast.ok());
      EXPECT_EQ(base->weight, fast->weight) << scheme.name << " on " << Fp8CpuPath();
      EXPECT_EQ(base->scale_inv, fast->scale_inv) << scheme.name << " on " << Fp8CpuPath();
    }
  }
  ForceFp8BaselinePath(false);
}

// A producer's pieces of blocks (relay/producers/fp8_share.h): the piece loops, on both
// paths, give the element functions' amax and codes, whatever the piece's length.
TEST(QuantizeFp8, PieceLoopsMatchTheElementCode) {
  const std::vector<uint16_t> x = RandomWeights(1000, 11);
  for (const Fp8CpuLoops path :
       {Fp8CpuLoops::kBaseline, Fp8CpuLoops::kAvx2, Fp8CpuLoops::kAvx512}) {
    LimitFp8CpuPath(path);
    for (const size_t n :
         {size_t{1}, size_t{7}, size_t{33}, size_t{64}, size_t{65}, size_t{128}, size_t{1000}}) {
      const std::span<const uint16_t> piece(x.data(), n);
      uint16_t want = 3;
      for (uint16_t v : piece) want = std::max<uint16_t>(want, Bf16AbsBits(v));
      EXPECT_EQ(Fp8PieceAmax(piece, 3), want) << n << " on " << Fp8CpuPath();
      const float m =
          ScaleOfBlock(want, ScaleFormat::kF32, Multiplier::kReciprocalOfScale).multiplier;
      std::vector<uint8_t> got(n);
      QuantizeFp8Piece(piece, m, got);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], QuantizeElement(x[i], m))
            << "element " << i << " of " << n << " on " << Fp8CpuPath();
      }
    }
  }
  ForceFp8BaselinePath(false);
}

}  // namespace
}  // namespace deltacast::quant
