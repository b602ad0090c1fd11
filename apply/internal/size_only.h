// A partition's size for the records whose check reads only the size of their base
// (XOR and literal records: codec::DecodeAndCheckRecord), without reading the base.
#pragma once

#include <cstdint>
#include <vector>

#include "common/bytes.h"

namespace deltacast::apply::internal {

// `length` zero bytes, owned by the calling thread and valid until its next call.
inline ByteSpan SizeOnly(uint64_t length) {
  thread_local std::vector<std::byte> zeros;
  if (zeros.size() < length) zeros.resize(length);
  return ByteSpan(zeros.data(), length);
}

}  // namespace deltacast::apply::internal
