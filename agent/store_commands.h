// Commands over a node's checkpoint store as it is kept on disk, in place or as a
// snapshot plus the committed chain (relay/store/snapshot_store.h): `deltacast
// materialize`, and the committed version that verify and audit read.
#pragma once

#include <filesystem>
#include <memory>

#include "apply/checkpoint_dir.h"
#include "codec/manifest.h"
#include "common/status.h"

namespace deltacast::agent {

// A checkpoint directory's committed version, read-only: a plain (or in-place)
// directory mapped as it is, with its manifest (cached or hashed); a snapshot store's
// snapshot mapped privately with its chain replayed. `store->dir()` is the folder
// whose files hold everything but the tensor bytes.
struct CommittedCheckpoint {
  std::unique_ptr<apply::CheckpointDirStore> store;
  codec::Manifest manifest;
  bool snapshot_store = false;
};
Result<CommittedCheckpoint> OpenCommittedCheckpoint(const std::filesystem::path& dir,
                                                    size_t threads);

struct MaterializeArgs {
  std::filesystem::path store;
  std::filesystem::path out;
  size_t threads = 0;  // 0: all cores
  bool json = false;
};
// Writes STORE's committed version to OUT (new or empty) as a checkpoint directory:
// byte-identical to the trainer's (headers, index, config files), each file fsynced.
int RunMaterialize(const MaterializeArgs& args);

}  // namespace deltacast::agent
