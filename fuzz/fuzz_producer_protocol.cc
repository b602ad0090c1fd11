// Every root <-> producer message parser on the same bytes (relay/producers/producer_protocol.h),
// as the root reads what a producer sends and a producer what the root sends, and
// what the root then does with a parsed SHARD_CHUNK's chunk (its header).
#include <cstddef>
#include <cstdint>

#include "codec/chunk.h"
#include "relay/producers/producer_protocol.h"

using namespace deltacast;
using namespace deltacast::relay;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ByteSpan m(reinterpret_cast<const std::byte*>(data), size);
  (void)PeekType(m);
  (void)ParseProduce(m);
  (void)ParseCoverage(m);
  (void)ParseBaseHashes(m);
  (void)ParseProduced(m);
  (void)ParsePull(m);
  (void)ParseProduceEnd(m);
  if (auto chunk = ParseShardChunk(m); chunk.ok()) (void)codec::PeekChunkHeader(chunk->second);
  if (auto pieces = ParsePieces(m); pieces.ok()) {
    // The views must lie inside the message.
    for (const auto& e : pieces->second) {
      if (!e.piece.payload.empty() &&
          (e.piece.payload.data() < m.data() ||
           e.piece.payload.data() + e.piece.payload.size() > m.data() + m.size())) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
