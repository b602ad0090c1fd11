// What a peer that has not completed the relay handshake may cost a listener: how
// long it may take and how many such peers may wait at once (in all, and from one
// address), and which link gives way when they are all taken. Shared by the tree's
// listener (relay/tree/downstream.h) and the root's producer listener
// (relay/producers/producer_hub.h), so both treat the same floods the same way.
//
// Thread safety: values and pure functions; a ProvenHosts is its owner's (one
// thread, or under the owner's lock).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "common/handshake_admission.h"
#include "topology/cluster_config.h"

namespace deltacast::relay {

using deltacast::HandshakeAdmission;
using deltacast::ProvenHosts;

struct HandshakeLimits {
  std::chrono::milliseconds handshake_timeout{5000};
  size_t max_pending = 64;
  size_t max_pending_per_address = 8;
};

inline HandshakeLimits HandshakeLimitsFrom(const topology::LimitsConfig& config) {
  return {config.handshake_timeout, static_cast<size_t>(config.max_pending_handshakes),
          static_cast<size_t>(config.max_handshakes_per_address)};
}

// "10.0.0.1:7600" -> "10.0.0.1", "[::1]:7600" -> "::1"; anything else as is: the key
// of the per-address cap.
inline std::string HostOf(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// The shared rule (common/handshake_admission.h) under the [limits] caps.
template <typename Pending>
HandshakeAdmission AdmitHandshake(const std::map<uint64_t, Pending>& pending,
                                  const std::string& host, const HandshakeLimits& limits,
                                  const ProvenHosts& proven) {
  return deltacast::AdmitHandshake(pending, host, limits.max_pending,
                                   limits.max_pending_per_address, proven);
}

}  // namespace deltacast::relay
