// The CUDA PieceMemory: a GPU's parameters patched and hashed by kernels that run
// the element code of segments.h, one launch per chunk over its segment table.
//
// Streams: everything this memory does to device memory runs on its two
// non-blocking streams, never on the legacy default stream (which does not order
// with them): staging copies on the copy stream, kernels, memsets, hashes, change
// finding and host copies on the apply stream, which waits for the copy's event.
// So a hash reads what the patches before it wrote, and the flag reset lands after
// the kernels that read it.
//
// Work is spread over the whole GPU: each segment of a launch gets as many blocks as
// its work needs (a table of first blocks, searched by each block), so one large
// segment does not run on one SM while the others idle.
//
// Every method sets its device and restores the caller's on return (DeviceGuard):
// an engine's next allocation lands where the engine expects.
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cub/device/device_select.cuh>
#include <string>
#include <vector>

#include "apply/device/piece_memory.h"

namespace deltacast::apply::device {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kHashPieceBytes = 4096;  // bytes of a row one thread hashes
constexpr uint64_t kItemsPerThread = 8;     // patch entries or words per thread and block

#define DC_CUDA(call)                                                                           \
  do {                                                                                          \
    const cudaError_t _err = (call);                                                            \
    if (_err != cudaSuccess) {                                                                  \
      return Status::Internal(name_ + ": " #call ": " + std::string(cudaGetErrorString(_err))); \
    }                                                                                           \
  } while (false)

// Sets `device` for the scope and restores the caller's current device after it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

#define DC_DEVICE()                  \
  const DeviceGuard _guard(device_); \
  DC_CUDA(_guard.status())

// Work items of patch segment s: sparse entries, or words / bytes of its rows.
DELTACAST_HD inline uint64_t PatchItems(const PatchSegment& s, bool word_aligned) {
  if (s.kind == kSparseXor) return s.count;
  const uint64_t row_bytes = s.run.len * s.element_size;
  return (word_aligned ? row_bytes / 8 : row_bytes) * s.run.rows;
}

// Block b of segment k's blocks, and how many it has.
struct BlockOf {
  uint32_t segment, index, count;
};
__device__ BlockOf FindBlock(const uint32_t* first, uint32_t segments) {
  const uint32_t k = SegmentOfBlock(first, segments, blockIdx.x);
  return {k, blockIdx.x - first[k], first[k + 1] - first[k]};
}

__global__ void CheckKernel(const PatchSegment* segments, const uint32_t* first, uint32_t n,
                            const uint32_t* positions, int* bad) {
  const BlockOf b = FindBlock(first, n);
  const PatchSegment s = segments[b.segment];
  if (s.kind != kSparseXor) return;
  const uint64_t stride = uint64_t{b.count} * blockDim.x;
  for (uint64_t i = uint64_t{b.index} * blockDim.x + threadIdx.x; i < s.count; i += stride) {
    if (!SparseEntryValid(s, positions, i)) atomicExch(bad, 1);
  }
}

// Writes nothing once a check kernel has raised the flag (for this batch or one
// queued before it since the last Sync).
__global__ void ApplyKernel(const PatchSegment* segments, const uint32_t* first, uint32_t n,
                            const uint32_t* positions, const unsigned char* words,
                            const unsigned char* dense, const int* flag) {
  if (*flag != 0) return;
  const BlockOf b = FindBlock(first, n);
  const PatchSegment s = segments[b.segment];
  const uint64_t stride = uint64_t{b.count} * blockDim.x;
  const uint64_t start = uint64_t{b.index} * blockDim.x + threadIdx.x;
  if (s.kind == kSparseXor) {
    for (uint64_t i = start; i < s.count; i += stride) ApplySparseEntry(s, positions, words, i);
    return;
  }
  const uint64_t row_bytes = s.run.len * s.element_size;
  if (DenseWordAligned(s, dense)) {
    // 8-byte words, consecutive threads on consecutive words: coalesced.
    const uint64_t per_row = row_bytes / 8;
    for (uint64_t w = start; w < per_row * s.run.rows; w += stride) {
      ApplyDenseWord(s, dense, w / per_row, w % per_row);
    }
    return;
  }
  for (uint64_t at = start; at < row_bytes * s.run.rows; at += stride) {
    const uint64_t row = at / row_bytes, col = at % row_bytes;
    ApplyDenseBytes(s, dense, row, col, col + 1);
  }
}

// XOR of a 128-bit value over a warp; lane 0 holds the result.
__device__ gf128::Gf128 WarpXor(gf128::Gf128 v) {
  for (int delta = 16; delta > 0; delta >>= 1) {
    v.lo ^= __shfl_xor_sync(0xffffffffu, v.lo, delta);
    v.hi ^= __shfl_xor_sync(0xffffffffu, v.hi, delta);
  }
  return v;
}

// One thread per piece (kHashPieceBytes of a row); every block lies in one segment,
// so its contributions go to one slot: reduced per warp, one atomic pair per warp.
__global__ void HashKernel(const HashSegment* segments, const uint32_t* first, uint32_t n,
                           const gf128::Gf128* powers, unsigned long long* out) {
  const BlockOf b = FindBlock(first, n);
  const HashSegment h = segments[b.segment];
  const uint64_t row_bytes = h.run.len * h.element_size;
  const uint64_t per_row = PiecesPerRow(row_bytes, kHashPieceBytes);
  const uint64_t stride = uint64_t{b.count} * blockDim.x;
  gf128::Gf128 acc;
  for (uint64_t u = uint64_t{b.index} * blockDim.x + threadIdx.x; u < per_row * h.run.rows;
       u += stride) {
    const uint64_t row = u / per_row, from = (u % per_row) * kHashPieceBytes;
    const uint64_t to = from + kHashPieceBytes < row_bytes ? from + kHashPieceBytes : row_bytes;
    acc = gf128::Xor(acc, RowPieceHashByTable(h.run, h.element_size, row, from, to, powers));
  }
  acc = WarpXor(acc);
  // Contributions combine by XOR: the order of the atomics does not change the bits.
  if ((threadIdx.x & 31) == 0) {
    if (acc.lo != 0) atomicXor(&out[2 * h.slot], static_cast<unsigned long long>(acc.lo));
    if (acc.hi != 0) atomicXor(&out[2 * h.slot + 1], static_cast<unsigned long long>(acc.hi));
  }
}

// Reads `words` 16-byte words and folds them into one (so the reads are not
// optimized away): the device's read bandwidth, what a hash is compared with.
__global__ void ReadKernel(const uint4* in, uint64_t words, uint4* sink) {
  uint4 acc{0, 0, 0, 0};
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint4 v = in[i];
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
  }
  if ((acc.x | acc.y | acc.z | acc.w) == 0x9e3779b9u) *sink = acc;  // practically never
}

// Whether element i's bits differ between two versions (1, 2, 4 or 8 bytes; both
// addresses aligned to the size, checked on the host).
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

// A device buffer that grows. Freed with cudaFree, which waits for the device.
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

std::string Address(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

// Each segment's first block when segment k needs blocks_of(k) blocks (at least one:
// a block with nothing to do returns at once), and the total at the end.
template <typename BlocksOf>
Result<std::vector<uint32_t>> BlockTable(size_t segments, BlocksOf blocks_of) {
  std::vector<uint32_t> first(segments + 1);
  uint64_t total = 0;
  for (size_t k = 0; k < segments; ++k) {
    first[k] = static_cast<uint32_t>(total);
    total += std::max<uint64_t>(1, blocks_of(k));
    if (total >= (uint64_t{1} << 31)) {
      return Status::InvalidArgument("a launch of more than 2^31 blocks: split the batch");
    }
  }
  first[segments] = static_cast<uint32_t>(total);
  return first;
}

class CudaPieceMemory final : public PieceMemory {
 public:
  explicit CudaPieceMemory(int device) : device_(device), name_("cuda:" + std::to_string(device)) {}
  ~CudaPieceMemory() override {
    const DeviceGuard guard(device_);
    if (apply_stream_ != nullptr) cudaStreamSynchronize(apply_stream_);
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    for (void* p : owned_) cudaFree(p);
    for (Slot& slot : slots_) {
      if (slot.pinned != nullptr) cudaFreeHost(slot.pinned);
      if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
      if (slot.done != nullptr) cudaEventDestroy(slot.done);
    }
    if (hash_pinned_ != nullptr) cudaFreeHost(hash_pinned_);
    if (flag_pinned_ != nullptr) cudaFreeHost(flag_pinned_);
    if (found_pinned_ != nullptr) cudaFreeHost(found_pinned_);
    if (caller_written_ != nullptr) cudaEventDestroy(caller_written_);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (apply_stream_ != nullptr) cudaStreamDestroy(apply_stream_);
  }

  Status Init() {
    DC_DEVICE();
    DC_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    DC_CUDA(cudaStreamCreateWithFlags(&apply_stream_, cudaStreamNonBlocking));
    for (Slot& slot : slots_) {
      DC_CUDA(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
      DC_CUDA(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
    DC_CUDA(cudaEventCreateWithFlags(&caller_written_, cudaEventDisableTiming));
    DC_CUDA(cudaHostAlloc(&flag_pinned_, sizeof(int), cudaHostAllocDefault));
    DC_CUDA(flag_.Reserve(sizeof(int)));
    DC_CUDA(cudaMemsetAsync(flag_.ptr, 0, sizeof(int), apply_stream_));
    // alpha^(2^i): the hash kernel's powers table.
    gf128::Gf128 powers[kAlphaPowers];
    powers[0] = gf128::kAlpha;
    for (int i = 1; i < kAlphaPowers; ++i) powers[i] = gf128::Mul(powers[i - 1], powers[i - 1]);
    DC_CUDA(powers_.Reserve(sizeof(powers)));
    DC_CUDA(cudaMemcpyAsync(powers_.ptr, powers, sizeof(powers), cudaMemcpyHostToDevice,
                            apply_stream_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));  // `powers` is on this stack
    cudaDeviceProp prop{};
    DC_CUDA(cudaGetDeviceProperties(&prop, device_));
    sms_ = std::max(1, prop.multiProcessorCount);
    return Status::Ok();
  }

  const std::string& name() const override { return name_; }

  Result<std::byte*> Allocate(uint64_t bytes) override {
    DC_DEVICE();
    void* p = nullptr;
    DC_CUDA(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    owned_.push_back(p);
    DC_CUDA(cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, apply_stream_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));
    return static_cast<std::byte*>(p);
  }

  Status CheckRegion(const std::byte* p, uint64_t bytes, uint32_t alignment) override {
    DC_DEVICE();
    if (p == nullptr) return Status::InvalidArgument(name_ + ": a null buffer");
    if (alignment > 1 && reinterpret_cast<uintptr_t>(p) % alignment != 0) {
      return Status::InvalidArgument(name_ + ": buffer " + Address(p) + " is not aligned to " +
                                     std::to_string(alignment) + " bytes");
    }
    // Its first and last bytes must be device (or managed) memory of this device.
    for (const std::byte* at : {p, p + (bytes == 0 ? 0 : bytes - 1)}) {
      cudaPointerAttributes a{};
      const cudaError_t err = cudaPointerGetAttributes(&a, at);
      if (err != cudaSuccess) {
        cudaGetLastError();  // an unknown pointer is an answer, not a sticky error
        return Status::InvalidArgument(name_ + ": buffer " + Address(p) + " (" +
                                       std::to_string(bytes) +
                                       " bytes) is not CUDA memory: " + cudaGetErrorString(err));
      }
      const bool here = (a.type == cudaMemoryTypeDevice && a.device == device_) ||
                        a.type == cudaMemoryTypeManaged;
      if (!here) {
        return Status::InvalidArgument(
            name_ + ": buffer " + Address(p) + " (" + std::to_string(bytes) + " bytes) " +
            (a.type == cudaMemoryTypeDevice ? "lies on cuda:" + std::to_string(a.device)
                                            : std::string("is host memory")) +
            " at byte " + std::to_string(at - p) + ", not in this device's memory");
      }
    }
    return Status::Ok();
  }

  Status AwaitStream(uintptr_t stream) override {
    DC_DEVICE();
    if (stream == 0) {
      DC_CUDA(cudaDeviceSynchronize());
      return Status::Ok();
    }
    DC_CUDA(cudaEventRecord(caller_written_, reinterpret_cast<cudaStream_t>(stream)));
    DC_CUDA(cudaStreamWaitEvent(apply_stream_, caller_written_, 0));
    return Status::Ok();
  }

  Status Patch(const PatchBatch& batch) override {
    RETURN_IF_ERROR(CheckBatch(batch));
    DC_DEVICE();
    if (batch.segments.empty()) return Status::Ok();
    const uint32_t n = static_cast<uint32_t>(batch.segments.size());
    // One staging area, five sections: segments, block table, positions, words, dense.
    size_t sizes[5] = {batch.segments.size() * sizeof(PatchSegment), (n + 1) * sizeof(uint32_t),
                       batch.positions.size() * sizeof(uint32_t), batch.words.size(),
                       batch.dense.size()};
    size_t offsets[5], total = 0;
    for (int i = 0; i < 5; ++i) {
      offsets[i] = total;
      total += (sizes[i] + 15) / 16 * 16;
    }
    // The ring: this slot's last batch must be done with its buffers first.
    Slot& slot = slots_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kSlots;
    if (slot.used) DC_CUDA(cudaEventSynchronize(slot.done));
    RETURN_IF_ERROR(ReservePinned(slot.pinned, slot.pinned_size, total));
    DC_CUDA(slot.device.Reserve(total));
    // Blocks per segment, from its work: dense rows go in words where the segment is
    // word aligned on the device (its payload's device address is known now).
    const auto* dense_on_device = static_cast<const unsigned char*>(slot.device.ptr) + offsets[4];
    ASSIGN_OR_RETURN(
        std::vector<uint32_t> first, BlockTable(n, [&](size_t k) {
          const PatchSegment& s = batch.segments[k];
          const bool words = s.kind != kSparseXor && DenseWordAligned(s, dense_on_device);
          const uint64_t items = PatchItems(s, words);
          return (items + kThreads * kItemsPerThread - 1) / (kThreads * kItemsPerThread);
        }));
    const void* sources[5] = {batch.segments.data(), first.data(), batch.positions.data(),
                              batch.words.data(), batch.dense.data()};
    for (int i = 0; i < 5; ++i) {
      if (sizes[i] != 0) std::memcpy(slot.pinned + offsets[i], sources[i], sizes[i]);
    }
    auto* device = static_cast<unsigned char*>(slot.device.ptr);
    DC_CUDA(cudaMemcpyAsync(device, slot.pinned, total, cudaMemcpyHostToDevice, copy_stream_));
    DC_CUDA(cudaEventRecord(slot.copied, copy_stream_));
    DC_CUDA(cudaStreamWaitEvent(apply_stream_, slot.copied, 0));
    const auto* segments = reinterpret_cast<const PatchSegment*>(device + offsets[0]);
    const auto* blocks = reinterpret_cast<const uint32_t*>(device + offsets[1]);
    const auto* positions = reinterpret_cast<const uint32_t*>(device + offsets[2]);
    const auto* words = device + offsets[3];
    const auto* dense = device + offsets[4];
    int* flag = static_cast<int*>(flag_.ptr);
    CheckKernel<<<first[n], kThreads, 0, apply_stream_>>>(segments, blocks, n, positions, flag);
    DC_CUDA(cudaGetLastError());
    ApplyKernel<<<first[n], kThreads, 0, apply_stream_>>>(segments, blocks, n, positions, words,
                                                          dense, flag);
    DC_CUDA(cudaGetLastError());
    DC_CUDA(cudaEventRecord(slot.done, apply_stream_));
    slot.used = true;
    return Status::Ok();
  }

  Status Sync() override {
    DC_DEVICE();
    // The flag is read and reset on the apply stream, after the kernels that set it.
    DC_CUDA(cudaMemcpyAsync(flag_pinned_, flag_.ptr, sizeof(int), cudaMemcpyDeviceToHost,
                            apply_stream_));
    DC_CUDA(cudaMemsetAsync(flag_.ptr, 0, sizeof(int), apply_stream_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));
    if (*flag_pinned_ == 0) return Status::Ok();
    return Status::Corrupt(name_ +
                           ": a patch's positions are out of order, repeated or outside their "
                           "run; it and the patches queued after it wrote nothing");
  }

  Status QueueHashes(std::span<const HashSegment> segments, size_t slots) override {
    DC_DEVICE();
    hash_slots_ = slots;
    hash_queued_ = false;
    for (const HashSegment& h : segments) {
      if (h.slot >= slots) return Status::InvalidArgument(name_ + ": hash slot out of range");
      if (h.run.base == nullptr && h.run.rows != 0 && h.run.len != 0) {
        return Status::InvalidArgument(name_ + ": a hash segment without a buffer");
      }
    }
    if (slots == 0) return Status::Ok();
    const uint32_t n = static_cast<uint32_t>(segments.size());
    ASSIGN_OR_RETURN(std::vector<uint32_t> first, BlockTable(n, [&](size_t k) {
                       const HashSegment& h = segments[k];
                       const uint64_t units =
                           PiecesPerRow(h.run.len * h.element_size, kHashPieceBytes) * h.run.rows;
                       return (units + kThreads - 1) / kThreads;
                     }));
    const size_t table = (segments.size() * sizeof(HashSegment) + 15) / 16 * 16;
    const size_t blocks = first.size() * sizeof(uint32_t);
    const size_t results = slots * 2 * sizeof(unsigned long long);
    RETURN_IF_ERROR(
        ReservePinned(hash_pinned_, hash_pinned_size_, std::max(table + blocks, results)));
    DC_CUDA(hash_table_.Reserve(table + blocks));
    DC_CUDA(hashes_.Reserve(results));
    // The pinned area is free: the last hash was collected (synchronized) before.
    if (!segments.empty()) std::memcpy(hash_pinned_, segments.data(), segments.size_bytes());
    std::memcpy(hash_pinned_ + table, first.data(), blocks);
    DC_CUDA(cudaMemcpyAsync(hash_table_.ptr, hash_pinned_, table + blocks, cudaMemcpyHostToDevice,
                            apply_stream_));
    DC_CUDA(cudaMemsetAsync(hashes_.ptr, 0, results, apply_stream_));
    if (n != 0) {
      auto* device = static_cast<unsigned char*>(hash_table_.ptr);
      HashKernel<<<first[n], kThreads, 0, apply_stream_>>>(
          reinterpret_cast<const HashSegment*>(device),
          reinterpret_cast<const uint32_t*>(device + table), n,
          static_cast<const gf128::Gf128*>(powers_.ptr),
          static_cast<unsigned long long*>(hashes_.ptr));
      DC_CUDA(cudaGetLastError());
    }
    // The table's upload must finish before the results overwrite the pinned area:
    // both are on the apply stream, in order.
    DC_CUDA(
        cudaMemcpyAsync(hash_pinned_, hashes_.ptr, results, cudaMemcpyDeviceToHost, apply_stream_));
    hash_queued_ = true;
    return Status::Ok();
  }

  Status CollectHashes(std::span<PartitionHash> out) override {
    DC_DEVICE();
    if (out.size() != hash_slots_) {
      return Status::InvalidArgument(name_ + ": " + std::to_string(out.size()) +
                                     " hash slots collected, " + std::to_string(hash_slots_) +
                                     " queued");
    }
    if (!hash_queued_) return Status::Ok();
    hash_queued_ = false;
    // A failed kernel or copy reports here: its slots never reach `out`.
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
    out.clear();
    out.element_size = element_size;
    if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8) {
      return Status::InvalidArgument(name_ + ": element size " + std::to_string(element_size));
    }
    if (count == 0) return Status::Ok();
    RETURN_IF_ERROR(CheckRegion(base, count * element_size, element_size));
    RETURN_IF_ERROR(CheckRegion(target, count * element_size, element_size));
    DC_DEVICE();
    constexpr uint64_t kBlock = uint64_t{1} << 24;
    DC_CUDA(found_.Reserve(kBlock * sizeof(uint64_t) + sizeof(uint64_t)));
    DC_CUDA(words_.Reserve(kBlock * element_size));
    auto* positions = static_cast<uint64_t*>(found_.ptr);
    auto* selected = positions + kBlock;
    if (found_pinned_ == nullptr) {
      DC_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&found_pinned_), sizeof(uint64_t),
                            cudaHostAllocDefault));
    }
    const unsigned gather_blocks = static_cast<unsigned>(sms_ * 8);
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
      GatherXors<<<gather_blocks, kThreads, 0, apply_stream_>>>(
          differs, positions, selected, static_cast<unsigned char*>(words_.ptr));
      DC_CUDA(cudaGetLastError());
      DC_CUDA(cudaMemcpyAsync(found_pinned_, selected, sizeof(uint64_t), cudaMemcpyDeviceToHost,
                              apply_stream_));
      DC_CUDA(cudaStreamSynchronize(apply_stream_));
      const uint64_t found = *found_pinned_;
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

  // On the apply stream: after the queued patches, before later ones.
  Status ReadRows(const std::byte* src, uint64_t src_pitch, std::byte* dst, uint64_t dst_pitch,
                  uint64_t width, uint64_t rows) override {
    DC_DEVICE();
    if (rows == 0 || width == 0) return Status::Ok();
    DC_CUDA(cudaMemcpy2DAsync(dst, rows == 1 ? width : dst_pitch, src,
                              rows == 1 ? width : src_pitch, width, rows, cudaMemcpyDeviceToHost,
                              apply_stream_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));
    return Status::Ok();
  }
  Status WriteRows(const std::byte* src, uint64_t src_pitch, std::byte* dst, uint64_t dst_pitch,
                   uint64_t width, uint64_t rows) override {
    DC_DEVICE();
    if (rows == 0 || width == 0) return Status::Ok();
    DC_CUDA(cudaMemcpy2DAsync(dst, rows == 1 ? width : dst_pitch, src,
                              rows == 1 ? width : src_pitch, width, rows, cudaMemcpyHostToDevice,
                              apply_stream_));
    DC_CUDA(cudaStreamSynchronize(apply_stream_));  // `src` may go away on return
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
  int sms_ = 1;
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t apply_stream_ = nullptr;
  cudaEvent_t caller_written_ = nullptr;  // AwaitStream's event on the caller's stream
  Slot slots_[kSlots];
  int next_slot_ = 0;
  unsigned char* hash_pinned_ = nullptr;
  size_t hash_pinned_size_ = 0;
  size_t hash_slots_ = 0;
  bool hash_queued_ = false;
  int* flag_pinned_ = nullptr;
  uint64_t* found_pinned_ = nullptr;
  DeviceBuffer hash_table_, hashes_, powers_;
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
  const DeviceGuard guard(device);
  DC_CUDA(guard.status());
  cudaDeviceProp prop{};
  DC_CUDA(cudaGetDeviceProperties(&prop, device));
  bytes = bytes / 16 * 16;
  cudaStream_t stream = nullptr;
  DC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer a, b, sink;
  DC_CUDA(a.Reserve(bytes));
  DC_CUDA(b.Reserve(bytes));
  DC_CUDA(sink.Reserve(16));
  DC_CUDA(cudaMemsetAsync(a.ptr, 1, bytes, stream));
  cudaEvent_t start, stop;
  DC_CUDA(cudaEventCreate(&start));
  DC_CUDA(cudaEventCreate(&stop));
  constexpr int kRounds = 10;
  auto time = [&](auto&& pass, float* ms) -> cudaError_t {
    pass();  // warm
    cudaEventRecord(start, stream);
    for (int i = 0; i < kRounds; ++i) pass();
    cudaEventRecord(stop, stream);
    cudaError_t err = cudaEventSynchronize(stop);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaEventElapsedTime(ms, start, stop);
    return err;
  };
  float copy_ms = 0, read_ms = 0;
  DC_CUDA(time([&] { cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, stream); },
               &copy_ms));
  DC_CUDA(time(
      [&] {
        ReadKernel<<<prop.multiProcessorCount * 8, kThreads, 0, stream>>>(
            static_cast<const uint4*>(a.ptr), bytes / 16, static_cast<uint4*>(sink.ptr));
      },
      &read_ms));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  CudaDeviceFacts facts;
  facts.name = prop.name;
  facts.copy_gbps = 2.0 * double(bytes) * kRounds / (double(copy_ms) * 1e-3) / 1e9;
  facts.read_gbps = double(bytes) * kRounds / (double(read_ms) * 1e-3) / 1e9;
  return facts;
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
