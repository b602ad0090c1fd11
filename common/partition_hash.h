// Partition hashes: 128 bits, linear over GF(2) in the data and keyed by position,
// so anyone can hash any disjoint pieces of a partition where they sit and combine
// the results into the hash of the whole (docs/wire-format.md, "Partition hash").
//
//   H(p) = L(n) + sum over 16-byte blocks b of M_b * alpha^(b+1)   in GF(2^128)
//
// Consequences the rest of deltacast relies on:
// - A training rank or one GPU of a node hashes only its own pieces (HashPiece,
//   HashStridedRun) at their canonical offsets; XOR of the pieces plus the length term
//   (CombinePieces) is the partition hash, whoever held what.
// - H(base ^ mask) = H(base) ^ HashPiece(mask, 0), so a receiver checks that a sparse
//   XOR record leads from the base hash to the target hash from the record alone, in
//   O(changed words) (HashSparseMask), before it writes anything.
//
// Integrity only: the key is public and the hash linear, so anyone can build a change
// that keeps the hash. Authentication (the relay token) keeps liars out.
//
// Thread safety: free functions are thread-safe; PartitionHash is a value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/bytes.h"

namespace deltacast {

// An element of GF(2^128): a partition hash, or the linear contribution of a piece
// of one (what HashPiece returns). Contributions combine by XOR.
struct PartitionHash {
  uint64_t lo = 0;  // coefficients of x^0..x^63: wire bytes 0..7, little-endian
  uint64_t hi = 0;  // coefficients of x^64..x^127: wire bytes 8..15

  static constexpr size_t kBytes = 16;

  auto operator<=>(const PartitionHash&) const = default;
  PartitionHash& operator^=(const PartitionHash& o) {
    lo ^= o.lo;
    hi ^= o.hi;
    return *this;
  }
  friend PartitionHash operator^(PartitionHash a, const PartitionHash& b) { return a ^= b; }
  bool IsZero() const { return (lo | hi) == 0; }

  // The 16 wire bytes, in order, as 32 lowercase hex characters.
  std::string ToHex() const;
  std::string ShortHex() const { return ToHex().substr(0, 12); }
  static std::optional<PartitionHash> FromHex(std::string_view hex);

  void Store(std::byte* out) const {
    StoreLE<uint64_t>(out, lo);
    StoreLE<uint64_t>(out + 8, hi);
  }
  static PartitionHash Load(const std::byte* in) {
    return {LoadLE<uint64_t>(in), LoadLE<uint64_t>(in + 8)};
  }
};

// The hash of a whole partition of `bytes.size()` bytes.
PartitionHash HashPartition(ByteSpan bytes);

// The linear contribution of `bytes` lying at byte `offset` of a partition (any
// offset, any length; zero length contributes zero).
PartitionHash HashPiece(ByteSpan bytes, uint64_t offset);

// L(n): what every partition hash of `byte_length` bytes starts from.
PartitionHash PartitionLengthTerm(uint64_t byte_length);

// The hash of a partition of `byte_length` bytes from the contributions of disjoint
// pieces that together cover it (bytes no piece covers count as zero).
PartitionHash CombinePieces(std::span<const PartitionHash> pieces, uint64_t byte_length);

// `count` rows of `row_bytes` contiguous bytes: row r is read at src + r * src_stride
// and lies at byte dst_offset + r * dst_stride of the partition. Rows must not overlap
// in the partition. A row-parallel shard's piece of a canonical partition is one run.
struct StridedRun {
  uint64_t count = 0;
  uint64_t row_bytes = 0;
  uint64_t src_stride = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_stride = 0;
};
// The linear contribution of a strided run: one power multiplication per row on top
// of hashing the rows' bytes.
PartitionHash HashStridedRun(const std::byte* src, const StridedRun& run);

// The linear contribution of a sparse XOR mask: element positions[i] (an element
// index within the partition, strictly increasing) is XORed with the element_size
// bytes at words + i * element_size. element_size is 1, 2, 4 or 8. O(positions):
// unchanged blocks are never touched. So H(base ^ mask) = H(base) ^ this.
PartitionHash HashSparseMask(std::span<const uint32_t> positions, const std::byte* words,
                             uint32_t element_size);

// Which implementation of the block loop runs: chosen once from the CPU (the widest
// carry-less multiply it has), or lowered with DELTACAST_HASH_PATH=portable|pclmul.
enum class HashPath : uint8_t {
  kPortable = 0,  // integer multiplies only (gf128.h)
  kPclmul = 1,    // SSE PCLMULQDQ, 8 blocks per reduction
  kVpclmul = 2,   // AVX-512 VPCLMULQDQ, 16 blocks per reduction
};
HashPath ActiveHashPath();
std::string_view HashPathName(HashPath path);
bool HashPathSupported(HashPath path);

// The same functions on a given path (which must be supported): for tests and the
// benchmark, which check that every path gives the same bits.
PartitionHash HashPieceOn(HashPath path, ByteSpan bytes, uint64_t offset);
PartitionHash HashStridedRunOn(HashPath path, const std::byte* src, const StridedRun& run);
PartitionHash HashSparseMaskOn(HashPath path, std::span<const uint32_t> positions,
                               const std::byte* words, uint32_t element_size);

}  // namespace deltacast
