// config.json as the engine-plan generator reads it (docs/engines.md): the model's
// dimensions (layout::ParseHfConfig) and, for FP8 serving weights, the block size
// of its quantization_config, so that every GPU's plan places each linear's
// `weight_scale_inv` grid beside its weight.
//
// Thread safety: pure functions.
#pragma once

#include <filesystem>
#include <string_view>

#include "common/status.h"
#include "layout/engine.h"

namespace deltacast::quant {

// kInvalidArgument naming the key for a quantization_config whose plans are not
// generated: another quant_method, no square weight_block_size (per-tensor or
// per-channel FP8), a format other than e4m3, or a decoder linear listed in
// modules_to_not_convert (per-layer exceptions: write those layouts by hand).
Result<layout::HfConfig> ParseEngineConfig(std::string_view json, std::string_view source);
Result<layout::HfConfig> LoadEngineConfig(const std::filesystem::path& path);

}  // namespace deltacast::quant
