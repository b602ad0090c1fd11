#include "apply/planned_store.h"

#include <algorithm>

#include "codec/partition_codec.h"
#include "common/gf128.h"
#include "common/thread_annotations.h"

namespace deltacast::apply {
namespace {

using device::PlacedRun;

std::string PartName(const PlannedStore::PartSpec& p, size_t index) {
  return "part " + std::to_string(index) + " (" + p.memory->name() + ")";
}

// What a partition reports when its copies disagree: copy 0's hash plus alpha times
// their differences, which is neither copy's hash, so the applier sees it torn.
PartitionHash Disagreeing(const PartitionHash& first, const PartitionHash& differences) {
  const gf128::Gf128 d = gf128::Mul(gf128::Gf128{differences.lo, differences.hi}, gf128::kAlpha);
  return {first.lo ^ d.lo, first.hi ^ d.hi};
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Every parameter the part's plan expects is among the engine's: a missing one is
// named with the rule that expects it and the shape that rule implies.
Status CheckExpected(const std::string& part, const PlannedStore::PartSpec& spec,
                     const std::vector<TensorSpec>& canonical) {
  auto expected = layout::ExpectedLocals(spec.layout, canonical);
  if (!expected.ok()) return expected.status().WithContext(part);
  std::vector<std::string> names;
  for (const TensorSpec& t : spec.locals) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  for (const layout::ExpectedLocal& x : *expected) {
    if (std::binary_search(names.begin(), names.end(), x.name)) continue;
    return Status::InvalidArgument(part + ": parameter '" + x.name + "' is missing: the plan (" +
                                   spec.layout.Where(x.line) + ") expects it" +
                                   (x.shape.empty() ? "" : " with shape " + ShapeText(x.shape)) +
                                   ", holding canonical '" + x.canonical + "'");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<PlannedStore>> PlannedStore::Create(std::vector<TensorSpec> canonical,
                                                           std::vector<PartSpec> specs) {
  if (specs.empty()) return Status::InvalidArgument("a planned store needs at least one part");
  std::vector<Part> parts;
  std::vector<layout::PlacementMap> scans;
  // Every registered buffer, to refuse overlaps once all are known.
  struct Registered {
    uintptr_t begin = 0, end = 0;
    std::string what;
  };
  std::vector<Registered> registered;
  for (size_t p = 0; p < specs.size(); ++p) {
    PartSpec& spec = specs[p];
    if (!spec.memory)
      return Status::InvalidArgument("part " + std::to_string(p) + " has no memory");
    const std::string name = PartName(spec, p);
    RETURN_IF_ERROR(CheckExpected(name, spec, canonical));
    ASSIGN_OR_RETURN(layout::PlacementMap scan,
                     layout::ExpandPlacement(spec.layout, canonical, spec.locals));
    ASSIGN_OR_RETURN(
        layout::PlacementMap load,
        layout::ExpandPlacement(spec.layout, canonical, spec.locals, layout::PlacementUse::kLoad));
    for (const layout::LocalTensor& t : load.locals()) {
      if (t.role == layout::Role::kUnmatched || t.role == layout::Role::kFlat ||
          t.role == layout::Role::kGathered) {
        return Status::InvalidArgument(name + ": parameter '" + t.spec.name + "' is " +
                                       std::string(layout::RoleName(t.role)) +
                                       "; a load plan needs every parameter placed by a rule");
      }
    }
    for (const layout::Run& r : load.runs()) {
      if (r.value != layout::Value::kBits) {
        return Status::Unsupported(name + ": parameter '" + load.locals()[r.local].spec.name +
                                   "' holds a transform of its canonical values (rule line " +
                                   std::to_string(r.line) + "): it cannot be patched in place");
      }
    }
    if (!spec.addresses.empty() && spec.addresses.size() != spec.locals.size()) {
      return Status::InvalidArgument(name + ": " + std::to_string(spec.addresses.size()) +
                                     " addresses for " + std::to_string(spec.locals.size()) +
                                     " parameters");
    }
    Part part{std::move(spec.memory), std::move(load), {}};
    for (size_t l = 0; l < part.plan.locals().size(); ++l) {
      const TensorSpec& local = part.plan.locals()[l].spec;
      if (!spec.addresses.empty()) {
        if (spec.addresses[l] == nullptr) {
          return Status::InvalidArgument(name + ": parameter '" + local.name + "' has no address");
        }
        const uint64_t bytes = local.ByteSize();
        RETURN_IF_ERROR(part.memory
                            ->CheckRegion(spec.addresses[l], bytes,
                                          static_cast<uint32_t>(ElementSize(local.dtype)))
                            .WithContext(name + ": parameter '" + local.name + "'"));
        const auto begin = reinterpret_cast<uintptr_t>(spec.addresses[l]);
        registered.push_back({begin, begin + bytes, name + " parameter '" + local.name + "'"});
        part.buffers.push_back(spec.addresses[l]);
        continue;
      }
      ASSIGN_OR_RETURN(std::byte * buffer, part.memory->Allocate(local.ByteSize()));
      part.buffers.push_back(buffer);
    }
    scans.push_back(std::move(scan));
    parts.push_back(std::move(part));
  }
  std::sort(registered.begin(), registered.end(),
            [](const Registered& a, const Registered& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < registered.size(); ++k) {
    if (registered[k].begin < registered[k - 1].end) {
      return Status::InvalidArgument(
          registered[k - 1].what + " and " + registered[k].what +
          " overlap in memory: every patch would be applied to the shared bytes twice (tied "
          "weights: register the tensor once, and map the other name to it in the layout)");
    }
  }
  std::vector<const layout::PlacementMap*> maps;
  for (const auto& m : scans) maps.push_back(&m);
  RETURN_IF_ERROR(layout::CheckCoverage(maps));
  // The engine's writes to its buffers finish before the first read of them.
  for (size_t p = 0; p < parts.size(); ++p) {
    if (specs[p].addresses.empty()) continue;
    RETURN_IF_ERROR(
        parts[p]
            .memory->AwaitStream(specs[p].stream)
            .WithContext("part " + std::to_string(p) + " (" + parts[p].memory->name() + ")"));
  }

  std::vector<TensorSpec> tensors;
  for (const TensorSpec& t : parts[0].plan.canonical())
    tensors.push_back({t.name, t.dtype, t.shape});
  uint32_t copies = 1;
  for (const Part& part : parts) {
    for (const layout::Run& r : part.plan.runs()) copies = std::max(copies, r.copy + 1);
  }
  return std::unique_ptr<PlannedStore>(
      new PlannedStore(std::move(tensors), std::move(parts), copies));
}

Result<MutableByteSpan> PlannedStore::MutableTensorData(size_t index) {
  return Status::Unsupported("tensor '" + (index < tensors_.size() ? tensors_[index].name : "?") +
                             "' lies in a planned store's GPU parts; use its PartitionAccess");
}

Result<std::vector<PlannedStore::Placed>> PlannedStore::Place(size_t index, uint64_t offset,
                                                              uint64_t length) const {
  if (index >= tensors_.size())
    return Status::InvalidArgument("no tensor " + std::to_string(index));
  const TensorSpec& info = tensors_[index];
  const uint64_t e = ElementSize(info.dtype);
  if (offset % e != 0 || length % e != 0 || offset + length > info.ByteSize()) {
    return Status::InvalidArgument("tensor '" + info.name + "': bytes [" + std::to_string(offset) +
                                   ", +" + std::to_string(length) +
                                   ") are not whole elements in it");
  }
  const uint64_t begin = offset / e, end = begin + length / e;
  std::vector<Placed> placed;
  std::vector<uint64_t> held(copies_, 0);
  for (size_t p = 0; p < parts_.size(); ++p) {
    const Part& part = parts_[p];
    for (const layout::Run& r : part.plan.ShardPieces(static_cast<uint32_t>(index), begin, end)) {
      const uint32_t copy = r.copy;
      PlacedRun run;
      run.base = reinterpret_cast<unsigned char*>(part.buffers[r.local]);
      run.part_dst = r.dst - begin;
      run.dst_stride = r.dst_stride;
      run.len = r.len;
      run.rows = r.count;
      run.src = r.src;
      run.src_stride = r.src_stride;
      placed.push_back({p, copy, static_cast<uint32_t>(e), run});
      held[copy] += r.Elements();
    }
  }
  for (size_t c = 0; c < held.size(); ++c) {
    if (held[c] != 0 && held[c] != end - begin) {
      return Status::Internal(
          "tensor '" + info.name + "' partition at element " + std::to_string(begin) + ": " +
          (c == 0 ? std::string("the primary placement") : "replica copy " + std::to_string(c)) +
          " holds " + std::to_string(held[c]) + " of its " + std::to_string(end - begin) +
          " elements");
    }
  }
  return placed;
}

Status PlannedStore::HashPlaced(const std::vector<std::vector<Placed>>& placed,
                                const std::vector<uint64_t>& lengths,
                                std::span<PartitionHash> out) {
  const size_t copies = copies_;
  std::vector<PartitionHash> slots(placed.size() * copies);
  std::vector<char> present(slots.size(), 0);
  // Every GPU's hash is queued before any is collected, so they run together.
  std::vector<char> queued(parts_.size(), 0);
  Status failed;
  for (size_t p = 0; p < parts_.size() && failed.ok(); ++p) {
    std::vector<device::HashSegment> segments;
    for (size_t k = 0; k < placed.size(); ++k) {
      for (const Placed& pl : placed[k]) {
        if (pl.part != p) continue;
        const uint32_t slot = static_cast<uint32_t>(k * copies + pl.copy);
        segments.push_back({pl.run, pl.element_size, slot});
        present[slot] = 1;
      }
    }
    if (segments.empty()) continue;
    failed = parts_[p].memory->QueueHashes(segments, slots.size());
    queued[p] = failed.ok();
  }
  for (size_t p = 0; p < parts_.size(); ++p) {
    if (!queued[p]) continue;
    const Status collected = parts_[p].memory->CollectHashes(slots);
    if (failed.ok()) failed = collected;
  }
  RETURN_IF_ERROR(failed);
  for (size_t k = 0; k < placed.size(); ++k) {
    const PartitionHash length_term = PartitionLengthTerm(lengths[k]);
    const PartitionHash first = slots[k * copies] ^ length_term;
    PartitionHash differences;
    for (size_t c = 1; c < copies; ++c) {
      if (present[k * copies + c]) differences ^= (slots[k * copies + c] ^ length_term) ^ first;
    }
    out[k] = differences.IsZero() ? first : Disagreeing(first, differences);
  }
  return Status::Ok();
}

Result<PartitionHash> PlannedStore::HashPartition(size_t index, uint64_t offset, uint64_t length) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(std::vector<Placed> placed, Place(index, offset, length));
  PartitionHash out;
  RETURN_IF_ERROR(HashPlaced({std::move(placed)}, {length}, {&out, 1}));
  return out;
}

Status PlannedStore::HashPartitions(std::span<const PartitionRef> partitions,
                                    std::span<PartitionHash> out) {
  if (out.size() != partitions.size()) return Status::InvalidArgument("one hash per partition");
  MutexLock lock(mu_);
  std::vector<std::vector<Placed>> placed(partitions.size());
  std::vector<uint64_t> lengths(partitions.size());
  for (size_t k = 0; k < partitions.size(); ++k) {
    ASSIGN_OR_RETURN(placed[k],
                     Place(partitions[k].tensor, partitions[k].offset, partitions[k].length));
    lengths[k] = partitions[k].length;
  }
  return HashPlaced(placed, lengths, out);
}

Status PlannedStore::ReadPartition(size_t index, uint64_t offset, MutableByteSpan out) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(std::vector<Placed> placed, Place(index, offset, out.size()));
  for (const Placed& pl : placed) {
    if (pl.copy != 0) continue;
    // One 2-D copy per run (rows of a row-split part), not one per row.
    const uint64_t e = pl.element_size;
    RETURN_IF_ERROR(parts_[pl.part].memory->ReadRows(
        reinterpret_cast<const std::byte*>(pl.run.base) + pl.run.src * e, pl.run.src_stride * e,
        out.data() + pl.run.part_dst * e, pl.run.dst_stride * e, pl.run.len * e, pl.run.rows));
  }
  return Status::Ok();
}

Status PlannedStore::WritePartition(size_t index, uint64_t offset, ByteSpan bytes) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(std::vector<Placed> placed, Place(index, offset, bytes.size()));
  for (const Placed& pl : placed) {
    const uint64_t e = pl.element_size;
    RETURN_IF_ERROR(parts_[pl.part].memory->WriteRows(
        bytes.data() + pl.run.part_dst * e, pl.run.dst_stride * e,
        reinterpret_cast<std::byte*>(pl.run.base) + pl.run.src * e, pl.run.src_stride * e,
        pl.run.len * e, pl.run.rows));
  }
  return Status::Ok();
}

Status PlannedStore::ApplyPatches(std::span<const Patch> patches, std::span<PartitionHash> after) {
  if (after.size() != patches.size()) return Status::InvalidArgument("one hash per patch");
  MutexLock lock(mu_);
  std::vector<std::vector<Placed>> placed(patches.size());
  std::vector<uint64_t> lengths(patches.size());
  std::vector<device::PatchBatch> batches(parts_.size());
  for (size_t k = 0; k < patches.size(); ++k) {
    const Patch& patch = patches[k];
    ASSIGN_OR_RETURN(placed[k], Place(patch.tensor, patch.offset, patch.length));
    lengths[k] = patch.length;
    const codec::DecodedRecord& d = *patch.decoded;
    const bool sparse = d.form == codec::DecodedRecord::Form::kChanges;
    if (!sparse && d.whole.size() != patch.length) {
      return Status::Corrupt("a whole-partition record of " + std::to_string(d.whole.size()) +
                             " bytes for a partition of " + std::to_string(patch.length));
    }
    for (const Placed& pl : placed[k]) {
      device::PatchBatch& batch = batches[pl.part];
      device::PatchSegment s;
      s.run = pl.run;
      s.element_size = pl.element_size;
      if (!sparse) {
        s.kind =
            d.form == codec::DecodedRecord::Form::kDenseMask ? device::kDenseXor : device::kLiteral;
        s.dense_offset = batch.dense.size();
        batch.dense.insert(batch.dense.end(), d.whole.begin(), d.whole.end());
        batch.segments.push_back(s);
        continue;
      }
      // The entries this run holds, in order.
      const codec::SparseChanges& c = d.changes;
      if (c.element_size != pl.element_size) {
        return Status::Corrupt("XOR words of " + std::to_string(c.element_size) +
                               " bytes for elements of " + std::to_string(pl.element_size));
      }
      s.kind = device::kSparseXor;
      s.first = batch.positions.size();
      s.word_offset = batch.words.size();
      for (size_t i = 0; i < c.size(); ++i) {
        uint64_t local = 0;
        if (!device::LocalElement(pl.run, c.positions[i], &local)) continue;
        batch.positions.push_back(c.positions[i]);
        const std::byte* w = c.xors.data() + i * c.element_size;
        batch.words.insert(batch.words.end(), w, w + c.element_size);
      }
      s.count = batch.positions.size() - s.first;
      if (s.count != 0) batch.segments.push_back(s);
    }
  }
  // The same check the memories make, over every part before any of them writes,
  // so a bad record never leaves one GPU patched and another not.
  for (size_t p = 0; p < batches.size(); ++p) {
    for (const device::PatchSegment& s : batches[p].segments) {
      if (s.kind != device::kSparseXor) continue;
      for (uint64_t i = 0; i < s.count; ++i) {
        if (!device::SparseEntryValid(s, batches[p].positions.data(), i)) {
          return Status::Corrupt(
              "a record's positions are out of order or repeated; nothing "
              "was written");
        }
      }
    }
  }
  // Every GPU's patch is queued before any is waited for, so they run together.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t p = 0; p < batches.size(); ++p) {
      if (batches[p].segments.empty()) continue;
      device::PieceMemory& memory = *parts_[p].memory;
      const Status s = pass == 0 ? memory.Patch(batches[p]) : memory.Sync();
      if (!s.ok()) {
        return Status::Internal(memory.name() +
                                " refused a patch the host had checked: " + s.message());
      }
    }
  }
  return HashPlaced(placed, lengths, after);
}

Status PlannedStore::CheckLocal(size_t part, size_t local, size_t bytes) const {
  if (part >= parts_.size() || local >= parts_[part].buffers.size()) {
    return Status::InvalidArgument("no parameter " + std::to_string(local) + " on part " +
                                   std::to_string(part));
  }
  const TensorSpec& spec = parts_[part].plan.locals()[local].spec;
  if (bytes != spec.ByteSize()) {
    return Status::InvalidArgument("'" + spec.name + "' has " + std::to_string(spec.ByteSize()) +
                                   " bytes, not " + std::to_string(bytes));
  }
  return Status::Ok();
}

Status PlannedStore::ReadLocal(size_t part, size_t local, MutableByteSpan out) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(CheckLocal(part, local, out.size()));
  return parts_[part].memory->Read(parts_[part].buffers[local], out);
}

Status PlannedStore::WriteLocal(size_t part, size_t local, ByteSpan bytes) {
  MutexLock lock(mu_);
  RETURN_IF_ERROR(CheckLocal(part, local, bytes.size()));
  return parts_[part].memory->Write(parts_[part].buffers[local], bytes);
}

}  // namespace deltacast::apply
