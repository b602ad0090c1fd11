#include "common/partition_hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/gf128.h"
#include "common/internal/gf128_kernels.h"

namespace deltacast {
namespace {

namespace gf = gf128;

std::vector<std::byte> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = std::byte(static_cast<uint8_t>(rng()));
  return out;
}

std::vector<HashPath> SupportedPaths() {
  std::vector<HashPath> out;
  for (HashPath p : {HashPath::kPortable, HashPath::kPclmul, HashPath::kVpclmul}) {
    if (HashPathSupported(p)) out.push_back(p);
  }
  return out;
}

PartitionHash Reference(ByteSpan bytes, uint64_t offset) {
  const gf::Gf128 v = gf::PieceReference(reinterpret_cast<const unsigned char*>(bytes.data()),
                                         bytes.size(), offset);
  return {v.lo, v.hi};
}

PartitionHash FullReference(ByteSpan bytes) {
  const gf::Gf128 v =
      gf::HashReference(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return {v.lo, v.hi};
}

// Carry-less product one bit at a time: what Clmul64 must equal.
gf::Gf128 ClmulByBits(uint64_t a, uint64_t b) {
  gf::Gf128 r;
  for (int i = 0; i < 64; ++i) {
    if ((b >> i) & 1) {
      r.lo ^= a << i;
      if (i > 0) r.hi ^= a >> (64 - i);
    }
  }
  return r;
}

// a^e for a 128-bit exponent (e_hi, e_lo).
gf::Gf128 Pow128(gf::Gf128 a, uint64_t e_lo, uint64_t e_hi) {
  gf::Gf128 r = gf::kOne;
  for (int i = 127; i >= 0; --i) {
    r = gf::Mul(r, r);
    const uint64_t bit = i >= 64 ? (e_hi >> (i - 64)) & 1 : (e_lo >> i) & 1;
    if (bit) r = gf::Mul(r, a);
  }
  return r;
}

// The construction's constants and field arithmetic, checked at compile time too.
static_assert(gf::Equal(gf::Mul(gf::kOne, gf::kAlpha), gf::kAlpha));
static_assert(gf::Equal(gf::Clmul64(3, 3), gf::Gf128{5, 0}));
static_assert(gf::Equal(gf::Mul({0, 1ull << 63}, {2, 0}), gf::Gf128{0x87, 0}));  // x^128

TEST(PartitionHashTest, GoldenVectorsFromTheIndependentReference) {
  // Printed by scripts/partition_hash_ref.py, written from docs/wire-format.md alone.
  std::vector<std::byte> iota(17), pattern(1000);
  for (size_t i = 0; i < iota.size(); ++i) iota[i] = std::byte(static_cast<uint8_t>(i));
  for (size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = std::byte(static_cast<uint8_t>((i * 131 + 7) & 255));
  const std::vector<std::byte> zeros(100);
  EXPECT_EQ(HashPartition({}).ToHex(), "0000000000000000646370682d6c656e");
  EXPECT_EQ(HashPartition(AsBytes("abc")).ToHex(), "300699fe2a31b04b722d29636338a0d6");
  EXPECT_EQ(HashPartition(ByteSpan(iota).first(16)).ToHex(), "c9c28bd915fdfbefda79d010d1545335");
  EXPECT_EQ(HashPartition(iota).ToHex(), "1cc902cbdfead1bc28ef67b11c6799b7");
  EXPECT_EQ(HashPartition(zeros).ToHex(), "6400000000000000646370682d6c656e");
  EXPECT_EQ(HashPartition(pattern).ToHex(), "2425c46cb32a69084eb914c7fd309598");
  EXPECT_EQ(gf::kAlpha.lo, 0xb83cf8ccf5e98a7aull);
}

TEST(PartitionHashTest, AlphaIsPrimitiveAndBetaIsItsInverse) {
  // 2^128 - 1 = 3 * 5 * 17 * 257 * 641 * 65537 * 274177 * 6700417 * 67280421310721:
  // alpha^((2^128-1)/p) != 1 for each prime p means alpha has the full order, so no
  // two block positions of any partition share a power.
  const unsigned __int128 order = ~static_cast<unsigned __int128>(0);
  for (uint64_t p :
       {3ull, 5ull, 17ull, 257ull, 641ull, 65537ull, 274177ull, 6700417ull, 67280421310721ull}) {
    const unsigned __int128 e = order / p;
    EXPECT_FALSE(gf::Equal(
        Pow128(gf::kAlpha, static_cast<uint64_t>(e), static_cast<uint64_t>(e >> 64)), gf::kOne))
        << "prime " << p;
  }
  EXPECT_TRUE(gf::Equal(Pow128(gf::kAlpha, ~0ull, ~0ull), gf::kOne));
  const auto& powers = gf::internal::GetPowers();
  EXPECT_TRUE(gf::Equal(gf::Mul(powers.beta, gf::kAlpha), gf::kOne));
  EXPECT_TRUE(gf::Equal(powers.beta_desc[31], powers.beta));
  EXPECT_TRUE(gf::Equal(powers.beta_desc[0], gf::Pow(powers.beta, 32)));
  EXPECT_TRUE(gf::Equal(powers.alpha[2][7], gf::Pow(gf::kAlpha, 7ull << 16)));
  EXPECT_TRUE(gf::Equal(powers.alpha_2_32, gf::Pow(gf::kAlpha, 1ull << 32)));
}

TEST(PartitionHashTest, PortableCarrylessMultiplyMatchesBitByBitAndPclmul) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    uint64_t a = rng(), b = rng();
    if (i < 64) a = ~0ull, b = 1ull << i;
    const gf::Gf128 want = ClmulByBits(a, b);
    ASSERT_TRUE(gf::Equal(gf::Clmul64(a, b), want)) << a << " " << b;
    const gf::Gf128 x{rng(), rng()}, y{rng(), rng()};
    if (gf::internal::CpuHasPclmul()) {
      ASSERT_TRUE(gf::Equal(gf::internal::MulPclmul(x, y), gf::Mul(x, y)));
    }
    // The field laws the composition rests on.
    const gf::Gf128 z{rng(), rng()};
    ASSERT_TRUE(gf::Equal(gf::Mul(gf::Xor(x, y), z), gf::Xor(gf::Mul(x, z), gf::Mul(y, z))));
    ASSERT_TRUE(gf::Equal(gf::Mul(x, y), gf::Mul(y, x)));
  }
}

TEST(PartitionHashTest, EveryPathsBlockLoopGivesTheSameBits) {
  std::mt19937_64 rng(2);
  const auto data = RandomBytes(rng, 16 * 2101 + 1);
  const std::byte* blocks = data.data() + 1;  // unaligned on purpose
  const gf::Gf128 y0{rng(), rng()};
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 100, 255, 256, 257, 1000, 2100}) {
    const gf::Gf128 want = gf::internal::HornerPortable(y0, blocks, n);
    if (gf::internal::CpuHasPclmul()) {
      EXPECT_TRUE(gf::Equal(gf::internal::HornerPclmul(y0, blocks, n), want)) << n;
    }
    if (gf::internal::CpuHasVpclmul()) {
      EXPECT_TRUE(gf::Equal(gf::internal::HornerVpclmul(y0, blocks, n), want)) << n;
    }
  }
}

TEST(PartitionHashTest, PiecesMatchTheReferenceAtEveryShiftAndTailLengthOnEveryPath) {
  std::mt19937_64 rng(3);
  const auto data = RandomBytes(rng, 4096 + 64);
  for (HashPath path : SupportedPaths()) {
    for (uint64_t offset = 0; offset < 40; ++offset) {
      for (size_t n = 0; n <= 80; ++n) {
        const ByteSpan piece = ByteSpan(data).subspan(offset % 7, n);
        ASSERT_EQ(HashPieceOn(path, piece, offset), Reference(piece, offset))
            << HashPathName(path) << " offset " << offset << " length " << n;
      }
    }
    // Long pieces exercise the wide loops with every leftover block count.
    for (size_t n = 4096 - 48; n <= 4096 + 16; ++n) {
      const uint64_t offset = 1000003 + n % 16;  // far in: large powers
      const ByteSpan piece = ByteSpan(data).first(n);
      ASSERT_EQ(HashPieceOn(path, piece, offset), Reference(piece, offset))
          << HashPathName(path) << " length " << n;
    }
    // Offsets above 2^32 blocks take the square-and-multiply part of the power.
    const ByteSpan piece = ByteSpan(data).first(100);
    EXPECT_EQ(HashPieceOn(path, piece, (1ull << 40) + 5), Reference(piece, (1ull << 40) + 5));
  }
  EXPECT_EQ(HashPartition(ByteSpan(data).first(1234)), FullReference(ByteSpan(data).first(1234)));
}

TEST(PartitionHashTest, RandomSplitsIntoUpTo64PiecesCombineToTheWholeHash) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 400; ++trial) {
    // Every tail length (size mod 16) and sizes from tiny to several wide groups.
    const size_t size = trial < 64 ? 16 * (trial / 16) + trial % 16 : rng() % 20000;
    const auto data = RandomBytes(rng, size);
    const size_t pieces = std::min<size_t>(1 + rng() % 64, std::max<size_t>(size, 1));
    std::vector<size_t> cuts{0, size};
    while (cuts.size() < pieces + 1) cuts.push_back(rng() % (size + 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<PartitionHash> parts;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      parts.push_back(HashPiece(ByteSpan(data).subspan(cuts[i], cuts[i + 1] - cuts[i]), cuts[i]));
    }
    std::shuffle(parts.begin(), parts.end(), rng);  // order does not matter
    ASSERT_EQ(CombinePieces(parts, size), HashPartition(data)) << "size " << size;
  }
}

TEST(PartitionHashTest, LengthAndPositionAreBound) {
  const std::vector<std::byte> zeros(64);
  EXPECT_NE(HashPartition(ByteSpan(zeros).first(31)), HashPartition(ByteSpan(zeros).first(32)));
  EXPECT_EQ(HashPartition(zeros), PartitionLengthTerm(64));
  std::vector<std::byte> a(64), b(64);
  a[3] = std::byte{1};
  b[19] = std::byte{1};  // the same byte one block later
  EXPECT_NE(HashPartition(a), HashPartition(b));
  // A change inside one block is never missed: alpha^(b+1) * delta != 0.
  std::mt19937_64 rng(5);
  auto data = RandomBytes(rng, 4096);
  const PartitionHash before = HashPartition(data);
  for (int i = 0; i < 200; ++i) {
    auto copy = data;
    copy[rng() % copy.size()] ^= std::byte(static_cast<uint8_t>(1 + rng() % 255));
    EXPECT_NE(HashPartition(copy), before);
  }
}

// A [rows, cols] matrix of `e`-byte elements split by columns over `tp` ranks (row
// parallel: o_proj, down_proj): each rank holds [rows, cols/tp] contiguously and
// hashes it as one strided run; the ranks' runs combine to the matrix's hash.
TEST(PartitionHashTest, RowParallelShardsCombineWithoutAGather) {
  std::mt19937_64 rng(6);
  for (uint64_t e : {1, 2, 4, 8}) {
    for (uint64_t tp : {1, 2, 3, 4, 8}) {
      const uint64_t rows = 1 + rng() % 40, cols = tp * (1 + rng() % 37);
      const auto matrix = RandomBytes(rng, rows * cols * e);
      const uint64_t local_cols = cols / tp;
      std::vector<PartitionHash> parts;
      for (uint64_t r = 0; r < tp; ++r) {
        std::vector<std::byte> shard(rows * local_cols * e);
        for (uint64_t i = 0; i < rows; ++i) {
          std::copy_n(matrix.begin() + (i * cols + r * local_cols) * e, local_cols * e,
                      shard.begin() + i * local_cols * e);
        }
        const StridedRun run{rows, local_cols * e, local_cols * e, r * local_cols * e, cols * e};
        for (HashPath path : SupportedPaths()) {
          ASSERT_EQ(HashStridedRunOn(path, shard.data(), run), HashStridedRun(shard.data(), run));
        }
        parts.push_back(HashStridedRun(shard.data(), run));
      }
      ASSERT_EQ(CombinePieces(parts, matrix.size()), HashPartition(matrix))
          << "e " << e << " tp " << tp << " rows " << rows << " cols " << cols;
    }
  }
}

// Fused QKV (LAYOUTS.md): rank r holds, per KV group g it owns, hpg query heads, one
// key head and one value head of hd rows each, [G (hpg+2) hd, H]. Its rows reach
// q_proj, k_proj and v_proj as three strided runs per group; every canonical
// tensor's hash comes out of the ranks' runs alone.
TEST(PartitionHashTest, FusedQkvShardsCombineIntoEachCanonicalTensor) {
  std::mt19937_64 rng(7);
  const uint64_t nh = 8, ng = 4, hd = 3, hidden = 10, e = 2, tp = 2;
  const uint64_t hpg = nh / ng, groups_per_rank = ng / tp, row = hidden * e;
  const auto q = RandomBytes(rng, nh * hd * row);
  const auto k = RandomBytes(rng, ng * hd * row);
  const auto v = RandomBytes(rng, ng * hd * row);
  std::vector<PartitionHash> q_parts, k_parts, v_parts;
  for (uint64_t r = 0; r < tp; ++r) {
    // Build the rank's fused shard the way the trainer lays it out.
    std::vector<std::byte> fused;
    for (uint64_t gl = 0; gl < groups_per_rank; ++gl) {
      const uint64_t g = r * groups_per_rank + gl;
      fused.insert(fused.end(), q.begin() + g * hpg * hd * row,
                   q.begin() + (g + 1) * hpg * hd * row);
      fused.insert(fused.end(), k.begin() + g * hd * row, k.begin() + (g + 1) * hd * row);
      fused.insert(fused.end(), v.begin() + g * hd * row, v.begin() + (g + 1) * hd * row);
    }
    const uint64_t block = (hpg + 2) * hd * row;  // one group's rows in the fused shard
    const uint64_t g0 = r * groups_per_rank;
    // Each part is `groups_per_rank` rows of contiguous bytes at the fused stride.
    q_parts.push_back(HashStridedRun(fused.data(), {groups_per_rank, hpg * hd * row, block,
                                                    g0 * hpg * hd * row, hpg * hd * row}));
    k_parts.push_back(HashStridedRun(fused.data() + hpg * hd * row,
                                     {groups_per_rank, hd * row, block, g0 * hd * row, hd * row}));
    v_parts.push_back(HashStridedRun(fused.data() + (hpg + 1) * hd * row,
                                     {groups_per_rank, hd * row, block, g0 * hd * row, hd * row}));
  }
  EXPECT_EQ(CombinePieces(q_parts, q.size()), HashPartition(q));
  EXPECT_EQ(CombinePieces(k_parts, k.size()), HashPartition(k));
  EXPECT_EQ(CombinePieces(v_parts, v.size()), HashPartition(v));
}

TEST(PartitionHashTest, StridedRunEqualsItsRowsAsPiecesAtAnyStride) {
  std::mt19937_64 rng(8);
  const auto src = RandomBytes(rng, 64 * 1024);
  for (int trial = 0; trial < 300; ++trial) {
    StridedRun run;
    run.count = rng() % 20;
    run.row_bytes = rng() % 300;
    run.src_stride = run.row_bytes + rng() % 50;
    run.dst_stride = run.row_bytes + rng() % 70;
    run.dst_offset = rng() % 5000;
    PartitionHash want;
    for (uint64_t r = 0; r < run.count; ++r) {
      want ^= HashPiece(ByteSpan(src).subspan(r * run.src_stride, run.row_bytes),
                        run.dst_offset + r * run.dst_stride);
    }
    for (HashPath path : SupportedPaths()) {
      ASSERT_EQ(HashStridedRunOn(path, src.data(), run), want)
          << HashPathName(path) << " trial " << trial;
    }
  }
}

TEST(PartitionHashTest, SparseMaskGivesTheHashOfTheXoredPartitionForEveryElementSize) {
  std::mt19937_64 rng(9);
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    for (int trial = 0; trial < 60; ++trial) {
      const size_t elements = 1 + rng() % 3000;
      auto base = RandomBytes(rng, elements * e);
      std::vector<uint32_t> positions;
      const double density = trial % 3 == 0 ? 0.5 : 0.03;
      for (uint32_t i = 0; i < elements; ++i) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) < density) positions.push_back(i);
      }
      std::vector<std::byte> words(positions.size() * e);
      for (auto& w : words) w = std::byte(static_cast<uint8_t>(rng()));
      auto target = base;
      for (size_t i = 0; i < positions.size(); ++i) {
        for (uint32_t b = 0; b < e; ++b) target[positions[i] * e + b] ^= words[i * e + b];
      }
      const PartitionHash mask = HashSparseMask(positions, words.data(), e);
      ASSERT_EQ(HashPartition(base) ^ mask, HashPartition(target))
          << "e " << e << " elements " << elements << " changes " << positions.size();
      for (HashPath path : SupportedPaths()) {
        ASSERT_EQ(HashSparseMaskOn(path, positions, words.data(), e), mask);
      }
      // The dense form of the same mask is just a piece at offset 0.
      std::vector<std::byte> dense(base.size());
      for (size_t i = 0; i < dense.size(); ++i) dense[i] = base[i] ^ target[i];
      ASSERT_EQ(HashPiece(dense, 0), mask);
      // Out-of-order positions are tolerated.
      if (positions.size() >= 2) {
        std::vector<uint32_t> swapped = positions;
        std::vector<std::byte> swapped_words = words;
        std::swap(swapped[0], swapped.back());
        std::swap_ranges(swapped_words.begin(), swapped_words.begin() + e, swapped_words.end() - e);
        ASSERT_EQ(HashSparseMask(swapped, swapped_words.data(), e), mask);
      }
    }
  }
}

TEST(PartitionHashTest, HexAndWireBytesRoundTrip) {
  const PartitionHash h{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  EXPECT_EQ(h.ToHex(), "000102030405060708090a0b0c0d0e0f");
  EXPECT_EQ(PartitionHash::FromHex(h.ToHex()), h);
  EXPECT_FALSE(PartitionHash::FromHex("00"));
  EXPECT_FALSE(PartitionHash::FromHex("zz0102030405060708090a0b0c0d0e0f"));
  std::byte wire[16];
  h.Store(wire);
  EXPECT_EQ(static_cast<int>(wire[15]), 0x0f);
  EXPECT_EQ(PartitionHash::Load(wire), h);
  EXPECT_EQ((h ^ h), PartitionHash{});
}

}  // namespace
}  // namespace deltacast
