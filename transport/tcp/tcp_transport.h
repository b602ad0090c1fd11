// The TCP backend: Boost.Asio sockets, one or more TCP streams per logical link.
//
// Every stream carries frames (transport/tcp/frame.h, docs/transport.md). With
// streams_per_link > 1 the connector opens that many sockets per link, tied
// together by a link id in the handshake; messages are spread over the streams
// and carry a per-link sequence number so the receiver restores send order.
// Nagle is always off (TCP_NODELAY).
//
// Thread safety: the transport and its connections are thread-safe (transport.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>

#include "common/status.h"
#include "transport/transport.h"

namespace deltacast::transport {

// TLS 1.3 with mutual certificate authentication (docs/transport.md, "TLS").
struct TlsFiles {
  std::filesystem::path ca;    // PEM: the cluster CA that every peer's certificate chains to
  std::filesystem::path cert;  // PEM: this node's certificate (CN = its node id)
  std::filesystem::path key;   // PEM: its private key
};

struct TcpOptions {
  // Threads running the io_context; every handler of this transport runs on one.
  size_t io_threads = 1;
  // TCP streams per outgoing link (1..64). Accepted links use whatever the
  // connector asked for. More streams help on long fat links (one TCP window each).
  uint32_t streams_per_link = 1;
  // Bound on Connect (resolve + TCP connect + handshake), and on how long an
  // accepted socket may take to complete its handshake.
  std::chrono::milliseconds connect_timeout{5000};
  // Largest message received or sent. A peer announcing a larger frame has its link
  // closed with kCorrupt before anything is allocated.
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  // SO_SNDBUF / SO_RCVBUF for every socket; 0 leaves the kernel's autotuning.
  int socket_buffer_bytes = 0;

  // Limits on peers that have proved nothing yet (topology::LimitsConfig).
  // Until Connection::Authenticated() is called, a data frame larger than this waits
  // unread, its body never allocated (the sender backs up); 0 = no such limit.
  uint64_t handshake_max_message_bytes = uint64_t{128} << 10;
  // Accepted sockets still in the transport handshake, overall and per peer IP;
  // sockets beyond are closed at once. (Sockets, not links: a link of N streams
  // takes N.) The relay caps unauthenticated links more tightly above this.
  size_t max_pending_handshakes = 512;
  size_t max_handshakes_per_address = 128;
  // Accepted links (and sockets in the handshake) per peer IP; 0 = no limit.
  size_t max_links_per_address = 256;
  // Received buffers kept for reuse, and how long an unused one is kept.
  uint64_t receive_pool_bytes = uint64_t{256} << 20;
  std::chrono::milliseconds receive_pool_idle{2000};

  // With TLS files the transport accepts TLS and plaintext links alike (a TLS
  // connection is told by its first byte), dials TLS for an address written
  // "tls://host:port", and reports a TLS peer's certificate CN as
  // Connection::PeerIdentity(). Without, a "tls://" Connect fails (kInvalidArgument).
  std::optional<TlsFiles> tls;
};

// kInvalidArgument for options out of range.
Result<std::unique_ptr<Transport>> MakeTcpTransport(const TcpOptions& options = {});

}  // namespace deltacast::transport
