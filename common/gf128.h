// Arithmetic in GF(2^128) and the element-level math of the partition hash
// (docs/wire-format.md, "Partition hash"), written once for the host and the device.
//
// Everything here is a constexpr function on plain 64-bit integers: no tables, no
// intrinsics, no STL, so the same header compiles under nvcc (DELTACAST_HD marks the
// functions __host__ __device__) and a CUDA kernel produces the host's bits. The host's
// fast paths (common/partition_hash.h) must agree with these bit for bit; the tests
// check that they do.
//
// Field: GF(2)[x] / (x^128 + x^7 + x^2 + x + 1). An element is 128 bits; bit i
// (`lo` bits 0..63, then `hi`) is the coefficient of x^i. This is the natural order,
// not GHASH's reflected one, so 16 bytes loaded little-endian are an element as they
// are and x86's carry-less multiply needs no byte or bit swaps.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DELTACAST_HD __host__ __device__
#else
#define DELTACAST_HD
#endif

namespace deltacast::gf128 {

struct Gf128 {
  uint64_t lo = 0;  // coefficients of x^0 .. x^63
  uint64_t hi = 0;  // coefficients of x^64 .. x^127
};

DELTACAST_HD constexpr Gf128 Xor(Gf128 a, Gf128 b) { return {a.lo ^ b.lo, a.hi ^ b.hi}; }
DELTACAST_HD constexpr bool Equal(Gf128 a, Gf128 b) { return a.lo == b.lo && a.hi == b.hi; }
DELTACAST_HD constexpr bool IsZero(Gf128 a) { return (a.lo | a.hi) == 0; }
inline constexpr Gf128 kOne{1, 0};

// The key: the first 16 bytes of SHA-256("deltacast partition hash v2 alpha") read
// little-endian. It is a primitive element (its order is 2^128 - 1; a test checks).
inline constexpr Gf128 kAlpha{0xb83cf8ccf5e98a7aull, 0x1619eb0d40ad7613ull};

// High half of the length term: the bytes "dcph-len" read little-endian.
inline constexpr uint64_t kLengthTag = 0x6e656c2d68706364ull;

// The term every partition hash of `byte_length` bytes starts from (the x^0 slot of
// the polynomial; data blocks start at alpha^1).
DELTACAST_HD constexpr Gf128 LengthTerm(uint64_t byte_length) { return {byte_length, kLengthTag}; }

// The low 64 bits of the carry-less product of x and y, with integer multiplies
// only (BearSSL's bmul64): each operand is split into four masks with a bit every
// fourth position, so the carries of one integer product never reach the next
// retained bit, and the low 64 bits come out exact.
DELTACAST_HD constexpr uint64_t Bmul64(uint64_t x, uint64_t y) {
  constexpr uint64_t m0 = 0x1111111111111111ull, m1 = 0x2222222222222222ull;
  constexpr uint64_t m2 = 0x4444444444444444ull, m3 = 0x8888888888888888ull;
  const uint64_t x0 = x & m0, x1 = x & m1, x2 = x & m2, x3 = x & m3;
  const uint64_t y0 = y & m0, y1 = y & m1, y2 = y & m2, y3 = y & m3;
  uint64_t z0 = (x0 * y0) ^ (x1 * y3) ^ (x2 * y2) ^ (x3 * y1);
  uint64_t z1 = (x0 * y1) ^ (x1 * y0) ^ (x2 * y3) ^ (x3 * y2);
  uint64_t z2 = (x0 * y2) ^ (x1 * y1) ^ (x2 * y0) ^ (x3 * y3);
  uint64_t z3 = (x0 * y3) ^ (x1 * y2) ^ (x2 * y1) ^ (x3 * y0);
  return (z0 & m0) | (z1 & m1) | (z2 & m2) | (z3 & m3);
}

DELTACAST_HD constexpr uint64_t Rev64(uint64_t x) {
  x = ((x >> 1) & 0x5555555555555555ull) | ((x & 0x5555555555555555ull) << 1);
  x = ((x >> 2) & 0x3333333333333333ull) | ((x & 0x3333333333333333ull) << 2);
  x = ((x >> 4) & 0x0f0f0f0f0f0f0f0full) | ((x & 0x0f0f0f0f0f0f0f0full) << 4);
  x = ((x >> 8) & 0x00ff00ff00ff00ffull) | ((x & 0x00ff00ff00ff00ffull) << 8);
  x = ((x >> 16) & 0x0000ffff0000ffffull) | ((x & 0x0000ffff0000ffffull) << 16);
  return (x >> 32) | (x << 32);
}

// The 128-bit carry-less product of two 64-bit polynomials. The high half comes from
// the low half of the bit-reversed operands' product.
DELTACAST_HD constexpr Gf128 Clmul64(uint64_t x, uint64_t y) {
  return {Bmul64(x, y), Rev64(Bmul64(Rev64(x), Rev64(y))) >> 1};
}

// Reduces the 256-bit polynomial hi * x^128 + lo modulo x^128 + x^7 + x^2 + x + 1,
// using x^128 = x^7 + x^2 + x + 1: hi * (x^7 + x^2 + x + 1) is hi shifted by 0, 1, 2
// and 7; the (at most 7) bits shifted past x^127 are folded back the same way.
DELTACAST_HD constexpr Gf128 Reduce(Gf128 lo, Gf128 hi) {
  const uint64_t over = (hi.hi >> 63) ^ (hi.hi >> 62) ^ (hi.hi >> 57);
  Gf128 r = lo;
  r.lo ^= hi.lo ^ (hi.lo << 1) ^ (hi.lo << 2) ^ (hi.lo << 7);
  r.hi ^= hi.hi ^ (hi.hi << 1) ^ (hi.hi << 2) ^ (hi.hi << 7) ^ (hi.lo >> 63) ^ (hi.lo >> 62) ^
          (hi.lo >> 57);
  r.lo ^= over ^ (over << 1) ^ (over << 2) ^ (over << 7);
  return r;
}

DELTACAST_HD constexpr Gf128 Mul(Gf128 a, Gf128 b) {
  const Gf128 ll = Clmul64(a.lo, b.lo);
  const Gf128 hh = Clmul64(a.hi, b.hi);
  const Gf128 lh = Clmul64(a.lo, b.hi);
  const Gf128 hl = Clmul64(a.hi, b.lo);
  const uint64_t mid_lo = lh.lo ^ hl.lo, mid_hi = lh.hi ^ hl.hi;
  return Reduce({ll.lo, ll.hi ^ mid_lo}, {hh.lo ^ mid_hi, hh.hi});
}

// a^k by square-and-multiply (at most 128 multiplications).
DELTACAST_HD constexpr Gf128 Pow(Gf128 a, uint64_t k) {
  Gf128 r = kOne;
  while (k != 0) {
    if (k & 1) r = Mul(r, a);
    a = Mul(a, a);
    k >>= 1;
  }
  return r;
}

// a^-1 = a^(2^128 - 2) = product of a^(2^i) for i = 1..127. Zero maps to zero.
DELTACAST_HD constexpr Gf128 Inverse(Gf128 a) {
  Gf128 r = kOne;
  Gf128 s = a;
  for (int i = 1; i < 128; ++i) {
    s = Mul(s, s);
    r = Mul(r, s);
  }
  return r;
}

// Up to 16 bytes (little-endian) starting at byte `shift` of a zero block: the block
// a piece's first or last partial block becomes. n + shift must not exceed 16.
DELTACAST_HD constexpr Gf128 PlaceBytes(const unsigned char* p, unsigned n, unsigned shift) {
  Gf128 r;
  for (unsigned i = 0; i < n; ++i) {
    const unsigned at = shift + i;
    const uint64_t b = p[i];
    if (at < 8) {
      r.lo |= b << (8 * at);
    } else {
      r.hi |= b << (8 * (at - 8));
    }
  }
  return r;
}

// An element word of `size` bytes (1, 2, 4 or 8; little-endian in `word`) at byte
// `shift` of a zero block; size + shift must not exceed 16.
DELTACAST_HD constexpr Gf128 PlaceWord(uint64_t word, unsigned size, unsigned shift) {
  if (size < 8) word &= (uint64_t{1} << (8 * size)) - 1;
  if (shift == 0) return {word, 0};
  if (shift >= 8) return {0, word << (8 * (shift - 8))};
  return {word << (8 * shift), word >> (64 - 8 * shift)};
}

// The linear part of the hash of `n` bytes placed at byte `offset` of a partition
// (zero everywhere else): sum over the partition blocks b they touch of M_b * alpha^(b+1).
// Horner from the last block down, one multiplication per block: the reference the
// fast paths are tested against, and what a device thread runs over its slice.
// PieceHorner is the loop alone, before the multiplication by alpha^(offset / 16).
DELTACAST_HD constexpr Gf128 PieceHorner(const unsigned char* p, uint64_t n, uint64_t offset) {
  if (n == 0) return {};
  const uint64_t first = offset / 16;
  const uint64_t last = (offset + n - 1) / 16;
  Gf128 acc;
  for (uint64_t b = last + 1; b-- > first;) {
    // Bytes of the piece inside block b: [from, to) in piece coordinates.
    const uint64_t block_start = b * 16;
    const uint64_t from = block_start > offset ? block_start - offset : 0;
    const uint64_t to = block_start + 16 - offset < n ? block_start + 16 - offset : n;
    const unsigned shift = static_cast<unsigned>(offset + from - block_start);
    acc = Mul(Xor(acc, PlaceBytes(p + from, static_cast<unsigned>(to - from), shift)), kAlpha);
  }
  return acc;
}
DELTACAST_HD constexpr Gf128 PieceReference(const unsigned char* p, uint64_t n, uint64_t offset) {
  // PieceHorner(p, n, offset) * alpha^(offset / 16): a device that keeps the powers
  // alpha^(2^i) in a table multiplies by them instead of calling Pow.
  if (n == 0) return {};
  return Mul(PieceHorner(p, n, offset), Pow(kAlpha, offset / 16));
}

// The whole hash of a partition of `n` bytes: LengthTerm(n) + the linear part.
DELTACAST_HD constexpr Gf128 HashReference(const unsigned char* p, uint64_t n) {
  return Xor(LengthTerm(n), PieceReference(p, n, 0));
}

// The linear contribution of XORing element `index` (of `size` bytes) with `word`.
DELTACAST_HD constexpr Gf128 MaskElementReference(uint64_t word, unsigned size, uint64_t index) {
  const uint64_t byte = index * size;
  return Mul(PlaceWord(word, size, static_cast<unsigned>(byte % 16)), Pow(kAlpha, byte / 16 + 1));
}

}  // namespace deltacast::gf128
