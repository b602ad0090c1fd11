// DeltaApplier for stores reached through PartitionAccess (GPU memory; canonical
// tensors split over GPUs by a load plan). The rules are those of delta_applier.cc:
// skip at target, patch at base, report torn otherwise, check every record before
// any byte of the chunk is written, undo a write whose result misses the target.
// What differs is where the work runs: records are decoded and checked on the host
// (O(changes)), the writes of a whole chunk go down in one ApplyPatches call, and
// hashes are computed where the bytes lie; the old bytes of a partition cross to the
// host only where a record needs them (overwrite and context-XOR decode against them;
// dense and literal records keep what they replace).
#include <algorithm>

#include "apply/delta_applier.h"
#include "apply/internal/size_only.h"
#include "codec/partition_codec.h"
#include "common/thread_annotations.h"

namespace deltacast::apply {
namespace {

using internal::SizeOnly;

bool IsWhole(codec::Encoding encoding) {
  return encoding == codec::Encoding::kDenseXor || encoding == codec::Encoding::kLiteral;
}

}  // namespace

Status DeltaApplier::ApplyChunkByParts(PartitionAccess& access, const codec::ChunkView& chunk,
                                       const std::vector<Located>& located, StagedChunk* staged,
                                       std::chrono::steady_clock::time_point start) {
  const size_t n = located.size();
  enum class Action : char { kUnknown, kSkip, kTorn, kApply };
  std::vector<Action> action(n, Action::kUnknown);
  std::vector<char> presumed(n, 0);
  if (options_.store_at_manifest) {
    MutexLock lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      const codec::PartitionRecord& record = chunk.records[i];
      if (torn_.contains(PartitionKey{std::string(record.tensor_name), record.element_offset}))
        continue;
      const PartitionHash& known =
          manifest_.partition_hashes[located[i].tensor][located[i].partition_index];
      if (known == record.target_hash) {
        action[i] = Action::kSkip;
      } else if (known == record.base_hash) {
        action[i] = Action::kApply;
        presumed[i] = 1;
      }
    }
  }
  auto context = [&](size_t i) {
    return "tensor '" + std::string(chunk.records[i].tensor_name) + "' partition at element " +
           std::to_string(chunk.records[i].element_offset);
  };
  auto classify = [&](size_t i) -> Status {
    const codec::PartitionRecord& record = chunk.records[i];
    ASSIGN_OR_RETURN(
        PartitionHash current,
        access.HashPartition(located[i].tensor, located[i].byte_offset, located[i].byte_length));
    action[i] = current == record.target_hash ? Action::kSkip
                : current == record.base_hash ? Action::kApply
                                              : Action::kTorn;
    presumed[i] = 0;
    return Status::Ok();
  };
  for (size_t i = 0; i < n; ++i) {
    if (action[i] == Action::kUnknown) RETURN_IF_ERROR(classify(i));
  }

  // Check before write. Old bytes come to the host only where a record needs them.
  std::vector<codec::DecodedRecord> decoded(n);
  std::vector<std::vector<std::byte>> old(n);
  std::vector<Status> errors(n);
  auto decode = [&](size_t i) {
    thread_local codec::CodecScratch scratch;
    const codec::PartitionRecord& record = chunk.records[i];
    const Located& where = located[i];
    // Decoded when staged (against the base bytes where the record needs them).
    const bool from_stage = staged && staged->held[i];
    if ((codec::RecordNeedsBase(record.encoding) && !from_stage) || IsWhole(record.encoding)) {
      // Dense and literal records keep what they replace, to undo a missed target.
      old[i].resize(where.byte_length);
      errors[i] = access.ReadPartition(where.tensor, where.byte_offset, old[i]);
      if (!errors[i].ok()) return;
    }
    if (from_stage) return std::swap(decoded[i], staged->decoded[i]);
    const ByteSpan base = old[i].empty() ? SizeOnly(where.byte_length) : ByteSpan(old[i]);
    errors[i] = codec::DecodeAndCheckRecord(record.Coding(), base, decoded[i], scratch)
                    .WithContext(context(i));
  };
  ForEach(n, [&](size_t i) {
    if (action[i] == Action::kApply) decode(i);
  });
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].ok() && presumed[i] && codec::RecordNeedsBase(chunk.records[i].encoding)) {
      // Decoded against bytes presumed at base: refuse only if they really are.
      RETURN_IF_ERROR(classify(i));
      errors[i] = Status::Ok();
      if (action[i] == Action::kApply) decode(i);
    }
    if (!errors[i].ok()) return Refuse(chunk.sequence, errors[i]);
  }

  // One write for the chunk, then each partition's hash after it.
  std::vector<PartitionAccess::Patch> patches;
  std::vector<size_t> patched_record;
  for (size_t i = 0; i < n; ++i) {
    if (action[i] != Action::kApply) continue;
    patches.push_back(
        {located[i].tensor, located[i].byte_offset, located[i].byte_length, &decoded[i]});
    patched_record.push_back(i);
  }
  std::vector<PartitionHash> after(patches.size());
  if (!patches.empty()) {
    const Status s = access.ApplyPatches(patches, after);
    if (s.code() == StatusCode::kCorrupt) return Refuse(chunk.sequence, s);
    RETURN_IF_ERROR(s);
  }

  ChunkOutcome outcome(n, options_.keep_undo);
  for (size_t i = 0; i < n; ++i) {
    if (action[i] == Action::kSkip) ++outcome.skipped;
    if (action[i] == Action::kTorn) outcome.torn[i] = 1;
  }
  // A result that misses the target is undone: XOR forms by applying them again,
  // literal records by writing back what they replaced.
  std::vector<PartitionAccess::Patch> undo_xor;
  for (size_t k = 0; k < patches.size(); ++k) {
    const size_t i = patched_record[k];
    const codec::PartitionRecord& record = chunk.records[i];
    if (after[k] == record.target_hash) {
      outcome.patched[i] = 1;
      ++outcome.applied;
      outcome.changed += record.change_count;
      if (KeepUndo(record, located[i])) {
        Undo& u = outcome.undo[i];
        outcome.kept[i] = 1;
        u.where = located[i];
        u.base_hash = record.base_hash;
        u.target_hash = record.target_hash;
        if (IsWhole(record.encoding)) {
          u.old_bytes = std::move(old[i]);
        } else {
          u.xors = std::move(decoded[i].changes);
        }
      }
      continue;
    }
    if (decoded[i].form == codec::DecodedRecord::Form::kWholeTarget) {
      RETURN_IF_ERROR(access.WritePartition(located[i].tensor, located[i].byte_offset, old[i]));
    } else {
      undo_xor.push_back(patches[k]);
    }
  }
  if (!undo_xor.empty()) {
    std::vector<PartitionHash> back(undo_xor.size());
    RETURN_IF_ERROR(access.ApplyPatches(undo_xor, back));
  }
  for (size_t k = 0; k < patches.size(); ++k) {
    const size_t i = patched_record[k];
    if (outcome.patched[i]) continue;
    if (presumed[i]) {
      // Not at base after all (the bytes are as they were): at target, or torn.
      RETURN_IF_ERROR(classify(i));
      if (action[i] == Action::kSkip) {
        ++outcome.skipped;
        continue;
      }
      if (action[i] == Action::kTorn) {
        outcome.torn[i] = 1;
        continue;
      }
    }
    outcome.errors[i] = Status::Corrupt(
                            "partition at its base hash did not reach its target hash with a "
                            "record checked to lead there (undone)")
                            .WithContext(context(i));
  }
  return Conclude(chunk, located, outcome, start);
}

Status DeltaApplier::RollbackByParts(PartitionAccess& access) {
  for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) {
    const Located& where = it->where;
    const std::string& name = store_.tensors()[where.tensor].name;
    ASSIGN_OR_RETURN(PartitionHash current,
                     access.HashPartition(where.tensor, where.byte_offset, where.byte_length));
    if (current == it->base_hash) continue;
    if (current != it->target_hash) {
      return Status::FailedPrecondition("cannot roll back partition of tensor " + name +
                                        ": it is at neither base nor target");
    }
    PartitionHash now;
    if (!it->old_bytes.empty()) {
      RETURN_IF_ERROR(access.WritePartition(where.tensor, where.byte_offset, it->old_bytes));
      ASSIGN_OR_RETURN(now,
                       access.HashPartition(where.tensor, where.byte_offset, where.byte_length));
    } else {
      codec::DecodedRecord back;
      back.changes = it->xors;
      const PartitionAccess::Patch patch{where.tensor, where.byte_offset, where.byte_length, &back};
      RETURN_IF_ERROR(access.ApplyPatches({&patch, 1}, {&now, 1}));
    }
    if (now != it->base_hash) {
      return Status::Internal("rollback of tensor " + name + " did not restore its base hash");
    }
    manifest_.partition_hashes[where.tensor][where.partition_index] = it->base_hash;
  }
  undo_.clear();
  dirty_.clear();
  return Status::Ok();
}

Status DeltaApplier::RevertByParts(PartitionAccess& access, const codec::PartitionRecord& record,
                                   const Located& where, std::vector<NeedsBase>& needs_base) {
  ASSIGN_OR_RETURN(PartitionHash current,
                   access.HashPartition(where.tensor, where.byte_offset, where.byte_length));
  if (current == record.base_hash) return Status::Ok();
  if (current == record.target_hash &&
      codec::RecordIsSelfInverse(record.encoding, record.payload)) {
    // Applying an XOR record to the target gives the base.
    codec::RecordCoding back = record.Coding();
    back.base_hash = record.target_hash;
    back.target_hash = record.base_hash;
    codec::CodecScratch scratch;
    codec::DecodedRecord decoded;
    if (codec::DecodeAndCheckRecord(back, SizeOnly(where.byte_length), decoded, scratch).ok()) {
      const PartitionAccess::Patch patch{where.tensor, where.byte_offset, where.byte_length,
                                         &decoded};
      PartitionHash now;
      RETURN_IF_ERROR(access.ApplyPatches({&patch, 1}, {&now, 1}));
      if (now == record.base_hash) {
        MutexLock lock(mu_);
        manifest_.partition_hashes[where.tensor][where.partition_index] = record.base_hash;
        return Status::Ok();
      }
      // The bytes changed under us: put them back as they were.
      RETURN_IF_ERROR(access.ApplyPatches({&patch, 1}, {&now, 1}));
    }
  }
  needs_base.push_back({PartitionKey{std::string(record.tensor_name), record.element_offset},
                        record.base_hash, where.byte_length});
  return Status::Ok();
}

}  // namespace deltacast::apply
