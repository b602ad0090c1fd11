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
};

}  // namespace deltacast::sim
