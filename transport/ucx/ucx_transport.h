// The UCX backend: deltacast links over UCP active messages (UCX 1.13).
//
// Addresses are "host:port" as for tcp: Listen creates a ucp_listener on that
// sockaddr, Connect creates an endpoint by sockaddr (UCX's TCP connection manager
// sets the link up; the data then flows over the transports `tls` allows).
//
// Data path: each message is one active message (ucp_am_send_nbx) sent straight
// from the caller's buffer, with a 24-byte header carrying its sequence number.
// Small messages arrive eagerly and are copied into a pooled buffer; large ones
// arrive by rendezvous and are received (ucp_am_recv_data_nbx) into a pooled
// buffer that becomes the delivered Message. Rendezvous data may complete out of
// order with later eager messages; the receiver restores send order.
//
// Why active messages rather than RMA (ucp_put_nbx into rkey-exchanged buffers):
// measured with ucx_perftest on this machine's loopback (2 cores, MB/s):
//                    1 MiB   4 MiB   16 MiB
//   tcp  ucp_am_bw     505    1376      986
//   tcp  ucp_put_bw    131      41       28
//   sm   ucp_am_bw   13773   12892     6474
//   sm   ucp_put_bw  55572   56883    29417
// Over tcp UCX emulates put with active messages, one fragment at a time, and it
// is 4-35x slower than AM. Over shared memory put is faster, but put_bw counts
// local completion only, and a put-based design still needs a message (AM) per
// chunk to tell the target that the bytes landed, an rkey exchange and a
// registered ring per link with flow control; the AM rendezvous already moves
// large messages by CMA (a single process_vm_readv by the receiver). So AM here.
//
// Progress: one thread per transport owns the UCP worker (UCS_THREAD_MODE_SINGLE)
// and makes every UCP call; other threads post closures and wake it. It spins on
// ucp_worker_progress for a short while after the last event, then arms the
// worker and blocks in poll() on UCP's event fd and its own eventfd, so an idle
// transport uses no CPU. User handlers run on this thread, outside UCP callbacks.
//
// Close protocol: an orderly Close sends kGoodbye(n) after the n messages whose
// on_sent ran OK; Abort (or a Close that cut sends short) sends kAbort(n). The
// peer delivers n messages, then closes (OK / kUnavailable) and answers
// kCloseAck; only then, or when the peer breaks, or after a linger timeout, is
// the endpoint force-closed. Peer death is seen through UCP_ERR_HANDLING_MODE_PEER
// (plus a 1 s keepalive for shared memory).
//
// Memory: host memory only; this UCX build has no CUDA support (checked with
// ucp_context_query and logged at creation).
//
// Thread safety: the transport and its connections are thread-safe (transport.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/transport.h"

namespace deltacast::transport {

struct UcxOptions {
  // Largest message received or sent (see transport.h).
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  // Until Connection::Authenticated(), a rendezvous message larger than this is
  // left at the sender (not fetched, nothing allocated); 0 = no such limit. Eager
  // messages are bounded by UCX's eager threshold (a few KiB) and always arrive.
  uint64_t handshake_max_message_bytes = uint64_t{128} << 10;
  // Which UCX transports carry data (UCX_TLS syntax). "tcp"; "shm" (UCX_TLS
  // "sm,tcp" with rendezvous over the shared-memory AM lane: messages and data go
  // over sysv/posix shared memory, tcp only sets the endpoint up); "" = UCX's own
  // choice; anything else is passed to UCX as is (e.g. "posix,tcp").
  std::string tls;
  // UCX_NET_DEVICES for the network transports, e.g. "lo" or "eth0"; "" = UCX's
  // own setting (UCX_NET_DEVICES from the environment, else all).
  std::string net_devices;
  // Bound on Connect (until the server answered the hello), and on how long an
  // accepted endpoint may take to say hello.
  std::chrono::milliseconds connect_timeout{5000};
  // How long a closed link waits for the peer to confirm it received everything
  // before the endpoint is torn down anyway.
  std::chrono::milliseconds linger_timeout{5000};
  // Spin on the worker this long after the last event before blocking on its fd.
  std::chrono::microseconds spin{50};
};

// The UCX_TLS value `tls` maps to ("shm" -> "sm"), or kInvalidArgument.
Result<std::string> UcxTlsValue(const std::string& tls);

// kInvalidArgument for options out of range; kUnavailable when UCX finds no
// usable transport for `tls` / `net_devices`.
Result<std::unique_ptr<Transport>> MakeUcxTransport(const UcxOptions& options = {});

}  // namespace deltacast::transport
