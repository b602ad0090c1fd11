// What a refit is published with and what it reports: the options of a Source (and
// of the one-shot Publish), its progress, and its report. Apart from source.h and
// publisher.h, which both use them (publisher.cc runs a Source).
//
// Thread safety: plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codec/delta_encoder.h"
#include "relay/tree/commit_record.h"
#include "relay/wire/protocol.h"
#include "relay/wire/signing.h"
#include "topology/cluster_config.h"

namespace deltacast::relay {

struct PublishProgress {
  uint64_t chunks_sent = 0;
  uint64_t bytes_sent = 0;
  uint64_t tensor_bytes = 0;  // the whole target, for scale
  // When the source encodes the delta itself (not from producers): tensor bytes of
  // the changed partitions encoded so far, and in all.
  uint64_t encoded_bytes = 0;
  uint64_t bytes_to_encode = 0;
};

struct PublishOptions {
  topology::ClusterConfig config;
  std::string token;
  codec::EncodeOptions codec;
  size_t encode_threads = 0;  // 0 = all cores
  // The decision of every refit is appended here and fsynced before it is sent;
  // empty = not recorded.
  std::filesystem::path decision_log;
  // Where the chunks are spooled for replays to children that rejoin; empty = a
  // per-process folder under the system temporary directory.
  std::filesystem::path spool_dir;
  // Where the last `keep_deltas` committed deltas are kept, so a node that missed
  // several versions catches up by the chain of deltas (else by every partition that
  // differs); empty or 0 = none kept.
  std::filesystem::path history_dir;
  size_t keep_deltas = 4;
  // The source's Ed25519 key ([security] signing_key): BEGIN, every CHUNK and every
  // decision go out signed, for nodes that check them (NodeAgentOptions::
  // verify_key). Null: unsigned.
  std::shared_ptr<const SigningKey> signing_key;

  // The commit record store ([coordination]; relay/tree/commit_record.h, docs/recovery.md
  // "The commit record"): each refit is announced there before its BEGIN, decided there
  // by compare-and-set before the decision is sent, and a restarted source reads it
  // first. Shared: the caller may hand the same store to a coordinator or to checks.
  // Null: the decision log alone, as before.
  std::shared_ptr<CommitRecordStore> commit_records;
  // With a store: the announcement's time to live (renewed every source_timeout / 6
  // while the refit runs; a standby coordinator aborts a refit whose announcement
  // lapsed), and how often an unknown outcome is asked again.
  std::chrono::milliseconds source_timeout{10'000};
  std::chrono::milliseconds poll_interval{1'000};

  std::function<void(const PublishProgress&)> on_progress;

  // Keeps the source's state in `state`: decisions.log, spool/ and history/. An
  // on-disk contract a restarted source relies on, defined here alone for the CLI,
  // the public API and the simulator.
  void UseStateDir(const std::filesystem::path& state);
};

struct PublishReport {
  bool committed = false;
  std::string abort_reason;  // why, when not committed
  uint64_t refit_id = 0;
  Digest128 base_version;
  Digest128 target_version;
  codec::DeltaStats delta;
  double seconds = 0;              // BEGIN to the last outcome
  double first_chunk_seconds = 0;  // BEGIN to the first chunk handed to the children
  // The publish call to that first chunk: with a one-shot Publish this includes
  // listening and the children's joining.
  double call_to_first_chunk_seconds = 0;
  double stream_seconds = 0;      // BEGIN to the END chunk handed to the children
  double prepare_seconds = 0;     // BEGIN to every node PREPARED
  std::vector<NodeReport> nodes;  // one per receiver that prepared
  uint32_t nodes_decided = 0;     // receivers that confirmed the decision
  // An FP8 delta quantized from BF16 (relay/producers/fp8_delta.h): the BF16 versions it was
  // made from (base_version and target_version are the FP8 twins'); zero otherwise.
  Digest128 bf16_base_version;
  Digest128 bf16_target_version;
};

}  // namespace deltacast::relay
