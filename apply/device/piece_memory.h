// PieceMemory: the memory of one GPU (or of the host) that holds some pieces of a
// planned store's canonical partitions, and the few operations a store needs on it:
// patch a batch of segments (one launch per chunk on a GPU), hash placed runs where
// they lie, and copy bytes in and out. Buffers are either allocated here (owned) or
// an engine's own parameters registered by address, and never move: CUDA graphs
// keep their pointers.
//
// Implementations: host memory (NewHostPieceMemory; the reference, and what runs on
// machines without a GPU) and CUDA device memory (NewCudaPieceMemory, built when
// nvcc is found). Both run the element code of segments.h, so they give the same
// bytes and hash bits.
//
// Thread safety: one caller at a time per memory (a planned store serializes).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "apply/device/segments.h"
#include "common/bytes.h"
#include "common/partition_hash.h"
#include "common/status.h"

namespace deltacast::apply::device {

// The patches of one chunk for one memory: the segment table and the payloads it
// indexes. Built on the host, copied to the device as is.
struct PatchBatch {
  std::vector<PatchSegment> segments;
  std::vector<uint32_t> positions;
  std::vector<std::byte> words;
  std::vector<std::byte> dense;
  void clear() {
    segments.clear();
    positions.clear();
    words.clear();
    dense.clear();
  }
};

// A placed run to hash, and the slot its contribution is XORed into.
struct HashSegment {
  PlacedRun run;
  uint32_t element_size = 1;
  uint32_t slot = 0;
};

// The elements whose bits differ between two versions of a buffer: their indices
// (increasing) and XOR words (element_size bytes each, little-endian as stored).
struct ChangeList {
  uint32_t element_size = 1;
  std::vector<uint64_t> positions;
  std::vector<std::byte> xors;
  void clear() {
    positions.clear();
    xors.clear();
  }
};

class PieceMemory {
 public:
  virtual ~PieceMemory() = default;

  // "host", "cuda:0", ...: for messages and logs.
  virtual const std::string& name() const = 0;

  // A zeroed buffer of `bytes` owned by this memory, freed with it. Its address is
  // stable.
  virtual Result<std::byte*> Allocate(uint64_t bytes) = 0;

  // Whether [p, p + bytes) is memory this PieceMemory can read and write in place
  // (on a GPU: device memory of this device, or managed memory) and `p` is aligned
  // to `alignment` bytes. kInvalidArgument naming the problem; checks only, changes
  // nothing. A store calls it for every registered buffer before any launch.
  virtual Status CheckRegion(const std::byte* p, uint64_t bytes, uint32_t alignment) = 0;

  // Orders this memory's later reads and writes after the work queued so far on the
  // caller's CUDA stream `stream` (a cudaStream_t as an integer; 1 = the legacy
  // default stream, what DLPack's stream=1 asks a producer to order with), without
  // blocking the host. stream = 0: waits, blocking, until every stream of the device
  // is idle (for callers that cannot name their stream). Host memory: nothing to do.
  virtual Status AwaitStream(uintptr_t stream) = 0;

  // Checks every sparse entry of `batch` (segments.h, SparseEntryValid) and, only if
  // all are valid, applies every segment. On a GPU this queues the work and returns:
  // the batch is staged through a pinned ring (two slots), so the copy of the next
  // batch overlaps the kernels of this one, and `batch` may be reused at once. A
  // batch with a bad entry writes nothing and neither do the batches queued after
  // it; Patch or the next Sync reports it (kCorrupt). A malformed batch (CheckBatch)
  // is refused before anything is queued. The host memory works at once.
  virtual Status Patch(const PatchBatch& batch) = 0;
  // Waits for every queued patch; kCorrupt if one was refused since the last Sync.
  virtual Status Sync() = 0;

  // Queues the hash of every segment's rows (contributions XORed into slot
  // segment.slot of `slots` slots) after the queued patches; CollectHashes waits and
  // XORs them into out (out.size() == slots). A store queues on every memory before
  // collecting any, so several GPUs hash at once. One hash in flight per memory.
  virtual Status QueueHashes(std::span<const HashSegment> segments, size_t slots) = 0;
  virtual Status CollectHashes(std::span<PartitionHash> out) = 0;
  // Both, for one memory.
  Status Hash(std::span<const HashSegment> segments, std::span<PartitionHash> out) {
    RETURN_IF_ERROR(QueueHashes(segments, out.size()));
    return CollectHashes(out);
  }

  // Compares `count` elements of `element_size` bytes (1, 2, 4 or 8) at `base` and
  // `target` where they lie and returns the changed ones (a trainer's GPU shard: on a
  // GPU only the changes cross to the host). Both addresses must be aligned to the
  // element size (kInvalidArgument otherwise, before any launch).
  virtual Status FindChanges(const std::byte* base, const std::byte* target, uint64_t count,
                             uint32_t element_size, ChangeList& out) = 0;

  // Copies between this memory and the host, after the queued patches. Rows: `rows`
  // rows of `width` bytes, at `src` + r * src_pitch and `dst` + r * dst_pitch (one
  // 2-D copy on a GPU, not one copy per row).
  Status Read(const std::byte* src, MutableByteSpan dst) {
    return ReadRows(src, dst.size(), dst.data(), dst.size(), dst.size(), 1);
  }
  Status Write(std::byte* dst, ByteSpan src) {
    return WriteRows(src.data(), src.size(), dst, src.size(), src.size(), 1);
  }
  virtual Status ReadRows(const std::byte* src, uint64_t src_pitch, std::byte* dst,
                          uint64_t dst_pitch, uint64_t width, uint64_t rows) = 0;
  virtual Status WriteRows(const std::byte* src, uint64_t src_pitch, std::byte* dst,
                           uint64_t dst_pitch, uint64_t width, uint64_t rows) = 0;
};

// Whether `batch` is well formed: every segment's kind and element size are known,
// its entries and words (sparse) or its partition bytes (dense, literal) lie inside
// the batch's payloads, its rows do not overlap in the partition, and no byte count
// overflows. Both memories call it before any work, so a malformed batch writes
// nothing anywhere (the GPU kernels index the payloads without bounds checks).
Status CheckBatch(const PatchBatch& batch);

// Host memory: buffers from calloc, the element code run in loops (the hash through
// the host's fast paths, which agree with segments.h bit for bit).
std::unique_ptr<PieceMemory> NewHostPieceMemory(std::string name = "host");

// Number of CUDA devices usable here: 0 without a driver or a device, or in a build
// without CUDA.
int CudaDeviceCount();

// The memory of CUDA device `device`. kUnavailable without CUDA support, a driver
// or that device (the message says which).
Result<std::unique_ptr<PieceMemory>> NewCudaPieceMemory(int device);

// What a benchmark compares the kernels with: device `device`'s name, its
// device-to-device copy bandwidth over `bytes` (read plus write, GB/s) and its read
// bandwidth (a kernel that only reads `bytes`, GB/s). Restores the caller's device.
struct CudaDeviceFacts {
  std::string name;
  double copy_gbps = 0;
  double read_gbps = 0;
};
Result<CudaDeviceFacts> MeasureCudaDevice(int device, uint64_t bytes);

}  // namespace deltacast::apply::device
