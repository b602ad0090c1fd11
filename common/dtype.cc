#include "common/dtype.h"

#include <array>
#include <utility>

namespace deltacast {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 19> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
    {DType::kF64, "F64", 8},
    {DType::kF8E8M0, "F8_E8M0", 1},
    {DType::kF8E4M3Fnuz, "F8_E4M3FNUZ", 1},
    {DType::kF8E5M2Fnuz, "F8_E5M2FNUZ", 1},
    {DType::kC64, "C64", 8},
}};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype) - 1]; }

}  // namespace

size_t ElementSize(DType dtype) { return Info(dtype).size; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromWire(uint8_t value) {
  if (value < 1 || value > kDTypes.size()) return std::nullopt;
  return static_cast<DType>(value);
}

}  // namespace deltacast
