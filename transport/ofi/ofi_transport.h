// The libfabric backend: ordered messages over FI_EP_RDM endpoints ("tcp;ofi_rxm",
// "shm"; in production "verbs;ofi_rxm", "efa").
//
// RDM endpoints are connectionless, so a Connection is built on control messages
// (transport/ofi/wire.h, docs/transport.md "ofi"): Connect sends CONNECT with our
// endpoint name to the listener's endpoint, which answers ACCEPT; every later
// message names the receiver's link id.
//
// Data path: a message of up to 4 KiB travels whole inside one control message
// (kData). A larger one is announced with RTS (seq, size); once the receiver has
// started and has room (256 MiB of posted receives per link) it posts a tagged
// receive of exactly that size straight into the vector it will hand to
// on_message (recycled through a pool) and answers CTS; the sender then posts one
// fi_tsend of the message's own bytes (tag = receiver link id, seq). Up to 64
// messages per link are announced ahead of their CTS, so the round trip overlaps
// with data, and a receiver that has not started holds at most 64 of them.
//
// Why tagged sends and not fi_write into receiver-advertised buffers: measured
// here (2 cores, loopback, one link, 8 messages in flight, MB/s for 1/4/16 MiB,
// two alternating runs each, quiet machine), tagged: tcp;ofi_rxm 4138/3509/3122
// and 2992/4282/3405, shm 13356/7843/6539 and 9160/7657/6086; an RMA variant
// (fi_writemsg with FI_DELIVERY_COMPLETE into a buffer registered by the
// receiver, key and address in the CTS, then a FIN message): tcp;ofi_rxm
// 4864/3146/3226 and 3590/3997/3242, shm 6895/8880/6485 and 8145/8175/7001. No
// measurable gain at these sizes (rxm and shm move large tagged messages by
// rendezvous with their own RMA read / process_vm_readv anyway), while RMA costs
// a registration with remote keys per receive buffer and a FIN per message. So
// tagged. For comparison, fi_pingpong (one message at a time) gives tcp;ofi_rxm
// 440/214/736 MB/s and shm 13205/1664/3938 MB/s.
//
// Registration: fi_getinfo is asked with FI_MR_LOCAL (plus FI_MR_VIRT_ADDR,
// FI_MR_ALLOCATED, FI_MR_PROV_KEY, which cost nothing here), so providers that
// need the application to register local buffers (verbs;ofi_rxm, efa) match.
// When the domain's mr_mode has FI_MR_LOCAL, or OfiOptions::register_memory is
// kAlways, every buffer handed to libfabric goes with a descriptor: control
// buffers are registered once (64 receive buffers per endpoint at setup; send
// buffers as first needed, then recycled, up to 256 spare); receive buffers
// from the pool are registered once and keep their MR while posted, while the
// application holds their Message and while pooled (buffer_pool.h); a caller's
// Message is registered through the send-side MrCache (mr_cache.h: keyed by
// address and length, the entry holding the Message so the memory cannot be
// freed under it, LRU under mr_cache_bytes), except a Message this transport
// received and forwards, which uses its pooled buffer's MR. A failed
// registration breaks the link where the provider requires registration, else
// the buffer goes without a descriptor. Here neither provider requires it
// (mr_mode is empty for tcp;ofi_rxm, FI_MR_VIRT_ADDR for shm), so kAuto
// registers nothing; fi_mr_reg works on both (the kAlways conformance runs).
// One recurring Message, 8 in flight, MB/s for 1/4/16 MiB, two runs each on a
// busy 2-core machine: tcp;ofi_rxm kAuto 3899/3222/2993 and 4653/3168/3213,
// kAlways 3879/3533/3580 and 2387/2866/2488; shm kAuto 7055/7437/6010 and
// 11007/4651/4736, kAlways 12337/9739/6577 and 8055/7333/4362: no difference
// beyond the noise (a cache hit is a map lookup).
//
// Progress: one thread per transport owns every libfabric call. It spins on the
// completion queue for ~50 us after work, then blocks in poll() on the CQ's wait
// fd (FI_WAIT_FD + fi_trywait; tcp;ofi_rxm has one) and an eventfd that API calls
// write; providers without a wait fd (shm) get poll() with a timeout growing from
// 50 us to 1 ms. Measured: idle, two connected transports use 0.2% (tcp;ofi_rxm)
// and 2.6% (shm) of one core; a 64-byte echo round trip takes 59/63 us (rxm/shm)
// back to back and 246/316 us after both sides idled for 5 ms.
//
// Liveness: Close sends GOODBYE, Abort and Shutdown send ABORT (each with how
// many messages were sent OK, so the peer delivers exactly those first); an idle
// link sends KEEPALIVE every peer_timeout/4; a link that hears nothing for
// peer_timeout, or one of whose transfers fails in the completion queue
// (fi_cq_readerr; also FI_ECANCELED, which tcp;ofi_rxm reports for a rendezvous
// cut by a dropped connection), breaks with kUnavailable. rxm retries refused or
// reset connections silently, so a killed peer is found by peer_timeout on both
// providers unless a transfer was under way, and a Connect to a closed address
// fails with kUnavailable after connect_timeout.
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

// When the backend registers the buffers it hands libfabric (fi_mr_reg) and
// passes their descriptors.
enum class OfiRegistration {
  kAuto,    // only when the provider requires it (FI_MR_LOCAL: verbs;ofi_rxm, efa)
  kAlways,  // also when it does not (tests the registration path on tcp/shm)
};

struct OfiOptions {
  // Largest message sent or received. A peer announcing a larger one has its link
  // closed with kCorrupt before anything is allocated.
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  // Until Connection::Authenticated(), a message announced larger than this is not
  // granted (no buffer allocated; the sender holds it); 0 = no such limit. Inline
  // messages are small and always arrive.
  uint64_t handshake_max_message_bytes = uint64_t{128} << 10;
  // libfabric provider: "tcp;ofi_rxm", "shm", "verbs;ofi_rxm", "efa"; "" = the
  // first FI_EP_RDM provider libfabric offers.
  std::string provider = "tcp;ofi_rxm";
  // Bound on Connect: no ACCEPT by then is kUnavailable (on RDM a closed address
  // is silence: rxm retries refused connections without reporting them).
  std::chrono::milliseconds connect_timeout{5000};
  // A link that hears nothing from its peer for this long breaks (kUnavailable).
  // Keepalives go out every peer_timeout / 4 on idle links.
  std::chrono::milliseconds peer_timeout{10000};
  // Network interface whose address a Connect's endpoint binds, e.g. "lo"; peers
  // answer to that endpoint's name. "" = the provider's choice (tcp: the first
  // non-loopback interface). Listeners bind what Listen names; providers without
  // IP addresses (shm) ignore it. A name with no address is kInvalidArgument.
  std::string net_device;
  OfiRegistration register_memory = OfiRegistration::kAuto;
  // Bound on the bytes of caller Messages the send-side registration cache keeps
  // registered (pinned, on verbs/efa) while they may be sent again; 0 registers
  // every send on its own. Received (pooled) buffers are not counted here.
  uint64_t mr_cache_bytes = uint64_t{512} << 20;
};

// Counters of one ofi transport (for tests and diagnostics).
struct OfiStats {
  bool registers_memory = false;       // descriptors are passed (FI_MR_LOCAL or kAlways)
  bool provider_requires_mr = false;   // the domain's mr_mode has FI_MR_LOCAL
  uint64_t registrations = 0;          // fi_mr_reg calls, all purposes, of which
  uint64_t control_registrations = 0;  // control buffers (receive: 64 per endpoint)
  uint64_t receive_registrations = 0;  // pooled receive buffers (sends: send_cache_misses)
  // The send-side cache (transport/ofi/mr_cache.h).
  uint64_t send_cache_hits = 0;
  uint64_t send_cache_misses = 0;
  uint64_t send_cache_evictions = 0;  // dropped for space
  uint64_t send_cache_released = 0;   // dropped once only the cache held the Message
  uint64_t send_cache_entries = 0;
  uint64_t send_cache_bytes = 0;
  // Sends of Messages this transport received (a relay forwarding), which use
  // the registration of their pooled receive buffer.
  uint64_t forwarded_sends = 0;
};

// What MakeOfiTransport returns; reach it with AsOfiTransport to read stats().
class OfiTransport : public Transport {
 public:
  // Safe at any time, also after Shutdown.
  virtual OfiStats stats() const = 0;
};

// kInvalidArgument for bad options or a provider libfabric does not offer here
// (the message names it).
Result<std::unique_ptr<Transport>> MakeOfiTransport(const OfiOptions& options = {});

// `transport` as an OfiTransport, or null if it is not one.
OfiTransport* AsOfiTransport(Transport* transport);
const OfiTransport* AsOfiTransport(const Transport* transport);

}  // namespace deltacast::transport
