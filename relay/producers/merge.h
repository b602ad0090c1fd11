// The root's side of many producers (docs/producers.md): combining their partition
// hash pieces into manifests, and their chunk streams and pieces into one delta.
//
// Manifests: partition hashes compose (common/partition_hash.h), so a base manifest
// is the XOR of the producers' base pieces plus each partition's length term, and
// the target is the base XOR every producer's mask contribution. No producer's
// bytes are needed.
//
// The delta: a producer's data chunks hold records of partitions it covers whole;
// they are stamped with the delta's identity and a sequence and passed on as they
// are (cut-through: header fields only). Partitions covered by several producers
// arrive as pieces; once every producer that changed one has sent its piece, they
// become one pieces record (codec::CombinePieces: one copy), or the piece itself as
// a record when only one producer changed it.
//
// Thread safety: a DeltaMerger is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "relay/producers/shard_encoder.h"
#include "transport/transport.h"

namespace deltacast::relay {

// What one producer reported about its share in a refit.
struct ShareReport {
  std::string producer;                    // for messages
  std::vector<PartitionShare> coverage;    // every partition it covers part of
  std::vector<PartitionHash> base_pieces;  // parallel to coverage; empty if not hashed
  std::vector<ShareChange> changes;        // every partition it changed
  // Parallel to coverage: its base pieces as hashed in the compare pass that made
  // its changes (PRODUCED), the proof that it compared against the base.
  std::vector<PartitionHash> proof;
};

// Checks that the shares cover every partition of `tensors` exactly: the covered
// element counts of each partition add up to its length. kInvalidArgument naming
// the tensor, the partition and the producers for a gap or an overlap.
Status CheckShares(const std::vector<TensorSpec>& tensors, uint64_t partition_bytes,
                   std::span<const ShareReport* const> shares);

// The base manifest from every share's base pieces (CheckShares first).
Result<codec::Manifest> CombineBaseManifest(const std::vector<TensorSpec>& tensors,
                                            uint64_t partition_bytes,
                                            std::span<const ShareReport* const> shares);
// Checks every share's proof of the base: for each partition, the shares' `proof`
// pieces plus the length term must give `base`'s hash. Otherwise a producer compared
// against bytes that are not the base version (a stale or corrupt previous shard, or
// another step's), its mask would take the receivers to a version that is neither
// step, and the linear partition hash would not notice: kFailedPrecondition naming
// the tensor, the partition, the producers that cover it and how many partitions
// differ. Call after CheckShares.
//
// `expected`, when given, is what each producer's pieces of the base should be (its
// pieces of the last committed target: ProofOfTarget), so that a partition shared by
// several producers names the one whose piece is off.
using ProducerPieces =
    std::map<std::string, std::map<std::pair<uint32_t, uint64_t>, PartitionHash>>;
Status CheckBaseProof(const codec::Manifest& base, std::span<const ShareReport* const> shares,
                      const ProducerPieces* expected = nullptr);
// Each share's pieces of the target (its base proof plus its mask contributions):
// what CheckBaseProof expects of the next refit from the same producers.
ProducerPieces ProofOfTarget(std::span<const ShareReport* const> shares);

// The target manifest: the base with every share's mask contributions added.
Result<codec::Manifest> CombineTargetManifest(const codec::Manifest& base,
                                              std::span<const ShareReport* const> shares);

// Receives each finished chunk of the merged delta as a whole CHUNK message
// (relay/wire/protocol.h) with an all-zero signature, in sequence order: what
// Source::PublishStream takes, signs and sends.
using ChunkMessageSink = std::function<Status(std::vector<std::byte> chunk_message)>;

class DeltaMerger {
 public:
  // `base` and `target` must outlive the merger.
  DeltaMerger(const codec::Manifest& base, const codec::Manifest& target, uint64_t chunk_bytes,
              ChunkMessageSink sink);

  // How many pieces each partition waits for: one per share that changed it and
  // covers it in part.
  void ExpectPieces(std::span<const ShareReport* const> shares);

  // A producer's data chunk (identity not yet stamped): copied once into a CHUNK
  // message, stamped there and handed on.
  Status AddChunk(ByteSpan chunk);
  // A producer's piece of a partition; its payload stays where it is (`keep` holds
  // it alive) until the partition's record is written. When it is the last piece
  // the partition waits for, the record is added to the merger's own chunk.
  Status AddPiece(uint32_t tensor, uint64_t partition, const codec::PieceView& piece,
                  std::shared_ptr<const void> keep);

  // Flushes the merger's last chunk and sends END. kFailedPrecondition if a
  // partition still waits for pieces. `changed_elements` is the producers' count
  // for the records in their own chunks (statistics in END).
  Status Finish(uint64_t changed_elements, codec::DeltaStats* stats);

  uint64_t pending_piece_bytes() const { return pending_bytes_; }
  const codec::DeltaIdentity& identity() const { return identity_; }

 private:
  Status Emit(std::vector<std::byte>&& message, uint32_t records);
  Status FlushOwn();

  const codec::Manifest& base_;
  const codec::Manifest& target_;
  const codec::DeltaIdentity identity_;
  const uint64_t chunk_bytes_;
  ChunkMessageSink sink_;
  struct Waiting {
    uint32_t expected = 0;
    std::vector<codec::PieceView> pieces;
    std::vector<std::shared_ptr<const void>> keep;
  };
  std::map<std::pair<uint32_t, uint64_t>, Waiting> waiting_;
  uint64_t pending_bytes_ = 0;
  std::optional<codec::ChunkBuilder> builder_;
  uint32_t sequence_ = 0;
  uint64_t records_ = 0;
  uint64_t delta_bytes_ = 0;
  uint64_t piece_changes_ = 0;
  std::array<uint64_t, codec::kMaxEncoding + 1> by_encoding_{};
};

}  // namespace deltacast::relay
