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
#include <string_view>
#include <vector>

#include "codec/tensor.h"
#include "common/bytes.h"
#include "common/hash.h"
#include "common/status.h"

namespace deltacast::apply {

class WeightStore {
 public:
  virtual ~WeightStore() = default;

  // All tensors, sorted by name (canonical order). Stable for the store's lifetime.
  virtual const std::vector<codec::TensorInfo>& tensors() const = 0;

  // The bytes of tensor `index` (an index into tensors()). Valid while the store lives.
  virtual ByteSpan TensorData(size_t index) const = 0;

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

  // Index of the tensor called `name`, by binary search over tensors().
  std::optional<size_t> FindTensor(std::string_view name) const;
};

}  // namespace deltacast::apply
