// A serialized manifest: from the manifest cache on disk and MANIFEST messages. The
// first byte picks whether the trailing checksum is fixed up, to reach the fields.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/manifest.h"
#include "common/bytes.h"
#include "common/hash.h"

using namespace deltacast;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data) + 1,
                               reinterpret_cast<const std::byte*>(data) + size);
  if ((data[0] & 1) && bytes.size() >= 8) {
    StoreLE<uint64_t>(bytes.data() + bytes.size() - 8,
                      Hash64(ByteSpan(bytes.data(), bytes.size() - 8)));
  }
  auto manifest = codec::Manifest::Parse(bytes);
  if (manifest.ok()) (void)manifest->VersionId();
  return 0;
}
