// The tcp transport's frame header and handshake payload decoders, on every 24-byte
// window of the input (a stream of frames as a reader sees it).
#include <cstddef>
#include <cstdint>
#include <span>

#include "transport/tcp/frame.h"

using namespace deltacast::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  for (size_t at = 0; at + kFrameHeaderSize <= size; at += kFrameHeaderSize) {
    auto header = DecodeFrameHeader(
        std::span<const std::byte, kFrameHeaderSize>(bytes + at, kFrameHeaderSize));
    if (header.ok() && header->type == FrameType::kHello && at + 2 * kFrameHeaderSize <= size) {
      (void)DecodeHello(
          std::span<const std::byte, kHelloSize>(bytes + at + kFrameHeaderSize, kHelloSize));
    }
  }
  return 0;
}
