// The UCX backend's two halves, shared by ucx_link.cc (one logical link: endpoint,
// send window, reorder buffer) and ucx_transport.cc (Core: the worker, its progress
// thread, listeners and endpoints). Design in ucx_transport.h.
//
// Thread safety: Core's progress thread owns every UCP object and all state marked
// "progress thread"; other threads reach it only through Core::Post. Link's public
// methods (Start/Send/Close) post; its atomics and gate are shared.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/thread_annotations.h"
#include "transport/buffer_pool.h"
#include "transport/internal/handler_gate.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_worker.h"
#include "transport/ucx/wire.h"

namespace deltacast::transport::ucx {

using Clock = std::chrono::steady_clock;

// Idle received buffers kept for reuse per transport.
inline constexpr uint64_t kPoolIdleBytes = uint64_t{512} << 20;

class Core;
class Link;

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

  Mutex post_mu_;
  std::vector<std::function<void()>> posted_ GUARDED_BY(post_mu_);
  bool accepting_posts_ GUARDED_BY(post_mu_) = true;

  Mutex shutdown_mu_;
  bool shut_down_ GUARDED_BY(shutdown_mu_) = false;

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

}  // namespace deltacast::transport::ucx
