#include "relay/producer_hub.h"

#include <fmt/core.h>

#include "common/log.h"

namespace deltacast::relay {

ProducerHub::ProducerHub(std::string root_id, std::string token, size_t capacity)
    : root_id_(std::move(root_id)), token_(std::move(token)), capacity_(capacity) {}

ProducerHub::~ProducerHub() { Close(); }

Result<std::string> ProducerHub::Listen(transport::Transport& transport,
                                        const std::string& address) {
  auto bound = transport.Listen(
      address, [this](std::unique_ptr<transport::Connection> c) { OnAccept(std::move(c)); });
  if (!bound.ok()) return bound.status().WithContext("root cannot listen for producers");
  log::Info(fmt::format("root {} listening for producers on {}", root_id_, *bound));
  return bound;
}

void ProducerHub::OnAccept(std::unique_ptr<transport::Connection> connection) {
  std::lock_guard lock(mu_);
  if (closed_) return;
  const uint64_t serial = next_serial_++;
  Pending& p = pending_[serial];
  p.connection = std::move(connection);
  p.nonce = RandomNonce();
  p.connection->Start([this, serial](transport::Message m) { OnMessage(serial, std::move(m)); },
                      [this, serial](Status s) { OnClosed(serial, s); });
  p.connection->Send(transport::MakeMessage(EncodeChallenge({p.nonce, root_id_})));
}

void ProducerHub::Refuse(uint64_t serial, std::unique_ptr<transport::Connection> c,
                         const std::string& why) {
  log::Warn(fmt::format("root {}: refusing producer at {}: {}", root_id_, c->PeerAddress(), why));
  c->Send(transport::MakeMessage(EncodeRefuse({why})), [this, serial](Status) {
    std::lock_guard lock(mu_);
    if (auto it = refused_.find(serial); it != refused_.end()) it->second->Close();
  });
  refused_[serial] = std::move(c);
}

void ProducerHub::OnMessage(uint64_t serial, transport::Message message) {
  // Destroyed after mu_ is released: a connection's destructor may wait for its
  // other handlers, which take mu_.
  std::unique_ptr<transport::Connection> doomed;
  std::lock_guard lock(mu_);
  if (closed_) return;
  if (auto it = pending_.find(serial); it != pending_.end()) {
    Pending& p = it->second;
    doomed = std::move(p.connection);
    const auto nonce = p.nonce;
    pending_.erase(it);
    auto hello = ParseHello(ByteSpan(*message));
    if (!hello.ok()) {
      return Refuse(serial, std::move(doomed), "expected HELLO: " + hello.status().message());
    }
    if (!ProofMatches(hello->proof, HelloProof(token_, nonce, hello->node_id, root_id_))) {
      return Refuse(
          serial, std::move(doomed),
          "producer '" + hello->node_id + "' failed authentication (wrong cluster token)");
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
    doomed->Send(transport::MakeMessage(EncodeWelcome()));
    log::Info(fmt::format("root {}: producer {} joined from {}", root_id_, hello->node_id,
                          doomed->PeerAddress()));
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
  std::lock_guard lock(mu_);
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
  std::unique_lock lock(mu_);
  if (cv_.wait_for(lock, timeout, [&] { return closed_ || producers_.size() >= count; }) &&
      !closed_) {
    return Status::Ok();
  }
  return Status::Unavailable(std::to_string(producers_.size()) + " of " + std::to_string(count) +
                             " producers joined within " + std::to_string(timeout.count()) + " ms");
}

std::vector<std::string> ProducerHub::Joined() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [id, j] : producers_) out.push_back(id);
  return out;
}

void ProducerHub::Send(const std::string& producer, std::vector<std::byte> bytes) {
  std::lock_guard lock(mu_);
  auto it = producers_.find(producer);
  if (it != producers_.end()) it->second.connection->Send(transport::MakeMessage(std::move(bytes)));
}

Result<ProducerHub::Event> ProducerHub::Next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return closed_ || !events_.empty(); })) {
    return Status::Timeout("no producer said anything for " + std::to_string(timeout.count()) +
                           " ms");
  }
  if (events_.empty()) return Status::Aborted("the root is stopping");
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void ProducerHub::DropEvents() {
  std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
    closed_ = true;
    pending.swap(pending_);
    producers.swap(producers_);
    refused.swap(refused_);
    cv_.notify_all();
  }
  // Outside mu_: a connection's destructor waits for its running handlers, which
  // take mu_.
  for (auto& [s, p] : pending) p.connection->Close();
  for (auto& [id, j] : producers) j.connection->Close();
  for (auto& [s, c] : refused) c->Close();
}

}  // namespace deltacast::relay
