#include "agent/store_commands.h"

#include <fmt/core.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "agent/commands.h"
#include "apply/checkpoint_state.h"
#include "codec/partition.h"
#include "common/parallel.h"
#include "relay/store/snapshot_store.h"

namespace deltacast::agent {

Result<CommittedCheckpoint> OpenCommittedCheckpoint(const std::filesystem::path& dir,
                                                    size_t threads) {
  threads = threads ? threads : DefaultThreadCount();
  CommittedCheckpoint c;
  if (relay::SnapshotStore::IsSnapshotStore(dir)) {
    c.snapshot_store = true;
    ASSIGN_OR_RETURN(c.store, relay::SnapshotStore::OpenCommitted(
                                  dir, codec::kDefaultPartitionBytes, threads, c.manifest));
    return c;
  }
  ASSIGN_OR_RETURN(
      c.store, apply::CheckpointDirStore::Open(dir, apply::CheckpointDirStore::Access::kReadOnly));
  ASSIGN_OR_RETURN(c.manifest, apply::CheckpointState(dir).LoadOrComputeManifest(
                                   *c.store, codec::kDefaultPartitionBytes, threads));
  return c;
}

int RunMaterialize(const MaterializeArgs& args) {
  const auto started = std::chrono::steady_clock::now();
  auto committed = OpenCommittedCheckpoint(args.store, args.threads);
  if (!committed.ok()) {
    fmt::print(stderr, "deltacast: {}\n",
               committed.status().WithContext(args.store.string()).ToString());
    return kExitFailure;
  }
  auto written = relay::SnapshotStore::WriteDirectory(*committed->store, args.out, /*rate=*/0);
  if (!written.ok()) {
    fmt::print(stderr, "deltacast: {}\n",
               written.status().WithContext(args.out.string()).ToString());
    return kExitFailure;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::string version = committed->manifest.VersionId().ToHex();
  if (args.json) {
    fmt::print("{}\n", nlohmann::json{{"store", args.store.string()},
                                      {"out", args.out.string()},
                                      {"version", version},
                                      {"snapshot_store", committed->snapshot_store},
                                      {"bytes_written", *written},
                                      {"seconds", seconds}}
                           .dump(2));
  } else {
    fmt::print("materialized {} (version {}) into {}: {} bytes in {:.2f} s\n", args.store.string(),
               version.substr(0, 12), args.out.string(), *written, seconds);
  }
  return kExitOk;
}

}  // namespace deltacast::agent
