#include "relay/wire/protocol.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "relay/wire/internal/body_reader.h"

namespace deltacast::relay {
namespace {

using internal::BodyReader;
using internal::Header;
using internal::ParseBody;
using internal::PutArray;
using internal::PutDigest;
using internal::PutString;

constexpr size_t kMaxTensorNameInFetch = 1024;

}  // namespace

std::string_view MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kChallenge:
      return "CHALLENGE";
    case MessageType::kHello:
      return "HELLO";
    case MessageType::kWelcome:
      return "WELCOME";
    case MessageType::kRefuse:
      return "REFUSE";
    case MessageType::kBegin:
      return "BEGIN";
    case MessageType::kChunk:
      return "CHUNK";
    case MessageType::kCredit:
      return "CREDIT";
    case MessageType::kPrepared:
      return "PREPARED";
    case MessageType::kFailed:
      return "FAILED";
    case MessageType::kCommit:
      return "COMMIT";
    case MessageType::kAbort:
      return "ABORT";
    case MessageType::kCommitted:
      return "COMMITTED";
    case MessageType::kAborted:
      return "ABORTED";
    case MessageType::kHeartbeat:
      return "HEARTBEAT";
    case MessageType::kFetch:
      return "FETCH";
    case MessageType::kPartition:
      return "PARTITION";
    case MessageType::kFetchManifest:
      return "FETCH_MANIFEST";
    case MessageType::kManifest:
      return "MANIFEST";
    case MessageType::kFetchChain:
      return "FETCH_CHAIN";
    case MessageType::kChain:
      return "CHAIN";
    case MessageType::kFetchDeltaChunk:
      return "FETCH_DELTA_CHUNK";
    case MessageType::kDeltaChunk:
      return "DELTA_CHUNK";
    case MessageType::kProduce:
      return "PRODUCE";
    case MessageType::kCoverage:
      return "COVERAGE";
    case MessageType::kBaseHashes:
      return "BASE_HASHES";
    case MessageType::kProduced:
      return "PRODUCED";
    case MessageType::kPull:
      return "PULL";
    case MessageType::kShardChunk:
      return "SHARD_CHUNK";
    case MessageType::kPieces:
      return "PIECES";
    case MessageType::kProduceEnd:
      return "PRODUCE_END";
    case MessageType::kActiveVersion:
      return "ACTIVE_VERSION";
    case MessageType::kSplitAmaxes:
      return "SPLIT_AMAXES";
  }
  return "UNKNOWN";
}

void WriteMessageHeader(MessageType type, std::byte* out) {
  StoreLE<uint32_t>(out, kProtocolMagic);
  out[4] = std::byte{kProtocolVersion};
  out[5] = std::byte{static_cast<uint8_t>(type)};
  out[6] = out[7] = std::byte{0};
}

Result<MessageType> PeekType(ByteSpan message) {
  if (message.size() < kMessageHeaderBytes)
    return Status::Corrupt("message shorter than its header");
  if (LoadLE<uint32_t>(message.data()) != kProtocolMagic)
    return Status::Corrupt("bad protocol magic");
  const auto version = static_cast<uint8_t>(message[4]);
  if (version != kProtocolVersion) {
    return Status::Corrupt("protocol version " + std::to_string(version) +
                           " is not supported (this build speaks " +
                           std::to_string(kProtocolVersion) + ")");
  }
  const auto type = static_cast<uint8_t>(message[5]);
  if (type < 1 || type > kMaxMessageType)
    return Status::Corrupt("unknown message type " + std::to_string(type));
  if (LoadLE<uint16_t>(message.data() + 6) != 0)
    return Status::Corrupt("reserved header bits are not zero");
  return static_cast<MessageType>(type);
}

std::vector<std::byte> EncodeHeartbeat() { return Header(MessageType::kHeartbeat); }

std::vector<std::byte> EncodeRefuse(const Refuse& m) {
  auto out = Header(MessageType::kRefuse);
  ByteWriter w(out);
  PutString(w, m.reason.substr(0, kMaxReasonBytes));
  w.Put<uint64_t>(m.refit_id);
  return out;
}

std::vector<std::byte> EncodeBegin(const Begin& m) {
  auto out = Header(MessageType::kBegin);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  PutDigest(w, m.base_version);
  PutDigest(w, m.target_version);
  w.Put<uint64_t>(m.partition_bytes);
  PutArray(w, m.manifest_digest);
  w.Put<uint64_t>(m.stream_id);
  w.Put<uint64_t>(m.begun_at_us);
  PutArray(w, m.signature);
  w.Put<uint8_t>(static_cast<uint8_t>(m.stripe));
  w.Put<uint8_t>(static_cast<uint8_t>(m.stripes));
  return out;
}

std::vector<std::byte> EncodeChunk(ByteSpan chunk, const Signature& signature) {
  auto out = Header(MessageType::kChunk);
  out.reserve(out.size() + chunk.size() + signature.size());
  out.insert(out.end(), chunk.begin(), chunk.end());
  ByteWriter w(out);
  PutArray(w, signature);
  return out;
}

std::vector<std::byte> FrameChunk(std::vector<std::byte>&& headroom_and_chunk) {
  std::vector<std::byte> message = std::move(headroom_and_chunk);
  WriteMessageHeader(MessageType::kChunk, message.data());
  message.resize(message.size() + kSignatureBytes);
  return message;
}

Result<ChunkParts> SplitChunkMessage(ByteSpan message) {
  ASSIGN_OR_RETURN(MessageType type, PeekType(message));
  if (type != MessageType::kChunk) {
    return Status::Corrupt("expected CHUNK, got " + std::string(MessageTypeName(type)));
  }
  if (message.size() < kMessageHeaderBytes + kSignatureBytes) {
    return Status::Corrupt("CHUNK message of " + std::to_string(message.size()) +
                           " bytes cannot hold a chunk and a signature");
  }
  ChunkParts parts;
  parts.chunk = ChunkOf(message);
  std::memcpy(parts.signature.data(), message.data() + message.size() - kSignatureBytes,
              kSignatureBytes);
  return parts;
}

ByteSpan ChunkOf(ByteSpan message) {
  if (message.size() < kMessageHeaderBytes + kSignatureBytes) return {};
  return message.subspan(kMessageHeaderBytes,
                         message.size() - kMessageHeaderBytes - kSignatureBytes);
}

std::vector<std::byte> EncodeCredit(const Credit& m) {
  auto out = Header(MessageType::kCredit);
  ByteWriter w(out);
  w.Put<uint32_t>(m.chunks);
  w.Put<uint64_t>(m.refit_id);
  return out;
}

std::vector<std::byte> EncodePrepared(const Prepared& m) {
  auto out = Header(MessageType::kPrepared);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint32_t>(static_cast<uint32_t>(m.nodes.size()));
  for (const auto& n : m.nodes) {
    PutString(w, n.node_id);
    w.Put<uint64_t>(n.chunk_bytes);
    w.Put<double>(n.apply_seconds);
    w.Put<uint64_t>(n.partitions_applied);
    for (double v : {n.receive_seconds, n.check_seconds, n.write_seconds, n.apply_cpu_seconds,
                     n.cpu_wait_seconds, n.disk_wait_seconds}) {
      w.Put<double>(v);
    }
  }
  return out;
}

std::vector<std::byte> EncodeFailed(const Failed& m) {
  auto out = Header(MessageType::kFailed);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  PutString(w, m.node_id);
  PutString(w, m.reason.substr(0, kMaxReasonBytes));
  w.Put<uint8_t>(static_cast<uint8_t>(m.kind));
  return out;
}

std::vector<std::byte> EncodeDecision(MessageType type, const Decision& m) {
  auto out = Header(type);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  PutDigest(w, m.target_version);
  PutArray(w, m.signature);
  return out;
}

std::vector<std::byte> EncodeOutcome(MessageType type, const Outcome& m) {
  auto out = Header(type);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint32_t>(m.nodes);
  w.Put<uint32_t>(static_cast<uint32_t>(m.pauses.size()));
  for (const PauseReport& p : m.pauses) {
    PutString(w, p.node_id);
    w.Put<double>(p.pause_seconds);
    w.Put<double>(p.hold_seconds);
  }
  return out;
}

Result<Refuse> ParseRefuse(ByteSpan message) {
  return ParseBody<Refuse>(message, MessageType::kRefuse, [&](BodyReader& r, Refuse& m) {
    r.GetString(m.reason, kMaxReasonBytes);
    r.Get(m.refit_id);
  });
}

Result<Begin> ParseBegin(ByteSpan message) {
  return ParseBody<Begin>(message, MessageType::kBegin, [&](BodyReader& r, Begin& m) {
    r.Get(m.refit_id);
    r.GetDigest(m.base_version);
    r.GetDigest(m.target_version);
    r.Get(m.partition_bytes);
    r.GetArray(m.manifest_digest);
    r.Get(m.stream_id);
    r.Get(m.begun_at_us);
    r.GetArray(m.signature);
    return r.GetStripe(m.stripe, m.stripes);
  });
}

Result<Credit> ParseCredit(ByteSpan message) {
  return ParseBody<Credit>(message, MessageType::kCredit, [&](BodyReader& r, Credit& m) {
    r.Get(m.chunks);
    r.Get(m.refit_id);
  });
}

Result<Prepared> ParsePrepared(ByteSpan message) {
  return ParseBody<Prepared>(message, MessageType::kPrepared, [&](BodyReader& r, Prepared& m) {
    uint32_t count = 0;
    r.Get(m.refit_id);
    r.Get(count);
    // Each report takes at least 74 bytes; refuse counts the message cannot hold.
    if (count > message.size() / 74)
      return Status::Corrupt("PREPARED message claims " + std::to_string(count) + " nodes");
    m.nodes.resize(count);
    for (auto& n : m.nodes) {
      if (r.GetString(n.node_id, kMaxNodeIdBytes) && !ValidNodeId(n.node_id)) {
        return Status::Corrupt("PREPARED reports a node id that is not a valid node id");
      }
      r.Get(n.chunk_bytes);
      r.Get(n.apply_seconds);
      r.Get(n.partitions_applied);
      for (double* v : {&n.receive_seconds, &n.check_seconds, &n.write_seconds,
                        &n.apply_cpu_seconds, &n.cpu_wait_seconds, &n.disk_wait_seconds}) {
        // Reports only, but still checked: a time is a finite count of seconds >= 0.
        if (r.Get(*v) && !(*v >= 0 && *v < 1e12)) {
          return Status::Corrupt("PREPARED reports a time of " + std::to_string(*v) +
                                 " s for node '" + n.node_id + "'");
        }
      }
    }
    return Status::Ok();
  });
}

Result<Failed> ParseFailed(ByteSpan message) {
  return ParseBody<Failed>(message, MessageType::kFailed, [&](BodyReader& r, Failed& m) {
    r.Get(m.refit_id);
    if (r.GetString(m.node_id, kMaxNodeIdBytes) && !ValidNodeId(m.node_id)) {
      return Status::Corrupt("FAILED names a node id that is not a valid node id");
    }
    r.GetString(m.reason, kMaxReasonBytes);
    uint8_t kind = 0;
    r.Get(kind);
    if (kind > static_cast<uint8_t>(FailureKind::kBadDelta)) {
      return Status::Corrupt("FAILED with unknown kind " + std::to_string(kind));
    }
    m.kind = static_cast<FailureKind>(kind);
    return Status::Ok();
  });
}

Result<Decision> ParseDecision(ByteSpan message) {
  ASSIGN_OR_RETURN(MessageType type, PeekType(message));
  if (type != MessageType::kCommit && type != MessageType::kAbort) {
    return Status::Corrupt("expected COMMIT or ABORT, got " + std::string(MessageTypeName(type)));
  }
  return ParseBody<Decision>(message, type, [&](BodyReader& r, Decision& m) {
    r.Get(m.refit_id);
    r.GetDigest(m.target_version);
    r.GetArray(m.signature);
  });
}

Result<Outcome> ParseOutcome(ByteSpan message) {
  ASSIGN_OR_RETURN(MessageType type, PeekType(message));
  if (type != MessageType::kCommitted && type != MessageType::kAborted) {
    return Status::Corrupt("expected COMMITTED or ABORTED, got " +
                           std::string(MessageTypeName(type)));
  }
  return ParseBody<Outcome>(message, type, [&](BodyReader& r, Outcome& m) {
    uint32_t count = 0;
    r.Get(m.refit_id);
    r.Get(m.nodes);
    r.Get(count);
    // Each report takes at least 21 bytes; refuse counts the message cannot hold.
    if (count > message.size() / 21) {
      return Status::Corrupt(std::string(MessageTypeName(type)) + " message claims " +
                             std::to_string(count) + " pause reports");
    }
    m.pauses.resize(count);
    for (PauseReport& p : m.pauses) {
      if (r.GetString(p.node_id, kMaxNodeIdBytes) && !ValidNodeId(p.node_id)) {
        return Status::Corrupt("a pause report names a node id that is not a valid node id");
      }
      for (double* v : {&p.pause_seconds, &p.hold_seconds}) {
        if (r.Get(*v) && !(*v >= 0 && *v < 1e12)) {
          return Status::Corrupt("a pause report gives " + std::to_string(*v) + " s for node '" +
                                 p.node_id + "'");
        }
      }
    }
    return Status::Ok();
  });
}

std::vector<std::byte> EncodeFetch(const Fetch& m) {
  auto out = Header(MessageType::kFetch);
  ByteWriter w(out);
  w.Put<uint64_t>(m.request_id);
  PutString(w, m.tensor);
  w.Put<uint64_t>(m.element_offset);
  w.Put<uint64_t>(m.byte_length);
  w.Put<uint64_t>(m.hash.lo);
  w.Put<uint64_t>(m.hash.hi);
  return out;
}

namespace {

// PARTITION and MANIFEST: request id, found flag, length-prefixed bytes.
std::vector<std::byte> EncodeFound(MessageType type, uint64_t request_id, bool found,
                                   ByteSpan bytes) {
  auto out = Header(type);
  ByteWriter w(out);
  w.Put<uint64_t>(request_id);
  w.Put<uint8_t>(found ? 1 : 0);
  w.Put<uint64_t>(bytes.size());
  w.PutBytes(bytes);
  return out;
}

Result<PartitionData> ParseFound(ByteSpan message, MessageType type) {
  return ParseBody<PartitionData>(message, type, [&](BodyReader& r, PartitionData& m) {
    uint8_t found = 0;
    uint64_t length = 0;
    r.Get(m.request_id);
    r.Get(found);
    r.Get(length);
    const std::string name(MessageTypeName(type));
    if (found > 1) return Status::Corrupt(name + " found flag is " + std::to_string(found));
    m.found = found == 1;
    if (!r.GetSpan(length, m.bytes)) return Status::Corrupt(name + " bytes run past the message");
    return Status::Ok();
  });
}

}  // namespace

std::vector<std::byte> EncodePartition(uint64_t request_id, bool found, ByteSpan bytes) {
  return EncodeFound(MessageType::kPartition, request_id, found, bytes);
}

std::vector<std::byte> EncodeManifest(uint64_t request_id, bool found, ByteSpan manifest) {
  return EncodeFound(MessageType::kManifest, request_id, found, manifest);
}

std::vector<std::byte> EncodeDeltaChunk(uint64_t request_id, bool found, ByteSpan chunk_message) {
  return EncodeFound(MessageType::kDeltaChunk, request_id, found, chunk_message);
}

std::vector<std::byte> EncodeActiveVersion(const Digest128& version, ByteSpan manifest) {
  auto out = Header(MessageType::kActiveVersion);
  ByteWriter w(out);
  PutDigest(w, version);
  w.Put<uint8_t>(manifest.empty() ? 0 : 1);
  w.Put<uint64_t>(manifest.size());
  w.PutBytes(manifest);
  return out;
}

std::vector<std::byte> EncodeFetchChain(const FetchChain& m) {
  auto out = Header(MessageType::kFetchChain);
  ByteWriter w(out);
  w.Put<uint64_t>(m.request_id);
  PutDigest(w, m.from);
  PutDigest(w, m.to);
  return out;
}

std::vector<std::byte> EncodeChain(const Chain& m) {
  auto out = Header(MessageType::kChain);
  ByteWriter w(out);
  w.Put<uint64_t>(m.request_id);
  w.Put<uint8_t>(m.found ? 1 : 0);
  const size_t n = std::min(m.links.size(), kMaxChainLinks);
  w.Put<uint8_t>(static_cast<uint8_t>(n));
  for (size_t i = 0; i < n; ++i) {
    PutDigest(w, m.links[i].base);
    PutDigest(w, m.links[i].target);
    w.Put<uint64_t>(m.links[i].partition_bytes);
    w.Put<uint32_t>(m.links[i].chunks);
  }
  return out;
}

std::vector<std::byte> EncodeFetchDeltaChunk(const FetchDeltaChunk& m) {
  auto out = Header(MessageType::kFetchDeltaChunk);
  ByteWriter w(out);
  w.Put<uint64_t>(m.request_id);
  PutDigest(w, m.target);
  w.Put<uint32_t>(m.sequence);
  return out;
}

uint64_t RequestIdOf(ByteSpan message) {
  if (message.size() < kMessageHeaderBytes + 8) return 0;
  return LoadLE<uint64_t>(message.data() + kMessageHeaderBytes);
}

std::vector<std::byte> WithRequestId(ByteSpan message, uint64_t request_id) {
  std::vector<std::byte> out(message.begin(), message.end());
  if (out.size() >= kMessageHeaderBytes + 8) {
    StoreLE<uint64_t>(out.data() + kMessageHeaderBytes, request_id);
  }
  return out;
}

std::vector<std::byte> EncodeFetchManifest(const FetchManifest& m) {
  auto out = Header(MessageType::kFetchManifest);
  ByteWriter w(out);
  w.Put<uint64_t>(m.request_id);
  PutDigest(w, m.version);
  PutDigest(w, m.from);
  return out;
}

Result<Fetch> ParseFetch(ByteSpan message) {
  return ParseBody<Fetch>(message, MessageType::kFetch, [&](BodyReader& r, Fetch& m) {
    r.Get(m.request_id);
    r.GetString(m.tensor, kMaxTensorNameInFetch);
    r.Get(m.element_offset);
    r.Get(m.byte_length);
    r.Get(m.hash.lo);
    r.Get(m.hash.hi);
    // One partition at most: a serving node hashes what is asked for.
    if (m.byte_length > kMaxFetchBytes) {
      return Status::Corrupt("FETCH of " + std::to_string(m.byte_length) +
                             " bytes is larger than any partition");
    }
    return Status::Ok();
  });
}

Result<PartitionData> ParsePartition(ByteSpan message) {
  return ParseFound(message, MessageType::kPartition);
}

Result<PartitionData> ParseManifest(ByteSpan message) {
  return ParseFound(message, MessageType::kManifest);
}

Result<PartitionData> ParseDeltaChunk(ByteSpan message) {
  return ParseFound(message, MessageType::kDeltaChunk);
}

Result<ActiveVersion> ParseActiveVersion(ByteSpan message) {
  return ParseBody<ActiveVersion>(
      message, MessageType::kActiveVersion, [&](BodyReader& r, ActiveVersion& m) {
        uint8_t has = 0;
        uint64_t length = 0;
        r.GetDigest(m.version);
        r.Get(has);
        r.Get(length);
        if (has > 1 || (has == 1) != (length > 0)) {
          return Status::Corrupt("ACTIVE_VERSION manifest flag does not match its length");
        }
        m.has_manifest = has == 1;
        if (!r.GetSpan(length, m.manifest)) {
          return Status::Corrupt("ACTIVE_VERSION manifest runs past the message");
        }
        return Status::Ok();
      });
}

Result<FetchChain> ParseFetchChain(ByteSpan message) {
  return ParseBody<FetchChain>(message, MessageType::kFetchChain,
                               [&](BodyReader& r, FetchChain& m) {
                                 r.Get(m.request_id);
                                 r.GetDigest(m.from);
                                 r.GetDigest(m.to);
                               });
}

Result<Chain> ParseChain(ByteSpan message) {
  return ParseBody<Chain>(message, MessageType::kChain, [&](BodyReader& r, Chain& m) {
    uint8_t found = 0, count = 0;
    r.Get(m.request_id);
    r.Get(found);
    r.Get(count);
    if (found > 1) return Status::Corrupt("CHAIN found flag is " + std::to_string(found));
    if (count > kMaxChainLinks)
      return Status::Corrupt("CHAIN lists " + std::to_string(count) + " deltas");
    m.found = found == 1;
    m.links.resize(count);
    for (auto& link : m.links) {
      r.GetDigest(link.base);
      r.GetDigest(link.target);
      r.Get(link.partition_bytes);
      r.Get(link.chunks);
    }
    return Status::Ok();
  });
}

Result<FetchDeltaChunk> ParseFetchDeltaChunk(ByteSpan message) {
  return ParseBody<FetchDeltaChunk>(message, MessageType::kFetchDeltaChunk,
                                    [&](BodyReader& r, FetchDeltaChunk& m) {
                                      r.Get(m.request_id);
                                      r.GetDigest(m.target);
                                      r.Get(m.sequence);
                                    });
}

Result<FetchManifest> ParseFetchManifest(ByteSpan message) {
  return ParseBody<FetchManifest>(message, MessageType::kFetchManifest,
                                  [&](BodyReader& r, FetchManifest& m) {
                                    r.Get(m.request_id);
                                    r.GetDigest(m.version);
                                    r.GetDigest(m.from);
                                  });
}

}  // namespace deltacast::relay
