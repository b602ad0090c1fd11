// WeightStore: the weights one node holds, addressed by canonical tensor name.
//
// Implementations: a safetensors checkpoint directory mapped into memory
// (apply/checkpoint_dir.h), plain host buffers (apply/host_store.h), and, for
// embedders, their own buffers. Apply workers patch tensor bytes in place through
// MutableTensorData and make them durable with Flush.
//
// Thread safety: const methods are thread-safe. Writers to disjoint byte ranges may
// run concurrently; callers serialize writes to the same range.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "codec/manifest.h"
#include "codec/range_reader.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/partition_hash.h"
#include "common/status.h"
#include "deltacast/tensor.h"

namespace deltacast::codec {
struct DecodedRecord;
}

namespace deltacast::apply {

// Partition-level access to a store whose bytes the host cannot address (GPU
// memory, or canonical tensors split over several GPUs by a load plan): its
// TensorData is empty and MutableTensorData kUnsupported, and the applier, the
// replica and the relay go through these instead. Offsets and lengths are bytes of
// canonical tensor `index` and name one whole partition.
class PartitionAccess {
 public:
  virtual ~PartitionAccess() = default;

  // The partition hash of the stored bytes (computed where they lie).
  virtual Result<PartitionHash> HashPartition(size_t index, uint64_t offset, uint64_t length) = 0;
  // The hashes of many partitions at once (out parallel to `partitions`): a store on
  // GPUs hashes them in one launch per GPU. The default calls HashPartition for each.
  // On failure `out` is unspecified: no hash of a failed call may be used.
  struct PartitionRef {
    size_t tensor = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  virtual Status HashPartitions(std::span<const PartitionRef> partitions,
                                std::span<PartitionHash> out);
  virtual Status ReadPartition(size_t index, uint64_t offset, MutableByteSpan out) = 0;
  virtual Status WritePartition(size_t index, uint64_t offset, ByteSpan bytes) = 0;

  // Writes decoded records (codec::DecodeAndCheckRecord's output: XOR words, a dense
  // XOR mask, or literal target bytes) into their partitions, all of one chunk at
  // once, and returns each partition's hash after the write in `after`. A record
  // whose positions are out of order or repeated refuses the whole call (kCorrupt,
  // nothing written). The caller compares `after` with the target hashes and undoes.
  struct Patch {
    size_t tensor = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    const codec::DecodedRecord* decoded = nullptr;
  };
  virtual Status ApplyPatches(std::span<const Patch> patches, std::span<PartitionHash> after) = 0;
};

class WeightStore {
 public:
  virtual ~WeightStore() = default;

  // All tensors, sorted by name (canonical order). Stable for the store's lifetime.
  virtual const std::vector<TensorSpec>& tensors() const = 0;

  // The bytes of tensor `index` (an index into tensors()). Valid while the store lives.
  virtual ByteSpan TensorData(size_t index) const = 0;

  // Bytes [offset, offset + length) of tensor `index` for a reader that goes through
  // them once (encoding, hashing): a view of the store's memory, or a copy in the
  // first `length` bytes of `buffer` where copying is faster (a checkpoint
  // directory reads its files: codec/range_reader.h says why) or the only way (a
  // PartitionAccess store, which reads whole partitions). The view is valid until
  // `buffer` changes or the store goes away. kInvalidArgument outside the tensor or
  // for a buffer shorter than `length`; kIoError if a read fails. Thread-safe with a
  // buffer per thread.
  virtual Result<ByteSpan> ReadRange(size_t index, uint64_t offset, uint64_t length,
                                     MutableByteSpan buffer) const;

  // Writable bytes of tensor `index`; Unsupported for a store opened read-only.
  virtual Result<MutableByteSpan> MutableTensorData(size_t index) = 0;

  // Makes earlier writes to bytes [offset, offset + length) of tensor `index`
  // durable (msync for mapped files; nothing for volatile memory). Blocks.
  virtual Status Flush(size_t index, uint64_t offset, uint64_t length) = 0;

  // Makes every earlier write to the store durable. Blocks. The default flushes
  // each tensor; a mapped store syncs each file's mapping once.
  virtual Status FlushAll();

  // Identifies everything about the store's bytes beyond tensor contents (file
  // names, safetensors headers, index file). Two stores with equal layout ids and
  // equal manifests are byte-identical. All-zero for stores without files.
  virtual Digest128 LayoutId() const = 0;

  // Non-null for a store whose bytes are not host-addressable (see PartitionAccess).
  virtual PartitionAccess* partition_access() const { return nullptr; }

  // Index of the tensor called `name`, by binary search over tensors().
  std::optional<size_t> FindTensor(std::string_view name) const;
};

// The manifest of the store's bytes as they are, by either path: host stores hash
// their spans on `threads` threads; a PartitionAccess store hashes where the bytes
// lie, many partitions per call. A store that cannot hash (a CUDA error) fails the
// whole manifest: no hash is made up for a partition that was not read.
Result<codec::Manifest> HashWeightStore(const WeightStore& store, uint64_t partition_bytes,
                                        size_t threads);

// The store's ReadRange as the encoder and the manifest hash take it. `store` must
// outlive the reader.
codec::RangeReader RangeReaderOf(const WeightStore& store);

// A copy of bytes [offset, offset + length) of tensor `index`, by either path.
// kInvalidArgument outside the tensor.
Result<std::vector<std::byte>> ReadStoreBytes(const WeightStore& store, size_t index,
                                              uint64_t offset, uint64_t length);

}  // namespace deltacast::apply
