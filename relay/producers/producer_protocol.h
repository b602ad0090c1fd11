// Messages between the root and its producers (docs/protocol.md, "Producers"):
// types 23..30 of relay/wire/protocol.h, same 8-byte header, little-endian. Producers
// join with the tree's handshake (CHALLENGE / HELLO with the token proof /
// WELCOME) and report failure with FAILED.
//
// A refit: PRODUCE -> COVERAGE (+ base pieces if asked) -> BASE_HASHES -> PRODUCED
// (mask contributions) -> PULL / SHARD_CHUNK / PIECES until every announced message
// has arrived -> PRODUCE_END.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/partition_codec.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/partition_hash.h"
#include "common/status.h"
#include "deltacast/tensor.h"
#include "layout/runs.h"
#include "relay/producers/fp8_share.h"
#include "relay/producers/shard_encoder.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

inline constexpr uint64_t kMaxProducerTensors = uint64_t{1} << 24;

struct Produce {
  uint64_t refit_id = 0;
  uint64_t partition_bytes = 0;
  uint64_t chunk_bytes = 0;
  bool hash_base = false;  // the root has no base manifest: send base pieces
};
struct Coverage {
  uint64_t refit_id = 0;
  std::vector<TensorSpec> tensors;  // the canonical table, sorted by name
  std::vector<PartitionShare> shares;
  std::vector<PartitionHash> base_pieces;  // parallel to shares, or empty
  // The producer's placement seen from the canonical side (where each run lands;
  // `local` and `src` are not sent): the root checks the mesh's exact coverage.
  std::string layout_name;
  std::vector<layout::Run> runs;
};
struct BaseHashes {
  uint64_t refit_id = 0;
  std::vector<PartitionHash> hashes;  // parallel to the producer's shares (zero: partial)
};
struct Produced {
  uint64_t refit_id = 0;
  uint32_t chunks = 0;  // SHARD_CHUNK messages that follow
  uint32_t pieces = 0;  // pieces in the PIECES messages that follow
  uint32_t piece_messages = 0;
  uint64_t changed_elements = 0;  // in the records of its chunks
  uint64_t local_bytes = 0;
  double seconds = 0;
  std::vector<ShareChange> changes;
  // The base contribution to each partition of the producer's coverage (parallel
  // to COVERAGE's shares), hashed in its compare pass: its proof of the base.
  std::vector<PartitionHash> base_pieces;
};
struct Pull {
  uint64_t refit_id = 0;
  uint32_t messages = 0;
};
struct PieceMessageEntry {
  uint32_t tensor = 0;
  uint64_t partition = 0;
  codec::PieceView piece;  // views into the message
};
struct ProduceEnd {
  uint64_t refit_id = 0;
  bool committed = false;
  std::string reason;
};

// Producers serving FP8, after PRODUCE and before COVERAGE: each producer's split
// blocks with their partial amaxes; the root answers each with the max-reduced
// amaxes of the blocks it listed (elements 0).
struct SplitAmaxes {
  uint64_t refit_id = 0;
  std::vector<SplitBlockAmax> blocks;
};

std::vector<std::byte> EncodeSplitAmaxes(const SplitAmaxes& m);
Result<SplitAmaxes> ParseSplitAmaxes(ByteSpan message);
std::vector<std::byte> EncodeProduce(const Produce& m);
std::vector<std::byte> EncodeCoverage(const Coverage& m);
std::vector<std::byte> EncodeBaseHashes(const BaseHashes& m);
std::vector<std::byte> EncodeProduced(const Produced& m);
std::vector<std::byte> EncodePull(const Pull& m);
std::vector<std::byte> EncodeShardChunk(uint64_t refit_id, ByteSpan chunk);
std::vector<std::byte> EncodePieces(uint64_t refit_id, std::span<const SharePiece> pieces);
std::vector<std::byte> EncodeProduceEnd(const ProduceEnd& m);

Result<Produce> ParseProduce(ByteSpan message);
Result<Coverage> ParseCoverage(ByteSpan message);
Result<BaseHashes> ParseBaseHashes(ByteSpan message);
Result<Produced> ParseProduced(ByteSpan message);
Result<Pull> ParsePull(ByteSpan message);
// The refit id and a view of the chunk.
Result<std::pair<uint64_t, ByteSpan>> ParseShardChunk(ByteSpan message);
Result<std::pair<uint64_t, std::vector<PieceMessageEntry>>> ParsePieces(ByteSpan message);
Result<ProduceEnd> ParseProduceEnd(ByteSpan message);

}  // namespace deltacast::relay
