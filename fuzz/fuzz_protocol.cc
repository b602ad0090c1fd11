// Every relay protocol parser on the same bytes, and the checks a node runs on a
// CHUNK message (split, chunk header), as a peer's message arrives.
#include <cstddef>
#include <cstdint>

#include "codec/chunk.h"
#include "relay/wire/protocol.h"
#include "relay/wire/signing.h"

using namespace deltacast;
using namespace deltacast::relay;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ByteSpan m(reinterpret_cast<const std::byte*>(data), size);
  (void)PeekType(m);
  (void)ParseChallenge(m);
  (void)ParseHello(m);
  (void)ParseWelcome(m);
  (void)ParseRefuse(m);
  (void)ParseBegin(m);
  (void)ParseCredit(m);
  (void)ParsePrepared(m);
  (void)ParseFailed(m);
  (void)ParseDecision(m);
  (void)ParseOutcome(m);
  (void)ParseFetch(m);
  (void)ParsePartition(m);
  (void)ParseFetchManifest(m);
  (void)ParseManifest(m);
  (void)ParseFetchChain(m);
  (void)ParseChain(m);
  (void)ParseFetchDeltaChunk(m);
  (void)ParseDeltaChunk(m);
  (void)ParseActiveVersion(m);
  (void)RequestIdOf(m);
  if (auto parts = SplitChunkMessage(m); parts.ok()) {
    (void)codec::PeekChunkHeader(parts->chunk);
    (void)codec::VerifyChunkChecksums(parts->chunk);
  }
  return 0;
}
