// Element types of checkpoint tensors, named as safetensors names them.
//
// deltacast never reinterprets element bits: the dtype only sets the element width
// (so partitions and XOR words are element-aligned) and, in context mode, which bit
// fields of a float act as context.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace deltacast {

enum class DType : uint8_t {
  kBool = 1,
  kU8 = 2,
  kI8 = 3,
  kF8E4M3 = 4,
  kF8E5M2 = 5,
  kI16 = 6,
  kU16 = 7,
  kF16 = 8,
  kBF16 = 9,
  kI32 = 10,
  kU32 = 11,
  kF32 = 12,
  kI64 = 13,
  kU64 = 14,
  kF64 = 15,
  // Newer safetensors dtypes (the reference accepts them): 1, 1, 1 and 8 bytes.
  kF8E8M0 = 16,
  kF8E4M3Fnuz = 17,
  kF8E5M2Fnuz = 18,
  kC64 = 19,
};

// Bytes per element: 1, 2, 4 or 8.
size_t ElementSize(DType dtype);
// "BF16", "F8_E4M3", ... as in a safetensors header.
std::string_view DTypeName(DType dtype);
// Parses a safetensors dtype name; nullopt for names outside the whitelist.
std::optional<DType> ParseDType(std::string_view name);
// Parses the numeric wire value; nullopt if it names no dtype.
std::optional<DType> DTypeFromWire(uint8_t value);

}  // namespace deltacast
