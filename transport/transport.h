// The transport interface: moves opaque messages (weight-delta chunks, control
// messages) between deltacast nodes, in order, over one logical link per peer.
//
// Backends (transport/tcp, transport/inproc, and the fault-injecting wrapper in
// transport/fault_transport.h) implement Transport and Connection; the relay
// protocol is written once against this header. docs/transport.md is the contract
// in prose, with the TCP frame format and the fault plan.
//
// Handler rules shared by every backend:
// - A handler never runs inline in the call that registered it (Start, Send,
//   Connect, Listen): it runs later on a thread owned by the transport.
// - Handlers of one connection: on_message never runs concurrently with itself;
//   on_sent handlers run in Send order; on_closed runs exactly once and after the
//   on_sent handler of every Send issued before the link closed.
// - Once Transport::Shutdown() returns, or a Connection's destructor returns, no
//   handler of it runs again. Handlers may call any method of the transport and its
//   connections, including destroying the connection they belong to; they must not
//   call Transport::Shutdown() or ConnectBlocking(), which wait for transport threads.
// - Handlers should be short: a slow on_message holds back that link (and, with one
//   I/O thread, every link of the transport). Hand heavy work to another thread.
//
// Thread safety: every method of Transport and Connection is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace deltacast::transport {

// A message buffer shared by everyone who still needs it: a relay hands the same
// received chunk to its apply workers and to every child's send queue, so the bytes
// are never copied. Never null when handed to a handler.
using Message = std::shared_ptr<const std::vector<std::byte>>;

inline Message MakeMessage(std::vector<std::byte> bytes) {
  return std::make_shared<const std::vector<std::byte>>(std::move(bytes));
}

// 1 GiB of payload plus room for chunk headers: the largest message a backend
// accepts unless configured otherwise.
inline constexpr uint64_t kDefaultMaxMessageBytes = (uint64_t{1} << 30) + (uint64_t{1} << 20);

enum class MemoryType : uint8_t { kHost = 0, kCudaDevice = 1 };

std::string_view MemoryTypeName(MemoryType type);

// Bytes somewhere in memory that the caller keeps alive and unchanged until the
// send's on_sent runs: how a GPU store hands device buffers to a backend that can
// move them directly (GPUDirect), and host memory to any backend.
struct MemoryRegion {
  MemoryType type = MemoryType::kHost;
  const void* data = nullptr;
  size_t size = 0;
  int device = 0;  // CUDA device ordinal for kCudaDevice
};

// What a backend can do; query it before relying on a feature.
struct Capabilities {
  std::string backend;                   // "tcp", "inproc", "fault(tcp)"
  bool ordered = true;                   // messages on one connection arrive in send order
  std::vector<MemoryType> memory_types;  // buffer kinds it moves without staging
  uint64_t max_message_bytes = 0;        // larger messages are refused (see Send)
  uint32_t streams_per_link = 1;         // transport-level connections under one Connection
};

using MessageHandler = std::function<void(Message)>;
// OK for an orderly close by either side; an error when the link broke.
using CloseHandler = std::function<void(Status)>;
using SendHandler = std::function<void(Status)>;

// One logical, ordered, bidirectional link to a peer.
class Connection {
 public:
  // Closes the link if still open (as Close() does) and waits for handlers of this
  // connection that are running on other threads to return; after it returns no
  // handler of this connection runs, and handlers not yet run (pending on_sent,
  // on_closed) are dropped without being called. To see them run, Close() and wait
  // for on_closed before destroying. Safe from inside this connection's own
  // handlers (it then does not wait for the handler it is called from).
  virtual ~Connection() = default;

  // Begins delivery. on_message runs for each received message, in order, never
  // concurrently with itself, never inline in Start. on_closed runs exactly once
  // when the link ends (OK for an orderly close by either side, an error status if
  // it broke or was refused), and no on_message runs after it. If the link already
  // ended before Start, on_closed still runs (once). Call Start at most once; later
  // calls are ignored. Before Start nothing is read from the peer (its sends back up).
  virtual void Start(MessageHandler on_message, CloseHandler on_closed) = 0;

  // Queues a message. Never blocks, never runs on_sent inline. on_sent (may be
  // empty) runs exactly once: OK after every byte was handed to the OS (or, for
  // inproc, to the peer); kAborted if this side closed first; kUnavailable (or the
  // error that broke the link) if the link broke or the peer closed first;
  // kInvalidArgument, with the link left open, for a null message or one larger than
  // capabilities().max_message_bytes. on_sent handlers run in Send order. Sends
  // issued after the link closed complete with an error after on_closed.
  // After the transport shut down, Send drops the message and on_sent never runs.
  virtual void Send(Message message, SendHandler on_sent = {}) = 0;

  // Sends the bytes of `region` as one message, like Send. Host memory is copied into
  // a Message (backends may override to send in place). Memory of a type the backend
  // does not list in capabilities().memory_types is refused at once with kUnsupported
  // (on_sent then never runs): the caller stages it through host memory instead.
  virtual Status SendRegion(const MemoryRegion& region, SendHandler on_sent = {});

  // Bytes queued by Send that were not yet handed to the OS (or the peer), i.e.
  // whose on_sent has not run. The relay's backpressure signal.
  virtual uint64_t QueuedBytes() const = 0;

  // Orderly close: queued sends complete with kAborted, then on_closed(OK) runs.
  // The peer receives every message whose on_sent ran OK and then sees an orderly
  // close (OK); a message cut off half-written makes the peer see kUnavailable
  // instead. Close does not wait for the peer. Idempotent, thread-safe, never blocks.
  virtual void Close() = 0;

  // Abortive close, as if this process died: like Close(), but locally on_closed
  // gets kAborted and the peer sees the link break (kUnavailable) after the bytes
  // already handed to the OS. Backends that cannot abort close orderly.
  virtual void Abort() { Close(); }

  // The peer's address ("127.0.0.1:5000", "[::1]:5000", an inproc name).
  virtual std::string PeerAddress() const = 0;

  // Who the transport proved the peer to be: the node id in the certificate of a TLS
  // link that verified against the cluster CA. Empty when the transport
  // authenticates nobody (plaintext tcp, ucx, ofi, inproc).
  virtual std::string PeerIdentity() const { return {}; }

  // The application has authenticated the peer (the relay handshake succeeded).
  // Before this call a backend may hold a frame larger than its
  // pre-authentication limit unread (tcp: TcpOptions::handshake_max_message_bytes),
  // so a peer that has proved nothing cannot make this side allocate for it; after
  // it, frames up to max_message_bytes are read. Idempotent; never blocks.
  virtual void Authenticated() {}
};

// Runs on a transport thread for each new connection, not yet started. The handler
// owns the connection; dropping it closes the link.
using AcceptHandler = std::function<void(std::unique_ptr<Connection>)>;
// The connection, or kUnavailable (refused, unreachable, no such name), kTimeout,
// kCorrupt (the peer does not speak this protocol) or kAborted (transport shut down).
using ConnectHandler = std::function<void(Result<std::unique_ptr<Connection>>)>;

class Transport {
 public:
  // Shuts down (see Shutdown) and releases the transport. Connections handed out
  // may outlive it: their methods stay safe, they are closed, and no handler runs.
  virtual ~Transport() = default;

  virtual const Capabilities& capabilities() const = 0;

  // Listens on "host:port" (port 0 = pick one; inproc: any name, ":0" suffix = pick
  // one) and returns the bound address, which Connect accepts. on_accept runs on a
  // transport thread for each new connection. Blocks only for the bind.
  virtual Result<std::string> Listen(const std::string& address, AcceptHandler on_accept) = 0;

  // Connects to an address returned by a peer's Listen. on_done runs exactly once,
  // never inline (unless the transport is already shut down: then never).
  virtual void Connect(const std::string& address, ConnectHandler on_done) = 0;

  // Stops listening, aborts every connection still open (their on_sent and on_closed
  // handlers run with kAborted during Shutdown; peers see the links break), fails
  // pending connects with kAborted, joins the transport's threads. Afterwards no
  // handler runs. Idempotent; blocks. Must not be called from a handler (there it
  // closes everything but cannot wait).
  virtual void Shutdown() = 0;
};

// Connect, waiting up to `timeout`; kTimeout when it does not finish in time (the
// late connection, if any, is closed; after Shutdown, Connect never answers, so
// this waits out the timeout). Blocks: do not call from a handler.
Result<std::unique_ptr<Connection>> ConnectBlocking(Transport& transport,
                                                    const std::string& address,
                                                    std::chrono::milliseconds timeout);

}  // namespace deltacast::transport
