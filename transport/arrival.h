// ArrivalClock: what a connection knows of when bytes from its peer last came, part
// of a message included. A liveness check reads it through LastHeard, so that one
// message which takes longer than the timeout to cross a slow link is not taken for
// silence. A capability beside Connection (found with dynamic_cast), not a method of
// it, as not every backend can tell.
//
// Thread safety: LastArrival is safe from any thread.
#pragma once

#include <algorithm>
#include <chrono>

#include "transport/transport.h"

namespace deltacast::transport {

class ArrivalClock {
 public:
  virtual ~ArrivalClock() = default;
  // The epoch while nothing arrived, and where the backend delivers whole messages
  // only (inproc, ucx, ofi, the fault wrapper).
  virtual std::chrono::steady_clock::time_point LastArrival() const = 0;
};

// The later of `last_message` (when the caller's last whole message came) and when
// bytes last came on `connection`.
inline std::chrono::steady_clock::time_point LastHeard(
    const Connection& connection, std::chrono::steady_clock::time_point last_message) {
  const auto* clock = dynamic_cast<const ArrivalClock*>(&connection);
  return clock ? std::max(last_message, clock->LastArrival()) : last_message;
}

}  // namespace deltacast::transport
