// Chunks: the self-contained frames a delta is made of, on disk and on the wire.
// The byte layout is specified in docs/wire-format.md; the constants here are the
// ones that document names.
//
// A chunk holds whole partition records and names the delta's base and target
// versions, so a receiver can verify and apply it without any other chunk. The last
// chunk of a delta is an END chunk that says how many data chunks and records came
// before it and the target layout id, so a receiver knows when it has everything.
//
// Thread safety: ChunkBuilder is used by one thread; ParseChunk is thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "codec/partition_codec.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/partition_hash.h"
#include "common/status.h"

namespace deltacast::codec {

inline constexpr uint32_t kChunkMagic = 0x4B434344;  // "DCCK" in file byte order
// 2: 16-byte partition hashes in records (common/partition_hash.h); 1 had xxh3-64.
inline constexpr uint16_t kWireFormatVersion = 2;
inline constexpr size_t kChunkHeaderBytes = 80;
inline constexpr size_t kRecordFixedBytes = 2 + 4 + 5 * 8 + 2 * 16;  // excluding name and payload
inline constexpr size_t kMaxTensorNameBytes = 1024;
// Decoders refuse larger chunks before allocating. A chunk holds at least one whole
// partition, so this also caps the partition size.
inline constexpr uint64_t kMaxChunkPayloadBytes = 1ull << 30;
inline constexpr uint64_t kMaxPartitionBytes = 256ull << 20;

enum class ChunkKind : uint8_t {
  kData = 1,
  kEnd = 2,
};

// Fields every chunk of one delta shares.
struct DeltaIdentity {
  Digest128 base_version;
  Digest128 target_version;
  uint64_t partition_bytes = 0;
  bool operator==(const DeltaIdentity&) const = default;
};

// One partition's change, as carried in a chunk. Views point into the chunk bytes.
struct PartitionRecord {
  std::string_view tensor_name;
  DType dtype = DType::kU8;
  Encoding encoding = Encoding::kSparseXor;
  EntropyCoder entropy = EntropyCoder::kNone;
  uint64_t element_offset = 0;
  uint64_t element_count = 0;
  uint64_t change_count = 0;
  PartitionHash base_hash;    // the partition's hash at the base version
  PartitionHash target_hash;  // ... and at the target version
  uint64_t raw_size = 0;
  ByteSpan payload;

  RecordCoding Coding() const {
    return {dtype, encoding, entropy, change_count, raw_size, payload, base_hash, target_hash};
  }
};

// The END chunk's summary of the whole delta.
struct DeltaSummary {
  Digest128 target_layout;    // WeightStore::LayoutId of the target
  uint32_t data_chunks = 0;   // data chunks before the END chunk (sequence 0..n-1)
  uint64_t records = 0;       // partition records in those chunks
  uint64_t tensor_bytes = 0;  // size of all tensor data of the target (for statistics)
  uint64_t changed_elements = 0;
};

struct ChunkView {
  ChunkKind kind = ChunkKind::kData;
  DeltaIdentity identity;
  uint32_t sequence = 0;
  std::vector<PartitionRecord> records;  // data chunks
  DeltaSummary summary;                  // END chunk
  size_t size_bytes = 0;                 // header + payload
};

// Accumulates records into one data chunk.
class ChunkBuilder {
 public:
  // `headroom` bytes are left free before the chunk in what Finish returns, so a
  // caller can put a message header there without copying the chunk.
  ChunkBuilder(const DeltaIdentity& identity, uint32_t sequence, size_t headroom = 0);

  // Appends a record; `payload` is copied.
  void Add(std::string_view tensor_name, DType dtype, uint64_t element_offset,
           uint64_t element_count, const PartitionHash& base_hash, const PartitionHash& target_hash,
           const EncodedPartition& encoded);
  // The same from a view of an encoding (a producer's piece, as it arrived).
  void AddView(std::string_view tensor_name, DType dtype, uint64_t element_offset,
               uint64_t element_count, const PartitionHash& base_hash,
               const PartitionHash& target_hash, const PieceView& record);
  // Appends one pieces record made of `pieces` (CombinePieces, written in place:
  // each piece's payload is copied once).
  void AddPieces(std::string_view tensor_name, DType dtype, uint64_t element_offset,
                 uint64_t element_count, const PartitionHash& base_hash,
                 const PartitionHash& target_hash, std::span<const PieceView> pieces);
  size_t record_count() const { return record_count_; }
  // Room for a chunk of `bytes` without growing (and copying) the buffer on the way.
  void Reserve(size_t bytes) { buffer_.reserve(headroom_ + bytes); }
  // Builds in `storage`'s memory instead when it holds more (a finished chunk that a
  // sink did not keep: its pages are already faulted in, where a fresh buffer of a
  // few MiB is a fresh mapping whose every page faults). Only before the first record.
  void Recycle(std::vector<std::byte>&& storage);
  // Bytes the chunk will have if finished now.
  size_t size_bytes() const { return buffer_.size() - headroom_; }
  // The finished chunk (after `headroom` bytes); the builder is then empty.
  std::vector<std::byte> Finish();

 private:
  void PutRecordHeader(std::string_view tensor_name, DType dtype, Encoding encoding,
                       EntropyCoder entropy, uint64_t element_offset, uint64_t element_count,
                       uint64_t change_count, const PartitionHash& base_hash,
                       const PartitionHash& target_hash, uint64_t raw_size, uint64_t payload_size);

  DeltaIdentity identity_;
  uint32_t sequence_;
  size_t headroom_;
  uint32_t record_count_ = 0;
  std::vector<std::byte> buffer_;  // headroom, header space, records
};

std::vector<std::byte> BuildEndChunk(const DeltaIdentity& identity, uint32_t sequence,
                                     const DeltaSummary& summary);

// The header fields of a chunk whose header validated (payload not checked).
struct ChunkHeader {
  ChunkKind kind = ChunkKind::kData;
  DeltaIdentity identity;
  uint32_t sequence = 0;
  uint32_t record_count = 0;
  uint64_t payload_length = 0;
};
// Validates the 80-byte header alone (as ParseChunkHeaderPayloadLength does) and
// returns its fields: enough for a relay to index a chunk it forwards unparsed.
Result<ChunkHeader> PeekChunkHeader(ByteSpan chunk);

// Gives a data chunk built without its delta's identity (a producer's, made before
// the target version id exists) its identity and sequence, in place: header fields
// and header hash only; the payload, and so its hash, is untouched. kCorrupt for a
// chunk whose header does not validate or that is not a data chunk;
// kInvalidArgument for another partition size.
Status RestampChunk(MutableByteSpan chunk, const DeltaIdentity& identity, uint32_t sequence);

// Checks a whole chunk's header and payload checksums (and its length) without
// parsing its records: what a relay verifies before it forwards a chunk.
Status VerifyChunkChecksums(ByteSpan chunk);

// Validates the 80-byte header alone and returns the payload length that follows,
// so a stream reader knows how much to read before calling ParseChunk.
Result<uint64_t> ParseChunkHeaderPayloadLength(ByteSpan header);

// Validates a whole chunk (header, checksums, every record's structure) and returns
// views into `chunk`, which must outlive the result. Corrupt on any violation.
Result<ChunkView> ParseChunk(ByteSpan chunk);
// As ParseChunk without hashing the payload again: only for bytes whose
// VerifyChunkChecksums passed and that stayed in this process's memory since (a
// relay applying the very buffer it verified on arrival). The header's checksum
// and every record's structure are still checked; bytes read back from a file or a
// socket go through ParseChunk.
Result<ChunkView> ParseVerifiedChunk(ByteSpan chunk);

}  // namespace deltacast::codec
