// The relay protocol's messages (docs/protocol.md): what nodes of the relay tree
// say to each other, and their encoding. Every message starts with an 8-byte
// header (magic, protocol version, type); CHUNK messages carry a codec chunk
// unchanged after it, so a relay forwards the very buffer it received.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/hash.h"
#include "common/partition_hash.h"
#include "common/status.h"

namespace deltacast::relay {

inline constexpr uint32_t kProtocolMagic = 0x50524344;  // "DCRP"
// 12: BEGIN says when the source began the refit (begun_at_us), which orders refits
// (docs/protocol.md, "Refits in order").
// 11: REFUSE names the refit a parent left out of it cannot serve.
// 10: striped trees (docs/protocol.md, "Stripes"): HELLO and BEGIN name the stripe a
// link belongs to (index, count); chunk k of a refit travels on stripe k mod count.
// 9: chunks are named by stream: BEGIN carries the stream id that numbers them, a
// HELLO the stream its applied chunks were numbered by (a root restarted mid-refit
// numbers the same delta otherwise).
// 6: PREPARED reports where each node's time went (receive, check, write, CPU, waiting
// for a CPU, waiting for the disk).
// 5: a parent tells a child that joined the version it holds (ACTIVE_VERSION), with
// its manifest when the child's HELLO named another, so the child names what differs.
// 4: FAILED says why (a node that cannot take part, or a delta that cannot reach its
// target); producers prove their base (PRODUCED) and send their layout (COVERAGE).
// 3: mutual proof of the token (HELLO carries the child's nonce, WELCOME the
// parent's proof), applied chunks as runs, signed BEGIN / CHUNK / decisions.
// 2: FETCH carries a 16-byte partition hash (docs/wire-format.md); 1 had xxh3-64.
inline constexpr uint8_t kProtocolVersion = 12;
inline constexpr size_t kMessageHeaderBytes = 8;
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kProofBytes = 32;      // HMAC-SHA256
inline constexpr size_t kSignatureBytes = 64;  // Ed25519 (relay/wire/signing.h); all zero: unsigned
using Signature = std::array<uint8_t, kSignatureBytes>;
inline constexpr size_t kMaxNodeIdBytes = 128;
inline constexpr size_t kMaxReasonBytes = 4096;
// The most stripes a refit is split into (HELLO and BEGIN refuse more).
inline constexpr uint32_t kMaxStripes = 64;

enum class MessageType : uint8_t {
  kChallenge = 1,   // parent -> child, first message on a link: a nonce to prove the token against
  kHello = 2,       // child -> parent: who I am, the proof, my active version
  kWelcome = 3,     // parent -> child: accepted
  kRefuse = 4,      // either way, then close: why
  kBegin = 5,       // down: a refit starts
  kChunk = 6,       // down: one codec chunk (data or END)
  kCredit = 7,      // up: room for this many more chunks
  kPrepared = 8,    // up: my subtree verified the target
  kFailed = 9,      // up: a node of my subtree cannot reach the target
  kCommit = 10,     // down: make the target active
  kAbort = 11,      // down: roll back to the base
  kCommitted = 12,  // up: my subtree made the target active
  kAborted = 13,    // up: my subtree rolled back
  kHeartbeat = 14,  // either way: the link is alive
  kFetch = 15,      // up: send me this partition's bytes at this hash (repair)
  kPartition = 16,  // down: the answer to a FETCH
  kFetchManifest = 17,    // up: send me the manifest of this version (catch-up)
  kManifest = 18,         // down: the answer to a FETCH_MANIFEST
  kFetchChain = 19,       // up: which retained deltas lead from my version to this one?
  kChain = 20,            // down: the answer to a FETCH_CHAIN
  kFetchDeltaChunk = 21,  // up: send me chunk N of the retained delta to this target
  kDeltaChunk = 22,       // down: the answer to a FETCH_DELTA_CHUNK (a CHUNK message)
  // Between the root and its producers (relay/producers/producer_protocol.h; docs/protocol.md,
  // "Producers"). Producers join with the same CHALLENGE / HELLO / WELCOME.
  kProduce = 23,        // root -> producer: a refit begins; report your share
  kCoverage = 24,       // producer -> root: the partitions I cover (and my base pieces)
  kBaseHashes = 25,     // root -> producer: base hashes of the partitions you cover whole
  kProduced = 26,       // producer -> root: my share is encoded; my mask contributions
  kPull = 27,           // root -> producer: room for this many more of your messages
  kShardChunk = 28,     // producer -> root: a data chunk of whole-partition records
  kPieces = 29,         // producer -> root: pieces of partitions others cover too
  kProduceEnd = 30,     // root -> producer: the refit is over (committed or not)
  kActiveVersion = 31,  // parent -> child after WELCOME: the version I hold (and its manifest)
  // Producers serving FP8 (docs/fp8.md): the partial amaxes of blocks they hold in
  // part, up; the max over every producer, down.
  kSplitAmaxes = 32,
};
inline constexpr uint8_t kMaxMessageType = 32;
inline constexpr size_t kMaxChainLinks = 64;
inline constexpr uint32_t kMaxAppliedInHello = 1u << 20;
// A HELLO lists applied chunks as runs (first, count), at most this many: it is
// read before the peer is authenticated, so it must stay small (64 KiB). A child
// whose applied set is more fragmented lists its first runs only and is sent the
// rest again, which it skips (those partitions are at the target).
inline constexpr size_t kMaxAppliedRunsInHello = 8192;
inline constexpr size_t kMaxHopTransports = 8;
inline constexpr size_t kMaxTransportNameBytes = 32;
// The largest partition (codec::kMaxPartitionBytes): a FETCH asks for one at most.
inline constexpr uint64_t kMaxFetchBytes = uint64_t{256} << 20;
std::string_view MessageTypeName(MessageType type);

struct Challenge {
  std::array<uint8_t, kNonceBytes> nonce{};
  std::string parent_id;
};
struct Hello {
  std::string node_id;
  std::array<uint8_t, kProofBytes> proof{};
  // The child's challenge to the parent: WELCOME must carry ParentProof over it.
  std::array<uint8_t, kNonceBytes> nonce{};
  Digest128 active_version;
  // The delta this node has in flight (all zero: none), whether it already
  // PREPARED it, and which of its chunks it has applied: a parent replays only the
  // rest, and tells a prepared node the outcome it missed.
  Digest128 inflight_base;
  Digest128 inflight_target;
  bool prepared = false;
  // The stream that numbered applied_chunks (BEGIN's stream_id; 0: unknown): a
  // parent streaming another stream of the delta counts none of them as held.
  uint64_t inflight_stream = 0;
  std::vector<uint32_t> applied_chunks;
  // The backend this link runs over and the child's preference list for the hop
  // (what both ends list, [[link]] rules applied): the parent refuses a backend it
  // does not speak and logs a hop that fell back from the first choice.
  std::string transport;
  std::vector<std::string> transports;
  // The stripe this link belongs to (docs/protocol.md, "Stripes"): a node joins its
  // parent in every stripe's tree, one link each. 0 of 1: not striped.
  uint32_t stripe = 0;
  uint32_t stripes = 1;
};
struct Welcome {
  std::array<uint8_t, kProofBytes> proof{};  // ParentProof: the parent holds the token too
};
struct Refuse {
  std::string reason;
  // A parent that cannot serve this refit on the link's stripe (it is left out of it:
  // docs/protocol.md, "Stripes", "A node left out"); 0: any other refusal.
  uint64_t refit_id = 0;
};
struct Begin {
  uint64_t refit_id = 0;
  Digest128 base_version;
  Digest128 target_version;
  uint64_t partition_bytes = 0;
  // SHA-256 of the target manifest's serialization (docs/wire-format.md); all zero:
  // not given. A node checks the manifest it derives against it.
  std::array<uint8_t, 32> manifest_digest{};
  // Names the numbering of this refit's chunks: random per stream the source (or a
  // root) starts, never 0. A chunk is (target, stream_id, sequence): the same delta
  // streamed again (a restarted root) may number its chunks otherwise.
  uint64_t stream_id = 0;
  // When the source began this refit, in microseconds of its clock (the wall clock;
  // simulated time in the simulator), strictly increasing within a source. Orders
  // refits: a source begins a refit only once the last is decided, so one begun
  // before another was decided before it began, and of two from the same base the
  // earlier was aborted or died with its source (docs/protocol.md, "Refits in
  // order"). 0: not given (no order).
  uint64_t begun_at_us = 0;
  Signature signature{};  // the source's, over the fields above (relay/wire/signing.h)
  // The stripe of the link this BEGIN came on, and how many there are; not signed:
  // one signed BEGIN serves every stripe, and a node refuses a BEGIN whose stripe is
  // not its link's.
  uint32_t stripe = 0;
  uint32_t stripes = 1;
};
struct Credit {
  uint32_t chunks = 0;
  // The refit the room is for: a parent ignores credit for another (a chunk of an
  // old refit released after the next began must not let the new one's chunks in
  // before the child has begun it).
  uint64_t refit_id = 0;
};
// One node's figures, carried up in PREPARED so the source can report them: where
// its time from BEGIN to PREPARED went (docs/protocol.md, "PREPARED").
struct NodeReport {
  std::string node_id;
  uint64_t chunk_bytes = 0;  // delta bytes received
  double apply_seconds = 0;  // BEGIN to verified target
  uint64_t partitions_applied = 0;
  double receive_seconds = 0;  // BEGIN to the END chunk received (streaming)
  // Applying, summed over chunks: checking every record leads to its target hash
  // before writing (decode + check, and the final check of the whole delta), and
  // writing the records into the store.
  double check_seconds = 0;
  double write_seconds = 0;
  // The apply thread's time: on a CPU, waiting for a CPU (other work on the
  // machine), and blocked: waiting for the disk (fsync of the spool and journal,
  // writes held back while the kernel writes dirty pages).
  double apply_cpu_seconds = 0;
  double cpu_wait_seconds = 0;
  double disk_wait_seconds = 0;
  // Not in PREPARED: filled in by the source from the node's PauseReport.
  double pause_seconds = 0;
  double hold_seconds = 0;
};
struct Prepared {
  uint64_t refit_id = 0;
  std::vector<NodeReport> nodes;  // every node of the sender's subtree
};
// Why a node says FAILED. A node that cannot take part (its disk, its store, an
// away child) may be left out under commit policy `available`; a delta that cannot
// take a node's base to the announced target is the delta's fault, would fail
// everywhere, and fails the refit under either policy.
enum class FailureKind : uint8_t {
  kNode = 0,
  kBadDelta = 1,
};
struct Failed {
  uint64_t refit_id = 0;
  std::string node_id;
  std::string reason;
  FailureKind kind = FailureKind::kNode;
};
struct Decision {  // COMMIT and ABORT
  uint64_t refit_id = 0;
  Digest128 target_version;
  Signature signature{};  // the source's (relay/wire/signing.h)
};
struct Fetch {
  uint64_t request_id = 0;
  std::string tensor;
  uint64_t element_offset = 0;
  uint64_t byte_length = 0;
  PartitionHash hash;  // the bytes wanted hash to this (docs/wire-format.md)
};
struct PartitionData {
  uint64_t request_id = 0;
  bool found = false;  // false: nobody up the tree has it
  ByteSpan bytes;      // view into the message
};
struct FetchManifest {
  uint64_t request_id = 0;
  Digest128 version;  // the manifest wanted
  Digest128 from;     // the asker's active version: the source serves only its own lineage
};
struct FetchChain {
  uint64_t request_id = 0;
  Digest128 from;  // the asker's active version
  Digest128 to;    // the committed version it must reach
};
// One retained delta of a chain.
struct ChainLink {
  Digest128 base;
  Digest128 target;
  uint64_t partition_bytes = 0;
  uint32_t chunks = 0;  // data chunks and the END chunk: sequences 0 .. chunks - 1
};
struct Chain {
  uint64_t request_id = 0;
  bool found = false;
  std::vector<ChainLink> links;  // oldest first
};
struct FetchDeltaChunk {
  uint64_t request_id = 0;
  Digest128 target;
  uint32_t sequence = 0;
};
// What a parent holds, told a child right after WELCOME. The child compares it with
// its own weights and reports what differs (Node::WaitForJoin); nothing is ever
// written from it.
struct ActiveVersion {
  Digest128 version;  // all zero: the parent does not know the cluster's version yet
  bool has_manifest = false;
  ByteSpan manifest;  // the serialized codec::Manifest of `version`; view into the message
};
// How long a node's engine was paused for a refit's writes, and how long the node
// held its verified delta before the decision (staged apply: the engine served
// meanwhile). Carried up in COMMITTED and ABORTED (docs/protocol.md).
struct PauseReport {
  std::string node_id;
  double pause_seconds = 0;
  double hold_seconds = 0;
};
struct Outcome {  // COMMITTED and ABORTED
  uint64_t refit_id = 0;
  uint32_t nodes = 0;               // nodes of the sender's subtree that completed the decision
  std::vector<PauseReport> pauses;  // those nodes' pauses, where known
};

// Message bytes ready to send.
std::vector<std::byte> EncodeChallenge(const Challenge& m);
std::vector<std::byte> EncodeHello(const Hello& m);
std::vector<std::byte> EncodeWelcome(const Welcome& m);
std::vector<std::byte> EncodeRefuse(const Refuse& m);
std::vector<std::byte> EncodeBegin(const Begin& m);
// A CHUNK message: the header, the codec chunk, then the source's signature over
// it (all zero: unsigned; relay/wire/signing.h signs).
std::vector<std::byte> EncodeChunk(ByteSpan chunk, const Signature& signature = {});
// The same made in the chunk's own buffer, which holds kMessageHeaderBytes free
// before the chunk: the header is written there and the signature's place (all zero)
// appended; the chunk is not copied.
std::vector<std::byte> FrameChunk(std::vector<std::byte>&& headroom_and_chunk);
std::vector<std::byte> EncodeCredit(const Credit& m);
std::vector<std::byte> EncodePrepared(const Prepared& m);
std::vector<std::byte> EncodeFailed(const Failed& m);
std::vector<std::byte> EncodeDecision(MessageType type, const Decision& m);
std::vector<std::byte> EncodeOutcome(MessageType type, const Outcome& m);
std::vector<std::byte> EncodeHeartbeat();
std::vector<std::byte> EncodeFetch(const Fetch& m);
std::vector<std::byte> EncodePartition(uint64_t request_id, bool found, ByteSpan bytes);
std::vector<std::byte> EncodeFetchManifest(const FetchManifest& m);
// A MANIFEST: the serialized codec::Manifest, or found = false.
std::vector<std::byte> EncodeManifest(uint64_t request_id, bool found, ByteSpan manifest);
std::vector<std::byte> EncodeFetchChain(const FetchChain& m);
std::vector<std::byte> EncodeChain(const Chain& m);
std::vector<std::byte> EncodeFetchDeltaChunk(const FetchDeltaChunk& m);
// A DELTA_CHUNK: a whole CHUNK message (header included), or found = false.
std::vector<std::byte> EncodeDeltaChunk(uint64_t request_id, bool found, ByteSpan chunk_message);
// An ACTIVE_VERSION; `manifest` empty: without one.
std::vector<std::byte> EncodeActiveVersion(const Digest128& version, ByteSpan manifest);
// Every request routed up the tree (FETCH_MANIFEST, FETCH_CHAIN, FETCH_DELTA_CHUNK)
// and its answer carry the request id as the first 8 body bytes: a relay renumbers
// them in place.
uint64_t RequestIdOf(ByteSpan message);
std::vector<std::byte> WithRequestId(ByteSpan message, uint64_t request_id);

// Validates the header; returns the type. Corrupt for bad magic, version, type or
// reserved bits.
Result<MessageType> PeekType(ByteSpan message);
// The body after the header.
inline ByteSpan Body(ByteSpan message) { return message.subspan(kMessageHeaderBytes); }
// Writes the message header of `type` at `out` (kMessageHeaderBytes).
void WriteMessageHeader(MessageType type, std::byte* out);
// A CHUNK message's codec chunk and signature.
struct ChunkParts {
  ByteSpan chunk;
  Signature signature{};
};
// Corrupt unless `message` is a CHUNK long enough to hold a signature.
Result<ChunkParts> SplitChunkMessage(ByteSpan message);
// The codec chunk of a CHUNK message (empty when it is too short to be one: the
// chunk parser then refuses it).
ByteSpan ChunkOf(ByteSpan message);

// Each parser validates the type and every length, and rejects trailing bytes.
Result<Challenge> ParseChallenge(ByteSpan message);
Result<Hello> ParseHello(ByteSpan message);
Result<Welcome> ParseWelcome(ByteSpan message);
Result<Refuse> ParseRefuse(ByteSpan message);
Result<Begin> ParseBegin(ByteSpan message);
Result<Credit> ParseCredit(ByteSpan message);
Result<Prepared> ParsePrepared(ByteSpan message);
Result<Failed> ParseFailed(ByteSpan message);
Result<Decision> ParseDecision(ByteSpan message);  // COMMIT or ABORT
Result<Outcome> ParseOutcome(ByteSpan message);    // COMMITTED or ABORTED
Result<Fetch> ParseFetch(ByteSpan message);
Result<PartitionData> ParsePartition(ByteSpan message);
Result<FetchManifest> ParseFetchManifest(ByteSpan message);
Result<PartitionData> ParseManifest(ByteSpan message);  // same shape as PARTITION
Result<FetchChain> ParseFetchChain(ByteSpan message);
Result<Chain> ParseChain(ByteSpan message);
Result<FetchDeltaChunk> ParseFetchDeltaChunk(ByteSpan message);
Result<PartitionData> ParseDeltaChunk(ByteSpan message);  // same shape as PARTITION
Result<ActiveVersion> ParseActiveVersion(ByteSpan message);

// The handshake's proofs (docs/protocol.md, "Handshake"), both HMAC-SHA256 under
// the cluster token, each with its own label so one can never stand in for the
// other. The child proves the token over the parent's nonce; the parent proves it
// over the child's nonce (and its own), so neither end trusts a peer that merely
// took the other's address.
std::array<uint8_t, kProofBytes> ChildProof(std::string_view token,
                                            const std::array<uint8_t, kNonceBytes>& parent_nonce,
                                            std::string_view child_id, std::string_view parent_id);
std::array<uint8_t, kProofBytes> ParentProof(std::string_view token,
                                             const std::array<uint8_t, kNonceBytes>& parent_nonce,
                                             const std::array<uint8_t, kNonceBytes>& child_nonce,
                                             std::string_view parent_id, std::string_view child_id);
bool ProofMatches(const std::array<uint8_t, kProofBytes>& a,
                  const std::array<uint8_t, kProofBytes>& b);
// A node id as the config allows it ([A-Za-z0-9._-], 1..kMaxNodeIdBytes): parsers
// refuse any other in a message, so what a peer names can always be logged as is.
bool ValidNodeId(std::string_view id);
std::array<uint8_t, kNonceBytes> RandomNonce();

}  // namespace deltacast::relay
