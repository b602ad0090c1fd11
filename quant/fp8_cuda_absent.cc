// Builds without nvcc: there is no CUDA quantizer.
#include "quant/fp8_cuda.h"

namespace deltacast::quant {

bool Fp8CudaAvailable() { return false; }

Status QuantizeFp8Cuda(const Fp8Scheme&, std::string_view, std::span<const uint16_t>, uint64_t,
                       uint64_t, std::span<uint8_t>, std::span<float>) {
  return Status::Unavailable("this build has no CUDA (nvcc was not found)");
}

}  // namespace deltacast::quant
