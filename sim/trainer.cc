#include "sim/trainer.h"

#include <fmt/core.h>

#include <stdexcept>

#include "relay/producers/merge.h"
#include "relay/producers/producer_protocol.h"

namespace deltacast::sim {
namespace {

constexpr uint64_t kRowElements = 256;

std::string RankName(int r) { return fmt::format("rank-{:05d}", r); }

}  // namespace

SimTrainer::SimTrainer(std::vector<TensorSpec> table, uint64_t partition_bytes,
                       uint64_t chunk_bytes)
    : table_(std::move(table)), partition_bytes_(partition_bytes), chunk_bytes_(chunk_bytes) {
  std::vector<TensorSpec> specs;
  for (const auto& t : table_) specs.push_back({t.name, t.dtype, t.shape});
  ranks_.resize(kTrainerRanks);
  for (size_t t = 0; t + 1 < table_.size(); ++t) {
    const uint64_t n = table_[t].ElementCount();
    for (uint64_t row = 0; row * kRowElements < n; ++row) {
      ranks_[row % kTrainerRanks].ranges.push_back(
          {table_[t].name, row * kRowElements, std::min(n, (row + 1) * kRowElements)});
    }
  }
  ranks_[0].ranges.push_back({table_.back().name, 0, table_.back().ElementCount()});
  for (int r = 0; r < kTrainerRanks; ++r) {
    auto map = layout::MapRanges(specs, ranks_[r].ranges, RankName(r) + ".sim");
    if (!map.ok()) throw std::runtime_error(map.status().ToString());
    ranks_[r].map = std::move(*map);
  }
}

// Local tensor `local` of `rank` (its range) in `t`, a whole version's tensors.
ByteSpan SimTrainer::Local(const Tensors& t, const Rank& rank, uint32_t local) const {
  const layout::ElementRange& range = rank.ranges[local];
  for (size_t i = 0; i < table_.size(); ++i) {
    if (table_[i].name != range.tensor) continue;
    const uint64_t e = ElementSize(table_[i].dtype);
    return ByteSpan(t[i]).subspan(range.begin * e, (range.end - range.begin) * e);
  }
  return {};
}

Status SimTrainer::Produce(const codec::Manifest& known, const Tensors& base, const Tensors& target,
                           const Tensors& stale, TrainerFault fault) {
  assembly_ = std::make_unique<relay::RefitAssembly>(&known, partition_bytes_, &checked_mesh_,
                                                     expected_ ? &*expected_ : nullptr);
  encoded_.clear();
  chunk_changes_ = 0;
  // A previous shard one ulp off where the step changes nothing: the rank's own
  // compare cannot see it.
  Tensors corrupt;
  if (fault.kind == TrainerFaultKind::kCorruptBase) {
    corrupt = base;
    for (const auto& range : ranks_[fault.rank].ranges) {
      size_t index = 0;
      while (table_[index].name != range.tensor) ++index;
      bool done = false;
      for (uint64_t e = range.begin; e < range.end && !done; ++e) {
        if (base[index][2 * e] == target[index][2 * e] &&
            base[index][2 * e + 1] == target[index][2 * e + 1]) {
          corrupt[index][2 * e] ^= std::byte{1};
          done = true;
        }
      }
      if (done) break;
    }
  }
  struct Share {
    std::string id;
    relay::ShareInput input;
    std::vector<relay::PartitionShare> coverage;
  };
  std::vector<Share> shares;
  for (int r = 0; r < kTrainerRanks; ++r) {
    const bool at_fault = fault.kind != TrainerFaultKind::kNone && r == fault.rank;
    // The rank claims another's rows (its map), while its bytes are its own rows.
    const Rank& claimed = at_fault && fault.kind == TrainerFaultKind::kOverlap
                              ? ranks_[fault.rank % (kTrainerRanks - 1) + 1]
                              : ranks_[r];
    const Tensors& previous = !at_fault                                      ? base
                              : fault.kind == TrainerFaultKind::kStaleBase   ? stale
                              : fault.kind == TrainerFaultKind::kCorruptBase ? corrupt
                                                                             : base;
    const Rank& own = ranks_[r];
    Share s{RankName(r),
            {&claimed.map, [this, &previous, &own](uint32_t i) { return Local(previous, own, i); },
             [this, &target, &own](uint32_t i) { return Local(target, own, i); }},
            relay::ShareCoverage(claimed.map, partition_bytes_)};
    relay::Coverage c;
    for (const auto& t : claimed.map.canonical()) c.tensors.push_back({t.name, t.dtype, t.shape});
    c.shares = s.coverage;
    c.layout_name = claimed.map.name();
    c.runs = claimed.map.runs();
    // Through the wire format, as a producer's COVERAGE reaches the root.
    ASSIGN_OR_RETURN(relay::Coverage sent, relay::ParseCoverage(relay::EncodeCoverage(c)));
    RETURN_IF_ERROR(assembly_->AddCoverage(s.id, std::move(sent)));
    shares.push_back(std::move(s));
  }
  RETURN_IF_ERROR(assembly_->SettleBase());
  for (const Share& s : shares) {
    relay::ShareEncodeOptions options;
    options.chunk_bytes = chunk_bytes_;
    options.partition_bytes = partition_bytes_;
    options.threads = 1;
    ASSIGN_OR_RETURN(
        relay::EncodedShare encoded,
        relay::EncodeShare(s.input, s.coverage, assembly_->HashesFor(s.id, 0).hashes, options));
    relay::Produced p;
    p.chunks = static_cast<uint32_t>(encoded.chunks.size());
    p.pieces = static_cast<uint32_t>(encoded.pieces.size());
    uint64_t piece_changes = 0;
    for (const auto& piece : encoded.pieces) piece_changes += piece.encoded.change_count;
    p.changed_elements = encoded.stats.changed_elements - piece_changes;
    p.changes = encoded.changes;
    p.base_pieces = encoded.base_pieces;
    chunk_changes_ += p.changed_elements;
    ASSIGN_OR_RETURN(relay::Produced sent, relay::ParseProduced(relay::EncodeProduced(p)));
    assembly_->AddProduced(s.id, std::move(sent));
    encoded_.push_back(std::move(encoded));
  }
  return assembly_->SettleTarget();
}

Status SimTrainer::Stream(const relay::Source::ChunkMessageSink& sink, codec::DeltaStats* stats) {
  relay::DeltaMerger merger(assembly_->base(), assembly_->target(), chunk_bytes_, sink);
  merger.ExpectPieces(assembly_->reports());
  for (const relay::EncodedShare& share : encoded_) {
    for (const auto& chunk : share.chunks) RETURN_IF_ERROR(merger.AddChunk(chunk));
    for (const auto& p : share.pieces) {
      const codec::PieceView view{p.encoded.encoding, p.encoded.entropy, p.encoded.change_count,
                                  p.encoded.raw_size, p.encoded.payload};
      RETURN_IF_ERROR(merger.AddPiece(p.tensor, p.partition, view, nullptr));
    }
  }
  return merger.Finish(chunk_changes_, stats);
}

}  // namespace deltacast::sim
