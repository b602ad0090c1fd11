// Value transforms of residual rules (description.h, Value): the canonical value of
// a local element computed from its bits. Float arithmetic in F32, rounded to the
// canonical dtype to nearest, ties to even (as torch's .to() does); NaNs stay NaN.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "layout/description.h"

namespace deltacast::layout {

// Whether `value` can take `from` elements to `to` elements (bits: equal dtypes;
// cast and add_one: F32, BF16, F16 either way).
bool TransformSupported(Value value, DType from, DType to);

// Writes the canonical values of `n` local elements: in[i * size(from)] ->
// out[i * size(to)]. Preconditions: TransformSupported.
void TransformValues(Value value, DType from, const std::byte* in, DType to, std::byte* out,
                     size_t n);

}  // namespace deltacast::layout
