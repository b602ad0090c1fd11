// The UCX backend's links, listeners and progress loop (design in ucx_transport.h).
//
// Thread safety: Core's progress thread owns every UCP object and all state marked
// "progress thread"; other threads reach it only through Core::Post. Link's public
// methods (Start/Send/Close) post; its atomics and gate are shared.
#include "transport/ucx/ucx_transport.h"

#include <netdb.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/log.h"
#include "transport/internal/address.h"
#include "transport/internal/buffer_pool.h"
#include "transport/internal/core_transport.h"
#include "transport/internal/handler_gate.h"
#include "transport/internal/link_connection.h"
#include "transport/ucx/ucx_worker.h"
#include "transport/ucx/wire.h"

namespace deltacast::transport {
namespace {

using namespace ucx;  // NOLINT(build/namespaces): this backend's own pieces
using Clock = std::chrono::steady_clock;

constexpr auto kDeadlineCheckPeriod = std::chrono::milliseconds(5);
// After Shutdown force-closed every endpoint, how long the loop waits for UCX to
// confirm before destroying the worker anyway.
constexpr auto kShutdownGrace = std::chrono::seconds(2);
// Idle received buffers kept for reuse per transport.
constexpr uint64_t kPoolIdleBytes = uint64_t{512} << 20;

class Core;
class Link;

std::string SockaddrString(const sockaddr* addr, socklen_t length) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getnameinfo(addr, length, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "unknown";
  }
  return JoinHostPort(host, static_cast<uint16_t>(std::stoi(port)));
}

socklen_t SockaddrLength(const sockaddr_storage& storage) {
  return storage.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfo> Resolve(const std::string& address, bool passive) {
  ASSIGN_OR_RETURN(HostPort host_port, ParseHostPort(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const int rc =
      getaddrinfo(host_port.host.c_str(), std::to_string(host_port.port).c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return Status::Unavailable("resolving " + address + ": " + gai_strerror(rc));
  }
  return AddrInfo(result);
}

// The context of one UCP request in flight; freed by its callback, or after the
// worker is destroyed if UCX never completed it.
struct RequestCtx {
  enum class Kind { kSend, kRecv, kControl, kEpClose };
  RequestCtx(Kind k, Core* c, std::shared_ptr<Link> l = nullptr, uint64_t s = 0)
      : kind(k), core(c), link(std::move(l)), seq(s) {}
  Kind kind;
  Core* core;
  std::shared_ptr<Link> link;
  uint64_t seq;
  AmHeader header;         // must stay valid until the send completes
  Message keep;            // kSend: the caller's bytes UCX reads from
  Buffer buffer;           // kRecv: the pooled bytes UCX writes into
  ucp_ep_h ep = nullptr;   // kEpClose
  bool completed = false;  // the callback ran (possibly before Submit saw the request)
};

struct ListenerState {
  Core* core = nullptr;
  ucp_listener_h handle = nullptr;
  AcceptHandler on_accept;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(const UcxOptions& opts, std::unique_ptr<UcxWorker> ucx_worker);
  ~Core();

  void StartThread();
  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept);
  void Connect(const std::string& address, ConnectHandler on_done);
  void Shutdown();

  // Any thread: runs `fn` on the progress thread; false once it has stopped.
  bool Post(std::function<void()> fn);
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  bool OnThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  // Progress thread only.
  void Defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }
  ucp_worker_h worker() const { return ucx_->worker(); }
  // Takes ownership of `ctx` for the request `ptr` returned; UCS_INPROGRESS while
  // in flight, else the immediate status (ctx already freed).
  ucs_status_t Submit(ucs_status_ptr_t ptr, RequestCtx* ctx);
  void Completed(RequestCtx* ctx, ucs_status_t status);
  void Register(const std::shared_ptr<Link>& link, ucp_ep_h ep);
  void EpGone(ucp_ep_h ep) { eps_.erase(ep); }
  void LinkClosed(const Link* link);

  const UcxOptions options;
  Capabilities caps;
  const std::shared_ptr<BufferPool> pool = std::make_shared<BufferPool>(kPoolIdleBytes);

 private:
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnConnRequest(ucp_conn_request_h request, void* arg);

  void Loop();
  bool RunPosted();
  bool RunDeferred();
  void CheckDeadlines(Clock::time_point now);
  bool HasDeadlines() const;
  Result<std::string> DoListen(const std::string& address, AcceptHandler on_accept);
  void DoConnect(const std::string& address, ConnectHandler on_done);
  void Accept(ListenerState* listener, ucp_conn_request_h request);
  void BeginShutdown();
  void Teardown();

  std::unique_ptr<UcxWorker> ucx_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> closing_{false};  // Shutdown began: refuse Listen/Connect
  std::atomic<bool> stopped_{false};  // handlers suppressed, loop gone

  std::mutex post_mu_;
  std::vector<std::function<void()>> posted_;
  bool accepting_posts_ = true;

  std::mutex shutdown_mu_;
  bool shut_down_ = false;

  // Progress thread state.
  std::deque<std::function<void()>> deferred_;
  std::unordered_map<ucp_ep_h, std::shared_ptr<Link>> eps_;  // until UCX closed the ep
  std::unordered_map<const Link*, std::shared_ptr<Link>> open_links_;
  std::vector<std::unique_ptr<ListenerState>> listeners_;
  std::unordered_set<RequestCtx*> live_;
  bool shutting_down_ = false;
  Clock::time_point shutdown_deadline_;
};

// One logical link: a UCP endpoint, the send window, the reorder buffer.
class Link : public std::enable_shared_from_this<Link> {
 public:
  enum class State { kConnecting, kAccepting, kOpen };

  Link(std::shared_ptr<Core> core, std::string peer, State state)
      : core_(std::move(core)), peer_(std::move(peer)), state_(state) {}

  // Any thread.
  void Start(MessageHandler on_message, CloseHandler on_closed) {
    core_->Post([self = shared_from_this(), on_message = std::move(on_message),
                 on_closed = std::move(on_closed)]() mutable {
      self->DoStart(std::move(on_message), std::move(on_closed));
    });
  }
  void Send(Message message, SendHandler on_sent) {
    const uint64_t size = message ? message->size() : 0;
    const bool valid = message && size <= core_->options.max_message_bytes;
    if (valid) queued_bytes_.fetch_add(size, std::memory_order_relaxed);
    const bool posted = core_->Post(
        [self = shared_from_this(), message = std::move(message), on_sent = std::move(on_sent),
         valid]() mutable { self->DoSend(std::move(message), std::move(on_sent), valid); });
    if (!posted && valid) queued_bytes_.fetch_sub(size, std::memory_order_relaxed);
  }
  void Close(bool abortive) {
    closing_.store(true, std::memory_order_relaxed);
    core_->Post([self = shared_from_this(), abortive] { self->DoClose(abortive); });
  }
  uint64_t QueuedBytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  const std::string& peer() const { return peer_; }
  // Lifts the pre-authentication limit: rendezvous data held back is fetched now.
  void Authenticated() {
    core_->Post([self = shared_from_this()] {
      self->authenticated_ = true;
      self->PumpReceive();
    });
  }
  // The facade is going: close, and return once no user handler can run.
  void Detach() {
    Close(/*abortive=*/false);
    gate_.Close();
  }

  // Progress thread.
  void SetEp(ucp_ep_h ep) { ep_ = ep; }
  void SetDeadline(Clock::time_point when) { deadline_ = when; }
  bool has_deadline() const { return deadline_ != Clock::time_point::max(); }
  void SetConnectHandler(ConnectHandler on_done) { on_connected_ = std::move(on_done); }
  void SetListener(ListenerState* listener) { listener_ = listener; }
  void SendControl(AmType type, uint64_t value);
  ucs_status_t OnDataArrived(const AmHeader& header, void* data, size_t length, bool rndv);
  void OnControl(const AmHeader& header);
  void OnEpError(ucs_status_t status);
  void OnSendDone(uint64_t seq, ucs_status_t status);
  void OnRecvDone(uint64_t seq, Buffer buffer, ucs_status_t status);
  void OnDeadline(Clock::time_point now);
  void ShutdownNow();
  void ForceCloseEp();

 private:
  enum class Signal { kNone, kGoodbye, kAbort };

  struct Outgoing {
    bool data = true;  // false: refused by Send (invalid), never sent
    uint64_t seq = 0;
    uint64_t size = 0;
    SendHandler on_sent;
    bool done = false;
    Status status;
  };
  struct Incoming {
    uint64_t length = 0;
    Buffer buffer;         // complete (or eager) data
    void* desc = nullptr;  // rendezvous data not yet asked for
    bool complete = false;
  };
  struct RemoteEnd {
    AmType type;
    uint64_t count;
  };

  template <typename F>
  void Invoke(F&& fn) {
    if (core_->stopped()) return;
    gate_.Run(std::forward<F>(fn));
  }

  void DoStart(MessageHandler on_message, CloseHandler on_closed);
  void DoSend(Message message, SendHandler on_sent, bool valid);
  void DoClose(bool abortive);
  void ReportSends();
  void PumpReceive();
  void RequestData(uint64_t seq, Incoming& incoming);
  void Deliver();
  uint64_t ReceivedThrough() const;
  void CheckRemoteEnd();
  void Fail(Status status, Signal signal);
  void CloseLocal(Status status, Status send_status, Signal signal);
  void FinishConnect(Result<std::unique_ptr<Connection>> result);
  void NotifyClosed();
  void DropReceived();
  void ReleaseDesc(void* desc);

  const std::shared_ptr<Core> core_;
  const std::string peer_;
  HandlerGate gate_;
  std::atomic<uint64_t> queued_bytes_{0};
  std::atomic<bool> closing_{false};  // Close was called: stop delivering now

  // Progress thread state.
  State state_;
  ucp_ep_h ep_ = nullptr;  // null once force-closed
  Clock::time_point deadline_ = Clock::time_point::max();
  ConnectHandler on_connected_;
  ListenerState* listener_ = nullptr;
  bool started_ = false;
  bool closed_ = false;
  bool authenticated_ = false;
  bool close_notified_ = false;
  bool ack_sent_ = false;
  bool we_initiated_close_ = false;
  Status close_status_;
  Status send_abort_status_;
  MessageHandler on_message_;
  CloseHandler on_closed_;
  std::deque<Outgoing> out_;
  uint64_t next_send_seq_ = 0;
  uint64_t sent_ok_ = 0;  // data messages whose on_sent ran OK
  std::map<uint64_t, Incoming> recv_;
  uint64_t next_recv_seq_ = 0;
  std::optional<RemoteEnd> remote_end_;
  // Rendezvous descriptors dropped while the endpoint is up: releasing one makes
  // UCX complete the sender's request as if delivered, so wait until the endpoint
  // is closed (the sender then sees the link break instead).
  std::vector<void*> dropped_descs_;
};

// ---- request callbacks (inside ucp_worker_progress: no user code here) ----

void OnSendCallback(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  auto* ctx = static_cast<RequestCtx*>(user_data);
  ctx->core->Completed(ctx, status);
}

void OnRecvCallback(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  ucp_request_free(request);
  auto* ctx = static_cast<RequestCtx*>(user_data);
  ctx->core->Completed(ctx, status);
}

ucp_request_param_t SendParam(RequestCtx* ctx) {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = OnSendCallback;
  param.user_data = ctx;
  // The receiver identifies the link by the reply endpoint.
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  return param;
}

// ---- Link ----

void Link::SendControl(AmType type, uint64_t value) {
  if (ep_ == nullptr) return;
  auto* ctx = new RequestCtx{RequestCtx::Kind::kControl, core_.get()};
  ctx->header.type = type;
  ctx->header.value = value;
  ucp_request_param_t param = SendParam(ctx);
  core_->Submit(ucp_am_send_nbx(ep_, kAmId, &ctx->header, sizeof(AmHeader), nullptr, 0, &param),
                ctx);
}

void Link::DoStart(MessageHandler on_message, CloseHandler on_closed) {
  if (started_) return;
  started_ = true;
  on_message_ = std::move(on_message);
  on_closed_ = std::move(on_closed);
  if (closed_) {
    NotifyClosed();
    return;
  }
  PumpReceive();
}

void Link::DoSend(Message message, SendHandler on_sent, bool valid) {
  if (!valid) {
    Status status = message
                        ? Status::InvalidArgument("message of " + std::to_string(message->size()) +
                                                  " bytes exceeds max_message_bytes " +
                                                  std::to_string(core_->options.max_message_bytes))
                        : Status::InvalidArgument("null message");
    out_.push_back(Outgoing{false, 0, 0, std::move(on_sent), true, std::move(status)});
    ReportSends();  // in Send order with the sends before it
    return;
  }
  const uint64_t size = message->size();
  if (closed_) {
    queued_bytes_.fetch_sub(size, std::memory_order_relaxed);
    if (on_sent) Invoke([&] { on_sent(send_abort_status_); });
    return;
  }
  const uint64_t seq = next_send_seq_++;
  out_.push_back(Outgoing{true, seq, size, std::move(on_sent), false, Status::Ok()});
  if (ep_ == nullptr) {  // the peer closed and its endpoint is gone; we await Start
    out_.back().done = true;
    out_.back().status = Status::Unavailable("peer " + peer_ + " closed the connection");
    ReportSends();
    return;
  }
  auto* ctx = new RequestCtx{RequestCtx::Kind::kSend, core_.get(), shared_from_this(), seq};
  ctx->header.type = AmType::kData;
  ctx->header.value = seq;
  ctx->header.length = size;
  ctx->keep = std::move(message);
  ucp_request_param_t param = SendParam(ctx);
  // Straight from the caller's buffer; `keep` holds it until completion.
  const ucs_status_t status = core_->Submit(
      ucp_am_send_nbx(ep_, kAmId, &ctx->header, sizeof(AmHeader), ctx->keep->data(), size, &param),
      ctx);
  if (status != UCS_INPROGRESS) OnSendDone(seq, status);
}

void Link::DoClose(bool abortive) {
  if (closed_ || state_ != State::kOpen) return;
  if (abortive) {
    CloseLocal(Status::Aborted("connection aborted locally"),
               Status::Aborted("connection aborted before the message was sent"), Signal::kAbort);
  } else {
    CloseLocal(Status::Ok(), Status::Aborted("connection closed before the message was sent"),
               Signal::kGoodbye);
  }
}

void Link::OnSendDone(uint64_t seq, ucs_status_t status) {
  if (closed_) return;  // already reported
  for (auto& out : out_) {
    if (out.data && out.seq == seq) {
      out.done = true;
      break;
    }
  }
  if (status != UCS_OK) {
    Fail(Status::Unavailable("sending to " + peer_ + ": " + ucs_status_string(status)),
         Signal::kNone);
    ForceCloseEp();
    return;
  }
  ReportSends();
}

void Link::ReportSends() {
  while (!closed_ && !out_.empty() && out_.front().done) {
    Outgoing out = std::move(out_.front());
    out_.pop_front();
    if (out.data) {
      queued_bytes_.fetch_sub(out.size, std::memory_order_relaxed);
      if (out.status.ok()) ++sent_ok_;
    }
    if (out.on_sent) Invoke([&] { out.on_sent(out.status); });
  }
}

ucs_status_t Link::OnDataArrived(const AmHeader& header, void* data, size_t length, bool rndv) {
  if (closed_ || remote_end_) return UCS_OK;  // discarded (a rendezvous is released)
  const uint64_t seq = header.value;
  if (header.length != length) {
    core_->Defer([self = shared_from_this()] {
      self->Fail(Status::Corrupt("from " + self->peer_ + ": message length disagrees with header"),
                 Signal::kAbort);
    });
    return UCS_OK;
  }
  if (length > core_->options.max_message_bytes) {
    core_->Defer([self = shared_from_this(), length] {
      self->Fail(Status::Corrupt("from " + self->peer_ + ": message of " + std::to_string(length) +
                                 " bytes exceeds max_message_bytes " +
                                 std::to_string(self->core_->options.max_message_bytes)),
                 Signal::kAbort);
    });
    return UCS_OK;
  }
  if (seq < next_recv_seq_ || recv_.count(seq) != 0) {
    core_->Defer([self = shared_from_this(), seq] {
      self->Fail(Status::Corrupt("from " + self->peer_ + ": duplicate message sequence " +
                                 std::to_string(seq)),
                 Signal::kAbort);
    });
    return UCS_OK;
  }
  Incoming incoming;
  incoming.length = length;
  if (rndv) {
    incoming.desc = data;  // fetched once the application has started the link
  } else {
    try {
      incoming.buffer = core_->pool->Acquire(length);
    } catch (const std::bad_alloc&) {
      core_->Defer([self = shared_from_this(), length] {
        self->Fail(Status::ResourceExhausted("cannot allocate a " + std::to_string(length) +
                                             "-byte message from " + self->peer_),
                   Signal::kAbort);
      });
      return UCS_OK;
    }
    if (length > 0) std::memcpy(incoming.buffer->data(), data, length);
    incoming.complete = true;
  }
  recv_.emplace(seq, std::move(incoming));
  core_->Defer([self = shared_from_this()] { self->PumpReceive(); });
  return rndv ? UCS_INPROGRESS : UCS_OK;
}

void Link::PumpReceive() {
  if (closed_) return;
  if (started_) {
    const uint64_t pre_auth = core_->options.handshake_max_message_bytes;
    for (auto& [seq, incoming] : recv_) {
      // A peer that has proved nothing gets nothing allocated for a large message:
      // its data stays with it until the application authenticates it.
      if (!authenticated_ && pre_auth > 0 && incoming.length > pre_auth) break;
      if (incoming.desc != nullptr) RequestData(seq, incoming);
      if (closed_) return;
    }
  }
  Deliver();
}

void Link::RequestData(uint64_t seq, Incoming& incoming) {
  void* desc = std::exchange(incoming.desc, nullptr);
  auto* ctx = new RequestCtx{RequestCtx::Kind::kRecv, core_.get(), shared_from_this(), seq};
  try {
    ctx->buffer = core_->pool->Acquire(incoming.length);
  } catch (const std::bad_alloc&) {
    delete ctx;
    ReleaseDesc(desc);
    Fail(Status::ResourceExhausted("cannot allocate a " + std::to_string(incoming.length) +
                                   "-byte message from " + peer_),
         Signal::kAbort);
    return;
  }
  void* target = ctx->buffer->data();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = OnRecvCallback;
  param.user_data = ctx;
  ucs_status_ptr_t ptr =
      ucp_am_recv_data_nbx(core_->worker(), desc, target, incoming.length, &param);
  if (ptr == nullptr) {  // completed at once: the buffer is still ours
    incoming.buffer = std::move(ctx->buffer);
    incoming.complete = true;
    delete ctx;
    return;
  }
  const ucs_status_t status = core_->Submit(ptr, ctx);
  if (status != UCS_INPROGRESS) {
    Fail(Status::Unavailable("receiving from " + peer_ + ": " + ucs_status_string(status)),
         Signal::kNone);
    ForceCloseEp();
  }
}

void Link::OnRecvDone(uint64_t seq, Buffer buffer, ucs_status_t status) {
  if (closed_) {
    core_->pool->Release(std::move(buffer));
    return;
  }
  if (status != UCS_OK) {
    core_->pool->Release(std::move(buffer));
    if (remote_end_ && ReceivedThrough() >= remote_end_->count) return;  // not needed
    Fail(Status::Unavailable("receiving from " + peer_ + ": " + ucs_status_string(status)),
         Signal::kNone);
    ForceCloseEp();
    return;
  }
  auto it = recv_.find(seq);
  if (it == recv_.end()) {
    core_->pool->Release(std::move(buffer));
    return;
  }
  it->second.buffer = std::move(buffer);
  it->second.complete = true;
  Deliver();
}

void Link::Deliver() {
  auto self = shared_from_this();  // a handler may drop the connection
  while (started_ && !closed_ && !closing_.load(std::memory_order_relaxed)) {
    auto first = recv_.begin();
    if (first == recv_.end() || first->first != next_recv_seq_ || !first->second.complete) break;
    if (remote_end_ && next_recv_seq_ >= remote_end_->count) break;
    Message message = core_->pool->Wrap(std::move(first->second.buffer));
    recv_.erase(first);
    ++next_recv_seq_;
    if (on_message_) Invoke([&] { on_message_(std::move(message)); });
  }
  CheckRemoteEnd();
}

uint64_t Link::ReceivedThrough() const {
  uint64_t through = next_recv_seq_;
  for (auto it = recv_.find(through); it != recv_.end() && it->first == through;
       it = recv_.find(through)) {
    if (!it->second.complete) break;
    ++through;
  }
  return through;
}

// The peer announced how many messages it sent before closing: acknowledge once
// they all arrived, close once they were all delivered.
void Link::CheckRemoteEnd() {
  if (!remote_end_) return;
  if (!ack_sent_ && ReceivedThrough() >= remote_end_->count) {
    ack_sent_ = true;
    SendControl(AmType::kCloseAck, 0);
    // The closer tears down its endpoint on the ack; ours follows on its
    // disconnect, or after the linger time.
    deadline_ = Clock::now() + core_->options.linger_timeout;
  }
  if (closed_ || !started_ || next_recv_seq_ < remote_end_->count) return;
  if (remote_end_->type == AmType::kGoodbye) {
    CloseLocal(Status::Ok(),
               Status::Unavailable("peer " + peer_ +
                                   " closed the connection before the message "
                                   "was sent"),
               Signal::kNone);
  } else {
    CloseLocal(Status::Unavailable("peer " + peer_ + " aborted the connection"),
               Status::Unavailable("peer " + peer_ +
                                   " aborted the connection before the message was sent"),
               Signal::kNone);
  }
}

void Link::OnControl(const AmHeader& header) {
  switch (header.type) {
    case AmType::kHello:
      if (state_ != State::kAccepting) return;
      state_ = State::kOpen;
      deadline_ = Clock::time_point::max();
      SendControl(AmType::kHelloAck, core_->options.max_message_bytes);
      if (!core_->stopped() && listener_ != nullptr && listener_->on_accept) {
        listener_->on_accept(std::make_unique<internal::LinkConnection<Link>>(shared_from_this()));
      }
      return;
    case AmType::kHelloAck:
      if (state_ != State::kConnecting) return;
      state_ = State::kOpen;
      deadline_ = Clock::time_point::max();
      FinishConnect(std::unique_ptr<Connection>(
          std::make_unique<internal::LinkConnection<Link>>(shared_from_this())));
      return;
    case AmType::kGoodbye:
    case AmType::kAbort:
      if (remote_end_) return;
      if (closed_) {
        // Both ends closed at once: each acknowledges the other.
        if (!ack_sent_) {
          ack_sent_ = true;
          SendControl(AmType::kCloseAck, 0);
        }
        return;
      }
      if (header.value < next_recv_seq_) {
        Fail(Status::Corrupt("from " + peer_ + ": close after " + std::to_string(header.value) +
                             " messages contradicts the messages received"),
             Signal::kAbort);
        return;
      }
      remote_end_ = RemoteEnd{header.type, header.value};
      // Rendezvous messages beyond the announced count will never be wanted.
      for (auto it = recv_.lower_bound(header.value); it != recv_.end();) {
        if (it->second.desc != nullptr) ReleaseDesc(it->second.desc);
        if (it->second.buffer) core_->pool->Release(std::move(it->second.buffer));
        it = recv_.erase(it);
      }
      Deliver();
      return;
    case AmType::kCloseAck:
      if (closed_ && we_initiated_close_) ForceCloseEp();
      return;
    case AmType::kData:
      return;
  }
}

void Link::OnEpError(ucs_status_t status) {
  if (ep_ == nullptr) return;
  const std::string why = ucs_status_string(status);
  if (state_ == State::kConnecting) {
    FinishConnect(Status::Unavailable("connecting to " + peer_ + ": " + why));
  } else if (state_ == State::kOpen && !closed_) {
    // Everything the peer announced before closing is here: its orderly close
    // stands, to be reported once the application has taken the messages.
    if (!(remote_end_ && ReceivedThrough() >= remote_end_->count)) {
      Fail(Status::Unavailable("connection to " + peer_ + " broke: " + why), Signal::kNone);
    }
  }
  ForceCloseEp();
}

void Link::OnDeadline(Clock::time_point now) {
  if (now < deadline_) return;
  deadline_ = Clock::time_point::max();
  if (state_ == State::kConnecting) {
    FinishConnect(Status::Timeout("connecting to " + peer_ + ": no answer within " +
                                  std::to_string(core_->options.connect_timeout.count()) + " ms"));
  } else if (state_ == State::kAccepting) {
    log::Warn("transport(ucx): dropping connection from " + peer_ + ": no hello in time");
  }
  ForceCloseEp();
}

void Link::ShutdownNow() {
  if (state_ == State::kConnecting) {
    FinishConnect(Status::Aborted("transport shut down"));
  } else if (state_ == State::kOpen && !closed_) {
    CloseLocal(Status::Aborted("transport shut down"),
               Status::Aborted("transport shut down before the message was sent"), Signal::kNone);
  }
  ForceCloseEp();
}

void Link::Fail(Status status, Signal signal) {
  if (state_ != State::kOpen) {
    ForceCloseEp();
    return;
  }
  CloseLocal(status, status, signal);
}

void Link::CloseLocal(Status status, Status send_status, Signal signal) {
  if (closed_) return;
  closed_ = true;
  closing_.store(true, std::memory_order_relaxed);
  close_status_ = std::move(status);
  send_abort_status_ = std::move(send_status);
  // Messages completed in order so far are handed over; from the first one still
  // in flight on, they are cut off (UCX cannot take a send back).
  std::deque<Outgoing> outs = std::move(out_);
  out_.clear();
  bool cut = false;
  for (auto& out : outs) {
    if (!out.data) continue;
    queued_bytes_.fetch_sub(out.size, std::memory_order_relaxed);
    if (!out.done || !out.status.ok()) cut = true;
    if (cut) {
      out.status = send_abort_status_;
    } else {
      ++sent_ok_;
    }
  }
  if (signal != Signal::kNone && ep_ != nullptr) {
    we_initiated_close_ = true;
    const bool orderly = signal == Signal::kGoodbye && !cut;
    SendControl(orderly ? AmType::kGoodbye : AmType::kAbort, sent_ok_);
    deadline_ = Clock::now() + core_->options.linger_timeout;
  }
  DropReceived();
  for (auto& out : outs) {
    if (out.on_sent) Invoke([&] { out.on_sent(out.status); });
  }
  core_->LinkClosed(this);
  if (started_) NotifyClosed();
}

void Link::DropReceived() {
  for (auto& [seq, incoming] : recv_) {
    if (incoming.desc != nullptr) ReleaseDesc(incoming.desc);
    if (incoming.buffer) core_->pool->Release(std::move(incoming.buffer));
  }
  recv_.clear();
}

void Link::FinishConnect(Result<std::unique_ptr<Connection>> result) {
  ConnectHandler on_done = std::move(on_connected_);
  on_connected_ = nullptr;
  if (!result.ok()) core_->LinkClosed(this);
  if (on_done && !core_->stopped()) on_done(std::move(result));
}

void Link::NotifyClosed() {
  if (close_notified_) return;
  close_notified_ = true;
  CloseHandler on_closed = std::move(on_closed_);
  on_closed_ = nullptr;
  on_message_ = nullptr;
  if (on_closed) Invoke([&] { on_closed(close_status_); });
}

void Link::ForceCloseEp() {
  if (ep_ == nullptr) return;
  ucp_ep_h ep = std::exchange(ep_, nullptr);
  deadline_ = Clock::time_point::max();
  if (!closed_ && state_ == State::kOpen && !remote_end_) {
    CloseLocal(Status::Unavailable("connection to " + peer_ + " closed"),
               Status::Unavailable("connection to " + peer_ + " closed"), Signal::kNone);
  }
  if (state_ != State::kOpen) core_->LinkClosed(this);
  auto* ctx = new RequestCtx{RequestCtx::Kind::kEpClose, core_.get()};
  ctx->ep = ep;
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = OnSendCallback;
  param.user_data = ctx;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  if (core_->Submit(ucp_ep_close_nbx(ep, &param), ctx) != UCS_INPROGRESS) core_->EpGone(ep);
  for (void* desc : dropped_descs_) ucp_am_data_release(core_->worker(), desc);
  dropped_descs_.clear();
}

void Link::ReleaseDesc(void* desc) {
  if (ep_ != nullptr) {
    dropped_descs_.push_back(desc);
  } else {
    ucp_am_data_release(core_->worker(), desc);
  }
}

// ---- Core ----

Core::Core(const UcxOptions& opts, std::unique_ptr<UcxWorker> ucx_worker)
    : options(opts), ucx_(std::move(ucx_worker)) {
  caps.backend = options.tls.empty() ? "ucx" : "ucx(" + options.tls + ")";
  caps.ordered = true;
  caps.memory_types = {MemoryType::kHost};
  caps.max_message_bytes = options.max_message_bytes;
  caps.streams_per_link = 1;
}

Core::~Core() {
  if (thread_.joinable()) {
    if (OnThread()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
}

void Core::StartThread() {
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &Core::OnAm;
  am.arg = this;
  ucp_worker_set_am_recv_handler(ucx_->worker(), &am);
  // The thread keeps the core alive: a Shutdown called from a handler cannot join.
  thread_ = std::thread([self = shared_from_this()] {
    self->thread_id_.store(std::this_thread::get_id());
    self->Loop();
  });
  thread_id_.store(thread_.get_id());
}

bool Core::Post(std::function<void()> fn) {
  {
    std::lock_guard lock(post_mu_);
    if (!accepting_posts_) return false;
    posted_.push_back(std::move(fn));
    // Under the lock: Teardown destroys the worker once it has stopped posts, and
    // the loop may reach it the moment this command is queued.
    ucx_->Wake();
  }
  return true;
}

ucs_status_t Core::Submit(ucs_status_ptr_t ptr, RequestCtx* ctx) {
  if (ptr == nullptr) {
    delete ctx;
    return UCS_OK;
  }
  if (UCS_PTR_IS_ERR(ptr)) {
    delete ctx;
    return UCS_PTR_STATUS(ptr);
  }
  // A forced ep close may run callbacks before returning its request.
  if (!ctx->completed) live_.insert(ctx);
  return UCS_INPROGRESS;
}

void Core::Completed(RequestCtx* ctx, ucs_status_t status) {
  ctx->completed = true;
  live_.erase(ctx);
  Defer([this, ctx, status] {
    std::unique_ptr<RequestCtx> owned(ctx);
    switch (ctx->kind) {
      case RequestCtx::Kind::kSend:
        ctx->link->OnSendDone(ctx->seq, status);
        break;
      case RequestCtx::Kind::kRecv:
        ctx->link->OnRecvDone(ctx->seq, std::move(ctx->buffer), status);
        break;
      case RequestCtx::Kind::kControl:
        break;
      case RequestCtx::Kind::kEpClose:
        EpGone(ctx->ep);
        break;
    }
  });
}

void Core::Register(const std::shared_ptr<Link>& link, ucp_ep_h ep) {
  link->SetEp(ep);
  eps_[ep] = link;
  open_links_[link.get()] = link;
}

void Core::LinkClosed(const Link* link) { open_links_.erase(link); }

ucs_status_t Core::OnAm(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  auto* core = static_cast<Core*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
  auto it = core->eps_.find(param->reply_ep);
  if (it == core->eps_.end()) return UCS_OK;  // an endpoint we already closed
  std::shared_ptr<Link> link = it->second;
  const auto decoded = DecodeAmHeader(header, header_length);
  if (!decoded) {
    core->Defer([link] { link->OnEpError(UCS_ERR_INVALID_PARAM); });
    return UCS_OK;
  }
  if (decoded->type == AmType::kData) {
    return link->OnDataArrived(*decoded, data, length,
                               (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0);
  }
  core->Defer([link, h = *decoded] { link->OnControl(h); });
  return UCS_OK;
}

void Core::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* core = static_cast<Core*>(arg);
  core->Defer([core, ep, status] {
    auto it = core->eps_.find(ep);
    if (it != core->eps_.end()) {
      std::shared_ptr<Link> link = it->second;
      link->OnEpError(status);
    }
  });
}

void Core::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* listener = static_cast<ListenerState*>(arg);
  listener->core->Defer(
      [core = listener->core, listener, request] { core->Accept(listener, request); });
}

void Core::Accept(ListenerState* listener, ucp_conn_request_h request) {
  if (shutting_down_) {
    ucp_listener_reject(listener->handle, request);
    return;
  }
  std::string peer = "unknown";
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) == UCS_OK) {
    peer = SockaddrString(reinterpret_cast<const sockaddr*>(&attr.client_address),
                          SockaddrLength(attr.client_address));
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Core::OnEpError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(worker(), &params, &ep);
  if (status != UCS_OK) {
    log::Warn("transport(ucx): accepting a connection from " + peer + ": " +
              ucs_status_string(status));
    return;
  }
  auto link = std::make_shared<Link>(shared_from_this(), peer, Link::State::kAccepting);
  link->SetListener(listener);
  link->SetDeadline(Clock::now() + options.connect_timeout);
  Register(link, ep);
}

Result<std::string> Core::Listen(const std::string& address, AcceptHandler on_accept) {
  if (closing_) return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  if (OnThread()) return DoListen(address, std::move(on_accept));
  auto promise = std::make_shared<std::promise<Result<std::string>>>();
  auto future = promise->get_future();
  if (!Post([self = shared_from_this(), promise, address,
             on_accept = std::move(on_accept)]() mutable {
        promise->set_value(self->DoListen(address, std::move(on_accept)));
      })) {
    return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  }
  try {
    return future.get();
  } catch (const std::future_error&) {  // the loop ended before running it
    return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  }
}

Result<std::string> Core::DoListen(const std::string& address, AcceptHandler on_accept) {
  if (shutting_down_) {
    return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  }
  ASSIGN_OR_RETURN(AddrInfo info, Resolve(address, /*passive=*/true));
  auto listener = std::make_unique<ListenerState>();
  listener->core = this;
  listener->on_accept = std::move(on_accept);
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = info->ai_addr;
  params.sockaddr.addrlen = info->ai_addrlen;
  params.conn_handler.cb = &Core::OnConnRequest;
  params.conn_handler.arg = listener.get();
  const ucs_status_t status = ucp_listener_create(worker(), &params, &listener->handle);
  if (status == UCS_ERR_BUSY) {
    return Status::FailedPrecondition("listening on " + address + ": address in use");
  }
  if (status != UCS_OK) {
    return Status::Unavailable("listening on " + address + ": " + ucs_status_string(status));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(listener->handle, &attr) != UCS_OK) {
    ucp_listener_destroy(listener->handle);
    return Status::Internal("listening on " + address + ": cannot query the bound address");
  }
  listeners_.push_back(std::move(listener));
  return SockaddrString(reinterpret_cast<const sockaddr*>(&attr.sockaddr),
                        SockaddrLength(attr.sockaddr));
}

void Core::Connect(const std::string& address, ConnectHandler on_done) {
  Post([self = shared_from_this(), address, on_done = std::move(on_done)]() mutable {
    self->DoConnect(address, std::move(on_done));
  });
}

void Core::DoConnect(const std::string& address, ConnectHandler on_done) {
  if (shutting_down_) {
    if (!stopped()) on_done(Status::Aborted("transport shut down"));
    return;
  }
  auto info = Resolve(address, /*passive=*/false);
  if (!info.ok()) {
    on_done(info.status());
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = (*info)->ai_addr;
  params.sockaddr.addrlen = (*info)->ai_addrlen;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Core::OnEpError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(worker(), &params, &ep);
  if (status != UCS_OK) {
    on_done(Status::Unavailable("connecting to " + address + ": " + ucs_status_string(status)));
    return;
  }
  auto link = std::make_shared<Link>(shared_from_this(), address, Link::State::kConnecting);
  link->SetConnectHandler(std::move(on_done));
  link->SetDeadline(Clock::now() + options.connect_timeout);
  Register(link, ep);
  link->SendControl(AmType::kHello, options.max_message_bytes);
}

bool Core::RunPosted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard lock(post_mu_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
  return !batch.empty();
}

bool Core::RunDeferred() {
  bool ran = false;
  while (!deferred_.empty()) {
    auto fn = std::move(deferred_.front());
    deferred_.pop_front();
    fn();
    ran = true;
  }
  return ran;
}

bool Core::HasDeadlines() const {
  return std::any_of(eps_.begin(), eps_.end(),
                     [](const auto& entry) { return entry.second->has_deadline(); });
}

void Core::CheckDeadlines(Clock::time_point now) {
  std::vector<std::shared_ptr<Link>> links;
  for (auto& [ep, link] : eps_) {
    if (link->has_deadline()) links.push_back(link);
  }
  for (auto& link : links) link->OnDeadline(now);
}

void Core::Loop() {
  Clock::time_point last_event = Clock::now();
  Clock::time_point next_deadline_check = last_event + kDeadlineCheckPeriod;
  for (;;) {
    bool busy = RunPosted();
    for (int rounds = 0; rounds < 64 && ucp_worker_progress(worker()) != 0; ++rounds) busy = true;
    busy = RunDeferred() || busy;
    const Clock::time_point now = Clock::now();
    if (now >= next_deadline_check) {
      CheckDeadlines(now);
      RunDeferred();
      next_deadline_check = now + kDeadlineCheckPeriod;
    }
    if (shutting_down_ && (eps_.empty() || now >= shutdown_deadline_)) break;
    if (busy) {
      last_event = now;
      continue;
    }
    if (now - last_event < options.spin) continue;
    // Idle: block on the worker's fd. Deadlines are checked every few ms.
    const bool timed = shutting_down_ || HasDeadlines();
    ucx_->Wait(timed ? static_cast<int>(kDeadlineCheckPeriod.count()) : -1);
    last_event = Clock::now();
  }
  Teardown();
}

void Core::BeginShutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  shutdown_deadline_ = Clock::now() + kShutdownGrace;
  for (auto& listener : listeners_) ucp_listener_destroy(listener->handle);
  listeners_.clear();
  std::vector<std::shared_ptr<Link>> links;
  for (auto& [raw, link] : open_links_) links.push_back(link);
  for (auto& [ep, link] : eps_) links.push_back(link);
  for (auto& link : links) link->ShutdownNow();
  RunDeferred();
}

void Core::Teardown() {
  {
    std::lock_guard lock(post_mu_);
    accepting_posts_ = false;
  }
  stopped_.store(true, std::memory_order_release);
  RunDeferred();  // releases what completions hold; user handlers are silenced
  deferred_.clear();
  posted_.clear();
  ucx_.reset();  // destroys the worker and the context
  for (RequestCtx* ctx : live_) delete ctx;
  live_.clear();
  eps_.clear();
  open_links_.clear();
}

void Core::Shutdown() {
  std::lock_guard shutdown_lock(shutdown_mu_);
  if (shut_down_) return;
  closing_.store(true);
  Post([self = shared_from_this()] { self->BeginShutdown(); });
  if (OnThread()) return;  // from a handler: everything closes, nobody waits
  if (thread_.joinable()) thread_.join();
  stopped_.store(true, std::memory_order_release);
  shut_down_ = true;
}

using UcxTransport = internal::CoreTransport<Core>;

}  // namespace

Result<std::string> UcxTlsValue(const std::string& tls) {
  // UCX 1.13 sets client-server links up through its TCP connection manager, and
  // the endpoint's wireup lane must be a network transport: with "sm" alone the
  // connect fails (unreachable). With "sm,tcp" the AM lanes are shared memory and
  // tcp only carries wireup (and would carry emulated RMA, which we do not use).
  if (tls == "shm") return std::string("sm,tcp");
  for (char c : tls) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == ',' || c == '^';
    if (!ok) return Status::InvalidArgument("ucx transport: bad tls \"" + tls + "\"");
  }
  return tls;
}

Result<std::unique_ptr<Transport>> MakeUcxTransport(const UcxOptions& options) {
  if (options.max_message_bytes == 0) {
    return Status::InvalidArgument("ucx transport: max_message_bytes must be positive");
  }
  if (options.connect_timeout.count() <= 0 || options.linger_timeout.count() <= 0) {
    return Status::InvalidArgument(
        "ucx transport: connect_timeout and linger_timeout must be "
        "positive");
  }
  if (options.spin.count() < 0) {
    return Status::InvalidArgument("ucx transport: spin must not be negative");
  }
  ASSIGN_OR_RETURN(std::string tls, UcxTlsValue(options.tls));
  UcxWorkerConfig config{tls, options.net_devices, {}};
  if (options.tls == "shm") {
    // Rendezvous data as active-message fragments over the shared-memory AM lane,
    // not as put/get emulated over the tcp lane.
    config.settings.emplace_back("RNDV_SCHEME", "am");
  }
  ASSIGN_OR_RETURN(auto ucx_worker, UcxWorker::Create(config));
  static std::once_flag logged;
  std::call_once(logged, [&] {
    log::Info(ucx_worker->supports_cuda_memory()
                  ? "transport(ucx): this UCX build supports CUDA memory, but the backend moves "
                    "host memory only"
                  : "transport(ucx): CUDA device memory is not supported by this UCX build; "
                    "host memory only");
  });
  auto core = std::make_shared<Core>(options, std::move(ucx_worker));
  core->StartThread();
  return std::unique_ptr<Transport>(std::make_unique<UcxTransport>(std::move(core)));
}

}  // namespace deltacast::transport
