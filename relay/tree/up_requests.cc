#include "relay/tree/up_requests.h"

namespace deltacast::relay {

uint64_t UpRequests::FetchPartition(Fetch fetch, PartitionHandler on_answer,
                                    std::function<void()> on_lost) {
  fetch.request_id = next_id_++;
  fetches_[fetch.request_id] = Pending{"", 0, std::move(on_answer), std::move(on_lost)};
  parent_.Send(EncodeFetch(fetch));
  return fetch.request_id;
}

void UpRequests::ForwardFetch(const std::string& child, Fetch fetch) {
  const uint64_t child_request = fetch.request_id;
  // Without a parent nobody answers; and a child may not make this node remember
  // requests without bound: both get "not found" now, and may ask again.
  if (!parent_.joined() || fetches_.size() + routed_.size() >= kMaxRoutedRequests) {
    downstream_.SendTo(child, transport::MakeMessage(EncodePartition(child_request, false, {})));
    return;
  }
  fetch.request_id = next_id_++;
  fetches_[fetch.request_id] = Pending{child, child_request, nullptr, nullptr};
  parent_.Send(EncodeFetch(fetch));
}

void UpRequests::RouteUp(const std::string& child, MessageType type, ByteSpan bytes) {
  const uint64_t child_request = RequestIdOf(bytes);
  if (!parent_.joined() || fetches_.size() + routed_.size() >= kMaxRoutedRequests) {
    downstream_.SendTo(child, transport::MakeMessage(NotFoundReply(type, child_request)));
    return;
  }
  const uint64_t request = next_id_++;
  routed_[request] = Routed{child, child_request, type};
  parent_.Send(WithRequestId(bytes, request));
}

void UpRequests::OnPartition(const PartitionData& data) {
  auto it = fetches_.find(data.request_id);
  if (it == fetches_.end()) return;
  Pending pending = std::move(it->second);
  fetches_.erase(it);
  if (!pending.child.empty()) {  // a relay passing an answer down
    downstream_.SendTo(pending.child, transport::MakeMessage(EncodePartition(
                                          pending.child_request, data.found, data.bytes)));
    return;
  }
  if (pending.on_answer) pending.on_answer(data);
}

bool UpRequests::PassDown(ByteSpan message) {
  auto it = routed_.find(RequestIdOf(message));
  if (it == routed_.end()) return false;
  downstream_.SendTo(it->second.child,
                     transport::MakeMessage(WithRequestId(message, it->second.child_request)));
  routed_.erase(it);
  return true;
}

void UpRequests::LinkLost() {
  // Handlers may ask again (on the next link): run them over a detached map.
  std::map<uint64_t, Pending> lost = std::move(fetches_);
  fetches_.clear();
  for (auto& [request, pending] : lost) {
    if (!pending.child.empty()) {
      // This path is gone; the child may ask again.
      downstream_.SendTo(pending.child,
                         transport::MakeMessage(EncodePartition(pending.child_request, false, {})));
    } else if (pending.on_lost) {
      pending.on_lost();
    }
  }
  for (const auto& [request, asker] : routed_) {
    downstream_.SendTo(asker.child,
                       transport::MakeMessage(NotFoundReply(asker.type, asker.child_request)));
  }
  routed_.clear();
}

std::vector<std::byte> UpRequests::NotFoundReply(MessageType request_type, uint64_t request_id) {
  switch (request_type) {
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
