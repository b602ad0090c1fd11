#include "relay/tree/parent_link.h"

#include <fmt/core.h>

#include <algorithm>

#include "common/log.h"
#include "relay/wire/internal/peer_identity.h"
#include "transport/arrival.h"
#include "transport/transport_set.h"

namespace deltacast::relay {

ParentLink::ParentLink(EventLoop& loop, const topology::ClusterConfig& config,
                       const topology::PlannedNode& self, std::string token,
                       transport::Transport& transport, Events events)
    : loop_(loop),
      config_(config),
      self_(self),
      token_(std::move(token)),
      transport_(transport),
      events_(std::move(events)),
      current_(*self.parent),
      address_(AddressOf(current_)) {}

std::string ParentLink::AddressOf(const std::string& id) const {
  const auto* node = config_.FindNode(id);
  return node->host + ":" + std::to_string(node->port);
}

const std::vector<std::string>& ParentLink::HopTransports() const {
  return on_failover() ? self_.failover_transports : self_.transports;
}

void ParentLink::Close() {
  if (link_) link_->Close();
  link_.reset();
  joined_ = false;
}

ParentLink::~ParentLink() { Close(); }

// Which parent to dial next: the planned one, or (after it has been unreachable
// for kFailoverAfter) the failover parent from the plan; back to the planned one
// when the failover parent is unreachable too.
void ParentLink::ChooseParent(Clock::time_point now) {
  // With commit policy `available`; under `all` a dead relay fails the refit anyway,
  // and a relay that comes back must find its children at home. A sender holds no
  // weights: its death fails nothing, so its children fail over under `all` too (to
  // the source that feeds it, which replays them its stripe).
  const topology::NodeConfig* planned = config_.FindNode(*self_.parent);
  const bool sender = planned && planned->role == topology::Role::kSender;
  if (!self_.failover_parent ||
      (config_.tree.commit_policy != topology::CommitPolicy::kAvailable && !sender)) {
    return;
  }
  if (!on_failover() && lost_at_ && now - *lost_at_ > kFailoverAfter) {
    current_ = *self_.failover_parent;
    next_primary_try_ = now + std::chrono::seconds(10);  // stay a while before trying home
    log::Warn(fmt::format("{}: parent {} unreachable; failing over to {}", self_.id, *self_.parent,
                          current_));
  } else if (on_failover() && lost_at_ && now - *lost_at_ > 2 * kFailoverAfter) {
    current_ = *self_.parent;
    lost_at_ = now;
  }
  address_ = AddressOf(current_);
}

void ParentLink::Tick(Clock::time_point now, bool between_refits) {
  refusing_.Expire(now);
  if (link_ && joined_ && on_failover() && now >= next_primary_try_ && between_refits) {
    next_primary_try_ = now + std::chrono::seconds(10);
    log::Info(fmt::format("{}: leaving failover parent {} to rejoin {}", self_.id, current_,
                          *self_.parent));
    Drop(Status::Ok());
    current_ = *self_.parent;
    address_ = AddressOf(current_);
    lost_at_ = now;
  }
  if (!link_ && !connecting_ && now >= next_connect_) {
    ChooseParent(now);
    connecting_ = true;
    Dial();
  }
  if (now >= next_heartbeat_) {
    next_heartbeat_ = now + config_.tree.HeartbeatInterval();
    if (link_ && joined_) link_->Send(transport::MakeMessage(EncodeHeartbeat()));
  }
  if (link_ && !joined_ && now - connected_at_ > config_.limits.handshake_timeout) {
    log::Warn(fmt::format("{}: parent {} did not complete the handshake within {} ms; reconnecting",
                          self_.id, current_, config_.limits.handshake_timeout.count()));
    Drop(Status::Timeout("handshake timed out"));
  } else if (link_ && now - transport::LastHeard(*link_, last_heard_) > config_.tree.idle_timeout) {
    // Silence is no bytes at all: on a slow link one chunk may take longer than
    // idle_timeout to arrive, with the parent's heartbeats queued behind it.
    log::Warn(fmt::format("{}: parent {} silent for {} ms; reconnecting", self_.id, current_,
                          config_.tree.idle_timeout.count()));
    Drop(Status::Timeout("parent idle"));
  }
}

// Dials current_: along the hop's transports when the node has several backends
// (falling back in order), else over its one backend.
void ParentLink::Dial() {
  auto on_done = [this](Result<std::unique_ptr<transport::Connection>> r,
                        const std::string& backend) {
    auto shared = std::make_shared<Result<std::unique_ptr<transport::Connection>>>(std::move(r));
    loop_.Post([this, shared, backend] { OnConnected(std::move(*shared), backend); });
  };
  const topology::NodeConfig* parent = config_.FindNode(current_);
  const bool tls = topology::HopUsesTls(config_, *parent, *config_.FindNode(self_.id));
  if (auto* set = transport::AsTransportSet(&transport_)) {
    set->ConnectFirst(parent->host, parent->port, HopTransports(), on_done, tls);
    return;
  }
  transport_.Connect(
      (tls ? "tls://" : "") + address_,
      [on_done, backend = transport_.capabilities().backend](
          Result<std::unique_ptr<transport::Connection>> r) { on_done(std::move(r), backend); });
}

void ParentLink::OnConnected(Result<std::unique_ptr<transport::Connection>> result,
                             const std::string& backend) {
  connecting_ = false;
  if (!result.ok()) {
    // A parent that is down is expected and retried quietly; a different reason
    // (a TLS handshake refused, say) is worth a line, once.
    if (result.status().message() != last_connect_error_) {
      last_connect_error_ = result.status().message();
      // (TransportSet folds each backend's status into its message.)
      if (result.status().code() == StatusCode::kPermissionDenied ||
          last_connect_error_.find("PERMISSION_DENIED") != std::string::npos) {
        log::Error(fmt::format("{}: cannot join parent {}: {}", self_.id, current_,
                               result.status().ToString()));
        if (events_.refused) {
          events_.refused(Status::PermissionDenied("cannot join parent '" + current_ +
                                                   "': " + result.status().message()));
        }
      }
    }
    if (!lost_at_) lost_at_ = Clock::now();  // unreachable since now
    next_connect_ = Clock::now() + backoff_;
    // Short ceiling: a one-shot publisher only listens while it publishes, and its
    // children should join within a tick or two of it starting.
    backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
    return;
  }
  backoff_ = std::chrono::milliseconds(100);
  last_connect_error_.clear();
  link_ = std::move(*result);
  backend_ = backend;
  const uint64_t serial = ++serial_;
  last_heard_ = connected_at_ = Clock::now();
  challenged_ = false;
  if (Status s = CheckParentIdentity(); !s.ok()) {
    log::Error(fmt::format("{}: refusing {} as parent: {}", self_.id, address_, s.message()));
    backoff_ = std::chrono::milliseconds(2000);
    if (events_.refused) events_.refused(s.WithContext("refusing parent '" + current_ + "'"));
    return Drop(s);
  }
  link_->Start(
      [this, serial](transport::Message m) {
        loop_.Post([this, serial, m] { OnMessage(serial, m); });
      },
      [this, serial](Status s) {
        loop_.Post([this, serial, s] {
          if (serial == serial_ && link_)
            Drop(s.ok() ? Status::Unavailable("parent closed the link") : s);
        });
      });
}

void ParentLink::Drop(const Status& why) {
  const bool had_link = link_ != nullptr;
  Close();
  Lost(had_link, why);
}

void ParentLink::Lost(bool had_link, const Status& why) {
  if (!lost_at_) lost_at_ = Clock::now();
  next_connect_ = Clock::now() + backoff_;
  if (had_link && events_.lost) events_.lost(why);
}

void ParentLink::Send(std::vector<std::byte> bytes) {
  if (link_ && joined_) link_->Send(transport::MakeMessage(std::move(bytes)));
}

Status ParentLink::CheckParentIdentity() const {
  const topology::NodeConfig* me = config_.FindNode(self_.id);
  const topology::NodeConfig* parent = config_.FindNode(current_);
  return CheckDialledIdentity(link_->PeerIdentity(), current_,
                              topology::HopUsesTls(config_, *parent, *me),
                              "the hop " + current_ + " -> " + self_.id);
}

void ParentLink::ProtocolError(const std::string& what) {
  log::Error(fmt::format("{}: protocol error from parent {}: {}; closing the link", self_.id,
                         current_, log::Escape(what)));
  RefuseAndClose(what, Status::Corrupt(what));
}

void ParentLink::RefuseAndClose(const std::string& reason, const Status& why) {
  if (!link_) return;
  // Closed once the REFUSE is out, so the other end learns why (closing at once
  // would abort the queued send). Kept here until then; its other handlers are
  // ignored (the serial moves on) and it is destroyed on this thread.
  // Not forever: a parent that reads nothing is closed at the handshake timeout (Tick).
  refusing_.Refuse(std::move(link_), relay::Refuse{reason, 0},
                   Clock::now() + config_.limits.handshake_timeout);
  Close();
  Lost(/*had_link=*/true, why);
}

void ParentLink::OnMessage(uint64_t serial, const transport::Message& message) {
  if (serial != serial_ || !link_) return;
  last_heard_ = Clock::now();
  const ByteSpan bytes(*message);
  auto type = PeekType(bytes);
  if (!type.ok()) return ProtocolError(type.status().message());
  if (!joined_ && *type != MessageType::kChallenge && *type != MessageType::kWelcome &&
      *type != MessageType::kRefuse) {
    return ProtocolError(std::string(MessageTypeName(*type)) + " before the handshake finished");
  }
  switch (*type) {
    case MessageType::kChallenge: {
      auto c = ParseChallenge(bytes);
      if (!c.ok()) return ProtocolError(c.status().message());
      if (c->parent_id != current_) {
        return ProtocolError("the node at " + address_ + " is '" + c->parent_id +
                             "', not the parent I dialled, '" + current_ + "'");
      }
      if (challenged_) return ProtocolError("a second CHALLENGE on one link");
      challenged_ = true;
      parent_nonce_ = c->nonce;
      child_nonce_ = RandomNonce();
      Hello hello = events_.hello();
      hello.node_id = self_.id;
      hello.proof = ChildProof(token_, c->nonce, self_.id, c->parent_id);
      hello.nonce = child_nonce_;
      hello.transport = backend_;
      hello.transports = HopTransports();
      link_->Send(transport::MakeMessage(EncodeHello(hello)));
      return;
    }
    case MessageType::kWelcome: {
      if (joined_ || !challenged_) return ProtocolError("WELCOME out of turn");
      auto w = ParseWelcome(bytes);
      if (!w.ok()) return ProtocolError(w.status().message());
      // The parent must hold the token too: anyone can bind the parent's port while
      // it is down, and a child that followed it would apply what it sends.
      if (!ProofMatches(w->proof,
                        ParentProof(token_, parent_nonce_, child_nonce_, current_, self_.id))) {
        log::Error(fmt::format(
            "{}: the node at {} answering as parent '{}' failed authentication (its WELCOME "
            "does not prove the cluster token); refusing it",
            self_.id, address_, current_));
        backoff_ = std::chrono::milliseconds(2000);
        const Status why = Status::PermissionDenied(
            "the node at " + address_ + " answering as parent '" + current_ +
            "' failed authentication (its WELCOME does not prove the cluster token)");
        if (events_.refused) events_.refused(why);
        return RefuseAndClose("wrong token proof", why);
      }
      link_->Authenticated();
      joined_ = true;
      lost_before_join_ = lost_at_;
      lost_at_.reset();
      log::Info(fmt::format("{}: joined parent {} over {}{}{}", self_.id, current_, backend_,
                            link_->PeerIdentity().empty() ? "" : " with TLS",
                            on_failover() ? " (failover)" : ""));
      if (events_.joined) events_.joined();
      return;
    }
    case MessageType::kRefuse: {
      auto r = ParseRefuse(bytes);
      const std::string reason = log::Escape(r.ok() ? r->reason : r.status().message());
      log::Error(fmt::format("{}: parent {} refused us: {}", self_.id, current_, reason));
      backoff_ = std::chrono::milliseconds(2000);
      const Status why =
          Status::PermissionDenied("parent '" + current_ + "' refused this node: " + reason);
      if (r.ok() && r->refit_id != 0) {
        // A parent that cannot serve this refit here (it may have welcomed us first,
        // as the source does): the link was never of use, so it does not count as
        // joined for the failover's timing.
        if (joined_) lost_at_ = lost_before_join_;
        if (events_.shed) events_.shed(current_, r->refit_id);
        if (self_.failover_parent &&
            config_.tree.commit_policy == topology::CommitPolicy::kAvailable) {
          // Said outright: try the other parent of this stripe now rather than after
          // kFailoverAfter (the planned one again only after the backoff, so that two
          // parents that both refuse are not dialled in a loop).
          const std::string other = on_failover() ? *self_.parent : *self_.failover_parent;
          log::Warn(fmt::format("{}: parent {} cannot serve refit {}; trying {}", self_.id,
                                current_, r->refit_id, other));
          if (!on_failover()) {
            next_primary_try_ = Clock::now() + std::chrono::seconds(10);
            backoff_ = std::chrono::milliseconds(100);
          }
          current_ = other;
          address_ = AddressOf(current_);
          lost_at_ = Clock::now();
        }
      }
      if (events_.refused) events_.refused(why);
      return Drop(why);
    }
    case MessageType::kHeartbeat:
      return;
    default:
      if (events_.message) events_.message(*type, message);
      return;
  }
}

}  // namespace deltacast::relay
