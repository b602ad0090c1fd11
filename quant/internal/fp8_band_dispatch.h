// The vector builds of fp8_band.h's loops: AVX2 (fp8_band_avx2.cc) and AVX-512
// (fp8_band_avx512.cc); call each only when the CPU has its instructions
// (fp8_quantizer.cc chooses).
#pragma once

#include <cstdint>

namespace deltacast::quant::internal {

void BandAmaxAvx2(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc, int16_t* amax);
void QuantizeBandAvx2(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc,
                      const float* multipliers, uint8_t* out);
int16_t SegmentAmaxAvx2(const uint16_t* in, uint64_t n, int16_t amax);
void QuantizeSegmentAvx2(const uint16_t* in, uint64_t n, float multiplier, uint8_t* out);

void BandAmaxAvx512(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc, int16_t* amax);
void QuantizeBandAvx512(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc,
                        const float* multipliers, uint8_t* out);
int16_t SegmentAmaxAvx512(const uint16_t* in, uint64_t n, int16_t amax);
void QuantizeSegmentAvx512(const uint16_t* in, uint64_t n, float multiplier, uint8_t* out);

}  // namespace deltacast::quant::internal
