#include "layout/values.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace deltacast::layout {
namespace {

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

float Load(DType d, const std::byte* p) {
  switch (d) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return std::bit_cast<float>(uint32_t{h} << 16);
    }
    default: {  // F16
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t sign = uint32_t{h & 0x8000u} << 16;
      const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
      if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
      if (exp == 0) {
        const float v = std::ldexp(static_cast<float>(man), -24);
        return sign ? -v : v;
      }
      return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
    }
  }
}

uint16_t ToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

uint16_t ToF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {                        // below the smallest normal half
    // Round-to-nearest-even at 2^-24 granularity.
    const float a = std::bit_cast<float>(abs);
    const float scaled = a * 16777216.0f;  // exact: a power of two
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

void Store(DType d, float f, std::byte* p) {
  if (d == DType::kF32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = d == DType::kBF16 ? ToBf16(f) : ToF16(f);
  std::memcpy(p, &h, 2);
}

}  // namespace

bool TransformSupported(Value value, DType from, DType to) {
  if (value == Value::kBits) return from == to;
  return IsFloat(from) && IsFloat(to);
}

void TransformValues(Value value, DType from, const std::byte* in, DType to, std::byte* out,
                     size_t n) {
  const size_t a = ElementSize(from), b = ElementSize(to);
  if (value == Value::kBits) {
    std::memcpy(out, in, n * a);
    return;
  }
  // No "+ 0" for a cast: -0.0 + 0.0 is +0.0, and -0.0 must survive.
  if (value == Value::kCast) {
    for (size_t i = 0; i < n; ++i) Store(to, Load(from, in + i * a), out + i * b);
    return;
  }
  for (size_t i = 0; i < n; ++i) Store(to, Load(from, in + i * a) + 1.0f, out + i * b);
}

}  // namespace deltacast::layout
