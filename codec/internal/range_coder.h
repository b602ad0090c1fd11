// Adaptive binary range coder used by context mode (codec/context_coder.h).
//
// Why this coder: context mode codes one binary decision per partition element
// (changed or not), so the entropy stage is a tight per-element loop whose
// symbols are binary and strongly skewed (P(changed) is 0.1-10 %). A binary
// arithmetic coder codes such bits within a fraction of a percent of their
// information content, where Huffman-style or byte-oriented coders cannot go
// below one bit per symbol, and it has no tables to transmit. We use the
// LZMA-style carry-less range coder (32-bit range, 33-bit low with a one-byte
// cache for the carry) because it is simple, well understood, and its decoder
// needs only a compare, a multiply and a conditional subtract per bit.
//
// Differences from LZMA, all for skewed bits:
// - Probabilities are kept with 32 bits of state and fed to the coder with 16
//   bits (LZMA: 11), so a context whose bit is 1 with probability 0.01 % still
//   costs ~0.0002 bits per 0 rather than the ~0.02 bits of an 11-bit model.
// - Adaptation is count-based: after n bits a context moves by about 1/(n+1)
//   of the error (1/2, 1/4, 1/4, 1/8 x4, ...; close to a Krichevsky-Trofimov
//   estimate), then settles at 2^-kMaxShift, so a few dozen observations
//   already give a good estimate and long stationary runs are coded with
//   little estimation noise.
// - Bit 0 takes the lower sub-interval, [low, low + bound), bound =
//   range * P16 / 2^16; range is renormalized (one byte) below 2^24.
// - The first byte of an LZMA stream is always zero; it is not written.
//
// The stream ends with a 4-byte flush; a decoder that consumed exactly the
// payload must then hold code == 0 (Finished() checks both).
//
// Thread safety: encoder and decoder objects are not thread-safe; use one per
// thread. AdaptiveBit tables are plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__GNUC__)
#define DELTACAST_RC_INLINE inline __attribute__((always_inline))
#define DELTACAST_RC_LIKELY(x) __builtin_expect(!!(x), 1)
#define DELTACAST_RC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define DELTACAST_RC_INLINE inline
#define DELTACAST_RC_LIKELY(x) (x)
#define DELTACAST_RC_UNLIKELY(x) (x)
#endif

namespace deltacast::codec::internal {

inline constexpr uint32_t kRangeTop = 1u << 24;  // renormalize below this range

// The adaptive model of one binary context: P(bit == 0) scaled by 2^32, and how
// many bits it has seen (saturating), which sets the adaptation rate.
struct AdaptiveBit {
  uint32_t p0 = 0x80000000u;
  uint32_t seen = 0;

  // P(bit == 0) for the coder, in [1, 65535] / 2^16: with a range of at least
  // 2^24 both sub-intervals are then at least 256 wide.
  DELTACAST_RC_INLINE uint32_t P16() const { return (p0 >> 16) | 1u; }

  template <int kMaxShift>
  DELTACAST_RC_INLINE void Update(uint32_t bit) {
    static_assert(kMaxShift >= 1 && kMaxShift <= 16);
    // Rate 2^-bit_width(seen + 1): 1/2, 1/4, 1/4, 1/8 x4, ... then 2^-kMaxShift.
    // (seen + 1 is never 0, so the builtin is defined and needs no zero check.)
    const int shift = 32 - __builtin_clz(seen + 1);
    seen += seen < (1u << kMaxShift) - 1;
    Move(bit, shift);
  }

  // The update once the count has saturated, without touching the count: half
  // the work of Update(), for the per-element hot loop (see kFlagWarmup).
  template <int kMaxShift>
  DELTACAST_RC_INLINE void UpdateSettled(uint32_t bit) {
    Move(bit, kMaxShift);
  }

 private:
  // Branch-free move toward 0 (bit 1) or 2^32 - 1 (bit 0). The arithmetic
  // shift rounds the step away from zero when moving down, so p0 may reach 0
  // but never wraps; P16() keeps the coder's probability non-zero either way.
  DELTACAST_RC_INLINE void Move(uint32_t bit, int shift) {
    const uint32_t goal = bit - 1u;
    p0 += static_cast<uint32_t>((static_cast<int64_t>(goal) - p0) >> shift);
  }
};

// How a coded bit updates its model.
enum class Adapt { kCounting, kSettled };

template <int kMaxShift, Adapt kAdapt>
DELTACAST_RC_INLINE void UpdateModel(AdaptiveBit& m, uint32_t bit) {
  if constexpr (kAdapt == Adapt::kCounting) {
    m.Update<kMaxShift>(bit);
  } else {
    m.UpdateSettled<kMaxShift>(bit);
  }
}

class RangeEncoder {
 public:
  explicit RangeEncoder(std::vector<std::byte>& out) : out_(out) {}

  template <int kMaxShift, Adapt kAdapt = Adapt::kCounting>
  DELTACAST_RC_INLINE void Encode(AdaptiveBit& m, uint32_t bit) {
    const uint32_t bound = Bound(m.P16());
    const uint32_t mask = 0u - bit;
    low_ += bound & mask;
    range_ = bound + ((range_ - 2 * bound) & mask);  // bit ? range_ - bound : bound
    UpdateModel<kMaxShift, kAdapt>(m, bit);
    Normalize();
  }

  // A bit with the fixed probability 1/2 (no model).
  DELTACAST_RC_INLINE void EncodeDirect(uint32_t bit) {
    range_ >>= 1;
    low_ += range_ & (0u - (bit & 1u));
    Normalize();
  }

  // Writes out everything still held in `low_`. The encoder is finished after.
  void Flush() {
    for (int i = 0; i < 5; ++i) ShiftLow();
  }

 private:
  DELTACAST_RC_INLINE uint32_t Bound(uint32_t p16) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(range_) * p16) >> 16);
  }
  DELTACAST_RC_INLINE void Normalize() {
    while (DELTACAST_RC_UNLIKELY(range_ < kRangeTop)) {
      range_ <<= 8;
      ShiftLow();
    }
  }
  // Moves the top byte of the 32-bit window out, resolving a pending carry.
  void ShiftLow() {
    if (static_cast<uint32_t>(low_) < 0xFF000000u || (low_ >> 32) != 0) {
      const auto carry = static_cast<uint8_t>(low_ >> 32);
      if (started_) out_.push_back(std::byte(static_cast<uint8_t>(cache_ + carry)));
      started_ = true;
      for (; pending_ff_ > 0; --pending_ff_) {
        out_.push_back(std::byte(static_cast<uint8_t>(0xFF + carry)));
      }
      cache_ = static_cast<uint8_t>(low_ >> 24);
    } else {
      ++pending_ff_;
    }
    low_ = (low_ & 0x00FFFFFFu) << 8;
  }

  std::vector<std::byte>& out_;
  uint64_t low_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
  uint8_t cache_ = 0;
  bool started_ = false;  // the first cache byte is always 0 and is not written
  uint64_t pending_ff_ = 0;
};

// Decodes what RangeEncoder wrote. Reads past the end of its input return zero
// bytes and are remembered, so a truncated stream never reads out of bounds and
// is reported by Finished(); the caller bounds the number of decoded bits.
class RangeDecoder {
 public:
  RangeDecoder(const std::byte* data, size_t size) : data_(data), size_(size) {
    for (int i = 0; i < 4; ++i) code_ = (code_ << 8) | NextByte();
  }

  // Branch-free: for bits that are hard to predict.
  template <int kMaxShift>
  DELTACAST_RC_INLINE uint32_t Decode(AdaptiveBit& m) {
    const uint32_t bound = Bound(m.P16());
    const uint32_t bit = code_ >= bound;
    const uint32_t mask = 0u - bit;
    code_ -= bound & mask;
    range_ = bound + ((range_ - 2 * bound) & mask);  // bit ? range_ - bound : bound
    m.Update<kMaxShift>(bit);
    Normalize();
    return bit;
  }

  // Branching: for bits that are nearly always 0, where a predicted branch is
  // cheaper than the data dependency of the branch-free form.
  template <int kMaxShift, Adapt kAdapt = Adapt::kCounting>
  DELTACAST_RC_INLINE uint32_t DecodeMostlyZero(AdaptiveBit& m) {
    const uint32_t bound = Bound(m.P16());
    if (DELTACAST_RC_LIKELY(code_ < bound)) {
      range_ = bound;
      UpdateModel<kMaxShift, kAdapt>(m, 0);
      Normalize();
      return 0;
    }
    code_ -= bound;
    range_ -= bound;
    UpdateModel<kMaxShift, kAdapt>(m, 1);
    Normalize();
    return 1;
  }

  DELTACAST_RC_INLINE uint32_t DecodeDirect() {
    range_ >>= 1;
    // Bit 1 when code_ >= range_, and range_ is then subtracted from code_. In
    // a consistent stream code_ < 2 * range_, so the top bit of the difference
    // tells the two apart.
    const uint32_t t = (code_ - range_) >> 31;  // 1 when code_ < range_
    code_ -= range_ & (t - 1u);
    Normalize();
    return 1u - t;
  }

  // True when the stream ended exactly at the end of the input and was
  // consistent: all bytes consumed, none invented, and nothing left in `code_`.
  bool Finished() const { return pos_ == size_ && code_ == 0; }
  bool Overran() const { return pos_ > size_; }
  // Bytes consumed so far (may exceed the input size after an overrun).
  size_t position() const { return pos_; }
  // Always true while decoding what an encoder wrote (the code lies inside the
  // current interval); false proves the input is not such a stream.
  bool Consistent() const { return code_ < range_; }

 private:
  DELTACAST_RC_INLINE uint32_t Bound(uint32_t p16) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(range_) * p16) >> 16);
  }
  DELTACAST_RC_INLINE uint32_t NextByte() {
    const uint32_t b = pos_ < size_ ? static_cast<uint8_t>(data_[pos_]) : 0u;
    ++pos_;
    return b;
  }
  DELTACAST_RC_INLINE void Normalize() {
    while (DELTACAST_RC_UNLIKELY(range_ < kRangeTop)) {
      range_ <<= 8;
      code_ = (code_ << 8) | NextByte();
    }
  }

  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
  uint32_t code_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
};

}  // namespace deltacast::codec::internal
