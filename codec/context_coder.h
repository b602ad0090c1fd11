// Context mode: the entropy coder for sparse changes that conditions on the base
// partition, which the receiver already holds.
//
// Every element of the partition gets a changed / unchanged decision coded with
// an adaptive binary model whose context is the base element's exponent: in Adam
// training every weight moves by about the learning rate, so weights with a small
// exponent (small unit in the last place) change far more often than large ones.
// A changed element whose sign is kept is coded as the integer difference of its
// magnitude bits (a direction bit and an Elias-gamma magnitude, modelled per
// exponent; +-1 unit in the last place is ~90 % of changes); a sign change is an
// escape followed by the XOR word's magnitude bits. Only integer operations on
// the bits are involved, so every bit pattern (NaN payloads, -0.0, denormals,
// infinities, carries into the exponent) round-trips exactly.
//
// The payload format is specified in docs/wire-format.md ("Context mode"): a
// version byte, the dtype, then one binary range-coder stream.
//
// Thread safety: the functions are pure and thread-safe; concurrent calls share
// no state.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/changes.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/status.h"

namespace deltacast::codec {

// First byte of every context-mode payload. A decoder rejects other values.
inline constexpr uint8_t kContextFormatVersion = 1;

// True for the dtypes whose bit fields context mode models: BF16, F16, F32 and the
// FP8 formats E4M3 and E5M2 (the serving twins, docs/fp8.md).
bool ContextModeSupports(DType dtype);

// Encodes the changes of one partition given its base bytes. `base` is the whole
// partition (element-aligned, dtype-sized elements), `changes` its changed elements.
// Pure function; output is a self-contained payload.
//
// Fails with InvalidArgument (and produces nothing) when the dtype is not
// supported, `base` is not a whole number of elements or has more than 2^32 of
// them, or `changes` is malformed: wrong element size, positions not strictly
// increasing or beyond the partition, an XOR array of the wrong length, or a
// zero XOR word.
Result<std::vector<std::byte>> ContextEncode(DType dtype, ByteSpan base,
                                             const SparseChanges& changes);

// Decodes `payload` against the same `base` into `out` (cleared first). `change_count`
// is the number of changes the encoder saw (carried in the record header): decoding
// must produce exactly that many. Validates everything: truncated or garbage payload,
// a position beyond the partition, a zero XOR word, trailing garbage -> Status::Corrupt with
// a clear message. Never reads out of bounds, never allocates more than change_count entries.
//
// Unsupported dtypes and a `base` that is not a whole number of elements give
// InvalidArgument. A change_count above the partition's element count is Corrupt
// before anything is allocated. On any failure `out` is left cleared. Time is
// linear in the partition size whatever the payload holds.
Status ContextDecode(DType dtype, ByteSpan payload, ByteSpan base, uint64_t change_count,
                     SparseChanges& out);

}  // namespace deltacast::codec
