// The safetensors header parser: the input is a whole file (length prefix, JSON,
// data). What `deltacast manifest` and every store open run first on disk input.
#include <cstddef>
#include <cstdint>

#include "apply/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  deltacast::ByteSpan bytes(reinterpret_cast<const std::byte*>(data), size);
  (void)deltacast::apply::ParseSafetensorsHeader(bytes, size);
  // A file larger than what was read: the parser must not read past the prefix.
  (void)deltacast::apply::ParseSafetensorsHeader(bytes, uint64_t{size} + 4096);
  return 0;
}
