// One-shot publishing: Publish starts a Source, publishes one version and stops it
// (its children re-dial at the next call). A trainer that publishes every step keeps
// a Source instead (source.h). The options and report: publish_options.h.
//
// This is the public embedding API for trainers: pass the two versions as
// WeightStores (apply::HostStore::Borrow over your own buffers works).
//
// Thread safety: Publish blocks the calling thread; on_progress runs on it.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apply/checkpoint_dir.h"
#include "apply/weight_store.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "relay/tree/publish_options.h"
#include "transport/transport.h"

namespace deltacast::relay {

// Publishes `base` -> `target` as the config's source node: Source::Start, one
// Source::Publish, Source::Stop. Fails (without a report) if it cannot listen or its
// children do not all join within the connect timeout; otherwise returns a report
// saying whether the version committed everywhere.
Result<PublishReport> Publish(const PublishOptions& options, const apply::WeightStore& base,
                              const codec::Manifest& base_manifest,
                              const apply::WeightStore& target,
                              const codec::Manifest& target_manifest,
                              std::unique_ptr<transport::Transport> transport);

// A checkpoint directory opened read-only, with its manifest (from its .deltacast/
// cache when the files are unchanged, else hashed on `threads` threads, 0 = all).
struct CheckpointVersion {
  std::unique_ptr<apply::CheckpointDirStore> store;
  codec::Manifest manifest;
};
Result<CheckpointVersion> OpenCheckpointVersion(const std::filesystem::path& dir, size_t threads);
// kUnsupported unless both hold the same files laid out the same way (a delta
// carries tensor bytes, not file headers).
Status SameFileLayout(const CheckpointVersion& base, const CheckpointVersion& target);

// Publish for two checkpoint directories with identical layouts.
Result<PublishReport> PublishCheckpoints(const PublishOptions& options,
                                         const std::filesystem::path& base_dir,
                                         const std::filesystem::path& new_dir,
                                         std::unique_ptr<transport::Transport> transport);

}  // namespace deltacast::relay
