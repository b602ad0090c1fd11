#include "sim/sim_network.h"

#include <cmath>
#include <deque>
#include <optional>

#include "relay/wire/protocol.h"

namespace deltacast::sim {

using transport::Message;
using Duration = EventQueue::Duration;
using TimePoint = EventQueue::TimePoint;

// One end of a link. The peer's end and both transports' queues are looked up when
// used: either side may be gone by then.
struct SimNetwork::End {
  SimNetwork* net = nullptr;
  std::string node, peer_node, peer_address;
  uint64_t queue = 0;  // the owning transport's handler queue
  std::weak_ptr<End> peer;
  std::shared_ptr<LinkInfo> info;  // shared by both ends
  bool open = true;
  bool started = false;
  bool handed_out = true;  // its Connection object exists: its handlers may run
  transport::MessageHandler on_message;
  transport::CloseHandler on_closed;
  std::deque<Message> inbox;                  // arrived before Start
  std::optional<Status> closed_before_start;  // ended before Start
  std::deque<Message> held;                   // arrived while the link stalled, in order
  std::optional<Status> closed_after_held;    // the peer's close, behind them
  uint64_t queued_bytes = 0;
  TimePoint tx_free{};
  TimePoint last_arrival{};  // of this end's sends at the peer
  uint64_t next_send = 0;
  std::map<uint64_t, std::pair<uint64_t, transport::SendHandler>> sending;  // id -> bytes, handler

  std::pair<std::string, std::string> key() const {
    return node < peer_node ? std::pair{node, peer_node} : std::pair{peer_node, node};
  }
  TimePoint StalledUntil() const {
    auto it = net->stalled_until().find(key());
    const TimePoint keyed = it == net->stalled_until().end() ? TimePoint{} : it->second;
    return std::max(keyed, info->stalled_until);
  }

  // Runs on this end's queue: pending sends fail, then on_closed.
  void Finish(const Status& sends, const Status& closed) {
    auto pending = std::move(sending);
    sending.clear();
    queued_bytes = 0;
    for (auto& [id, p] : pending) {
      if (handed_out && p.second) p.second(sends);
    }
    if (!handed_out) return;
    if (!started) {
      closed_before_start = closed;
      return;
    }
    if (auto h = std::move(on_closed)) {
      on_closed = nullptr;
      on_message = nullptr;
      h(closed);
    }
  }
  // Ends the link here (a task on this end's queue does the handlers) and tells the
  // peer after the bytes in flight.
  void Close(const Status& local, const Status& remote) {
    if (!open) return;
    open = false;
    EventQueue& q = net->queue();
    q.Post(queue, [self = Self(), local] { self->Finish(Status::Aborted("link closed"), local); });
    NotifyPeer(remote);
  }
  void NotifyPeer(const Status& remote) {
    auto p = peer.lock();
    if (!p) return;
    EventQueue& q = net->queue();
    const TimePoint at =
        std::max({q.Now() + net->ShapeOf(node, peer_node).latency, last_arrival, StalledUntil()});
    q.PostAt(p->queue, at, [p, remote] { p->Closed(remote); });
  }
  // The peer's close reached this end: after what the peer sent before it.
  void Closed(const Status& status) {
    if (!open) return;
    if (!held.empty()) {
      closed_after_held = status;
      return;
    }
    open = false;
    Finish(Status::Unavailable("peer closed"), status);
  }
  // A message that arrives while the link stalls waits, and so does every one behind
  // it, however the stall ends: one that came after a Heal went past those held, and
  // a stripe's END overtook the ABORT before it (--stripes seed 70276). Each held
  // message has a task at the stall's end; the first that runs hands out all of them.
  void Deliver(const Message& m) {
    if (!open) return;
    const TimePoint stalled = StalledUntil();
    EventQueue& q = net->queue();
    if (stalled > q.Now() || !held.empty()) {
      held.push_back(m);
      q.PostAt(queue, std::max(stalled, q.Now()), [self = Self()] { self->DeliverHeld(); });
      return;
    }
    Hand(m);
  }
  void DeliverHeld() {
    if (!open || held.empty()) return;
    const TimePoint stalled = StalledUntil();
    EventQueue& q = net->queue();
    if (stalled > q.Now()) {  // stalled again meanwhile
      q.PostAt(queue, stalled, [self = Self()] { self->DeliverHeld(); });
      return;
    }
    while (open && !held.empty()) {
      const Message m = std::move(held.front());
      held.pop_front();
      Hand(m);
    }
    if (closed_after_held) Closed(*std::exchange(closed_after_held, {}));
  }
  void Hand(const Message& m) {
    if (!started) {
      inbox.push_back(m);
      return;
    }
    if (handed_out && on_message) {
      Observe(m, true);
      on_message(m);
    }
  }
  void Observe(const transport::Message& m, bool delivered) {
    if (!net->observer()) return;
    net->observer()(LinkEvent{*info, delivered ? peer_node : node, delivered ? node : peer_node,
                              delivered, *m});
  }
  // A HELLO names the link's stripe and its child (the sender).
  void Tag(const transport::Message& m) {
    const ByteSpan bytes(m->data(), m->size());
    auto type = relay::PeekType(bytes);
    if (!type.ok() || *type != relay::MessageType::kHello) return;
    auto hello = relay::ParseHello(bytes);
    if (!hello.ok()) return;
    info->stripe = static_cast<int>(hello->stripe);
    info->stripes = static_cast<int>(hello->stripes);
    info->child = node;
    info->parent = peer_node;
  }
  std::shared_ptr<End> Self() {
    // Ends are always owned by shared_ptr (made in Connect).
    return self_.lock();
  }
  std::weak_ptr<End> self_;
};

namespace {

class SimConnection final : public transport::Connection {
 public:
  explicit SimConnection(std::shared_ptr<SimNetwork::End> end) : end_(std::move(end)) {}
  ~SimConnection() override {
    end_->Close(Status::Aborted("connection destroyed"), Status::Ok());
    end_->handed_out = false;
    end_->on_message = nullptr;
    end_->on_closed = nullptr;
  }

  void Start(transport::MessageHandler on_message, transport::CloseHandler on_closed) override {
    if (end_->started) return;
    end_->started = true;
    end_->on_message = std::move(on_message);
    end_->on_closed = std::move(on_closed);
    EventQueue& q = end_->net->queue();
    // What came before Start, then an end that came before it: never inline.
    q.Post(end_->queue, [end = end_] {
      auto inbox = std::move(end->inbox);
      end->inbox.clear();
      for (auto& m : inbox) {
        if (!end->handed_out || !end->on_message) continue;
        end->Observe(m, true);
        end->on_message(m);
      }
      if (end->closed_before_start && end->handed_out) {
        auto h = std::move(end->on_closed);
        end->on_closed = nullptr;
        end->on_message = nullptr;
        if (h) h(*end->closed_before_start);
      }
    });
  }

  void Send(Message message, transport::SendHandler on_sent) override {
    EventQueue& q = end_->net->queue();
    if (!message) {
      q.Post(end_->queue, [end = end_, h = std::move(on_sent)] {
        if (end->handed_out && h) h(Status::InvalidArgument("null message"));
      });
      return;
    }
    if (end_->open) {
      end_->Tag(message);
      // A cut stripe link breaks as its HELLO names the stripe.
      if (end_->info->stripe >= 0 && end_->net->StripeCut(end_->info->child, end_->info->stripe)) {
        ++end_->net->mutable_counts().resets;
        end_->Close(Status::Unavailable("stripe link cut (simulated)"),
                    Status::Unavailable("stripe link cut (simulated)"));
      }
    }
    if (end_->open) end_->Observe(message, false);
    if (!end_->open) {
      q.Post(end_->queue, [end = end_, h = std::move(on_sent)] {
        if (end->handed_out && h) h(Status::Unavailable("link closed"));
      });
      return;
    }
    SimNetwork& net = *end_->net;
    const LinkShape shape = net.ShapeOf(end_->node, end_->peer_node);
    const uint64_t bytes = message->size();
    const TimePoint start = std::max({q.Now(), end_->tx_free, end_->StalledUntil()});
    const TimePoint done =
        start + std::chrono::duration_cast<Duration>(
                    std::chrono::duration<double>(bytes / shape.bytes_per_second));
    end_->tx_free = done;
    end_->queued_bytes += bytes;
    const uint64_t id = end_->next_send++;
    end_->sending[id] = {bytes, std::move(on_sent)};
    q.PostAt(end_->queue, done, [end = end_, id, message, shape] {
      auto it = end->sending.find(id);
      if (it == end->sending.end() || !end->open) return;
      auto handler = std::move(it->second.second);
      end->queued_bytes -= it->second.first;
      end->sending.erase(it);
      SimNetwork& net = *end->net;
      EventQueue& q = net.queue();
      TimePoint arrival = q.Now() + shape.latency;
      if (net.loss_probability() > 0 && q.Uniform() < net.loss_probability()) {
        ++net.mutable_counts().losses;
        arrival += std::chrono::milliseconds(200 + q.Below(800));  // retransmission
      }
      arrival = std::max(arrival, end->last_arrival);
      end->last_arrival = arrival;
      ++net.mutable_counts().messages;
      net.mutable_counts().bytes += message->size();
      if (auto p = end->peer.lock()) {
        q.PostAt(p->queue, arrival, [p, message] { p->Deliver(message); });
      }
      if (end->handed_out && handler) handler(Status::Ok());
    });
  }

  uint64_t QueuedBytes() const override { return end_->queued_bytes; }
  void Close() override { end_->Close(Status::Ok(), Status::Ok()); }
  void Abort() override {
    end_->Close(Status::Aborted("aborted"), Status::Unavailable("peer aborted the link"));
  }
  std::string PeerAddress() const override { return end_->peer_address; }

 private:
  std::shared_ptr<SimNetwork::End> end_;
};

}  // namespace

class SimNetwork::Transport final : public transport::Transport {
 public:
  Transport(SimNetwork& net, std::string node)
      : net_(net), node_(std::move(node)), queue_(net.queue().OpenQueue("net")) {
    caps_.backend = "sim";
    caps_.memory_types = {transport::MemoryType::kHost};
    caps_.max_message_bytes = transport::kDefaultMaxMessageBytes;
  }
  ~Transport() override { Shutdown(); }

  const transport::Capabilities& capabilities() const override { return caps_; }

  Result<std::string> Listen(const std::string& address,
                             transport::AcceptHandler on_accept) override {
    if (down_) return Status::Unavailable("transport shut down");
    auto& listeners = net_.listeners();
    auto it = listeners.find(address);
    if (it != listeners.end() && !it->second.alive.expired()) {
      return Status::Unavailable("address in use: " + address);
    }
    listeners[address] = Listener{node_, alive_, this, std::move(on_accept)};
    listening_.push_back(address);
    return address;
  }

  void Connect(const std::string& address, transport::ConnectHandler on_done) override {
    if (down_) return;
    EventQueue& q = net_.queue();
    ++net_.mutable_counts().connects;
    auto it = net_.listeners().find(address);
    const bool there = it != net_.listeners().end() && !it->second.alive.expired();
    const std::string peer = there ? it->second.node : std::string();
    const Duration latency =
        there ? net_.ShapeOf(node_, peer).latency : std::chrono::milliseconds(1);
    if (!there || net_.Partitioned(node_, peer)) {
      ++net_.mutable_counts().refused;
      q.PostAt(queue_, q.Now() + 2 * latency,
               [on_done] { on_done(Status::Unavailable("connection refused (simulated)")); });
      return;
    }
    // The SYN reaches the listener a latency later; the answer comes back another.
    // On the network's queue, which never closes: the listener may be gone by then,
    // and on_done must still run (refused).
    q.PostAt(net_.wire_queue(), q.Now() + latency,
             [net = &net_, client = this, alive = std::weak_ptr<bool>(alive_), address, on_done] {
               if (alive.expired()) return;  // the connecting process is gone
               auto it = net->listeners().find(address);
               if (it == net->listeners().end() || it->second.alive.expired()) {
                 ++net->mutable_counts().refused;
                 EventQueue& q = net->queue();
                 q.PostAt(
                     client->queue_, q.Now() + net->ShapeOf(client->node_, "?").latency,
                     [on_done] { on_done(Status::Unavailable("connection refused (simulated)")); });
                 return;
               }
               it->second.transport->Accept(client, alive, address, on_done);
             });
  }

  void Shutdown() override {
    if (down_) return;
    down_ = true;
    for (const auto& a : listening_) {
      auto it = net_.listeners().find(a);
      if (it != net_.listeners().end() && it->second.transport == this) net_.listeners().erase(it);
    }
    // Every open link aborts, its handlers running here; peers see it break.
    for (auto& weak : ends_) {
      auto end = weak.lock();
      if (!end || !end->open) continue;
      end->open = false;
      end->NotifyPeer(Status::Unavailable("peer went away"));
      end->Finish(Status::Aborted("transport shut down"), Status::Aborted("transport shut down"));
    }
    ends_.clear();
    net_.queue().CloseQueue(queue_);
    alive_.reset();
  }

  // The listener's side of a connect, on this (the listening) transport's queue.
  void Accept(Transport* client, const std::weak_ptr<bool>& client_alive,
              const std::string& address, transport::ConnectHandler on_done) {
    if (client_alive.expired()) return;  // the connecting process is gone
    EventQueue& q = net_.queue();
    const Duration latency = net_.ShapeOf(node_, client->node_).latency;
    auto it = net_.listeners().find(address);
    if (down_ || it == net_.listeners().end() || it->second.transport != this ||
        net_.Partitioned(node_, client->node_)) {
      ++net_.mutable_counts().refused;
      q.PostAt(client->queue_, q.Now() + latency,
               [on_done] { on_done(Status::Unavailable("connection refused (simulated)")); });
      return;
    }
    auto server_end = std::make_shared<End>();
    auto client_end = std::make_shared<End>();
    server_end->self_ = server_end;
    client_end->self_ = client_end;
    server_end->net = client_end->net = &net_;
    server_end->node = client_end->peer_node = node_;
    client_end->node = server_end->peer_node = client->node_;
    server_end->queue = queue_;
    client_end->queue = client->queue_;
    server_end->peer = client_end;
    client_end->peer = server_end;
    server_end->info = client_end->info = std::make_shared<LinkInfo>();
    server_end->info->id = net_.NextLinkId();
    server_end->peer_address = client->node_ + ":" + std::to_string(client->serial_++);
    client_end->peer_address = address;
    ends_.push_back(server_end);
    client->ends_.push_back(client_end);
    const auto key =
        node_ < client->node_ ? std::pair{node_, client->node_} : std::pair{client->node_, node_};
    net_.links().emplace(key, server_end);
    net_.links().emplace(key, client_end);
    it->second.on_accept(std::make_unique<SimConnection>(server_end));
    q.PostAt(client->queue_, q.Now() + latency, [client_end, on_done] {
      on_done(std::unique_ptr<transport::Connection>(std::make_unique<SimConnection>(client_end)));
    });
  }

 public:
  SimNetwork& net_;
  const std::string node_;
  const uint64_t queue_;
  transport::Capabilities caps_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  bool down_ = false;
  std::vector<std::string> listening_;
  std::vector<std::weak_ptr<End>> ends_;
  uint64_t serial_ = 0;
};

std::unique_ptr<transport::Transport> SimNetwork::MakeTransport(const std::string& node) {
  return std::make_unique<Transport>(*this, node);
}

LinkShape SimNetwork::ShapeOf(const std::string& a, const std::string& b) {
  auto [it, fresh] = shapes_.try_emplace(Key(a, b));
  if (fresh) {
    // 50 us .. 20 ms one way, 20 MB/s .. 2 GB/s: a rack to a WAN.
    it->second.latency = std::chrono::microseconds(50 + queue_.Below(20'000));
    it->second.bytes_per_second = 20e6 * std::pow(100.0, queue_.Uniform());
  }
  return it->second;
}

bool SimNetwork::Partitioned(const std::string& a, const std::string& b) const {
  auto it = partitioned_until_.find(Key(a, b));
  return it != partitioned_until_.end() && it->second > queue_.Now();
}

void SimNetwork::ResetLinks(const std::string& a, const std::string& b) {
  auto [lo, hi] = links_.equal_range(Key(a, b));
  for (auto it = lo; it != hi; ++it) {
    if (auto end = it->second.lock(); end && end->open) {
      ++counts_.resets;
      end->Close(Status::Unavailable("link reset (simulated)"),
                 Status::Unavailable("link reset (simulated)"));
    }
  }
}

void SimNetwork::StallLinks(const std::string& a, const std::string& b, Duration d) {
  ++counts_.stalls;
  auto& until = stalled_until_[Key(a, b)];
  until = std::max(until, queue_.Now() + d);
}

void SimNetwork::Partition(const std::string& a, const std::string& b, Duration d) {
  ++counts_.partitions;
  auto& p = partitioned_until_[Key(a, b)];
  p = std::max(p, queue_.Now() + d);
  auto& s = stalled_until_[Key(a, b)];
  s = std::max(s, queue_.Now() + d);
}

namespace {
template <typename Fn>
void ForStripeLink(
    std::multimap<std::pair<std::string, std::string>, std::weak_ptr<SimNetwork::End>>& links,
    const std::string& child, int stripe, Fn&& fn) {
  for (auto& [key, weak] : links) {
    auto end = weak.lock();
    if (!end || !end->open || end->node != child || end->info->child != child ||
        end->info->stripe != stripe)
      continue;
    fn(*end);
  }
}
}  // namespace

void SimNetwork::ResetStripeLink(const std::string& child, int stripe) {
  ForStripeLink(links_, child, stripe, [&](End& end) {
    ++counts_.resets;
    end.Close(Status::Unavailable("stripe link reset (simulated)"),
              Status::Unavailable("stripe link reset (simulated)"));
  });
}

void SimNetwork::StallStripeLink(const std::string& child, int stripe, Duration d) {
  ++counts_.stalls;
  ForStripeLink(links_, child, stripe, [&](End& end) {
    end.info->stalled_until = std::max(end.info->stalled_until, queue_.Now() + d);
  });
}

void SimNetwork::CutStripeLink(const std::string& child, int stripe, Duration d) {
  auto& until = cut_until_[{child, stripe}];
  until = std::max(until, queue_.Now() + d);
  ResetStripeLink(child, stripe);
}

bool SimNetwork::StripeCut(const std::string& child, int stripe) const {
  auto it = cut_until_.find({child, stripe});
  return it != cut_until_.end() && it->second > queue_.Now();
}

void SimNetwork::Heal() {
  partitioned_until_.clear();
  stalled_until_.clear();
  cut_until_.clear();
  for (auto& [key, weak] : links_) {
    if (auto end = weak.lock()) end->info->stalled_until = TimePoint{};
  }
  // What the stalls held comes now, not at their old ends.
  for (auto& [key, weak] : links_) {
    auto end = weak.lock();
    if (end && !end->held.empty()) queue_.Post(end->queue, [end] { end->DeliverHeld(); });
  }
  loss_probability_ = 0;
}

std::vector<std::pair<std::string, std::string>> SimNetwork::LinkedPairs() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = links_.begin(); it != links_.end(); it = links_.upper_bound(it->first)) {
    out.push_back(it->first);
  }
  return out;
}

}  // namespace deltacast::sim
