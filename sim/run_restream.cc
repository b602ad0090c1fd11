// --restream (Scenario::restream): a source killed mid-stream and the same delta
// streamed again by the restarted one, numbered otherwise, as a root restarted
// mid-refit does. Nodes that held part of the lost stream must not take its
// sequence numbers for the new stream's (docs/protocol.md, "Chunk identity").
#include <algorithm>

#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "relay/wire/protocol.h"
#include "sim/run_internal.h"

namespace deltacast::sim::internal {

relay::Source::DeltaStream Run::RestreamStream(const Tensors& base, const Tensors& target,
                                               bool renumber, bool kill_before_end) {
  return [this, &base, &target, renumber, kill_before_end](
             const relay::Source::ChunkMessageSink& sink, codec::DeltaStats* stats) -> Status {
    const codec::Manifest base_manifest = ManifestOf(base);
    const codec::Manifest target_manifest = ManifestOf(target);
    codec::DeltaEncoderOptions o;
    o.chunk_bytes = kChunkBytes;
    o.threads = 1;
    std::vector<std::vector<std::byte>> chunks;
    RETURN_IF_ERROR(codec::EncodeDelta(
        base_manifest, target_manifest, [&](size_t i) { return ByteSpan(base[i]); },
        [&](size_t i) { return ByteSpan(target[i]); }, Digest128{}, o,
        [&](std::vector<std::byte>&& c) {
          chunks.push_back(std::move(c));
          return Status::Ok();
        },
        stats));
    if (chunks.empty()) return Status::Internal("the encoder made no END chunk");
    std::vector<size_t> order(chunks.size() - 1);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    // Another order than the first stream's (seeded: the run stays replayable).
    if (renumber) std::shuffle(order.begin(), order.end(), q_.rng());
    const codec::DeltaIdentity identity{base_manifest.VersionId(), target_manifest.VersionId(),
                                        kPartitionBytes};
    for (size_t n = 0; n < order.size(); ++n) {
      std::vector<std::byte> c = std::move(chunks[order[n]]);
      RETURN_IF_ERROR(codec::RestampChunk(c, identity, static_cast<uint32_t>(n)));
      RETURN_IF_ERROR(sink(relay::EncodeChunk(c)));
    }
    if (kill_before_end) {
      // The nodes apply and journal what came; then the source dies without a decision.
      q_.RunFor(std::chrono::milliseconds(300));
      ++faults_begun_;
      disturbed_until_ = std::max(disturbed_until_, q_.Now());
      q_.Note("kill src after its data chunks, before END [restream]");
      throw Killed{};
    }
    return sink(relay::EncodeChunk(chunks.back()));
  };
}

}  // namespace deltacast::sim::internal
