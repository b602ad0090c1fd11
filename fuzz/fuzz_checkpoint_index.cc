// The checkpoint layout file, model.safetensors.index.json (which tensor lives in
// which file): read from disk before a store opens its files.
#include <cstddef>
#include <cstdint>

#include "apply/checkpoint_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)deltacast::apply::ParseCheckpointIndex(
      deltacast::ByteSpan(reinterpret_cast<const std::byte*>(data), size), "fuzz.index.json");
  return 0;
}
