#include "relay/protocol.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace deltacast::relay {
namespace {

constexpr size_t kMaxTensorNameInFetch = 1024;

std::vector<std::byte> Header(MessageType type) {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.Put<uint32_t>(kProtocolMagic);
  w.Put<uint8_t>(kProtocolVersion);
  w.Put<uint8_t>(static_cast<uint8_t>(type));
  w.Put<uint16_t>(0);
  return out;
}

void PutString(ByteWriter& w, std::string_view s) {
  w.Put<uint16_t>(static_cast<uint16_t>(s.size()));
  w.PutString(s);
}

void PutDigest(ByteWriter& w, const Digest128& d) {
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size()));
}

// Reads a message body of one expected type, field by field, with one error text.
class BodyReader {
 public:
  BodyReader(ByteSpan message, MessageType type) : type_(type), r_(message) {}

  Status Open() {
    ASSIGN_OR_RETURN(MessageType got, PeekType(AsSpan()));
    if (got != type_) {
      return Status::Corrupt("expected " + std::string(MessageTypeName(type_)) + ", got " +
                             std::string(MessageTypeName(got)));
    }
    ByteSpan header;
    (void)r_.GetBytes(kMessageHeaderBytes, header);
    return Status::Ok();
  }
  template <typename T>
  bool Get(T& v) {
    return ok_ = ok_ && r_.Get(v);
  }
  bool GetString(std::string& s, size_t max) {
    uint16_t n;
    ByteSpan b;
    ok_ = ok_ && r_.Get(n) && n <= max && r_.GetBytes(n, b);
    if (ok_) s.assign(AsChars(b));
    return ok_;
  }
  template <size_t N>
  bool GetArray(std::array<uint8_t, N>& a) {
    ByteSpan b;
    ok_ = ok_ && r_.GetBytes(N, b);
    if (ok_) std::memcpy(a.data(), b.data(), N);
    return ok_;
  }
  bool GetDigest(Digest128& d) { return GetArray(d.bytes); }
  bool GetSpan(uint64_t n, ByteSpan& out) { return ok_ = ok_ && r_.GetBytes(n, out); }
  Status Close() {
    if (!ok_)
      return Status::Corrupt(std::string(MessageTypeName(type_)) +
                             " message is truncated or has an oversized field");
    if (r_.remaining() != 0) {
      return Status::Corrupt(std::string(MessageTypeName(type_)) + " message has " +
                             std::to_string(r_.remaining()) + " trailing bytes");
    }
    return Status::Ok();
  }

 private:
  ByteSpan AsSpan() const { return r_.rest(); }
  MessageType type_;
  ByteReader r_;
  bool ok_ = true;
};

// Opens a message of `type`, reads its fields into a T with read(r, m) (which may
// return an error of its own: a count or a flag out of range), and rejects
// truncation and trailing bytes.
template <typename T, typename ReadFields>
Result<T> ParseBody(ByteSpan message, MessageType type, ReadFields read) {
  BodyReader r(message, type);
  RETURN_IF_ERROR(r.Open());
  T m;
  if constexpr (std::is_void_v<std::invoke_result_t<ReadFields&, BodyReader&, T&>>) {
    read(r, m);
  } else {
    RETURN_IF_ERROR(read(r, m));
  }
  RETURN_IF_ERROR(r.Close());
  return m;
}

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
  }
  return "UNKNOWN";
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

std::vector<std::byte> EncodeChallenge(const Challenge& m) {
  auto out = Header(MessageType::kChallenge);
  ByteWriter w(out);
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(m.nonce.data()), m.nonce.size()));
  PutString(w, m.parent_id);
  return out;
}

std::vector<std::byte> EncodeHello(const Hello& m) {
  auto out = Header(MessageType::kHello);
  ByteWriter w(out);
  PutString(w, m.node_id);
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(m.proof.data()), m.proof.size()));
  PutDigest(w, m.active_version);
  PutDigest(w, m.inflight_base);
  PutDigest(w, m.inflight_target);
  w.Put<uint8_t>(m.prepared ? 1 : 0);
  w.Put<uint32_t>(static_cast<uint32_t>(m.applied_chunks.size()));
  for (uint32_t s : m.applied_chunks) w.Put<uint32_t>(s);
  PutString(w, m.transport);
  w.Put<uint8_t>(static_cast<uint8_t>(std::min<size_t>(m.transports.size(), kMaxHopTransports)));
  for (size_t i = 0; i < m.transports.size() && i < kMaxHopTransports; ++i) {
    PutString(w, m.transports[i]);
  }
  return out;
}

std::vector<std::byte> EncodeWelcome() { return Header(MessageType::kWelcome); }
std::vector<std::byte> EncodeHeartbeat() { return Header(MessageType::kHeartbeat); }

std::vector<std::byte> EncodeRefuse(const Refuse& m) {
  auto out = Header(MessageType::kRefuse);
  ByteWriter w(out);
  PutString(w, m.reason.substr(0, kMaxReasonBytes));
  return out;
}

std::vector<std::byte> EncodeBegin(const Begin& m) {
  auto out = Header(MessageType::kBegin);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  PutDigest(w, m.base_version);
  PutDigest(w, m.target_version);
  w.Put<uint64_t>(m.partition_bytes);
  return out;
}

std::vector<std::byte> EncodeChunk(ByteSpan chunk) {
  auto out = Header(MessageType::kChunk);
  out.insert(out.end(), chunk.begin(), chunk.end());
  return out;
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
  }
  return out;
}

std::vector<std::byte> EncodeFailed(const Failed& m) {
  auto out = Header(MessageType::kFailed);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  PutString(w, m.node_id);
  PutString(w, m.reason.substr(0, kMaxReasonBytes));
  return out;
}

std::vector<std::byte> EncodeDecision(MessageType type, const Decision& m) {
  auto out = Header(type);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  PutDigest(w, m.target_version);
  return out;
}

std::vector<std::byte> EncodeOutcome(MessageType type, const Outcome& m) {
  auto out = Header(type);
  ByteWriter w(out);
  w.Put<uint64_t>(m.refit_id);
  w.Put<uint32_t>(m.nodes);
  return out;
}

Result<Challenge> ParseChallenge(ByteSpan message) {
  return ParseBody<Challenge>(message, MessageType::kChallenge, [&](BodyReader& r, Challenge& m) {
    r.GetArray(m.nonce);
    r.GetString(m.parent_id, kMaxNodeIdBytes);
  });
}

Result<Hello> ParseHello(ByteSpan message) {
  return ParseBody<Hello>(message, MessageType::kHello, [&](BodyReader& r, Hello& m) {
    r.GetString(m.node_id, kMaxNodeIdBytes);
    r.GetArray(m.proof);
    r.GetDigest(m.active_version);
    r.GetDigest(m.inflight_base);
    r.GetDigest(m.inflight_target);
    uint8_t prepared = 0;
    uint32_t count = 0;
    r.Get(prepared);
    r.Get(count);
    if (prepared > 1) return Status::Corrupt("HELLO prepared flag is " + std::to_string(prepared));
    if (count > kMaxAppliedInHello || count > message.size() / 4) {
      return Status::Corrupt("HELLO lists " + std::to_string(count) + " applied chunks");
    }
    m.prepared = prepared == 1;
    m.applied_chunks.resize(count);
    for (auto& s : m.applied_chunks) r.Get(s);
    r.GetString(m.transport, kMaxTransportNameBytes);
    uint8_t transports = 0;
    r.Get(transports);
    if (transports > kMaxHopTransports) {
      return Status::Corrupt("HELLO lists " + std::to_string(transports) + " transports");
    }
    m.transports.resize(transports);
    for (auto& t : m.transports) r.GetString(t, kMaxTransportNameBytes);
    return Status::Ok();
  });
}

Result<Refuse> ParseRefuse(ByteSpan message) {
  return ParseBody<Refuse>(message, MessageType::kRefuse, [&](BodyReader& r, Refuse& m) {
    r.GetString(m.reason, kMaxReasonBytes);
  });
}

Result<Begin> ParseBegin(ByteSpan message) {
  return ParseBody<Begin>(message, MessageType::kBegin, [&](BodyReader& r, Begin& m) {
    r.Get(m.refit_id);
    r.GetDigest(m.base_version);
    r.GetDigest(m.target_version);
    r.Get(m.partition_bytes);
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
    // Each report takes at least 26 bytes; refuse counts the message cannot hold.
    if (count > message.size() / 26)
      return Status::Corrupt("PREPARED message claims " + std::to_string(count) + " nodes");
    m.nodes.resize(count);
    for (auto& n : m.nodes) {
      r.GetString(n.node_id, kMaxNodeIdBytes);
      r.Get(n.chunk_bytes);
      r.Get(n.apply_seconds);
      r.Get(n.partitions_applied);
    }
    return Status::Ok();
  });
}

Result<Failed> ParseFailed(ByteSpan message) {
  return ParseBody<Failed>(message, MessageType::kFailed, [&](BodyReader& r, Failed& m) {
    r.Get(m.refit_id);
    r.GetString(m.node_id, kMaxNodeIdBytes);
    r.GetString(m.reason, kMaxReasonBytes);
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
  });
}

Result<Outcome> ParseOutcome(ByteSpan message) {
  ASSIGN_OR_RETURN(MessageType type, PeekType(message));
  if (type != MessageType::kCommitted && type != MessageType::kAborted) {
    return Status::Corrupt("expected COMMITTED or ABORTED, got " +
                           std::string(MessageTypeName(type)));
  }
  return ParseBody<Outcome>(message, type, [&](BodyReader& r, Outcome& m) {
    r.Get(m.refit_id);
    r.Get(m.nodes);
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

std::array<uint8_t, kProofBytes> HelloProof(std::string_view token,
                                            const std::array<uint8_t, kNonceBytes>& nonce,
                                            std::string_view child_id, std::string_view parent_id) {
  std::vector<uint8_t> data(nonce.begin(), nonce.end());
  data.insert(data.end(), child_id.begin(), child_id.end());
  data.push_back(0);  // separator: ids cannot contain NUL
  data.insert(data.end(), parent_id.begin(), parent_id.end());
  std::array<uint8_t, kProofBytes> out{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), data.data(), data.size(),
       out.data(), &length);
  return out;
}

bool ProofMatches(const std::array<uint8_t, kProofBytes>& a,
                  const std::array<uint8_t, kProofBytes>& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;  // constant time
}

std::array<uint8_t, kNonceBytes> RandomNonce() {
  std::array<uint8_t, kNonceBytes> nonce{};
  RAND_bytes(nonce.data(), static_cast<int>(nonce.size()));
  return nonce;
}

}  // namespace deltacast::relay
