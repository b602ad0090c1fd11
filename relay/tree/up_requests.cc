#include "relay/tree/up_requests.h"

#include "relay/tree/stripe_links.h"

namespace deltacast::relay {

// Sent again after a link dropped, to any joined parent, those that said "not found"
// too: skipped, a request whose only joined parents had said so waited for another
// to join, for good (the simulator's --stripes seed 11317 on a first version); asked
// again, such a parent says "not found" again and AskElsewhere hands that on.
void UpRequests::SendUp(Pending& p) {
  if (p.child.empty()) {
    p.stripe = up_.Send(p.bytes, /*again=*/p.sent, std::set<std::string>{});
  } else {
    // Up the tree of the stripe it came on while its parent there is joined, else any
    // other joined parent's (a path that changes stripes may loop: its hop count
    // ends it, RoutedId).
    const std::set<std::string> skip{NodeOfLink(p.child)};
    p.stripe = up_.SendOn(StripeOfLink(p.child), p.bytes, /*again=*/p.sent, skip);
    if (p.stripe == UpLink::kNone) p.stripe = up_.Send(p.bytes, /*again=*/p.sent, skip);
  }
  if (p.stripe != UpLink::kNone) p.parent = up_.ParentOf(p.stripe);
  p.sent = p.sent || p.stripe != UpLink::kNone;
}

// A relay with no parent joined answers "not found" (after kNoParentGrace), and so does one whose
// own path up lacks what was asked while another stripe's parent of this node would
// reach the source (the simulator's --stripes seed 11809: a catch-up's FETCH_MANIFEST
// went to a relay that every parent refused, its "not found" failed the catch-up and
// the refit, while this node's other parent, the source, serves that manifest). With
// one parent link (one stripe, a sender) there is nobody else and nothing changes.
// Only this node's own requests: a relay passes a child's "not found" down, and the
// child asks its other parents. Relays that each asked every parent of theirs would
// ask up every path of the graph the stripes make for an answer that is truly "not
// found" (a chain of kept deltas the source does not keep: seed 11809 again, 77,000
// tasks and a catch-up held 40 s).
bool UpRequests::AskElsewhere(Pending& p) {
  if (!p.child.empty() || p.parent.empty()) return false;
  p.not_found_by.insert(p.parent);
  const std::set<std::string>& skip = p.not_found_by;
  const uint32_t stripe = up_.Chosen(skip);
  if (stripe == UpLink::kNone) return false;
  p.stripe = up_.Send(p.bytes, /*again=*/false, skip);
  p.parent = up_.ParentOf(p.stripe);
  return true;
}

uint64_t UpRequests::FetchPartition(Fetch fetch, PartitionHandler on_answer) {
  fetch.request_id = next_id_++;
  Pending& p = pending_[fetch.request_id];
  p.type = MessageType::kFetch;
  p.bytes = EncodeFetch(fetch);
  p.on_answer = std::move(on_answer);
  SendUp(p);  // with no parent joined, it waits for one (LinkJoined)
  return fetch.request_id;
}

void UpRequests::Ask(std::vector<std::byte> request) {
  const uint64_t id = RequestIdOf(request);
  auto type = PeekType(request);
  Pending& p = pending_[id];
  p.type = type.ok() ? *type : MessageType::kFetchManifest;
  p.bytes = std::move(request);
  SendUp(p);
}

void UpRequests::ForwardFetch(const std::string& child, Fetch fetch) {
  const uint64_t child_request = fetch.request_id;
  // A child may not make this node remember requests without bound, nor a request
  // travel without end: "not found" now, and it may ask again.
  if (pending_.size() >= kMaxRoutedRequests || HopsOf(child_request) >= kMaxHops) {
    downstream_.SendTo(child, transport::MakeMessage(EncodePartition(child_request, false, {})));
    return;
  }
  fetch.request_id = RoutedId(child_request);
  Pending& p = pending_[fetch.request_id];
  p.child = child;
  p.child_request = child_request;
  p.type = MessageType::kFetch;
  p.bytes = EncodeFetch(fetch);
  SendUp(p);
  RoutedOrWaiting(p);
}

uint64_t UpRequests::RoutedId(uint64_t child_request) {
  const uint64_t hops = HopsOf(child_request) + 1;
  return (hops << kHopShift) | (next_id_++ & ((uint64_t{1} << kHopShift) - 1));
}

void UpRequests::RoutedOrWaiting(Pending& p) {
  if (p.stripe == UpLink::kNone) p.parentless_since = Clock::now();
}

void UpRequests::Tick(Clock::time_point now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    const Pending& p = it->second;
    if (p.child.empty() || p.stripe != UpLink::kNone || now - p.parentless_since < kNoParentGrace) {
      ++it;
      continue;
    }
    downstream_.SendTo(p.child, transport::MakeMessage(NotFoundReply(p.type, p.child_request)));
    it = pending_.erase(it);
  }
}

void UpRequests::RouteUp(const std::string& child, MessageType type, ByteSpan bytes) {
  const uint64_t child_request = RequestIdOf(bytes);
  if (pending_.size() >= kMaxRoutedRequests || HopsOf(child_request) >= kMaxHops) {
    downstream_.SendTo(child, transport::MakeMessage(NotFoundReply(type, child_request)));
    return;
  }
  const uint64_t request = RoutedId(child_request);
  Pending& p = pending_[request];
  p.child = child;
  p.child_request = child_request;
  p.type = type;
  p.bytes = WithRequestId(bytes, request);
  SendUp(p);
  RoutedOrWaiting(p);
}

void UpRequests::OnPartition(const PartitionData& data) {
  auto it = pending_.find(data.request_id);
  if (it == pending_.end() || it->second.type != MessageType::kFetch) return;
  if (!data.found && AskElsewhere(it->second)) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  if (!p.child.empty()) {  // a relay passing an answer down
    downstream_.SendTo(
        p.child, transport::MakeMessage(EncodePartition(p.child_request, data.found, data.bytes)));
    return;
  }
  if (p.on_answer) p.on_answer(data);
}

bool UpRequests::PassDown(ByteSpan message) {
  auto it = pending_.find(RequestIdOf(message));
  if (it == pending_.end() || it->second.type == MessageType::kFetch) return false;
  if (!Answers(it->second.type, message)) return true;  // not this request's answer: dropped
  if (!Found(message) && AskElsewhere(it->second)) return true;
  const Pending p = std::move(it->second);
  pending_.erase(it);
  if (p.child.empty()) return false;  // this node's own: the caller takes it
  downstream_.SendTo(p.child, transport::MakeMessage(WithRequestId(message, p.child_request)));
  return true;
}

UpRequests::Moved UpRequests::LinkLost(uint32_t stripe) {
  Moved moved;
  for (auto& [request, p] : pending_) {
    if (p.stripe != stripe) continue;
    // Sent again: a child's up its stripe's new link, this node's own to any joined
    // parent; else it waits for a link to join.
    SendUp(p);
    if (!p.child.empty()) RoutedOrWaiting(p);
    ++(p.stripe == UpLink::kNone ? moved.waiting : moved.again);
  }
  return moved;
}

size_t UpRequests::LinkJoined() {
  size_t sent = 0;
  for (auto& [request, p] : pending_) {
    if (p.stripe != UpLink::kNone) continue;
    SendUp(p);
    sent += p.stripe != UpLink::kNone;
  }
  return sent;
}

uint64_t UpRequests::FirstId() { return RuntimeRandomId() % (uint64_t{1} << 48) + 1; }

bool UpRequests::Answers(MessageType request, ByteSpan answer) {
  auto type = PeekType(answer);
  if (!type.ok()) return true;  // taken as it is: the caller reports what is wrong with it
  switch (request) {
    case MessageType::kFetchManifest:
      return *type == MessageType::kManifest;
    case MessageType::kFetchChain:
      return *type == MessageType::kChain;
    case MessageType::kFetchDeltaChunk:
      return *type == MessageType::kDeltaChunk;
    default:
      return false;
  }
}

bool UpRequests::Found(ByteSpan message) {
  auto type = PeekType(message);
  if (!type.ok()) return true;  // taken as it is: the caller reports what is wrong with it
  switch (*type) {
    case MessageType::kChain: {
      auto chain = ParseChain(message);
      return !chain.ok() || chain->found;
    }
    case MessageType::kManifest: {
      auto manifest = ParseManifest(message);
      return !manifest.ok() || manifest->found;
    }
    case MessageType::kDeltaChunk: {
      auto chunk = ParseDeltaChunk(message);
      return !chunk.ok() || chunk->found;
    }
    default:
      return true;
  }
}

std::vector<std::byte> UpRequests::NotFoundReply(MessageType request_type, uint64_t request_id) {
  switch (request_type) {
    case MessageType::kFetch:
      return EncodePartition(request_id, false, {});
    case MessageType::kFetchChain: {
      Chain none;
      none.request_id = request_id;
      return EncodeChain(none);
    }
    case MessageType::kFetchDeltaChunk:
      return EncodeDeltaChunk(request_id, false, {});
    default:
      return EncodeManifest(request_id, false, {});
  }
}

}  // namespace deltacast::relay
