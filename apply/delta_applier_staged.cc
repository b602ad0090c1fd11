// DeltaApplier's staged apply (delta_applier.h): a chunk is checked and decoded
// while the weights are still being served, and written only at commit. Staging
// reads the store and never writes it.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "apply/delta_applier.h"
#include "apply/internal/size_only.h"
#include "codec/partition_codec.h"

namespace deltacast::apply {

using internal::SizeOnly;

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older C libraries lack the name
#endif

namespace {

// Maps the pages of `bytes` (a store's memory: a checkpoint's file mapping, or host
// buffers) into the page tables now, for reading: the commit's write then finds them
// there instead of faulting each page in inside the pause. Reading does not disturb
// an engine serving from them. Best effort: older kernels refuse, and nothing else
// depends on it.
void FaultInForWrite(ByteSpan bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data()) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
}

}  // namespace

Result<StagedChunk> DeltaApplier::StageChunk(const codec::ChunkView& chunk,
                                             std::atomic<int64_t>& budget) {
  ASSIGN_OR_RETURN(std::vector<Located> located, LocateChunk(chunk));
  const size_t n = located.size();
  StagedChunk staged;
  staged.sequence = chunk.sequence;
  staged.decoded.resize(n);
  staged.held.assign(n, 0);
  // Which partitions the manifest has at their record's base: only those are
  // decoded against the stored bytes.
  std::vector<char> at_base(n, 0);
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      at_base[i] = manifest_.partition_hashes[located[i].tensor][located[i].partition_index] ==
                   chunk.records[i].base_hash;
    }
  }
  PartitionAccess* access = store_.partition_access();
  std::vector<Status> errors(n);
  std::atomic<uint64_t> held_bytes{0};
  ForEach(n, [&](size_t i) {
    thread_local codec::CodecScratch scratch;
    thread_local std::vector<std::byte> read;
    const codec::PartitionRecord& record = chunk.records[i];
    const Located& where = located[i];
    const bool needs_base = codec::RecordNeedsBase(record.encoding);
    // Not at base: this record decodes when written, once its partition is classified.
    if (needs_base && !at_base[i]) return;
    if (!access) {
      FaultInForWrite(
          store_.TensorData(where.tensor).subspan(where.byte_offset, where.byte_length));
    }
    ByteSpan base = SizeOnly(where.byte_length);
    if (needs_base && access) {
      read.resize(where.byte_length);
      errors[i] = access->ReadPartition(where.tensor, where.byte_offset, read);
      if (!errors[i].ok()) return;
      base = read;
    } else if (needs_base) {
      base = store_.TensorData(where.tensor).subspan(where.byte_offset, where.byte_length);
    }
    codec::DecodedRecord& out = staged.decoded[i];
    errors[i] = codec::DecodeAndCheckRecord(record.Coding(), base, out, scratch)
                    .WithContext("tensor '" + std::string(record.tensor_name) +
                                 "' partition at element " + std::to_string(record.element_offset));
    if (!errors[i].ok() && needs_base && HashPartition(base) != record.base_hash) {
      // The manifest was wrong about these bytes: classified when written.
      errors[i] = Status::Ok();
      out = codec::DecodedRecord{};
      return;
    }
    if (!errors[i].ok()) return;
    // What does not fit the budget is decoded again when written.
    const auto bytes = static_cast<int64_t>(out.MemoryBytes());
    if (budget.fetch_sub(bytes) >= bytes) {
      staged.held[i] = 1;
      held_bytes += static_cast<uint64_t>(bytes);
    } else {
      budget += bytes;
      out = codec::DecodedRecord{};
    }
  });
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].ok()) {
      budget += static_cast<int64_t>(held_bytes.load());
      return Refuse(chunk.sequence, errors[i]);
    }
  }
  staged.held_bytes = held_bytes;
  std::lock_guard lock(mu_);
  if (!staged_target_) staged_target_ = manifest_;
  for (size_t i = 0; i < n; ++i) {
    staged_target_->partition_hashes[located[i].tensor][located[i].partition_index] =
        chunk.records[i].target_hash;
  }
  staged_seen_.insert(chunk.sequence);
  refused_.erase(chunk.sequence);
  return staged;
}

Result<codec::Manifest> DeltaApplier::FinishStaged(const codec::DeltaSummary& summary) {
  std::lock_guard lock(mu_);
  if (staged_seen_.size() != summary.data_chunks ||
      (!staged_seen_.empty() && *staged_seen_.rbegin() >= summary.data_chunks)) {
    return Status::FailedPrecondition("delta incomplete: staged " +
                                      std::to_string(staged_seen_.size()) + " of " +
                                      std::to_string(summary.data_chunks) + " data chunks");
  }
  codec::Manifest target = staged_target_ ? *staged_target_ : manifest_;
  if (target.VersionId() != identity_.target_version) {
    return Status::Corrupt("the staged records do not lead from this base to the target version " +
                           identity_.target_version.ShortHex());
  }
  return target;
}

}  // namespace deltacast::apply
