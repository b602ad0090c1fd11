#include "codec/context_coder.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <memory>
#include <string>

#include "codec/internal/range_coder.h"

namespace deltacast::codec {
namespace {

using internal::Adapt;
using internal::AdaptiveBit;
using internal::RangeDecoder;
using internal::RangeEncoder;

// Adaptation limits (see AdaptiveBit::Update). The change flag sees every
// element, millions per partition, with a probability that is steady along a
// tensor, so it may average over ~1000 observations; the value models see only
// the changed elements, split over more contexts, and must learn faster.
constexpr int kFlagShift = 10;
constexpr int kValueShift = 7;
// The change flags of the first kFlagWarmup elements of a partition update
// their model's count; later ones use the settled rate 2^-kFlagShift and skip
// the count, which makes the per-element loop about 1.5x faster. By then every
// exponent common enough to matter has been seen more than 2^kFlagShift times.
constexpr uint64_t kFlagWarmup = uint64_t{1} << 17;

// Where the fields of a float format sit. The sign is the top bit; everything
// below it is the "magnitude", which increases monotonically with |value| for
// every finite value, so +-1 unit in the last place is +-1 on it, including a
// carry into the exponent.
template <typename WordT, int kExpShiftV, int kExpBitsV>
struct Layout {
  using Word = WordT;
  static constexpr int kWordBits = 8 * sizeof(Word);
  static constexpr int kMagBits = kWordBits - 1;
  static constexpr Word kSign = Word(Word(1) << kMagBits);
  static constexpr Word kMagMask = Word(kSign - 1);
  static constexpr int kExpShift = kExpShiftV;
  static constexpr int kExps = 1 << kExpBitsV;

  static DELTACAST_RC_INLINE uint32_t Exp(Word w) { return (w >> kExpShift) & (kExps - 1); }
  static DELTACAST_RC_INLINE Word Load(const std::byte* p, uint64_t i) {
    Word w;
    std::memcpy(&w, p + i * sizeof(Word), sizeof(Word));
    return w;
  }
};

using Bf16Layout = Layout<uint16_t, 7, 8>;
using F16Layout = Layout<uint16_t, 10, 5>;
using F32Layout = Layout<uint32_t, 23, 8>;
// FP8 serving weights (docs/fp8.md): the block scale is shared by 128 x 128 elements,
// so the element's own exponent still says how wide its unit in the last place is
// against an AdamW step, as it does for BF16.
using F8E4M3Layout = Layout<uint8_t, 3, 4>;
using F8E5M2Layout = Layout<uint8_t, 2, 5>;

// Bit length of a magnitude difference or XOR: 0..kMagBits. The sign-change
// escape codes it with a 5-level binary tree, enough for 31 magnitude bits.
constexpr int kLenTreeLevels = 5;

template <class L>
struct Model {
  static constexpr int kMagBits = L::kMagBits;
  static_assert(kMagBits < (1 << kLenTreeLevels));

  // Indexed by the base exponent.
  std::array<AdaptiveBit, L::kExps> flag;
  // A changed element moved by one unit in the last place, sign kept (0), or
  // not (1); then whether the sign changed.
  std::array<AdaptiveBit, L::kExps> unit;
  std::array<AdaptiveBit, L::kExps> escape;
  // By base sign and exponent: magnitude grew (1) or shrank (0).
  std::array<AdaptiveBit, 2 * L::kExps> grow;
  // Elias-gamma length prefix: unary[e][i - 1] codes "bit length > i".
  std::array<AdaptiveBit, L::kExps * kMagBits> unary;
  // The bit below the leading one, by exponent and bit length.
  std::array<AdaptiveBit, L::kExps*(kMagBits + 1)> below_lead;
  std::array<AdaptiveBit, 1 << kLenTreeLevels> xor_len;
};

template <class L>
class Encoder {
 public:
  using Word = typename L::Word;
  static constexpr int kMagBits = L::kMagBits;

  explicit Encoder(std::vector<std::byte>& out) : rc_(out) {}

  template <Adapt kAdapt>
  DELTACAST_RC_INLINE void Unchanged(Word base) {
    rc_.template Encode<kFlagShift, kAdapt>(m_.flag[L::Exp(base)], 0);
  }

  void Changed(uint64_t pos, Word base, Word xor_word) {
    const uint32_t e = L::Exp(base);
    if (pos < kFlagWarmup) {
      rc_.template Encode<kFlagShift, Adapt::kCounting>(m_.flag[e], 1);
    } else {
      rc_.template Encode<kFlagShift, Adapt::kSettled>(m_.flag[e], 1);
    }
    Value(e, base, xor_word);
  }

  void Finish() { rc_.Flush(); }

 private:
  void Value(uint32_t e, Word base, Word xor_word) {
    const bool same_sign = (xor_word & L::kSign) == 0;
    const Word from = base & L::kMagMask;
    const Word to = (base ^ xor_word) & L::kMagMask;
    const uint32_t grow = to > from;
    const Word mag = grow ? Word(to - from) : Word(from - to);
    const uint32_t grow_ctx = (base >> kMagBits) * L::kExps + e;
    // One unit in the last place, sign kept: the common case, two coded bits.
    const bool unit = same_sign && mag == 1;
    rc_.template Encode<kValueShift>(m_.unit[e], !unit);
    if (!unit) rc_.template Encode<kValueShift>(m_.escape[e], !same_sign);
    if (!same_sign) {
      SignChange(xor_word);
      return;
    }
    rc_.template Encode<kValueShift>(m_.grow[grow_ctx], grow);
    if (!unit) Magnitude(e, Word(mag - 1));  // mag >= 2
  }

  // The XOR word's magnitude bits x: bit length in a binary tree, then the
  // bits below the leading one, uncoded. Sign changes are rare (~0.05 %).
  void SignChange(Word xor_word) {
    const Word x = xor_word & L::kMagMask;
    const int len = std::bit_width(x);
    uint32_t node = 1;
    for (int b = kLenTreeLevels - 1; b >= 0; --b) {
      const uint32_t bit = (len >> b) & 1;
      rc_.template Encode<kValueShift>(m_.xor_len[node], bit);
      node = 2 * node + bit;
    }
    for (int b = len - 2; b >= 0; --b) rc_.EncodeDirect((x >> b) & 1);
  }

  // Elias gamma of mag >= 1: the bit length in unary, then the bits below the
  // leading one, the first of them modelled.
  void Magnitude(uint32_t e, Word mag) {
    const int len = std::bit_width(mag);
    AdaptiveBit* unary = &m_.unary[e * kMagBits];
    for (int i = 1; i < kMagBits; ++i) {
      const uint32_t longer = len > i;
      rc_.template Encode<kValueShift>(unary[i - 1], longer);
      if (!longer) break;
    }
    if (len >= 2) {
      rc_.template Encode<kValueShift>(m_.below_lead[e * (kMagBits + 1) + len],
                                       (mag >> (len - 2)) & 1);
      for (int b = len - 3; b >= 0; --b) rc_.EncodeDirect((mag >> b) & 1);
    }
  }

  RangeEncoder rc_;
  Model<L> m_;
};

template <class L>
class Decoder {
 public:
  using Word = typename L::Word;
  static constexpr int kMagBits = L::kMagBits;

  Decoder(const std::byte* data, size_t size) : rc_(data, size) {}

  template <Adapt kAdapt>
  DELTACAST_RC_INLINE uint32_t Flag(Word base) {
    return rc_.template DecodeMostlyZero<kFlagShift, kAdapt>(m_.flag[L::Exp(base)]);
  }

  // The XOR word of a changed element, read in Encoder::Value's order; false
  // if the payload describes a magnitude outside the format.
  bool Value(Word base, Word& xor_word) {
    const uint32_t e = L::Exp(base);
    const uint32_t grow_ctx = (base >> kMagBits) * L::kExps + e;
    const Word from = base & L::kMagMask;
    const uint32_t unit = rc_.template Decode<kValueShift>(m_.unit[e]) == 0;
    if (!unit && rc_.template Decode<kValueShift>(m_.escape[e]) != 0) return SignChange(xor_word);
    const uint32_t grow = rc_.template Decode<kValueShift>(m_.grow[grow_ctx]);
    // Magnitude() is below 2^kMagBits, so adding 1 does not overflow.
    const Word mag = unit ? Word(1) : Word(Magnitude(e) + 1);
    Word to;
    if (grow) {
      if (mag > Word(L::kMagMask - from)) return false;
      to = Word(from + mag);
    } else {
      if (mag > from) return false;
      to = Word(from - mag);
    }
    xor_word = Word(from ^ to);
    return true;
  }

  const RangeDecoder& rc() const { return rc_; }

 private:
  // Mirrors Encoder::SignChange; false for a bit length beyond the format.
  bool SignChange(Word& xor_word) {
    uint32_t node = 1;
    for (int b = 0; b < kLenTreeLevels; ++b) {
      node = 2 * node + rc_.template Decode<kValueShift>(m_.xor_len[node]);
    }
    const int len = static_cast<int>(node - (1u << kLenTreeLevels));
    if (len > kMagBits) return false;
    Word x = len > 0 ? 1 : 0;
    for (int b = len - 2; b >= 0; --b) x = Word((x << 1) | rc_.DecodeDirect());
    xor_word = Word(L::kSign | x);
    return true;
  }

  Word Magnitude(uint32_t e) {
    int len = 1;
    AdaptiveBit* unary = &m_.unary[e * kMagBits];
    for (int i = 1; i < kMagBits; ++i) {
      if (!rc_.template Decode<kValueShift>(unary[i - 1])) break;
      len = i + 1;
    }
    Word mag = 1;
    if (len >= 2) {
      mag = Word(2 | rc_.template Decode<kValueShift>(m_.below_lead[e * (kMagBits + 1) + len]));
      for (int b = len - 3; b >= 0; --b) mag = Word((mag << 1) | rc_.DecodeDirect());
    }
    return mag;
  }

  RangeDecoder rc_;
  Model<L> m_;
};

constexpr size_t kHeaderBytes = 2;  // version, dtype

template <class L>
Status EncodeWith(ByteSpan base, const SparseChanges& changes, std::vector<std::byte>& out) {
  using Word = typename L::Word;
  const std::byte* b = base.data();
  const uint64_t elements = base.size() / sizeof(Word);
  const size_t n = changes.positions.size();
  if (changes.xors.size() != n * sizeof(Word)) {
    return Status::InvalidArgument("context encode: " + std::to_string(n) + " positions but " +
                                   std::to_string(changes.xors.size()) + " XOR bytes");
  }
  auto encoder = std::make_unique<Encoder<L>>(out);
  uint64_t next = 0;  // first element not yet coded
  for (size_t j = 0; j < n; ++j) {
    const uint64_t pos = changes.positions[j];
    if (pos < next || pos >= elements) {
      return Status::InvalidArgument(
          "context encode: change " + std::to_string(j) + " at element " + std::to_string(pos) +
          (pos >= elements ? " is beyond the partition's " + std::to_string(elements) + " elements"
                           : " is not after the previous change"));
    }
    const Word x = L::Load(changes.xors.data(), j);
    if (x == 0) {
      return Status::InvalidArgument("context encode: change " + std::to_string(j) +
                                     " has a zero XOR word");
    }
    const uint64_t warm_end = std::min(pos, std::max(next, kFlagWarmup));
    for (; next < warm_end; ++next) encoder->template Unchanged<Adapt::kCounting>(L::Load(b, next));
    for (; next < pos; ++next) encoder->template Unchanged<Adapt::kSettled>(L::Load(b, next));
    encoder->Changed(pos, L::Load(b, pos), x);
    next = pos + 1;
  }
  // The decoder stops after the last change (it knows the count), so the
  // unchanged tail costs nothing.
  encoder->Finish();
  return Status::Ok();
}

// Decodes elements [begin, end) until `count` reaches `change_count`.
template <class L, Adapt kAdapt>
Status DecodeElements(Decoder<L>& decoder, const std::byte* base, uint64_t begin, uint64_t end,
                      uint64_t change_count, uint64_t& count, SparseChanges& out) {
  using Word = typename L::Word;
  if (count == change_count) return Status::Ok();
  for (uint64_t i = begin; i < end; ++i) {
    const Word w = L::Load(base, i);
    if (DELTACAST_RC_LIKELY(decoder.template Flag<kAdapt>(w) == 0)) continue;
    Word x;
    if (!decoder.Value(w, x)) {
      return Status::Corrupt("context payload: change " + std::to_string(count) + " at element " +
                             std::to_string(i) + " codes a magnitude outside the format");
    }
    if (decoder.rc().Overran()) {
      return Status::Corrupt("context payload is truncated (ends inside change " +
                             std::to_string(count) + ")");
    }
    if (!decoder.rc().Consistent()) {
      return Status::Corrupt("context payload: range coder state is inconsistent at change " +
                             std::to_string(count) + " (element " + std::to_string(i) + ")");
    }
    out.positions[count] = static_cast<uint32_t>(i);
    std::memcpy(out.xors.data() + count * sizeof(Word), &x, sizeof(Word));
    // The encoder stops after its last change; so does the decoder.
    if (++count == change_count) break;
  }
  return Status::Ok();
}

template <class L>
Status DecodeWith(ByteSpan stream, ByteSpan base, uint64_t change_count, SparseChanges& out) {
  using Word = typename L::Word;
  const uint64_t elements = base.size() / sizeof(Word);
  // change_count <= elements (checked by the caller) bounds both allocations.
  out.positions.resize(change_count);
  out.xors.resize(change_count * sizeof(Word));

  auto decoder = std::make_unique<Decoder<L>>(stream.data(), stream.size());
  uint64_t count = 0;
  const uint64_t warm_end = std::min(elements, kFlagWarmup);
  RETURN_IF_ERROR((DecodeElements<L, Adapt::kCounting>(*decoder, base.data(), 0, warm_end,
                                                       change_count, count, out)));
  RETURN_IF_ERROR((DecodeElements<L, Adapt::kSettled>(*decoder, base.data(), warm_end, elements,
                                                      change_count, count, out)));
  if (count != change_count) {
    return Status::Corrupt("context payload codes " + std::to_string(count) +
                           " changes but the record says " + std::to_string(change_count));
  }
  const RangeDecoder& rc = decoder->rc();
  if (rc.Overran()) return Status::Corrupt("context payload is truncated");
  if (rc.position() < stream.size()) {
    return Status::Corrupt("context payload has " + std::to_string(stream.size() - rc.position()) +
                           " trailing bytes");
  }
  if (!rc.Finished()) return Status::Corrupt("context payload fails its end-of-stream check");
  return Status::Ok();
}

Status CheckBase(std::string_view what, DType dtype, ByteSpan base) {
  if (!ContextModeSupports(dtype)) {
    // DTypeName() is only defined for dtypes that exist.
    const auto raw = static_cast<uint8_t>(dtype);
    return Status::InvalidArgument(
        std::string(what) + ": context mode does not support dtype " +
        (DTypeFromWire(raw) ? std::string(DTypeName(dtype)) : "#" + std::to_string(raw)));
  }
  const size_t size = ElementSize(dtype);
  if (base.size() % size != 0) {
    return Status::InvalidArgument(std::string(what) + ": base of " + std::to_string(base.size()) +
                                   " bytes is not a whole number of " +
                                   std::string(DTypeName(dtype)) + " elements");
  }
  if (base.size() / size > (uint64_t{1} << 32)) {
    return Status::InvalidArgument(std::string(what) + ": partition of " +
                                   std::to_string(base.size() / size) +
                                   " elements exceeds 2^32 elements");
  }
  return Status::Ok();
}

}  // namespace

bool ContextModeSupports(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32 ||
         dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

Result<std::vector<std::byte>> ContextEncode(DType dtype, ByteSpan base,
                                             const SparseChanges& changes) {
  RETURN_IF_ERROR(CheckBase("context encode", dtype, base));
  if (changes.element_size != ElementSize(dtype)) {
    return Status::InvalidArgument("context encode: changes have element size " +
                                   std::to_string(changes.element_size) + ", dtype " +
                                   std::string(DTypeName(dtype)) + " needs " +
                                   std::to_string(ElementSize(dtype)));
  }
  std::vector<std::byte> out;
  // Typical payloads are about one byte per change.
  out.reserve(kHeaderBytes + 8 + changes.size() * 3 / 2);
  out.push_back(std::byte{kContextFormatVersion});
  out.push_back(std::byte{static_cast<uint8_t>(dtype)});
  Status s;
  switch (dtype) {
    case DType::kBF16:
      s = EncodeWith<Bf16Layout>(base, changes, out);
      break;
    case DType::kF16:
      s = EncodeWith<F16Layout>(base, changes, out);
      break;
    case DType::kF8E4M3:
      s = EncodeWith<F8E4M3Layout>(base, changes, out);
      break;
    case DType::kF8E5M2:
      s = EncodeWith<F8E5M2Layout>(base, changes, out);
      break;
    default:
      s = EncodeWith<F32Layout>(base, changes, out);
      break;
  }
  if (!s.ok()) return s;
  return out;
}

Status ContextDecode(DType dtype, ByteSpan payload, ByteSpan base, uint64_t change_count,
                     SparseChanges& out) {
  out.clear();
  RETURN_IF_ERROR(CheckBase("context decode", dtype, base));
  out.element_size = static_cast<uint32_t>(ElementSize(dtype));
  if (payload.size() < kHeaderBytes) {
    return Status::Corrupt("context payload of " + std::to_string(payload.size()) +
                           " bytes is shorter than its header");
  }
  const auto version = static_cast<uint8_t>(payload[0]);
  if (version != kContextFormatVersion) {
    return Status::Corrupt("context payload has format version " + std::to_string(version) +
                           ", this build reads " + std::to_string(kContextFormatVersion));
  }
  const auto coded_dtype = static_cast<uint8_t>(payload[1]);
  if (coded_dtype != static_cast<uint8_t>(dtype)) {
    return Status::Corrupt("context payload was coded for dtype " + std::to_string(coded_dtype) +
                           ", decoding as " + std::string(DTypeName(dtype)));
  }
  const uint64_t elements = base.size() / out.element_size;
  if (change_count > elements) {
    return Status::Corrupt("context payload: change count " + std::to_string(change_count) +
                           " exceeds the partition's " + std::to_string(elements) + " elements");
  }
  const ByteSpan stream = payload.subspan(kHeaderBytes);
  Status s;
  switch (dtype) {
    case DType::kBF16:
      s = DecodeWith<Bf16Layout>(stream, base, change_count, out);
      break;
    case DType::kF16:
      s = DecodeWith<F16Layout>(stream, base, change_count, out);
      break;
    case DType::kF8E4M3:
      s = DecodeWith<F8E4M3Layout>(stream, base, change_count, out);
      break;
    case DType::kF8E5M2:
      s = DecodeWith<F8E5M2Layout>(stream, base, change_count, out);
      break;
    default:
      s = DecodeWith<F32Layout>(stream, base, change_count, out);
      break;
  }
  if (!s.ok()) out.clear();
  return s;
}

}  // namespace deltacast::codec
