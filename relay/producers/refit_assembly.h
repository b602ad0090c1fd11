// RefitAssembly: the root's part of a refit from many producers that talks to nobody
// (docs/producers.md). From every producer's COVERAGE it checks that the shares
// cover the model exactly (counts per partition, and the layouts' runs element by
// element) and settles the base manifest (the one the root knows, or the producers'
// base pieces combined); from every PRODUCED it checks each producer's base proof
// against that manifest and combines the target manifest. Root::Publish drives it
// over the producers' links; the simulator drives it with in-process producers, so
// both run the same checks.
//
// Thread safety: none; one thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "codec/manifest.h"
#include "common/hash.h"
#include "layout/placement.h"
#include "relay/producers/merge.h"
#include "relay/producers/producer_protocol.h"

namespace deltacast::relay {

class RefitAssembly {
 public:
  // `known` (may be null: the producers hash their bases) must outlive the assembly.
  // `checked_mesh` is the fingerprint of the last set of layouts found exact (the
  // caller keeps it between refits); it is updated when a new set passes.
  // `expected`, when `known` is the target of the caller's last refit, is that
  // refit's ProofOfTarget (names the producer at fault in a shared partition).
  RefitAssembly(const codec::Manifest* known, uint64_t partition_bytes,
                std::optional<Digest128>* checked_mesh, const ProducerPieces* expected = nullptr);

  // A producer's COVERAGE. kInvalidArgument if its canonical table differs from the
  // first producer's.
  Status AddCoverage(const std::string& producer, Coverage coverage);
  // Once every COVERAGE is in: the shares cover every element exactly once, by
  // count and (when the layouts changed since `checked_mesh`) by the layouts' runs;
  // the table is the known base's; then the base manifest.
  Status SettleBase();
  const codec::Manifest& base() const { return base_; }
  bool base_from_producers() const { return known_ == nullptr; }

  // What BASE_HASHES tells `producer`: the base hash of each partition it covers
  // whole (zero for the others), parallel to its coverage.
  BaseHashes HashesFor(const std::string& producer, uint64_t refit_id) const;

  // A producer's PRODUCED.
  void AddProduced(const std::string& producer, Produced produced);
  // Once every PRODUCED is in: every producer's base proof matches the base
  // (CheckBaseProof), then the target manifest.
  Status SettleTarget();
  const codec::Manifest& target() const { return target_; }
  // Each producer's pieces of the target, for the next refit's `expected`.
  ProducerPieces ProofOfTarget() const { return relay::ProofOfTarget(reports()); }

  const std::map<std::string, Produced>& produced() const { return produced_; }
  const ShareReport& share(const std::string& producer) const { return shares_.at(producer); }
  std::vector<const ShareReport*> reports() const;

 private:
  Status CheckMesh();

  const codec::Manifest* known_;
  const uint64_t partition_bytes_;
  std::optional<Digest128>* checked_mesh_;
  const ProducerPieces* expected_;
  std::vector<TensorSpec> table_;
  std::map<std::string, ShareReport> shares_;
  std::vector<layout::CanonicalRuns> layouts_;
  std::map<std::string, Produced> produced_;
  codec::Manifest base_, target_;
};

}  // namespace deltacast::relay
