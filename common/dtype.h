// Helpers over the element types of deltacast/dtype.h: widths, names, wire values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "deltacast/dtype.h"

namespace deltacast {

// Bytes per element: 1, 2, 4 or 8.
size_t ElementSize(DType dtype);
// "BF16", "F8_E4M3", ... as in a safetensors header.
std::string_view DTypeName(DType dtype);
// Parses a safetensors dtype name; nullopt for names outside the whitelist.
std::optional<DType> ParseDType(std::string_view name);
// Parses the numeric wire value; nullopt if it names no dtype.
std::optional<DType> DTypeFromWire(uint8_t value);

}  // namespace deltacast
