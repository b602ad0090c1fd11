#include "transport/tcp/frame.h"

#include <cstdio>
#include <string>

#include "common/bytes.h"

namespace deltacast::transport {

void EncodeFrameHeader(const FrameHeader& header, FrameHeaderBytes out) {
  StoreLE<uint32_t>(out.data(), kFrameMagic);
  out[4] = std::byte{kFrameVersion};
  out[5] = std::byte{static_cast<uint8_t>(header.type)};
  StoreLE<uint16_t>(out.data() + 6, 0);
  StoreLE<uint64_t>(out.data() + 8, header.length);
  StoreLE<uint64_t>(out.data() + 16, header.sequence);
}

Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte, kFrameHeaderSize> in) {
  const auto magic = LoadLE<uint32_t>(in.data());
  if (magic != kFrameMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x", magic);
    return Status::Corrupt(std::string("frame header: bad magic 0x") + hex +
                           " (not a deltacast transport peer?)");
  }
  const auto version = static_cast<uint8_t>(in[4]);
  if (version != kFrameVersion) {
    return Status::Corrupt("frame header: unsupported version " + std::to_string(version));
  }
  const auto type = static_cast<uint8_t>(in[5]);
  if (type < static_cast<uint8_t>(FrameType::kData) ||
      type > static_cast<uint8_t>(FrameType::kGoodbye)) {
    return Status::Corrupt("frame header: unknown frame type " + std::to_string(type));
  }
  const auto flags = LoadLE<uint16_t>(in.data() + 6);
  if (flags != 0) {
    return Status::Corrupt("frame header: reserved flags " + std::to_string(flags) +
                           " must be zero");
  }
  FrameHeader header;
  header.type = static_cast<FrameType>(type);
  header.length = LoadLE<uint64_t>(in.data() + 8);
  header.sequence = LoadLE<uint64_t>(in.data() + 16);
  const bool handshake = header.type == FrameType::kHello || header.type == FrameType::kHelloAck;
  if (handshake && header.length != kHelloSize) {
    return Status::Corrupt("frame header: handshake frame of " + std::to_string(header.length) +
                           " bytes, expected " + std::to_string(kHelloSize));
  }
  if (header.type == FrameType::kGoodbye && header.length != 0) {
    return Status::Corrupt("frame header: goodbye frame with a " + std::to_string(header.length) +
                           "-byte payload");
  }
  return header;
}

void EncodeHello(const Hello& hello, std::span<std::byte, kHelloSize> out) {
  StoreLE<uint64_t>(out.data(), hello.link_id);
  StoreLE<uint32_t>(out.data() + 8, hello.stream_index);
  StoreLE<uint32_t>(out.data() + 12, hello.stream_count);
  StoreLE<uint64_t>(out.data() + 16, hello.max_message_bytes);
}

Result<Hello> DecodeHello(std::span<const std::byte, kHelloSize> in) {
  Hello hello;
  hello.link_id = LoadLE<uint64_t>(in.data());
  hello.stream_index = LoadLE<uint32_t>(in.data() + 8);
  hello.stream_count = LoadLE<uint32_t>(in.data() + 12);
  hello.max_message_bytes = LoadLE<uint64_t>(in.data() + 16);
  if (hello.stream_count < 1 || hello.stream_count > kMaxStreamsPerLink) {
    return Status::Corrupt("hello: stream count " + std::to_string(hello.stream_count) +
                           " outside 1.." + std::to_string(kMaxStreamsPerLink));
  }
  if (hello.stream_index >= hello.stream_count) {
    return Status::Corrupt("hello: stream index " + std::to_string(hello.stream_index) +
                           " >= stream count " + std::to_string(hello.stream_count));
  }
  return hello;
}

}  // namespace deltacast::transport
