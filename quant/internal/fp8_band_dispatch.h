// The AVX2 build of fp8_band.h's loops (fp8_band_avx2.cc); call only when the CPU
// has AVX2.
#pragma once

#include <cstdint>

namespace deltacast::quant::internal {

void BandAmaxAvx2(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc, int16_t* amax);
void QuantizeBandAvx2(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc,
                      const float* multipliers, uint8_t* out);

int16_t SegmentAmaxAvx2(const uint16_t* in, uint64_t n, int16_t amax);
void QuantizeSegmentAvx2(const uint16_t* in, uint64_t n, float multiplier, uint8_t* out);

}  // namespace deltacast::quant::internal
