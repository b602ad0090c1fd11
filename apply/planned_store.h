// PlannedStore: the weights of an inference engine whose GPUs each hold slices of
// the canonical tensors in the engine's own shapes (fused qkv_proj / gate_up_proj,
// vocabulary-parallel embeddings, replicated norms), patched in place through a
// load plan (../shared/LAYOUTS.md, receiver side; layout/ expands it).
//
// Each GPU is one PieceMemory (apply/device/piece_memory.h) holding that GPU's
// parameters, allocated here or registered by address (an engine's own tensors:
// addresses never change, so CUDA graphs stay valid). The store presents the
// canonical tensors to the applier through PartitionAccess: a canonical partition is
// hashed as the combination of its pieces' contributions on every GPU (the partition
// hash is composable), so a partition verifies only when every GPU's part of it is
// right, and nothing is gathered. Replicated tensors are written on every copy, and
// a partition whose copies disagree hashes to neither base nor target (torn).
//
// Bytes are volatile: Flush does nothing, and the version state lives in the
// Replica's memory (a restarted engine reloads its weights anyway).
//
// Thread safety: as WeightStore; PartitionAccess calls are serialized inside.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "apply/device/piece_memory.h"
#include "apply/weight_store.h"
#include "common/thread_annotations.h"
#include "layout/description.h"
#include "layout/placement.h"

namespace deltacast::apply {

class PlannedStore final : public WeightStore, public PartitionAccess {
 public:
  // One GPU's part: its memory, the layout its engine rank uses (what its
  // parameters are in canonical terms) and its parameters' names, dtypes and shapes.
  // `addresses` (parallel to `locals`, each local's first byte in `memory`) registers
  // the engine's own buffers; empty allocates zeroed buffers in `memory`. A registered
  // buffer is read and written only after the work queued on the engine's CUDA
  // stream `stream` (PieceMemory::AwaitStream; 0: after the whole device is idle).
  struct PartSpec {
    std::unique_ptr<device::PieceMemory> memory;
    layout::LayoutDescription layout;
    std::vector<TensorSpec> locals;
    std::vector<std::byte*> addresses;
    uintptr_t stream = 0;
  };

  // Expands every part's load plan over `canonical` and checks that together they
  // hold every canonical element (each once, replicas aside), that every parameter
  // matches a rule, and that every run carries bits (a cast or other transform
  // cannot be patched in place): kInvalidArgument / kUnsupported naming the problem.
  // Registered buffers must lie in their part's memory, aligned to their element
  // size, and no two may overlap (tied weights registered twice would take every
  // patch twice: XOR twice is no change, and the partition would read torn forever);
  // each is checked before anything is launched, and a refused store touches none.
  static Result<std::unique_ptr<PlannedStore>> Create(std::vector<TensorSpec> canonical,
                                                      std::vector<PartSpec> parts);

  // WeightStore. Tensor bytes are not host-addressable: TensorData is empty and
  // MutableTensorData kUnsupported; use PartitionAccess.
  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  ByteSpan TensorData(size_t) const override { return {}; }
  Result<MutableByteSpan> MutableTensorData(size_t index) override;
  Status Flush(size_t, uint64_t, uint64_t) override { return Status::Ok(); }
  Digest128 LayoutId() const override { return Digest128{}; }
  PartitionAccess* partition_access() const override {
    return const_cast<PlannedStore*>(this);  // the access serializes itself
  }

  // PartitionAccess.
  Result<PartitionHash> HashPartition(size_t index, uint64_t offset, uint64_t length) override;
  Status HashPartitions(std::span<const PartitionRef> partitions,
                        std::span<PartitionHash> out) override;
  Status ReadPartition(size_t index, uint64_t offset, MutableByteSpan out) override;
  Status WritePartition(size_t index, uint64_t offset, ByteSpan bytes) override;
  Status ApplyPatches(std::span<const Patch> patches, std::span<PartitionHash> after) override;

  // The parts, for engines and tests: the plan of part p and where its local tensor
  // `local` lies.
  size_t part_count() const { return parts_.size(); }
  const layout::PlacementMap& plan(size_t part) const { return parts_[part].plan; }
  std::byte* local_address(size_t part, size_t local) const { return parts_[part].buffers[local]; }
  // Copies local tensor `local` of part `part` to the host, or from it (loading an
  // engine's weights; the caller then hashes the store again).
  Status ReadLocal(size_t part, size_t local, MutableByteSpan out);
  Status WriteLocal(size_t part, size_t local, ByteSpan bytes);

 private:
  struct Part {
    std::unique_ptr<device::PieceMemory> memory;
    layout::PlacementMap plan;
    std::vector<std::byte*> buffers;  // per local tensor of plan
  };
  // A run of one part clipped to a partition; copy 0 is the primary placement,
  // the others replicas (layout::Run::copy: each copy's runs over all parts hold
  // the whole partition or none of it).
  struct Placed {
    size_t part = 0;
    uint32_t copy = 0;
    uint32_t element_size = 1;
    device::PlacedRun run;
  };

  PlannedStore(std::vector<TensorSpec> tensors, std::vector<Part> parts, uint32_t copies)
      : tensors_(std::move(tensors)), parts_(std::move(parts)), copies_(copies) {}
  Status CheckLocal(size_t part, size_t local, size_t bytes) const;
  Result<std::vector<Placed>> Place(size_t index, uint64_t offset, uint64_t length) const;
  // Hashes of `placed` groups (one per partition), combined over their copies.
  Status HashPlaced(const std::vector<std::vector<Placed>>& placed,
                    const std::vector<uint64_t>& lengths, std::span<PartitionHash> out)
      REQUIRES(mu_);

  std::vector<TensorSpec> tensors_;  // canonical, sorted by name
  std::vector<Part> parts_;
  uint32_t copies_ = 1;  // one more than the highest copy number of any run
  Mutex mu_;  // one device operation at a time (a hash is queued on every part, then collected)
};

}  // namespace deltacast::apply
