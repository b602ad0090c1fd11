// The sparse-mask loop behind HashSparseMask, written once over a small backend (the
// portable integer multiplies, or PCLMULQDQ) that supplies the products. Included
// only by partition_hash.cc and gf128_x86.cc.
//
// Changed elements are taken last to first and grouped into windows of 256 blocks
// (4 KiB). Inside a window each touched 64-bit word (the XOR of the changed elements
// in it) is multiplied by its power from a table (alpha^j, or x^64 * alpha^j for the
// high word of block j) and the 192-bit products are summed unreduced: no chain, two
// carry-less multiplies per touched word. Each window is reduced once and joins a
// Horner chain over the touched windows with the gap's power, alpha^(256 * gap).
// Windows with no change cost nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/gf128.h"
#include "common/internal/gf128_kernels.h"

namespace deltacast::gf128::internal {

inline constexpr uint64_t kMaskWindowBytes = 256 * 16;

// alpha^k from the tables: at most three multiplications below 2^32.
template <class B>
inline Gf128 AlphaPowWith(const Powers& pw, uint64_t k) {
  Gf128 r = pw.alpha[0][k & 255];
  for (int l = 1; l < 4; ++l) {
    const uint64_t digit = (k >> (8 * l)) & 255;
    if (digit != 0) r = B::Mul(r, pw.alpha[l][digit]);
  }
  if (k >> 32) {
    Gf128 base = pw.alpha_2_32;
    for (uint64_t rest = k >> 32; rest != 0; rest >>= 1) {
      if (rest & 1) r = B::Mul(r, base);
      base = B::Mul(base, base);
    }
  }
  return r;
}

// A little-endian word of 1, 2, 4 or 8 bytes, without a call to memcpy.
inline uint64_t LoadWord(const std::byte* p, uint32_t size) {
  switch (size) {
    case 1:
      return static_cast<uint8_t>(p[0]);
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

// Sum over the changes of (word placed in its block b) * alpha^(b+1). element_size
// is 1, 2, 4 or 8, so an element never straddles a 64-bit word.
template <class B>
inline Gf128 MaskKernel(const uint32_t* positions, size_t n, const std::byte* words,
                        uint32_t element_size) {
  const Powers& pw = GetPowers();
  Gf128 chain, extra;
  uint64_t chain_window = ~0ull;
  size_t i = n;
  while (i > 0) {
    const uint64_t window = uint64_t{positions[i - 1]} * element_size / kMaskWindowBytes;
    const uint64_t first_word = window * (kMaskWindowBytes / 8);
    typename B::Acc acc = B::Zero();
    uint64_t word_index = ~0ull, value = 0;
    for (; i > 0; --i) {
      const uint64_t byte = uint64_t{positions[i - 1]} * element_size;
      if (byte / kMaskWindowBytes != window) break;
      uint64_t w = LoadWord(words + (i - 1) * element_size, element_size) << (8 * (byte % 8));
      if (byte / 8 != word_index) {
        if (word_index != ~0ull) B::Accumulate(acc, value, pw.qword[word_index - first_word]);
        word_index = byte / 8;
        value = w;
      } else {
        value ^= w;
      }
    }
    B::Accumulate(acc, value, pw.qword[word_index - first_word]);
    const Gf128 sum = B::Finish(acc);  // sum of V_b * alpha^(b - 256 * window)
    if (chain_window == ~0ull) {
      chain = sum;
      chain_window = window;
    } else if (window < chain_window) {
      const uint64_t gap = chain_window - window;
      const Gf128 step = gap < 256 ? pw.alpha[1][gap] : AlphaPowWith<B>(pw, 256 * gap);
      chain = Xor(B::Mul(chain, step), sum);
      chain_window = window;
    } else {  // positions out of order: this window on its own
      extra = Xor(extra, B::Mul(sum, AlphaPowWith<B>(pw, 256 * window + 1)));
    }
  }
  if (chain_window == ~0ull) return {};
  return Xor(B::Mul(chain, AlphaPowWith<B>(pw, 256 * chain_window + 1)), extra);
}

}  // namespace deltacast::gf128::internal
