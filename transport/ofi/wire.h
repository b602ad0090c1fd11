// The control messages of the ofi backend (docs/transport.md, "ofi"): a fixed
// 32-byte little-endian header, then a payload only for CONNECT (the sender's
// endpoint name) and kData (a small message's bytes). A larger message's bytes go
// as one tagged send once the receiver granted it (CTS).
//
// Thread safety: free functions and plain structs, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace deltacast::transport::ofi {

inline constexpr uint32_t kWireMagic = 0x464f4344;  // "DCOF" in memory order
inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kHeaderBytes = 32;
// Messages up to this size travel inside a kData control message (one hop
// instead of RTS, CTS and a tagged send).
inline constexpr size_t kInlineBytes = 4096;
// Control receive buffers hold a header plus an inline message or the longest
// endpoint name we accept (shorter).
inline constexpr size_t kMaxNameBytes = 480;
inline constexpr size_t kControlBufferBytes = kHeaderBytes + kInlineBytes;

enum class ControlType : uint8_t {
  kConnect = 1,    // src_id = connector's link id; payload = connector's endpoint name
  kAccept = 2,     // dst_id = connector's link id, src_id = listener's link id
  kRts = 3,        // "message `seq` of `value` bytes is ready" (request to send)
  kCts = 4,        // "post your tagged send for `seq`": a receive of that size is posted
  kGoodbye = 5,    // orderly close; `value` = messages whose on_sent ran OK
  kAbort = 6,      // broken link; `value` as for kGoodbye
  kKeepalive = 7,  // liveness only
  kData = 8,       // message `seq` of `value` <= kInlineBytes bytes, which follow;
                   // the receiver answers kCts once it took it (frees the window)
};

struct ControlHeader {
  ControlType type = ControlType::kKeepalive;
  uint32_t dst_id = 0;  // the receiver's link id (0 for kConnect)
  uint32_t src_id = 0;  // the sender's link id
  uint64_t seq = 0;     // message sequence number (kRts, kCts)
  uint64_t value = 0;   // size (kRts) or count (kGoodbye, kAbort)
};

std::vector<std::byte> EncodeControl(const ControlHeader& header,
                                     std::span<const std::byte> payload = {});

// nullopt when the bytes are not a control message of this version.
std::optional<ControlHeader> DecodeControl(std::span<const std::byte> bytes);

// The tag of message `seq` sent to link `dst_id`: every link and message has its own.
inline uint64_t DataTag(uint32_t dst_id, uint64_t seq) {
  return (uint64_t{dst_id} << 32) | (seq & 0xffffffffu);
}

}  // namespace deltacast::transport::ofi
