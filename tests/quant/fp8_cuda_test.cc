// The CUDA quantizer against the CPU one, byte for byte (ctest label gpu; reported
// as skipped without a device).
#include "quant/fp8_cuda.h"

#include <gtest/gtest.h>

#include "quant/fp8_quantizer.h"
#include "tests/quant/fp8_test_util.h"

namespace deltacast::quant {
namespace {

// The CUDA kernel writes the CPU's bytes (label gpu; skipped without a device).
TEST(QuantizeFp8Cuda, MatchesTheCpu) {
  if (!Fp8CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  for (const auto& [rows, cols] :
       {std::pair<uint64_t, uint64_t>{257, 389}, {128, 128}, {1, 7}, {1024, 2048}}) {
    const std::vector<uint16_t> x = RandomWeights(rows * cols, static_cast<uint32_t>(rows));
    for (const Fp8Scheme& scheme : Fp8Schemes()) {
      auto cpu = QuantizeFp8(scheme, "t", x, rows, cols);
      ASSERT_TRUE(cpu.ok());
      std::vector<uint8_t> w(rows * cols);
      std::vector<float> s(cpu->scale_inv.size());
      const Status st = QuantizeFp8Cuda(scheme, "t", x, rows, cols, w, s);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(w, cpu->weight) << scheme.name << " " << rows << "x" << cols;
      EXPECT_EQ(s, cpu->scale_inv) << scheme.name;
    }
  }
  std::vector<uint16_t> bad(300 * 300, Bf16(1.0f));
  bad[299 * 300 + 1] = 0x7FC0;
  std::vector<uint8_t> w(bad.size());
  std::vector<float> s(9);
  const Status st = QuantizeFp8Cuda(Scheme("fp8_e4m3_block128"), "t", bad, 300, 300, w, s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("[299, 1]"), std::string::npos) << st.ToString();
}

TEST(QuantizeFp8Cuda, SaysUnavailableWithoutADevice) {
  if (Fp8CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  std::vector<uint16_t> x(4);
  std::vector<uint8_t> w(4);
  std::vector<float> s(1);
  EXPECT_EQ(QuantizeFp8Cuda(Scheme("fp8_e4m3_block128"), "t", x, 2, 2, w, s).code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace deltacast::quant
