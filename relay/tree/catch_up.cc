#include "relay/tree/catch_up.h"

#include <fmt/core.h>

#include "codec/chunk.h"
#include "common/elapsed.h"
#include "common/log.h"
#include "common/runtime.h"

namespace deltacast::relay {

CatchUp::CatchUp(std::string node_id, UpRequests& requests, NodeStore& store,
                 const NodeStore::Journal& journal, std::function<void(const Result&)> finished)
    : node_id_(std::move(node_id)),
      requests_(requests),
      store_(store),
      journal_(journal),
      finished_(std::move(finished)) {}

void CatchUp::Start(const Digest128& to, uint64_t refit_id, bool resolving) {
  state_.emplace();
  ++generation_;
  state_->to = to;
  state_->refit_id = refit_id;
  state_->resolving = resolving;
  state_->start = RuntimeClock::now();
  log::Warn(fmt::format(
      "{}: holds {}{} but the cluster committed {}: catching up (by the deltas the source "
      "kept, else by the partitions that differ)",
      node_id_, journal_.version.ShortHex(),
      journal_.inflight
          ? " (with a delta to " + journal_.inflight->target.ShortHex() + " left in flight)"
          : "",
      to.ShortHex()));
  Pump();
}

void CatchUp::Resolves(uint64_t refit_id) {
  state_->refit_id = refit_id;
  state_->resolving = true;
}

// Asks for the chain; then keeps kWindow chunks of it, or (without a chain) the
// manifest and then kWindow partitions, requested.
void CatchUp::Pump() {
  if (!state_) return;
  State& c = *state_;
  if (!c.chain_answered) {
    if (c.chain_request == 0) {
      c.chain_request = requests_.NextId();
      requests_.Ask(EncodeFetchChain({c.chain_request, journal_.version, c.to}));
    }
    return;
  }
  if (c.chain_mode) return PumpChain();
  if (!c.have_manifest) {
    if (c.manifest_request == 0) {
      c.manifest_request = requests_.NextId();
      requests_.Ask(EncodeFetchManifest({c.manifest_request, c.to, journal_.version}));
    }
    return;
  }
  while (c.outstanding < kWindow && !c.queue.empty()) {
    const apply::CatchUpPartition part = c.queue.front();
    c.queue.pop_front();
    ++c.outstanding;
    const uint64_t generation = generation_;
    requests_.FetchPartition(
        {0, part.key.tensor, part.key.element_offset, part.byte_length, part.target_hash},
        [this, part, generation](const PartitionData& data) {
          if (generation == generation_) OnPartitionBytes(part, data);
        });
  }
}

void CatchUp::OnChain(const Chain& chain) {
  if (!state_ || chain.request_id != state_->chain_request) return;
  State& c = *state_;
  c.chain_request = 0;
  c.chain_answered = true;
  // A delta left in flight is resumed only if it is the chain's first.
  const bool usable =
      chain.found && !chain.links.empty() && chain.links.front().base == journal_.version &&
      chain.links.back().target == c.to &&
      (!journal_.inflight || (journal_.inflight->base == chain.links.front().base &&
                              journal_.inflight->target == chain.links.front().target));
  if (!usable) {
    log::Info(
        fmt::format("{}: no chain of kept deltas from {} to {}: fetching the partitions "
                    "that differ",
                    node_id_, journal_.version.ShortHex(), c.to.ShortHex()));
    return Pump();
  }
  c.chain_mode = true;
  c.links = chain.links;
  log::Info(fmt::format("{}: catching up by a chain of {} kept deltas", node_id_, c.links.size()));
  StartLink(0);
}

// Begins (or resumes) applying delta `i` of the chain.
void CatchUp::StartLink(size_t i) {
  State& c = *state_;
  c.link = i;
  c.missing.clear();
  c.pending_chunks.clear();
  c.outstanding = 0;
  c.chunks_done = 0;
  c.end.reset();
  const uint64_t generation = generation_;
  store_.BeginLink(
      c.links[i], [this, generation](const Status& status, const std::set<uint32_t>& journaled) {
        if (generation != generation_ || !state_ || !state_->chain_mode) return;
        if (!status.ok()) return FallBackToPartitions(status);
        // Chunks applied before a restart are not fetched again.
        State& c = *state_;
        for (uint32_t s = 0; s < c.links[c.link].chunks; ++s) {
          if (!journaled.contains(s)) c.missing.insert(s);
        }
        c.chunks_done = static_cast<uint32_t>(c.links[c.link].chunks - c.missing.size());
        ReportProgress();
        PumpChain();
      });
}

void CatchUp::PumpChain() {
  State& c = *state_;
  const ChainLink& link = c.links[c.link];
  while (c.outstanding < kWindow && !c.missing.empty()) {
    const uint32_t sequence = *c.missing.begin();
    c.missing.erase(c.missing.begin());
    const uint64_t request = requests_.NextId();
    c.pending_chunks[request] = sequence;
    ++c.outstanding;
    requests_.Ask(EncodeFetchDeltaChunk({request, link.target, sequence}));
  }
}

void CatchUp::OnDeltaChunk(const PartitionData& reply) {
  if (!state_ || !state_->chain_mode) return;
  State& c = *state_;
  auto it = c.pending_chunks.find(reply.request_id);
  if (it == c.pending_chunks.end()) return;
  const uint32_t sequence = it->second;
  c.pending_chunks.erase(it);
  --c.outstanding;
  const ChainLink link = c.links[c.link];
  if (!reply.found) {
    return FallBackToPartitions(
        Status::Unavailable(fmt::format("the source no longer keeps chunk {} of the delta to {}",
                                        sequence, link.target.ShortHex())));
  }
  // A chunk is checked before it is used: whole, of this delta, the one asked for.
  const ByteSpan chunk_message = reply.bytes;
  auto type = PeekType(chunk_message);
  Status intact = type.ok() && *type == MessageType::kChunk
                      ? codec::VerifyChunkChecksums(ChunkOf(chunk_message))
                      : Status::Corrupt("a DELTA_CHUNK that holds no CHUNK");
  if (intact.ok() && verify_key_) intact = VerifyChunkMessage(*verify_key_, chunk_message);
  auto header = intact.ok() ? codec::PeekChunkHeader(ChunkOf(chunk_message))
                            : deltacast::Result<codec::ChunkHeader>(intact);
  if (!header.ok() || header->sequence != sequence ||
      header->identity.target_version != link.target ||
      header->identity.base_version != link.base) {
    return FallBackToPartitions(Status::Corrupt(
        fmt::format("chunk {} of the kept delta to {} failed its checks{}", sequence,
                    link.target.ShortHex(), header.ok() ? "" : ": " + header.status().message())));
  }
  c.bytes += chunk_message.size();
  auto owned = std::make_shared<std::vector<std::byte>>(chunk_message.begin(), chunk_message.end());
  const uint64_t generation = generation_;
  store_.ApplyLinkChunk(
      sequence, owned,
      [this, generation](const Status& status, const std::optional<codec::DeltaSummary>& end) {
        if (generation == generation_) OnLinkChunkApplied(status, end);
      });
  PumpChain();
}

void CatchUp::OnLinkChunkApplied(const Status& status,
                                 const std::optional<codec::DeltaSummary>& end) {
  if (!state_ || !state_->chain_mode) return;
  if (!status.ok()) return FallBackToPartitions(status);
  State& c = *state_;
  ++c.chunks_done;
  ReportProgress();
  if (end) c.end = end;
  if (c.chunks_done == c.links[c.link].chunks && c.end) FinishLink();
}

// Every chunk of the delta applied: verify it whole, make it active, go on.
void CatchUp::FinishLink() {
  const uint64_t generation = generation_;
  store_.FinishLink(*state_->end, [this, generation](const Status& status) {
    if (generation != generation_ || !state_ || !state_->chain_mode) return;
    if (!status.ok()) return FallBackToPartitions(status);
    State& c = *state_;
    ++c.deltas;
    if (c.link + 1 < c.links.size()) return StartLink(c.link + 1);
    Finish(Status::Ok());
  });
}

// The chain cannot finish (a delta no longer kept, a torn partition, a damaged
// chunk): overwrite what differs instead, from wherever the store stands now.
void CatchUp::FallBackToPartitions(const Status& why) {
  State& c = *state_;
  log::Warn(
      fmt::format("{}: catch-up by the chain of deltas stopped ({}); fetching the "
                  "partitions that differ instead",
                  node_id_, why.ToString()));
  c.chain_mode = false;
  c.pending_chunks.clear();
  c.missing.clear();
  c.outstanding = 0;
  store_.DropCatchUp();
  Pump();
}

void CatchUp::OnManifest(const PartitionData& reply) {
  if (!state_ || reply.request_id != state_->manifest_request) return;
  state_->manifest_request = 0;
  const Digest128 to = state_->to;
  if (!reply.found) {
    return Finish(
        Status::Unavailable("the source does not serve version " + to.ShortHex() +
                            " to a node at " + journal_.version.ShortHex() +
                            " (not a version this cluster committed, or no source is publishing)"));
  }
  auto manifest = codec::Manifest::Parse(reply.bytes);
  if (!manifest.ok() || manifest->VersionId() != to) {
    return Finish(
        Status::Corrupt("the parent answered with a manifest that is not version " + to.ShortHex() +
                        (manifest.ok() ? " (it is " + manifest->VersionId().ShortHex() + ")"
                                       : ": " + manifest.status().message())));
  }
  state_->have_manifest = true;
  const uint64_t generation = generation_;
  store_.BeginCatchUp(
      std::move(*manifest),
      [this, generation](const Status& status, const std::vector<apply::CatchUpPartition>& parts) {
        if (generation != generation_ || !state_) return;
        if (!status.ok()) return Finish(status);
        state_->total = parts.size();
        state_->queue.assign(parts.begin(), parts.end());
        ReportProgress();
        log::Info(fmt::format("{}: {} partitions differ from {}", node_id_, parts.size(),
                              state_->to.ShortHex()));
        if (parts.empty()) return Commit();
        Pump();
      });
}

void CatchUp::OnPartitionBytes(const apply::CatchUpPartition& part, const PartitionData& data) {
  if (!state_) return;
  --state_->outstanding;
  if (!data.found) {
    return Finish(Status::Unavailable(
        fmt::format("no node up the tree has partition '{}' at element {} of version {}",
                    part.key.tensor, part.key.element_offset, state_->to.ShortHex())));
  }
  state_->bytes += data.bytes.size();
  auto owned = std::make_shared<std::vector<std::byte>>(data.bytes.begin(), data.bytes.end());
  const uint64_t generation = generation_;
  store_.WriteCatchUp(part.key, owned, part.target_hash, [this, generation](const Status& written) {
    if (generation != generation_ || !state_) return;
    if (!written.ok()) return Finish(written.WithContext("catch-up"));
    ++state_->written;
    ReportProgress();
    if (state_->written == state_->total) Commit();
  });
  Pump();
}

// Every differing partition written: the store must now hash to the target.
void CatchUp::Commit() {
  const uint64_t generation = generation_;
  store_.CommitCatchUp([this, generation](const Status& status) {
    if (generation == generation_) Finish(status);
  });
}

void CatchUp::ReportProgress(bool finished) const {
  if (!progress_ || !state_) return;
  const State& c = *state_;
  CatchUpProgress p{c.to, c.chain_mode, 0, 0, finished};
  if (c.chain_mode) {
    for (size_t i = 0; i < c.links.size(); ++i) {
      p.total += c.links[i].chunks;
      if (i < c.link) p.done += c.links[i].chunks;
    }
    p.done += c.chunks_done;
  } else {
    p.done = c.written;
    p.total = c.total;
  }
  progress_(p);
}

void CatchUp::Finish(const Status& status) {
  if (!state_) return;
  ReportProgress(/*finished=*/true);
  const State c = std::move(*state_);
  state_.reset();
  ++generation_;
  if (status.ok()) {
    log::Info(fmt::format(
        "{}: caught up to {}: {} kept deltas and {} partitions, {:.2f} MiB fetched in {:.2f} s",
        node_id_, c.to.ShortHex(), c.deltas, c.written, double(c.bytes) / (1 << 20),
        SecondsSince(c.start)));
  } else {
    log::Error(
        fmt::format("{}: catch-up to {} failed: {}", node_id_, c.to.ShortHex(), status.ToString()));
    store_.DropCatchUp();
  }
  finished_({c.to, c.refit_id, c.resolving, status, c.deltas, c.written, c.bytes});
}

}  // namespace deltacast::relay
