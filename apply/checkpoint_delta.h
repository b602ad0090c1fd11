// Whole-directory delta operations behind `deltacast diff` and `deltacast patch`:
// encode the delta between two checkpoint directories into a delta file, and apply
// a delta file to a checkpoint directory in place, resumably.
//
// Thread safety: each call runs its own threads; do not patch one directory from
// two processes at once.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "apply/delta_applier.h"
#include "codec/delta_encoder.h"
#include "common/status.h"

namespace deltacast::apply {

struct DiffOptions {
  codec::DeltaEncoderOptions encoder;
  uint64_t partition_bytes = codec::kDefaultPartitionBytes;
};

struct DiffResult {
  codec::DeltaIdentity identity;
  codec::DeltaStats stats;
  double manifest_seconds = 0;  // hashing (or loading cached hashes of) both versions
};

// Writes the delta from checkpoint `base_dir` to `new_dir` into `out_file`. The two
// directories must have identical layouts (file names, safetensors headers, index):
// only tensor bytes may differ. Manifests are cached under each .deltacast/.
Result<DiffResult> DiffCheckpoints(const std::filesystem::path& base_dir,
                                   const std::filesystem::path& new_dir,
                                   const std::filesystem::path& out_file,
                                   const DiffOptions& options);

struct PatchResult {
  enum class Outcome { kApplied, kResumed, kAlreadyAtTarget };
  Outcome outcome = Outcome::kApplied;
  codec::DeltaIdentity identity;
  ApplyReport report;
};

// Applies the delta in `delta_file` to checkpoint `dir` in place.
// - Reads and validates the whole delta file first: a file corrupt anywhere
//   (checksums, structure, missing or duplicate chunks) is refused with kCorrupt
//   before anything is written.
// - Refuses with kVersionMismatch, writing nothing, if `dir` is at neither the
//   delta's base nor its target (nor mid-way through this same delta).
// - Succeeds without writing anything (outcome kAlreadyAtTarget) if `dir` is
//   already at the target.
// - Resumes an interrupted patch of the same delta: partitions at target are
//   skipped, those at base applied; torn ones are repaired from
//   options.repair_from when given, else fail the patch (kFailedPrecondition,
//   naming them) and are left as they are.
// On success `dir` is byte-identical to the target checkpoint and
// .deltacast/active names the target version.
struct PatchOptions {
  size_t threads = 0;  // 0 = all cores
  // A checkpoint directory at the target version to repair torn partitions from
  // (their bytes are copied only if they hash to the target); empty = no repair.
  std::filesystem::path repair_from;
};

Result<PatchResult> PatchCheckpoint(const std::filesystem::path& dir,
                                    const std::filesystem::path& delta_file,
                                    const PatchOptions& options);

}  // namespace deltacast::apply
