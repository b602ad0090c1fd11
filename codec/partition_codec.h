// Per-partition encodings: how the change from a partition's base bytes to its
// target bytes is written, and how a receiver applies it. Payload layouts are
// specified in docs/wire-format.md ("Partition payloads").
//
// Thread safety: pure functions; each thread passes its own CodecScratch.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "codec/changes.h"
#include "codec/entropy.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/status.h"

namespace deltacast::codec {

enum class Encoding : uint8_t {
  kSparseXor = 1,   // gaps between changed elements + XOR words, byte-planed
  kDenseXor = 2,    // XOR of every element, byte-planed
  kOverwrite = 3,   // gaps + new words, byte-planed (for changes XOR cannot serve)
  kLiteral = 4,     // the whole target partition, byte-planed
  kContextXor = 5,  // context-modelled changes (codec/context_coder.h); no entropy stage
};
inline constexpr uint8_t kMaxEncoding = 5;
std::string_view EncodingName(Encoding encoding);

enum class CodecMode {
  kFast,     // change detection + byte planes + zstd/lz4
  kContext,  // also tries the context coder on float partitions; keeps the smaller
};

struct EncodeOptions {
  CodecMode mode = CodecMode::kFast;
  EntropyCoder entropy = EntropyCoder::kZstd;
  int zstd_level = 1;
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

// Reused buffers so steady-state encoding and decoding do not allocate.
struct CodecScratch {
  SparseChanges changes;
  std::vector<std::byte> raw;
  std::vector<std::byte> bytes;
};

// Encodes the change base -> target of one partition of `dtype` elements with the
// smallest encoding the options allow. nullopt when the partition is unchanged.
std::optional<EncodedPartition> EncodePartition(DType dtype, ByteSpan base, ByteSpan target,
                                                const EncodeOptions& options,
                                                CodecScratch& scratch);

// Encodes with one given encoding; `changes` must be FindChanges(base, target).
// Unsupported for kContextXor on dtypes the context coder does not model.
Result<EncodedPartition> EncodePartitionAs(Encoding encoding, DType dtype, ByteSpan base,
                                           ByteSpan target, const SparseChanges& changes,
                                           const EncodeOptions& options, CodecScratch& scratch);

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
  uint64_t target_hash = 0;
};

// Applies `record` to `data`, which must hold the partition at its base version.
// Success: `data` holds the target and hashes (xxh3-64) to record.target_hash.
// Failure (malformed payload, or a result with the wrong hash): `data` is exactly as
// it was. Does not check the base hash; the caller does.
Status ApplyEncodedPartition(const RecordCoding& record, MutableByteSpan data,
                             CodecScratch& scratch);

}  // namespace deltacast::codec
