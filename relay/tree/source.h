// Source: the root of the relay tree, long-lived. It listens once; its children
// join, authenticate and stay joined between refits (a child that joins late or
// rejoins is replayed what it lacks). Each Publish is one refit: it encodes the
// delta between two versions while streaming it (the first chunk is on the wire long
// before the last partition is compared), waits until every node reports PREPARED,
// records its decision durably and drives the tree-wide two-phase commit
// (docs/protocol.md). Between refits it keeps the last refit's spool, so a child
// that rejoins is told the outcome; it serves partition bytes and manifests only
// during a Publish (the caller's stores need to live only that long).
//
// Thread safety: Publish blocks the calling thread, one at a time; on_progress runs
// on it. Start, Publish and Stop from one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "apply/weight_store.h"
#include "codec/manifest.h"
#include "relay/tree/publish_options.h"
#include "transport/transport.h"

namespace deltacast::topology {
struct StripedPlan;  // topology/stripe_plan.h
}  // namespace deltacast::topology

namespace deltacast::relay {

class Source {
 public:
  // Listens on the config's source address and waits for nothing: children join as
  // they come. Fails if the address cannot be bound.
  static Result<std::unique_ptr<Source>> Start(PublishOptions options,
                                               std::unique_ptr<transport::Transport> transport);
  // The same along a plan given (every stripe's tree) instead of the config's
  // (PlanStripes): for tests that need a tree of a given shape; see NodeAgent::Start.
  static Result<std::unique_ptr<Source>> Start(PublishOptions options,
                                               std::unique_ptr<transport::Transport> transport,
                                               const topology::StripedPlan& plan);
  ~Source();  // Stop()

  // Publishes `base` -> `target` as the next version. Waits up to the connect
  // timeout for the children that are not joined yet (policy `available`: goes on
  // without them if any node is there); fails without a report if they do not come
  // (policy `all`). Otherwise returns a report saying whether the version committed.
  Result<PublishReport> Publish(const apply::WeightStore& base,
                                const codec::Manifest& base_manifest,
                                const apply::WeightStore& target,
                                const codec::Manifest& target_manifest);
  // The same with this refit's codec options instead of the Source's.
  Result<PublishReport> Publish(const apply::WeightStore& base,
                                const codec::Manifest& base_manifest,
                                const apply::WeightStore& target,
                                const codec::Manifest& target_manifest,
                                const codec::EncodeOptions& codec);

  // Receives each CHUNK message of a delta in sequence order, whole (relay/wire/protocol.h:
  // header, codec chunk, all-zero signature) and handed over: the source signs it in
  // place with its key (relay/wire/signing.h), so every delta it publishes, however it
  // was encoded, reaches the nodes signed.
  using ChunkMessageSink = std::function<Status(std::vector<std::byte> chunk_message)>;
  // Produces a delta's chunks (data chunks 0..n-1, then END, all naming the
  // manifests' versions) into the sink, and its statistics; a non-OK status from
  // the sink must stop it and be returned.
  using DeltaStream = std::function<Status(const ChunkMessageSink& sink, codec::DeltaStats* stats)>;

  // Publishes a delta that someone else encodes (the root of many producers,
  // relay/producers/root.h), as Publish does otherwise: children, spool, two-phase commit. A
  // failing stream aborts the refit. `base` and `target` (optional) serve repair
  // FETCHes during the refit; without them the source answers "not found".
  Result<PublishReport> PublishStream(const codec::Manifest& base_manifest,
                                      const codec::Manifest& target_manifest,
                                      const DeltaStream& stream,
                                      const apply::WeightStore* base = nullptr,
                                      const apply::WeightStore* target = nullptr);

  // The version the cluster holds as this source knows it: the base of the refit
  // in progress, else the last committed target (from the decision log after a
  // restart); zero before anything says it. Each child that joins is told it.
  Digest128 version() const;
  // Says the cluster holds `manifest`'s version now (before the first Publish):
  // children that join are checked against it, and those joined are told.
  void Announce(const codec::Manifest& manifest);

  // Closes every link; the last committed delta joins the kept history. Idempotent.
  // A Publish after Stop fails at once (kFailedPrecondition).
  void Stop();
  const std::string& listen_address() const;

  class Impl;

 private:
  explicit Source(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::relay
