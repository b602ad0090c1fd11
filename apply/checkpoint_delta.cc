#include "apply/checkpoint_delta.h"

#include <chrono>
#include <set>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/delta_file.h"
#include "apply/replica.h"
#include "common/elapsed.h"
#include "common/parallel.h"

namespace deltacast::apply {
namespace {

using Clock = std::chrono::steady_clock;
}  // namespace

Result<DiffResult> DiffCheckpoints(const std::filesystem::path& base_dir,
                                   const std::filesystem::path& new_dir,
                                   const std::filesystem::path& out_file,
                                   const DiffOptions& options) {
  using Access = CheckpointDirStore::Access;
  auto base_store = CheckpointDirStore::Open(base_dir, Access::kReadOnly);
  if (!base_store.ok()) return base_store.status().WithContext("base checkpoint");
  auto new_store = CheckpointDirStore::Open(new_dir, Access::kReadOnly);
  if (!new_store.ok()) return new_store.status().WithContext("new checkpoint");
  if ((*base_store)->LayoutId() != (*new_store)->LayoutId()) {
    return Status::Unsupported("the checkpoints " + base_dir.string() + " and " + new_dir.string() +
                               " differ in file layout (file names, safetensors headers or index); "
                               "a delta carries tensor bytes only");
  }
  const size_t threads = options.encoder.threads ? options.encoder.threads : DefaultThreadCount();

  DiffResult result;
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(codec::Manifest base_manifest,
                   CheckpointState(base_dir).LoadOrComputeManifest(
                       **base_store, options.partition_bytes, threads));
  ASSIGN_OR_RETURN(codec::Manifest new_manifest,
                   CheckpointState(new_dir).LoadOrComputeManifest(
                       **new_store, options.partition_bytes, threads));
  result.manifest_seconds = SecondsSince<Clock>(t0);
  result.identity = {base_manifest.VersionId(), new_manifest.VersionId(), options.partition_bytes};

  ASSIGN_OR_RETURN(auto writer, DeltaFileWriter::Create(out_file));
  const CheckpointDirStore& a = **base_store;
  const CheckpointDirStore& b = **new_store;
  RETURN_IF_ERROR(codec::EncodeDelta(
      base_manifest, new_manifest, RangeReaderOf(a), RangeReaderOf(b), b.LayoutId(),
      options.encoder, [&](std::vector<std::byte>&& chunk) { return writer->Append(chunk); },
      &result.stats));
  RETURN_IF_ERROR(writer->Finish());
  return result;
}

namespace {

// Reads the whole delta file once, validating every chunk, the sequence numbers
// and the END chunk, so that a file corrupt anywhere is refused before the first
// byte of the store is written. Returns the identity and the END summary.
Result<std::pair<codec::DeltaIdentity, codec::DeltaSummary>> ValidateDeltaFile(
    const std::filesystem::path& delta_file) {
  ASSIGN_OR_RETURN(auto reader, DeltaFileReader::Open(delta_file));
  std::optional<codec::DeltaIdentity> identity;
  std::optional<codec::DeltaSummary> summary;
  std::set<uint32_t> sequences;
  uint64_t records = 0;
  for (;;) {
    ASSIGN_OR_RETURN(auto bytes, reader->Next());
    if (!bytes) break;
    auto chunk = codec::ParseChunk(*bytes);
    if (!chunk.ok()) return chunk.status().WithContext(delta_file.string());
    if (summary) return Status::Corrupt(delta_file.string() + ": chunks follow the END chunk");
    if (identity && !(chunk->identity == *identity)) {
      return Status::Corrupt(delta_file.string() + ": chunk " + std::to_string(chunk->sequence) +
                             " belongs to another delta");
    }
    identity = chunk->identity;
    if (chunk->kind == codec::ChunkKind::kEnd) {
      summary = chunk->summary;
    } else if (!sequences.insert(chunk->sequence).second) {
      return Status::Corrupt(delta_file.string() + ": chunk " + std::to_string(chunk->sequence) +
                             " appears twice");
    } else {
      records += chunk->records.size();
    }
  }
  if (!identity) return Status::Corrupt(delta_file.string() + " holds no chunks");
  if (!summary) return Status::Corrupt(delta_file.string() + " ends without an END chunk");
  if (sequences.size() != summary->data_chunks || records != summary->records ||
      (!sequences.empty() && *sequences.rbegin() + 1 != summary->data_chunks)) {
    return Status::Corrupt(delta_file.string() + ": holds " + std::to_string(sequences.size()) +
                           " data chunks and " + std::to_string(records) +
                           " records, its END chunk says " + std::to_string(summary->data_chunks) +
                           " and " + std::to_string(summary->records));
  }
  return std::pair{*identity, *summary};
}

}  // namespace

Result<PatchResult> PatchCheckpoint(const std::filesystem::path& dir,
                                    const std::filesystem::path& delta_file,
                                    const PatchOptions& options) {
  ASSIGN_OR_RETURN(auto validated, ValidateDeltaFile(delta_file));
  const auto& [identity, summary] = validated;

  ASSIGN_OR_RETURN(auto replica,
                   Replica::OpenCheckpointDir(dir, identity.partition_bytes, options.threads));
  PatchResult result;
  result.identity = identity;
  if (!replica->inflight() && replica->version() == identity.target_version) {
    result.outcome = PatchResult::Outcome::kAlreadyAtTarget;
    return result;
  }
  if (!summary.target_layout.IsZero() && summary.target_layout != replica->store().LayoutId()) {
    return Status::Corrupt("the delta's target layout differs from " + dir.string() + "'s layout");
  }
  if (replica->inflight()) result.outcome = PatchResult::Outcome::kResumed;
  ASSIGN_OR_RETURN(auto applier, replica->Begin(identity, ApplyOptions{options.threads}));

  // Second pass: apply. Every chunk was validated above; a file that changes
  // between the passes still fails its chunk checksums here.
  ASSIGN_OR_RETURN(auto reader, DeltaFileReader::Open(delta_file));
  for (;;) {
    ASSIGN_OR_RETURN(auto bytes, reader->Next());
    if (!bytes) break;
    ASSIGN_OR_RETURN(codec::ChunkView chunk, codec::ParseChunk(*bytes));
    if (chunk.kind == codec::ChunkKind::kData) RETURN_IF_ERROR(applier->ApplyChunk(chunk));
  }
  if (!options.repair_from.empty() && !applier->torn().empty()) {
    ASSIGN_OR_RETURN(auto source, CheckpointDirStore::Open(options.repair_from,
                                                           CheckpointDirStore::Access::kReadOnly));
    for (const PartitionKey& key : applier->torn())
      RETURN_IF_ERROR(applier->RepairFrom(*source, key));
  }
  auto target = applier->Finish(summary);
  result.report = applier->report();
  if (!target.ok()) return target.status();
  RETURN_IF_ERROR(replica->Commit(*target));
  return result;
}

}  // namespace deltacast::apply
