#include "relay/producers/producer_protocol.h"

#include <cstring>

#include "relay/wire/internal/body_reader.h"

namespace deltacast::relay {
namespace {

using internal::Header;
using internal::PutHash;
using Reader = internal::BodyReader;

constexpr size_t kShareBytes = 4 + 8 + 8 + 8;
constexpr size_t kChangeBytes = 4 + 8 + 1 + 16;
constexpr size_t kRunBytes = 4 + 8 + 8 + 8 + 8 + 4;
constexpr size_t kMaxLayoutName = 4096;
constexpr size_t kSplitAmaxBytes = 4 + 8 + 2 + 2 + 8;

}  // namespace

std::vector<std::byte> EncodeProduce(const Produce& m) {
  auto out = Header(MessageType::kProduce);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint64_t>(m.partition_bytes);
  w.Put<uint64_t>(m.chunk_bytes);
  w.Put<uint8_t>(m.hash_base ? 1 : 0);
  return out;
}

Result<Produce> ParseProduce(ByteSpan message) {
  Reader r(message, MessageType::kProduce);
  RETURN_IF_ERROR(r.Open());
  Produce m;
  uint8_t flags = 0;
  r.Get(m.refit_id) && r.Get(m.partition_bytes) && r.Get(m.chunk_bytes) && r.Get(flags);
  if (flags > 1 || m.partition_bytes == 0) r.Fail();
  m.hash_base = flags == 1;
  RETURN_IF_ERROR(r.Close());
  return m;
}

std::vector<std::byte> EncodeCoverage(const Coverage& m) {
  auto out = Header(MessageType::kCoverage);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint64_t>(m.tensors.size());
  for (const auto& t : m.tensors) {
    w.Put<uint16_t>(static_cast<uint16_t>(t.name.size()));
    w.PutString(t.name);
    w.Put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.Put<uint8_t>(static_cast<uint8_t>(t.shape.size()));
    for (uint64_t d : t.shape) w.Put<uint64_t>(d);
  }
  w.Put<uint64_t>(m.shares.size());
  w.Put<uint8_t>(m.base_pieces.empty() ? 0 : 1);
  for (size_t i = 0; i < m.shares.size(); ++i) {
    const PartitionShare& s = m.shares[i];
    w.Put<uint32_t>(s.tensor);
    w.Put<uint64_t>(s.partition);
    w.Put<uint64_t>(s.covered);
    w.Put<uint64_t>(s.length);
    if (!m.base_pieces.empty()) PutHash(w, m.base_pieces[i]);
  }
  const std::string name = m.layout_name.substr(0, kMaxLayoutName);
  w.Put<uint16_t>(static_cast<uint16_t>(name.size()));
  w.PutString(name);
  w.Put<uint64_t>(m.runs.size());
  for (const layout::Run& run : m.runs) {
    w.Put<uint32_t>(run.canonical);
    w.Put<uint64_t>(run.dst);
    w.Put<uint64_t>(run.dst_stride);
    w.Put<uint64_t>(run.count);
    w.Put<uint64_t>(run.len);
    w.Put<int32_t>(run.line);
  }
  return out;
}

Result<Coverage> ParseCoverage(ByteSpan message) {
  Reader r(message, MessageType::kCoverage);
  RETURN_IF_ERROR(r.Open());
  Coverage m;
  uint64_t tensors = 0;
  r.Get(m.refit_id) && r.GetCount(tensors, 4);
  for (uint64_t i = 0; i < tensors; ++i) {
    TensorSpec t;
    uint8_t dtype = 0, rank = 0;
    if (!r.GetString(t.name, 1024) || !r.Get(dtype) || !r.Get(rank) || rank > 16) {
      r.Fail();
      break;
    }
    auto d = DTypeFromWire(dtype);
    if (!d) {
      r.Fail();
      break;
    }
    t.dtype = *d;
    t.shape.resize(rank);
    for (auto& dim : t.shape) r.Get(dim);
    m.tensors.push_back(std::move(t));
  }
  uint64_t shares = 0;
  uint8_t with_base = 0;
  r.GetCount(shares, kShareBytes) && r.Get(with_base);
  if (with_base > 1) r.Fail();
  for (uint64_t i = 0; i < shares; ++i) {
    PartitionShare s;
    if (!r.Get(s.tensor) || !r.Get(s.partition) || !r.Get(s.covered) || !r.Get(s.length)) break;
    if (s.tensor >= m.tensors.size() || s.covered == 0 || s.covered > s.length) {
      r.Fail();
      break;
    }
    m.shares.push_back(s);
    if (with_base) {
      PartitionHash h;
      r.GetHash(h);
      m.base_pieces.push_back(h);
    }
  }
  uint64_t runs = 0;
  r.GetString(m.layout_name, kMaxLayoutName) && r.GetCount(runs, kRunBytes);
  for (uint64_t i = 0; i < runs; ++i) {
    layout::Run run;
    if (!r.Get(run.canonical) || !r.Get(run.dst) || !r.Get(run.dst_stride) || !r.Get(run.count) ||
        !r.Get(run.len) || !r.Get(run.line)) {
      break;
    }
    // Whether each run lies inside its tensor is the coverage check's to say
    // (layout::CheckCoverage), with the producer named.
    if (run.canonical >= m.tensors.size()) {
      r.Fail();
      break;
    }
    m.runs.push_back(run);
  }
  RETURN_IF_ERROR(r.Close());
  return m;
}

std::vector<std::byte> EncodeBaseHashes(const BaseHashes& m) {
  auto out = Header(MessageType::kBaseHashes);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint64_t>(m.hashes.size());
  for (const auto& h : m.hashes) PutHash(w, h);
  return out;
}

Result<BaseHashes> ParseBaseHashes(ByteSpan message) {
  Reader r(message, MessageType::kBaseHashes);
  RETURN_IF_ERROR(r.Open());
  BaseHashes m;
  uint64_t n = 0;
  r.Get(m.refit_id) && r.GetCount(n, 16);
  m.hashes.resize(n);
  for (auto& h : m.hashes) r.GetHash(h);
  RETURN_IF_ERROR(r.Close());
  return m;
}

std::vector<std::byte> EncodeProduced(const Produced& m) {
  auto out = Header(MessageType::kProduced);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint32_t>(m.chunks);
  w.Put<uint32_t>(m.pieces);
  w.Put<uint32_t>(m.piece_messages);
  w.Put<uint64_t>(m.changed_elements);
  w.Put<uint64_t>(m.local_bytes);
  w.Put<double>(m.seconds);
  w.Put<uint64_t>(m.changes.size());
  for (const auto& c : m.changes) {
    w.Put<uint32_t>(c.tensor);
    w.Put<uint64_t>(c.partition);
    w.Put<uint8_t>(c.whole ? 1 : 0);
    PutHash(w, c.mask);
  }
  w.Put<uint64_t>(m.base_pieces.size());
  for (const auto& h : m.base_pieces) PutHash(w, h);
  return out;
}

Result<Produced> ParseProduced(ByteSpan message) {
  Reader r(message, MessageType::kProduced);
  RETURN_IF_ERROR(r.Open());
  Produced m;
  uint64_t n = 0;
  r.Get(m.refit_id) && r.Get(m.chunks) && r.Get(m.pieces) && r.Get(m.piece_messages) &&
      r.Get(m.changed_elements) && r.Get(m.local_bytes) && r.Get(m.seconds) &&
      r.GetCount(n, kChangeBytes);
  for (uint64_t i = 0; i < n; ++i) {
    ShareChange c;
    uint8_t whole = 0;
    if (!r.Get(c.tensor) || !r.Get(c.partition) || !r.Get(whole) || !r.GetHash(c.mask)) break;
    if (whole > 1) {
      r.Fail();
      break;
    }
    c.whole = whole == 1;
    m.changes.push_back(c);
  }
  uint64_t pieces = 0;
  r.GetCount(pieces, PartitionHash::kBytes);
  for (uint64_t i = 0; i < pieces; ++i) {
    PartitionHash h;
    if (!r.GetHash(h)) break;
    m.base_pieces.push_back(h);
  }
  RETURN_IF_ERROR(r.Close());
  return m;
}

std::vector<std::byte> EncodeSplitAmaxes(const SplitAmaxes& m) {
  auto out = Header(MessageType::kSplitAmaxes);
  out.reserve(out.size() + 16 + m.blocks.size() * kSplitAmaxBytes);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint64_t>(m.blocks.size());
  for (const SplitBlockAmax& b : m.blocks) {
    w.Put<uint32_t>(b.tensor);
    w.Put<uint64_t>(b.block);
    w.Put<uint16_t>(b.base);
    w.Put<uint16_t>(b.target);
    w.Put<uint64_t>(b.elements);
  }
  return out;
}

Result<SplitAmaxes> ParseSplitAmaxes(ByteSpan message) {
  Reader r(message, MessageType::kSplitAmaxes);
  RETURN_IF_ERROR(r.Open());
  SplitAmaxes m;
  uint64_t count = 0;
  r.Get(m.refit_id) && r.GetCount(count, kSplitAmaxBytes);
  m.blocks.resize(count);
  for (SplitBlockAmax& b : m.blocks) {
    r.Get(b.tensor) && r.Get(b.block) && r.Get(b.base) && r.Get(b.target) && r.Get(b.elements);
    // |x| of a BF16 has 15 bits.
    if (b.base > 0x7FFF || b.target > 0x7FFF) r.Fail();
  }
  RETURN_IF_ERROR(r.Close());
  return m;
}

std::vector<std::byte> EncodePull(const Pull& m) {
  auto out = Header(MessageType::kPull);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint32_t>(m.messages);
  return out;
}

Result<Pull> ParsePull(ByteSpan message) {
  Reader r(message, MessageType::kPull);
  RETURN_IF_ERROR(r.Open());
  Pull m;
  r.Get(m.refit_id) && r.Get(m.messages);
  RETURN_IF_ERROR(r.Close());
  return m;
}

std::vector<std::byte> EncodeShardChunk(uint64_t refit_id, ByteSpan chunk) {
  auto out = Header(MessageType::kShardChunk);
  out.reserve(out.size() + 8 + chunk.size());
  ByteWriter w(out);
  w.Put<uint64_t>(refit_id);
  w.PutBytes(chunk);
  return out;
}

Result<std::pair<uint64_t, ByteSpan>> ParseShardChunk(ByteSpan message) {
  Reader r(message, MessageType::kShardChunk);
  RETURN_IF_ERROR(r.Open());
  uint64_t refit_id = 0;
  r.Get(refit_id);
  ByteSpan chunk = r.Rest();
  RETURN_IF_ERROR(r.Close());
  return std::pair{refit_id, chunk};
}

std::vector<std::byte> EncodePieces(uint64_t refit_id, std::span<const SharePiece> pieces) {
  auto out = Header(MessageType::kPieces);
  ByteWriter w(out);
  w.Put<uint64_t>(refit_id);
  w.Put<uint32_t>(static_cast<uint32_t>(pieces.size()));
  for (const SharePiece& p : pieces) {
    w.Put<uint32_t>(p.tensor);
    w.Put<uint64_t>(p.partition);
    w.Put<uint8_t>(static_cast<uint8_t>(p.encoded.encoding));
    w.Put<uint8_t>(static_cast<uint8_t>(p.encoded.entropy));
    w.Put<uint64_t>(p.encoded.change_count);
    w.Put<uint64_t>(p.encoded.raw_size);
    w.Put<uint64_t>(p.encoded.payload.size());
    w.PutBytes(p.encoded.payload);
  }
  return out;
}

Result<std::pair<uint64_t, std::vector<PieceMessageEntry>>> ParsePieces(ByteSpan message) {
  Reader r(message, MessageType::kPieces);
  RETURN_IF_ERROR(r.Open());
  uint64_t refit_id = 0;
  uint32_t n = 0;
  r.Get(refit_id) && r.Get(n);
  std::vector<PieceMessageEntry> out;
  for (uint32_t i = 0; i < n; ++i) {
    PieceMessageEntry e;
    uint8_t encoding = 0, entropy = 0;
    uint64_t size = 0;
    if (!r.Get(e.tensor) || !r.Get(e.partition) || !r.Get(encoding) || !r.Get(entropy) ||
        !r.Get(e.piece.change_count) || !r.Get(e.piece.raw_size) || !r.Get(size) ||
        !r.GetSpan(size, e.piece.payload)) {
      break;
    }
    // A piece is what a partition's own record could be: sparse-XOR or overwrite.
    if ((encoding != static_cast<uint8_t>(codec::Encoding::kSparseXor) &&
         encoding != static_cast<uint8_t>(codec::Encoding::kOverwrite)) ||
        entropy > static_cast<uint8_t>(codec::EntropyCoder::kLz4) || e.piece.change_count == 0) {
      r.Fail();
      break;
    }
    e.piece.encoding = static_cast<codec::Encoding>(encoding);
    e.piece.entropy = static_cast<codec::EntropyCoder>(entropy);
    out.push_back(e);
  }
  RETURN_IF_ERROR(r.Close());
  return std::pair{refit_id, std::move(out)};
}

std::vector<std::byte> EncodeProduceEnd(const ProduceEnd& m) {
  auto out = Header(MessageType::kProduceEnd);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint8_t>(m.committed ? 1 : 0);
  const std::string reason = m.reason.substr(0, kMaxReasonBytes);
  w.Put<uint16_t>(static_cast<uint16_t>(reason.size()));
  w.PutString(reason);
  return out;
}

Result<ProduceEnd> ParseProduceEnd(ByteSpan message) {
  Reader r(message, MessageType::kProduceEnd);
  RETURN_IF_ERROR(r.Open());
  ProduceEnd m;
  uint8_t committed = 0;
  r.Get(m.refit_id) && r.Get(committed) && r.GetString(m.reason, kMaxReasonBytes);
  if (committed > 1) r.Fail();
  m.committed = committed == 1;
  RETURN_IF_ERROR(r.Close());
  return m;
}

}  // namespace deltacast::relay
