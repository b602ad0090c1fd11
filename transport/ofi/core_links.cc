// The per-link state machine: sending (announce, CTS, finish), receiving
// (RTS/DATA, grant, deliver) and the link lifecycle (start, close, end).
#include <rdma/fi_errno.h>

#include <cstring>

#include "transport/ofi/core.h"

namespace deltacast::transport::ofi {

// ---------------------------------------------------------------------------
// Links: sending.

void Core::SendOnLink(const std::shared_ptr<Link>& link, Message message, SendHandler on_sent,
                      Status precheck) {
  if (link->ended) {
    if (precheck.ok()) link->queued_bytes -= message->size();
    // on_closed already ran (or, not started, never will before this): fail now.
    if (on_sent) RunHandler(*link, [&] { on_sent(precheck.ok() ? link->late_status : precheck); });
    return;
  }
  PendingSend send;
  send.seq = link->next_send_seq++;
  send.on_sent = std::move(on_sent);
  if (!precheck.ok()) {
    send.done = true;
    send.status = std::move(precheck);
    send.announced = false;
    --link->next_send_seq;  // an invalid send is not a message: it takes no seq
    send.seq = UINT64_MAX;
  } else {
    send.bytes = message->size();
    send.message = std::move(message);
  }
  link->sends.push_back(std::move(send));
  FinishSends(*link);
  Announce(*link);
}

void Core::Announce(Link& link) {
  for (PendingSend& send : link.sends) {
    if (link.unanswered >= kMaxAnnouncedPerLink) return;
    if (send.announced || send.done) continue;
    send.announced = true;
    ++link.unanswered;
    if (send.bytes > kInlineBytes) {
      SendControl(link, ControlType::kRts, send.seq, send.bytes);
      // A post that fails at once ends the link inside Submit, and EndLink takes
      // link.sends (this loop's deque) and destroys it: stop iterating.
      if (link.ended) return;
      continue;
    }
    // Small: the bytes go along; on_sent runs when this send completes.
    Op* op = new Op();
    op->kind = OpKind::kControlSend;
    op->endpoint = link.endpoint;
    op->peer = link.peer;
    op->link_id = link.id;
    op->seq = send.seq;
    op->message = send.message;
    FillControl(op,
                EncodeControl({ControlType::kData, link.remote_id, link.id, send.seq, send.bytes},
                              *send.message));
    link.last_said = Clock::now();
    Submit(op);
    if (link.ended) return;  // as above
  }
}

void Core::OnCts(Link& link, uint64_t seq) {
  if (link.unanswered > 0) --link.unanswered;
  for (PendingSend& send : link.sends) {
    if (send.seq != seq || send.done || !send.announced) continue;
    if (send.bytes <= kInlineBytes) break;  // went inline: the CTS only frees the window
    Op* op = new Op();
    op->kind = OpKind::kDataSend;
    op->endpoint = link.endpoint;
    op->peer = link.peer;
    op->link_id = link.id;
    op->seq = seq;
    op->tag = DataTag(link.remote_id, seq);
    op->message = send.message;
    AttachSendRegistration(op);
    Submit(op);
    return;
  }
  Announce(link);
}

void Core::FinishSends(Link& link) {
  while (!link.sends.empty() && link.sends.front().done && !link.ended) {
    PendingSend send = std::move(link.sends.front());
    link.sends.pop_front();
    link.queued_bytes -= send.bytes;
    if (send.status.ok()) ++link.sent_ok;
    if (send.on_sent) RunHandler(link, [&] { send.on_sent(send.status); });
  }
  Announce(link);
}

// ---------------------------------------------------------------------------
// Links: receiving.

void Core::OnRts(Link& link, uint64_t seq, uint64_t size,
                 std::optional<std::span<const std::byte>> inline_bytes) {
  if (size > options_.max_message_bytes) {
    return EndLink(link,
                   Status::Corrupt("peer announced a message of " + std::to_string(size) +
                                   " bytes, above max_message_bytes " +
                                   std::to_string(options_.max_message_bytes)),
                   Status::Unavailable("link closed: peer sent an oversized message"),
                   ControlType::kAbort);
  }
  if (seq < link.next_grant || seq - link.next_grant > kMaxSeqAhead || link.incoming.count(seq)) {
    return EndLink(
        link, Status::Corrupt("peer announced message " + std::to_string(seq) + " out of sequence"),
        Status::Unavailable("link closed: protocol error"), ControlType::kAbort);
  }
  if (inline_bytes && inline_bytes->size() != size) {
    return EndLink(link,
                   Status::Corrupt("inline message " + std::to_string(seq) + " carries " +
                                   std::to_string(inline_bytes->size()) + " bytes, announced " +
                                   std::to_string(size)),
                   Status::Unavailable("link closed: protocol error"), ControlType::kAbort);
  }
  Incoming& in = link.incoming[seq];
  in.size = size;
  link.announced_by_peer = std::max(link.announced_by_peer, seq + 1);
  if (inline_bytes) {
    in.complete = true;
    in.bytes = pool_->Acquire(size);
    // An empty message has no data pointer; memcpy must not see null (UBSan).
    if (size > 0) std::memcpy(in.bytes.bytes->data(), inline_bytes->data(), size);
  }
  Grant(link);
  Deliver(link);
}

void Core::Grant(Link& link) {
  if (!link.started || link.ended) return;
  bool completed_now = false;
  while (true) {
    // After the peer's GOODBYE/ABORT only messages it sent OK will come.
    if (link.peer_ended && link.next_grant >= link.peer_count) break;
    auto it = link.incoming.find(link.next_grant);
    if (it == link.incoming.end()) break;
    Incoming& in = it->second;
    if (link.granted_bytes > 0 && link.granted_bytes + in.size > kGrantBudgetBytes) break;
    // A peer that has proved nothing gets no buffer for a large message: it keeps
    // the bytes until the application authenticates it.
    if (!link.authenticated && !in.complete && options_.handshake_max_message_bytes > 0 &&
        in.size > options_.handshake_max_message_bytes) {
      break;
    }
    in.granted = true;
    link.granted_bytes += in.size;
    if (in.complete) {
      completed_now = true;  // inline: nothing to receive, just answer
    } else if (in.size == 0) {
      in.complete = true;
      completed_now = true;
      in.bytes.bytes = std::make_unique<std::vector<std::byte>>();
    } else {
      PooledBuffer buffer;
      if (register_) {
        auto registered = pool_->AcquireRegistered(in.size);
        if (!registered.ok() && mr_required_) {
          return EndLink(link,
                         Status::ResourceExhausted("registering a receive buffer: " +
                                                   registered.status().message()),
                         Status::Unavailable("link broke: out of registered memory"),
                         ControlType::kAbort);
        }
        if (registered.ok()) buffer = std::move(registered).value();
      }
      if (!buffer.bytes) buffer = pool_->Acquire(in.size);
      Op* op = new Op();
      op->kind = OpKind::kDataRecv;
      op->endpoint = link.endpoint;
      op->peer = link.peer;
      op->link_id = link.id;
      op->seq = link.next_grant;
      op->tag = DataTag(link.id, link.next_grant);
      op->receive = std::move(buffer);
      op->desc = op->receive.mr.desc();
      in.op = op;
      Submit(op);  // the receive is posted before the CTS leaves
      // A post that fails at once ends the link (EndLink clears link.incoming,
      // `in` included): no CTS then.
      if (link.ended) return;
    }
    // After GOODBYE/ABORT only inline messages are granted here: nobody waits.
    if (!link.peer_ended) SendControl(link, ControlType::kCts, link.next_grant);
    ++link.next_grant;
  }
  if (completed_now) Deliver(link);
}

void Core::Deliver(Link& link) {
  if (!link.started) return;
  while (!link.ended) {
    auto it = link.incoming.begin();
    if (it == link.incoming.end() || it->first != link.next_deliver || !it->second.complete ||
        !it->second.granted) {
      break;
    }
    Message message = pool_->Wrap(std::move(it->second.bytes));
    link.granted_bytes -= it->second.size;
    link.incoming.erase(it);
    ++link.next_deliver;
    if (link.peer_ended && link.next_deliver > link.peer_count) continue;  // not sent OK: drop
    RunHandler(link, [&] {
      if (link.on_message) link.on_message(std::move(message));
    });
  }
  MaybeEndAfterPeer(link);
  Grant(link);
}

void Core::MaybeEndAfterPeer(Link& link) {
  if (!link.peer_ended || link.ended || link.next_deliver < link.peer_count) return;
  const bool orderly = link.peer_status.ok();
  EndLink(link, link.peer_status,
          Status::Unavailable(orderly ? "peer closed the link" : link.peer_status.message()),
          std::nullopt);
}

// ---------------------------------------------------------------------------
// Links: lifecycle.

void Core::StartLink(const std::shared_ptr<Link>& link, MessageHandler on_message,
                     CloseHandler on_closed) {
  if (link->started) return;
  link->started = true;
  link->on_message = std::move(on_message);
  link->on_closed = std::move(on_closed);
  if (link->ended) return ReportClose(*link);
  Grant(*link);
}

void Core::AuthenticateLink(const std::shared_ptr<Link>& link) {
  link->authenticated = true;
  Grant(*link);
}

void Core::CloseLink(const std::shared_ptr<Link>& link, bool abort) {
  if (link->ended) return;
  if (abort) {
    EndLink(*link, Status::Aborted("connection aborted"), Status::Aborted("connection aborted"),
            ControlType::kAbort);
  } else {
    EndLink(*link, Status::Ok(), Status::Aborted("connection closed"), ControlType::kGoodbye);
  }
}

void Core::EndLink(Link& link, Status final_status, Status send_status,
                   std::optional<ControlType> notify) {
  if (link.ended) return;
  link.ended = true;
  link.final_status = std::move(final_status);
  link.late_status = send_status;
  if (notify) SendControl(link, *notify, 0, link.sent_ok);
  // Receives still posted would fill buffers nobody reads: cancel them (their ops
  // complete with FI_ECANCELED and are freed then).
  for (auto& [seq, in] : link.incoming) {
    if (in.op) {
      in.op->link_id = 0;
      fi_cancel(&link.endpoint->endpoint->ep()->fid, in.op);
    }
  }
  link.incoming.clear();
  // Sends in flight keep their bytes alive in their ops; they no longer count.
  for (Op* op : ops_) {
    if (op->link_id == link.id) op->link_id = 0;
  }
  std::deque<PendingSend> sends = std::move(link.sends);
  link.sends.clear();
  for (PendingSend& send : sends) {
    link.queued_bytes -= send.bytes;
    Status status = send.done ? send.status : send_status;
    if (send.on_sent) RunHandler(link, [&] { send.on_sent(status); });
  }
  auto keep = links_.find(link.id);
  std::shared_ptr<Link> hold;
  if (keep != links_.end()) {
    hold = keep->second;
    links_.erase(keep);
  }
  if (link.started) ReportClose(link);
}

void Core::ReportClose(Link& link) {
  if (link.close_reported) return;
  link.close_reported = true;
  RunHandler(link, [&] {
    if (link.on_closed) link.on_closed(link.final_status);
  });
  std::vector<SendHandler> late = std::move(link.late_sends);
  for (auto& on_sent : late) RunHandler(link, [&] { on_sent(link.late_status); });
}

uint32_t Core::NewId() {
  uint32_t id = next_id_++;
  if (id == 0) id = next_id_++;
  return id;
}

}  // namespace deltacast::transport::ofi
