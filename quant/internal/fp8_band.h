// The CPU quantizer's two loops over one band of block rows, written as plain loops
// that the compiler vectorises. Included by fp8_quantizer.cc (baseline x86-64),
// fp8_band_avx2.cc (-mavx2) and fp8_band_avx512.cc (-mavx512f/bw/vl/dq), which wrap
// them under their own names; hence static.
//
// Thread safety: pure functions over caller buffers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "quant/fp8_element.h"

namespace deltacast::quant::internal {

// amax[j] = max over the band's rows of |x| (as BF16 bits) in block column j, for
// `cols` columns in blocks of `bc`. |x| bits fit in 15 bits, so a signed 16-bit max
// (one SSE2 instruction) orders them. amax must hold ceil(cols / bc) zeros on entry.
static inline void BandAmaxLoop(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc,
                                int16_t* amax) {
  for (uint64_t r = 0; r < rows; ++r) {
    const uint16_t* row = in + r * cols;
    for (uint64_t j = 0, c0 = 0; c0 < cols; ++j, c0 += bc) {
      const uint64_t n = std::min(bc, cols - c0);
      int16_t m = amax[j];
      for (uint64_t c = 0; c < n; ++c) {
        m = std::max(m, static_cast<int16_t>(Bf16AbsBits(row[c0 + c])));
      }
      amax[j] = m;
    }
  }
}

// out = E4M3(x * multiplier of x's block column) over the band's rows.
static inline void QuantizeBandLoop(const uint16_t* __restrict in, uint64_t rows, uint64_t cols,
                                    uint64_t bc, const float* multipliers,
                                    uint8_t* __restrict out) {
  for (uint64_t r = 0; r < rows; ++r) {
    const uint16_t* row = in + r * cols;
    uint8_t* dst = out + r * cols;
    for (uint64_t j = 0, c0 = 0; c0 < cols; ++j, c0 += bc) {
      const uint64_t n = std::min(bc, cols - c0);
      const float m = multipliers[j];
      const uint16_t* x = row + c0;
      uint8_t* q = dst + c0;
      for (uint64_t c = 0; c < n; ++c) q[c] = QuantizeElement(x[c], m);
    }
  }
}

// max(amax, |x| bits) over one contiguous piece of a block row (a producer's
// piece of a block: relay/producers/fp8_share.h).
static inline int16_t SegmentAmaxLoop(const uint16_t* in, uint64_t n, int16_t amax) {
  for (uint64_t c = 0; c < n; ++c) amax = std::max(amax, static_cast<int16_t>(Bf16AbsBits(in[c])));
  return amax;
}

// out = E4M3(x * multiplier) over one contiguous piece of a block row.
static inline void QuantizeSegmentLoop(const uint16_t* __restrict in, uint64_t n, float multiplier,
                                       uint8_t* __restrict out) {
  for (uint64_t c = 0; c < n; ++c) out[c] = QuantizeElement(in[c], multiplier);
}

}  // namespace deltacast::quant::internal
