// The band loops compiled for AVX2 (CMakeLists sets -mavx2 on this file only);
// fp8_quantizer.cc calls them when the CPU has AVX2.
#include "quant/internal/fp8_band.h"
#include "quant/internal/fp8_band_dispatch.h"

namespace deltacast::quant::internal {

void BandAmaxAvx2(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc, int16_t* amax) {
  BandAmaxLoop(in, rows, cols, bc, amax);
}

void QuantizeBandAvx2(const uint16_t* in, uint64_t rows, uint64_t cols, uint64_t bc,
                      const float* multipliers, uint8_t* out) {
  QuantizeBandLoop(in, rows, cols, bc, multipliers, out);
}

int16_t SegmentAmaxAvx2(const uint16_t* in, uint64_t n, int16_t amax) {
  return SegmentAmaxLoop(in, n, amax);
}

void QuantizeSegmentAvx2(const uint16_t* in, uint64_t n, float multiplier, uint8_t* out) {
  QuantizeSegmentLoop(in, n, multiplier, out);
}

}  // namespace deltacast::quant::internal
