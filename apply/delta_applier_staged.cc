// DeltaApplier's staged apply (delta_applier.h): a chunk is checked and decoded
// while the weights are still being served, and written only at commit. Staging
// reads the store and never writes it.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "apply/delta_applier.h"
#include "apply/internal/size_only.h"
#include "codec/partition_codec.h"
#include "common/thread_annotations.h"

namespace deltacast::apply {

using internal::SizeOnly;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif

namespace {

// Makes the pages of `bytes` (a store's memory: a checkpoint's file mapping, or
// host buffers) writable in every page table now, so the commit's write does not
// take a fault per page inside the pause: a shared file mapping's first write to a
// clean page faults into the kernel (and the file system's page_mkwrite) even when
// the page is resident, and under a hypervisor that tracks guest writes the first
// write to a page traps again below the guest kernel, which no madvise reaches.
// On this project's VM that trap was most of a staged commit's write on a
// checkpoint store (bench/apply_path_bench.cc: its pause against a host store's).
// So the kernel faults them in writable (MADV_POPULATE_WRITE; Linux 5.14) and then
// one byte of each page is OR-ed with zero, atomically: a write that changes no
// byte, so an engine serving from them sees nothing. The pages become dirty; a write-back of them
// before the commit writes the same bytes. Read-only mappings are left alone.
void PrepareForWrite(ByteSpan bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  static std::atomic<bool> populate_refused{false};  // the kernel lacks it
  const auto first = reinterpret_cast<uintptr_t>(bytes.data());
  const auto begin = first & ~(page - 1);
  const auto end = first + bytes.size();
  if (end <= first) return;
  if (!populate_refused.load(std::memory_order_relaxed)) {
    if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) != 0) {
      if (errno == EFAULT) return;  // a read-only mapping: nothing will write it here
      if (errno == EINVAL) populate_refused.store(true, std::memory_order_relaxed);
    }
  }
  for (uintptr_t at = first; at < end; at = (at & ~(page - 1)) + page) {
    std::atomic_ref<uint8_t>(*reinterpret_cast<uint8_t*>(at))
        .fetch_or(0, std::memory_order_relaxed);
  }
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
    MutexLock lock(mu_);
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
      PrepareForWrite(
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
  MutexLock lock(mu_);
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
  MutexLock lock(mu_);
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
