// The UCX backend's Link: one logical link over a UCP endpoint (ucx_core.h).
#include <cstring>
#include <new>
#include <utility>

#include "common/log.h"
#include "transport/internal/link_connection.h"
#include "transport/ucx/ucx_core.h"

namespace deltacast::transport::ucx {
namespace {

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

}  // namespace

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

}  // namespace deltacast::transport::ucx
