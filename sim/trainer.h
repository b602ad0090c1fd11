// SimTrainer: the trainer side of a simulated refit from many producers
// (`deltacast_sim --producers`). Four ranks each hold interleaved rows of every BF16
// tensor (rank r: rows r, r + 4, ... of 256 elements, so every partition is shared
// and its delta goes through pieces) and rank 0 the norm. Each rank compares its
// share in process (relay::EncodeShare), its COVERAGE and PRODUCED go through the
// producer protocol's encoders and parsers, and the root's checks and merge run
// exactly as in Root::Publish (relay::RefitAssembly, relay::DeltaMerger); the merged
// delta goes down the simulated tree through Source::PublishStream.
//
// Trainer faults (docs/simulation.md): a rank whose previous shard is another
// step's (a stale base, or a rank restarted with another step's shard), a rank whose
// previous shard has one element one ulp off at a position the step does not change,
// and a rank that claims another rank's rows (an overlap and a gap the per-partition
// counts cannot see). The root must refuse each before anything is sent; with its
// checks reverted, the simulator's bit-exact checker sees the wrong commit.
//
// Thread safety: none; the simulator's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/manifest.h"
#include "layout/placement.h"
#include "relay/producers/refit_assembly.h"
#include "relay/producers/shard_encoder.h"
#include "relay/tree/source.h"
#include "sim/scenario.h"

namespace deltacast::sim {

using Bytes = std::vector<std::byte>;
using Tensors = std::vector<Bytes>;

inline constexpr int kTrainerRanks = 4;

class SimTrainer {
 public:
  // `table`: the canonical tensors (BF16 ones first, one F32 norm last).
  SimTrainer(std::vector<TensorSpec> table, uint64_t partition_bytes, uint64_t chunk_bytes);

  // One refit's produce phase: every rank compares `base` -> `target` (`stale` is
  // the other step a kStaleBase rank holds as its previous shard) and the root,
  // which knows `known` as the tree's version, checks and combines. Failure is the
  // root's refusal; nothing has been sent.
  Status Produce(const codec::Manifest& known, const Tensors& base, const Tensors& target,
                 const Tensors& stale, TrainerFault fault);
  const codec::Manifest& base() const { return assembly_->base(); }
  const codec::Manifest& target() const { return assembly_->target(); }
  // The last Produce's target committed: its pieces are what the root expects of the
  // next base.
  void Committed() { expected_ = assembly_->ProofOfTarget(); }
  // The merged delta of the last Produce, as Source::PublishStream takes it.
  Status Stream(const relay::Source::ChunkMessageSink& sink, codec::DeltaStats* stats);

 private:
  struct Rank {
    std::vector<layout::ElementRange> ranges;
    layout::PlacementMap map;
  };
  ByteSpan Local(const Tensors& t, const Rank& rank, uint32_t local) const;

  const std::vector<TensorSpec> table_;
  const uint64_t partition_bytes_, chunk_bytes_;
  std::vector<Rank> ranks_;
  std::optional<Digest128> checked_mesh_;  // the root's, across refits
  std::optional<relay::ProducerPieces> expected_;
  std::unique_ptr<relay::RefitAssembly> assembly_;
  std::vector<relay::EncodedShare> encoded_;
  uint64_t chunk_changes_ = 0;
};

}  // namespace deltacast::sim
