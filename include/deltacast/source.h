// Source: the trainer's end of deltacast, the root of the relay tree. Start it once;
// the receivers join it and stay joined. Each Publish makes the next version:
// it encodes the changes between the two versions while streaming them, waits until
// every node verified the target, records its decision durably and commits it on
// every node at once (two-phase commit), or aborts it everywhere.
//
// Thread safety: Publish blocks the calling thread, one call at a time. Start,
// Publish and Stop from the thread that owns the Source.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "deltacast/config.h"
#include "deltacast/status.h"
#include "deltacast/tensor.h"

namespace deltacast {

struct SourceOptions {
  std::string token;  // the cluster's shared secret (Config::TokenFromEnvironment)
  // The decision log, spool and kept deltas; keep it across restarts of the trainer
  // (a restarted source resolves what it may have decided). Empty: a per-process
  // folder, removed at Stop (no decisions survive the process).
  std::filesystem::path state_dir;
  size_t keep_deltas = 4;     // committed deltas kept, so a node that missed some catches up
  bool context_mode = false;  // the context coder: ~0.6x the bytes, ~5x the encode CPU
  size_t encode_threads = 0;  // 0 = all cores
};

struct NodeReport {
  std::string node;
  uint64_t delta_bytes = 0;  // what it received
  double prepared_seconds = 0;
  uint64_t partitions_applied = 0;
  // Where its time to PREPARED went: BEGIN to the last chunk received (streaming);
  // checking each record leads to its target hash before writing, and writing
  // (summed over chunks); the apply thread on a CPU, waiting for a CPU (other work
  // on the machine) and waiting for the disk (fsync, writes the kernel held back
  // while it wrote dirty pages out).
  double receive_seconds = 0;
  double check_seconds = 0;
  double write_seconds = 0;
  double apply_cpu_seconds = 0;
  double cpu_wait_seconds = 0;
  double disk_wait_seconds = 0;
  // After the decision: how long its engine was paused for the writes (staged: the
  // commit's apply; on-arrival: first write to commit; NodeOptions::pause_engine),
  // and how long it held its verified delta before the decision came. Zero where a
  // node's confirmation did not come through (or crossed a bucket bridge).
  double pause_seconds = 0;
  double prepared_hold_seconds = 0;
};

struct PublishReport {
  bool committed = false;
  std::string abort_reason;  // why, when not committed
  uint64_t refit_id = 0;
  std::string base_version, target_version;  // version ids, hex
  // Published with a serving description: the BF16 versions the FP8 twins
  // (base_version, target_version) were quantized from; "" otherwise.
  std::string bf16_base_version, bf16_target_version;
  uint64_t delta_bytes = 0;
  uint64_t checkpoint_bytes = 0;
  uint64_t chunks = 0;
  double seconds = 0;                      // BEGIN to the last confirmation
  double call_to_first_chunk_seconds = 0;  // the Publish call to the first chunk sent
  uint32_t nodes_decided = 0;              // receivers that confirmed the decision
  std::vector<NodeReport> nodes;           // one per receiver that prepared
};

class Source {
 public:
  // Listens on the config's source address. Fails if it cannot.
  static Result<std::unique_ptr<Source>> Start(const Config& config, SourceOptions options);
  ~Source();  // Stop()
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // Publishes `target` as the next version; the receivers hold `base`. Both must
  // list the same tensors (names, dtypes, shapes); the bytes are only read, and
  // need to live only until the call returns.
  //
  // How a publish reports failure, in C++ and Python alike: an error (a Status
  // here; an exception in Python) means the refit never began, nothing was sent
  // and every node keeps its version: mismatched tensors (kInvalidArgument), a
  // stopped source (kFailedPrecondition), receivers that did not join within the
  // connect timeout (kUnavailable; the message names each one and why: refused at
  // the door and the reason, or never connected). A report means a refit ran:
  // `committed` says whether the version is now active everywhere, and
  // `abort_reason` why not (a node whose weights differ from `base` names the
  // tensors).
  Result<PublishReport> Publish(const std::vector<TensorView>& base,
                                const std::vector<TensorView>& target);
  // The same for two safetensors checkpoint directories laid out alike. With a
  // serving description (a TOML file, docs/fp8.md), both are BF16 and the nodes
  // hold FP8 serving twins: both versions are quantized here and the delta between
  // their twins is published (a description that does not fit the checkpoint is
  // refused, naming the tensor, before anything is sent).
  Result<PublishReport> PublishCheckpoints(const std::filesystem::path& base_dir,
                                           const std::filesystem::path& new_dir,
                                           const std::filesystem::path& serving = {});

  void Stop();  // idempotent; a Publish after it fails at once
  std::string listen_address() const;
  // The version the cluster holds as this source knows it (hex): the last
  // committed target, or the base of the publish in progress; after a restart with
  // the same state_dir, the last one its decision log committed; "" before any.
  // Each node that joins is told it and checks its weights against it
  // (Node::WaitForJoin).
  std::string version() const;
  // Says which weights the cluster holds now, before the first publish (hashed
  // here; the bytes need to live only during the call): nodes that join are
  // checked against them at once instead of at the first publish. The Python
  // Source does it with the tensors it starts with.
  Status SetVersion(const std::vector<TensorView>& current);

  struct Impl;

 private:
  explicit Source(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast
