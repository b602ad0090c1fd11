// The active-message header of the UCX backend. Every deltacast message and every
// link-control signal is one UCX active message (id kAmId) whose header is an
// AmHeader; data messages carry the payload as the AM body.
//
//   kHello     client -> server after ucp_ep_create; value = client's max_message_bytes
//   kHelloAck  server -> client; the link is open on both sides
//   kData      value = per-link sequence number, length = payload bytes
//   kGoodbye   orderly close; value = data messages the sender completed (on_sent OK)
//   kAbort     broken close; value as for kGoodbye (the peer delivers those, then
//              reports kUnavailable)
//   kCloseAck  answer to kGoodbye/kAbort once everything announced has arrived: the
//              closer may now tear its endpoint down without losing anything
//
// Fields are host byte order: both ends of a UCX link run the same build (the
// backend does not interoperate across architectures).
//
// Thread safety: plain functions and data.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>

namespace deltacast::transport::ucx {

inline constexpr unsigned kAmId = 17;
inline constexpr uint32_t kAmMagic = 0x44435558;  // "DCUX"

enum class AmType : uint8_t {
  kHello = 1,
  kHelloAck = 2,
  kData = 3,
  kGoodbye = 4,
  kAbort = 5,
  kCloseAck = 6,
};

struct AmHeader {
  uint32_t magic = kAmMagic;
  AmType type = AmType::kData;
  uint8_t reserved[3] = {};
  uint64_t value = 0;
  uint64_t length = 0;
};
static_assert(sizeof(AmHeader) == 24);

inline std::optional<AmHeader> DecodeAmHeader(const void* data, size_t size) {
  if (size != sizeof(AmHeader)) return std::nullopt;
  AmHeader header;
  std::memcpy(&header, data, sizeof header);
  if (header.magic != kAmMagic) return std::nullopt;
  if (header.type < AmType::kHello || header.type > AmType::kCloseAck) return std::nullopt;
  return header;
}

}  // namespace deltacast::transport::ucx
