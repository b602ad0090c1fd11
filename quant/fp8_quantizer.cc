#include "quant/fp8_quantizer.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>

#include "quant/internal/fp8_band.h"
#include "quant/internal/fp8_band_dispatch.h"

namespace deltacast::quant {
namespace {

std::atomic<Fp8CpuLoops> limit{Fp8CpuLoops::kAvx512};

// The best loops this CPU runs.
Fp8CpuLoops Supported() {
#if defined(__x86_64__)
  static const Fp8CpuLoops best = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      return Fp8CpuLoops::kAvx512;
    }
    return __builtin_cpu_supports("avx2") ? Fp8CpuLoops::kAvx2 : Fp8CpuLoops::kBaseline;
  }();
  return best;
#else
  return Fp8CpuLoops::kBaseline;
#endif
}

// One build of fp8_band.h's loops.
struct Loops {
  void (*band_amax)(const uint16_t*, uint64_t, uint64_t, uint64_t, int16_t*);
  void (*quantize_band)(const uint16_t*, uint64_t, uint64_t, uint64_t, const float*, uint8_t*);
  int16_t (*segment_amax)(const uint16_t*, uint64_t, int16_t);
  void (*quantize_segment)(const uint16_t*, uint64_t, float, uint8_t*);
};

constexpr Loops kBaselineLoops{internal::BandAmaxLoop, internal::QuantizeBandLoop,
                               internal::SegmentAmaxLoop, internal::QuantizeSegmentLoop};
constexpr Loops kAvx2Loops{internal::BandAmaxAvx2, internal::QuantizeBandAvx2,
                           internal::SegmentAmaxAvx2, internal::QuantizeSegmentAvx2};
constexpr Loops kAvx512Loops{internal::BandAmaxAvx512, internal::QuantizeBandAvx512,
                             internal::SegmentAmaxAvx512, internal::QuantizeSegmentAvx512};

Fp8CpuLoops Chosen() { return std::min(Supported(), limit.load(std::memory_order_relaxed)); }

const Loops& ChosenLoops() {
  switch (Chosen()) {
    case Fp8CpuLoops::kAvx512:
      return kAvx512Loops;
    case Fp8CpuLoops::kAvx2:
      return kAvx2Loops;
    case Fp8CpuLoops::kBaseline:
      break;
  }
  return kBaselineLoops;
}

std::string Hex16(uint16_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%04x", v);
  return buf;
}

}  // namespace

std::string_view Fp8CpuPath() {
  switch (Chosen()) {
    case Fp8CpuLoops::kAvx512:
      return "avx512";
    case Fp8CpuLoops::kAvx2:
      return "avx2";
    case Fp8CpuLoops::kBaseline:
      break;
  }
  return "baseline";
}
void LimitFp8CpuPath(Fp8CpuLoops most) { limit.store(most); }
void ForceFp8BaselinePath(bool force) {
  LimitFp8CpuPath(force ? Fp8CpuLoops::kBaseline : Fp8CpuLoops::kAvx512);
}

Status CheckFinite(std::string_view name, std::span<const uint16_t> bf16, uint64_t rows,
                   uint64_t cols) {
  for (uint64_t i = 0; i < rows * cols && i < bf16.size(); ++i) {
    const uint16_t b = bf16[i];
    if (Bf16AbsBits(b) < kBf16NonFinite) continue;
    const bool nan = Bf16AbsBits(b) > kBf16NonFinite;
    return Status::InvalidArgument(
        "tensor '" + std::string(name) + "' element [" + std::to_string(i / cols) + ", " +
        std::to_string(i % cols) + "] is " + (nan ? "NaN" : (b & 0x8000 ? "-Inf" : "Inf")) +
        " (BF16 " + Hex16(b) +
        "): FP8 serving weights are not made from non-finite values (docs/fp8.md)");
  }
  return Status::Ok();
}

Status QuantizeFp8(const Fp8Scheme& scheme, std::string_view name, std::span<const uint16_t> bf16,
                   uint64_t rows, uint64_t cols, std::span<uint8_t> weight,
                   std::span<float> scale_inv) {
  const std::string who = "tensor '" + std::string(name) + "'";
  if (scheme.element != DType::kF8E4M3 || scheme.scale_dtype != DType::kF32) {
    return Status::Unsupported(who + ": scheme " + std::string(scheme.name) +
                               " stores elements or scales this quantizer does not write");
  }
  const std::vector<uint64_t> scale_shape = scheme.ScaleShape(rows, cols);
  if (bf16.size() != rows * cols || weight.size() != rows * cols ||
      scale_inv.size() != scale_shape[0] * scale_shape[1]) {
    return Status::InvalidArgument(who + ": buffer sizes do not match its shape [" +
                                   std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  if (rows == 0 || cols == 0) return Status::Ok();
  const uint64_t br = scheme.BlockRows(rows), bc = scheme.BlockCols(cols);
  const uint64_t block_cols = scale_shape[1];
  std::vector<int16_t> amax(block_cols);
  std::vector<float> multipliers(block_cols);
  const Loops& loops = ChosenLoops();
  for (uint64_t b = 0, r0 = 0; r0 < rows; ++b, r0 += br) {
    const uint64_t band_rows = std::min(br, rows - r0);
    const uint16_t* in = bf16.data() + r0 * cols;
    std::fill(amax.begin(), amax.end(), int16_t{0});
    loops.band_amax(in, band_rows, cols, bc, amax.data());
    for (uint64_t j = 0; j < block_cols; ++j) {
      if (static_cast<uint16_t>(amax[j]) >= kBf16NonFinite) {
        // Rows are counted from the band's start; name the tensor's row.
        RETURN_IF_ERROR(
            CheckFinite(name, bf16.subspan(0, (r0 + band_rows) * cols), r0 + band_rows, cols));
        return Status::Internal(who + ": a non-finite amax with no non-finite element");
      }
      const BlockScale s =
          ScaleOfBlock(static_cast<uint16_t>(amax[j]), scheme.scale_format, scheme.multiplier);
      scale_inv[b * block_cols + j] = s.scale_inv;
      multipliers[j] = s.multiplier;
    }
    uint8_t* out = weight.data() + r0 * cols;
    loops.quantize_band(in, band_rows, cols, bc, multipliers.data(), out);
  }
  return Status::Ok();
}

uint16_t Fp8PieceAmax(std::span<const uint16_t> bf16, uint16_t amax) {
  const auto start = static_cast<int16_t>(amax & 0x7FFF);
  const int16_t m = ChosenLoops().segment_amax(bf16.data(), bf16.size(), start);
  return static_cast<uint16_t>(m);
}

void QuantizeFp8Piece(std::span<const uint16_t> bf16, float multiplier, std::span<uint8_t> out) {
  ChosenLoops().quantize_segment(bf16.data(), bf16.size(), multiplier, out.data());
}

Result<Fp8Tensor> QuantizeFp8(const Fp8Scheme& scheme, std::string_view name,
                              std::span<const uint16_t> bf16, uint64_t rows, uint64_t cols) {
  Fp8Tensor t;
  const std::vector<uint64_t> shape = scheme.ScaleShape(rows, cols);
  t.scale_rows = shape[0];
  t.scale_cols = shape[1];
  t.weight.resize(rows * cols);
  t.scale_inv.resize(shape[0] * shape[1]);
  RETURN_IF_ERROR(QuantizeFp8(scheme, name, bf16, rows, cols, t.weight, t.scale_inv));
  return t;
}

}  // namespace deltacast::quant
