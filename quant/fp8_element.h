// The element-level arithmetic of block-scaled FP8 quantization (docs/fp8.md),
// written once for the host and the device: BF16 -> FP32, a block's scale and
// multiplier from its amax, and FP32 -> E4M3FN with round-to-nearest-even, as
// torch's c10::Float8_e4m3fn conversion rounds. The CPU quantizer
// (fp8_quantizer.cc) and the CUDA kernel (fp8_cuda.cu) both call these functions,
// so they produce the same bytes, and the tests check the logic on the host.
//
// No STL, no tables, no intrinsics beyond a bit cast; branch-free selects, so the
// host loops that call them vectorise. FP32 arithmetic must stay IEEE: nothing here
// is compiled with fast-math (no reciprocal approximations, no flush-to-zero).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/gf128.h"  // DELTACAST_HD

namespace deltacast::quant {

inline constexpr float kE4m3Max = 448.0f;
// The reference clamps a block's amax to at least this (torch's clamp(min=1e-4) on
// an FP32 tensor: the double 1e-4 rounded to FP32), so an all-zero block gets a
// finite scale.
inline constexpr float kAmaxFloor = 1e-4f;
// E4M3FN has no infinity; 0x7F (and 0xFF) is its only NaN.
inline constexpr uint8_t kE4m3Nan = 0x7F;

// How a block's FP32 scale is stored.
enum class ScaleFormat : uint8_t {
  kF32,    // amax / 448, any FP32 value
  kUe8m0,  // amax / 448 rounded up to a power of two (an 8-bit exponent, no mantissa)
};

// How the multiplier that takes a block's values to the E4M3 range is formed. The
// two are not bit-identical: each rounds its own way (docs/fp8.md).
enum class Multiplier : uint8_t {
  kReciprocalOfScale,  // fl(1 / scale): DeepGEMM's x * (1.0 / sf)
  kMaxOverAmax,        // fl(fl(1 / amax) * 448): x * (448.0 / amax) as torch evaluates it
};

DELTACAST_HD inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

DELTACAST_HD inline float FloatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// BF16 widens to FP32 exactly.
DELTACAST_HD inline float Bf16ToFloat(uint16_t b) { return FloatFromBits(uint32_t{b} << 16); }

// |x| of a BF16 as an integer: for finite values, integer order is value order, so
// a block's amax is an integer max. At or above kBf16NonFinite: an Inf or a NaN.
DELTACAST_HD inline uint16_t Bf16AbsBits(uint16_t b) { return static_cast<uint16_t>(b & 0x7FFFu); }
inline constexpr uint16_t kBf16NonFinite = 0x7F80;

// FP32 -> E4M3FN bits, round to nearest, ties to even. Matches c10's
// fp8e4m3fn_from_fp32_value on every input: |f| >= 480 (the first value past the
// top code's rounding range), Inf and NaN give NaN (0x7F) with f's sign, as do
// values in (464, 480), which round up into the NaN code; 464 itself is a tie and
// goes to 448. No saturation: the quantizer never produces more than 448 * (1 + 2^-22).
DELTACAST_HD inline uint8_t E4m3FromFloat(float f) {
  const uint32_t bits = FloatBits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t mag = bits & 0x7FFFFFFFu;
  // Below 2^-6 (E4M3's smallest normal): E4M3 steps by 2^-9 there, and FP32's step at
  // 2^14 is 2^-9 too, so adding 2^14 rounds |f| to that grid (to nearest even, in the
  // FPU) and leaves the step count in the low mantissa bits: 0..8 (8 encodes 2^-6).
  const uint32_t subnormal = FloatBits(FloatFromBits(mag) + 16384.0f) - 0x46800000u;
  // Normal: rebias the exponent (127 -> 7) and round the 20 dropped mantissa bits to
  // nearest even; a carry out of the mantissa moves to the next exponent, as it should.
  const uint32_t odd = (mag >> 20) & 1u;
  const uint32_t normal = (mag + 0xC407FFFFu + odd) >> 20;  // 0xC4000000 = (7 - 127) << 23
  uint32_t code = mag < 0x3C800000u ? subnormal : normal;   // 0x3C800000 = 2^-6
  code = mag >= 0x43F00000u ? uint32_t{kE4m3Nan} : code;    // 0x43F00000 = 480
  return static_cast<uint8_t>(code | sign);
}

// E4M3FN bits -> FP32 (exact), for tests and dequantization.
DELTACAST_HD inline float E4m3ToFloat(uint8_t code) {
  const uint32_t sign = uint32_t{code & 0x80u} << 24;
  const uint32_t exp = (code >> 3) & 0xFu, man = code & 0x7u;
  if (exp == 0xF && man == 0x7) return FloatFromBits(sign | 0x7FC00000u);
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 512.0f);  // man * 2^-9, exact
    return sign ? -v : v;
  }
  return FloatFromBits(sign | ((exp + 120u) << 23) | (man << 20));
}

// A positive finite FP32 rounded up to a power of two, from its bits (DeepGEMM's
// ceil_to_ue8m0): the biased exponent, plus one if any mantissa bit is set, clamped
// to [1, 254] so the result is a normal, finite float.
DELTACAST_HD inline float CeilToUe8m0(float s) {
  const uint32_t bits = FloatBits(s) & 0x7FFFFFFFu;
  uint32_t exp = (bits >> 23) + ((bits & 0x7FFFFFu) != 0 ? 1u : 0u);
  exp = exp < 1u ? 1u : (exp > 254u ? 254u : exp);
  return FloatFromBits(exp << 23);
}

struct BlockScale {
  float scale_inv = 0;   // what the checkpoint stores (weight_scale_inv): dequant = q * it
  float multiplier = 0;  // what each element is multiplied by before the cast
};

// The scale of a block whose largest |x| has BF16 bits `amax_bits` (finite).
DELTACAST_HD inline BlockScale ScaleOfBlock(uint16_t amax_bits, ScaleFormat format,
                                            Multiplier multiplier) {
  float amax = Bf16ToFloat(amax_bits);
  amax = amax < kAmaxFloor ? kAmaxFloor : amax;
  float scale = amax / kE4m3Max;
  if (format == ScaleFormat::kUe8m0) scale = CeilToUe8m0(scale);
  BlockScale out;
  out.scale_inv = scale;
  // torch evaluates `c / t` for a Python scalar c as t.reciprocal() * c: two roundings.
  out.multiplier =
      multiplier == Multiplier::kReciprocalOfScale ? 1.0f / scale : (1.0f / amax) * kE4m3Max;
  return out;
}

// One element: the BF16 value times the block's multiplier, in FP32, cast to E4M3.
DELTACAST_HD inline uint8_t QuantizeElement(uint16_t bf16, float multiplier) {
  return E4m3FromFloat(Bf16ToFloat(bf16) * multiplier);
}

}  // namespace deltacast::quant
