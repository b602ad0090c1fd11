#include "relay/replay.h"

#include <set>

namespace deltacast::relay {

Replay ReplayFor(const Hello& hello, const Begin& begin, Spool* spool,
                 transport::Message decision) {
  Replay replay;
  replay.messages.push_back(
      Downstream::Outgoing::Control(transport::MakeMessage(EncodeBegin(begin))));
  const bool same_delta = hello.inflight_target == begin.target_version;
  const std::set<uint32_t> applied(hello.applied_chunks.begin(), hello.applied_chunks.end());
  if (spool) {
    for (uint32_t sequence : spool->sequences()) {
      if (same_delta && applied.contains(sequence)) continue;
      replay.messages.push_back(Downstream::Outgoing::Chunk(
          [spool, sequence] { return spool->Read(sequence); }, {begin.target_version, sequence}));
      ++replay.chunks;
    }
  }
  if (decision) replay.messages.push_back(Downstream::Outgoing::Control(std::move(decision)));
  return replay;
}

}  // namespace deltacast::relay
