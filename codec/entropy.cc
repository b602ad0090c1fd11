#include "codec/entropy.h"

#include <lz4.h>
// For ZSTD_c_literalCompressionMode, an experimental parameter the shared library
// takes like any other (checked: a library that refuses it gets level 1's defaults).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

namespace deltacast::codec {
namespace {

struct ZstdContexts {
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx{ZSTD_createCCtx(), ZSTD_freeCCtx};
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx{ZSTD_createDCtx(), ZSTD_freeDCtx};
  std::optional<int> level;  // what cctx is set up for
};

// Sets `cctx` up for `level` on the sections the codec compresses: byte planes and
// gap bytes, order-0 data in which long matches are rare. Matches of 7 bytes or more
// from a 256-entry table, and literals always Huffman-coded (which negative levels
// otherwise skip). On the 3 % BF16 step of the diff benchmark this came out both
// smaller and faster than level 1's defaults: 1.048 x the sections' order-0 entropy
// at -5 in 0.07 s per GB of checkpoint, against 1.072 x in 0.12 s.
void Configure(ZSTD_CCtx* cctx, int level) {
  (void)ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  const bool tuned = !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_literalCompressionMode,
                                                          static_cast<int>(ZSTD_ps_enable)));
  // Without forced literal coding a negative level would store literals raw.
  (void)ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, tuned ? level : std::max(level, 1));
  if (tuned) {
    (void)ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, 7);
    (void)ZSTD_CCtx_setParameter(cctx, ZSTD_c_hashLog, 8);
  }
}

ZstdContexts& ThreadContexts() {
  thread_local ZstdContexts contexts;
  return contexts;
}

}  // namespace

void Compress(EntropyCoder coder, int zstd_level, ByteSpan raw, std::vector<std::byte>& out) {
  const size_t at = out.size();
  switch (coder) {
    case EntropyCoder::kNone:
      out.insert(out.end(), raw.begin(), raw.end());
      return;
    case EntropyCoder::kZstd: {
      ZstdContexts& contexts = ThreadContexts();
      if (contexts.level != zstd_level) {
        Configure(contexts.cctx.get(), zstd_level);
        contexts.level = zstd_level;
      }
      out.resize(at + ZSTD_compressBound(raw.size()));
      const size_t n = ZSTD_compress2(contexts.cctx.get(), out.data() + at, out.size() - at,
                                      raw.data(), raw.size());
      // Compression into a buffer of compressBound size cannot fail.
      out.resize(at + (ZSTD_isError(n) ? 0 : n));
      return;
    }
    case EntropyCoder::kLz4: {
      const int bound = LZ4_compressBound(static_cast<int>(raw.size()));
      out.resize(at + static_cast<size_t>(bound));
      const int n = LZ4_compress_default(reinterpret_cast<const char*>(raw.data()),
                                         reinterpret_cast<char*>(out.data() + at),
                                         static_cast<int>(raw.size()), bound);
      out.resize(at + static_cast<size_t>(n > 0 ? n : 0));
      return;
    }
  }
}

Status Decompress(EntropyCoder coder, ByteSpan stored, MutableByteSpan out) {
  switch (coder) {
    case EntropyCoder::kNone:
      if (stored.size() != out.size()) {
        return Status::Corrupt("stored payload is " + std::to_string(stored.size()) +
                               " bytes, record declares " + std::to_string(out.size()));
      }
      std::copy(stored.begin(), stored.end(), out.begin());
      return Status::Ok();
    case EntropyCoder::kZstd: {
      const unsigned long long declared = ZSTD_getFrameContentSize(stored.data(), stored.size());
      if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN ||
          declared != out.size()) {
        return Status::Corrupt("zstd frame does not declare the record's raw size of " +
                               std::to_string(out.size()) + " bytes");
      }
      const size_t n = ZSTD_decompressDCtx(ThreadContexts().dctx.get(), out.data(), out.size(),
                                           stored.data(), stored.size());
      if (ZSTD_isError(n)) return Status::Corrupt(std::string("zstd: ") + ZSTD_getErrorName(n));
      if (n != out.size()) return Status::Corrupt("zstd frame decompressed to the wrong size");
      return Status::Ok();
    }
    case EntropyCoder::kLz4: {
      if (stored.size() > static_cast<size_t>(LZ4_MAX_INPUT_SIZE) ||
          out.size() > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) {
        return Status::Corrupt("lz4 block too large");
      }
      const int n = LZ4_decompress_safe(
          reinterpret_cast<const char*>(stored.data()), reinterpret_cast<char*>(out.data()),
          static_cast<int>(stored.size()), static_cast<int>(out.size()));
      if (n < 0 || static_cast<size_t>(n) != out.size()) {
        return Status::Corrupt("lz4 block is malformed or has the wrong size");
      }
      return Status::Ok();
    }
  }
  return Status::Corrupt("unknown entropy coder");
}

void CompressSections(EntropyCoder coder, int zstd_level, std::span<const ByteSpan> sections,
                      std::vector<std::byte>& out) {
  thread_local std::vector<std::byte> packed;
  ByteWriter w(out);
  for (ByteSpan raw : sections) {
    packed.clear();
    if (coder != EntropyCoder::kNone && !raw.empty()) Compress(coder, zstd_level, raw, packed);
    const bool compressed = !packed.empty() && packed.size() < raw.size();
    const ByteSpan stored = compressed ? ByteSpan(packed) : raw;
    w.Put<uint8_t>(compressed ? static_cast<uint8_t>(coder) : 0);
    w.PutVarint(raw.size());
    w.PutVarint(stored.size());
    w.PutBytes(stored);
  }
}

Status DecompressSections(EntropyCoder coder, ByteSpan payload, MutableByteSpan out) {
  // Checked up front: a payload whose sections are all stored (mode 0) never
  // reaches Decompress(coder, ...), which would refuse it.
  if (coder != EntropyCoder::kNone && coder != EntropyCoder::kZstd && coder != EntropyCoder::kLz4) {
    return Status::Corrupt("unknown entropy coder " + std::to_string(static_cast<int>(coder)));
  }
  ByteReader r(payload);
  size_t filled = 0;
  for (int section = 0; r.remaining() > 0; ++section) {
    const std::string where = "section " + std::to_string(section) + ": ";
    uint8_t mode;
    uint64_t raw_length, stored_length;
    ByteSpan stored;
    if (!r.Get(mode) || !r.GetVarint(raw_length) || !r.GetVarint(stored_length)) {
      return Status::Corrupt(where + "truncated header");
    }
    if (mode != 0 && mode != static_cast<uint8_t>(coder)) {
      return Status::Corrupt(where + "mode " + std::to_string(mode) + " is not the record's coder");
    }
    if (raw_length > out.size() - filled) {
      return Status::Corrupt(where + "raw length " + std::to_string(raw_length) +
                             " overflows the record's raw size " + std::to_string(out.size()));
    }
    if (!r.GetBytes(stored_length, stored))
      return Status::Corrupt(where + "stored bytes run past the payload");
    RETURN_IF_ERROR(
        Decompress(static_cast<EntropyCoder>(mode), stored, out.subspan(filled, raw_length))
            .WithContext(where));
    filled += raw_length;
  }
  if (filled != out.size()) {
    return Status::Corrupt("sections hold " + std::to_string(filled) +
                           " raw bytes, record declares " + std::to_string(out.size()));
  }
  return Status::Ok();
}

}  // namespace deltacast::codec
