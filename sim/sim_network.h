// SimNetwork: the simulated network of one run, and its Transport
// (transport/transport.h) for each simulated process. Every link has a latency and
// a bandwidth drawn from the seed; a message of B bytes leaves B / bandwidth after
// the link is free (on_sent then) and arrives a latency later, in order. Faults:
// - reset: the link breaks (both ends see kUnavailable after the bytes in flight);
// - stall: a link sends nothing for a while (then resumes, unless an idle timeout
//   dropped it first);
// - loss: TCP never loses silently, so a lost segment is a retransmission delay
//   (200 ms to 1 s) on that message and every one behind it;
// - partition: two processes cannot connect, and their links stall, until healed.
// Handlers run as tasks of the receiving transport's queue, never inline; after
// Shutdown the queue is closed, so no handler runs again.
//
// Thread safety: none; one simulation thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim/event_queue.h"
#include "transport/transport.h"

namespace deltacast::sim {

struct LinkShape {
  EventQueue::Duration latency;
  double bytes_per_second = 0;
};

// What the network knows of a link from the HELLO that opened it (docs/protocol.md,
// "Stripes"): which stripe it joins, of how many, and which end is the child.
// stripe -1: no HELLO seen yet (or not a tree link).
struct LinkInfo {
  uint64_t id = 0;  // unique per connection of the run
  int stripe = -1, stripes = 0;
  std::string child, parent;
  EventQueue::TimePoint stalled_until{};  // a stall of this connection alone
};

// One message on a link, for the simulator's checkers: handed to Send (`delivered`
// false) or handed to the receiver's handler (true).
struct LinkEvent {
  const LinkInfo& link;
  const std::string& from;
  const std::string& to;
  bool delivered = false;
  const std::vector<std::byte>& message;
};

struct NetworkCounts {
  uint64_t messages = 0, bytes = 0;
  uint64_t connects = 0, refused = 0;
  uint64_t resets = 0, stalls = 0, losses = 0, partitions = 0;
};

class SimNetwork {
 public:
  explicit SimNetwork(EventQueue& queue) : queue_(queue), wire_(queue.OpenQueue("wire")) {}

  // A transport for process `node` (its name in partitions and link shapes).
  std::unique_ptr<transport::Transport> MakeTransport(const std::string& node);

  // Faults. Links are named by their two processes, in either order.
  void ResetLinks(const std::string& a, const std::string& b);
  void StallLinks(const std::string& a, const std::string& b, EventQueue::Duration d);
  void Partition(const std::string& a, const std::string& b, EventQueue::Duration d);
  void set_loss_probability(double p) { loss_probability_ = p; }
  // Striped trees: faults on the link between `child` and its parent in one stripe
  // only (the links of its other stripes, to the same parent or not, go on). A cut
  // resets it and, for `d`, closes every new link of that child and stripe as its
  // HELLO names the stripe.
  void ResetStripeLink(const std::string& child, int stripe);
  void StallStripeLink(const std::string& child, int stripe, EventQueue::Duration d);
  void CutStripeLink(const std::string& child, int stripe, EventQueue::Duration d);
  bool StripeCut(const std::string& child, int stripe) const;
  // Called for every message sent and delivered (checkers; must post nothing).
  void set_observer(std::function<void(const LinkEvent&)> observer) {
    observer_ = std::move(observer);
  }
  const std::function<void(const LinkEvent&)>& observer() const { return observer_; }
  uint64_t NextLinkId() { return ++link_ids_; }
  // Ends every partition, stall and loss now.
  void Heal();
  // The processes that have (or had) links, for choosing faults.
  std::vector<std::pair<std::string, std::string>> LinkedPairs() const;

  LinkShape ShapeOf(const std::string& a, const std::string& b);
  bool Partitioned(const std::string& a, const std::string& b) const;
  const NetworkCounts& counts() const { return counts_; }
  NetworkCounts& mutable_counts() { return counts_; }
  double loss_probability() const { return loss_probability_; }

  class Transport;
  struct End;
  struct Listener {
    std::string node;
    std::weak_ptr<bool> alive;
    Transport* transport = nullptr;
    transport::AcceptHandler on_accept;
  };

  EventQueue& queue() { return queue_; }
  uint64_t wire_queue() const { return wire_; }  // the network's own: never closed
  std::map<std::string, Listener>& listeners() { return listeners_; }
  // Both ends of every link still open, by (lower, higher) process pair.
  std::multimap<std::pair<std::string, std::string>, std::weak_ptr<End>>& links() { return links_; }
  std::map<std::pair<std::string, std::string>, EventQueue::TimePoint>& stalled_until() {
    return stalled_until_;
  }

 private:
  static std::pair<std::string, std::string> Key(const std::string& a, const std::string& b) {
    return a < b ? std::pair{a, b} : std::pair{b, a};
  }
  EventQueue& queue_;
  const uint64_t wire_;
  std::map<std::string, Listener> listeners_;
  std::map<std::pair<std::string, std::string>, LinkShape> shapes_;
  std::map<std::pair<std::string, std::string>, EventQueue::TimePoint> partitioned_until_;
  std::map<std::pair<std::string, std::string>, EventQueue::TimePoint> stalled_until_;
  std::multimap<std::pair<std::string, std::string>, std::weak_ptr<End>> links_;
  double loss_probability_ = 0;
  NetworkCounts counts_;
  std::map<std::pair<std::string, int>, EventQueue::TimePoint> cut_until_;
  std::function<void(const LinkEvent&)> observer_;
  uint64_t link_ids_ = 0;
};

}  // namespace deltacast::sim
