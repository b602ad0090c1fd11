// The libfabric backend: ordered messages over FI_EP_RDM endpoints ("tcp;ofi_rxm",
// "shm"; in production "verbs;ofi_rxm", "efa").
//
// RDM endpoints are connectionless, so a Connection is built on control messages
// (transport/ofi/wire.h, docs/transport.md "ofi"): Connect sends CONNECT with our
// endpoint name to the listener's endpoint, which answers ACCEPT; every later
// message names the receiver's link id.
//
// Data path: each message is announced with RTS (seq, size); once the receiver
// has started and has room (256 MiB of posted receives per link) it posts a
// tagged receive of exactly that size straight into the vector it will hand to
// on_message (recycled through a pool) and answers CTS; the sender then posts one
// fi_tsend of the message's own bytes (tag = receiver link id, seq). Up to 64
// messages per link are announced ahead, so the RTS/CTS round trip overlaps with
// data. Why tagged sends and not fi_write into advertised buffers: on these
// providers a large tagged send already is a rendezvous whose bulk move is the
// provider's own RMA read (rxm) or a process_vm_readv (shm), so RMA would move
// the same bytes and add a registration with remote keys on the target and a FIN
// message per chunk; neither provider needs FI_MR_LOCAL (mr_mode is empty for
// tcp;ofi_rxm, FI_MR_VIRT_ADDR for shm), so tagged sends need no registration at
// all. Measured (fi_pingpong, loopback, 2 cores): tcp;ofi_rxm 1/4/16 MiB =
// 440/214/736 MB/s, shm 13204/1664/3938 MB/s; this backend: see docs/transport.md.
// fi_getinfo is asked without FI_MR_LOCAL, so only providers that register
// internally match (rxm does so over verbs); nothing is registered here.
//
// Progress: one thread per transport owns every libfabric call. It spins on the
// completion queue for ~50 us after work, then blocks in poll() on the CQ's wait
// fd (FI_WAIT_FD + fi_trywait) and an eventfd that API calls write; providers
// without a wait fd get poll() with a timeout growing from 50 us to 1 ms.
//
// Liveness: Close sends GOODBYE, Abort and Shutdown send ABORT (each with how
// many messages were sent OK, so the peer delivers exactly those first); an idle
// link sends KEEPALIVE every peer_timeout/4; a link that hears nothing for
// peer_timeout, or whose send fails in the completion queue, breaks with
// kUnavailable.
//
// Device memory: memory_types is {kHost}. CUDA buffers are not supported: this
// libfabric build has no CUDA HMEM interface (FI_HMEM is queried and logged once).
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

struct OfiOptions {
  // Largest message sent or received. A peer announcing a larger one has its link
  // closed with kCorrupt before anything is allocated.
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  // libfabric provider: "tcp;ofi_rxm", "shm", "verbs;ofi_rxm", "efa"; "" = the
  // first FI_EP_RDM provider libfabric offers.
  std::string provider = "tcp;ofi_rxm";
  // Bound on Connect: no ACCEPT by then is kTimeout.
  std::chrono::milliseconds connect_timeout{5000};
  // A link that hears nothing from its peer for this long breaks (kUnavailable).
  // Keepalives go out every peer_timeout / 4 on idle links.
  std::chrono::milliseconds peer_timeout{10000};
};

// kInvalidArgument for bad options or a provider libfabric does not offer here
// (the message names it).
Result<std::unique_ptr<Transport>> MakeOfiTransport(const OfiOptions& options = {});

}  // namespace deltacast::transport
