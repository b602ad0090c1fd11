// The band loops compiled for AVX-512 (F, BW, VL, DQ; CMakeLists sets the flags on
// this file only); fp8_quantizer.cc calls them when the CPU has all four. The same
// source as the baseline and AVX2 builds (fp8_band.h, fp8_element.h): the compiler
// picks the instructions (mask selects, 32 -> 8 bit narrowing), not the arithmetic.
#include "quant/internal/fp8_band.h"
#include "quant/internal/fp8_band_dispatch.h"

namespace deltacast::quant::internal {

void BandAmaxAvx512(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc, int16_t* amax) {
  BandAmaxLoop(in, rows, cols, bc, amax);
}

void QuantizeBandAvx512(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc,
                        const float* multipliers, uint8_t* out) {
  QuantizeBandLoop(in, rows, cols, bc, multipliers, out);
}

int16_t SegmentAmaxAvx512(const uint16_t* in, uint64_t n, int16_t amax) {
  return SegmentAmaxLoop(in, n, amax);
}

void QuantizeSegmentAvx512(const uint16_t* in, uint64_t n, float multiplier, uint8_t* out) {
  QuantizeSegmentLoop(in, n, multiplier, out);
}

}  // namespace deltacast::quant::internal
