// UpRequests: the requests a relay node sends up the tree and the answers that come
// back. FETCH asks for a partition's bytes at a given hash: for this node's own
// repairs, rollbacks and catch-ups, and for children's FETCHes its store cannot
// serve. FETCH_MANIFEST, FETCH_CHAIN and FETCH_DELTA_CHUNK (catch-up) only the
// source answers: this node's own go up as they are, a child's are renumbered on the
// way up and back on the way down.
//
// This node's own requests go to the parent UpLink chooses (striped trees: any
// joined stripe's parent; docs/protocol.md, "Stripes"), a child's up the stripe it
// came on while that parent is joined, else to any joined parent, and an answer is
// taken from whichever link it comes on. A path that changes stripes can loop (n4
// passed a catch-up's FETCH_MANIFEST to n3, its parent in stripe 1 and below it in
// stripe 0, whose path went on down to n4 again: the simulator's --stripes seed
// 20597 circled it until the commit timeout): each relay counts a hop in the top
// byte of the id it sends up (RoutedId), and one past kMaxHops is "not found". When
// the link a request went on drops, the request is sent again to another joined
// parent; with none joined, it waits for a link to join (LinkJoined): this node's
// own as long as it takes, a child's for kNoParentGrace, then it is answered "not
// found" (Tick; the child may ask again).
// A "not found" is one parent's answer, not the tree's (a relay whose parent there
// is not joined gives it after kNoParentGrace): this node's own request is asked again of each
// other joined parent that has not said so before "not found" is taken (AskElsewhere); a child's is
// passed down as it came.
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

#include "common/runtime.h"
#include "relay/tree/downstream.h"
#include "relay/tree/up_link.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

class UpRequests {
 public:
  // Requests a node passes up for its children and has not had answered, at most:
  // beyond, a child's request is answered "not found" at once.
  static constexpr size_t kMaxRoutedRequests = 4096;
  // How long a child's request waits for its stripe's parent to join when none is
  // (a relay between parents: it left its failover parent to rejoin its planned
  // one), before it is answered "not found". Answered at once, it failed a catch-up
  // whose every path up went through this relay (the simulator's --stripes seed
  // 28245); held 2 s, a child that would have asked its other parents lost the time
  // (seed 12659).
  static constexpr std::chrono::milliseconds kNoParentGrace{500};
  // A request routed through more relays than this is in a loop (no tree is that
  // deep): answered "not found".
  static constexpr uint64_t kMaxHops = 64;
  using Clock = RuntimeClock;

  using PartitionHandler = std::function<void(const PartitionData&)>;

  // `up` and `downstream` must outlive this object.
  UpRequests(UpLink& up, Downstream& downstream)
      : up_(up), downstream_(downstream), next_id_(FirstId()) {}
  // A node with one parent link (a sender): every request goes on it. `parent` and
  // `downstream` must outlive this object.
  UpRequests(ParentLink& parent, Downstream& downstream)
      : single_(std::make_unique<UpLink>(std::vector<ParentLink*>{&parent}, nullptr)),
        up_(*single_),
        downstream_(downstream),
        next_id_(FirstId()) {}

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
  // A child's FETCH_MANIFEST / FETCH_CHAIN / FETCH_DELTA_CHUNK: routed up (see
  // above for when no parent is joined).
  void RouteUp(const std::string& child, MessageType type, ByteSpan bytes);

  // A PARTITION from a parent: delivered to whoever asked (if anyone still does).
  void OnPartition(const PartitionData& data);
  // A MANIFEST / CHAIN / DELTA_CHUNK from a parent: passed down and true when it
  // answers a child's request; false when it is this node's own (or nobody's). True,
  // and dropped, when its id asked for another type (an answer to a request of a
  // restarted relay's dead self, FirstId).
  bool PassDown(ByteSpan message);
  // What LinkLost did with the requests that went on the dropped link.
  struct Moved {
    size_t again = 0;    // sent again to another joined parent
    size_t waiting = 0;  // waiting for a parent to join
  };
  // The link of `stripe` dropped (0: the one link of a node with one): what went on
  // it is sent again (see above).
  Moved LinkLost(uint32_t stripe = 0);
  // A link joined: the requests that waited for one go up now. Returns how many.
  size_t LinkJoined();
  // Answers "not found" to the children's requests that have waited kNoParentGrace
  // for a parent to join.
  void Tick(Clock::time_point now);

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
    Clock::time_point parentless_since;  // a child's, waiting for a parent to join
  };
  // Sends `p` up (again, if it went before): stripe kNone when no parent is joined.
  void SendUp(Pending& p);
  // A child's request `p` just sent up: when it went nowhere (no parent joined but
  // that child), it waits for a link from now (Tick).
  static void RoutedOrWaiting(Pending& p);
  // The id a child's request (id `child_request`) goes up with: the hops it has
  // made, one more here, in the top byte; a fresh number below.
  static constexpr int kHopShift = 56;
  static uint64_t HopsOf(uint64_t request_id) { return request_id >> kHopShift; }
  uint64_t RoutedId(uint64_t child_request);
  // This node's own `p` was answered "not found" by the parent it went to: asks
  // another joined parent that has not said so; false when there is none (or `p` is
  // a child's).
  bool AskElsewhere(Pending& p);
  static std::vector<std::byte> NotFoundReply(MessageType request_type, uint64_t request_id);
  // Whether a MANIFEST / CHAIN / DELTA_CHUNK answers "found" (true if it cannot be read).
  static bool Found(ByteSpan message);
  // Whether `answer` (MANIFEST, CHAIN, DELTA_CHUNK) is of the type that answers `request`.
  static bool Answers(MessageType request, ByteSpan answer);
  // Where this process's request ids begin: random, so that an answer to what this
  // node asked before it restarted is not taken for the answer to what it asks now.
  // Both began at 1 once: a relay that restarted numbered a child's FETCH_CHAIN as its
  // dead self had numbered a FETCH_MANIFEST still in flight, the manifest's answer
  // came back as the chain's and the chain's as the manifest's, and the catch-up
  // below waited for its manifest until the commit timeout (the simulator's --stripes
  // seed 17320). Below 2^48: ids never reach the hop count's byte (RoutedId).
  static uint64_t FirstId();

  std::unique_ptr<UpLink> single_;  // the one-link constructor's
  UpLink& up_;
  Downstream& downstream_;
  uint64_t next_id_;
  std::map<uint64_t, Pending> pending_;  // by the request id sent up
};

}  // namespace deltacast::relay
