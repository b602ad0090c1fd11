// A Transport wrapper that injects faults into the connections it creates and
// accepts: dropped messages, delay, a bandwidth cap, resets, failed sends and
// connects. Tests and the fan-out benchmark drive the unmodified relay engine
// through it. Every random choice comes from `seed`, so a plan replays exactly
// (given the same sequence of Sends on each connection).
//
// Faults apply to what this side sends; wrap both ends' transports to shape both
// directions. Held messages wait on the wrapper's timer thread, never on the
// caller's: Send still never blocks.
//
// Thread safety: thread-safe, like every Transport.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace deltacast::transport {

struct FaultPlan {
  uint64_t seed = 1;
  // Each message is discarded with this probability (0..1): it is never handed to
  // the inner connection, yet its on_sent reports OK, as for a message lost on the
  // wire. (Real TCP never loses silently; this exercises acks and repair.)
  double drop_probability = 0;
  // Added to every message before it is handed to the inner connection (on_sent
  // runs after it). Order is kept.
  std::chrono::microseconds delay{0};
  // After this many messages were handed to the inner connection (and their on_sent
  // ran), the link is aborted: the peer receives exactly those messages and then
  // sees the link break; locally on_closed gets kUnavailable. -1 = never.
  int64_t reset_after_messages = -1;
  // After this many messages on each connection, the link stalls: it stays open but
  // every later message is held forever (on_sent runs only when the link closes),
  // like a peer or path that hangs without failing. -1 = never.
  int64_t stall_after_messages = -1;
  // Only the first this-many links of the wrapper (in the order they were made)
  // stall; -1 = all.
  int64_t stall_links = -1;
  // The Send with this 0-based index on each connection fails: on_sent gets
  // kUnavailable, nothing is sent, the link stays open. -1 = never.
  int64_t fail_nth_send = -1;
  // The Connect with this 0-based index on this transport fails with kUnavailable.
  // -1 = never.
  int64_t fail_nth_connect = -1;
  // Pacing per connection and direction: a message of B bytes occupies the link for
  // B / rate seconds and is handed over when that time is up. 0 = uncapped.
  double bandwidth_bytes_per_second = 0;
};

// Totals over every connection of the wrapper.
struct FaultStats {
  uint64_t sent = 0;             // messages handed to the inner connection
  uint64_t dropped = 0;          // messages discarded by drop_probability
  uint64_t delayed = 0;          // messages held by delay or the bandwidth cap
  uint64_t resets = 0;           // links aborted by reset_after_messages
  uint64_t stalled = 0;          // messages held forever by stall_after_messages
  uint64_t bytes = 0;            // payload bytes handed to the inner connection
  uint64_t failed_sends = 0;     // by fail_nth_send
  uint64_t failed_connects = 0;  // by fail_nth_connect
};

// What WrapWithFaults returns; reach it with AsFaultTransport to read the counters.
class FaultTransport : public Transport {
 public:
  // Counters so far; safe to call at any time, also after Shutdown.
  virtual FaultStats stats() const = 0;
  // The plan in force (after clamping, see WrapWithFaults).
  virtual const FaultPlan& plan() const = 0;
};

// Wraps `inner` (must not be null). capabilities() are the inner transport's, with
// backend "fault(<inner>)". Plan values out of range are clamped (probability to
// [0, 1], negative delay and bandwidth to 0) with a warning in the log. The result
// is always a FaultTransport.
std::unique_ptr<Transport> WrapWithFaults(std::unique_ptr<Transport> inner, FaultPlan plan);

// `transport` as a FaultTransport, or null if it is not one.
FaultTransport* AsFaultTransport(Transport* transport);
const FaultTransport* AsFaultTransport(const Transport* transport);

}  // namespace deltacast::transport
