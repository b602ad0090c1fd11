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
#include <memory>

#include "common/status.h"
#include "transport/transport.h"

namespace deltacast::transport {

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
};

// kInvalidArgument for options out of range.
Result<std::unique_ptr<Transport>> MakeTcpTransport(const TcpOptions& options = {});

}  // namespace deltacast::transport
