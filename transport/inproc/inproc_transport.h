// The in-process backend, for tests: transports sharing one InprocNetwork reach
// each other by name, and messages move by pointer, never copied.
//
// Semantics match the tcp backend (transport.h): ordered delivery, on_sent once the
// peer has taken the message (so a receiver that is slow or not started backs up
// its sender's QueuedBytes, as a full socket would), orderly Close, abortive Abort
// and Shutdown, receiver-side max_message_bytes (kCorrupt). Each transport runs its
// handlers on one thread of its own, so a handler is never inline.
//
// Addresses are arbitrary strings ("inproc:relay-3", "127.0.0.1:0"); one ending in
// ":0" is given a fresh unique number instead of the 0.
//
// Thread safety: InprocNetwork, the transports and their connections are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace deltacast::transport {

// The name registry transports listen in. Shared (shared_ptr) by every transport on
// it; it may be destroyed before or after them.
class InprocNetwork {
 public:
  InprocNetwork();
  ~InprocNetwork();
  InprocNetwork(const InprocNetwork&) = delete;
  InprocNetwork& operator=(const InprocNetwork&) = delete;

  // Names currently listened on, sorted.
  std::vector<std::string> ListenerNames() const;

  // The backend's view of the registry; not for other callers.
  struct Registry;
  Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<Registry> registry_;
};

struct InprocOptions {
  // Largest message accepted (receiver side) or sent.
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
};

// A transport on `network` (a null network gets a private one of its own).
// max_message_bytes 0 means the default.
std::unique_ptr<Transport> MakeInprocTransport(std::shared_ptr<InprocNetwork> network,
                                               const InprocOptions& options = {});

}  // namespace deltacast::transport
