// The change-detection kernel, shared by the portable and the AVX2 translation
// units (change_detect.cc, change_detect_avx2.cc). DiffMask returns bit i set when
// byte i of two 64-byte blocks differs. Include only from those two files: the AVX2
// one is compiled with -mavx2 -mpopcnt so the whole kernel inlines with them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "codec/changes.h"
#include "common/bytes.h"

namespace deltacast::codec::internal {

inline constexpr size_t kBlock = 64;  // bytes compared per step: one mask bit per byte

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

// Stores the XOR of one element of `a` and `b` at `out`.
template <uint32_t kSize>
inline void XorWord(const std::byte* a, const std::byte* b, std::byte* out) {
  using Word = std::conditional_t<
      kSize == 1, uint8_t,
      std::conditional_t<kSize == 2, uint16_t, std::conditional_t<kSize == 4, uint32_t, uint64_t>>>;
  Word x, y;
  std::memcpy(&x, a, kSize);
  std::memcpy(&y, b, kSize);
  x ^= y;
  std::memcpy(out, &x, kSize);
}

// Works a stripe of blocks at a time: masks first, then one resize of the output for
// the stripe's changes, then a fill through raw pointers. Growing the vectors per
// change instead costs more than the comparison itself.
// Appends to `out`, numbering elements from `first`.
template <uint64_t (*DiffMask)(const std::byte*, const std::byte*), uint32_t kSize>
inline void FindChangesWith(ByteSpan base, ByteSpan target, uint32_t first, SparseChanges& out) {
  constexpr size_t kStripeBlocks = 64;
  constexpr int kShift = __builtin_ctz(kSize);
  const std::byte* a = base.data();
  const std::byte* b = target.data();
  const size_t full = base.size() / kBlock * kBlock;
  uint64_t masks[kStripeBlocks];
  for (size_t stripe = 0; stripe < full; stripe += kStripeBlocks * kBlock) {
    const size_t blocks = std::min(kStripeBlocks, (full - stripe) / kBlock);
    size_t count = 0;
    for (size_t k = 0; k < blocks; ++k) {
      const uint64_t m = DiffMask(a + stripe + k * kBlock, b + stripe + k * kBlock);
      masks[k] = m == 0 ? 0 : ElementMask(m, kSize);
      count += static_cast<size_t>(__builtin_popcountll(masks[k]));
    }
    if (count == 0) continue;
    // kUnrolled slots of slack let every block write its first kUnrolled changes
    // unconditionally: most blocks hold zero or one change, and a data-dependent loop
    // exit would mispredict on nearly every block.
    constexpr size_t kUnrolled = 4;
    const size_t at = out.positions.size();
    out.positions.resize(at + count + kUnrolled);
    out.xors.resize((at + count + kUnrolled) * kSize);
    uint32_t* pos = out.positions.data() + at;
    std::byte* xr = out.xors.data() + at * kSize;
    // An empty mask points at the block's last element, which is always readable.
    constexpr uint64_t kSentinel = uint64_t{1} << (kBlock - kSize);
    for (size_t k = 0; k < blocks; ++k) {
      uint64_t mask = masks[k];
      const size_t off = stripe + k * kBlock;
      const int n = __builtin_popcountll(mask);
      for (size_t j = 0; j < kUnrolled; ++j) {
        const size_t byte = off + static_cast<size_t>(__builtin_ctzll(mask | kSentinel));
        mask &= mask - 1;
        pos[j] = first + static_cast<uint32_t>(byte >> kShift);
        XorWord<kSize>(a + byte, b + byte, xr + j * kSize);
      }
      for (size_t j = kUnrolled; mask != 0; ++j) {
        const size_t byte = off + static_cast<size_t>(__builtin_ctzll(mask));
        mask &= mask - 1;
        pos[j] = first + static_cast<uint32_t>(byte >> kShift);
        XorWord<kSize>(a + byte, b + byte, xr + j * kSize);
      }
      pos += n;
      xr += static_cast<size_t>(n) * kSize;
    }
    out.positions.resize(at + count);
    out.xors.resize((at + count) * kSize);
  }
  for (size_t byte = full; byte < base.size(); byte += kSize) {
    if (std::memcmp(a + byte, b + byte, kSize) == 0) continue;
    out.positions.push_back(first + static_cast<uint32_t>(byte >> kShift));
    out.xors.resize(out.xors.size() + kSize);
    XorWord<kSize>(a + byte, b + byte, out.xors.data() + out.xors.size() - kSize);
  }
}

template <uint64_t (*DiffMask)(const std::byte*, const std::byte*)>
inline void FindChangesDispatch(ByteSpan base, ByteSpan target, uint32_t element_size,
                                uint32_t first, SparseChanges& out) {
  switch (element_size) {
    case 1:
      return FindChangesWith<DiffMask, 1>(base, target, first, out);
    case 2:
      return FindChangesWith<DiffMask, 2>(base, target, first, out);
    case 4:
      return FindChangesWith<DiffMask, 4>(base, target, first, out);
    default:
      return FindChangesWith<DiffMask, 8>(base, target, first, out);
  }
}

}  // namespace deltacast::codec::internal
