// The tcp backend's internals (transport/tcp/tcp_transport.h is the public side):
// the Core every link and pending operation shares, the Link (one logical
// connection over 1..N sockets: framing, striping, reorder, the pre-authentication
// hold), and the state of sockets still in the handshake. The accept side is
// transport/tcp/tcp_accept.cc, the connect side tcp_connect.cc, the rest
// tcp_transport.cc. docs/transport.md is the spec.
//
// Thread safety: Core's control state is touched on its control strand only; each
// Link's state on its own strand (comments say which members are shared).
#pragma once

// <utility> before Boost.Asio: Boost 1.74 + g++ 12 C++20 (docs TOOLCHAIN-NOTES).
#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/handshake_admission.h"
#include "common/log.h"
#include "common/thread_annotations.h"
#include "transport/internal/address.h"
#include "transport/buffer_pool.h"
#include "transport/internal/core_transport.h"
#include "transport/internal/handler_gate.h"
#include "transport/internal/link_connection.h"
#include "transport/internal/tcp_stream.h"
#include "transport/tcp/frame.h"

namespace deltacast::transport::tcp_internal {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;
using Strand = asio::strand<asio::io_context::executor_type>;
using internal::TcpStream;
using StreamPtr = std::unique_ptr<TcpStream>;

// A peer that closes a TLS link without close_notify ends it like EOF ends a plain one.
inline bool IsEof(const ErrorCode& ec) {
  return ec == asio::error::eof || ec == asio::ssl::error::stream_truncated;
}

// Receivers hold at most this many out-of-order bytes (multi-stream links) before
// pausing the streams that are ahead; the stream carrying the next message never
// pauses, so progress is guaranteed.
inline constexpr uint64_t kReorderBudgetBytes = uint64_t{256} << 20;
// A data frame further ahead of the next expected sequence than this is corrupt.
inline constexpr uint64_t kMaxReorderDistance = uint64_t{1} << 20;
// How Connect is asked for TLS: "tls://host:port".
inline constexpr std::string_view kTlsScheme = "tls://";
// Accepted links still waiting for some of their streams.
inline constexpr size_t kMaxPendingLinks = 1024;

// The one place Boost.Asio errors become Status.
inline Status StatusFromError(const ErrorCode& ec, std::string_view what) {
  namespace e = asio::error;
  std::string message = std::string(what) + ": " + ec.message();
  if (ec == e::operation_aborted) return Status::Aborted(std::move(message));
  if (ec == e::timed_out) return Status::Timeout(std::move(message));
  if (ec == e::eof || ec == e::connection_reset || ec == e::connection_refused ||
      ec == e::connection_aborted || ec == e::broken_pipe || ec == e::host_unreachable ||
      ec == e::network_unreachable || ec == e::network_down || ec == e::network_reset ||
      ec == e::not_connected || ec == e::shut_down || ec == e::host_not_found ||
      ec == e::host_not_found_try_again || ec == e::no_data || ec == e::service_not_found) {
    return Status::Unavailable(std::move(message));
  }
  if (ec == e::address_in_use) return Status::FailedPrecondition(std::move(message));
  if (ec == e::invalid_argument || ec == e::address_family_not_supported ||
      ec == e::bad_descriptor) {
    return Status::InvalidArgument(std::move(message));
  }
  if (ec == e::no_memory || ec == e::no_buffer_space || ec == e::no_descriptors) {
    return Status::ResourceExhausted(std::move(message));
  }
  return Status::IoError(std::move(message));
}

// Asio's transfer_all caps each system call at 64 KiB; chunk messages are 1-16 MiB.
struct TransferAll {
  size_t operator()(const ErrorCode& ec, size_t /*transferred*/) const {
    return ec ? 0 : (size_t{1} << 30);
  }
};

inline void NoteArrival(std::atomic<int64_t>& last_arrival) {
  last_arrival.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                     std::memory_order_relaxed);
}

// TransferAll for reads that also notes when bytes came (steady_clock ticks) after
// each read that brought some but did not finish the buffer (asio asks no more
// then: the read's handler notes that one): a message still arriving keeps the
// link's last_arrival() fresh, however long the whole of it takes.
struct TransferAllNotingArrival {
  std::atomic<int64_t>* last_arrival;
  size_t operator()(const ErrorCode& ec, size_t transferred) const {
    if (transferred > 0) NoteArrival(*last_arrival);
    return TransferAll()(ec, transferred);
  }
};

inline std::string EndpointString(const tcp::endpoint& endpoint) {
  return JoinHostPort(endpoint.address().to_string(), endpoint.port());
}

inline Status ConfigureSocket(tcp::socket& socket, const TcpOptions& options) {
  ErrorCode ec;
  socket.set_option(tcp::no_delay(true), ec);
  if (ec) return StatusFromError(ec, "setting TCP_NODELAY");
  if (options.socket_buffer_bytes > 0) {
    socket.set_option(asio::socket_base::send_buffer_size(options.socket_buffer_bytes), ec);
    if (!ec) {
      socket.set_option(asio::socket_base::receive_buffer_size(options.socket_buffer_bytes), ec);
    }
    if (ec) return StatusFromError(ec, "setting socket buffer sizes");
  }
  return Status::Ok();
}

class Link;
class ConnectOp;
class Core;
// Fails every pending Connect (transport shut down). Control strand.
void FailPendingConnects(Core& core);
struct Listener;
struct AcceptedStream;
struct PendingLink;

// State shared by the transport, its links and its pending operations. Links hold
// it (shared_ptr) so the io_context outlives every socket.
class Core : public std::enable_shared_from_this<Core> {
 public:
  explicit Core(const TcpOptions& opts);

  void StartThreads();
  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept);
  void Connect(const std::string& address, ConnectHandler on_done);
  void Shutdown();

  // Posts `fn` to `strand` unless the transport has stopped (then drops it).
  template <typename F>
  bool Post(const Strand& strand, F&& fn) {
    MutexLock lock(mu_);
    if (stopped_.load(std::memory_order_relaxed)) return false;
    asio::post(strand, std::forward<F>(fn));
    return true;
  }
  // Tracks a new link for Shutdown; false when shutting down (caller drops the link).
  bool Register(const std::shared_ptr<Link>& link);
  void Unregister(const Link* link);
  bool closing() const {
    MutexLock lock(mu_);
    return closing_;
  }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  uint64_t NewLinkId() {
    MutexLock lock(mu_);
    return rng_();
  }

  // Control strand only: acceptors, handshakes, connects.
  void AcceptNext(const std::shared_ptr<Listener>& listener);
  void BeginHandshake(const std::shared_ptr<Listener>& listener, tcp::socket socket);
  void ReadHello(const std::shared_ptr<AcceptedStream>& stream);
  void OnHello(const std::shared_ptr<AcceptedStream>& stream, const ErrorCode& ec);
  void DropHandshake(const std::shared_ptr<AcceptedStream>& stream, std::string_view why,
                     bool quiet = false);
  void DropPendingLink(const std::shared_ptr<PendingLink>& pending, std::string_view why);
  void SendAcks(const std::shared_ptr<PendingLink>& pending);
  void CompleteAccept(const std::shared_ptr<PendingLink>& pending);
  void CloseControlState();

  const TcpOptions options;
  Capabilities caps;
  internal::TlsContexts tls;  // both null without TlsOptions
  // Received messages are read into recycled buffers: no allocation, zero-fill or
  // page faults per message once the pool is warm.
  const std::shared_ptr<BufferPool> receive_pool =
      std::make_shared<BufferPool>(options.receive_pool_bytes, options.receive_pool_idle);
  asio::io_context io;  // first member to be built, last to go
  Strand control;
  asio::steady_timer trim_timer{io};  // gives idle receive buffers back (control strand)

  // Peers with accepted sockets still in the handshake, by IP (control strand).
  std::map<std::string, size_t> pending_by_host;
  size_t pending_sockets = 0;
  void PendingDone(const std::string& host, size_t sockets = 1) {
    auto it = pending_by_host.find(host);
    if (it == pending_by_host.end()) return;
    it->second -= std::min(it->second, sockets);
    pending_sockets -= std::min(pending_sockets, sockets);
    if (it->second == 0) pending_by_host.erase(it);
  }
  size_t LinksFrom(const std::string& host) const {
    MutexLock lock(mu_);
    auto it = links_by_host_.find(host);
    return it == links_by_host_.end() ? 0 : it->second;
  }
  void TrimPoolLater();

  std::vector<std::shared_ptr<Listener>> listeners;
  std::set<std::shared_ptr<ConnectOp>> connects;
  std::set<std::shared_ptr<AcceptedStream>> handshakes;
  uint64_t next_handshake_serial = 0;  // AcceptedStream::serial: grows with age
  uint64_t evicted_quietly_ = 0;       // silent sockets closed for a newcomer
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<PendingLink>> pending_links;
  uint64_t refused_quietly_ = 0;  // sockets refused by the caps (control strand)
  uint64_t dropped_quietly_ = 0;  // handshakes that timed out or failed TLS

 private:
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
  std::vector<std::thread::id> thread_ids_;
  mutable Mutex mu_;
  bool closing_ GUARDED_BY(mu_) = false;
  std::atomic<bool> stopped_{false};
  std::unordered_map<const Link*, std::weak_ptr<Link>> links_ GUARDED_BY(mu_);
  std::map<std::string, size_t> links_by_host_ GUARDED_BY(mu_);  // accepted links, by peer IP
  std::mt19937_64 rng_ GUARDED_BY(mu_){std::random_device{}()};
  Mutex shutdown_mu_;
  bool shut_down_ GUARDED_BY(shutdown_mu_) = false;
};

// One logical connection: 1..N sockets, a send queue, a reorder buffer. All state
// below the atomics is touched only on strand_.
class Link : public std::enable_shared_from_this<Link> {
 public:
  // `inbound_host`: the peer's IP for an accepted link (counted against
  // max_links_per_address), empty for one this side connected.
  Link(std::shared_ptr<Core> core, std::vector<StreamPtr> sockets, std::string peer,
       std::string inbound_host = {})
      : core_(std::move(core)),
        strand_(asio::make_strand(core_->io)),
        peer_(std::move(peer)),
        inbound_host_(std::move(inbound_host)),
        identity_(sockets.empty() ? "" : sockets[0]->PeerIdentity()) {
    for (auto& socket : sockets) streams_.push_back(std::make_unique<Stream>(std::move(socket)));
  }

  // Lifts the pre-authentication frame limit and reads the frames it held back.
  void Authenticated() {
    core_->Post(strand_, [self = shared_from_this()] {
      if (self->authenticated_) return;
      self->authenticated_ = true;
      for (size_t i = 0; i < self->streams_.size() && !self->closed_; ++i) {
        Stream& stream = *self->streams_[i];
        if (!stream.held_for_auth) continue;
        stream.held_for_auth = false;
        if (self->ShouldPause(stream)) {
          stream.paused = true;
        } else {
          self->ReadBody(i);
        }
      }
    });
  }
  const std::string& inbound_host() const { return inbound_host_; }
  const std::string& identity() const { return identity_; }

  void Start(MessageHandler on_message, CloseHandler on_closed) {
    core_->Post(strand_, [self = shared_from_this(), on_message = std::move(on_message),
                          on_closed = std::move(on_closed)]() mutable {
      self->DoStart(std::move(on_message), std::move(on_closed));
    });
  }

  void Send(Message message, SendHandler on_sent) {
    const uint64_t size = message ? message->size() : 0;
    const bool valid = message && size <= core_->options.max_message_bytes;
    if (valid) queued_bytes_.fetch_add(size, std::memory_order_relaxed);
    const bool posted = core_->Post(
        strand_,
        [self = shared_from_this(), message = std::move(message), on_sent = std::move(on_sent),
         valid]() mutable { self->DoSend(std::move(message), std::move(on_sent), valid); });
    if (!posted && valid) queued_bytes_.fetch_sub(size, std::memory_order_relaxed);
  }

  // Orderly (goodbye) or abortive close from the application.
  void Close(bool abortive) {
    closing_.store(true, std::memory_order_relaxed);
    core_->Post(strand_, [self = shared_from_this(), abortive] {
      if (abortive) {
        self->CloseNow(Status::Aborted("connection aborted locally"),
                       Status::Aborted("connection aborted before the message was sent"),
                       CloseMode::kSilent);
      } else {
        self->CloseNow(Status::Ok(),
                       Status::Aborted("connection closed before the message was sent"),
                       CloseMode::kGoodbye);
      }
    });
  }

  void CloseForShutdown() {
    closing_.store(true, std::memory_order_relaxed);
    core_->Post(strand_, [self = shared_from_this()] {
      self->CloseNow(Status::Aborted("transport shut down"),
                     Status::Aborted("transport shut down before the message was sent"),
                     CloseMode::kSilent);
    });
  }

  uint64_t QueuedBytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  std::chrono::steady_clock::time_point last_arrival() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_arrival_.load(std::memory_order_relaxed)));
  }
  const std::string& peer() const { return peer_; }
  // The facade is going: close, and return once no user handler can run.
  void Detach() {
    Close(/*abortive=*/false);
    gate_.Close();
  }

 private:
  enum class CloseMode { kGoodbye, kSilent };

  struct Stream {
    explicit Stream(StreamPtr s) : io(std::move(s)) {}
    StreamPtr io;
    bool writing = false;
    bool paused = false;         // header read, body held back by the reorder budget
    bool held_for_auth = false;  // header read, body larger than the pre-auth limit
    std::array<std::byte, kFrameHeaderSize> read_header{};
    std::array<std::byte, kFrameHeaderSize> write_header{};
    uint64_t body_sequence = 0;
    uint64_t body_length = 0;
    std::shared_ptr<std::vector<std::byte>> body;
  };

  struct Outgoing {
    Message message;
    SendHandler on_sent;
    uint64_t sequence = 0;
    bool written = false;
  };

  template <typename F>
  void Invoke(F&& fn) {
    if (core_->stopped()) return;
    gate_.Run(std::forward<F>(fn));
  }

  void Fail(const Status& status) { CloseNow(status, status, CloseMode::kSilent); }

  void DoStart(MessageHandler on_message, CloseHandler on_closed) {
    if (started_) return;
    started_ = true;
    on_message_ = std::move(on_message);
    on_closed_ = std::move(on_closed);
    if (closed_) {
      NotifyClosed();
      return;
    }
    for (size_t i = 0; i < streams_.size(); ++i) ReadHeader(i);
  }

  void DoSend(Message message, SendHandler on_sent, bool valid) {
    if (!valid) {
      Status status =
          message ? Status::InvalidArgument("message of " + std::to_string(message->size()) +
                                            " bytes exceeds max_message_bytes " +
                                            std::to_string(core_->options.max_message_bytes))
                  : Status::InvalidArgument("null message");
      if (on_sent) Invoke([&] { on_sent(std::move(status)); });
      return;
    }
    if (closed_) {
      queued_bytes_.fetch_sub(message->size(), std::memory_order_relaxed);
      if (on_sent) Invoke([&] { on_sent(send_abort_status_); });
      return;
    }
    queue_.push_back(Outgoing{std::move(message), std::move(on_sent)});
    Pump();
  }

  // Hands queued messages to idle streams, lowest index first.
  void Pump() {
    for (size_t i = 0; i < streams_.size() && !queue_.empty() && !closed_; ++i) {
      Stream& stream = *streams_[i];
      if (stream.writing) continue;
      Outgoing out = std::move(queue_.front());
      queue_.pop_front();
      out.sequence = next_send_sequence_++;
      EncodeFrameHeader({FrameType::kData, out.message->size(), out.sequence}, stream.write_header);
      const std::array<asio::const_buffer, 2> buffers{
          asio::buffer(stream.write_header),
          asio::buffer(out.message->data(), out.message->size())};
      stream.writing = true;
      // The handler keeps the bytes alive until the write is over, whatever happens
      // to in_flight_ meanwhile.
      asio::async_write(
          *stream.io, buffers, TransferAll(),
          asio::bind_executor(
              strand_, [self = shared_from_this(), i, sequence = out.sequence, keep = out.message](
                           const ErrorCode& ec, size_t) { self->OnWritten(i, sequence, ec); }));
      in_flight_.push_back(std::move(out));
    }
  }

  void OnWritten(size_t index, uint64_t sequence, const ErrorCode& ec) {
    streams_[index]->writing = false;
    if (closed_) return;
    if (ec) {
      Fail(StatusFromError(ec, "sending to " + peer_));
      return;
    }
    Outgoing& out = in_flight_[sequence - in_flight_.front().sequence];
    out.written = true;
    queued_bytes_.fetch_sub(out.message->size(), std::memory_order_relaxed);
    // Writes on different streams finish out of order; on_sent runs in Send order.
    while (!in_flight_.empty() && in_flight_.front().written) {
      Outgoing done = std::move(in_flight_.front());
      in_flight_.pop_front();
      if (done.on_sent) Invoke([&] { done.on_sent(Status::Ok()); });
    }
    Pump();
  }

  void ReadHeader(size_t index) {
    Stream& stream = *streams_[index];
    asio::async_read(
        *stream.io, asio::buffer(stream.read_header), TransferAllNotingArrival{&last_arrival_},
        asio::bind_executor(strand_,
                            [self = shared_from_this(), index](const ErrorCode& ec, size_t n) {
                              self->OnHeader(index, ec, n);
                            }));
  }

  void OnHeader(size_t index, const ErrorCode& ec, size_t transferred) {
    if (transferred > 0) NoteArrival(last_arrival_);
    if (closed_) return;
    Stream& stream = *streams_[index];
    if (ec) {
      if (IsEof(ec) && transferred == 0) {
        // A clean end between frames. On a striped link the other streams may still
        // hold messages sent before it: deliver those, break when all have ended.
        StreamFinished();
      } else if (IsEof(ec)) {
        Fail(Status::Unavailable("peer " + peer_ + " closed the connection inside a frame header"));
      } else {
        Fail(StatusFromError(ec, "receiving from " + peer_));
      }
      return;
    }
    auto header = DecodeFrameHeader(stream.read_header);
    if (!header.ok()) {
      Fail(header.status().WithContext("from " + peer_));
      return;
    }
    switch (header->type) {
      case FrameType::kData: {
        if (header->length > core_->options.max_message_bytes) {
          Fail(Status::Corrupt("from " + peer_ + ": message of " + std::to_string(header->length) +
                               " bytes exceeds max_message_bytes " +
                               std::to_string(core_->options.max_message_bytes)));
          return;
        }
        if (Status s = CheckSequence(header->sequence); !s.ok()) {
          Fail(s);
          return;
        }
        stream.body_sequence = header->sequence;
        stream.body_length = header->length;
        const uint64_t pre_auth = core_->options.handshake_max_message_bytes;
        if (header->length == 0) {
          stream.body = std::make_shared<std::vector<std::byte>>();
          Received(index);
        } else if (!authenticated_ && pre_auth > 0 && header->length > pre_auth) {
          // Nothing is allocated for a peer that has proved nothing: the body waits
          // in its socket until Authenticated() (the application drops the link if
          // the handshake never completes).
          stream.held_for_auth = true;
        } else if (ShouldPause(stream)) {
          stream.paused = true;
        } else {
          ReadBody(index);
        }
        return;
      }
      case FrameType::kGoodbye:
        if (header->sequence < next_recv_sequence_ ||
            (goodbye_total_ && *goodbye_total_ != header->sequence) ||
            (!reorder_.empty() && reorder_.rbegin()->first >= header->sequence)) {
          Fail(Status::Corrupt("from " + peer_ + ": goodbye after " +
                               std::to_string(header->sequence) +
                               " messages contradicts the messages received"));
          return;
        }
        goodbye_total_ = header->sequence;
        Deliver();                       // may complete the orderly close
        if (!closed_) StreamFinished();  // this stream reads no more
        return;
      case FrameType::kHello:
      case FrameType::kHelloAck:
        Fail(Status::Corrupt("from " + peer_ + ": handshake frame on an established link"));
        return;
    }
  }

  // A stream ended cleanly (goodbye, or EOF between frames). On a striped link the
  // others may still carry earlier messages; once every stream has ended and the
  // goodbye count (if any) was not reached, the peer went away without finishing.
  void StreamFinished() {
    if (++finished_streams_ < streams_.size()) return;
    if (goodbye_total_) {
      Fail(Status::Unavailable("peer " + peer_ + " closed the connection after announcing " +
                               std::to_string(*goodbye_total_) + " messages, of which only " +
                               std::to_string(next_recv_sequence_) + " arrived"));
    } else {
      Fail(Status::Unavailable("peer " + peer_ +
                               " closed the connection without a goodbye (crashed or aborted)"));
    }
  }

  Status CheckSequence(uint64_t sequence) const {
    const bool bad =
        sequence < next_recv_sequence_ || sequence - next_recv_sequence_ >= kMaxReorderDistance ||
        (streams_.size() == 1 && sequence != next_recv_sequence_) ||
        reorder_.count(sequence) != 0 || (goodbye_total_ && sequence >= *goodbye_total_);
    if (!bad) return Status::Ok();
    return Status::Corrupt("from " + peer_ + ": unexpected message sequence " +
                           std::to_string(sequence) + " (next expected " +
                           std::to_string(next_recv_sequence_) + ")");
  }

  bool ShouldPause(const Stream& stream) const {
    return stream.body_sequence != next_recv_sequence_ && !reorder_.empty() &&
           reorder_bytes_ + stream.body_length > kReorderBudgetBytes;
  }

  void ReadBody(size_t index) {
    Stream& stream = *streams_[index];
    try {
      // Read straight into the buffer the message will live in.
      stream.body = core_->receive_pool->AcquireShared(stream.body_length);
    } catch (const std::bad_alloc&) {
      Fail(Status::ResourceExhausted("cannot allocate a " + std::to_string(stream.body_length) +
                                     "-byte message from " + peer_));
      return;
    }
    asio::async_read(*stream.io, asio::buffer(stream.body->data(), stream.body->size()),
                     TransferAllNotingArrival{&last_arrival_},
                     asio::bind_executor(strand_, [self = shared_from_this(), index](
                                                      const ErrorCode& ec, size_t n) {
                       self->OnBody(index, ec, n);
                     }));
  }

  void OnBody(size_t index, const ErrorCode& ec, size_t transferred) {
    if (transferred > 0) NoteArrival(last_arrival_);
    if (closed_) return;
    if (ec) {
      const Stream& stream = *streams_[index];
      if (IsEof(ec)) {
        Fail(Status::Unavailable("peer " + peer_ + " closed the connection in the middle of a " +
                                 std::to_string(stream.body_length) + "-byte message (" +
                                 std::to_string(transferred) + " bytes received)"));
      } else {
        Fail(StatusFromError(ec, "receiving from " + peer_));
      }
      return;
    }
    Received(index);
  }

  void Received(size_t index) {
    Stream& stream = *streams_[index];
    reorder_bytes_ += stream.body_length;
    reorder_.emplace(stream.body_sequence, std::move(stream.body));
    Deliver();
    if (!closed_) ReadHeader(index);
  }

  void Deliver() {
    while (!closed_ && !closing_.load(std::memory_order_relaxed)) {
      auto first = reorder_.begin();
      if (first == reorder_.end() || first->first != next_recv_sequence_) break;
      Message message = std::move(first->second);
      reorder_bytes_ -= message->size();
      reorder_.erase(first);
      ++next_recv_sequence_;
      if (on_message_) Invoke([&] { on_message_(std::move(message)); });
    }
    if (closed_) return;
    if (goodbye_total_ && next_recv_sequence_ == *goodbye_total_) {
      CloseNow(Status::Ok(),
               Status::Unavailable("peer " + peer_ +
                                   " closed the connection before the message was sent"),
               CloseMode::kSilent);
      return;
    }
    for (size_t i = 0; i < streams_.size(); ++i) {
      Stream& stream = *streams_[i];
      if (stream.paused && !ShouldPause(stream)) {
        stream.paused = false;
        ReadBody(i);
      }
    }
  }

  void CloseNow(Status status, Status send_status, CloseMode mode) {
    if (closed_) return;
    closed_ = true;
    closing_.store(true, std::memory_order_relaxed);
    close_status_ = std::move(status);
    send_abort_status_ = std::move(send_status);
    for (auto& stream : streams_) {
      if (mode == CloseMode::kGoodbye && !stream->writing) TryWriteGoodbye(*stream);
      ErrorCode ignored;
      stream->io->socket().close(ignored);  // cancels pending reads and writes
      stream->body.reset();
    }
    reorder_.clear();
    reorder_bytes_ = 0;
    std::deque<Outgoing> aborted = std::move(in_flight_);
    in_flight_.clear();
    for (auto& out : queue_) aborted.push_back(std::move(out));
    queue_.clear();
    for (auto& out : aborted) {
      if (!out.written) queued_bytes_.fetch_sub(out.message->size(), std::memory_order_relaxed);
    }
    for (auto& out : aborted) {
      if (out.on_sent) {
        Invoke([&] { out.on_sent(out.written ? Status::Ok() : send_abort_status_); });
      }
    }
    core_->Unregister(this);
    if (started_) NotifyClosed();
  }

  // Best effort, never blocks: a stream whose socket buffer is full gets none, and
  // its peer then sees the link break instead of an orderly close.
  void TryWriteGoodbye(Stream& stream) {
    std::array<std::byte, kFrameHeaderSize> frame;
    EncodeFrameHeader({FrameType::kGoodbye, 0, next_send_sequence_}, frame);
    stream.io->WriteNowNonBlocking(asio::buffer(frame));
  }

  void NotifyClosed() {
    if (close_notified_) return;
    close_notified_ = true;
    CloseHandler on_closed = std::move(on_closed_);
    on_closed_ = nullptr;
    on_message_ = nullptr;
    if (on_closed) Invoke([&] { on_closed(close_status_); });
  }

  const std::shared_ptr<Core> core_;
  const Strand strand_;
  std::vector<std::unique_ptr<Stream>> streams_;
  const std::string peer_;
  const std::string inbound_host_;
  const std::string identity_;  // the TLS peer's certificate CN; empty for plaintext
  HandlerGate gate_;
  std::atomic<uint64_t> queued_bytes_{0};
  std::atomic<bool> closing_{false};      // set by Close from any thread: stop delivering
  std::atomic<int64_t> last_arrival_{0};  // steady_clock ticks of the last bytes read

  // Strand-only state.
  std::deque<Outgoing> queue_;      // not yet given to a stream
  std::deque<Outgoing> in_flight_;  // given to a stream, ordered by sequence
  uint64_t next_send_sequence_ = 0;
  bool started_ = false;
  bool closed_ = false;
  bool close_notified_ = false;
  bool authenticated_ = false;
  Status close_status_;
  Status send_abort_status_;
  MessageHandler on_message_;
  CloseHandler on_closed_;
  uint64_t next_recv_sequence_ = 0;
  std::map<uint64_t, Message> reorder_;  // received, waiting for earlier sequences
  uint64_t reorder_bytes_ = 0;
  std::optional<uint64_t> goodbye_total_;  // data frames the peer sent before its goodbye
  size_t finished_streams_ = 0;            // streams past their goodbye or a clean EOF
};

struct Listener {
  explicit Listener(asio::io_context& io) : acceptor(io), retry(io) {}
  tcp::acceptor acceptor;
  asio::steady_timer retry;  // after accept errors such as EMFILE
  AcceptHandler on_accept;
};

// An accepted socket waiting for its hello.
struct AcceptedStream {
  AcceptedStream(asio::io_context& io, tcp::socket s)
      : io(std::make_unique<TcpStream>(std::move(s))), timer(io) {}
  StreamPtr io;
  unsigned char first_byte = 0;  // peeked: TLS or plaintext
  asio::steady_timer timer;
  std::array<std::byte, kFrameHeaderSize + kHelloSize> hello{};
  std::shared_ptr<Listener> listener;
  std::string host;  // the peer's IP: what the per-address caps count
  std::string peer;
  uint64_t serial = 0;  // accept order: the oldest gives its slot up first
};

// Accepted streams of one link until all stream_count have said hello.
struct PendingLink {
  PendingLink(asio::io_context& io, uint32_t count)
      : stream_count(count), sockets(count), acks(count), timer(io) {}
  uint64_t link_id = 0;
  uint32_t stream_count;
  uint32_t arrived = 0;
  uint32_t acks_written = 0;
  bool failed = false;
  std::pair<std::string, uint64_t> key;
  std::vector<StreamPtr> sockets;
  std::vector<std::array<std::byte, kFrameHeaderSize + kHelloSize>> acks;
  asio::steady_timer timer;
  std::shared_ptr<Listener> listener;
  std::string peer;
};

// One Connect: resolve, open streams_per_link sockets, hello on each, wait for the
// acks. Lives on the control strand.
}  // namespace deltacast::transport::tcp_internal
