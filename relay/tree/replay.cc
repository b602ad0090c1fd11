#include "relay/tree/replay.h"

#include <set>

#include "codec/chunk.h"

namespace deltacast::relay {
namespace {

bool IsEnd(Spool& spool, uint32_t sequence) {
  auto message = spool.Read(sequence);
  if (!message.ok()) return false;
  auto header = codec::PeekChunkHeader(ChunkOf(**message));
  return header.ok() && header->kind == codec::ChunkKind::kEnd;
}

// Whether `sequences` (ascending, the END last) hold every data chunk of `stripe`.
bool StripeWhole(const std::vector<uint32_t>& sequences, uint32_t stripe, uint32_t stripes) {
  const uint32_t end = sequences.back();
  size_t have = 0;
  for (uint32_t sequence : sequences) have += sequence < end && sequence % stripes == stripe;
  return have == (end > stripe ? (end - stripe - 1) / stripes + 1 : 0);
}

// `keep` (may be null) owns `spool` for as long as a loader exists.
Replay Build(const Hello& hello, const Begin& begin, Spool* spool, std::shared_ptr<Spool> keep,
             transport::Message decision) {
  Replay replay;
  // The BEGIN names the stripe of the link it goes on (the child's HELLO says it);
  // Downstream::Requeue drops the chunks another stripe carries.
  Begin named = begin;
  named.stripe = hello.stripe;
  named.stripes = hello.stripes;
  replay.messages.push_back(
      Downstream::Outgoing::Control(transport::MakeMessage(EncodeBegin(named))));
  // Its applied chunks name this refit's chunks only if the same stream numbered
  // them (a restarted root streams the delta anew, numbered otherwise).
  const bool same_delta = hello.inflight_target == begin.target_version;
  const bool same_stream = same_delta && hello.inflight_stream == begin.stream_id;
  const std::set<uint32_t> applied(hello.applied_chunks.begin(), hello.applied_chunks.end());
  // A child that holds the target already (it committed through another parent
  // while this one has no decision yet) needs no data chunk: the END alone makes it
  // PREPARED, as its store is at the target. Found by the simulator (seed 1688: a
  // relay back from its failover parent was replayed the whole delta, and forwarded
  // it to its own children, who had it).
  const bool at_target =
      !same_delta && hello.inflight_target.IsZero() && hello.active_version == begin.target_version;
  if (spool) {
    const std::vector<uint32_t> sequences = spool->sequences();
    for (uint32_t sequence : sequences) {
      if (same_stream && applied.contains(sequence)) continue;
      // Only the last can be the END (it has the highest sequence); it goes on every
      // stripe, a data chunk only on its own.
      const bool end = sequence == sequences.back() && IsEnd(*spool, sequence);
      if (at_target && !end) continue;
      // Striped, the END this node holds may have come on another stripe than the
      // child's, before this one's data chunks: replayed now, it reached the child
      // ahead of them (each stripe's END must follow its data chunks: the child
      // takes its ENDs for the whole delta and failed it, "received 0 of 1 data
      // chunks"; the simulator's --stripes --coord seed 144). It goes down with the
      // rest of that stripe once it comes here.
      if (end && hello.stripes > 1 && !StripeWhole(sequences, hello.stripe, hello.stripes))
        continue;
      if (!end && hello.stripes > 1 && sequence % hello.stripes != hello.stripe) continue;
      replay.messages.push_back(
          Downstream::Outgoing::Chunk([spool, keep, sequence] { return spool->Read(sequence); },
                                      {begin.target_version, sequence, !end}));
      ++replay.chunks;
    }
  }
  if (decision) replay.messages.push_back(Downstream::Outgoing::Control(std::move(decision)));
  return replay;
}

}  // namespace

std::vector<Downstream::Outgoing> HeldChunks(const Begin& begin, std::shared_ptr<Spool> spool) {
  std::vector<Downstream::Outgoing> held;
  if (!spool) return held;
  const std::vector<uint32_t> sequences = spool->sequences();
  for (uint32_t sequence : sequences) {
    // Only the last can be the END (it has the highest sequence).
    const bool data = sequence != sequences.back() || !IsEnd(*spool, sequence);
    // Striped, it goes down every stripe: held, it may have come before a stripe's
    // data chunks, which it must follow (Build); then its parents send it again, as
    // it was not applied, and it goes down with the rest.
    if (!data && begin.stripes > 1 && sequences.size() != size_t{sequence} + 1) continue;
    held.push_back(Downstream::Outgoing::Chunk([spool, sequence] { return spool->Read(sequence); },
                                               {begin.target_version, sequence, data}));
  }
  return held;
}

Replay ReplayFor(const Hello& hello, const Begin& begin, Spool* spool,
                 transport::Message decision) {
  return Build(hello, begin, spool, nullptr, std::move(decision));
}

Replay ReplayFor(const Hello& hello, const Begin& begin, std::shared_ptr<Spool> spool,
                 transport::Message decision) {
  Spool* raw = spool.get();
  return Build(hello, begin, raw, std::move(spool), std::move(decision));
}

}  // namespace deltacast::relay
