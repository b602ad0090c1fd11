// The TCP backend's frames: every byte the tcp transport puts on a socket is a frame
// header followed by `length` payload bytes. docs/transport.md ("TCP frame format")
// is the spec; these constants and codecs are its only implementation.
//
// Thread safety: free functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/status.h"

namespace deltacast::transport {

// Bytes 'D' 'C' 'T' 'P' on the wire (little-endian u32).
inline constexpr uint32_t kFrameMagic = 0x50544344;
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 24;
// Hello and hello-ack payloads.
inline constexpr size_t kHelloSize = 24;
// The most TCP streams one link may stripe over.
inline constexpr uint32_t kMaxStreamsPerLink = 64;

enum class FrameType : uint8_t {
  kData = 1,      // one message; sequence = its per-link index
  kHello = 2,     // connector -> acceptor, first frame of every stream
  kHelloAck = 3,  // acceptor -> connector, once the whole link is assembled
  kGoodbye = 4,   // orderly close; sequence = data frames the sender completed
};

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint64_t length = 0;    // payload bytes that follow
  uint64_t sequence = 0;  // meaning depends on type (see FrameType)
};

using FrameHeaderBytes = std::span<std::byte, kFrameHeaderSize>;

void EncodeFrameHeader(const FrameHeader& header, FrameHeaderBytes out);
// Checks magic, version, type, reserved flags and, for handshake and goodbye frames,
// the exact payload length; kCorrupt naming the field otherwise. The data length is
// left to the caller, who knows its max_message_bytes.
Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte, kFrameHeaderSize> in);

struct Hello {
  uint64_t link_id = 0;            // same on every stream of one link
  uint32_t stream_index = 0;       // 0 .. stream_count-1
  uint32_t stream_count = 1;       // 1 .. kMaxStreamsPerLink
  uint64_t max_message_bytes = 0;  // the sender's receive limit (informational)
};

void EncodeHello(const Hello& hello, std::span<std::byte, kHelloSize> out);
// kCorrupt unless 1 <= stream_count <= kMaxStreamsPerLink and stream_index < count.
Result<Hello> DecodeHello(std::span<const std::byte, kHelloSize> in);

}  // namespace deltacast::transport
