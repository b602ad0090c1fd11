#include "relay/producers/producer_hub.h"

#include <fmt/core.h>

#include <algorithm>
#include <vector>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "relay/wire/internal/peer_identity.h"

namespace deltacast::relay {

ProducerHub::ProducerHub(std::string root_id, std::string token, size_t capacity,
                         HandshakeLimits limits)
    : root_id_(std::move(root_id)),
      token_(std::move(token)),
      capacity_(capacity),
      limits_{limits.handshake_timeout, limits.max_pending,
              std::max(limits.max_pending_per_address, capacity)} {
  // Started here, not in the initializer list: it reads members declared after it.
  reaper_ = std::thread([this] { ReapLoop(); });
}

ProducerHub::~ProducerHub() { Close(); }

void ProducerHub::ReapLoop() {
  MutexLock lock(mu_);
  while (!closed_) {
    auto next = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (const auto& [serial, p] : pending_) next = std::min(next, p.deadline);
    reap_cv_.wait_until(lock, next);
    if (closed_) break;
    std::vector<std::unique_ptr<transport::Connection>> expired;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now < it->second.deadline) {
        ++it;
        continue;
      }
      log::Warn(fmt::format(
          "root {}: dropping producer link from {}: no valid HELLO within the handshake "
          "timeout ({} ms)",
          root_id_, log::Escape(it->second.connection->PeerAddress()),
          limits_.handshake_timeout.count()));
      expired.push_back(std::move(it->second.connection));
      it = pending_.erase(it);
    }
    // Outside mu_: a connection's destructor waits for its running handlers, which
    // take mu_.
    lock.Unlock();
    for (auto& c : expired) c->Close();
    expired.clear();
    lock.Lock();
  }
}

size_t ProducerHub::pending_handshakes() const {
  MutexLock lock(mu_);
  return pending_.size();
}

void ProducerHub::RequireTls(bool required) {
  MutexLock lock(mu_);
  tls_required_ = required;
}

Result<std::string> ProducerHub::Listen(transport::Transport& transport,
                                        const std::string& address) {
  auto bound = transport.Listen(
      address, [this](std::unique_ptr<transport::Connection> c) { OnAccept(std::move(c)); });
  if (!bound.ok()) return bound.status().WithContext("root cannot listen for producers");
  log::Info(fmt::format("root {} listening for producers on {}", root_id_, *bound));
  return bound;
}

void ProducerHub::OnAccept(std::unique_ptr<transport::Connection> connection) {
  std::unique_ptr<transport::Connection> doomed;  // destroyed after mu_ is released
  MutexLock lock(mu_);
  if (closed_) {
    doomed = std::move(connection);
    return;
  }
  // Caps first, as for the tree's links (relay/tree/downstream.h, the same rule): a peer
  // that has proved nothing gets a slot while there is one, or the oldest of a more
  // represented address's.
  const std::string host = HostOf(connection->PeerAddress());
  const HandshakeAdmission admission = AdmitHandshake(pending_, host, limits_, proven_);
  if (!admission.admit) {
    if (refused_over_caps_++ % 100 == 0) {  // one line per burst, not per link
      log::Warn(fmt::format(
          "root {}: refusing producer link from {}: {} handshakes pending (limits {} in all, {} "
          "per address; {} refused so far)",
          root_id_, log::Escape(connection->PeerAddress()), pending_.size(), limits_.max_pending,
          limits_.max_pending_per_address, refused_over_caps_));
    }
    connection->Close();
    doomed = std::move(connection);
    return;
  }
  if (admission.evict) {
    auto victim = pending_.find(*admission.evict);
    if (evicted_over_caps_++ % 100 == 0) {
      log::Warn(fmt::format(
          "root {}: {} producer handshakes pending (limit {}): dropping the oldest from {}, the "
          "most represented address, for {} ({} dropped so far)",
          root_id_, pending_.size(), limits_.max_pending, log::Escape(victim->second.host),
          log::Escape(connection->PeerAddress()), evicted_over_caps_));
    }
    // Closed once mu_ is released (see `doomed`): its handlers take mu_.
    doomed = std::move(victim->second.connection);
    pending_.erase(victim);
  }
  const uint64_t serial = next_serial_++;
  Pending& p = pending_[serial];
  p.connection = std::move(connection);
  p.nonce = RandomNonce();
  p.host = host;
  p.deadline = std::chrono::steady_clock::now() + limits_.handshake_timeout;
  p.connection->Start([this, serial](transport::Message m) { OnMessage(serial, std::move(m)); },
                      [this, serial](Status s) { OnClosed(serial, s); });
  p.connection->Send(transport::MakeMessage(EncodeChallenge({p.nonce, root_id_})));
  reap_cv_.notify_all();
}

void ProducerHub::Refuse(uint64_t serial, std::unique_ptr<transport::Connection> c,
                         const std::string& why) {
  // `why` may quote what the peer sent: escaped, it cannot forge log lines.
  const std::string line = fmt::format("refused the producer at {}: {}",
                                       log::Escape(c->PeerAddress()), log::Escape(why));
  log::Warn(fmt::format("root {}: {}", root_id_, line));
  // Kept for WaitFor's error: the root's caller learns why a producer is missing.
  refusals_.push_back(line);
  while (refusals_.size() > kRefusalsKept) refusals_.pop_front();
  c->Send(transport::MakeMessage(EncodeRefuse({why})), [this, serial](Status) {
    MutexLock lock(mu_);
    if (auto it = refused_.find(serial); it != refused_.end()) it->second->Close();
  });
  refused_[serial] = std::move(c);
}

void ProducerHub::OnMessage(uint64_t serial, transport::Message message) {
  // Destroyed after mu_ is released: a connection's destructor may wait for its
  // other handlers, which take mu_.
  std::unique_ptr<transport::Connection> doomed;
  MutexLock lock(mu_);
  if (closed_) return;
  if (auto it = pending_.find(serial); it != pending_.end()) {
    Pending& p = it->second;
    doomed = std::move(p.connection);
    const auto nonce = p.nonce;
    const std::string host = p.host;
    pending_.erase(it);
    auto hello = ParseHello(ByteSpan(*message));
    if (!hello.ok()) {
      return Refuse(serial, std::move(doomed), "expected HELLO: " + hello.status().message());
    }
    if (!ProofMatches(hello->proof, ChildProof(token_, nonce, hello->node_id, root_id_))) {
      return Refuse(
          serial, std::move(doomed),
          "producer '" + hello->node_id + "' failed authentication (wrong cluster token)");
    }
    if (Status s =
            CheckJoiningIdentity(doomed->PeerIdentity(), "producer", hello->node_id, tls_required_,
                                 "[security] tls covers the producers' links");
        !s.ok()) {
      return Refuse(serial, std::move(doomed), std::string(s.message()));
    }
    if (producers_.contains(hello->node_id)) {
      return Refuse(serial, std::move(doomed),
                    "producer '" + hello->node_id + "' is already joined");
    }
    if (producers_.size() >= capacity_) {
      return Refuse(
          serial, std::move(doomed),
          "the root expects " + std::to_string(capacity_) + " producers and has them all");
    }
    proven_.Add(host);  // a flood from addresses that never get here cannot displace it
    doomed->Authenticated();
    doomed->Send(transport::MakeMessage(
        EncodeWelcome({ParentProof(token_, nonce, hello->nonce, root_id_, hello->node_id)})));
    log::Info(fmt::format("root {}: producer {} joined from {}{}", root_id_, hello->node_id,
                          doomed->PeerAddress(),
                          doomed->PeerIdentity().empty() ? "" : " with TLS"));
    producers_[hello->node_id] = Link{serial, std::move(doomed)};
    cv_.notify_all();
    return;
  }
  for (auto& [id, joined] : producers_) {
    if (joined.serial != serial) continue;
    auto type = PeekType(ByteSpan(*message));
    if (type.ok() && *type == MessageType::kHeartbeat) return;
    events_.push_back({id, std::move(message), Status::Ok()});
    cv_.notify_all();
    return;
  }
}

void ProducerHub::OnClosed(uint64_t serial, const Status& status) {
  std::unique_ptr<transport::Connection> doomed;  // destroyed after mu_ is released
  MutexLock lock(mu_);
  if (auto it = pending_.find(serial); it != pending_.end()) {
    doomed = std::move(it->second.connection);
    pending_.erase(it);
    return;
  }
  if (auto it = refused_.find(serial); it != refused_.end()) {
    doomed = std::move(it->second);
    refused_.erase(it);
    return;
  }
  for (auto it = producers_.begin(); it != producers_.end(); ++it) {
    if (it->second.serial != serial) continue;
    const std::string line = fmt::format("root {}: producer {} left: {}", root_id_, it->first,
                                         status.ok() ? "closed its link" : status.ToString());
    status.ok() ? log::Info(line) : log::Warn(line);
    events_.push_back(
        {it->first, nullptr, status.ok() ? Status::Unavailable("closed the link") : status});
    doomed = std::move(it->second.connection);
    producers_.erase(it);
    cv_.notify_all();
    return;
  }
}

Status ProducerHub::WaitFor(size_t count, std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  if (cv_.wait_for(lock, timeout,
                   [&]() REQUIRES(mu_) { return closed_ || producers_.size() >= count; }) &&
      !closed_) {
    return Status::Ok();
  }
  std::string refused;
  for (const std::string& r : refusals_) refused += "; " + r;
  return Status::Unavailable(std::to_string(producers_.size()) + " of " + std::to_string(count) +
                             " producers joined within " + std::to_string(timeout.count()) + " ms" +
                             refused);
}

std::vector<std::string> ProducerHub::Joined() const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, j] : producers_) out.push_back(id);
  return out;
}

void ProducerHub::Send(const std::string& producer, std::vector<std::byte> bytes) {
  MutexLock lock(mu_);
  auto it = producers_.find(producer);
  if (it != producers_.end()) it->second.connection->Send(transport::MakeMessage(std::move(bytes)));
}

Result<ProducerHub::Event> ProducerHub::Next(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&]() REQUIRES(mu_) { return closed_ || !events_.empty(); })) {
    return Status::Timeout("no producer said anything for " + std::to_string(timeout.count()) +
                           " ms");
  }
  if (events_.empty()) return Status::Aborted("the root is stopping");
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void ProducerHub::DropEvents() {
  MutexLock lock(mu_);
  // Losses stay: they matter to the next refit too (the producer must rejoin).
  std::deque<Event> kept;
  for (auto& e : events_) {
    if (!e.message) kept.push_back(std::move(e));
  }
  events_ = std::move(kept);
}

void ProducerHub::Close() {
  std::map<uint64_t, Pending> pending;
  std::map<std::string, Link> producers;
  std::map<uint64_t, std::unique_ptr<transport::Connection>> refused;
  {
    MutexLock lock(mu_);
    closed_ = true;
    pending.swap(pending_);
    producers.swap(producers_);
    refused.swap(refused_);
    cv_.notify_all();
    reap_cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();
  // Outside mu_: a connection's destructor waits for its running handlers, which
  // take mu_.
  for (auto& [s, p] : pending) p.connection->Close();
  for (auto& [id, j] : producers) j.connection->Close();
  for (auto& [s, c] : refused) c->Close();
}

}  // namespace deltacast::relay
