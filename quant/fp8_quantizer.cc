#include "quant/fp8_quantizer.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "quant/internal/fp8_band.h"
#include "quant/internal/fp8_band_dispatch.h"

namespace deltacast::quant {
namespace {

std::atomic<bool> force_baseline{false};

bool UseAvx2() {
#if defined(__x86_64__)
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  return has_avx2 && !force_baseline.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

std::string Hex16(uint16_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%04x", v);
  return buf;
}

}  // namespace

std::string_view Fp8CpuPath() { return UseAvx2() ? "avx2" : "baseline"; }
void ForceFp8BaselinePath(bool force) { force_baseline.store(force); }

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
  const bool avx2 = UseAvx2();
  for (uint64_t b = 0, r0 = 0; r0 < rows; ++b, r0 += br) {
    const uint64_t band_rows = std::min(br, rows - r0);
    const uint16_t* in = bf16.data() + r0 * cols;
    std::fill(amax.begin(), amax.end(), int16_t{0});
    if (avx2) {
      internal::BandAmaxAvx2(in, band_rows, cols, bc, amax.data());
    } else {
      internal::BandAmaxLoop(in, band_rows, cols, bc, amax.data());
    }
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
    if (avx2) {
      internal::QuantizeBandAvx2(in, band_rows, cols, bc, multipliers.data(), out);
    } else {
      internal::QuantizeBandLoop(in, band_rows, cols, bc, multipliers.data(), out);
    }
  }
  return Status::Ok();
}

uint16_t Fp8PieceAmax(std::span<const uint16_t> bf16, uint16_t amax) {
  const auto start = static_cast<int16_t>(amax & 0x7FFF);
  const int16_t m = UseAvx2() ? internal::SegmentAmaxAvx2(bf16.data(), bf16.size(), start)
                              : internal::SegmentAmaxLoop(bf16.data(), bf16.size(), start);
  return static_cast<uint16_t>(m);
}

void QuantizeFp8Piece(std::span<const uint16_t> bf16, float multiplier, std::span<uint8_t> out) {
  if (UseAvx2()) {
    internal::QuantizeSegmentAvx2(bf16.data(), bf16.size(), multiplier, out.data());
  } else {
    internal::QuantizeSegmentLoop(bf16.data(), bf16.size(), multiplier, out.data());
  }
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
