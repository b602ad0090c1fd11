#include "quant/fp8_scheme.h"

namespace deltacast::quant {
namespace {

// One row per scheme (fp8_scheme.h says what a new one needs).
constexpr Fp8Scheme kFp8Schemes[] = {
    // DeepSeek-V3 / Qwen3-FP8 block FP8 with FP32 scales, as DeepGEMM's current
    // per_block_cast_to_fp8(x, use_ue8m0=False) makes it.
    {.name = "fp8_e4m3_block128",
     .block_rows = 128,
     .block_cols = 128,
     .scale_format = ScaleFormat::kF32,
     .multiplier = Multiplier::kReciprocalOfScale,
     .scale_fmt = "",
     .reference = "DeepGEMM deep_gemm/utils/math.py per_block_cast_to_fp8, use_ue8m0=False"},
    // The same with power-of-two scales (DeepSeek-V3.1's "scale_fmt": "ue8m0"),
    // stored as FP32 values.
    {.name = "fp8_e4m3_block128_ue8m0",
     .block_rows = 128,
     .block_cols = 128,
     .scale_format = ScaleFormat::kUe8m0,
     .multiplier = Multiplier::kReciprocalOfScale,
     .scale_fmt = "ue8m0",
     .reference = "DeepGEMM deep_gemm/utils/math.py per_block_cast_to_fp8, use_ue8m0=True"},
    // The older spelling x * (448 / amax), still in SGLang's and DeepGEMM's earlier
    // test utilities: same scales, the multiplier rounds differently.
    {.name = "fp8_e4m3_block128_amax448",
     .block_rows = 128,
     .block_cols = 128,
     .scale_format = ScaleFormat::kF32,
     .multiplier = Multiplier::kMaxOverAmax,
     .scale_fmt = "",
     .reference = "DeepGEMM v1 / SGLang test per_block_cast_to_fp8: x * (448.0 / x_amax)"},
};

}  // namespace

std::vector<uint64_t> Fp8Scheme::ScaleShape(uint64_t rows, uint64_t cols) const {
  const uint64_t br = BlockRows(rows), bc = BlockCols(cols);
  return {br == 0 ? 0 : (rows + br - 1) / br, bc == 0 ? 0 : (cols + bc - 1) / bc};
}

std::span<const Fp8Scheme> Fp8Schemes() { return kFp8Schemes; }

const Fp8Scheme* FindFp8Scheme(std::string_view name) {
  for (const Fp8Scheme& s : kFp8Schemes) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string Fp8SchemeNames() {
  std::string out;
  for (const Fp8Scheme& s : kFp8Schemes) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}

}  // namespace deltacast::quant
