// Root: the source of a relay tree whose delta is produced by N producers on the
// trainer (docs/producers.md). It owns a Source (children, spool, history, the
// two-phase commit, unchanged) and a ProducerHub (the producers' links). A refit:
//  1. PRODUCE to every producer; each answers COVERAGE: the canonical partitions it
//     covers (and, when the root does not know the base version's manifest, its
//     base hash pieces, from which the root combines the base manifest). The
//     covered element counts must add up to every partition exactly.
//  2. BASE_HASHES: each producer gets the base hash of the partitions it covers
//     whole; it encodes its share and answers PRODUCED with its mask contribution
//     per changed partition. The root combines the target manifest: now the target
//     version id exists.
//  3. Source::PublishStream: BEGIN down the tree, then the producers' chunks,
//     stamped and passed on as they arrive (cut-through), and the pieces combined
//     into pieces records, under credit (PULL), then END; PREPARED, the decision,
//     COMMIT or ABORT as for any refit. PRODUCE_END tells the producers the outcome.
// A producer that dies mid-refit aborts it cleanly: before step 3 no node has seen
// the refit (Publish fails and the tree is untouched); during it the root fails the
// refit and the tree rolls back (ABORT). The next refit needs every producer back.
//
// Thread safety: Publish blocks the calling thread, one at a time; Start, Publish
// and Stop from one thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/manifest.h"
#include "common/hash.h"
#include "relay/producers/merge.h"
#include "relay/producers/producer_hub.h"
#include "relay/producers/split_amax_exchange.h"
#include "relay/tree/publisher.h"
#include "relay/tree/source.h"

namespace deltacast::relay {

// Unless told otherwise, producers dial the root at the source's host, its port +
// kProducerPortOffset.
inline constexpr uint16_t kProducerPortOffset = 1000;
std::string DefaultProducerAddress(const topology::ClusterConfig& config);

struct RootOptions {
  PublishOptions publish;        // the tree side, as for a Source
  std::string producer_address;  // where producers dial ("host:port", port 0: any)
  size_t producers = 1;          // how many to wait for
  uint64_t partition_bytes = codec::kDefaultPartitionBytes;
  // Messages in flight per producer while streaming (its buffer at the root).
  uint32_t producer_window = 2;
  // How long producers may take to join, and to answer within a refit.
  std::chrono::milliseconds join_timeout{30'000};
  std::chrono::milliseconds produce_timeout{300'000};
};

struct ProducerSummary {
  std::string id;
  uint64_t partitions = 0;  // canonical partitions it touches
  uint64_t whole_changes = 0;
  uint64_t piece_changes = 0;
  uint64_t local_bytes = 0;  // shard bytes it compared
  double encode_seconds = 0;
};

struct RootReport {
  PublishReport publish;
  std::vector<ProducerSummary> producers;
  bool base_from_producers = false;  // the producers hashed their base pieces
  double coverage_seconds = 0;       // PRODUCE to every COVERAGE
  double produce_seconds = 0;        // PRODUCE to every PRODUCED: the target is known
  double merge_cpu_seconds = 0;      // the root's CPU while merging (this thread)
  uint64_t merged_bytes = 0;         // delta bytes the merge handled
  SplitAmaxStats fp8;                // producers serving FP8: the amax exchange
};

class Root {
 public:
  static Result<std::unique_ptr<Root>> Start(
      RootOptions options, std::unique_ptr<transport::Transport> tree_transport,
      std::unique_ptr<transport::Transport> producer_transport);
  ~Root();

  // One refit from the producers' shares. `base` is the manifest of the version the
  // tree holds, when the caller knows it; otherwise the root uses the target of its
  // last committed refit, or asks the producers to hash their base pieces. Fails
  // without touching the tree when the producers do not all join, a producer fails
  // or dies before the target version is known, or their shares do not cover the
  // model exactly; otherwise returns the refit's report (committed or aborted).
  Result<RootReport> Publish(const codec::Manifest* base = nullptr);

  const std::string& producer_address() const { return producer_address_; }
  const std::string& listen_address() const { return source_->listen_address(); }
  void Stop();

 private:
  Root(RootOptions options, std::unique_ptr<Source> source,
       std::unique_ptr<transport::Transport> producer_transport);

  RootOptions options_;
  std::unique_ptr<Source> source_;
  std::unique_ptr<transport::Transport> producer_transport_;
  std::unique_ptr<ProducerHub> hub_;
  std::string producer_address_;
  std::optional<codec::Manifest> last_target_;
  std::optional<Digest128> checked_mesh_;  // the producers' layouts last found exact
  ProducerPieces last_pieces_;             // each producer's pieces of last_target_
};

}  // namespace deltacast::relay
