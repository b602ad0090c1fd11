// AVX-512 build of change detection (AVX512F/BW/VBMI2; codec/CMakeLists.txt sets the
// flags for this file only): each 64-byte block is compared, and its changed
// elements' XOR words and positions are compressed out in a few instructions,
// instead of one scalar step per change. Same output as the AVX2 kernel, element
// sizes 2, 4 and 8 (1 is left to it).
//
// One pass, no branch per block: at 3 % of BF16 elements changed about 60 % of
// blocks hold a change, so a test per block mispredicts on a third of them, and a
// second pass over the changed blocks (the kernel before this one) cost a reload
// and a zero-filled resize of the output per stripe. Instead every block of a group
// of four is compressed into small stage arrays that stay in L1 (a block with no
// change writes nothing that counts); only a group with no change at all is skipped,
// which is well predicted at low and at high change rates alike. The stages are
// appended to the output once per stripe.
#include <immintrin.h>

#include <algorithm>

#include "codec/internal/change_detect_kernel.h"

namespace deltacast::codec::internal {
namespace {

constexpr size_t kStripeBlocks = 64;  // blocks staged before one append to the output
constexpr size_t kGroup = 4;          // blocks tested together before any is compressed

template <uint32_t kSize>
inline __mmask64 ElementDiff(__m512i x) {
  if constexpr (kSize == 2) return _mm512_test_epi16_mask(x, x);
  if constexpr (kSize == 4) return _mm512_test_epi32_mask(x, x);
  return _mm512_test_epi64_mask(x, x);
}

// Stage for one stripe: XOR words and element numbers within the stripe (16 bits:
// a stripe holds at most 64 x 32 elements). Every compressed store writes a whole
// register, so each array has a register of room past its last possible change.
template <uint32_t kSize>
struct Stage {
  static constexpr size_t kMaxChanges = kStripeBlocks * (kBlock / kSize);
  alignas(64) std::byte xors[kMaxChanges * kSize + kBlock];
  alignas(64) uint16_t numbers[kMaxChanges + 32];
  alignas(64) uint32_t positions[kMaxChanges + 16];
};

// Compresses one block's changes (x = a ^ b, m = its changed elements) onto the
// stage; `index` numbers the block's first element within the stripe.
template <uint32_t kSize>
inline void StageBlock(__m512i x, __mmask64 m, uint16_t index, std::byte*& xr, uint16_t*& num) {
  const __m512i iota16 =
      _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                       12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i numbers = _mm512_add_epi16(iota16, _mm512_set1_epi16(static_cast<short>(index)));
  const int n = __builtin_popcountll(m);
  // The numbers as 16-bit lanes whatever the element size (a whole register stored:
  // the stage has room past its end).
  _mm512_storeu_si512(num, _mm512_maskz_compress_epi16(static_cast<__mmask32>(m), numbers));
  if constexpr (kSize == 2) {
    _mm512_storeu_si512(xr, _mm512_maskz_compress_epi16(static_cast<__mmask32>(m), x));
  } else if constexpr (kSize == 4) {
    _mm512_storeu_si512(xr, _mm512_maskz_compress_epi32(static_cast<__mmask16>(m), x));
  } else {
    _mm512_storeu_si512(xr, _mm512_maskz_compress_epi64(static_cast<__mmask8>(m), x));
  }
  xr += static_cast<size_t>(n) * kSize;
  num += n;
}

// Appends the stage's `count` changes to `out`, numbering them from `first`.
template <uint32_t kSize>
inline void AppendStage(Stage<kSize>& stage, size_t count, uint32_t first, SparseChanges& out) {
  const __m512i base = _mm512_set1_epi32(static_cast<int>(first));
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i n16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(stage.numbers + i));
    _mm512_storeu_si512(stage.positions + i,
                        _mm512_add_epi32(_mm512_maskz_cvtepu16_epi32(0xFFFF, n16), base));
  }
  if (i < count) {  // masked: the stage past `count` holds nothing of this stripe
    const auto lanes = static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m256i n16 = _mm256_maskz_loadu_epi16(lanes, stage.numbers + i);
    _mm512_mask_storeu_epi32(stage.positions + i, lanes,
                             _mm512_add_epi32(_mm512_maskz_cvtepu16_epi32(lanes, n16), base));
  }
  out.positions.insert(out.positions.end(), stage.positions, stage.positions + count);
  out.xors.insert(out.xors.end(), stage.xors, stage.xors + count * kSize);
}

// Appends to `out`, numbering elements from `first`.
template <uint32_t kSize>
void FindChangesCompress(ByteSpan base, ByteSpan target, uint32_t first, SparseChanges& out) {
  constexpr uint32_t kPerBlock = kBlock / kSize;  // elements per block
  static_assert(kPerBlock <= 32);
  constexpr size_t kPrefetch = 4 * kStripeBlocks * kBlock;
  const std::byte* a = base.data();
  const std::byte* b = target.data();
  const size_t full = base.size() / kBlock * kBlock;
  Stage<kSize> stage;
  for (size_t stripe = 0; stripe < full; stripe += kStripeBlocks * kBlock) {
    const size_t blocks = std::min(kStripeBlocks, (full - stripe) / kBlock);
    std::byte* xr = stage.xors;
    uint16_t* num = stage.numbers;
    size_t k = 0;
    for (; k + kGroup <= blocks; k += kGroup) {
      const std::byte* pa = a + stripe + k * kBlock;
      const std::byte* pb = b + stripe + k * kBlock;
      // Some stripes ahead: for versions read from memory rather than from a tile
      // in L2 (the hardware prefetcher stops at page ends).
      for (size_t g = 0; g < kGroup; ++g) {
        _mm_prefetch(reinterpret_cast<const char*>(pa + g * kBlock + kPrefetch), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(pb + g * kBlock + kPrefetch), _MM_HINT_T0);
      }
      __m512i x[kGroup];
      __mmask64 m[kGroup];
      for (size_t g = 0; g < kGroup; ++g) {
        x[g] = _mm512_xor_si512(_mm512_loadu_si512(pa + g * kBlock),
                                _mm512_loadu_si512(pb + g * kBlock));
        m[g] = ElementDiff<kSize>(x[g]);
      }
      if ((m[0] | m[1] | m[2] | m[3]) == 0) continue;
      for (size_t g = 0; g < kGroup; ++g) {
        StageBlock<kSize>(x[g], m[g], static_cast<uint16_t>((k + g) * kPerBlock), xr, num);
      }
    }
    for (; k < blocks; ++k) {
      const size_t off = stripe + k * kBlock;
      const __m512i x = _mm512_xor_si512(_mm512_loadu_si512(a + off), _mm512_loadu_si512(b + off));
      StageBlock<kSize>(x, ElementDiff<kSize>(x), static_cast<uint16_t>(k * kPerBlock), xr, num);
    }
    const size_t count = static_cast<size_t>(num - stage.numbers);
    if (count != 0) AppendStage(stage, count, first + static_cast<uint32_t>(stripe / kSize), out);
  }
  for (size_t byte = full; byte < base.size(); byte += kSize) {
    if (std::memcmp(a + byte, b + byte, kSize) == 0) continue;
    out.positions.push_back(first + static_cast<uint32_t>(byte / kSize));
    out.xors.resize(out.xors.size() + kSize);
    XorWord<kSize>(a + byte, b + byte, out.xors.data() + out.xors.size() - kSize);
  }
}

}  // namespace

// False when the element size is one this kernel leaves to AVX2.
bool FindChangesAvx512(ByteSpan base, ByteSpan target, uint32_t element_size, uint32_t first,
                       SparseChanges& out) {
  switch (element_size) {
    case 2:
      FindChangesCompress<2>(base, target, first, out);
      return true;
    case 4:
      FindChangesCompress<4>(base, target, first, out);
      return true;
    case 8:
      FindChangesCompress<8>(base, target, first, out);
      return true;
    default:
      return false;
  }
}

}  // namespace deltacast::codec::internal
