#include "apply/delta_applier.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "common/parallel.h"
#include "common/thread_annotations.h"

namespace deltacast::apply {
namespace {
// Decoded records held between the check and the write of one chunk; the rest are
// decoded a second time when written (a chunk of many dense records, say).
constexpr size_t kMaxHeldDecodedBytes = size_t{256} << 20;
}  // namespace

DeltaApplier::DeltaApplier(WeightStore& store, codec::Manifest base_manifest,
                           const codec::DeltaIdentity& identity, ApplyOptions options)
    : store_(store), manifest_(std::move(base_manifest)), identity_(identity), options_(options) {}

Result<DeltaApplier::Located> DeltaApplier::Locate(const codec::PartitionRecord& record) const {
  const std::string name(record.tensor_name);
  const auto index = store_.FindTensor(name);
  if (!index) return Status::NotFound("delta names tensor '" + name + "', which this store lacks");
  const TensorSpec& info = store_.tensors()[*index];
  if (info.dtype != record.dtype) {
    return Status::Corrupt("tensor '" + name + "' is " + std::string(DTypeName(info.dtype)) +
                           " here but " + std::string(DTypeName(record.dtype)) + " in the delta");
  }
  const uint64_t per = codec::PartitionElements(info.dtype, identity_.partition_bytes);
  const uint64_t elements = info.ElementCount();
  if (record.element_offset % per != 0 || record.element_offset >= elements) {
    return Status::Corrupt("tensor '" + name + "': element offset " +
                           std::to_string(record.element_offset) + " is not a partition start");
  }
  const uint64_t expected = std::min(per, elements - record.element_offset);
  if (record.element_count != expected) {
    return Status::Corrupt("tensor '" + name + "': partition at " +
                           std::to_string(record.element_offset) + " has " +
                           std::to_string(expected) + " elements, the delta says " +
                           std::to_string(record.element_count));
  }
  const uint64_t e = ElementSize(info.dtype);
  return Located{*index, record.element_offset / per, record.element_offset * e, expected * e};
}

void DeltaApplier::ForEach(size_t count, const std::function<void(size_t)>& fn) const {
  if (options_.pool) return options_.pool->ParallelFor(count, fn);
  ParallelFor(count, options_.threads ? options_.threads : DefaultThreadCount(), fn);
}

namespace {
uint64_t UndoBytes(const codec::PartitionRecord& record, uint64_t byte_length) {
  const bool whole =
      record.encoding == codec::Encoding::kDenseXor || record.encoding == codec::Encoding::kLiteral;
  return whole ? byte_length : record.change_count * (4 + ElementSize(record.dtype));
}
}  // namespace

bool DeltaApplier::KeepUndo(const codec::PartitionRecord& record, const Located& where) {
  if (!options_.keep_undo) return false;
  // An XOR record (or pieces records all XOR) undoes itself from the spool.
  if (options_.undo_from_records && codec::RecordIsSelfInverse(record.encoding, record.payload)) {
    return false;
  }
  if (!options_.undo_from_records) return true;
  const uint64_t bytes = UndoBytes(record, where.byte_length);
  uint64_t held = undo_bytes_.load();
  do {
    if (held + bytes > kMaxUndoBytes) return false;
  } while (!undo_bytes_.compare_exchange_weak(held, held + bytes));
  return true;
}

void DeltaApplier::ReleaseUndo(const codec::PartitionRecord& record, const Located& where) {
  if (options_.undo_from_records) undo_bytes_ -= UndoBytes(record, where.byte_length);
}

// Waits until no other ApplyChunk holds any of `partitions`, then holds them all.
// All or nothing, so two chunks never wait on each other.
void DeltaApplier::Claim(const std::vector<std::pair<size_t, uint64_t>>& partitions) {
  MutexLock lock(mu_);
  claims_released_.wait(lock, [&]() REQUIRES(mu_) {
    return std::none_of(partitions.begin(), partitions.end(),
                        [&](const auto& p) REQUIRES(mu_) { return claimed_.contains(p); });
  });
  claimed_.insert(partitions.begin(), partitions.end());
}

void DeltaApplier::Release(const std::vector<std::pair<size_t, uint64_t>>& partitions) {
  {
    MutexLock lock(mu_);
    for (const auto& p : partitions) claimed_.erase(p);
  }
  claims_released_.notify_all();
}

Result<std::vector<DeltaApplier::Located>> DeltaApplier::LocateChunk(
    const codec::ChunkView& chunk) const {
  if (!(chunk.identity == identity_)) {
    return Status::VersionMismatch("chunk " + std::to_string(chunk.sequence) +
                                   " belongs to delta " + chunk.identity.base_version.ShortHex() +
                                   " -> " + chunk.identity.target_version.ShortHex() + ", not " +
                                   identity_.base_version.ShortHex() + " -> " +
                                   identity_.target_version.ShortHex());
  }
  if (chunk.kind != codec::ChunkKind::kData) return Status::InvalidArgument("not a data chunk");
  std::vector<Located> located;
  located.reserve(chunk.records.size());
  std::vector<std::pair<size_t, uint64_t>> sorted;  // (tensor, partition index)
  sorted.reserve(chunk.records.size());
  for (const auto& record : chunk.records) {
    ASSIGN_OR_RETURN(Located where, Locate(record));
    located.push_back(where);
    sorted.emplace_back(where.tensor, where.partition_index);
  }
  // Records run in parallel; two for one partition would write the same bytes at once.
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) {
    size_t i = 0;
    while (located[i].tensor != dup->first || located[i].partition_index != dup->second) ++i;
    return Status::Corrupt("chunk " + std::to_string(chunk.sequence) + " names tensor '" +
                           std::string(chunk.records[i].tensor_name) + "' partition at element " +
                           std::to_string(chunk.records[i].element_offset) + " twice");
  }
  return located;
}

Status DeltaApplier::ApplyChunk(const codec::ChunkView& chunk) {
  return ApplyChunk(chunk, nullptr);
}

Status DeltaApplier::ApplyChunk(const codec::ChunkView& chunk, StagedChunk* staged) {
  const auto start = std::chrono::steady_clock::now();
  // Validate everything before the first write.
  ASSIGN_OR_RETURN(std::vector<Located> located, LocateChunk(chunk));
  if (staged && staged->decoded.size() != located.size()) staged = nullptr;
  std::vector<std::pair<size_t, uint64_t>> named;  // (tensor, partition index)
  named.reserve(located.size());
  for (const Located& where : located) named.emplace_back(where.tensor, where.partition_index);
  PartitionAccess* access = store_.partition_access();
  std::vector<MutableByteSpan> targets(access ? 0 : located.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    ASSIGN_OR_RETURN(MutableByteSpan tensor, store_.MutableTensorData(located[i].tensor));
    targets[i] = tensor.subspan(located[i].byte_offset, located[i].byte_length);
  }

  // Chunks of the delta may apply concurrently; one that names a partition another
  // is writing (a replay of the same chunk, say) waits for it.
  Claim(named);
  struct Unclaim {
    DeltaApplier* self;
    const std::vector<std::pair<size_t, uint64_t>>& named;
    ~Unclaim() { self->Release(named); }
  } unclaim{this, named};
  if (access) return ApplyChunkByParts(*access, chunk, located, staged, start);

  // What the manifest says each partition holds. With store_at_manifest a
  // partition at the record's base is written without hashing it first: the
  // write is verified by hashing the stored result (in the same pass), and a
  // mismatch is undone and the partition classified by hashing after all.
  // A partition the manifest has at the record's target was verified there (this
  // applier wrote it, or the store was just hashed) and is skipped.
  enum class Action : char { kUnknown, kSkip, kTorn, kApply };
  std::vector<Action> action(located.size(), Action::kUnknown);
  std::vector<char> presumed_base(located.size(), 0);
  if (options_.store_at_manifest) {
    MutexLock lock(mu_);
    for (size_t i = 0; i < located.size(); ++i) {
      const codec::PartitionRecord& record = chunk.records[i];
      if (torn_.contains(PartitionKey{std::string(record.tensor_name), record.element_offset}))
        continue;
      const PartitionHash& known =
          manifest_.partition_hashes[located[i].tensor][located[i].partition_index];
      presumed_base[i] = known == record.base_hash;
      if (known == record.target_hash) action[i] = Action::kSkip;
    }
  }

  // Check before write: decode and check every record before any byte of the chunk
  // is written. Records checked from the mask alone (XOR, literal) do not read the
  // store here. Overwrite and context-XOR records decode against the base bytes, so
  // a partition not presumed at base is hashed first and decoded only if at base.
  std::vector<Status> errors(located.size());
  std::vector<char> held(located.size(), 0);
  std::atomic<size_t> held_bytes{0};
  std::vector<codec::DecodedRecord> decoded;
  {
    MutexLock lock(mu_);
    if (!decoded_pool_.empty()) {
      decoded = std::move(decoded_pool_.back());
      decoded_pool_.pop_back();
    }
  }
  decoded.resize(std::max(decoded.size(), located.size()));
  struct ReturnDecoded {
    DeltaApplier* self;
    std::vector<codec::DecodedRecord>& decoded;
    ~ReturnDecoded() {
      MutexLock lock(self->mu_);
      self->decoded_pool_.push_back(std::move(decoded));
    }
  } return_decoded{this, decoded};
  auto context = [&](size_t i) {
    return "tensor '" + std::string(chunk.records[i].tensor_name) + "' partition at element " +
           std::to_string(chunk.records[i].element_offset);
  };
  auto classify = [&](size_t i) {
    const codec::PartitionRecord& record = chunk.records[i];
    const PartitionHash current = HashPartition(targets[i]);
    action[i] = current == record.target_hash ? Action::kSkip
                : current == record.base_hash ? Action::kApply
                                              : Action::kTorn;
  };
  ForEach(located.size(), [&](size_t i) {
    thread_local codec::CodecScratch scratch;
    const codec::PartitionRecord& record = chunk.records[i];
    if (staged && staged->held[i]) {
      // Checked and decoded when staged: against the base bytes for the records that
      // need them, which the write verifies (a partition no longer at base is undone
      // and classified, as below).
      std::swap(decoded[i], staged->decoded[i]);
      held[i] = 1;
      return;
    }
    const bool needs_base = codec::RecordNeedsBase(record.encoding);
    if (needs_base && action[i] == Action::kSkip) return;
    if (needs_base && !presumed_base[i]) {
      classify(i);
      if (action[i] != Action::kApply) return;
    }
    errors[i] = codec::DecodeAndCheckRecord(record.Coding(), targets[i], decoded[i], scratch)
                    .WithContext(context(i));
    if (!errors[i].ok() && needs_base && presumed_base[i]) {
      // Decoded against bytes presumed at base: refuse only if they really are.
      classify(i);
      if (action[i] != Action::kApply) {
        errors[i] = Status::Ok();
        return;
      }
      errors[i] = codec::DecodeAndCheckRecord(record.Coding(), targets[i], decoded[i], scratch)
                      .WithContext(context(i));
    }
    // What does not fit the budget is decoded again when written.
    const size_t bytes = decoded[i].MemoryBytes();
    if (held_bytes.fetch_add(bytes) + bytes <= kMaxHeldDecodedBytes) {
      held[i] = 1;
    } else {
      held_bytes -= bytes;
      decoded[i] = codec::DecodedRecord{};
    }
  });
  for (size_t i = 0; i < located.size(); ++i) {
    if (!errors[i].ok()) return Refuse(chunk.sequence, errors[i]);
  }
  const auto checked = std::chrono::steady_clock::now();

  std::atomic<uint64_t> applied{0}, skipped{0}, changed{0};
  ChunkOutcome outcome(located.size(), options_.keep_undo);
  outcome.check_seconds = std::chrono::duration<double>(checked - start).count();
  std::vector<char>&torn = outcome.torn, &patched = outcome.patched, &kept = outcome.kept;
  std::vector<Undo>& undo = outcome.undo;
  ForEach(located.size(), [&](size_t i) {
    thread_local codec::CodecScratch scratch;
    const codec::PartitionRecord& record = chunk.records[i];
    const bool presumed = action[i] == Action::kUnknown && presumed_base[i];
    if (action[i] == Action::kUnknown && !presumed) classify(i);
    if (action[i] == Action::kSkip) {
      ++skipped;
      return;
    }
    if (action[i] == Action::kTorn) {
      torn[i] = 1;
      return;
    }
    const bool whole = record.encoding == codec::Encoding::kDenseXor ||
                       record.encoding == codec::Encoding::kLiteral;
    const bool keep = KeepUndo(record, located[i]);
    if (keep && whole) undo[i].old_bytes.assign(targets[i].begin(), targets[i].end());
    errors[i] =
        (held[i] ? codec::ApplyDecodedRecord(decoded[i], targets[i], record.target_hash, scratch)
                 : codec::ApplyEncodedPartition(record.Coding(), targets[i], scratch))
            .WithContext(context(i));
    if (!errors[i].ok() && presumed) {
      // Not at base after all (the bytes are exactly as they were): at target, or torn.
      classify(i);
      errors[i] = Status::Ok();
      if (action[i] != Action::kApply && keep) ReleaseUndo(record, located[i]);
      if (action[i] == Action::kSkip) {
        ++skipped;
        return;
      }
      if (action[i] == Action::kTorn) {
        torn[i] = 1;
        return;
      }
      errors[i] = Status::Internal(
                      "partition at its base hash did not reach its target with a "
                      "record checked to lead there")
                      .WithContext(context(i));
    }
    if (!errors[i].ok() && keep) ReleaseUndo(record, located[i]);
    if (errors[i].ok()) {
      if (keep) {
        kept[i] = 1;
        undo[i].where = located[i];
        undo[i].base_hash = record.base_hash;
        undo[i].target_hash = record.target_hash;
        if (!whole) undo[i].xors = held[i] ? decoded[i].changes : scratch.decoded.changes;
      }
      patched[i] = 1;
      ++applied;
      changed += record.change_count;
    }
  });

  outcome.errors = std::move(errors);
  outcome.applied = applied;
  outcome.skipped = skipped;
  outcome.changed = changed;
  outcome.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - checked).count();
  return Conclude(chunk, located, outcome, start);
}

Status DeltaApplier::Refuse(uint32_t sequence, const Status& error) {
  MutexLock lock(mu_);
  refused_.insert(sequence);
  report_.refused_chunks++;
  return error.WithContext("chunk " + std::to_string(sequence) + " refused, nothing written");
}

Status DeltaApplier::Conclude(const codec::ChunkView& chunk, const std::vector<Located>& located,
                              ChunkOutcome& outcome, std::chrono::steady_clock::time_point start) {
  const std::vector<Status>& errors = outcome.errors;
  MutexLock lock(mu_);
  Status first_error;
  for (size_t i = 0; i < located.size(); ++i) {
    const bool torn = outcome.torn[i], patched = outcome.patched[i], kept = outcome.kept[i];
    const auto& record = chunk.records[i];
    if (torn)
      torn_[PartitionKey{std::string(record.tensor_name), record.element_offset}] =
          record.target_hash;
    if (patched) dirty_.push_back(located[i]);
    if (patched && kept) undo_.push_back(std::move(outcome.undo[i]));
    if (errors[i].ok() && !torn) {
      manifest_.partition_hashes[located[i].tensor][located[i].partition_index] =
          record.target_hash;
    }
    if (!errors[i].ok() && first_error.ok()) first_error = errors[i];
  }
  sequences_seen_.insert(chunk.sequence);
  refused_.erase(chunk.sequence);
  report_.chunks++;
  report_.records += chunk.records.size();
  report_.applied += outcome.applied;
  report_.already_at_target += outcome.skipped;
  report_.changed_elements += outcome.changed;
  report_.chunk_bytes += chunk.size_bytes;
  report_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report_.check_seconds += outcome.check_seconds;
  report_.write_seconds += outcome.write_seconds;
  return first_error;
}

Result<codec::Manifest> DeltaApplier::Finish(const codec::DeltaSummary& summary) {
  MutexLock lock(mu_);
  report_.torn.clear();
  for (const auto& [key, hash] : torn_) report_.torn.push_back(key);
  if (sequences_seen_.size() != summary.data_chunks ||
      (!sequences_seen_.empty() && *sequences_seen_.rbegin() >= summary.data_chunks)) {
    return Status::FailedPrecondition("delta incomplete: received " +
                                      std::to_string(sequences_seen_.size()) + " of " +
                                      std::to_string(summary.data_chunks) + " data chunks");
  }
  if (options_.flush_on_finish) {
    for (const Located& p : dirty_)
      RETURN_IF_ERROR(store_.Flush(p.tensor, p.byte_offset, p.byte_length));
    dirty_.clear();
  }
  if (!torn_.empty()) {
    const PartitionKey& first = torn_.begin()->first;
    return Status::FailedPrecondition(
        std::to_string(torn_.size()) + " partition(s) are torn (neither base nor target), e.g. '" +
        first.tensor + "' at element " + std::to_string(first.element_offset) +
        "; they need repair with literal target bytes");
  }
  if (manifest_.VersionId() != identity_.target_version) {
    return Status::Corrupt("after applying every chunk the store is not at the target version " +
                           identity_.target_version.ShortHex() +
                           ": the delta does not lead from this base to that target");
  }
  return manifest_;
}

void DeltaApplier::MarkApplied(uint32_t sequence) {
  MutexLock lock(mu_);
  sequences_seen_.insert(sequence);
}

Status DeltaApplier::FlushApplied() {
  MutexLock lock(mu_);
  for (const Located& p : dirty_)
    RETURN_IF_ERROR(store_.Flush(p.tensor, p.byte_offset, p.byte_length));
  dirty_.clear();
  return Status::Ok();
}

Status DeltaApplier::Rollback() {
  MutexLock lock(mu_);
  if (!options_.keep_undo)
    return Status::FailedPrecondition("rollback needs ApplyOptions::keep_undo");
  if (repaired_)
    return Status::FailedPrecondition("partitions repaired with literal bytes cannot roll back");
  if (PartitionAccess* access = store_.partition_access()) return RollbackByParts(*access);
  for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) {
    ASSIGN_OR_RETURN(MutableByteSpan tensor, store_.MutableTensorData(it->where.tensor));
    MutableByteSpan bytes = tensor.subspan(it->where.byte_offset, it->where.byte_length);
    const PartitionHash current = HashPartition(bytes);
    if (current == it->base_hash) continue;
    if (current != it->target_hash) {
      return Status::FailedPrecondition("cannot roll back partition of tensor " +
                                        store_.tensors()[it->where.tensor].name +
                                        ": it is at neither base nor target");
    }
    if (!it->old_bytes.empty()) {
      std::copy(it->old_bytes.begin(), it->old_bytes.end(), bytes.begin());
    } else {
      const uint32_t e = it->xors.element_size;
      for (size_t i = 0; i < it->xors.size(); ++i) {
        std::byte* dst = bytes.data() + size_t{it->xors.positions[i]} * e;
        for (uint32_t k = 0; k < e; ++k) dst[k] ^= it->xors.xors[i * e + k];
      }
    }
    if (HashPartition(bytes) != it->base_hash) {
      return Status::Internal("rollback of tensor " + store_.tensors()[it->where.tensor].name +
                              " did not restore its base hash");
    }
    const size_t p = it->where.partition_index;
    manifest_.partition_hashes[it->where.tensor][p] = it->base_hash;
    RETURN_IF_ERROR(store_.Flush(it->where.tensor, it->where.byte_offset, it->where.byte_length));
  }
  undo_.clear();
  dirty_.clear();
  return Status::Ok();
}

codec::Manifest DeltaApplier::current_manifest() const {
  MutexLock lock(mu_);
  return manifest_;
}

std::vector<PartitionKey> DeltaApplier::torn() const {
  MutexLock lock(mu_);
  std::vector<PartitionKey> out;
  for (const auto& [key, hash] : torn_) out.push_back(key);
  return out;
}

Status DeltaApplier::RevertChunk(const codec::ChunkView& chunk,
                                 std::vector<NeedsBase>& needs_base) {
  if (!(chunk.identity == identity_))
    return Status::VersionMismatch("chunk belongs to another delta");
  codec::CodecScratch scratch;
  for (const auto& record : chunk.records) {
    ASSIGN_OR_RETURN(Located where, Locate(record));
    if (PartitionAccess* access = store_.partition_access()) {
      RETURN_IF_ERROR(RevertByParts(*access, record, where, needs_base));
      continue;
    }
    ASSIGN_OR_RETURN(MutableByteSpan tensor, store_.MutableTensorData(where.tensor));
    MutableByteSpan bytes = tensor.subspan(where.byte_offset, where.byte_length);
    const PartitionHash current = HashPartition(bytes);
    if (current == record.base_hash) continue;
    const bool self_inverse = codec::RecordIsSelfInverse(record.encoding, record.payload);
    if (current == record.target_hash && self_inverse) {
      // Applying an XOR record to the target gives the base.
      codec::RecordCoding back = record.Coding();
      back.base_hash = record.target_hash;
      back.target_hash = record.base_hash;
      if (codec::ApplyEncodedPartition(back, bytes, scratch).ok()) {
        RETURN_IF_ERROR(store_.Flush(where.tensor, where.byte_offset, where.byte_length));
        MutexLock lock(mu_);
        manifest_.partition_hashes[where.tensor][where.partition_index] = record.base_hash;
        continue;
      }
    }
    needs_base.push_back({PartitionKey{std::string(record.tensor_name), record.element_offset},
                          record.base_hash, where.byte_length});
  }
  return Status::Ok();
}

Status DeltaApplier::WriteVerified(const PartitionKey& key, ByteSpan bytes,
                                   const PartitionHash& expected_hash) {
  const auto index = store_.FindTensor(key.tensor);
  if (!index) return Status::NotFound("no tensor '" + key.tensor + "'");
  const TensorSpec& info = store_.tensors()[*index];
  const uint64_t per = codec::PartitionElements(info.dtype, identity_.partition_bytes);
  const uint64_t e = ElementSize(info.dtype);
  if (key.element_offset % per != 0 || key.element_offset >= info.ElementCount()) {
    return Status::InvalidArgument("'" + key.tensor + "' has no partition at element " +
                                   std::to_string(key.element_offset));
  }
  const uint64_t length = std::min(per, info.ElementCount() - key.element_offset) * e;
  if (bytes.size() != length || HashPartition(bytes) != expected_hash) {
    return Status::Corrupt("bytes for '" + key.tensor + "' at element " +
                           std::to_string(key.element_offset) +
                           " do not hash to what was asked for");
  }
  RETURN_IF_ERROR(WriteBytes(*index, key.element_offset * e, bytes));
  RETURN_IF_ERROR(store_.Flush(*index, key.element_offset * e, length));
  MutexLock lock(mu_);
  manifest_.partition_hashes[*index][key.element_offset / per] = expected_hash;
  return Status::Ok();
}

Status DeltaApplier::WriteBytes(size_t tensor, uint64_t offset, ByteSpan bytes) {
  if (PartitionAccess* access = store_.partition_access()) {
    return access->WritePartition(tensor, offset, bytes);
  }
  ASSIGN_OR_RETURN(MutableByteSpan data, store_.MutableTensorData(tensor));
  std::copy(bytes.begin(), bytes.end(), data.begin() + static_cast<ptrdiff_t>(offset));
  return Status::Ok();
}

PartitionHash DeltaApplier::TornTargetHash(const PartitionKey& key) const {
  MutexLock lock(mu_);
  auto it = torn_.find(key);
  return it == torn_.end() ? PartitionHash{} : it->second;
}

bool DeltaApplier::WasRefused(uint32_t sequence) const {
  MutexLock lock(mu_);
  return refused_.contains(sequence);
}

bool DeltaApplier::HasRefusedChunks() const {
  MutexLock lock(mu_);
  return !refused_.empty();
}

Status DeltaApplier::Repair(const PartitionKey& key, ByteSpan literal) {
  MutexLock lock(mu_);
  auto it = torn_.find(key);
  if (it == torn_.end()) {
    return Status::NotFound("no torn partition '" + key.tensor + "' at element " +
                            std::to_string(key.element_offset));
  }
  const auto index = store_.FindTensor(key.tensor);
  const TensorSpec& info = store_.tensors()[*index];
  const uint64_t per = codec::PartitionElements(info.dtype, identity_.partition_bytes);
  const uint64_t e = ElementSize(info.dtype);
  const uint64_t length = std::min(per, info.ElementCount() - key.element_offset) * e;
  if (literal.size() != length || HashPartition(literal) != it->second) {
    return Status::Corrupt("repair bytes for '" + key.tensor + "' at element " +
                           std::to_string(key.element_offset) + " do not hash to the target");
  }
  RETURN_IF_ERROR(WriteBytes(*index, key.element_offset * e, literal));
  RETURN_IF_ERROR(store_.Flush(*index, key.element_offset * e, length));
  manifest_.partition_hashes[*index][key.element_offset / per] = it->second;
  torn_.erase(it);
  repaired_ = true;
  ++report_.applied;
  return Status::Ok();
}

Status DeltaApplier::RepairFrom(const WeightStore& source, const PartitionKey& key) {
  const auto index = source.FindTensor(key.tensor);
  const auto mine = store_.FindTensor(key.tensor);
  if (!index || !mine || !(source.tensors()[*index] == store_.tensors()[*mine])) {
    return Status::NotFound("repair source lacks tensor '" + key.tensor + "' with the same shape");
  }
  const TensorSpec& info = source.tensors()[*index];
  const uint64_t per = codec::PartitionElements(info.dtype, identity_.partition_bytes);
  const uint64_t e = ElementSize(info.dtype);
  const uint64_t count = std::min(per, info.ElementCount() - key.element_offset);
  return Repair(key, source.TensorData(*index).subspan(key.element_offset * e, count * e));
}

}  // namespace deltacast::apply
