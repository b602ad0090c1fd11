// Makes a backend from the name a cluster config uses ("tcp", "ucx", "ofi"), so
// that the agents, the benchmarks and the tests pick backends by name.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace deltacast::transport {

// The options every backend understands; each maps them onto its own.
struct TransportOptions {
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  // Which of the backend's providers to use; empty = the library's own choice.
  //   ucx: the UCX transports to enable, e.g. "tcp" or "shm" (UCX_TLS syntax)
  //   ofi: the libfabric provider, e.g. "tcp;ofi_rxm", "shm", "verbs;ofi_rxm", "efa"
  //   tcp: must be empty
  std::string provider;
  std::chrono::milliseconds connect_timeout{5000};
  // Network interface the network providers use, e.g. "lo"; "" = the library's
  // choice. ucx: UcxOptions::net_devices; ofi: OfiOptions::net_device (what a
  // Connect's endpoint binds); tcp: unused (sockets bind what Listen names and
  // Connect's source follows the route).
  std::string net_device;

  // What a peer that has not authenticated may cost (tcp; topology::LimitsConfig
  // explains each; ucx and ofi do not enforce them yet).
  uint64_t handshake_max_message_bytes = uint64_t{128} << 10;
  size_t max_pending_handshakes = 512;
  size_t max_handshakes_per_address = 128;
  size_t max_links_per_address = 256;
  uint64_t receive_pool_bytes = uint64_t{256} << 20;
  std::chrono::milliseconds receive_pool_idle{2000};
  // tcp: TLS certificate files (TcpOptions::tls); other backends refuse them.
  std::optional<TlsFiles> tls;
};

// The backend names MakeTransport accepts, in the order of their listen-port offset
// (a node listening on several backends uses port + offset, see docs/transport.md).
const std::vector<std::string_view>& BackendNames();

// kInvalidArgument for an unknown name or a bad option; otherwise what the backend's
// own Make* returns (e.g. kUnavailable when its library finds no usable device).
Result<std::unique_ptr<Transport>> MakeTransport(std::string_view backend,
                                                 const TransportOptions& options);

}  // namespace deltacast::transport
