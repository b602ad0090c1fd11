#include "codec/change_detect.h"

#include <cassert>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace deltacast::codec {
namespace {

constexpr size_t kBlock = 64;  // bytes compared per step: one bit of the mask per byte

// Bit i set when byte i of the 64-byte blocks differs.
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t DiffMaskAvx2(const std::byte* a, const std::byte* b) {
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
  const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
  const uint32_t eq0 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a0, b0)));
  const uint32_t eq1 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a1, b1)));
  return ~(static_cast<uint64_t>(eq1) << 32 | eq0);
}
#endif

uint64_t DiffMaskScalar(const std::byte* a, const std::byte* b) {
  uint64_t mask = 0;
  for (size_t i = 0; i < kBlock; ++i) mask |= static_cast<uint64_t>(a[i] != b[i]) << i;
  return mask;
}

// Folds a per-byte mask to one bit per element, at the element's lowest byte.
inline uint64_t ElementMask(uint64_t bytes, uint32_t element_size) {
  switch (element_size) {
    case 1:
      return bytes;
    case 2:
      return (bytes | bytes >> 1) & 0x5555555555555555ull;
    case 4:
      bytes |= bytes >> 1;
      bytes |= bytes >> 2;
      return bytes & 0x1111111111111111ull;
    default:
      bytes |= bytes >> 1;
      bytes |= bytes >> 2;
      bytes |= bytes >> 4;
      return bytes & 0x0101010101010101ull;
  }
}

template <uint64_t (*DiffMask)(const std::byte*, const std::byte*)>
void FindChangesWith(ByteSpan base, ByteSpan target, uint32_t element_size, SparseChanges& out) {
  const std::byte* a = base.data();
  const std::byte* b = target.data();
  const size_t full = base.size() / kBlock * kBlock;
  const int shift = __builtin_ctz(element_size);
  for (size_t off = 0; off < full; off += kBlock) {
    uint64_t mask = DiffMask(a + off, b + off);
    if (mask == 0) continue;
    mask = ElementMask(mask, element_size);
    while (mask != 0) {
      const size_t byte = off + static_cast<size_t>(__builtin_ctzll(mask));
      mask &= mask - 1;
      out.positions.push_back(static_cast<uint32_t>(byte >> shift));
      const size_t at = out.xors.size();
      out.xors.resize(at + element_size);
      for (uint32_t k = 0; k < element_size; ++k) out.xors[at + k] = a[byte + k] ^ b[byte + k];
    }
  }
  for (size_t byte = full; byte < base.size(); byte += element_size) {
    if (std::memcmp(a + byte, b + byte, element_size) == 0) continue;
    out.positions.push_back(static_cast<uint32_t>(byte >> shift));
    for (uint32_t k = 0; k < element_size; ++k) out.xors.push_back(a[byte + k] ^ b[byte + k]);
  }
}

bool HasAvx2() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

}  // namespace

void FindChanges(ByteSpan base, ByteSpan target, uint32_t element_size, SparseChanges& out) {
  assert(base.size() == target.size() && base.size() % element_size == 0);
  out.element_size = element_size;
  out.clear();
#if defined(__x86_64__)
  if (HasAvx2()) return FindChangesWith<DiffMaskAvx2>(base, target, element_size, out);
#endif
  FindChangesWith<DiffMaskScalar>(base, target, element_size, out);
}

}  // namespace deltacast::codec
