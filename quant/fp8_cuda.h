// The block quantizer on a CUDA GPU: one thread block per scale block, running
// fp8_element.h's functions, so it writes the CPU quantizer's bytes (the gpu-labelled
// test compares them). Built where nvcc is found; elsewhere every call returns
// kUnavailable.
//
// Thread safety: thread-safe; each call uses its own device buffers and the default
// stream of the current device, and blocks until the results are on the host.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "common/status.h"
#include "quant/fp8_scheme.h"

namespace deltacast::quant {

// Whether a CUDA device can run the kernel here.
bool Fp8CudaAvailable();

// QuantizeFp8 (fp8_quantizer.h) on the current CUDA device, from and to host
// buffers: copies `bf16` in, runs the kernel, copies `weight` and `scale_inv` back.
// Same errors as QuantizeFp8 (non-finite inputs found on the device are located on
// the host for the message); kUnavailable without CUDA or a device.
Status QuantizeFp8Cuda(const Fp8Scheme& scheme, std::string_view name,
                       std::span<const uint16_t> bf16, uint64_t rows, uint64_t cols,
                       std::span<uint8_t> weight, std::span<float> scale_inv);

}  // namespace deltacast::quant
