// FP8 serving schemes: how a BF16 tensor is served quantized. A scheme is one row
// of kFp8Schemes: its block shape, element format, scale format and storage, and
// the quantizer rule that makes the scale and the multiplier (fp8_element.h).
//
// Adding a scheme is adding a row, not plumbing: the CPU quantizer and the CUDA
// kernel walk any block shape, the serving description names schemes by `name`,
// and the checkpoint writer and checker take shapes and dtypes from the row. For
// example per-channel FP8 would be {block_rows 1, block_cols kWholeRow, F32
// scales}, and MXFP8 {block_rows 1, block_cols 32, kUe8m0, scale dtype F8_E8M0}
// (each needs its quantization_config fields checked against the engines first).
//
// Thread safety: constant data and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "quant/fp8_element.h"

namespace deltacast::quant {

// A block dimension that spans the whole tensor dimension (per-channel scales).
inline constexpr uint32_t kWholeDim = 0;

struct Fp8Scheme {
  std::string_view name;    // what a serving description says
  uint32_t block_rows = 0;  // a block is block_rows x block_cols elements of a 2-D
  uint32_t block_cols = 0;  // [rows, cols] tensor; edge blocks are cut short
  DType element = DType::kF8E4M3;
  ScaleFormat scale_format = ScaleFormat::kF32;
  DType scale_dtype = DType::kF32;  // how weight_scale_inv is stored
  Multiplier multiplier = Multiplier::kReciprocalOfScale;
  std::string_view scale_fmt;  // quantization_config "scale_fmt" ("" = not written)
  std::string_view reference;  // the source whose bytes it reproduces (docs/fp8.md)

  // Block rows / cols of a [rows, cols] tensor (kWholeDim: the whole dimension).
  uint64_t BlockRows(uint64_t rows) const { return block_rows == kWholeDim ? rows : block_rows; }
  uint64_t BlockCols(uint64_t cols) const { return block_cols == kWholeDim ? cols : block_cols; }
  // The scale tensor's shape: [ceil(rows / block rows), ceil(cols / block cols)].
  std::vector<uint64_t> ScaleShape(uint64_t rows, uint64_t cols) const;
};

// Every scheme deltacast can serve. The first is the default.
std::span<const Fp8Scheme> Fp8Schemes();
// nullptr when no scheme has that name.
const Fp8Scheme* FindFp8Scheme(std::string_view name);
// "a, b, c": the names, for messages.
std::string Fp8SchemeNames();

}  // namespace deltacast::quant
