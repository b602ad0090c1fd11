// UpRequests: the requests a relay node sends up the tree and the answers that come
// back. FETCH asks for a partition's bytes at a given hash: for this node's own
// repairs, rollbacks and catch-ups, and for children's FETCHes its store cannot
// serve. FETCH_MANIFEST, FETCH_CHAIN and FETCH_DELTA_CHUNK (catch-up) only the
// source answers: a relay routes its children's up, renumbered on the way, and
// passes the answers down.
//
// Owns: the requests in flight and their request ids. When the parent link drops,
// children's requests are answered "not found" (they may ask again) and this
// node's own get their on_lost handler (which may queue them for the next link).
//
// Thread safety: the node's loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "relay/tree/downstream.h"
#include "relay/tree/parent_link.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

class UpRequests {
 public:
  // Requests a node passes up for its children and has not had answered, at most:
  // beyond, a child's request is answered "not found" at once.
  static constexpr size_t kMaxRoutedRequests = 4096;

  using PartitionHandler = std::function<void(const PartitionData&)>;

  // `parent` and `downstream` must outlive this object.
  UpRequests(ParentLink& parent, Downstream& downstream)
      : parent_(parent), downstream_(downstream) {}

  // A fresh request id for one of this node's own requests (not a FETCH).
  uint64_t NextId() { return next_id_++; }

  // Asks the parent for partition bytes (`fetch.request_id` is assigned here).
  // `on_answer` runs with the PARTITION; if the link drops first, `on_lost` does
  // instead (if set). Returns the request id.
  uint64_t FetchPartition(Fetch fetch, PartitionHandler on_answer,
                          std::function<void()> on_lost = {});
  // A child's FETCH this node cannot serve: asked up; the answer goes to the child.
  void ForwardFetch(const std::string& child, Fetch fetch);
  // A child's FETCH_MANIFEST / FETCH_CHAIN / FETCH_DELTA_CHUNK: routed up, or
  // answered "not found" when there is no parent link.
  void RouteUp(const std::string& child, MessageType type, ByteSpan bytes);

  // A PARTITION from the parent: delivered to whoever asked (if anyone still does).
  void OnPartition(const PartitionData& data);
  // A MANIFEST / CHAIN / DELTA_CHUNK from the parent: passed down and true when it
  // answers a child's request; false when it is this node's own.
  bool PassDown(ByteSpan message);
  // The parent link dropped.
  void LinkLost();

 private:
  struct Pending {
    std::string child;  // empty: this node's own
    uint64_t child_request = 0;
    PartitionHandler on_answer;
    std::function<void()> on_lost;
  };
  struct Routed {
    std::string child;
    uint64_t child_request = 0;
    MessageType type = MessageType::kFetchManifest;
  };
  static std::vector<std::byte> NotFoundReply(MessageType request_type, uint64_t request_id);

  ParentLink& parent_;
  Downstream& downstream_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> fetches_;
  std::map<uint64_t, Routed> routed_;
};

}  // namespace deltacast::relay
