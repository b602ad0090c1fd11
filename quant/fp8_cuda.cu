// The CUDA block quantizer (fp8_cuda.h). Compiled with --fmad=false: a fused
// multiply-add anywhere near the element arithmetic would round differently from
// the host (CMakeLists sets it).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "quant/fp8_cuda.h"
#include "quant/fp8_element.h"
#include "quant/fp8_quantizer.h"

namespace deltacast::quant {
namespace {

constexpr int kThreads = 256;

#define DC_FP8_CUDA(call)                                                 \
  do {                                                                    \
    const cudaError_t _err = (call);                                      \
    if (_err != cudaSuccess) {                                            \
      return Status::Internal(std::string("fp8 quantizer: " #call ": ") + \
                              cudaGetErrorString(_err));                  \
    }                                                                     \
  } while (false)

struct KernelArgs {
  const uint16_t* in;
  uint8_t* out;
  float* scale_inv;
  uint32_t* non_finite;  // set when a block's amax is Inf or NaN
  uint64_t rows, cols, br, bc;
  ScaleFormat format;
  Multiplier multiplier;
};

// Block (blockIdx.y, blockIdx.x) of the scale grid.
__global__ void QuantizeBlocks(KernelArgs a) {
  const uint64_t r0 = uint64_t{blockIdx.y} * a.br, c0 = uint64_t{blockIdx.x} * a.bc;
  const uint64_t nr = min(a.br, a.rows - r0), nc = min(a.bc, a.cols - c0);
  const uint64_t n = nr * nc;
  __shared__ uint32_t amax;
  __shared__ float multiplier;
  if (threadIdx.x == 0) amax = 0;
  __syncthreads();
  uint32_t m = 0;
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint16_t b = a.in[(r0 + i / nc) * a.cols + c0 + i % nc];
    m = max(m, uint32_t{Bf16AbsBits(b)});
  }
  atomicMax(&amax, m);
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint16_t block_amax = static_cast<uint16_t>(amax);
    if (block_amax >= kBf16NonFinite) {
      *a.non_finite = 1;
      multiplier = 0;
    } else {
      const BlockScale s = ScaleOfBlock(block_amax, a.format, a.multiplier);
      a.scale_inv[uint64_t{blockIdx.y} * gridDim.x + blockIdx.x] = s.scale_inv;
      multiplier = s.multiplier;
    }
  }
  __syncthreads();
  const float mult = multiplier;
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t at = (r0 + i / nc) * a.cols + c0 + i % nc;
    a.out[at] = QuantizeElement(a.in[at], mult);
  }
}

// Device buffers freed on every path.
struct DeviceBuffers {
  void* in = nullptr;
  void* out = nullptr;
  void* scale = nullptr;
  void* flag = nullptr;
  ~DeviceBuffers() {
    cudaFree(in);
    cudaFree(out);
    cudaFree(scale);
    cudaFree(flag);
  }
};

}  // namespace

bool Fp8CudaAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

Status QuantizeFp8Cuda(const Fp8Scheme& scheme, std::string_view name,
                       std::span<const uint16_t> bf16, uint64_t rows, uint64_t cols,
                       std::span<uint8_t> weight, std::span<float> scale_inv) {
  if (!Fp8CudaAvailable()) return Status::Unavailable("no CUDA device");
  const std::string who = "tensor '" + std::string(name) + "'";
  if (scheme.element != DType::kF8E4M3 || scheme.scale_dtype != DType::kF32) {
    return Status::Unsupported(who + ": scheme " + std::string(scheme.name) +
                               " stores elements or scales this quantizer does not write");
  }
  const std::vector<uint64_t> grid = scheme.ScaleShape(rows, cols);
  if (bf16.size() != rows * cols || weight.size() != rows * cols ||
      scale_inv.size() != grid[0] * grid[1]) {
    return Status::InvalidArgument(who + ": buffer sizes do not match its shape");
  }
  if (rows == 0 || cols == 0) return Status::Ok();
  if (grid[0] > 65535 || grid[1] > 0x7FFFFFFFu) {
    return Status::Unsupported(who + ": too many block rows for one launch");
  }
  DeviceBuffers d;
  DC_FP8_CUDA(cudaMalloc(&d.in, bf16.size_bytes()));
  DC_FP8_CUDA(cudaMalloc(&d.out, weight.size_bytes()));
  DC_FP8_CUDA(cudaMalloc(&d.scale, scale_inv.size_bytes()));
  DC_FP8_CUDA(cudaMalloc(&d.flag, sizeof(uint32_t)));
  DC_FP8_CUDA(cudaMemcpy(d.in, bf16.data(), bf16.size_bytes(), cudaMemcpyHostToDevice));
  DC_FP8_CUDA(cudaMemset(d.flag, 0, sizeof(uint32_t)));
  KernelArgs args{static_cast<const uint16_t*>(d.in),
                  static_cast<uint8_t*>(d.out),
                  static_cast<float*>(d.scale),
                  static_cast<uint32_t*>(d.flag),
                  rows,
                  cols,
                  scheme.BlockRows(rows),
                  scheme.BlockCols(cols),
                  scheme.scale_format,
                  scheme.multiplier};
  QuantizeBlocks<<<dim3(static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[0])),
                   kThreads>>>(args);
  DC_FP8_CUDA(cudaGetLastError());
  DC_FP8_CUDA(cudaDeviceSynchronize());
  uint32_t non_finite = 0;
  DC_FP8_CUDA(cudaMemcpy(&non_finite, d.flag, sizeof non_finite, cudaMemcpyDeviceToHost));
  if (non_finite != 0) {
    RETURN_IF_ERROR(CheckFinite(name, bf16, rows, cols));
    return Status::Internal(who + ": the device saw a non-finite element the host does not");
  }
  DC_FP8_CUDA(cudaMemcpy(weight.data(), d.out, weight.size_bytes(), cudaMemcpyDeviceToHost));
  DC_FP8_CUDA(
      cudaMemcpy(scale_inv.data(), d.scale, scale_inv.size_bytes(), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

}  // namespace deltacast::quant
