// HostStore: tensors in ordinary host memory, either owned by the store or
// borrowed from an embedder. Used for tests, for staging, and by embedders whose
// weights already live in their own buffers. Nothing is written to disk, so Flush
// does nothing and there is no layout beyond the tensor table.
//
// Thread safety: as WeightStore: const methods from any thread; concurrent writers
// to disjoint byte ranges.
#pragma once

#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "apply/weight_store.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/status.h"
#include "deltacast/tensor.h"

namespace deltacast::apply {

class HostStore final : public WeightStore {
 public:
  // A store owning one zeroed buffer per tensor (calloc: large buffers are zero
  // pages until written; aligned to at least 16 bytes). kInvalidArgument for
  // duplicate names or a size that overflows 64 bits; kResourceExhausted if the
  // memory cannot be allocated. The input order does not matter.
  static Result<std::unique_ptr<HostStore>> Create(std::vector<TensorSpec> tensors);

  // A store over the embedder's buffers: each span must be exactly
  // info.ByteSize() bytes (else kInvalidArgument, as for duplicate names). The
  // buffers are borrowed, not copied: they must outlive the store, and writes
  // through MutableTensorData land in them directly.
  static Result<std::unique_ptr<HostStore>> Borrow(
      std::vector<std::pair<TensorSpec, MutableByteSpan>> tensors);

  // An owning store with the same tensors and bytes as `other` (copies every byte).
  static Result<std::unique_ptr<HostStore>> CopyOf(const WeightStore& other);

  ~HostStore() override;

  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  // Empty for an out-of-range index.
  ByteSpan TensorData(size_t index) const override;
  // kInvalidArgument for an out-of-range index.
  Result<MutableByteSpan> MutableTensorData(size_t index) override;
  // Nothing to make durable; only checks the range (kInvalidArgument outside it).
  Status Flush(size_t index, uint64_t offset, uint64_t length) override;
  Digest128 LayoutId() const override { return Digest128{}; }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

  HostStore(std::vector<TensorSpec> tensors, std::vector<MutableByteSpan> data,
            std::vector<Buffer> owned);

  std::vector<TensorSpec> tensors_;    // sorted by name
  std::vector<MutableByteSpan> data_;  // parallel to tensors_
  std::vector<Buffer> owned_;          // empty for a borrowing store
};

}  // namespace deltacast::apply
