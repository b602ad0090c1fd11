#include "relay/publisher.h"

#include <chrono>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "common/parallel.h"
#include "relay/source.h"

namespace deltacast::relay {

Result<PublishReport> Publish(const PublishOptions& options, const apply::WeightStore& base,
                              const codec::Manifest& base_manifest,
                              const apply::WeightStore& target,
                              const codec::Manifest& target_manifest,
                              std::unique_ptr<transport::Transport> transport) {
  const auto call = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto source, Source::Start(options, std::move(transport)));
  const double started =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - call).count();
  auto report = source->Publish(base, base_manifest, target, target_manifest);
  source->Stop();
  if (report.ok()) report->call_to_first_chunk_seconds += started;
  return report;
}

Result<PublishReport> PublishCheckpoints(const PublishOptions& options,
                                         const std::filesystem::path& base_dir,
                                         const std::filesystem::path& new_dir,
                                         std::unique_ptr<transport::Transport> transport) {
  using Access = apply::CheckpointDirStore::Access;
  auto base = apply::CheckpointDirStore::Open(base_dir, Access::kReadOnly);
  if (!base.ok()) return base.status().WithContext("base checkpoint");
  auto target = apply::CheckpointDirStore::Open(new_dir, Access::kReadOnly);
  if (!target.ok()) return target.status().WithContext("new checkpoint");
  if ((*base)->LayoutId() != (*target)->LayoutId()) {
    return Status::Unsupported(
        "the checkpoints differ in file layout; a delta carries tensor bytes only");
  }
  const size_t threads = options.encode_threads ? options.encode_threads : DefaultThreadCount();
  ASSIGN_OR_RETURN(auto base_manifest, apply::CheckpointState(base_dir).LoadOrComputeManifest(
                                           **base, codec::kDefaultPartitionBytes, threads));
  ASSIGN_OR_RETURN(auto target_manifest, apply::CheckpointState(new_dir).LoadOrComputeManifest(
                                             **target, codec::kDefaultPartitionBytes, threads));
  return Publish(options, **base, base_manifest, **target, target_manifest, std::move(transport));
}

}  // namespace deltacast::relay
