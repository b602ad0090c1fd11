#include "transport/ofi/wire.h"

#include <cstring>

namespace deltacast::transport::ofi {
namespace {

template <typename T>
void Put(std::byte* at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) at[i] = std::byte((value >> (8 * i)) & 0xff);
}

template <typename T>
T Get(const std::byte* at) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= T(std::to_integer<uint8_t>(at[i])) << (8 * i);
  return value;
}

}  // namespace

// Layout: magic u32 @0, version u8 @4, type u8 @5, reserved u16 @6 (zero),
// dst_id u32 @8, src_id u32 @12, seq u64 @16, value u64 @24.
std::vector<std::byte> EncodeControl(const ControlHeader& header,
                                     std::span<const std::byte> payload) {
  std::vector<std::byte> bytes(kHeaderBytes + payload.size());
  Put<uint32_t>(&bytes[0], kWireMagic);
  Put<uint8_t>(&bytes[4], kWireVersion);
  Put<uint8_t>(&bytes[5], static_cast<uint8_t>(header.type));
  Put<uint16_t>(&bytes[6], 0);
  Put<uint32_t>(&bytes[8], header.dst_id);
  Put<uint32_t>(&bytes[12], header.src_id);
  Put<uint64_t>(&bytes[16], header.seq);
  Put<uint64_t>(&bytes[24], header.value);
  if (!payload.empty()) std::memcpy(&bytes[kHeaderBytes], payload.data(), payload.size());
  return bytes;
}

std::optional<ControlHeader> DecodeControl(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderBytes) return std::nullopt;
  if (Get<uint32_t>(&bytes[0]) != kWireMagic || Get<uint8_t>(&bytes[4]) != kWireVersion ||
      Get<uint16_t>(&bytes[6]) != 0) {
    return std::nullopt;
  }
  const uint8_t type = Get<uint8_t>(&bytes[5]);
  if (type < 1 || type > 8) return std::nullopt;
  ControlHeader header;
  header.type = static_cast<ControlType>(type);
  header.dst_id = Get<uint32_t>(&bytes[8]);
  header.src_id = Get<uint32_t>(&bytes[12]);
  header.seq = Get<uint64_t>(&bytes[16]);
  header.value = Get<uint64_t>(&bytes[24]);
  return header;
}

}  // namespace deltacast::transport::ofi
