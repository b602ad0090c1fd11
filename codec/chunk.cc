#include "codec/chunk.h"

#include <string>

namespace deltacast::codec {
namespace {

// Header field offsets (docs/wire-format.md, "Chunk header").
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffKind = 6;
constexpr size_t kOffFlags = 7;
constexpr size_t kOffBase = 8;
constexpr size_t kOffTarget = 24;
constexpr size_t kOffPartitionBytes = 40;
constexpr size_t kOffSequence = 48;
constexpr size_t kOffRecordCount = 52;
constexpr size_t kOffPayloadLength = 56;
constexpr size_t kOffPayloadHash = 64;
constexpr size_t kOffHeaderHash = 72;
constexpr size_t kEndPayloadBytes = 16 + 4 + 4 + 8 + 8 + 8;

// Writes the header of a chunk whose payload follows it at h + kChunkHeaderBytes.
void WriteHeader(std::byte* h, ChunkKind kind, const DeltaIdentity& identity, uint32_t sequence,
                 uint32_t record_count, ByteSpan payload) {
  StoreLE<uint32_t>(h + kOffMagic, kChunkMagic);
  StoreLE<uint16_t>(h + kOffVersion, kWireFormatVersion);
  h[kOffKind] = std::byte(static_cast<uint8_t>(kind));
  h[kOffFlags] = std::byte{0};
  std::memcpy(h + kOffBase, identity.base_version.bytes.data(), 16);
  std::memcpy(h + kOffTarget, identity.target_version.bytes.data(), 16);
  StoreLE<uint64_t>(h + kOffPartitionBytes, identity.partition_bytes);
  StoreLE<uint32_t>(h + kOffSequence, sequence);
  StoreLE<uint32_t>(h + kOffRecordCount, record_count);
  StoreLE<uint64_t>(h + kOffPayloadLength, payload.size());
  StoreLE<uint64_t>(h + kOffPayloadHash, Hash64(payload));
  StoreLE<uint64_t>(h + kOffHeaderHash, Hash64(ByteSpan(h, kOffHeaderHash)));
}

std::vector<std::byte> Assemble(ChunkKind kind, const DeltaIdentity& identity, uint32_t sequence,
                                uint32_t record_count, ByteSpan payload) {
  std::vector<std::byte> out(kChunkHeaderBytes + payload.size());
  std::memcpy(out.data() + kChunkHeaderBytes, payload.data(), payload.size());
  WriteHeader(out.data(), kind, identity, sequence, record_count,
              ByteSpan(out).subspan(kChunkHeaderBytes));
  return out;
}

bool GetHash(ByteReader& r, PartitionHash& h) { return r.Get(h.lo) && r.Get(h.hi); }

Status ParseRecord(ByteReader& r, uint64_t partition_bytes, size_t index, PartitionRecord& rec) {
  auto bad = [&](const std::string& what) {
    return Status::Corrupt("record " + std::to_string(index) + ": " + what);
  };
  uint16_t name_length;
  ByteSpan name;
  if (!r.Get(name_length) || !r.GetBytes(name_length, name)) return bad("truncated tensor name");
  if (name_length == 0 || name_length > kMaxTensorNameBytes) {
    return bad("tensor name length " + std::to_string(name_length) + " is outside 1.." +
               std::to_string(kMaxTensorNameBytes));
  }
  rec.tensor_name = AsChars(name);
  uint8_t dtype, encoding, entropy, reserved;
  if (!r.Get(dtype) || !r.Get(encoding) || !r.Get(entropy) || !r.Get(reserved) ||
      !r.Get(rec.element_offset) || !r.Get(rec.element_count) || !r.Get(rec.change_count) ||
      !GetHash(r, rec.base_hash) || !GetHash(r, rec.target_hash) || !r.Get(rec.raw_size)) {
    return bad("truncated record header for tensor '" + std::string(rec.tensor_name) + "'");
  }
  uint64_t payload_size;
  if (!r.Get(payload_size)) return bad("truncated record header");
  auto parsed_dtype = DTypeFromWire(dtype);
  if (!parsed_dtype) return bad("unknown dtype " + std::to_string(dtype));
  rec.dtype = *parsed_dtype;
  if (encoding < 1 || encoding > kMaxEncoding)
    return bad("unknown encoding " + std::to_string(encoding));
  rec.encoding = static_cast<Encoding>(encoding);
  if (entropy > static_cast<uint8_t>(EntropyCoder::kLz4)) {
    return bad("unknown entropy coder " + std::to_string(entropy));
  }
  rec.entropy = static_cast<EntropyCoder>(entropy);
  if (reserved != 0) return bad("reserved byte is " + std::to_string(reserved) + ", must be 0");
  const uint64_t element_size = ElementSize(rec.dtype);
  if (rec.element_count == 0 || rec.element_count > partition_bytes / element_size + 1 ||
      rec.element_count * element_size > std::max(partition_bytes, element_size)) {
    return bad("element count " + std::to_string(rec.element_count) +
               " does not fit a partition of " + std::to_string(partition_bytes) + " bytes");
  }
  if (rec.change_count == 0 || rec.change_count > rec.element_count) {
    return bad("change count " + std::to_string(rec.change_count) + " is outside 1.." +
               std::to_string(rec.element_count));
  }
  const uint64_t max_raw = MaxRawSize(rec.encoding, rec.element_count,
                                      static_cast<uint32_t>(element_size), rec.change_count);
  if (rec.raw_size > max_raw) {
    return bad("raw size " + std::to_string(rec.raw_size) + " exceeds the bound " +
               std::to_string(max_raw) + " for " + std::string(EncodingName(rec.encoding)));
  }
  if ((rec.encoding == Encoding::kContextXor || rec.encoding == Encoding::kPieces) &&
      rec.entropy != EntropyCoder::kNone) {
    return bad(std::string(EncodingName(rec.encoding)) + " records take no entropy stage");
  }
  if (!r.GetBytes(payload_size, rec.payload)) {
    return bad("payload of " + std::to_string(payload_size) + " bytes runs past the chunk");
  }
  return Status::Ok();
}

}  // namespace

ChunkBuilder::ChunkBuilder(const DeltaIdentity& identity, uint32_t sequence, size_t headroom)
    : identity_(identity), sequence_(sequence), headroom_(headroom) {
  buffer_.resize(headroom_ + kChunkHeaderBytes);
}

void ChunkBuilder::PutRecordHeader(std::string_view tensor_name, DType dtype, Encoding encoding,
                                   EntropyCoder entropy, uint64_t element_offset,
                                   uint64_t element_count, uint64_t change_count,
                                   const PartitionHash& base_hash, const PartitionHash& target_hash,
                                   uint64_t raw_size, uint64_t payload_size) {
  ByteWriter w(buffer_);
  w.Put<uint16_t>(static_cast<uint16_t>(tensor_name.size()));
  w.PutString(tensor_name);
  w.Put<uint8_t>(static_cast<uint8_t>(dtype));
  w.Put<uint8_t>(static_cast<uint8_t>(encoding));
  w.Put<uint8_t>(static_cast<uint8_t>(entropy));
  w.Put<uint8_t>(0);
  w.Put<uint64_t>(element_offset);
  w.Put<uint64_t>(element_count);
  w.Put<uint64_t>(change_count);
  w.Put<uint64_t>(base_hash.lo);
  w.Put<uint64_t>(base_hash.hi);
  w.Put<uint64_t>(target_hash.lo);
  w.Put<uint64_t>(target_hash.hi);
  w.Put<uint64_t>(raw_size);
  w.Put<uint64_t>(payload_size);
  ++record_count_;
}

void ChunkBuilder::Add(std::string_view tensor_name, DType dtype, uint64_t element_offset,
                       uint64_t element_count, const PartitionHash& base_hash,
                       const PartitionHash& target_hash, const EncodedPartition& encoded) {
  AddView(tensor_name, dtype, element_offset, element_count, base_hash, target_hash,
          PieceView{encoded.encoding, encoded.entropy, encoded.change_count, encoded.raw_size,
                    encoded.payload});
}

void ChunkBuilder::AddView(std::string_view tensor_name, DType dtype, uint64_t element_offset,
                           uint64_t element_count, const PartitionHash& base_hash,
                           const PartitionHash& target_hash, const PieceView& record) {
  PutRecordHeader(tensor_name, dtype, record.encoding, record.entropy, element_offset,
                  element_count, record.change_count, base_hash, target_hash, record.raw_size,
                  record.payload.size());
  buffer_.insert(buffer_.end(), record.payload.begin(), record.payload.end());
}

void ChunkBuilder::AddPieces(std::string_view tensor_name, DType dtype, uint64_t element_offset,
                             uint64_t element_count, const PartitionHash& base_hash,
                             const PartitionHash& target_hash, std::span<const PieceView> pieces) {
  uint64_t changes = 0, raw = 0, payload = 4;
  for (const PieceView& p : pieces) {
    changes += p.change_count;
    raw += p.raw_size;
    payload += kPieceHeaderBytes + p.payload.size();
  }
  PutRecordHeader(tensor_name, dtype, Encoding::kPieces, EntropyCoder::kNone, element_offset,
                  element_count, changes, base_hash, target_hash, raw, payload);
  AppendPiecesPayload(pieces, buffer_);
}

void ChunkBuilder::Recycle(std::vector<std::byte>&& storage) {
  if (record_count_ != 0 || storage.capacity() <= buffer_.capacity()) return;
  storage.assign(headroom_ + kChunkHeaderBytes, std::byte{0});
  buffer_.swap(storage);
}

std::vector<std::byte> ChunkBuilder::Finish() {
  std::byte* h = buffer_.data() + headroom_;
  WriteHeader(h, ChunkKind::kData, identity_, sequence_, record_count_,
              ByteSpan(buffer_).subspan(headroom_ + kChunkHeaderBytes));
  std::vector<std::byte> out = std::move(buffer_);
  buffer_.assign(headroom_ + kChunkHeaderBytes, std::byte{0});
  record_count_ = 0;
  return out;
}

std::vector<std::byte> BuildEndChunk(const DeltaIdentity& identity, uint32_t sequence,
                                     const DeltaSummary& summary) {
  std::vector<std::byte> payload;
  ByteWriter w(payload);
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(summary.target_layout.bytes.data()), 16));
  w.Put<uint32_t>(summary.data_chunks);
  w.Put<uint32_t>(0);
  w.Put<uint64_t>(summary.records);
  w.Put<uint64_t>(summary.tensor_bytes);
  w.Put<uint64_t>(summary.changed_elements);
  return Assemble(ChunkKind::kEnd, identity, sequence, 0, payload);
}

Result<uint64_t> ParseChunkHeaderPayloadLength(ByteSpan header) {
  if (header.size() < kChunkHeaderBytes) {
    return Status::Corrupt("chunk header truncated: " + std::to_string(header.size()) + " of " +
                           std::to_string(kChunkHeaderBytes) + " bytes");
  }
  const std::byte* h = header.data();
  if (LoadLE<uint32_t>(h + kOffMagic) != kChunkMagic) return Status::Corrupt("bad chunk magic");
  if (LoadLE<uint64_t>(h + kOffHeaderHash) != Hash64(ByteSpan(h, kOffHeaderHash))) {
    return Status::Corrupt("chunk header checksum mismatch");
  }
  const uint16_t version = LoadLE<uint16_t>(h + kOffVersion);
  if (version != kWireFormatVersion) {
    return Status::Corrupt("unsupported wire format version " + std::to_string(version) +
                           " (this build reads version " + std::to_string(kWireFormatVersion) +
                           ")");
  }
  const auto kind = static_cast<uint8_t>(h[kOffKind]);
  if (kind != static_cast<uint8_t>(ChunkKind::kData) &&
      kind != static_cast<uint8_t>(ChunkKind::kEnd)) {
    return Status::Corrupt("unknown chunk kind " + std::to_string(kind));
  }
  if (h[kOffFlags] != std::byte{0}) return Status::Corrupt("reserved chunk flags are not zero");
  const uint64_t partition_bytes = LoadLE<uint64_t>(h + kOffPartitionBytes);
  if (partition_bytes == 0 || partition_bytes > kMaxPartitionBytes) {
    return Status::Corrupt("partition size " + std::to_string(partition_bytes) + " is outside 1.." +
                           std::to_string(kMaxPartitionBytes));
  }
  const uint64_t length = LoadLE<uint64_t>(h + kOffPayloadLength);
  if (length > kMaxChunkPayloadBytes) {
    return Status::Corrupt("chunk payload length " + std::to_string(length) +
                           " exceeds the cap of " + std::to_string(kMaxChunkPayloadBytes));
  }
  return length;
}

Result<ChunkHeader> PeekChunkHeader(ByteSpan chunk) {
  ASSIGN_OR_RETURN(uint64_t length, ParseChunkHeaderPayloadLength(chunk));
  const std::byte* h = chunk.data();
  ChunkHeader out;
  out.kind = static_cast<ChunkKind>(h[kOffKind]);
  std::memcpy(out.identity.base_version.bytes.data(), h + kOffBase, 16);
  std::memcpy(out.identity.target_version.bytes.data(), h + kOffTarget, 16);
  out.identity.partition_bytes = LoadLE<uint64_t>(h + kOffPartitionBytes);
  out.sequence = LoadLE<uint32_t>(h + kOffSequence);
  out.record_count = LoadLE<uint32_t>(h + kOffRecordCount);
  out.payload_length = length;
  return out;
}

Status RestampChunk(MutableByteSpan chunk, const DeltaIdentity& identity, uint32_t sequence) {
  ASSIGN_OR_RETURN(ChunkHeader header, PeekChunkHeader(chunk));
  if (header.kind != ChunkKind::kData) return Status::Corrupt("only data chunks are restamped");
  if (header.identity.partition_bytes != identity.partition_bytes) {
    return Status::InvalidArgument("chunk of partition size " +
                                   std::to_string(header.identity.partition_bytes) +
                                   " for a delta of " + std::to_string(identity.partition_bytes));
  }
  std::byte* h = chunk.data();
  std::memcpy(h + kOffBase, identity.base_version.bytes.data(), 16);
  std::memcpy(h + kOffTarget, identity.target_version.bytes.data(), 16);
  StoreLE<uint32_t>(h + kOffSequence, sequence);
  StoreLE<uint64_t>(h + kOffHeaderHash, Hash64(ByteSpan(h, kOffHeaderHash)));
  return Status::Ok();
}

Status VerifyChunkChecksums(ByteSpan chunk) {
  ASSIGN_OR_RETURN(uint64_t length, ParseChunkHeaderPayloadLength(chunk));
  if (chunk.size() != kChunkHeaderBytes + length) {
    return Status::Corrupt("chunk is " + std::to_string(chunk.size()) + " bytes, header declares " +
                           std::to_string(kChunkHeaderBytes + length));
  }
  if (LoadLE<uint64_t>(chunk.data() + kOffPayloadHash) !=
      Hash64(chunk.subspan(kChunkHeaderBytes))) {
    return Status::Corrupt("chunk payload checksum mismatch");
  }
  return Status::Ok();
}

namespace {

Result<ChunkView> ParseChunkChecking(ByteSpan chunk, bool payload_hash) {
  ASSIGN_OR_RETURN(uint64_t length, ParseChunkHeaderPayloadLength(chunk));
  if (chunk.size() != kChunkHeaderBytes + length) {
    return Status::Corrupt("chunk is " + std::to_string(chunk.size()) + " bytes, header declares " +
                           std::to_string(kChunkHeaderBytes + length));
  }
  const std::byte* h = chunk.data();
  const ByteSpan payload = chunk.subspan(kChunkHeaderBytes);
  if (payload_hash && LoadLE<uint64_t>(h + kOffPayloadHash) != Hash64(payload)) {
    return Status::Corrupt("chunk payload checksum mismatch");
  }
  ChunkView view;
  view.kind = static_cast<ChunkKind>(h[kOffKind]);
  std::memcpy(view.identity.base_version.bytes.data(), h + kOffBase, 16);
  std::memcpy(view.identity.target_version.bytes.data(), h + kOffTarget, 16);
  view.identity.partition_bytes = LoadLE<uint64_t>(h + kOffPartitionBytes);
  view.sequence = LoadLE<uint32_t>(h + kOffSequence);
  view.size_bytes = chunk.size();
  const uint32_t record_count = LoadLE<uint32_t>(h + kOffRecordCount);
  ByteReader r(payload);

  if (view.kind == ChunkKind::kEnd) {
    ByteSpan layout;
    uint32_t reserved;
    if (record_count != 0 || payload.size() != kEndPayloadBytes) {
      return Status::Corrupt("END chunk must carry no records and a " +
                             std::to_string(kEndPayloadBytes) + "-byte summary");
    }
    (void)r.GetBytes(16, layout);
    std::memcpy(view.summary.target_layout.bytes.data(), layout.data(), 16);
    (void)r.Get(view.summary.data_chunks);
    (void)r.Get(reserved);
    (void)r.Get(view.summary.records);
    (void)r.Get(view.summary.tensor_bytes);
    (void)r.Get(view.summary.changed_elements);
    if (reserved != 0) return Status::Corrupt("END chunk reserved field is not zero");
    if (view.sequence != view.summary.data_chunks) {
      return Status::Corrupt("END chunk sequence " + std::to_string(view.sequence) +
                             " does not follow its " + std::to_string(view.summary.data_chunks) +
                             " data chunks");
    }
    return view;
  }

  if (record_count == 0) return Status::Corrupt("data chunk carries no records");
  // Every record takes at least kRecordFixedBytes + 1, so this bounds the reservation.
  if (record_count > payload.size() / (kRecordFixedBytes + 1)) {
    return Status::Corrupt("record count " + std::to_string(record_count) +
                           " cannot fit a payload of " + std::to_string(payload.size()) + " bytes");
  }
  view.records.resize(record_count);
  for (uint32_t i = 0; i < record_count; ++i) {
    RETURN_IF_ERROR(ParseRecord(r, view.identity.partition_bytes, i, view.records[i])
                        .WithContext("chunk " + std::to_string(view.sequence)));
  }
  if (r.remaining() != 0) {
    return Status::Corrupt("chunk " + std::to_string(view.sequence) + ": " +
                           std::to_string(r.remaining()) + " trailing bytes after the last record");
  }
  return view;
}

}  // namespace

Result<ChunkView> ParseChunk(ByteSpan chunk) { return ParseChunkChecking(chunk, true); }

Result<ChunkView> ParseVerifiedChunk(ByteSpan chunk) { return ParseChunkChecking(chunk, false); }

}  // namespace deltacast::codec
