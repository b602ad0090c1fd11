// Helpers of the quantizer tests: schemes by name, random BF16 weights.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "quant/fp8_scheme.h"

namespace deltacast::quant {

inline const Fp8Scheme& Scheme(std::string_view name) {
  const Fp8Scheme* s = FindFp8Scheme(name);
  EXPECT_NE(s, nullptr) << name;
  return *s;
}

inline uint16_t Bf16(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

// Random BF16 weights with a spread of magnitudes, BF16 subnormals and signed zeros.
inline std::vector<uint16_t> RandomWeights(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<uint16_t> out(n);
  for (auto& v : out) {
    const int p = pick(rng);
    if (p == 0) {
      v = static_cast<uint16_t>(rng() & 0x807Fu);  // subnormal or zero, either sign
    } else if (p == 1) {
      v = Bf16(normal(rng) * 1000.0f);
    } else {
      v = Bf16(normal(rng));
    }
  }
  return out;
}

}  // namespace deltacast::quant
