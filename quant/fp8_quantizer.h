// The CPU block quantizer: a row-major [rows, cols] BF16 tensor to E4M3 bytes and
// one FP32 scale per block, bit for bit as the scheme's reference makes them
// (docs/fp8.md). The element arithmetic is fp8_element.h's, shared with the CUDA
// kernel (fp8_cuda.h); the loops are vectorised (AVX2 where the CPU has it).
//
// Inf and NaN inputs are refused: the reference would write a NaN scale (or, for
// Inf, zeros and NaNs) that no engine can serve, so such a step is an error to
// report, not a checkpoint to ship.
//
// Thread safety: thread-safe; one call runs on the calling thread (callers split
// work over tensors).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "quant/fp8_scheme.h"

namespace deltacast::quant {

struct Fp8Tensor {
  std::vector<uint8_t> weight;   // rows * cols E4M3 codes, row-major
  std::vector<float> scale_inv;  // scale_rows * scale_cols, row-major
  uint64_t scale_rows = 0, scale_cols = 0;
};

// Quantizes into caller buffers: `weight` of rows * cols bytes, `scale_inv` of
// scheme.ScaleShape(rows, cols) elements. kInvalidArgument naming `name` for a size
// that does not match or an Inf / NaN element (its row and column); kUnsupported
// for a scheme whose element or scale storage this quantizer does not write. On
// error the buffers' contents are unspecified.
Status QuantizeFp8(const Fp8Scheme& scheme, std::string_view name, std::span<const uint16_t> bf16,
                   uint64_t rows, uint64_t cols, std::span<uint8_t> weight,
                   std::span<float> scale_inv);
Result<Fp8Tensor> QuantizeFp8(const Fp8Scheme& scheme, std::string_view name,
                              std::span<const uint16_t> bf16, uint64_t rows, uint64_t cols);

// Pieces of blocks, for a producer that holds only some rows or columns of a block
// (relay/producers/fp8_share.h): the block's amax is the max over its pieces' Fp8PieceAmax
// (as BF16 |x| bits; kBf16NonFinite or more: an Inf or NaN is there), its scale
// ScaleOfBlock of that, and each piece is quantized on its own with the block's
// multiplier. The bytes equal QuantizeFp8's for the whole tensor.
// max(amax, max |x| bits over `bf16`).
uint16_t Fp8PieceAmax(std::span<const uint16_t> bf16, uint16_t amax);
// out[i] = E4M3(bf16[i] * multiplier); out.size() >= bf16.size().
void QuantizeFp8Piece(std::span<const uint16_t> bf16, float multiplier, std::span<uint8_t> out);

// The builds of the CPU loops (one source, fp8_band.h), in order.
enum class Fp8CpuLoops : uint8_t { kBaseline, kAvx2, kAvx512 };
// The loops the CPU path runs on this machine: "avx512", "avx2" or "baseline".
std::string_view Fp8CpuPath();
// For tests and the benchmark: run the best loops this CPU has up to `most`
// (process-wide; kAvx512 is the default).
void LimitFp8CpuPath(Fp8CpuLoops most);
// LimitFp8CpuPath(kBaseline) if `force`, else back to the default.
void ForceFp8BaselinePath(bool force);

// The first Inf or NaN element of a row-major [rows, cols] BF16 tensor, as a
// message naming `name` and its position; Ok if there is none.
Status CheckFinite(std::string_view name, std::span<const uint16_t> bf16, uint64_t rows,
                   uint64_t cols);

}  // namespace deltacast::quant
