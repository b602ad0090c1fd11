#include "relay/tree/publisher.h"

#include <chrono>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "common/parallel.h"
#include "common/runtime.h"
#include "relay/tree/source.h"

namespace deltacast::relay {

Result<PublishReport> Publish(const PublishOptions& options, const apply::WeightStore& base,
                              const codec::Manifest& base_manifest,
                              const apply::WeightStore& target,
                              const codec::Manifest& target_manifest,
                              std::unique_ptr<transport::Transport> transport) {
  const auto call = RuntimeClock::now();
  ASSIGN_OR_RETURN(auto source, Source::Start(options, std::move(transport)));
  const double started = std::chrono::duration<double>(RuntimeClock::now() - call).count();
  auto report = source->Publish(base, base_manifest, target, target_manifest);
  source->Stop();
  if (report.ok()) report->call_to_first_chunk_seconds += started;
  return report;
}

Result<CheckpointVersion> OpenCheckpointVersion(const std::filesystem::path& dir, size_t threads) {
  using Access = apply::CheckpointDirStore::Access;
  CheckpointVersion v;
  ASSIGN_OR_RETURN(v.store, apply::CheckpointDirStore::Open(dir, Access::kReadOnly));
  ASSIGN_OR_RETURN(v.manifest, apply::CheckpointState(dir).LoadOrComputeManifest(
                                   *v.store, codec::kDefaultPartitionBytes,
                                   threads ? threads : DefaultThreadCount()));
  return v;
}

Status SameFileLayout(const CheckpointVersion& base, const CheckpointVersion& target) {
  if (base.store->LayoutId() == target.store->LayoutId()) return Status::Ok();
  return Status::Unsupported(
      "the checkpoints differ in file layout; a delta carries tensor bytes only");
}

Result<PublishReport> PublishCheckpoints(const PublishOptions& options,
                                         const std::filesystem::path& base_dir,
                                         const std::filesystem::path& new_dir,
                                         std::unique_ptr<transport::Transport> transport) {
  auto base = OpenCheckpointVersion(base_dir, options.encode_threads);
  if (!base.ok()) return base.status().WithContext("base checkpoint");
  auto target = OpenCheckpointVersion(new_dir, options.encode_threads);
  if (!target.ok()) return target.status().WithContext("new checkpoint");
  RETURN_IF_ERROR(SameFileLayout(*base, *target));
  return Publish(options, *base->store, base->manifest, *target->store, target->manifest,
                 std::move(transport));
}

}  // namespace deltacast::relay
