// The general-purpose entropy stage applied to an encoded partition: zstd, lz4 or
// nothing. Decompression never allocates more than the caller's declared size.
//
// Thread safety: functions are thread-safe (compression contexts are per thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace deltacast::codec {

enum class EntropyCoder : uint8_t {
  kNone = 0,
  kZstd = 1,
  kLz4 = 2,
};

// Appends the compressed form of `raw` to `out`. zstd runs at `zstd_level` with
// parameters chosen for byte planes (entropy.cc, Configure); any zstd decoder reads
// the frames.
void Compress(EntropyCoder coder, int zstd_level, ByteSpan raw, std::vector<std::byte>& out);

// Decompresses `stored` into `out`, which the caller sized to the exact raw size the
// record declares. Corrupt if the data is malformed or decompresses to any other size.
Status Decompress(EntropyCoder coder, ByteSpan stored, MutableByteSpan out);

// Compresses each section on its own and appends, per section: a mode byte (0 =
// stored as is, else the EntropyCoder value), the raw length and the stored length
// as varints, then the stored bytes. A section is stored as is when compressing
// does not make it smaller. Independent sections (gaps, then one byte plane after
// another) each get an entropy model fitted to them alone.
void CompressSections(EntropyCoder coder, int zstd_level, std::span<const ByteSpan> sections,
                      std::vector<std::byte>& out);

// Decodes a section sequence into `out`, sized by the caller to the record's total
// raw size. Corrupt unless every section is well-formed, uses mode 0 or `coder`,
// and the raw lengths add up to exactly out.size(); nothing is allocated.
Status DecompressSections(EntropyCoder coder, ByteSpan payload, MutableByteSpan out);

}  // namespace deltacast::codec
