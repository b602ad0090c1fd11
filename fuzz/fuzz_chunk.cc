// The chunk decoder on hostile bytes: ParseChunk, then every record decoded and
// checked against a zero base the way a receiver does before it writes anything.
// The first byte picks a mode: even, the bytes as they came (checksums must hold);
// odd, the header and payload checksums fixed up first, so the fuzzer reaches the
// record and entropy parsers behind them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/chunk.h"
#include "codec/partition_codec.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/hash.h"

using namespace deltacast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool fix = data[0] & 1;
  std::vector<std::byte> chunk(reinterpret_cast<const std::byte*>(data) + 1,
                               reinterpret_cast<const std::byte*>(data) + size);
  if (fix && chunk.size() >= codec::kChunkHeaderBytes) {
    const size_t payload = chunk.size() - codec::kChunkHeaderBytes;
    StoreLE<uint64_t>(chunk.data() + 56, payload);
    StoreLE<uint64_t>(chunk.data() + 64,
                      Hash64(ByteSpan(chunk.data() + codec::kChunkHeaderBytes, payload)));
    StoreLE<uint64_t>(chunk.data() + 72, Hash64(ByteSpan(chunk.data(), 72)));
  }
  (void)codec::VerifyChunkChecksums(chunk);
  (void)codec::PeekChunkHeader(chunk);
  auto view = codec::ParseChunk(chunk);
  if (!view.ok()) return 0;
  codec::CodecScratch scratch;
  for (const auto& record : view->records) {
    // A partition of at most 1 MiB of zeros stands in for the base: enough to run
    // every decoder, small enough to keep executions fast.
    const uint64_t e = ElementSize(record.dtype);
    if (record.element_count == 0 || record.element_count > (uint64_t{1} << 20) / e) continue;
    std::vector<std::byte> base(record.element_count * e);
    codec::DecodedRecord decoded;
    (void)codec::DecodeAndCheckRecord(record.Coding(), base, decoded, scratch);
  }
  return 0;
}
