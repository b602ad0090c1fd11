#include "agent/audit_command.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "agent/commands.h"
#include "agent/fp8_twin.h"
#include "agent/store_commands.h"
#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/weight_store.h"
#include "codec/manifest_diff.h"
#include "common/parallel.h"

namespace deltacast::agent {
namespace {

int Fail(const Status& status) {
  fmt::print(stderr, "deltacast: {}\n", status.ToString());
  return kExitFailure;
}

}  // namespace

int RunAudit(const AuditArgs& args) {
  const size_t threads = args.threads ? args.threads : DefaultThreadCount();
  const apply::CheckpointState state(args.dir);
  auto active = state.ReadActive();
  if (!active.ok()) return Fail(active.status().WithContext(args.dir.string()));
  if (!*active) {
    return Fail(Status::NotFound(args.dir.string() +
                                 " holds no active version (.deltacast/): not a node's checkpoint "
                                 "directory, or it never committed one"));
  }
  auto inflight = state.ReadInflight();
  if (!inflight.ok()) return Fail(inflight.status().WithContext(args.dir.string()));
  if (*inflight) {
    return Fail(Status::FailedPrecondition("a delta is in flight (" + (*inflight)->base.ShortHex() +
                                           " -> " + (*inflight)->target.ShortHex() +
                                           "): audit between refits"));
  }
  if (Status fp8 = CheckFp8CheckpointDir(args.dir); !fp8.ok()) return Fail(fp8);
  auto manifest = state.LoadManifestOf(**active, codec::kDefaultPartitionBytes);
  if (!manifest.ok()) return Fail(manifest.status().WithContext("the active version's manifest"));
  if (!*manifest) {
    return Fail(Status::NotFound("the manifest of the active version " + (*active)->ShortHex() +
                                 " is not cached in " + args.dir.string() + "/.deltacast"));
  }
  // A snapshot store's committed version is its snapshot with the chain replayed.
  auto committed = OpenCommittedCheckpoint(args.dir, threads);
  if (!committed.ok()) return Fail(committed.status().WithContext(args.dir.string()));
  auto now = apply::HashWeightStore(*committed->store, (*manifest)->partition_bytes, threads);
  if (!now.ok()) return Fail(now.status().WithContext("hashing " + args.dir.string()));
  const codec::ManifestDiff diff = codec::DiffManifests(**manifest, *now);
  if (args.json) {
    nlohmann::json mismatches = nlohmann::json::array();
    for (const auto& t : diff.tensors)
      mismatches.push_back({{"tensor", t.name}, {"what", t.Detail()}});
    fmt::print("{}\n", nlohmann::json{{"dir", args.dir.string()},
                                      {"version", (*active)->ToHex()},
                                      {"ok", diff.empty()},
                                      {"tensors", (*manifest)->tensors.size()},
                                      {"partitions", (*manifest)->PartitionTotal()},
                                      {"mismatches", mismatches}}
                           .dump(2));
  } else {
    fmt::print("{} {}: version {}, {} tensors, {} partitions hashed: {}\n",
               diff.empty() ? "OK" : "DIFFERENT", args.dir.string(), (*active)->ShortHex(),
               (*manifest)->tensors.size(), (*manifest)->PartitionTotal(),
               diff.empty() ? "every partition is the active version's" : "");
    for (const auto& t : diff.tensors) fmt::print("  {}\n", t.Describe());
  }
  return diff.empty() ? kExitOk : kExitDiffers;
}

}  // namespace deltacast::agent
