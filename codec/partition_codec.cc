#include "codec/partition_codec.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "codec/change_detect.h"
#include "codec/context_coder.h"
#include "common/crash_point.h"

namespace deltacast::codec {
namespace {

// Longest LEB128 encoding of a 32-bit gap.
constexpr uint64_t kMaxVarint32Bytes = 5;

// Splits n words of `element_size` bytes into element_size planes: plane b holds
// byte b of every word. Grouping bytes of equal significance is what lets a
// general-purpose compressor see that high bytes of XOR words are nearly all zero.
void AppendPlanes(const std::byte* words, size_t n, uint32_t element_size,
                  std::vector<std::byte>& out) {
  const size_t at = out.size();
  out.resize(at + n * element_size);
  std::byte* dst = out.data() + at;
  if (element_size == 1) {
    std::memcpy(dst, words, n);
    return;
  }
  for (uint32_t b = 0; b < element_size; ++b) {
    std::byte* plane = dst + b * n;
    for (size_t i = 0; i < n; ++i) plane[i] = words[i * element_size + b];
  }
}

// Inverse of AppendPlanes: n words from element_size planes. Written per element
// size so the compiler vectorizes the interleave (it is on every receiver's path).
template <uint32_t E>
void JoinPlanesOf(const std::byte* planes, size_t n, std::byte* words) {
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t b = 0; b < E; ++b) words[i * E + b] = planes[b * n + i];
  }
}

void JoinPlanes(const std::byte* planes, size_t n, uint32_t element_size, std::byte* words) {
  switch (element_size) {
    case 1:
      std::memcpy(words, planes, n);
      return;
    case 2:
      return JoinPlanesOf<2>(planes, n, words);
    case 4:
      return JoinPlanesOf<4>(planes, n, words);
    case 8:
      return JoinPlanesOf<8>(planes, n, words);
  }
  for (uint32_t b = 0; b < element_size; ++b) {
    const std::byte* plane = planes + b * n;
    for (size_t i = 0; i < n; ++i) words[i * element_size + b] = plane[i];
  }
}

// Writes the gaps as varints split in two streams: the lead byte of every gap
// (exactly one per change), then all continuation bytes. Most gaps fit their lead
// byte; kept apart, the rare continuations no longer blur the lead bytes' statistics
// for the entropy stage (docs/wire-format.md, "Gaps").
void AppendGaps(const std::vector<uint32_t>& positions, std::vector<std::byte>& out) {
  thread_local std::vector<std::byte> continuation;
  continuation.clear();
  const size_t at = out.size();
  out.resize(at + positions.size());
  std::byte* lead = out.data() + at;
  uint32_t next = 0;
  for (uint32_t p : positions) {
    uint32_t gap = p - next;
    next = p + 1;
    *lead++ = std::byte(static_cast<uint8_t>(gap & 0x7f) | (gap > 0x7f ? 0x80 : 0));
    for (gap >>= 7; gap != 0; gap >>= 7) {
      continuation.push_back(std::byte(static_cast<uint8_t>(gap & 0x7f) | (gap > 0x7f ? 0x80 : 0)));
    }
  }
  out.insert(out.end(), continuation.begin(), continuation.end());
}

// New words at the changed positions (for overwrite records).
void GatherWords(ByteSpan target, const std::vector<uint32_t>& positions, uint32_t element_size,
                 std::vector<std::byte>& out) {
  out.resize(positions.size() * element_size);
  for (size_t i = 0; i < positions.size(); ++i) {
    std::memcpy(out.data() + i * element_size, target.data() + size_t{positions[i]} * element_size,
                element_size);
  }
}

// Runs the entropy stage over `raw`, cut into sections of the given lengths: the
// gap stream (if any) and then one section per byte plane.
EncodedPartition Finish(Encoding encoding, uint64_t change_count, ByteSpan raw, size_t gap_bytes,
                        uint32_t element_size, const EncodeOptions& options) {
  EncodedPartition out;
  out.encoding = encoding;
  out.change_count = change_count;
  out.raw_size = raw.size();
  out.entropy = options.entropy;
  std::vector<ByteSpan> sections;
  if (gap_bytes > 0) {
    sections.push_back(raw.first(change_count));                              // lead bytes
    sections.push_back(raw.subspan(change_count, gap_bytes - change_count));  // continuations
  }
  const size_t plane = (raw.size() - gap_bytes) / element_size;
  for (uint32_t b = 0; b < element_size; ++b)
    sections.push_back(raw.subspan(gap_bytes + b * plane, plane));
  CompressSections(options.entropy, options.zstd_level, sections, out.payload);
  return out;
}

// True when XOR words carry little structure (many touch the sign or exponent byte),
// as when a tensor was re-initialised: then overwrite or literal may be smaller.
bool XorLooksUnstructured(const SparseChanges& changes) {
  const uint32_t e = changes.element_size;
  size_t high = 0;
  for (size_t i = 0; i < changes.size(); ++i) high += changes.xors[i * e + e - 1] != std::byte{0};
  return high * 4 > changes.size();
}

Status ParseSparse(ByteSpan raw, uint64_t element_count, uint64_t change_count,
                   uint32_t element_size, SparseChanges& out, std::vector<std::byte>& words) {
  ByteReader r(raw);
  ByteSpan lead;
  if (!r.GetBytes(change_count, lead))
    return Status::Corrupt("sparse payload: lead bytes are truncated");
  out.element_size = element_size;
  out.clear();
  out.positions.resize(change_count);
  uint32_t* positions = out.positions.data();
  const auto* leads = reinterpret_cast<const uint8_t*>(lead.data());
  // Positions are checked once, at the end: they only grow, a varint adds at most
  // 2^35 per change, so `next` cannot wrap and the last one bounds them all.
  uint64_t next = 0;
  for (uint64_t i = 0; i < change_count; ++i) {
    uint8_t byte = leads[i];
    uint64_t gap = byte & 0x7f;
    if (byte & 0x80) [[unlikely]] {
      for (int shift = 7; byte & 0x80; shift += 7) {
        if (shift > 28 || !r.Get(byte)) {
          return Status::Corrupt("sparse payload: gap " + std::to_string(i) +
                                 " is truncated or too long");
        }
        gap |= uint64_t{byte & 0x7fu} << shift;
      }
    }
    next += gap;
    positions[i] = static_cast<uint32_t>(next);
    ++next;
  }
  if (next > element_count) {
    return Status::Corrupt("sparse payload: its changes run to element " +
                           std::to_string(next - 1) + ", beyond the partition's " +
                           std::to_string(element_count) + " elements");
  }
  ByteSpan planes;
  if (!r.GetBytes(change_count * element_size, planes) || r.remaining() != 0) {
    return Status::Corrupt("sparse payload: word planes are " + std::to_string(r.remaining()) +
                           " bytes, expected " + std::to_string(change_count * element_size));
  }
  words.resize(change_count * element_size);
  JoinPlanes(planes.data(), change_count, element_size, words.data());
  return Status::Ok();
}

// Whether any of the n words of `element_size` bytes is zero.
template <uint32_t E>
bool AnyZeroWordOf(const std::byte* words, size_t n) {
  bool zero = false;
  for (size_t i = 0; i < n; ++i) {
    uint64_t w = 0;
    std::memcpy(&w, words + i * E, E);
    zero |= w == 0;
  }
  return zero;
}

bool AnyZeroWord(const std::byte* words, size_t n, uint32_t element_size) {
  switch (element_size) {
    case 1:
      return AnyZeroWordOf<1>(words, n);
    case 2:
      return AnyZeroWordOf<2>(words, n);
    case 4:
      return AnyZeroWordOf<4>(words, n);
    case 8:
      return AnyZeroWordOf<8>(words, n);
  }
  for (size_t i = 0; i < n; ++i) {
    bool zero = true;
    for (uint32_t k = 0; k < element_size; ++k) zero &= words[i * element_size + k] == std::byte{0};
    if (zero) return true;
  }
  return false;
}

// XORs changes [from, to) into `data`.
template <uint32_t E>
void XorAtOf(std::byte* data, const uint32_t* positions, const std::byte* xors, size_t from,
             size_t to) {
  for (size_t i = from; i < to; ++i) {
    std::byte* dst = data + size_t{positions[i]} * E;
    for (uint32_t k = 0; k < E; ++k) dst[k] ^= xors[i * E + k];
  }
}

void XorAt(MutableByteSpan data, const SparseChanges& changes, size_t from, size_t to) {
  const uint32_t e = changes.element_size;
  const uint32_t* p = changes.positions.data();
  const std::byte* x = changes.xors.data();
  switch (e) {
    case 1:
      return XorAtOf<1>(data.data(), p, x, from, to);
    case 2:
      return XorAtOf<2>(data.data(), p, x, from, to);
    case 4:
      return XorAtOf<4>(data.data(), p, x, from, to);
    case 8:
      return XorAtOf<8>(data.data(), p, x, from, to);
  }
  for (size_t i = from; i < to; ++i) {
    std::byte* dst = data.data() + size_t{p[i]} * e;
    for (uint32_t k = 0; k < e; ++k) dst[k] ^= x[i * e + k];
  }
}

// The apply kernels below write one window of the partition, then hash the stored
// window at its offset while it is still in L2 (pieces combine by XOR:
// docs/wire-format.md, "Pieces"), so the partition's memory is read and written once.
// Hashing after a whole 4 MiB partition was written would read it back from L3 or
// DRAM (L2 is 2 MiB per core here). A multiple of 8 (no element spans two windows)
// and of 16 (pieces start on a block boundary).
constexpr size_t kApplyWindowBytes = size_t{64} << 10;

PartitionHash HashWindow(MutableByteSpan data, size_t at, size_t end) {
  return HashPiece(ByteSpan(data.data() + at, end - at), at);
}

// XORs the changes in and hashes the stored bytes in one pass; undoes them on a
// mismatch.
Status ApplySparseVerified(MutableByteSpan data, const SparseChanges& changes,
                           const PartitionHash& target_hash) {
  const uint32_t e = changes.element_size;
  const size_t n = changes.size();
  const size_t half = n / 2;
  PartitionHash h = PartitionLengthTerm(data.size());
  size_t i = 0;
  // Fault-injection tests stop half-way through the changes to leave a torn
  // partition behind.
  if (n == 0) CrashPoint("apply.mid_partition");
  for (size_t at = 0; at < data.size(); at += kApplyWindowBytes) {
    const size_t end = std::min(data.size(), at + kApplyWindowBytes);
    const size_t first = i;
    while (i < n && size_t{changes.positions[i]} * e < end) ++i;
    if (first <= half && half < i) {
      XorAt(data, changes, first, half);
      CrashPoint("apply.mid_partition");
      XorAt(data, changes, half, i);
    } else {
      XorAt(data, changes, first, i);
    }
    h ^= HashWindow(data, at, end);
  }
  if (h == target_hash) return Status::Ok();
  XorAt(data, changes, 0, n);  // XOR is self-inverse: this restores the base bytes
  return Status::Corrupt("partition does not hash to its target after apply; left at base");
}

// XORs a whole-partition mask in (dense-XOR) and hashes the stored bytes in one
// pass; XORs it again on a mismatch.
Status ApplyDenseVerified(MutableByteSpan data, ByteSpan mask, const PartitionHash& target_hash) {
  PartitionHash h = PartitionLengthTerm(data.size());
  for (size_t at = 0; at < data.size(); at += kApplyWindowBytes) {
    const size_t end = std::min(data.size(), at + kApplyWindowBytes);
    for (size_t k = at; k < end; ++k) data[k] ^= mask[k];
    h ^= HashWindow(data, at, end);
  }
  if (h == target_hash) return Status::Ok();
  for (size_t k = 0; k < data.size(); ++k) data[k] ^= mask[k];
  return Status::Corrupt("partition does not hash to its target after apply; left at base");
}

// Copies the target bytes in (literal) and hashes the stored bytes in one pass,
// keeping the old bytes in `old` to put back on a mismatch.
Status ApplyWholeVerified(MutableByteSpan data, ByteSpan target, std::vector<std::byte>& old,
                          const PartitionHash& target_hash) {
  old.resize(data.size());
  PartitionHash h = PartitionLengthTerm(data.size());
  for (size_t at = 0; at < data.size(); at += kApplyWindowBytes) {
    const size_t end = std::min(data.size(), at + kApplyWindowBytes);
    std::memcpy(old.data() + at, data.data() + at, end - at);
    std::memcpy(data.data() + at, target.data() + at, end - at);
    h ^= HashWindow(data, at, end);
  }
  if (h == target_hash) return Status::Ok();
  std::memcpy(data.data(), old.data(), data.size());
  return Status::Corrupt("partition does not hash to its target after apply; left at base");
}

Status CheckLeadsToTarget(const RecordCoding& record, const PartitionHash& reached) {
  if (reached == record.target_hash) return Status::Ok();
  return Status::Corrupt("the record's result does not hash to its target: it takes base hash " +
                         record.base_hash.ShortHex() + " to " + reached.ShortHex() + ", not to " +
                         record.target_hash.ShortHex() + "; refused before writing");
}

// Decodes a kPieces payload into one list of XOR changes over the partition:
// every piece parsed like the record it would be on its own, overwrite words turned
// into XOR words against `base`, the union checked to hold each position once.
Status DecodePieces(const RecordCoding& record, ByteSpan base, uint64_t count, uint32_t e,
                    SparseChanges& out, CodecScratch& scratch) {
  ByteReader r(record.payload);
  uint32_t pieces = 0;
  if (!r.Get(pieces) || pieces < 2 || pieces > kMaxPieces) {
    return Status::Corrupt("pieces record: piece count " + std::to_string(pieces) +
                           " is outside 2.." + std::to_string(kMaxPieces));
  }
  out.clear();
  out.element_size = e;
  out.positions.reserve(record.change_count);
  out.xors.reserve(record.change_count * e);
  thread_local SparseChanges piece;
  thread_local std::vector<std::byte> raw, words;
  uint64_t changes = 0, raw_total = 0;
  bool sorted = true;
  for (uint32_t i = 0; i < pieces; ++i) {
    uint8_t encoding = 0, entropy = 0;
    uint16_t reserved = 0;
    uint64_t piece_changes = 0, raw_size = 0, payload_size = 0;
    ByteSpan payload;
    if (!r.Get(encoding) || !r.Get(entropy) || !r.Get(reserved) || !r.Get(piece_changes) ||
        !r.Get(raw_size) || !r.Get(payload_size) || !r.GetBytes(payload_size, payload)) {
      return Status::Corrupt("pieces record: piece " + std::to_string(i) + " is truncated");
    }
    const auto enc = static_cast<Encoding>(encoding);
    if ((enc != Encoding::kSparseXor && enc != Encoding::kOverwrite) || reserved != 0 ||
        entropy > static_cast<uint8_t>(EntropyCoder::kLz4)) {
      return Status::Corrupt("pieces record: piece " + std::to_string(i) + " has encoding " +
                             std::to_string(encoding) + ", entropy " + std::to_string(entropy) +
                             " (a piece is sparse-xor or overwrite)");
    }
    if (piece_changes == 0 || piece_changes > record.change_count - changes ||
        raw_size > MaxRawSize(enc, count, e, piece_changes)) {
      return Status::Corrupt("pieces record: piece " + std::to_string(i) +
                             " declares more changes or raw bytes than the record allows");
    }
    changes += piece_changes;
    raw_total += raw_size;
    raw.resize(raw_size);
    RETURN_IF_ERROR(DecompressSections(static_cast<EntropyCoder>(entropy), payload, raw));
    RETURN_IF_ERROR(ParseSparse(raw, count, piece_changes, e, piece, words));
    for (size_t k = 0; k < piece.size(); ++k) {
      const uint32_t pos = piece.positions[k];
      if (!out.positions.empty() && pos <= out.positions.back()) sorted = false;
      out.positions.push_back(pos);
      const std::byte* w = words.data() + k * e;
      bool zero = true;
      for (uint32_t b = 0; b < e; ++b) {
        const std::byte x = enc == Encoding::kOverwrite ? w[b] ^ base[size_t{pos} * e + b] : w[b];
        zero &= x == std::byte{0};
        out.xors.push_back(x);
      }
      if (zero && enc == Encoding::kSparseXor) {
        return Status::Corrupt("pieces record: a sparse-xor piece lists a zero XOR word");
      }
    }
  }
  if (r.remaining() != 0 || changes != record.change_count || raw_total != record.raw_size) {
    return Status::Corrupt(
        "pieces record: pieces add up to " + std::to_string(changes) + " changes and " +
        std::to_string(raw_total) + " raw bytes, the record declares " +
        std::to_string(record.change_count) + " and " + std::to_string(record.raw_size) +
        (r.remaining() ? " (trailing bytes)" : ""));
  }
  if (!sorted) {
    // Pieces from different producers interleave (a row split): one sort by position.
    std::vector<uint32_t> order(out.positions.size());
    for (uint32_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return out.positions[a] < out.positions[b]; });
    SparseChanges& s = scratch.changes;
    s.element_size = e;
    s.positions.resize(order.size());
    s.xors.resize(out.xors.size());
    for (size_t k = 0; k < order.size(); ++k) {
      s.positions[k] = out.positions[order[k]];
      std::memcpy(s.xors.data() + k * e, out.xors.data() + size_t{order[k]} * e, e);
      if (k > 0 && s.positions[k] == s.positions[k - 1]) {
        return Status::Corrupt("pieces record: two pieces change element " +
                               std::to_string(s.positions[k]) + " of the partition");
      }
    }
    out.positions.swap(s.positions);
    out.xors.swap(s.xors);
  }
  return Status::Ok();
}

}  // namespace

std::string_view EncodingName(Encoding encoding) {
  switch (encoding) {
    case Encoding::kSparseXor:
      return "sparse-xor";
    case Encoding::kDenseXor:
      return "dense-xor";
    case Encoding::kOverwrite:
      return "overwrite";
    case Encoding::kLiteral:
      return "literal";
    case Encoding::kContextXor:
      return "context-xor";
    case Encoding::kPieces:
      return "pieces";
  }
  return "unknown";
}

uint64_t MaxRawSize(Encoding encoding, uint64_t element_count, uint32_t element_size,
                    uint64_t change_count) {
  switch (encoding) {
    case Encoding::kSparseXor:
    case Encoding::kOverwrite:
      return change_count * (kMaxVarint32Bytes + element_size);
    case Encoding::kDenseXor:
    case Encoding::kLiteral:
      return element_count * element_size;
    case Encoding::kContextXor:
      return 0;  // no entropy stage: raw size must be 0, payload size is the coder's own
    case Encoding::kPieces:
      // The pieces' raw sizes added up: each is sparse-XOR or overwrite.
      return change_count * (kMaxVarint32Bytes + element_size);
  }
  return 0;
}

Result<EncodedPartition> EncodePartitionAs(Encoding encoding, DType dtype, ByteSpan base,
                                           ByteSpan target, const SparseChanges& changes,
                                           const EncodeOptions& options, CodecScratch& scratch) {
  const uint32_t e = static_cast<uint32_t>(ElementSize(dtype));
  const size_t count = base.size() / e;
  std::vector<std::byte>& raw = scratch.raw;
  raw.clear();
  size_t gap_bytes = 0;
  switch (encoding) {
    case Encoding::kSparseXor:
      AppendGaps(changes.positions, raw);
      gap_bytes = raw.size();
      AppendPlanes(changes.xors.data(), changes.size(), e, raw);
      break;
    case Encoding::kOverwrite:
      AppendGaps(changes.positions, raw);
      gap_bytes = raw.size();
      GatherWords(target, changes.positions, e, scratch.bytes);
      AppendPlanes(scratch.bytes.data(), changes.size(), e, raw);
      break;
    case Encoding::kDenseXor:
      scratch.bytes.resize(base.size());
      for (size_t i = 0; i < base.size(); ++i) scratch.bytes[i] = base[i] ^ target[i];
      AppendPlanes(scratch.bytes.data(), count, e, raw);
      break;
    case Encoding::kLiteral:
      AppendPlanes(target.data(), count, e, raw);
      break;
    case Encoding::kPieces:
      return Status::InvalidArgument("pieces records are combined from pieces (CombinePieces)");
    case Encoding::kContextXor: {
      if (!ContextModeSupports(dtype)) {
        return Status::Unsupported("context mode does not model " + std::string(DTypeName(dtype)));
      }
      ASSIGN_OR_RETURN(auto payload, ContextEncode(dtype, base, changes));
      EncodedPartition out;
      out.encoding = Encoding::kContextXor;
      out.entropy = EntropyCoder::kNone;
      out.change_count = changes.size();
      out.raw_size = 0;
      out.payload = std::move(payload);
      return out;
    }
  }
  return Finish(encoding, changes.size(), raw, gap_bytes, e, options);
}

EncodedPartition EncodeChanges(Encoding encoding, DType dtype, const SparseChanges& changes,
                               const std::byte* new_words, const EncodeOptions& options,
                               CodecScratch& scratch) {
  const uint32_t e = static_cast<uint32_t>(ElementSize(dtype));
  std::vector<std::byte>& raw = scratch.raw;
  raw.clear();
  AppendGaps(changes.positions, raw);
  const size_t gap_bytes = raw.size();
  const std::byte* words = encoding == Encoding::kOverwrite ? new_words : changes.xors.data();
  AppendPlanes(words, changes.size(), e, raw);
  return Finish(encoding, changes.size(), raw, gap_bytes, e, options);
}

void AppendPiecesPayload(std::span<const PieceView> pieces, std::vector<std::byte>& out) {
  size_t bytes = 4;
  for (const PieceView& p : pieces) bytes += kPieceHeaderBytes + p.payload.size();
  out.reserve(out.size() + bytes);
  ByteWriter w(out);
  w.Put<uint32_t>(static_cast<uint32_t>(pieces.size()));
  for (const PieceView& p : pieces) {
    w.Put<uint8_t>(static_cast<uint8_t>(p.encoding));
    w.Put<uint8_t>(static_cast<uint8_t>(p.entropy));
    w.Put<uint16_t>(0);
    w.Put<uint64_t>(p.change_count);
    w.Put<uint64_t>(p.raw_size);
    w.Put<uint64_t>(p.payload.size());
    w.PutBytes(p.payload);
  }
}

EncodedPartition CombinePieces(std::span<const EncodedPartition* const> pieces) {
  EncodedPartition out;
  out.encoding = Encoding::kPieces;
  out.entropy = EntropyCoder::kNone;
  std::vector<PieceView> views;
  for (const EncodedPartition* p : pieces) {
    views.push_back({p->encoding, p->entropy, p->change_count, p->raw_size, p->payload});
    out.change_count += p->change_count;
    out.raw_size += p->raw_size;
  }
  AppendPiecesPayload(views, out.payload);
  return out;
}

std::optional<EncodedPartition> EncodePartition(DType dtype, ByteSpan base, ByteSpan target,
                                                const EncodeOptions& options, CodecScratch& scratch,
                                                PartitionHash* base_piece) {
  const uint32_t e = static_cast<uint32_t>(ElementSize(dtype));
  if (base_piece != nullptr) {
    *base_piece = FindChangesHashingBase(base, target, e, 0, scratch.changes);
  } else {
    FindChanges(base, target, e, scratch.changes);
  }
  return EncodeFoundChanges(dtype, base, target, options, scratch);
}

namespace {

// The encodings worth trying for these changes of a partition of `count` elements,
// sparse-XOR first.
std::vector<Encoding> Candidates(DType dtype, uint64_t count, const SparseChanges& changes,
                                 const EncodeOptions& options) {
  std::vector<Encoding> candidates = {Encoding::kSparseXor};
  const bool dense = changes.size() * 4 > count;
  const bool unstructured = XorLooksUnstructured(changes);
  if (options.try_every_encoding || dense) candidates.push_back(Encoding::kDenseXor);
  if (options.try_every_encoding || unstructured) candidates.push_back(Encoding::kOverwrite);
  if (options.try_every_encoding || (dense && unstructured))
    candidates.push_back(Encoding::kLiteral);
  if ((options.mode == CodecMode::kContext || options.try_every_encoding) &&
      ContextModeSupports(dtype)) {
    candidates.push_back(Encoding::kContextXor);
  }
  return candidates;
}

}  // namespace

bool FoundChangesNeedBytes(DType dtype, uint64_t element_count, const SparseChanges& changes,
                           const EncodeOptions& options) {
  return changes.size() > 0 && Candidates(dtype, element_count, changes, options).size() > 1;
}

std::optional<EncodedPartition> EncodeFoundSparse(DType dtype, const EncodeOptions& options,
                                                  CodecScratch& scratch) {
  if (scratch.changes.size() == 0) return std::nullopt;
  return EncodeChanges(Encoding::kSparseXor, dtype, scratch.changes, nullptr, options, scratch);
}

std::optional<EncodedPartition> EncodeFoundChanges(DType dtype, ByteSpan base, ByteSpan target,
                                                   const EncodeOptions& options,
                                                   CodecScratch& scratch) {
  const uint32_t e = static_cast<uint32_t>(ElementSize(dtype));
  const SparseChanges& changes = scratch.changes;
  if (changes.size() == 0) return std::nullopt;
  const std::vector<Encoding> candidates = Candidates(dtype, base.size() / e, changes, options);

  std::optional<EncodedPartition> best;
  for (Encoding encoding : candidates) {
    auto encoded = EncodePartitionAs(encoding, dtype, base, target, changes, options, scratch);
    if (!encoded.ok()) continue;  // only context mode can refuse, and sparse XOR never does
    if (!best || encoded->payload.size() < best->payload.size()) best = std::move(*encoded);
  }
  return best;
}

Status DecodeAndCheckRecord(const RecordCoding& record, ByteSpan base, DecodedRecord& out,
                            CodecScratch& scratch) {
  const uint32_t e = static_cast<uint32_t>(ElementSize(record.dtype));
  const uint64_t count = base.size() / e;
  out.form = DecodedRecord::Form::kChanges;
  out.changes.clear();
  out.changes.element_size = e;
  if (record.change_count > count) {
    return Status::Corrupt("record declares " + std::to_string(record.change_count) +
                           " changes in a partition of " + std::to_string(count) + " elements");
  }
  auto check_mask = [&] {
    return CheckLeadsToTarget(
        record,
        record.base_hash ^ HashSparseMask(out.changes.positions, out.changes.xors.data(), e));
  };
  if (record.encoding == Encoding::kContextXor) {
    if (!ContextModeSupports(record.dtype)) {
      return Status::Corrupt("context-xor record for unsupported dtype " +
                             std::string(DTypeName(record.dtype)));
    }
    if (record.raw_size != 0) return Status::Corrupt("context-xor record must declare raw size 0");
    RETURN_IF_ERROR(
        ContextDecode(record.dtype, record.payload, base, record.change_count, out.changes));
    return check_mask();
  }

  if (record.encoding == Encoding::kPieces) {
    RETURN_IF_ERROR(DecodePieces(record, base, count, e, out.changes, scratch));
    return check_mask();
  }
  const uint64_t max_raw = MaxRawSize(record.encoding, count, e, record.change_count);
  if (record.raw_size > max_raw) {
    return Status::Corrupt("record declares raw size " + std::to_string(record.raw_size) +
                           " above the bound " + std::to_string(max_raw) + " for its encoding");
  }
  scratch.raw.resize(record.raw_size);
  RETURN_IF_ERROR(DecompressSections(record.entropy, record.payload, scratch.raw));
  const ByteSpan raw = scratch.raw;

  switch (record.encoding) {
    case Encoding::kSparseXor: {
      RETURN_IF_ERROR(ParseSparse(raw, count, record.change_count, e, out.changes, scratch.bytes));
      out.changes.xors.swap(scratch.bytes);
      if (AnyZeroWord(out.changes.xors.data(), out.changes.size(), e))
        return Status::Corrupt("sparse-xor payload lists an element with a zero XOR word");
      return check_mask();
    }
    case Encoding::kOverwrite: {
      RETURN_IF_ERROR(ParseSparse(raw, count, record.change_count, e, out.changes, scratch.bytes));
      // New words become XOR words against the base, so the same mask check and the
      // same verified, undoable apply serve both encodings.
      out.changes.xors.resize(scratch.bytes.size());
      for (size_t i = 0; i < out.changes.size(); ++i) {
        const std::byte* old = base.data() + size_t{out.changes.positions[i]} * e;
        for (uint32_t k = 0; k < e; ++k) {
          out.changes.xors[i * e + k] = scratch.bytes[i * e + k] ^ old[k];
        }
      }
      return check_mask();
    }
    case Encoding::kDenseXor:
    case Encoding::kLiteral: {
      if (record.raw_size != base.size()) {
        return Status::Corrupt("record declares raw size " + std::to_string(record.raw_size) +
                               " for a partition of " + std::to_string(base.size()) + " bytes");
      }
      out.whole.resize(base.size());
      JoinPlanes(raw.data(), count, e, out.whole.data());
      if (record.encoding == Encoding::kLiteral) {
        out.form = DecodedRecord::Form::kWholeTarget;
        return CheckLeadsToTarget(record, HashPartition(out.whole));
      }
      out.form = DecodedRecord::Form::kDenseMask;
      return CheckLeadsToTarget(record, record.base_hash ^ HashPiece(out.whole, 0));
    }
    case Encoding::kContextXor:
    case Encoding::kPieces:
      break;
  }
  return Status::Corrupt("unknown encoding " + std::to_string(static_cast<int>(record.encoding)));
}

bool RecordNeedsBase(Encoding encoding) {
  // Pieces may hold overwrite pieces, which decode against the old bytes.
  return encoding == Encoding::kOverwrite || encoding == Encoding::kContextXor ||
         encoding == Encoding::kPieces;
}

bool RecordIsSelfInverse(Encoding encoding, ByteSpan payload) {
  if (encoding == Encoding::kSparseXor || encoding == Encoding::kDenseXor) return true;
  if (encoding != Encoding::kPieces) return false;
  ByteReader r(payload);
  uint32_t pieces = 0;
  if (!r.Get(pieces)) return false;
  for (uint32_t i = 0; i < pieces; ++i) {
    uint8_t enc = 0, entropy = 0;
    uint16_t reserved = 0;
    uint64_t changes = 0, raw = 0, size = 0;
    ByteSpan body;
    if (!r.Get(enc) || !r.Get(entropy) || !r.Get(reserved) || !r.Get(changes) || !r.Get(raw) ||
        !r.Get(size) || !r.GetBytes(size, body) ||
        enc != static_cast<uint8_t>(Encoding::kSparseXor)) {
      return false;
    }
  }
  return true;
}

Status ApplyDecodedRecord(DecodedRecord& decoded, MutableByteSpan data,
                          const PartitionHash& target_hash, CodecScratch& scratch) {
  using Form = DecodedRecord::Form;
  if (decoded.form == Form::kChanges)
    return ApplySparseVerified(data, decoded.changes, target_hash);
  if (decoded.whole.size() != data.size()) {
    return Status::Corrupt("decoded record is for a partition of another size; left at base");
  }
  if (decoded.form == Form::kDenseMask) return ApplyDenseVerified(data, decoded.whole, target_hash);
  return ApplyWholeVerified(data, decoded.whole, scratch.bytes, target_hash);
}

Status ApplyDecodedRecord(DecodedRecord& decoded, MutableByteSpan data,
                          const PartitionHash& target_hash) {
  CodecScratch scratch;
  return ApplyDecodedRecord(decoded, data, target_hash, scratch);
}

Status ApplyEncodedPartition(const RecordCoding& record, MutableByteSpan data,
                             CodecScratch& scratch) {
  RETURN_IF_ERROR(DecodeAndCheckRecord(record, data, scratch.decoded, scratch));
  return ApplyDecodedRecord(scratch.decoded, data, record.target_hash, scratch);
}

}  // namespace deltacast::codec
