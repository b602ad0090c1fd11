// The CUDA PieceMemory: a GPU's parameters patched and hashed by kernels that run
// the element code of segments.h, one launch per chunk over its segment table.
//
// Staging: a batch (segment table and payloads) is packed into a slot of a pinned
// host ring and copied on a copy stream; the kernels run on an apply stream that
// waits for the copy's event, so the next batch's copy overlaps this one's kernels.
// Positions are checked by a kernel before the apply kernel runs; a violation raises
// a flag, the apply kernel then writes nothing, and Sync reports it.
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstring>
#include <cub/device/device_select.cuh>
#include <string>
#include <vector>

#include "apply/device/piece_memory.h"

namespace deltacast::apply::device {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kHashPieceBytes = 512;  // bytes of a row one thread hashes

#define DC_CUDA(call)                                                                           \
  do {                                                                                          \
    const cudaError_t _err = (call);                                                            \
    if (_err != cudaSuccess) {                                                                  \
      return Status::Internal(name_ + ": " #call ": " + std::string(cudaGetErrorString(_err))); \
    }                                                                                           \
  } while (false)

__global__ void CheckKernel(const PatchSegment* segments, const uint32_t* positions, int* bad) {
  const PatchSegment s = segments[blockIdx.x];
  if (s.kind != kSparseXor) return;
  for (uint64_t i = threadIdx.x; i < s.count; i += blockDim.x) {
    if (!SparseEntryValid(s, positions, i)) atomicExch(bad, 1);
  }
}

// Writes nothing once a check kernel has raised the flag (for this batch or one
// queued before it since the last Sync).
__global__ void ApplyKernel(const PatchSegment* segments, const uint32_t* positions,
                            const unsigned char* words, const unsigned char* dense,
                            const int* flag) {
  if (*flag != 0) return;
  const PatchSegment s = segments[blockIdx.x];
  if (s.kind == kSparseXor) {
    for (uint64_t i = threadIdx.x; i < s.count; i += blockDim.x) {
      ApplySparseEntry(s, positions, words, i);
    }
    return;
  }
  const uint64_t row_bytes = s.run.len * s.element_size;
  if (DenseWordAligned(s, dense)) {
    // 8-byte words, consecutive threads on consecutive words: coalesced.
    const uint64_t words = row_bytes / 8;
    for (uint64_t w = threadIdx.x; w < words * s.run.rows; w += blockDim.x) {
      ApplyDenseWord(s, dense, w / words, w % words);
    }
    return;
  }
  const uint64_t total = row_bytes * s.run.rows;
  for (uint64_t b = threadIdx.x; b < total; b += blockDim.x) {
    const uint64_t row = b / row_bytes, at = b % row_bytes;
    ApplyDenseBytes(s, dense, row, at, at + 1);
  }
}

__global__ void HashKernel(const HashSegment* segments, unsigned long long* out) {
  const HashSegment h = segments[blockIdx.x];
  const uint64_t row_bytes = h.run.len * h.element_size;
  const uint64_t per_row = (row_bytes + kHashPieceBytes - 1) / kHashPieceBytes;
  gf128::Gf128 acc;
  for (uint64_t u = threadIdx.x; u < per_row * h.run.rows; u += blockDim.x) {
    const uint64_t row = u / per_row, from = (u % per_row) * kHashPieceBytes;
    const uint64_t to = from + kHashPieceBytes < row_bytes ? from + kHashPieceBytes : row_bytes;
    acc = gf128::Xor(acc, RowPieceHash(h.run, h.element_size, row, from, to));
  }
  // Contributions combine by XOR: the order of the atomics does not change the bits.
  if (acc.lo != 0) atomicXor(&out[2 * h.slot], static_cast<unsigned long long>(acc.lo));
  if (acc.hi != 0) atomicXor(&out[2 * h.slot + 1], static_cast<unsigned long long>(acc.hi));
}

// Whether element i's bits differ between two versions (1, 2, 4 or 8 bytes).
struct Differs {
  const unsigned char* base;
  const unsigned char* target;
  uint32_t size;
  __device__ bool operator()(uint64_t i) const {
    const unsigned char* a = base + i * size;
    const unsigned char* b = target + i * size;
    switch (size) {
      case 1:
        return *a != *b;
      case 2:
        return *reinterpret_cast<const uint16_t*>(a) != *reinterpret_cast<const uint16_t*>(b);
      case 4:
        return *reinterpret_cast<const uint32_t*>(a) != *reinterpret_cast<const uint32_t*>(b);
      default:
        return *reinterpret_cast<const uint64_t*>(a) != *reinterpret_cast<const uint64_t*>(b);
    }
  }
};

// The XOR words of the selected elements, next to their positions.
__global__ void GatherXors(Differs d, const uint64_t* positions, const uint64_t* count,
                           unsigned char* xors) {
  const uint64_t n = *count;
  for (uint64_t k = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; k < n;
       k += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t i = positions[k];
    for (uint32_t b = 0; b < d.size; ++b) {
      xors[k * d.size + b] = d.base[i * d.size + b] ^ d.target[i * d.size + b];
    }
  }
}

// A device buffer that grows.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t size = 0;
  cudaError_t Reserve(size_t bytes) {
    if (bytes <= size) return cudaSuccess;
    if (ptr != nullptr) cudaFree(ptr);
    ptr = nullptr;
    size = 0;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaSuccess) size = bytes;
    return err;
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

class CudaPieceMemory final : public PieceMemory {
 public:
  explicit CudaPieceMemory(int device) : device_(device), name_("cuda:" + std::to_string(device)) {}
  ~CudaPieceMemory() override {
    cudaSetDevice(device_);
    for (void* p : owned_) cudaFree(p);
    for (Slot& slot : slots_) {
      if (slot.pinned != nullptr) cudaFreeHost(slot.pinned);
      if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
      if (slot.done != nullptr) cudaEventDestroy(slot.done);
    }
    if (hash_pinned_ != nullptr) cudaFreeHost(hash_pinned_);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (apply_stream_ != nullptr) cudaStreamDestroy(apply_stream_);
  }

  Status Init() {
    DC_CUDA(cudaSetDevice(device_));
    DC_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    DC_CUDA(cudaStreamCreateWithFlags(&apply_stream_, cudaStreamNonBlocking));
    for (Slot& slot : slots_) {
      DC_CUDA(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
      DC_CUDA(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
    DC_CUDA(flag_.Reserve(sizeof(int)));
    DC_CUDA(cudaMemset(flag_.ptr, 0, sizeof(int)));
    return Status::Ok();
  }

  const std::string& name() const override { return name_; }

  Result<std::byte*> Allocate(uint64_t bytes) override {
    DC_CUDA(cudaSetDevice(device_));
    void* p = nullptr;
    DC_CUDA(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    owned_.push_back(p);
    DC_CUDA(cudaMemset(p, 0, bytes == 0 ? 1 : bytes));
    return static_cast<std::byte*>(p);
  }

  Status Patch(const PatchBatch& batch) override {
    DC_CUDA(cudaSetDevice(device_));
    if (batch.segments.empty()) return Status::Ok();
    // One staging area, four sections: segments, positions, words, dense.
    const size_t sizes[4] = {batch.segments.size() * sizeof(PatchSegment),
                             batch.positions.size() * sizeof(uint32_t), batch.words.size(),
                             batch.dense.size()};
    const void* sources[4] = {batch.segments.data(), batch.positions.data(), batch.words.data(),
                              batch.dense.data()};
    size_t offsets[4], total = 0;
    for (int i = 0; i < 4; ++i) {
      offsets[i] = total;
      total += (sizes[i] + 15) / 16 * 16;
    }
    // The ring: this slot's last batch must be done with its buffers first.
    Slot& slot = slots_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kSlots;
    if (slot.used) DC_CUDA(cudaEventSynchronize(slot.done));
    RETURN_IF_ERROR(ReservePinned(slot.pinned, slot.pinned_size, total));
    DC_CUDA(slot.device.Reserve(total));
    for (int i = 0; i < 4; ++i) {
      if (sizes[i] != 0) std::memcpy(slot.pinned + offsets[i], sources[i], sizes[i]);
    }
    auto* device = static_cast<unsigned char*>(slot.device.ptr);
    DC_CUDA(cudaMemcpyAsync(device, slot.pinned, total, cudaMemcpyHostToDevice, copy_stream_));
    DC_CUDA(cudaEventRecord(slot.copied, copy_stream_));
    DC_CUDA(cudaStreamWaitEvent(apply_stream_, slot.copied, 0));
    const auto* segments = reinterpret_cast<const PatchSegment*>(device + offsets[0]);
    const auto* positions = reinterpret_cast<const uint32_t*>(device + offsets[1]);
    const auto* words = device + offsets[2];
    const auto* dense = device + offsets[3];
    const unsigned blocks = static_cast<unsigned>(batch.segments.size());
    int* flag = static_cast<int*>(flag_.ptr);
    CheckKernel<<<blocks, kThreads, 0, apply_stream_>>>(segments, positions, flag);
    DC_CUDA(cudaGetLastError());
    ApplyKernel<<<blocks, kThreads, 0, apply_stream_>>>(segments, positions, words, dense, flag);
    DC_CUDA(cudaGetLastError());
    DC_CUDA(cudaEventRecord(slot.done, apply_stream_));
    slot.used = true;
    return Status::Ok();
  }

  Status Sync() override {
    DC_CUDA(cudaSetDevice(device_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));
    int bad = 0;
    DC_CUDA(cudaMemcpy(&bad, flag_.ptr, sizeof(int), cudaMemcpyDeviceToHost));
    if (bad == 0) return Status::Ok();
    DC_CUDA(cudaMemset(flag_.ptr, 0, sizeof(int)));
    return Status::Corrupt(name_ +
                           ": a patch's positions are out of order, repeated or outside their "
                           "run; it and the patches queued after it wrote nothing");
  }

  Status Hash(std::span<const HashSegment> segments, std::span<PartitionHash> out) override {
    DC_CUDA(cudaSetDevice(device_));
    if (segments.empty()) return Status::Ok();
    for (const HashSegment& h : segments) {
      if (h.slot >= out.size()) return Status::InvalidArgument("hash slot out of range");
    }
    const size_t table = segments.size() * sizeof(HashSegment);
    const size_t results = out.size() * 2 * sizeof(unsigned long long);
    RETURN_IF_ERROR(ReservePinned(hash_pinned_, hash_pinned_size_, std::max(table, results)));
    DC_CUDA(hash_table_.Reserve(table));
    DC_CUDA(hashes_.Reserve(results));
    std::memcpy(hash_pinned_, segments.data(), table);
    DC_CUDA(cudaMemcpyAsync(hash_table_.ptr, hash_pinned_, table, cudaMemcpyHostToDevice,
                            apply_stream_));
    DC_CUDA(cudaMemsetAsync(hashes_.ptr, 0, results, apply_stream_));
    HashKernel<<<static_cast<unsigned>(segments.size()), kThreads, 0, apply_stream_>>>(
        static_cast<const HashSegment*>(hash_table_.ptr),
        static_cast<unsigned long long*>(hashes_.ptr));
    DC_CUDA(cudaGetLastError());
    DC_CUDA(
        cudaMemcpyAsync(hash_pinned_, hashes_.ptr, results, cudaMemcpyDeviceToHost, apply_stream_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));
    const auto* words = reinterpret_cast<const unsigned long long*>(hash_pinned_);
    for (size_t k = 0; k < out.size(); ++k) out[k] ^= PartitionHash{words[2 * k], words[2 * k + 1]};
    return Status::Ok();
  }

  // Compacts changed positions with CUB (a selection over element indices), gathers
  // their XOR words beside them, and copies only those to the host, a block of
  // elements at a time so scratch memory stays bounded.
  Status FindChanges(const std::byte* base, const std::byte* target, uint64_t count,
                     uint32_t element_size, ChangeList& out) override {
    DC_CUDA(cudaSetDevice(device_));
    out.clear();
    out.element_size = element_size;
    if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8) {
      return Status::InvalidArgument(name_ + ": element size " + std::to_string(element_size));
    }
    constexpr uint64_t kBlock = uint64_t{1} << 24;
    DC_CUDA(found_.Reserve(kBlock * sizeof(uint64_t) + sizeof(uint64_t)));
    DC_CUDA(words_.Reserve(kBlock * element_size));
    auto* positions = static_cast<uint64_t*>(found_.ptr);
    auto* selected = positions + kBlock;
    for (uint64_t first = 0; first < count; first += kBlock) {
      const uint64_t n = std::min(kBlock, count - first);
      const Differs differs{reinterpret_cast<const unsigned char*>(base),
                            reinterpret_cast<const unsigned char*>(target), element_size};
      thrust::counting_iterator<uint64_t> indices(first);
      size_t temp = 0;
      DC_CUDA(cub::DeviceSelect::If(nullptr, temp, indices, positions, selected,
                                    static_cast<int64_t>(n), differs, apply_stream_));
      DC_CUDA(scratch_.Reserve(temp));
      DC_CUDA(cub::DeviceSelect::If(scratch_.ptr, temp, indices, positions, selected,
                                    static_cast<int64_t>(n), differs, apply_stream_));
      GatherXors<<<256, kThreads, 0, apply_stream_>>>(differs, positions, selected,
                                                      static_cast<unsigned char*>(words_.ptr));
      DC_CUDA(cudaGetLastError());
      uint64_t found = 0;
      DC_CUDA(
          cudaMemcpyAsync(&found, selected, sizeof(found), cudaMemcpyDeviceToHost, apply_stream_));
      DC_CUDA(cudaStreamSynchronize(apply_stream_));
      if (found == 0) continue;
      const size_t at = out.positions.size();
      out.positions.resize(at + found);
      out.xors.resize((at + found) * element_size);
      DC_CUDA(cudaMemcpyAsync(out.positions.data() + at, positions, found * sizeof(uint64_t),
                              cudaMemcpyDeviceToHost, apply_stream_));
      DC_CUDA(cudaMemcpyAsync(out.xors.data() + at * element_size, words_.ptr, found * element_size,
                              cudaMemcpyDeviceToHost, apply_stream_));
      DC_CUDA(cudaStreamSynchronize(apply_stream_));
    }
    return Status::Ok();
  }

  // After the queued patches (the streams do not synchronize with the default one).
  Status Read(const std::byte* src, MutableByteSpan dst) override {
    DC_CUDA(cudaSetDevice(device_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));
    DC_CUDA(cudaMemcpy(dst.data(), src, dst.size(), cudaMemcpyDeviceToHost));
    return Status::Ok();
  }
  Status Write(std::byte* dst, ByteSpan src) override {
    DC_CUDA(cudaSetDevice(device_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));
    DC_CUDA(cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice));
    return Status::Ok();
  }

 private:
  Status ReservePinned(unsigned char*& pinned, size_t& size, size_t bytes) {
    if (bytes <= size) return Status::Ok();
    if (pinned != nullptr) DC_CUDA(cudaFreeHost(pinned));
    pinned = nullptr;
    size = 0;
    void* p = nullptr;
    DC_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    pinned = static_cast<unsigned char*>(p);
    size = bytes;
    return Status::Ok();
  }

  // A slot of the staging ring: pinned host bytes (pageable memory would serialize
  // the copies), their device copy, and events for copied and done.
  struct Slot {
    unsigned char* pinned = nullptr;
    size_t pinned_size = 0;
    DeviceBuffer device;
    cudaEvent_t copied = nullptr, done = nullptr;
    bool used = false;
  };
  static constexpr int kSlots = 2;

  int device_;
  std::string name_;
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t apply_stream_ = nullptr;
  Slot slots_[kSlots];
  int next_slot_ = 0;
  unsigned char* hash_pinned_ = nullptr;
  size_t hash_pinned_size_ = 0;
  DeviceBuffer hash_table_, hashes_;
  DeviceBuffer flag_;                     // set by a check kernel; sticky until Sync
  DeviceBuffer found_, words_, scratch_;  // FindChanges' positions, XOR words, CUB temp
  std::vector<void*> owned_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it: no driver or no device is an answer, not an error
    return 0;
  }
  return count;
}

Result<CudaDeviceFacts> MeasureCudaDevice(int device, uint64_t bytes) {
  const std::string name_ = "cuda:" + std::to_string(device);  // for DC_CUDA
  if (device < 0 || device >= CudaDeviceCount()) return Status::Unavailable(name_ + ": no device");
  DC_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  DC_CUDA(cudaGetDeviceProperties(&prop, device));
  DeviceBuffer a, b;
  DC_CUDA(a.Reserve(bytes));
  DC_CUDA(b.Reserve(bytes));
  DC_CUDA(cudaMemset(a.ptr, 1, bytes));
  cudaEvent_t start, stop;
  DC_CUDA(cudaEventCreate(&start));
  DC_CUDA(cudaEventCreate(&stop));
  DC_CUDA(cudaMemcpy(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice));  // warm
  constexpr int kRounds = 10;
  DC_CUDA(cudaEventRecord(start));
  for (int i = 0; i < kRounds; ++i)
    DC_CUDA(cudaMemcpy(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice));
  DC_CUDA(cudaEventRecord(stop));
  DC_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  DC_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return CudaDeviceFacts{prop.name, 2.0 * double(bytes) * kRounds / (double(ms) * 1e-3) / 1e9};
}

Result<std::unique_ptr<PieceMemory>> NewCudaPieceMemory(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return Status::Unavailable("cuda:" + std::to_string(device) + ": " + std::to_string(count) +
                               " CUDA device(s) usable here");
  }
  auto memory = std::make_unique<CudaPieceMemory>(device);
  RETURN_IF_ERROR(memory->Init());
  return std::unique_ptr<PieceMemory>(std::move(memory));
}

}  // namespace deltacast::apply::device
