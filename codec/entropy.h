// The general-purpose entropy stage applied to an encoded partition: zstd, lz4 or
// nothing. Decompression never allocates more than the caller's declared size.
//
// Thread safety: functions are thread-safe (compression contexts are per thread).
#pragma once

#include <cstdint>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace deltacast::codec {

enum class EntropyCoder : uint8_t {
  kNone = 0,
  kZstd = 1,
  kLz4 = 2,
};

// Appends the compressed form of `raw` to `out`.
void Compress(EntropyCoder coder, int zstd_level, ByteSpan raw, std::vector<std::byte>& out);

// Decompresses `stored` into `out`, which the caller sized to the exact raw size the
// record declares. Corrupt if the data is malformed or decompresses to any other size.
Status Decompress(EntropyCoder coder, ByteSpan stored, MutableByteSpan out);

}  // namespace deltacast::codec
