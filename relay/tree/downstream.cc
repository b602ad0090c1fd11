#include "relay/tree/downstream.h"

#include <fmt/core.h>

#include <algorithm>

#include "common/log.h"
#include "common/runtime.h"
#include "relay/tree/stripe_links.h"
#include "relay/wire/internal/peer_identity.h"
#include "transport/transport_set.h"

namespace deltacast::relay {

std::function<bool(const std::string& child)> TlsRequiredFor(const topology::ClusterConfig& config,
                                                             const std::string& self_id) {
  // The config is copied: the predicate may outlive the caller's.
  return [config, self_id](const std::string& child) {
    const topology::NodeConfig* self = config.FindNode(self_id);
    const topology::NodeConfig* node = config.FindNode(child);
    return self && node && topology::HopUsesTls(config, *self, *node);
  };
}

Downstream::Limits Downstream::LimitsFrom(const topology::LimitsConfig& config) {
  return HandshakeLimitsFrom(config);
}

Downstream::Downstream(EventLoop& loop, std::string self_id, std::vector<std::string> children,
                       std::string token, Events events, Limits limits)
    : loop_(loop),
      self_id_(std::move(self_id)),
      token_(std::move(token)),
      events_(std::move(events)),
      limits_(limits) {
  for (auto& id : children) children_[id].stripe = StripeOfLink(id);
}

bool Downstream::Carries(const Child& child, const ChunkRef& chunk) const {
  return StripeCarries(child.stripe, stripes_, chunk.sequence, chunk.data);
}

Downstream::~Downstream() { CloseAll(); }

Result<std::string> Downstream::Listen(transport::Transport& transport,
                                       const std::string& address) {
  auto bound = transport.Listen(address, [this](std::unique_ptr<transport::Connection> c) {
    // Tasks must be copyable; the holder carries the move-only link.
    auto holder = std::make_shared<std::unique_ptr<transport::Connection>>(std::move(c));
    loop_.Post([this, holder] { Accept(std::move(*holder)); });
  });
  if (!bound.ok()) return bound.status();
  if (auto* set = transport::AsTransportSet(&transport)) {
    loop_.Post([this, names = set->Accepting()] { SetTransports(names); });
  }
  return bound;
}

void Downstream::Accept(std::unique_ptr<transport::Connection> connection) {
  // Caps first: a peer that has proved nothing gets a slot only while there is one,
  // or by taking the oldest of the most represented address's (the shared rule,
  // relay/wire/internal/handshake_limits.h): no set of addresses can keep the others out.
  const std::string host = HostOf(connection->PeerAddress());
  const HandshakeAdmission admission = AdmitHandshake(handshakes_, host, limits_, proven_);
  if (!admission.admit) {
    // One line per burst, not per connection: a flood must not fill the log.
    if (refused_over_caps_++ % 100 == 0) {
      const bool global = admission.refused_by == std::string("max_pending_handshakes");
      log::Warn(fmt::format(
          "{}: refusing {}: {} handshakes pending{} (limit {}; [limits] {}; {} refused so far)",
          self_id_, log::Escape(connection->PeerAddress()), admission.count,
          global ? "" : " from " + log::Escape(host),
          global ? limits_.max_pending : limits_.max_pending_per_address, admission.refused_by,
          refused_over_caps_));
    }
    connection->Close();
    return;
  }
  if (admission.evict) {
    auto victim = handshakes_.find(*admission.evict);
    if (evicted_over_caps_++ % 100 == 0) {
      log::Warn(fmt::format(
          "{}: {} handshakes pending (limit {}; [limits] max_pending_handshakes): dropping the "
          "oldest from {}, the most represented address, for {} ({} dropped so far)",
          self_id_, handshakes_.size(), limits_.max_pending, log::Escape(victim->second.host),
          log::Escape(connection->PeerAddress()), evicted_over_caps_));
    }
    victim->second.connection->Close();
    handshakes_.erase(victim);
  }
  const uint64_t serial = next_serial_++;
  Handshake& h = handshakes_[serial];
  h.connection = std::move(connection);
  h.host = host;
  h.deadline = RuntimeClock::now() + limits_.handshake_timeout;
  h.nonce = RandomNonce();
  h.connection->Start(
      [this, serial](transport::Message m) {
        loop_.Post([this, serial, m] { OnMessage(serial, m); });
      },
      [this, serial](Status s) { loop_.Post([this, serial, s] { OnClosed(serial, s); }); });
  h.connection->Send(transport::MakeMessage(EncodeChallenge({h.nonce, self_id_})));
}

void Downstream::Tick(std::chrono::steady_clock::time_point now) {
  refusing_.Expire(now, [&](transport::Connection& link) {
    log::Warn(fmt::format("{}: closing {}: its REFUSE was not taken within {} ms", self_id_,
                          log::Escape(link.PeerAddress()), limits_.handshake_timeout.count()));
  });
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (now < it->second.deadline) {
      ++it;
      continue;
    }
    log::Warn(fmt::format("{}: dropping {}: no valid HELLO within the handshake timeout ({} ms)",
                          self_id_, log::Escape(it->second.connection->PeerAddress()),
                          limits_.handshake_timeout.count()));
    it->second.connection->Close();
    it = handshakes_.erase(it);
  }
}

void Downstream::Refuse(std::unique_ptr<transport::Connection> connection,
                        const std::string& reason) {
  // `reason` may quote what the peer sent: escaped, it cannot forge log lines.
  log::Warn(fmt::format("{}: refusing {}: {}", self_id_, log::Escape(connection->PeerAddress()),
                        log::Escape(reason)));
  RefuseThenClose(std::move(connection), relay::Refuse{reason, 0});
}

std::string Downstream::ChildId(const Child& child) const {
  for (const auto& [id, c] : children_) {
    if (&c == &child) return id;
  }
  return {};
}

Downstream::Child* Downstream::BySerial(uint64_t serial, std::string* id) {
  for (auto& [name, child] : children_) {
    if (child.connection && child.serial == serial) {
      if (id) *id = name;
      return &child;
    }
  }
  return nullptr;
}

void Downstream::OnHello(uint64_t serial, ByteSpan message) {
  auto it = handshakes_.find(serial);
  Handshake h = std::move(it->second);
  handshakes_.erase(it);
  auto hello = ParseHello(message);
  if (!hello.ok()) {
    return Refuse(std::move(h.connection), "malformed HELLO: " + hello.status().message());
  }
  if (hello->stripes != stripes_) {
    const std::string reason = "node '" + hello->node_id + "' joins stripe " +
                               std::to_string(hello->stripe) + " of " +
                               std::to_string(hello->stripes) + ", but '" + self_id_ + "' serves " +
                               std::to_string(stripes_) + " stripes (the configs differ)";
    // Said where the reports that name absent children look.
    const std::string planned = StripeLinkKey(hello->node_id, 0);
    if (children_.contains(planned) && events_.refused) events_.refused(planned, reason);
    return Refuse(std::move(h.connection), reason);
  }
  if (shedding_ && shed_stripes_.contains(hello->stripe)) {
    // Refused until the refit ends (logged once, at Shed, not at every redial).
    return RefuseThenClose(std::move(h.connection), relay::Refuse{*shedding_, shed_refit_});
  }
  // A link is named by its node and stripe: a child joins this node once per stripe
  // whose tree makes it this node's child.
  const std::string key = StripeLinkKey(hello->node_id, hello->stripe);
  auto child = children_.find(key);
  if (child == children_.end() && adoptable_.contains(key)) {
    child = children_.emplace(key, Child{}).first;  // checked below like any other
    child->second.adopted = true;
    child->second.stripe = hello->stripe;
  }
  if (child == children_.end()) {
    return Refuse(
        std::move(h.connection),
        "node '" + hello->node_id + "' is not a child of '" + self_id_ + "' in the plan" +
            (stripes_ > 1 ? " of stripe " + std::to_string(hello->stripe) : std::string()));
  }
  auto refuse_child = [&](const std::string& reason) {
    if (child->second.adopted && !child->second.connection) children_.erase(child);
    if (events_.refused) events_.refused(key, reason);
    Refuse(std::move(h.connection), reason);
  };
  if (!ProofMatches(hello->proof, ChildProof(token_, h.nonce, hello->node_id, self_id_))) {
    return refuse_child("node '" + hello->node_id +
                        "' failed authentication (wrong cluster token)");
  }
  if (Status s = CheckIdentity(*h.connection, hello->node_id); !s.ok()) {
    return refuse_child(s.message());
  }
  if (child->second.connection) {
    return Refuse(
        std::move(h.connection),
        "node '" + hello->node_id + "' is already connected" +
            (stripes_ > 1 ? " on stripe " + std::to_string(hello->stripe) : std::string()));
  }
  if (Status s = CheckTransport(*hello); !s.ok()) return refuse_child(s.message());
  child->second.connection = std::move(h.connection);
  child->second.excused = false;
  child->second.serial = serial;
  child->second.credits = 0;
  ChunkBook& book = child->second.chunks;
  book = ChunkBook{hello->inflight_target,
                   {},
                   hello->active_version,
                   hello->inflight_target,
                   {hello->applied_chunks.begin(), hello->applied_chunks.end()},
                   hello->inflight_stream};
  for (const Pending& p : child->second.queue) {
    if (p.chunk) book.Note(*p.chunk);
  }
  proven_.Add(h.host);  // a flood from addresses that never get here cannot displace it
  child->second.connection->Authenticated();
  child->second.connection->Send(transport::MakeMessage(
      EncodeWelcome({ParentProof(token_, h.nonce, hello->nonce, self_id_, hello->node_id)})));
  log::Info(fmt::format("{}: child {} joined from {}{}{} at version {}", self_id_, key,
                        child->second.connection->PeerAddress(),
                        hello->transport.empty() ? "" : " over " + hello->transport,
                        child->second.connection->PeerIdentity().empty() ? "" : " with TLS",
                        hello->active_version.ShortHex()));
  if (events_.joined) events_.joined(key, *hello);
  Pump(child->second);
}

Status Downstream::CheckIdentity(const transport::Connection& connection,
                                 const std::string& id) const {
  return CheckJoiningIdentity(connection.PeerIdentity(), "node", id,
                              tls_required_ && tls_required_(id), "[security] tls covers this hop");
}

Status Downstream::CheckTransport(const Hello& hello) const {
  if (transports_.empty() || hello.transport.empty()) return Status::Ok();
  auto speaks = [&](const std::string& t) {
    return std::find(transports_.begin(), transports_.end(), t) != transports_.end();
  };
  std::string mine;
  for (const auto& t : transports_) mine += (mine.empty() ? "" : ", ") + t;
  if (!speaks(hello.transport)) {
    return Status::FailedPrecondition("node '" + hello.node_id + "' came over " + hello.transport +
                                      ", which '" + self_id_ + "' does not speak (it speaks " +
                                      mine + ")");
  }
  auto first = std::find_if(hello.transports.begin(), hello.transports.end(), speaks);
  if (first != hello.transports.end() && *first != hello.transport) {
    log::Warn(
        fmt::format("{}: child {} runs over {}, not over {}, which both ends list (it fell "
                    "back: see its log)",
                    self_id_, hello.node_id, hello.transport, *first));
  }
  return Status::Ok();
}

void Downstream::OnMessage(uint64_t serial, transport::Message message) {
  const ByteSpan bytes(*message);
  auto type = PeekType(bytes);
  if (auto h = handshakes_.find(serial); h != handshakes_.end()) {
    if (type.ok() && *type == MessageType::kHello) return OnHello(serial, bytes);
    std::unique_ptr<transport::Connection> link = std::move(h->second.connection);
    handshakes_.erase(h);
    if (type.ok() && *type == MessageType::kRefuse) {
      ChildRefused(*link, "", bytes);
      return link->Close();
    }
    // What was wrong, said: a peer of another protocol version learns it here.
    return Refuse(std::move(link), "expected HELLO first" +
                                       (type.ok() ? ", not " + std::string(MessageTypeName(*type))
                                                  : ": " + type.status().message()));
  }
  std::string id;
  Child* child = BySerial(serial, &id);
  if (!child) return;  // a link already dropped
  if (!type.ok()) return RefuseChild(id, "malformed message: " + type.status().message());
  switch (*type) {
    case MessageType::kCredit: {
      auto credit = ParseCredit(bytes);
      if (!credit.ok()) return RefuseChild(id, credit.status().message());
      if (credit->refit_id != refit_id_) return;  // room for another refit
      child->credits += credit->chunks;
      return Pump(*child);
    }
    case MessageType::kHeartbeat:
      return;
    case MessageType::kPrepared:
    case MessageType::kFailed:
    case MessageType::kCommitted:
    case MessageType::kAborted:
    case MessageType::kFetch:
    case MessageType::kFetchManifest:
    case MessageType::kFetchChain:
    case MessageType::kFetchDeltaChunk:
      if (events_.message) events_.message(id, *type, bytes);
      return;
    case MessageType::kRefuse: {
      // The child will not have this node as its parent (its WELCOME did not prove
      // the token): said, not answered with a REFUSE of our own.
      std::unique_ptr<transport::Connection> link = std::move(child->connection);
      const std::string why = ChildRefused(*link, id, bytes);
      link->Close();
      return Lose(id, Status::PermissionDenied(why));
    }
    default:
      return RefuseChild(id,
                         std::string(MessageTypeName(*type)) + " is not a message a child sends");
  }
}

void Downstream::RefuseChild(const std::string& id, const std::string& reason) {
  auto it = children_.find(id);
  if (it == children_.end() || !it->second.connection) return;
  std::unique_ptr<transport::Connection> link = std::move(it->second.connection);
  // Lost first (it no longer holds the link), then told why, and closed once that
  // is out.
  Lose(id, Status::Corrupt(reason));
  Refuse(std::move(link), reason);
}

std::string Downstream::ChildRefused(transport::Connection& connection, const std::string& id,
                                     ByteSpan message) {
  auto refuse = ParseRefuse(message);
  const std::string why =
      (id.empty() ? "the peer at " + connection.PeerAddress() : "child " + id) + " refused '" +
      self_id_ + "' as its parent: " + (refuse.ok() ? refuse->reason : refuse.status().message());
  log::Warn(fmt::format("{}: {}", self_id_, log::Escape(why)));
  if (!id.empty() && events_.refused) events_.refused(id, why);
  return why;
}

void Downstream::OnClosed(uint64_t serial, const Status& status) {
  if (handshakes_.erase(serial)) return;
  std::string id;
  if (BySerial(serial, &id)) Lose(id, status.ok() ? Status::Unavailable("link closed") : status);
}

void Downstream::Lose(const std::string& id, const Status& why) {
  Child& child = children_[id];
  if (child.connection) child.connection->Close();
  child.connection.reset();
  child.credits = 0;
  // Whatever the dead link still held is owed to nobody now (a rejoining child is
  // replayed from the spool), so release it rather than wait for handlers that the
  // destroyed connection will never run.
  for (auto& [send, pending] : child.in_flight) Complete(*pending);
  child.in_flight.clear();
  // What the dead link carried may not have arrived: only what is still queued
  // is sure to reach the child (its next HELLO says what it applied).
  child.chunks.carried.clear();
  for (const Pending& p : child.queue) {
    if (p.chunk) child.chunks.Note(*p.chunk);
  }
  if (child.adopted) {
    // Not ours to wait for: it goes back to its own parent or comes back here.
    DropUnsent(child);
    children_.erase(id);
    log::Info(fmt::format("{}: adopted child {} left: {}", self_id_, id, why.ToString()));
    if (events_.lost) events_.lost(id, why);
    return;
  }
  // Queued messages stay queued: the child may rejoin and must get them in order.
  // kAborted is this side shutting down: expected, not worth a warning.
  const std::string line = fmt::format("{}: lost child {}: {}", self_id_, id, why.ToString());
  why.code() == StatusCode::kAborted ? log::Debug(line) : log::Warn(line);
  if (events_.lost) events_.lost(id, why);
}

void Downstream::Complete(Pending& pending) {
  if (pending.message) queued_bytes_ -= pending.message->size();
  if (pending.fanout && --pending.fanout->remaining == 0 && pending.fanout->done)
    pending.fanout->done();
}

void Downstream::DropUnsent(Child& child) {
  while (!child.queue.empty()) {
    Pending& front = child.queue.front();
    if (front.chunk) child.chunks.Unnote(*front.chunk);
    Complete(front);
    child.queue.pop_front();
  }
}

void Downstream::NoteSent(Child& child, const transport::Message& message) {
  auto type = PeekType(ByteSpan(*message));
  if (type.ok() && *type == MessageType::kBegin) {
    auto begin = ParseBegin(ByteSpan(*message));
    child.begun = begin.ok() ? begin->refit_id : 0;
    child.end_out = false;
    return;
  }
  if (!type.ok() || (*type != MessageType::kCommit && *type != MessageType::kAbort)) return;
  auto decision = ParseDecision(ByteSpan(*message));
  if (decision.ok() && decision->target_version == child.chunks.held) {
    // What it applied no longer counts (it commits or rolls back the delta); what
    // this link carried in the refit still does: a relay that runs the decided
    // refit again (its rollback failed; a replayed BEGIN retries it) sent its END
    // down again to a child that had it and the ABORT (the simulator's --stripes
    // seeds 2843, 12919). A new refit clears it (BeginRefit).
    child.chunks.applied.clear();
    child.chunks.stream = 0;
  }
  // A COMMIT moves the child to its target: what its HELLO said it held is past.
  // Kept, it made a later refit back to that version (A -> B, then B -> A) look
  // applied already, and its data chunks were never sent down.
  if (decision.ok() && *type == MessageType::kCommit)
    child.chunks.active = decision->target_version;
}

void Downstream::Pump(Child& child) {
  while (child.connection && !child.queue.empty()) {
    Pending& front = child.queue.front();
    if (front.chunk) {
      if (child.credits <= 0) return;
      --child.credits;
    }
    Pending sent = std::move(front);
    child.queue.pop_front();
    if (!sent.message) {
      auto loaded = sent.load();
      if (!loaded.ok()) {
        log::Error(
            fmt::format("{}: cannot replay to a child: {}", self_id_, loaded.status().ToString()));
        Complete(sent);
        continue;
      }
      sent.message = *loaded;
      queued_bytes_ += sent.message->size();
    }
    // Released only when the transport is done with the bytes, so this node's
    // memory accounting covers what sits in socket queues too.
    if (!sent.chunk) NoteSent(child, sent.message);
    if (sent.chunk && !sent.chunk->data) child.end_out = true;
    auto shared = std::make_shared<Pending>(std::move(sent));
    const uint64_t send = next_send_++;
    child.in_flight[send] = shared;
    child.connection->Send(shared->message, [this, id = ChildId(child), send](Status) {
      loop_.Post([this, id, send] {
        auto it = children_.find(id);
        if (it == children_.end()) return;
        auto entry = it->second.in_flight.find(send);
        if (entry == it->second.in_flight.end()) return;  // completed by Lose
        Complete(*entry->second);
        it->second.in_flight.erase(entry);
      });
    });
  }
}

void Downstream::Broadcast(transport::Message message, std::function<void()> done) {
  // A decision goes to a connected child left out of the refit too: else it stays in
  // the refit it failed and replays it to a child that joins it (one that began the
  // next refit meanwhile went back to that one and lost what it had of the next: the
  // simulator's --stripes seed 210, once a refit with no node prepared aborted).
  auto type = PeekType(ByteSpan(*message));
  const bool decision =
      type.ok() && (*type == MessageType::kCommit || *type == MessageType::kAbort);
  auto sent_to = [&](const Child& child) {
    return !child.excused || (decision && child.connection != nullptr);
  };
  auto fanout = std::make_shared<Fanout>();
  fanout->done = std::move(done);
  for (auto& [id, child] : children_) fanout->remaining += sent_to(child) ? 1 : 0;
  if (fanout->remaining == 0) {
    if (fanout->done) fanout->done();
    return;
  }
  for (auto& [id, child] : children_) {
    if (!sent_to(child)) continue;
    queued_bytes_ += message->size();
    child.queue.push_back(Pending{message, nullptr, std::nullopt, fanout});
    Pump(child);
  }
}

void Downstream::BroadcastBegin(Begin begin) {
  std::vector<transport::Message> per_stripe;
  begin.stripes = stripes_;
  for (uint32_t s = 0; s < stripes_; ++s) {
    begin.stripe = s;
    per_stripe.push_back(transport::MakeMessage(EncodeBegin(begin)));
  }
  QueueForEach([&](const Child& child) { return per_stripe[child.stripe]; });
}

void Downstream::BroadcastActiveVersion(const Digest128& version, ByteSpan manifest) {
  const auto full = transport::MakeMessage(EncodeActiveVersion(version, manifest));
  const auto bare = transport::MakeMessage(EncodeActiveVersion(version, {}));
  QueueForEach([&](const Child& child) { return child.chunks.active == version ? bare : full; });
}

void Downstream::QueueForEach(const std::function<transport::Message(const Child&)>& message_for) {
  for (auto& [id, child] : children_) {
    if (child.excused) continue;
    transport::Message message = message_for(child);
    queued_bytes_ += message->size();
    child.queue.push_back(Pending{std::move(message), nullptr, std::nullopt, nullptr});
    Pump(child);
  }
}

void Downstream::Requeue(const std::string& id, std::vector<Outgoing> backlog) {
  auto it = children_.find(id);
  if (it == children_.end()) return;
  Child& child = it->second;
  DropUnsent(child);
  for (auto& out : backlog) {
    if (out.chunk && !Carries(child, *out.chunk)) continue;  // another stripe's
    if (out.message) queued_bytes_ += out.message->size();
    if (out.chunk) child.chunks.Note(*out.chunk);
    child.queue.push_back(Pending{std::move(out.message), std::move(out.load), out.chunk, nullptr});
  }
  Pump(child);
}

void Downstream::QueueHeld(const std::vector<Outgoing>& held) {
  for (auto& [id, child] : children_) {
    if (!child.connection || child.excused) continue;
    for (const Outgoing& out : held) {
      if (!out.chunk || !Carries(child, *out.chunk) || child.chunks.Has(*out.chunk, stream_id_))
        continue;
      child.chunks.Note(*out.chunk);
      child.queue.push_back(Pending{out.message, out.load, out.chunk, nullptr});
      if (out.message) queued_bytes_ += out.message->size();
    }
    Pump(child);
  }
}

void Downstream::Excuse(const std::string& id) {
  auto it = children_.find(id);
  if (it == children_.end()) return;
  it->second.excused = true;
  DropUnsent(it->second);
}

void Downstream::SendTo(const std::string& id, transport::Message message) {
  auto it = children_.find(id);
  if (it == children_.end() || !it->second.connection) return;
  NoteSent(it->second, message);
  it->second.connection->Send(std::move(message));
}

void Downstream::BroadcastChunk(transport::Message message, const ChunkRef& chunk,
                                std::function<void()> done, std::optional<uint32_t> stripe) {
  auto fanout = std::make_shared<Fanout>();
  fanout->done = std::move(done);
  std::vector<Child*> to;
  for (auto& [id, child] : children_) {
    if (child.excused || (stripe && child.stripe != *stripe) || !Carries(child, chunk) ||
        child.chunks.Has(chunk, stream_id_)) {
      continue;
    }
    to.push_back(&child);
  }
  fanout->remaining = to.size();
  if (to.empty()) {
    if (fanout->done) fanout->done();
    return;
  }
  for (Child* child : to) {
    queued_bytes_ += message->size();
    child->chunks.Note(chunk);
    child->queue.push_back(Pending{message, nullptr, chunk, fanout});
    Pump(*child);
  }
}

void Downstream::BeginRefit(uint64_t refit_id, uint64_t stream_id) {
  // What is still queued belongs to an earlier refit (a replay a child has not
  // finished): it would wait forever for credit that now counts for this one.
  // The child catches up from the new BEGIN instead.
  if (refit_id != refit_id_) {
    DropQueued();
    // A child excused from the last refit while connected (it failed there) takes
    // part in this one; an absent one is excused again if it stays away.
    for (auto& [id, child] : children_) {
      if (child.connection) child.excused = false;
      // What a link carried belongs to its refit: a new refit of the same delta
      // sends again what the child may need in it (its END at least, which
      // prepares it; data chunks it journaled it skips by itself).
      child.chunks.carried.clear();
      // A child grants each refit's window once per link: a new refit starts from
      // none. The same refit begun again here (a relay that began it, failed its
      // catch-up, and began it once more) keeps what its children granted; set to
      // none, it sent a child nothing more, and the refit waited its commit timeout
      // (the simulator's --stripes seed 20749).
      child.credits = 0;
    }
  }
  refit_id_ = refit_id;
  stream_id_ = stream_id;
}

void Downstream::DropQueued() {
  for (auto& [id, child] : children_) DropUnsent(child);
}

bool Downstream::IsAdopted(const std::string& id) const {
  auto it = children_.find(id);
  return it != children_.end() && it->second.adopted;
}

size_t Downstream::expected() const {
  size_t n = 0;
  for (const auto& [id, child] : children_) n += child.adopted ? 0 : 1;
  return n;
}

bool Downstream::AllConnected() const {
  for (const auto& [id, child] : children_) {
    if (!child.connection) return false;
  }
  return true;
}

bool Downstream::AllConnected(uint32_t stripe) const {
  for (const auto& [id, child] : children_) {
    if (child.stripe == stripe && !child.connection) return false;
  }
  return true;
}

std::vector<std::string> Downstream::Missing() const {
  std::vector<std::string> out;
  for (const auto& [id, child] : children_) {
    if (!child.connection) out.push_back(id);
  }
  return out;
}

void Downstream::Heartbeat() {
  auto beat = transport::MakeMessage(EncodeHeartbeat());
  for (auto& [id, child] : children_) {
    if (child.connection) child.connection->Send(beat);
  }
}

void Downstream::Shed(std::optional<std::string> reason, std::set<uint32_t> stripes,
                      uint64_t refit_id) {
  shedding_ = std::move(reason);
  shed_stripes_ = shedding_ ? std::move(stripes) : std::set<uint32_t>{};
  shed_refit_ = shedding_ ? refit_id : 0;
  std::vector<std::string> shed;
  for (const auto& [id, child] : children_) {
    if (child.connection && shed_stripes_.contains(StripeOfLink(id))) shed.push_back(id);
  }
  for (const auto& id : shed) {
    auto it = children_.find(id);
    if (it == children_.end() || !it->second.connection) continue;
    log::Warn(fmt::format("{}: refusing child {}: {}", self_id_, id, *shedding_));
    std::unique_ptr<transport::Connection> link = std::move(it->second.connection);
    Lose(id, Status::Unavailable(*shedding_));
    RefuseThenClose(std::move(link), relay::Refuse{*shedding_, shed_refit_});
  }
}

void Downstream::RefuseForRefit(const std::string& id, const std::string& reason,
                                uint64_t refit_id) {
  auto it = children_.find(id);
  if (it == children_.end() || !it->second.connection) return;
  std::unique_ptr<transport::Connection> link = std::move(it->second.connection);
  Lose(id, Status::Unavailable(reason));
  RefuseThenClose(std::move(link), relay::Refuse{reason, refit_id});
}

void Downstream::RefuseLinksMidRefit(uint64_t refit_id, const std::string& reason) {
  std::vector<std::string> mid;
  for (const auto& [id, child] : children_) {
    if (child.connection && child.begun == refit_id && !child.end_out) mid.push_back(id);
  }
  for (const auto& id : mid) {
    log::Warn(fmt::format("{}: refusing child {}: {}", self_id_, id, reason));
    RefuseForRefit(id, reason, refit_id);
  }
}

void Downstream::RefuseThenClose(std::unique_ptr<transport::Connection> connection,
                                 const relay::Refuse& refuse) {
  // Not forever: a peer that reads nothing (or a link whose queue is full of chunks
  // it does not take) is closed at the handshake timeout, REFUSE out or not (Tick).
  refusing_.Refuse(std::move(connection), refuse, RuntimeClock::now() + limits_.handshake_timeout);
}

void Downstream::CloseAll() {
  for (auto& [id, child] : children_) {
    if (child.connection) child.connection->Close();
    child.connection.reset();
  }
  for (auto& [serial, h] : handshakes_) h.connection->Close();
  handshakes_.clear();
  refusing_.CloseAll();
}

}  // namespace deltacast::relay
