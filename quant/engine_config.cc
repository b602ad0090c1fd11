#include "quant/engine_config.h"

#include <array>
#include <string>

#include "common/file_util.h"
#include "quant/serving.h"

namespace deltacast::quant {
namespace {

constexpr uint64_t kMaxConfigBytes = uint64_t{4} << 20;

// The decoder linears the generated plans quantize (docs/engines.md), by the last
// part of their module name; anything else in modules_to_not_convert (the
// embeddings, the LM head, routers) stays BF16 in those plans anyway.
constexpr std::array<std::string_view, 7> kQuantizedLinears = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

bool IsQuantizedLinear(std::string_view module) {
  const size_t dot = module.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? module : module.substr(dot + 1);
  for (std::string_view linear : kQuantizedLinears) {
    if (last == linear) return true;
  }
  return false;
}

}  // namespace

Result<layout::HfConfig> ParseEngineConfig(std::string_view json, std::string_view source) {
  ASSIGN_OR_RETURN(layout::HfConfig config, layout::ParseHfConfig(json, source));
  auto q = ParseQuantizationConfig(json, source);
  if (!q.ok() && q.status().code() == StatusCode::kNotFound) return config;  // BF16 weights
  if (!q.ok()) return q.status();
  const std::string src(source);
  auto refuse = [&](const std::string& what) {
    return Status::InvalidArgument(src + ": quantization_config" + what +
                                   "; engine plans are generated for block-scaled FP8 e4m3 "
                                   "only (write other layouts by hand, docs/layout.md)");
  };
  if (q->quant_method != "fp8") {
    return refuse(".quant_method \"" + q->quant_method + "\" is not \"fp8\"");
  }
  if (!q->fmt.empty() && q->fmt != "e4m3") return refuse(".fmt \"" + q->fmt + "\" is not \"e4m3\"");
  if (q->weight_block_size.size() != 2 || q->weight_block_size[0] == 0 ||
      q->weight_block_size[0] != q->weight_block_size[1]) {
    return refuse(
        ".weight_block_size is missing or not square (per-tensor and per-channel FP8 have no "
        "scale grid)");
  }
  for (const std::string& module : q->modules_to_not_convert) {
    if (IsQuantizedLinear(module)) {
      return refuse(".modules_to_not_convert names \"" + module +
                    "\", a decoder linear: plans with per-layer exceptions are not generated");
    }
  }
  config.fp8_block = q->weight_block_size[0];
  return config;
}

Result<layout::HfConfig> LoadEngineConfig(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, kMaxConfigBytes));
  return ParseEngineConfig(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string());
}

}  // namespace deltacast::quant
