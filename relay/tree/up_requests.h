// UpRequests: the requests a relay node sends up the tree and the answers that come
// back. FETCH asks for a partition's bytes at a given hash: for this node's own
// repairs, rollbacks and catch-ups, and for children's FETCHes its store cannot
// serve. FETCH_MANIFEST, FETCH_CHAIN and FETCH_DELTA_CHUNK (catch-up) only the
// source answers: this node's own go up as they are, a child's are renumbered on the
// way up and back on the way down.
//
// Each request goes to the parent UpLink chooses (striped trees: any joined stripe's
// parent; docs/protocol.md, "Stripes"), and its answer is taken from whichever link
// it comes on. When the link a request went on drops, the request is sent again to
// another joined parent; with none joined, this node's own wait for the next link
// to join (LinkJoined), and a child's is answered "not found" (it may ask again).
// A "not found" is one parent's answer, not the tree's (a relay with no parent
// joined gives it at once): this node's own request is asked again of each other
// joined parent that has not said so before "not found" is taken (AskElsewhere); a
// child's is passed down as it came.
//
// Owns: the requests in flight, with the stripe each went on and its bytes (to send
// it again), and the request ids.
//
// Thread safety: the node's loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "relay/tree/downstream.h"
#include "relay/tree/up_link.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

class UpRequests {
 public:
  // Requests a node passes up for its children and has not had answered, at most:
  // beyond, a child's request is answered "not found" at once.
  static constexpr size_t kMaxRoutedRequests = 4096;

  using PartitionHandler = std::function<void(const PartitionData&)>;

  // `up` and `downstream` must outlive this object.
  UpRequests(UpLink& up, Downstream& downstream) : up_(up), downstream_(downstream) {}
  // A node with one parent link (a sender): every request goes on it. `parent` and
  // `downstream` must outlive this object.
  UpRequests(ParentLink& parent, Downstream& downstream)
      : single_(std::make_unique<UpLink>(std::vector<ParentLink*>{&parent}, nullptr)),
        up_(*single_),
        downstream_(downstream) {}

  // A fresh request id for one of this node's own requests (not a FETCH).
  uint64_t NextId() { return next_id_++; }

  // Asks up the tree for partition bytes (`fetch.request_id` is assigned here).
  // `on_answer` runs with the PARTITION. Returns the request id.
  uint64_t FetchPartition(Fetch fetch, PartitionHandler on_answer);
  // One of this node's own FETCH_MANIFEST / FETCH_CHAIN / FETCH_DELTA_CHUNK, its id
  // from NextId: sent up; its answer is PassDown's false.
  void Ask(std::vector<std::byte> request);
  // A child's FETCH this node cannot serve: asked up; the answer goes to the child.
  void ForwardFetch(const std::string& child, Fetch fetch);
  // A child's FETCH_MANIFEST / FETCH_CHAIN / FETCH_DELTA_CHUNK: routed up, or
  // answered "not found" when no parent is joined.
  void RouteUp(const std::string& child, MessageType type, ByteSpan bytes);

  // A PARTITION from a parent: delivered to whoever asked (if anyone still does).
  void OnPartition(const PartitionData& data);
  // A MANIFEST / CHAIN / DELTA_CHUNK from a parent: passed down and true when it
  // answers a child's request; false when it is this node's own (or nobody's).
  bool PassDown(ByteSpan message);
  // What LinkLost did with the requests that went on the dropped link.
  struct Moved {
    size_t again = 0;      // sent again to another joined parent
    size_t waiting = 0;    // this node's own, waiting for a parent to join
    size_t not_found = 0;  // a child's, answered "not found" (no parent joined)
  };
  // The link of `stripe` dropped (0: the one link of a node with one): what went on
  // it is sent again (see above).
  Moved LinkLost(uint32_t stripe = 0);
  // A link joined: this node's requests that waited for one go up now. Returns how
  // many.
  size_t LinkJoined();

 private:
  // A request in flight. `child` empty: this node's own.
  struct Pending {
    std::string child;
    uint64_t child_request = 0;
    MessageType type = MessageType::kFetch;
    std::vector<std::byte> bytes;        // as sent up (renumbered): sent again if its link drops
    uint32_t stripe = UpLink::kNone;     // the link it went on; kNone: waiting for one
    bool sent = false;                   // went up once (then sending it again counts as such)
    PartitionHandler on_answer;          // this node's own FETCH
    std::string parent;                  // the parent it went to last
    std::set<std::string> not_found_by;  // the parents that answered it "not found"
  };
  // Sends `p` up (again, if it went before): stripe kNone when no parent is joined.
  void SendUp(Pending& p);
  // This node's own `p` was answered "not found" by the parent it went to: asks
  // another joined parent that has not said so; false when there is none (or `p` is
  // a child's).
  bool AskElsewhere(Pending& p);
  static std::vector<std::byte> NotFoundReply(MessageType request_type, uint64_t request_id);
  // Whether a MANIFEST / CHAIN / DELTA_CHUNK answers "found" (true if it cannot be read).
  static bool Found(ByteSpan message);

  std::unique_ptr<UpLink> single_;  // the one-link constructor's
  UpLink& up_;
  Downstream& downstream_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> pending_;  // by the request id sent up
};

}  // namespace deltacast::relay
