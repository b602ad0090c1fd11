// Element types of tensors, named as safetensors names them. deltacast never
// reinterprets element bits: the dtype sets the element width (partitions and XOR
// words are element-aligned) and, in context mode, which bit fields of a float act
// as context.
//
// Thread safety: a value type.
#pragma once

#include <cstdint>

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

}  // namespace deltacast
