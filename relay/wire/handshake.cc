// The relay handshake's messages (CHALLENGE, HELLO, WELCOME) and proofs
// (docs/protocol.md, "Handshake"). They are parsed before the peer is
// authenticated, so every count is bounded before anything is allocated.
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdlib>

#include "common/runtime.h"
#include "relay/wire/internal/body_reader.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {
namespace {

using internal::BodyReader;
using internal::Header;
using internal::ParseBody;
using internal::PutArray;
using internal::PutDigest;
using internal::PutString;

// Backend names are printable ASCII without spaces ("tcp", "fault(inproc)").
bool ValidTransportName(std::string_view name) {
  return !name.empty() &&
         std::all_of(name.begin(), name.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

// Sorted, distinct sequences as runs (first, count), at most kMaxAppliedRunsInHello.
std::vector<std::pair<uint32_t, uint32_t>> Runs(const std::vector<uint32_t>& applied) {
  std::vector<uint32_t> sorted = applied;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  for (uint32_t s : sorted) {
    if (!runs.empty() && runs.back().first + runs.back().second == s) {
      ++runs.back().second;
    } else {
      if (runs.size() == kMaxAppliedRunsInHello) break;  // the rest are resent (protocol.h)
      runs.push_back({s, 1});
    }
  }
  return runs;
}

std::array<uint8_t, kProofBytes> Hmac(std::string_view token, const std::vector<uint8_t>& data) {
  std::array<uint8_t, kProofBytes> out{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), data.data(), data.size(),
       out.data(), &length);
  return out;
}

void Append(std::vector<uint8_t>& data, std::string_view s) {
  data.insert(data.end(), s.begin(), s.end());
  data.push_back(0);  // separator: labels and node ids contain no NUL (ValidNodeId)
}

}  // namespace

bool ValidNodeId(std::string_view id) {
  return !id.empty() && id.size() <= kMaxNodeIdBytes &&
         std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
         });
}

std::vector<std::byte> EncodeChallenge(const Challenge& m) {
  auto out = Header(MessageType::kChallenge);
  ByteWriter w(out);
  PutArray(w, m.nonce);
  PutString(w, m.parent_id);
  return out;
}

std::vector<std::byte> EncodeHello(const Hello& m) {
  auto out = Header(MessageType::kHello);
  ByteWriter w(out);
  PutString(w, m.node_id);
  PutArray(w, m.proof);
  PutArray(w, m.nonce);
  PutDigest(w, m.active_version);
  PutDigest(w, m.inflight_base);
  PutDigest(w, m.inflight_target);
  w.Put<uint8_t>(m.prepared ? 1 : 0);
  w.Put<uint64_t>(m.inflight_stream);
  const auto runs = Runs(m.applied_chunks);
  w.Put<uint32_t>(static_cast<uint32_t>(runs.size()));
  for (const auto& [first, count] : runs) {
    w.Put<uint32_t>(first);
    w.Put<uint32_t>(count);
  }
  PutString(w, m.transport);
  w.Put<uint8_t>(static_cast<uint8_t>(std::min<size_t>(m.transports.size(), kMaxHopTransports)));
  for (size_t i = 0; i < m.transports.size() && i < kMaxHopTransports; ++i) {
    PutString(w, m.transports[i]);
  }
  w.Put<uint8_t>(static_cast<uint8_t>(m.stripe));
  w.Put<uint8_t>(static_cast<uint8_t>(m.stripes));
  return out;
}

std::vector<std::byte> EncodeWelcome(const Welcome& m) {
  auto out = Header(MessageType::kWelcome);
  ByteWriter w(out);
  PutArray(w, m.proof);
  return out;
}

Result<Challenge> ParseChallenge(ByteSpan message) {
  return ParseBody<Challenge>(message, MessageType::kChallenge, [&](BodyReader& r, Challenge& m) {
    r.GetArray(m.nonce);
    if (r.GetString(m.parent_id, kMaxNodeIdBytes) && !ValidNodeId(m.parent_id)) {
      return Status::Corrupt("CHALLENGE names a parent id that is not a valid node id");
    }
    return Status::Ok();
  });
}

Result<Hello> ParseHello(ByteSpan message) {
  return ParseBody<Hello>(message, MessageType::kHello, [&](BodyReader& r, Hello& m) {
    if (r.GetString(m.node_id, kMaxNodeIdBytes) && !ValidNodeId(m.node_id)) {
      return Status::Corrupt("HELLO names a node id that is not a valid node id");
    }
    r.GetArray(m.proof);
    r.GetArray(m.nonce);
    r.GetDigest(m.active_version);
    r.GetDigest(m.inflight_base);
    r.GetDigest(m.inflight_target);
    uint8_t prepared = 0;
    uint32_t runs = 0;
    r.Get(prepared);
    r.Get(m.inflight_stream);
    r.Get(runs);
    if (prepared > 1) return Status::Corrupt("HELLO prepared flag is " + std::to_string(prepared));
    if (runs > kMaxAppliedRunsInHello || runs > r.remaining() / 8) {
      return Status::Corrupt("HELLO lists " + std::to_string(runs) + " runs of applied chunks");
    }
    m.prepared = prepared == 1;
    uint64_t total = 0;
    uint64_t next = 0;  // runs ascend and do not touch: one encoding per set
    std::vector<std::pair<uint32_t, uint32_t>> list(runs);
    for (auto& [first, count] : list) {
      if (!r.Get(first) || !r.Get(count)) break;
      if (count == 0 || first < next || uint64_t{first} + count > (uint64_t{1} << 32)) {
        return Status::Corrupt("HELLO lists a malformed run of applied chunks");
      }
      next = uint64_t{first} + count + 1;
      total += count;
      if (total > kMaxAppliedInHello) {
        return Status::Corrupt("HELLO lists more than " + std::to_string(kMaxAppliedInHello) +
                               " applied chunks");
      }
    }
    m.applied_chunks.reserve(total);
    for (const auto& [first, count] : list) {
      for (uint64_t s = first; s < uint64_t{first} + count; ++s) {
        m.applied_chunks.push_back(static_cast<uint32_t>(s));
      }
    }
    if (r.GetString(m.transport, kMaxTransportNameBytes) && !m.transport.empty() &&
        !ValidTransportName(m.transport)) {
      return Status::Corrupt("HELLO names a transport that is not a transport name");
    }
    uint8_t transports = 0;
    r.Get(transports);
    if (transports > kMaxHopTransports) {
      return Status::Corrupt("HELLO lists " + std::to_string(transports) + " transports");
    }
    m.transports.resize(transports);
    for (auto& t : m.transports) {
      if (r.GetString(t, kMaxTransportNameBytes) && !ValidTransportName(t)) {
        return Status::Corrupt("HELLO lists a transport that is not a transport name");
      }
    }
    return r.GetStripe(m.stripe, m.stripes);
  });
}

Result<Welcome> ParseWelcome(ByteSpan message) {
  return ParseBody<Welcome>(message, MessageType::kWelcome,
                            [&](BodyReader& r, Welcome& m) { r.GetArray(m.proof); });
}

std::array<uint8_t, kProofBytes> ChildProof(std::string_view token,
                                            const std::array<uint8_t, kNonceBytes>& parent_nonce,
                                            std::string_view child_id, std::string_view parent_id) {
  std::vector<uint8_t> data;
  Append(data, "deltacast-v3 child proof");
  data.insert(data.end(), parent_nonce.begin(), parent_nonce.end());
  Append(data, child_id);
  Append(data, parent_id);
  return Hmac(token, data);
}

std::array<uint8_t, kProofBytes> ParentProof(std::string_view token,
                                             const std::array<uint8_t, kNonceBytes>& parent_nonce,
                                             const std::array<uint8_t, kNonceBytes>& child_nonce,
                                             std::string_view parent_id,
                                             std::string_view child_id) {
  std::vector<uint8_t> data;
  Append(data, "deltacast-v3 parent proof");
  data.insert(data.end(), parent_nonce.begin(), parent_nonce.end());
  data.insert(data.end(), child_nonce.begin(), child_nonce.end());
  Append(data, parent_id);
  Append(data, child_id);
  return Hmac(token, data);
}

bool ProofMatches(const std::array<uint8_t, kProofBytes>& a,
                  const std::array<uint8_t, kProofBytes>& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;  // constant time
}

std::array<uint8_t, kNonceBytes> RandomNonce() {
  std::array<uint8_t, kNonceBytes> nonce{};
  if (Runtime* sim = SimRuntime()) {  // a simulation replays from its seed
    for (auto& b : nonce) b = static_cast<uint8_t>(sim->Random64());
    return nonce;
  }
  // A nonce that is not random would let a recorded handshake be replayed: abort
  // rather than go on with a predictable one.
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) std::abort();
  return nonce;
}

}  // namespace deltacast::relay
