// A build without CUDA (nvcc was not found): no device memories.
#include "apply/device/piece_memory.h"

namespace deltacast::apply::device {

int CudaDeviceCount() { return 0; }

Result<std::unique_ptr<PieceMemory>> NewCudaPieceMemory(int device) {
  return Status::Unavailable("cuda:" + std::to_string(device) +
                             ": this build of deltacast has no CUDA support (nvcc was not found)");
}

Result<CudaDeviceFacts> MeasureCudaDevice(int device, uint64_t) {
  return Status::Unavailable("cuda:" + std::to_string(device) + ": built without CUDA");
}

}  // namespace deltacast::apply::device
