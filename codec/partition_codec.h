// Per-partition encodings: how the change from a partition's base bytes to its
// target bytes is written, and how a receiver applies it. Payload layouts are
// specified in docs/wire-format.md ("Partition payloads").
//
// Thread safety: pure functions; each thread passes its own CodecScratch.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "codec/changes.h"
#include "codec/entropy.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/partition_hash.h"
#include "common/status.h"

namespace deltacast::codec {

enum class Encoding : uint8_t {
  kSparseXor = 1,   // gaps between changed elements + XOR words, byte-planed
  kDenseXor = 2,    // XOR of every element, byte-planed
  kOverwrite = 3,   // gaps + new words, byte-planed (for changes XOR cannot serve)
  kLiteral = 4,     // the whole target partition, byte-planed
  kContextXor = 5,  // context-modelled changes (codec/context_coder.h); no entropy stage
  kPieces = 6,      // disjoint pieces of one partition (each sparse-XOR or overwrite),
                    // encoded by the producers that hold them; no entropy stage of its own
};
inline constexpr uint8_t kMaxEncoding = 6;
// A pieces payload: u32 piece count, then per piece this header (encoding u8,
// entropy u8, reserved u16, change count u64, raw size u64, payload size u64) and
// its payload.
inline constexpr size_t kPieceHeaderBytes = 28;
inline constexpr uint32_t kMaxPieces = 1u << 16;
std::string_view EncodingName(Encoding encoding);

enum class CodecMode {
  kFast,     // change detection + byte planes + zstd/lz4
  kContext,  // also tries the context coder on float partitions; keeps the smaller
};

struct EncodeOptions {
  CodecMode mode = CodecMode::kFast;
  EntropyCoder entropy = EntropyCoder::kZstd;
  // zstd's level, negative for faster (codec/entropy.cc sets the other parameters).
  int zstd_level = -5;
  // Tries every encoding instead of skipping the ones a cheap estimate rules out.
  bool try_every_encoding = false;
};

struct EncodedPartition {
  Encoding encoding = Encoding::kSparseXor;
  EntropyCoder entropy = EntropyCoder::kNone;
  uint64_t change_count = 0;  // elements whose bits changed
  uint64_t raw_size = 0;      // payload size before the entropy stage
  std::vector<std::byte> payload;
};

// A decoded record: what applying it will write, held aside so it can be checked
// before anything is written.
struct DecodedRecord {
  enum class Form : uint8_t {
    kChanges,      // `changes`: XOR words against the base (sparse-XOR, context-XOR, and
                   // overwrite, whose new words become XOR words with the old ones)
    kDenseMask,    // `whole`: the XOR of every byte (dense-XOR)
    kWholeTarget,  // `whole`: the target bytes (literal)
  };
  Form form = Form::kChanges;
  SparseChanges changes;
  std::vector<std::byte> whole;

  // Heap bytes held, for callers that keep many.
  size_t MemoryBytes() const {
    return changes.positions.capacity() * sizeof(uint32_t) + changes.xors.capacity() +
           whole.capacity();
  }
};

// Reused buffers so steady-state encoding and decoding do not allocate.
struct CodecScratch {
  SparseChanges changes;
  std::vector<std::byte> raw;
  std::vector<std::byte> bytes;
  DecodedRecord decoded;  // ApplyEncodedPartition's
};

// Encodes the change base -> target of one partition of `dtype` elements with the
// smallest encoding the options allow. nullopt when the partition is unchanged. With
// `base_piece`, also sets it to HashPiece(base, 0) (the hash of `base` without its
// length term), computed in the compare pass (FindChangesHashingBase), whether or not
// the partition changed.
std::optional<EncodedPartition> EncodePartition(DType dtype, ByteSpan base, ByteSpan target,
                                                const EncodeOptions& options, CodecScratch& scratch,
                                                PartitionHash* base_piece = nullptr);

// EncodePartition for a caller that found the changes itself: `scratch.changes`
// holds FindChanges(base, target) (found tile by tile while each tile was in cache,
// as the delta encoder does with bytes it copies in). nullopt when it is empty.
std::optional<EncodedPartition> EncodeFoundChanges(DType dtype, ByteSpan base, ByteSpan target,
                                                   const EncodeOptions& options,
                                                   CodecScratch& scratch);

// Whether EncodeFoundChanges would read the partition's bytes for these changes of
// a partition of `element_count` elements: false when sparse-XOR is the only
// encoding worth trying (few, structured changes in fast mode), which is built from
// the changes alone.
bool FoundChangesNeedBytes(DType dtype, uint64_t element_count, const SparseChanges& changes,
                           const EncodeOptions& options);
// EncodeFoundChanges where FoundChangesNeedBytes is false: the same record, from
// `scratch.changes` alone (the delta encoder compares copied tiles and keeps only
// their changes). nullopt when there are none.
std::optional<EncodedPartition> EncodeFoundSparse(DType dtype, const EncodeOptions& options,
                                                  CodecScratch& scratch);

// Encodes with one given encoding; `changes` must be FindChanges(base, target).
// Unsupported for kContextXor on dtypes the context coder does not model.
Result<EncodedPartition> EncodePartitionAs(Encoding encoding, DType dtype, ByteSpan base,
                                           ByteSpan target, const SparseChanges& changes,
                                           const EncodeOptions& options, CodecScratch& scratch);

// Encodes known changes without the partition's bytes (a producer's piece of a
// partition, or a partition assembled from several local runs): kSparseXor from
// changes.xors, or kOverwrite from `new_words` (changes.size() words). Positions are
// relative to the partition, strictly increasing.
EncodedPartition EncodeChanges(Encoding encoding, DType dtype, const SparseChanges& changes,
                               const std::byte* new_words, const EncodeOptions& options,
                               CodecScratch& scratch);

// An encoded partition or piece whose payload lies elsewhere (in a message).
struct PieceView {
  Encoding encoding = Encoding::kSparseXor;
  EntropyCoder entropy = EntropyCoder::kNone;
  uint64_t change_count = 0;
  uint64_t raw_size = 0;
  ByteSpan payload;
};

// One kPieces record from the pieces several producers encoded of one partition
// (each kSparseXor or kOverwrite, over disjoint positions; docs/wire-format.md,
// "Pieces"). The piece payloads are copied once, never re-encoded.
EncodedPartition CombinePieces(std::span<const EncodedPartition* const> pieces);
// Appends the payload of a pieces record made of `pieces` to `out`.
void AppendPiecesPayload(std::span<const PieceView> pieces, std::vector<std::byte>& out);

// The largest raw size a well-formed record with these counts can declare; decoders
// refuse anything larger before allocating.
uint64_t MaxRawSize(Encoding encoding, uint64_t element_count, uint32_t element_size,
                    uint64_t change_count);

// What a receiver needs to apply one record.
struct RecordCoding {
  DType dtype = DType::kU8;
  Encoding encoding = Encoding::kSparseXor;
  EntropyCoder entropy = EntropyCoder::kNone;
  uint64_t change_count = 0;
  uint64_t raw_size = 0;
  ByteSpan payload;
  PartitionHash base_hash;
  PartitionHash target_hash;
};

// Check before write. Decodes `record` into `out` and checks that it takes
// record.base_hash to record.target_hash, using H(base ^ mask) = H(base) ^ H(mask)
// (docs/wire-format.md, "Partition hash"): for XOR encodings from the mask alone
// (O(changed words) for sparse-XOR), for overwrite with the old values at the
// written positions, for literal by hashing the new bytes. `base` (the partition's
// bytes at the base version, read and never written) is read only by overwrite and
// context-XOR records (RecordNeedsBase); the others take its size alone. kCorrupt on
// a malformed payload or a record that fails the check (`out` is then unspecified).
Status DecodeAndCheckRecord(const RecordCoding& record, ByteSpan base, DecodedRecord& out,
                            CodecScratch& scratch);
bool RecordNeedsBase(Encoding encoding);
// Whether applying the record to its target gives its base back (XOR records:
// sparse-XOR, dense-XOR, and pieces records whose pieces are all sparse-XOR).
bool RecordIsSelfInverse(Encoding encoding, ByteSpan payload);

// Writes `decoded` (from DecodeAndCheckRecord; for overwrite and context-XOR against
// these same bytes) into `data`, which should be at the base version, and verifies
// that the stored result hashes to `target_hash`. One pass: each 64 KiB window is
// written and then hashed where it lies while still in cache, so verifying costs no
// second trip to memory. On a mismatch (`data` was not at the base, or changed
// meanwhile) `data` is exactly as it was (XOR is undone; a literal's old bytes are
// kept in scratch.bytes and put back) and the result is kCorrupt. `decoded` is not
// changed. The overload without scratch allocates its own.
Status ApplyDecodedRecord(DecodedRecord& decoded, MutableByteSpan data,
                          const PartitionHash& target_hash, CodecScratch& scratch);
Status ApplyDecodedRecord(DecodedRecord& decoded, MutableByteSpan data,
                          const PartitionHash& target_hash);

// DecodeAndCheckRecord then ApplyDecodedRecord, with scratch.decoded. `data` must
// hold the partition at its base version (the caller checks its hash). Success:
// `data` holds the target and hashes to record.target_hash. Failure: `data` is
// exactly as it was.
Status ApplyEncodedPartition(const RecordCoding& record, MutableByteSpan data,
                             CodecScratch& scratch);

}  // namespace deltacast::codec
