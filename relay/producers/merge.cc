#include "relay/producers/merge.h"

#include <cstring>
#include <optional>
#include <set>

#include "codec/partition.h"
#include "relay/producers/producer_protocol.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {
namespace {

std::string PartitionName(const TensorSpec& t, uint64_t k) {
  return "tensor '" + t.name + "' partition " + std::to_string(k);
}

// Where (tensor, partition) sits in a flat per-partition array.
class PartitionIndex {
 public:
  PartitionIndex(const std::vector<TensorSpec>& tensors, uint64_t partition_bytes) {
    first_.push_back(0);
    for (const auto& t : tensors) {
      first_.push_back(first_.back() + codec::PartitionCount(t, partition_bytes));
    }
  }
  bool Valid(uint32_t tensor, uint64_t partition) const {
    return tensor + 1 < first_.size() && partition < first_[tensor + 1] - first_[tensor];
  }
  uint64_t At(uint32_t tensor, uint64_t partition) const { return first_[tensor] + partition; }
  uint64_t size() const { return first_.back(); }

 private:
  std::vector<uint64_t> first_;
};

Status CheckIndices(const PartitionIndex& index, const ShareReport& s) {
  for (const auto& c : s.coverage) {
    if (!index.Valid(c.tensor, c.partition)) {
      return Status::InvalidArgument("producer " + s.producer + " covers partition " +
                                     std::to_string(c.partition) + " of tensor " +
                                     std::to_string(c.tensor) + ", which does not exist");
    }
  }
  for (const auto& c : s.changes) {
    if (!index.Valid(c.tensor, c.partition)) {
      return Status::InvalidArgument("producer " + s.producer +
                                     " changed a partition that does "
                                     "not exist");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckShares(const std::vector<TensorSpec>& tensors, uint64_t partition_bytes,
                   std::span<const ShareReport* const> shares) {
  PartitionIndex index(tensors, partition_bytes);
  std::vector<uint64_t> covered(index.size(), 0);
  for (const ShareReport* s : shares) {
    RETURN_IF_ERROR(CheckIndices(index, *s));
    for (const auto& c : s->coverage) covered[index.At(c.tensor, c.partition)] += c.covered;
  }
  for (uint32_t t = 0; t < tensors.size(); ++t) {
    for (uint64_t k = 0; k < codec::PartitionCount(tensors[t], partition_bytes); ++k) {
      const codec::PartitionRef p = codec::PartitionAt(tensors[t], t, k, partition_bytes);
      const uint64_t n = covered[index.At(t, k)];
      if (n == p.element_count) continue;
      std::string who;
      for (const ShareReport* s : shares) {
        for (const auto& c : s->coverage) {
          if (c.tensor == t && c.partition == k) {
            who += (who.empty() ? "" : ", ") + s->producer + " (" + std::to_string(c.covered) + ")";
          }
        }
      }
      return Status::InvalidArgument(
          PartitionName(tensors[t], k) + " has " + std::to_string(p.element_count) +
          " elements but the producers cover " + std::to_string(n) + " of them" +
          (n < p.element_count ? " (a gap: no layout rule covers some)" : " (an overlap)") +
          (who.empty() ? "" : ": " + who));
    }
  }
  return Status::Ok();
}

namespace {

// The manifest the shares' `pieces` (base_pieces or proof) combine to.
Result<codec::Manifest> Combine(const std::vector<TensorSpec>& tensors, uint64_t partition_bytes,
                                std::span<const ShareReport* const> shares,
                                std::vector<PartitionHash> ShareReport::*pieces) {
  codec::Manifest m;
  m.partition_bytes = partition_bytes;
  m.tensors = tensors;
  for (const auto& t : tensors) {
    m.partition_hashes.emplace_back(codec::PartitionCount(t, partition_bytes));
  }
  for (const ShareReport* s : shares) {
    const std::vector<PartitionHash>& hashes = s->*pieces;
    if (hashes.size() != s->coverage.size()) {
      return Status::FailedPrecondition("producer " + s->producer + " did not hash its base");
    }
    for (size_t i = 0; i < s->coverage.size(); ++i) {
      m.partition_hashes[s->coverage[i].tensor][s->coverage[i].partition] ^= hashes[i];
    }
  }
  for (uint32_t t = 0; t < tensors.size(); ++t) {
    for (uint64_t k = 0; k < m.partition_hashes[t].size(); ++k) {
      const auto p = codec::PartitionAt(tensors[t], t, k, partition_bytes);
      m.partition_hashes[t][k] ^=
          PartitionLengthTerm(p.element_count * ElementSize(tensors[t].dtype));
    }
  }
  return m;
}

}  // namespace

Result<codec::Manifest> CombineBaseManifest(const std::vector<TensorSpec>& tensors,
                                            uint64_t partition_bytes,
                                            std::span<const ShareReport* const> shares) {
  return Combine(tensors, partition_bytes, shares, &ShareReport::base_pieces);
}

ProducerPieces ProofOfTarget(std::span<const ShareReport* const> shares) {
  ProducerPieces out;
  for (const ShareReport* s : shares) {
    auto& pieces = out[s->producer];
    for (size_t i = 0; i < s->coverage.size() && i < s->proof.size(); ++i) {
      pieces[{s->coverage[i].tensor, s->coverage[i].partition}] = s->proof[i];
    }
    for (const ShareChange& c : s->changes) pieces[{c.tensor, c.partition}] ^= c.mask;
  }
  return out;
}

Status CheckBaseProof(const codec::Manifest& base, std::span<const ShareReport* const> shares,
                      const ProducerPieces* expected) {
  ASSIGN_OR_RETURN(codec::Manifest proved,
                   Combine(base.tensors, base.partition_bytes, shares, &ShareReport::proof));
  std::optional<std::pair<uint32_t, uint64_t>> first;
  std::set<std::pair<uint32_t, uint64_t>> bad;
  std::set<uint32_t> tensors;
  for (uint32_t t = 0; t < base.tensors.size(); ++t) {
    for (uint64_t k = 0; k < base.partition_hashes[t].size(); ++k) {
      if (proved.partition_hashes[t][k] == base.partition_hashes[t][k]) continue;
      if (!first) first = {t, k};
      bad.insert({t, k});
      tensors.insert(t);
    }
  }
  if (!first) return Status::Ok();
  const uint64_t partitions = bad.size();
  // The producers every bad partition has in common: one producer at fault shares
  // each of its bad partitions with different others, so this narrows to it.
  std::map<std::string, uint64_t> in_bad;
  for (const ShareReport* s : shares) {
    for (const auto& c : s->coverage) in_bad[s->producer] += bad.count({c.tensor, c.partition});
  }
  std::set<std::string> common;
  for (const auto& [producer, n] : in_bad) {
    if (n == partitions) common.insert(producer);
  }
  const uint32_t t = first->first;
  const uint64_t k = first->second;
  // The piece a producer's proof of (t, k) should be, if the last refit says.
  auto expected_piece = [&](const std::string& producer) -> const PartitionHash* {
    if (expected == nullptr) return nullptr;
    const auto p = expected->find(producer);
    if (p == expected->end()) return nullptr;
    const auto piece = p->second.find({t, k});
    return piece == p->second.end() ? nullptr : &piece->second;
  };
  std::vector<std::string> who, off;
  bool all_expected = true;
  for (const ShareReport* s : shares) {
    for (size_t i = 0; i < s->coverage.size(); ++i) {
      const PartitionShare& c = s->coverage[i];
      if (c.tensor != t || c.partition != k) continue;
      who.push_back(s->producer);
      const PartitionHash* want = expected_piece(s->producer);
      if (want == nullptr) {
        all_expected = false;
      } else if (*want != s->proof[i]) {
        off.push_back(s->producer);
      }
    }
  }
  // Each producer's piece is known from the last refit: name the ones that are off;
  // otherwise those of the partition's that every bad partition has in common.
  if (all_expected && !off.empty()) {
    who = off;
  } else {
    std::vector<std::string> narrowed;
    for (const auto& w : who) {
      if (common.contains(w)) narrowed.push_back(w);
    }
    if (!narrowed.empty()) who = narrowed;
  }
  std::string names;
  for (const auto& w : who) names += (names.empty() ? "" : ", ") + w;
  return Status::FailedPrecondition(
      (who.size() == 1 ? "producer " + names + " compared against another base than"
                       : "one of producers " + names +
                             " (who share it) compared against "
                             "another base than") +
      " the version the tree holds (" + base.VersionId().ShortHex() + "): its base piece of " +
      PartitionName(base.tensors[t], k) + " does not match (" + std::to_string(partitions) +
      " partitions of " + std::to_string(tensors.size()) +
      " tensors differ); a stale, corrupt or other step's previous shard; nothing was sent");
}

Result<codec::Manifest> CombineTargetManifest(const codec::Manifest& base,
                                              std::span<const ShareReport* const> shares) {
  PartitionIndex index(base.tensors, base.partition_bytes);
  codec::Manifest m = base;
  for (const ShareReport* s : shares) {
    RETURN_IF_ERROR(CheckIndices(index, *s));
    for (const auto& c : s->changes) m.partition_hashes[c.tensor][c.partition] ^= c.mask;
  }
  return m;
}

DeltaMerger::DeltaMerger(const codec::Manifest& base, const codec::Manifest& target,
                         uint64_t chunk_bytes, ChunkMessageSink sink)
    : base_(base),
      target_(target),
      identity_{base.VersionId(), target.VersionId(), target.partition_bytes},
      chunk_bytes_(chunk_bytes),
      sink_(std::move(sink)) {}

void DeltaMerger::ExpectPieces(std::span<const ShareReport* const> shares) {
  for (const ShareReport* s : shares) {
    for (const auto& c : s->changes) {
      if (!c.whole) waiting_[{c.tensor, c.partition}].expected++;
    }
  }
}

// `message` holds kMessageHeaderBytes free, then a chunk whose sequence is not set yet.
Status DeltaMerger::Emit(std::vector<std::byte>&& message, uint32_t records) {
  RETURN_IF_ERROR(codec::RestampChunk(MutableByteSpan(message).subspan(kMessageHeaderBytes),
                                      identity_, sequence_));
  delta_bytes_ += message.size() - kMessageHeaderBytes;
  records_ += records;
  ++sequence_;
  return sink_(FrameChunk(std::move(message)));
}

Status DeltaMerger::AddChunk(ByteSpan chunk) {
  ASSIGN_OR_RETURN(codec::ChunkHeader header, codec::PeekChunkHeader(chunk));
  if (chunk.size() != codec::kChunkHeaderBytes + header.payload_length) {
    return Status::Corrupt("a producer's chunk of " + std::to_string(chunk.size()) +
                           " bytes declares a payload of " + std::to_string(header.payload_length));
  }
  // One pass over the bytes: no zero fill before the copy.
  std::vector<std::byte> message;
  message.reserve(kMessageHeaderBytes + chunk.size() + kSignatureBytes);
  message.resize(kMessageHeaderBytes);
  message.insert(message.end(), chunk.begin(), chunk.end());
  return Emit(std::move(message), header.record_count);
}

Status DeltaMerger::FlushOwn() {
  if (!builder_ || builder_->record_count() == 0) return Status::Ok();
  const uint32_t records = static_cast<uint32_t>(builder_->record_count());
  std::vector<std::byte> message = builder_->Finish();
  builder_.reset();
  return Emit(std::move(message), records);
}

Status DeltaMerger::AddPiece(uint32_t tensor, uint64_t partition, const codec::PieceView& piece,
                             std::shared_ptr<const void> keep) {
  auto it = waiting_.find({tensor, partition});
  if (it == waiting_.end() || it->second.pieces.size() >= it->second.expected) {
    return Status::InvalidArgument("a piece of partition " + std::to_string(partition) +
                                   " of tensor " + std::to_string(tensor) +
                                   " that no producer announced");
  }
  Waiting& w = it->second;
  pending_bytes_ += piece.payload.size();
  w.pieces.push_back(piece);
  w.keep.push_back(std::move(keep));
  if (w.pieces.size() < w.expected) return Status::Ok();

  const TensorSpec& t = target_.tensors[tensor];
  const auto p = codec::PartitionAt(t, tensor, partition, target_.partition_bytes);
  // Sequence 0 until it is emitted (producer chunks may be numbered meanwhile), with
  // room for the CHUNK message header in front.
  if (!builder_) {
    builder_.emplace(identity_, 0, kMessageHeaderBytes);
    builder_->Reserve(chunk_bytes_ + (chunk_bytes_ >> 2) + kSignatureBytes);
  }
  const PartitionHash& bh = base_.partition_hashes[tensor][partition];
  const PartitionHash& th = target_.partition_hashes[tensor][partition];
  uint64_t changes = 0;
  for (const auto& v : w.pieces) changes += v.change_count;
  if (w.pieces.size() == 1) {
    // One producer changed it: its piece, with partition positions, is the record.
    builder_->AddView(t.name, t.dtype, p.element_offset, p.element_count, bh, th, w.pieces[0]);
    by_encoding_[static_cast<size_t>(w.pieces[0].encoding)]++;
  } else {
    builder_->AddPieces(t.name, t.dtype, p.element_offset, p.element_count, bh, th, w.pieces);
    by_encoding_[static_cast<size_t>(codec::Encoding::kPieces)]++;
  }
  piece_changes_ += changes;
  for (const auto& v : w.pieces) pending_bytes_ -= v.payload.size();
  waiting_.erase(it);
  if (builder_->size_bytes() >= chunk_bytes_) return FlushOwn();
  return Status::Ok();
}

Status DeltaMerger::Finish(uint64_t changed_elements, codec::DeltaStats* stats) {
  if (!waiting_.empty()) {
    const auto& [key, w] = *waiting_.begin();
    return Status::FailedPrecondition(
        std::to_string(waiting_.size()) + " partitions still wait for pieces, e.g. " +
        PartitionName(target_.tensors[key.first], key.second) + " (" +
        std::to_string(w.pieces.size()) + " of " + std::to_string(w.expected) + ")");
  }
  RETURN_IF_ERROR(FlushOwn());
  codec::DeltaSummary summary{Digest128{}, sequence_, records_, target_.TotalBytes(),
                              changed_elements + piece_changes_};
  std::vector<std::byte> end = codec::BuildEndChunk(identity_, sequence_, summary);
  const uint64_t end_bytes = end.size();
  RETURN_IF_ERROR(sink_(EncodeChunk(end)));
  if (stats) {
    stats->tensor_bytes = target_.TotalBytes();
    stats->partitions = target_.PartitionTotal();
    stats->changed_partitions = records_;
    stats->changed_elements = summary.changed_elements;
    stats->delta_bytes = delta_bytes_ + end_bytes;
    stats->chunks = sequence_ + 1;
    for (size_t e = 0; e < by_encoding_.size(); ++e)
      stats->records_by_encoding[e] += by_encoding_[e];
  }
  return Status::Ok();
}

}  // namespace deltacast::relay
