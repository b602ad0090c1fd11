// Every change-detection kernel finds exactly the changed elements, with their XOR
// words, whatever the element size, the alignment and the tail.
#include "codec/change_detect.h"

#include <gtest/gtest.h>

#include <random>

namespace deltacast::codec {
namespace internal {
void FindChangesAvx2(ByteSpan base, ByteSpan target, uint32_t element_size, uint32_t first,
                     SparseChanges& out);
bool FindChangesAvx512(ByteSpan base, ByteSpan target, uint32_t element_size, uint32_t first,
                       SparseChanges& out);
}  // namespace internal
namespace {

SparseChanges Reference(ByteSpan a, ByteSpan b, uint32_t e) {
  SparseChanges out;
  out.element_size = e;
  for (size_t i = 0; i < a.size() / e; ++i) {
    bool changed = false;
    for (uint32_t k = 0; k < e; ++k) changed |= a[i * e + k] != b[i * e + k];
    if (!changed) continue;
    out.positions.push_back(static_cast<uint32_t>(i));
    for (uint32_t k = 0; k < e; ++k) out.xors.push_back(a[i * e + k] ^ b[i * e + k]);
  }
  return out;
}

TEST(ChangeDetect, KernelsAgreeWithAReference) {
  std::mt19937 rng(5);
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vbmi2");
  const bool avx2 = __builtin_cpu_supports("avx2");
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    for (size_t elements : {0ul, 1ul, 31ul, 64ul, 4095ul, 20000ul, 70001ul}) {
      for (int percent : {0, 1, 3, 50, 100}) {
        std::vector<std::byte> a(elements * e + 1), b;
        for (auto& x : a) x = std::byte(rng());
        b = a;
        for (size_t i = 0; i < elements; ++i) {
          if (static_cast<int>(rng() % 100) < percent)
            b[i * e + rng() % e] ^= std::byte(1 + rng() % 255);
        }
        // Offset by one byte: kernels must not assume alignment.
        const ByteSpan x = ByteSpan(a).subspan(1), y = ByteSpan(b).subspan(1);
        const SparseChanges want = Reference(x.first(elements * e), y.first(elements * e), e);
        SparseChanges got;
        FindChanges(x.first(elements * e), y.first(elements * e), e, got);
        EXPECT_EQ(got.positions, want.positions) << e << " " << elements << " " << percent;
        EXPECT_EQ(got.xors, want.xors);
        if (avx2) {
          SparseChanges k;
          k.element_size = e;
          internal::FindChangesAvx2(x.first(elements * e), y.first(elements * e), e, 0, k);
          EXPECT_EQ(k.positions, want.positions);
          EXPECT_EQ(k.xors, want.xors);
        }
        if (avx512) {
          SparseChanges k;
          k.element_size = e;
          if (internal::FindChangesAvx512(x.first(elements * e), y.first(elements * e), e, 0, k)) {
            EXPECT_EQ(k.positions, want.positions) << "avx512 " << e << " " << elements;
            EXPECT_EQ(k.xors, want.xors);
          }
        }
      }
    }
  }
}

// A partition compared a tile at a time, each tile's changes appended and numbered
// from the tile's first element, gives the changes of one pass over it, with every
// kernel (DELTACAST_CHANGE_DETECT is read once per process, so each kernel is called
// directly as well).
TEST(ChangeDetect, AppendingTileByTileGivesTheChangesOfOnePass) {
  std::mt19937 rng(17);
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vbmi2");
  const bool avx2 = __builtin_cpu_supports("avx2");
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    const size_t elements = 50'003;
    std::vector<std::byte> a(elements * e), b;
    for (auto& x : a) x = std::byte(rng());
    b = a;
    for (size_t i = 0; i < elements; ++i) {
      if (rng() % 100 < 3) b[i * e + rng() % e] ^= std::byte(1 + rng() % 255);
    }
    const SparseChanges want = Reference(a, b, e);
    ASSERT_GT(want.size(), 1000u);
    for (size_t tile : {size_t{64}, size_t{4096} + 64, size_t{131072}}) {
      const size_t tile_elements = tile / e;
      for (int kernel = 0; kernel < 3; ++kernel) {
        if ((kernel == 1 && !avx2) || (kernel == 2 && !avx512)) continue;
        SparseChanges got;
        got.element_size = e;
        got.positions = {7};  // what was there before stays, first
        got.xors.assign(e, std::byte{1});
        for (size_t at = 0; at < elements; at += tile_elements) {
          const size_t n = std::min(tile_elements, elements - at) * e;
          const ByteSpan x = ByteSpan(a).subspan(at * e, n), y = ByteSpan(b).subspan(at * e, n);
          const auto first = static_cast<uint32_t>(at);
          if (kernel == 0) FindChangesAppend(x, y, e, first, got);
          if (kernel == 1) internal::FindChangesAvx2(x, y, e, first, got);
          if (kernel == 2 && !internal::FindChangesAvx512(x, y, e, first, got)) {
            FindChangesAppend(x, y, e, first, got);
          }
        }
        ASSERT_EQ(got.positions.front(), 7u);
        got.positions.erase(got.positions.begin());
        got.xors.erase(got.xors.begin(), got.xors.begin() + e);
        EXPECT_EQ(got.positions, want.positions) << e << " " << tile << " kernel " << kernel;
        EXPECT_EQ(got.xors, want.xors) << e << " " << tile << " kernel " << kernel;
      }
    }
  }
}

// Changes placed where a kernel's loops turn: the first and last element, the ends of
// a group of four blocks and of a 64-block stripe, a ragged tail, every element, none;
// numbered from a first position far above 16 bits (the AVX-512 kernel stages numbers
// within a stripe in 16 bits). Every kernel against the reference.
TEST(ChangeDetect, KernelsAgreeWhereTheirLoopsTurn) {
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vbmi2");
  const bool avx2 = __builtin_cpu_supports("avx2");
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    for (size_t bytes : {size_t{64}, size_t{64} * 3, size_t{64} * 4, size_t{64} * 5, size_t{4096},
                         size_t{4096} + 64 * 3, size_t{8192} + 24, size_t{3} * 4096 + 8}) {
      const size_t elements = bytes / e;
      // Sets of changed elements.
      std::vector<std::vector<size_t>> layouts = {{}, {0}, {elements - 1}, {0, elements - 1}};
      std::vector<size_t> every(elements), edges;
      for (size_t i = 0; i < elements; ++i) every[i] = i;
      layouts.push_back(every);
      for (size_t block : {size_t{3}, size_t{4}, size_t{63}, size_t{64}, size_t{67}}) {
        for (size_t i = block * 64 / e; i < (block + 1) * 64 / e && i < elements; ++i) {
          edges.push_back(i);
        }
      }
      layouts.push_back(edges);
      for (const auto& changed : layouts) {
        std::vector<std::byte> a(bytes), b;
        for (size_t i = 0; i < bytes; ++i) a[i] = std::byte(i * 131 % 251);
        b = a;
        // The element's last byte: a kernel must test every byte of it.
        for (size_t i : changed) b[i * e + e - 1] ^= std::byte(0x80);
        for (uint32_t first : {0u, 0xF0000000u}) {
          SparseChanges want = Reference(a, b, e);
          for (auto& p : want.positions) p += first;
          for (int kernel = 0; kernel < 3; ++kernel) {
            if ((kernel == 1 && !avx2) || (kernel == 2 && !avx512)) continue;
            SparseChanges got;
            got.element_size = e;
            if (kernel == 0) FindChangesAppend(a, b, e, first, got);
            if (kernel == 1) internal::FindChangesAvx2(a, b, e, first, got);
            if (kernel == 2 && !internal::FindChangesAvx512(a, b, e, first, got)) continue;
            EXPECT_EQ(got.positions, want.positions)
                << "e " << e << " bytes " << bytes << " changes " << changed.size() << " first "
                << first << " kernel " << kernel;
            EXPECT_EQ(got.xors, want.xors)
                << "e " << e << " bytes " << bytes << " kernel " << kernel;
          }
        }
      }
    }
  }
}

TEST(ChangeDetect, HashingTheBaseWhileComparingGivesTheSameChangesAndItsPieceHash) {
  std::mt19937_64 rng(11);
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    // Below, at and well above one 64 KiB tile, with a ragged last tile.
    for (size_t elements : {size_t{1}, size_t{777}, (size_t{64} << 10) / e, size_t{300'001}}) {
      std::vector<std::byte> a(elements * e), b;
      for (auto& x : a) x = std::byte(rng());
      b = a;
      for (size_t i = 0; i < b.size(); i += 37) b[i] ^= std::byte(1 + rng() % 255);
      for (uint64_t offset : {uint64_t{0}, uint64_t{e} * 3, uint64_t{4096}}) {
        SparseChanges plain, fused;
        FindChanges(a, b, e, plain);
        const PartitionHash h = FindChangesHashingBase(a, b, e, offset, fused);
        EXPECT_EQ(h, HashPiece(a, offset)) << "e " << e << " n " << elements << " at " << offset;
        EXPECT_EQ(fused.positions, plain.positions) << "e " << e << " n " << elements;
        EXPECT_EQ(fused.xors, plain.xors) << "e " << e << " n " << elements;
        EXPECT_EQ(fused.element_size, e);
      }
    }
  }
}

}  // namespace
}  // namespace deltacast::codec
