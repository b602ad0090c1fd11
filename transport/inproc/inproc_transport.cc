#include "transport/inproc/inproc_transport.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "common/thread_annotations.h"
#include "transport/internal/core_transport.h"
#include "transport/internal/handler_gate.h"
#include "transport/internal/task_thread.h"

namespace deltacast::transport {
namespace {
class Core;
}  // namespace

struct InprocNetwork::Registry {
  Mutex mu;
  std::map<std::string, std::weak_ptr<Core>> listeners GUARDED_BY(mu);
  uint64_t next_auto GUARDED_BY(mu) = 1;
  uint64_t next_transport GUARDED_BY(mu) = 1;
};

InprocNetwork::InprocNetwork() : registry_(std::make_shared<Registry>()) {}
InprocNetwork::~InprocNetwork() = default;

std::vector<std::string> InprocNetwork::ListenerNames() const {
  MutexLock lock(registry_->mu);
  std::vector<std::string> names;
  for (const auto& [name, core] : registry_->listeners) {
    if (!core.expired()) names.push_back(name);
  }
  return names;
}

namespace {

class Pipe;

// One transport: its handler thread, its listen names, its connection ends.
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(std::shared_ptr<InprocNetwork> net, const InprocOptions& opts, std::string own_name)
      : options(opts), name(std::move(own_name)), network(std::move(net)) {
    caps.backend = "inproc";
    caps.ordered = true;
    caps.memory_types = {MemoryType::kHost};
    caps.max_message_bytes = options.max_message_bytes;
    caps.streams_per_link = 1;
  }

  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept);
  void Connect(const std::string& address, ConnectHandler on_done);
  void Shutdown();

  // Tracks one end of a pipe for Shutdown; false if shutting down.
  bool AddEnd(const std::shared_ptr<Pipe>& pipe, int side) {
    MutexLock lock(mu_);
    if (closing_) return false;
    ends_.emplace(std::make_pair(pipe.get(), side), pipe);
    return true;
  }
  void ForgetEnd(const Pipe* pipe, int side) {
    MutexLock lock(mu_);
    ends_.erase(std::make_pair(pipe, side));
  }
  // The accept handler for `address`, or null if not listening there.
  std::shared_ptr<AcceptHandler> Acceptor(const std::string& address) {
    MutexLock lock(mu_);
    if (closing_) return nullptr;
    auto it = handlers_.find(address);
    return it == handlers_.end() ? nullptr : it->second;
  }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

  const InprocOptions options;
  const std::string name;  // what peers see as PeerAddress of links it opened
  Capabilities caps;
  const std::shared_ptr<InprocNetwork> network;
  TaskThread executor;  // every handler of this transport runs here

 private:
  Mutex mu_;
  bool closing_ GUARDED_BY(mu_) = false;
  std::atomic<bool> stopped_{false};
  std::map<std::string, std::shared_ptr<AcceptHandler>> handlers_ GUARDED_BY(mu_);
  std::map<std::pair<const Pipe*, int>, std::weak_ptr<Pipe>> ends_ GUARDED_BY(mu_);
  Mutex shutdown_mu_;  // one Shutdown at a time; guards no member
};

enum class CloseKind { kClose, kAbort, kShutdown };

// A bidirectional link: side 0 belongs to the connecting transport, side 1 to the
// accepting one. One mutex guards both sides; handlers are posted to the owning
// side's executor while it is held, which keeps them in decision order.
class Pipe : public std::enable_shared_from_this<Pipe> {
 public:
  struct Entry {
    Message message;
    SendHandler on_sent;
  };
  struct Side {
    std::shared_ptr<Core> core;
    std::string peer_name;
    std::deque<Entry> inbox;                // sent by the other side, not yet taken
    std::atomic<uint64_t> queued_bytes{0};  // sent by this side, not yet taken
    bool started = false;
    bool closed = false;
    bool close_notified = false;
    bool deliver_scheduled = false;
    Status close_status;
    Status send_abort_status;
    std::shared_ptr<MessageHandler> on_message;
    CloseHandler on_closed;
    HandlerGate gate;
  };

  Side& side(int i) { return sides_[i]; }

  void Start(int i, MessageHandler on_message, CloseHandler on_closed) {
    MutexLock lock(mu_);
    Side& me = sides_[i];
    if (me.started) return;
    me.started = true;
    me.on_message = std::make_shared<MessageHandler>(std::move(on_message));
    me.on_closed = std::move(on_closed);
    if (me.closed) {
      PostNotifyClosed(i);
    } else if (!me.inbox.empty() && !me.deliver_scheduled) {
      PostDeliver(i);
    }
  }

  void Send(int i, Message message, SendHandler on_sent) {
    MutexLock lock(mu_);
    Side& me = sides_[i];
    Side& peer = sides_[1 - i];
    Status reject;
    if (!message) {
      reject = Status::InvalidArgument("null message");
    } else if (message->size() > me.core->options.max_message_bytes) {
      reject = Status::InvalidArgument("message of " + std::to_string(message->size()) +
                                       " bytes exceeds max_message_bytes " +
                                       std::to_string(me.core->options.max_message_bytes));
    } else if (me.closed) {
      reject = me.send_abort_status;
    }
    if (!reject.ok()) {
      if (on_sent) PostHandler(i, [on_sent = std::move(on_sent), reject] { on_sent(reject); });
      return;
    }
    me.queued_bytes.fetch_add(message->size(), std::memory_order_relaxed);
    peer.inbox.push_back(Entry{std::move(message), std::move(on_sent)});
    if (peer.started && !peer.deliver_scheduled) PostDeliver(1 - i);
  }

  void Close(int i, CloseKind kind) {
    MutexLock lock(mu_);
    switch (kind) {
      case CloseKind::kClose:
        CloseLocked(i, Status::Ok(),
                    Status::Aborted("connection closed before the message was sent"), Status::Ok(),
                    Status::Unavailable("peer closed the connection before the message was sent"));
        break;
      case CloseKind::kAbort:
        CloseLocked(i, Status::Aborted("connection aborted locally"),
                    Status::Aborted("connection aborted before the message was sent"),
                    Status::Unavailable("peer aborted the connection"),
                    Status::Unavailable("peer aborted the connection before the message was sent"));
        break;
      case CloseKind::kShutdown:
        CloseLocked(i, Status::Aborted("transport shut down"),
                    Status::Aborted("transport shut down before the message was sent"),
                    Status::Unavailable("peer transport shut down"),
                    Status::Unavailable("peer transport shut down before the message was sent"));
        break;
    }
  }

 private:
  void Invoke(int i, const std::function<void()>& fn) {
    if (sides_[i].core->stopped()) return;
    sides_[i].gate.Run(fn);
  }

  // Runs `fn` on side i's executor, through its gate. Called with mu_ held.
  void PostHandler(int i, std::function<void()> fn) {
    sides_[i].core->executor.Post(
        [self = shared_from_this(), i, fn = std::move(fn)] { self->Invoke(i, fn); });
  }

  void PostDeliver(int i) {
    Side& me = sides_[i];
    me.deliver_scheduled =
        me.core->executor.Post([self = shared_from_this(), i] { self->DeliverOne(i); });
  }

  void PostNotifyClosed(int i) {
    sides_[i].core->executor.Post([self = shared_from_this(), i] {
      CloseHandler on_closed;
      Status status;
      {
        MutexLock lock(self->mu_);
        Side& me = self->sides_[i];
        if (me.close_notified) return;
        me.close_notified = true;
        on_closed = std::move(me.on_closed);
        me.on_closed = nullptr;
        me.on_message.reset();
        status = me.close_status;
      }
      if (on_closed) self->Invoke(i, [&] { on_closed(status); });
    });
  }

  // Takes one message off side i's inbox and delivers it; one per task, so links
  // sharing the executor take turns.
  void DeliverOne(int i) {
    Entry entry;
    std::shared_ptr<MessageHandler> handler;
    {
      MutexLock lock(mu_);
      Side& me = sides_[i];
      Side& peer = sides_[1 - i];
      if (me.closed || me.inbox.empty()) {
        me.deliver_scheduled = false;
        return;
      }
      entry = std::move(me.inbox.front());
      me.inbox.pop_front();
      const uint64_t size = entry.message->size();
      peer.queued_bytes.fetch_sub(size, std::memory_order_relaxed);
      const uint64_t limit = me.core->options.max_message_bytes;
      if (size > limit) {
        const std::string why = "message of " + std::to_string(size) +
                                " bytes exceeds max_message_bytes " + std::to_string(limit);
        Status theirs = Status::Unavailable("peer refused a " + why);
        if (entry.on_sent) {
          PostHandler(1 - i, [on_sent = std::move(entry.on_sent), theirs] { on_sent(theirs); });
        }
        Status mine = Status::Corrupt("from " + me.peer_name + ": " + why);
        CloseLocked(i, mine, mine, theirs, theirs);
        me.deliver_scheduled = false;
        return;
      }
      if (entry.on_sent) {
        PostHandler(1 - i, [on_sent = std::move(entry.on_sent)] { on_sent(Status::Ok()); });
      }
      handler = me.on_message;
      if (me.inbox.empty()) {
        me.deliver_scheduled = false;
      } else {
        PostDeliver(i);
      }
    }
    if (handler && *handler) Invoke(i, [&] { (*handler)(std::move(entry.message)); });
  }

  // Ends the link for both sides. Messages not yet taken are withdrawn and their
  // senders told; on_closed is posted for each started side.
  void CloseLocked(int i, Status mine, Status mine_send, Status theirs, Status theirs_send) {
    Side& me = sides_[i];
    Side& peer = sides_[1 - i];
    if (me.closed) return;
    me.closed = peer.closed = true;
    me.close_status = std::move(mine);
    me.send_abort_status = std::move(mine_send);
    peer.close_status = std::move(theirs);
    peer.send_abort_status = std::move(theirs_send);
    for (int k : {i, 1 - i}) {
      // Side k's sends still waiting in the other side's inbox.
      Side& sender = sides_[k];
      Side& holder = sides_[1 - k];
      for (auto& entry : holder.inbox) {
        sender.queued_bytes.fetch_sub(entry.message->size(), std::memory_order_relaxed);
        if (entry.on_sent) {
          PostHandler(k, [on_sent = std::move(entry.on_sent), status = sender.send_abort_status] {
            on_sent(status);
          });
        }
      }
      holder.inbox.clear();
    }
    for (int k : {i, 1 - i}) {
      if (sides_[k].started) PostNotifyClosed(k);
      sides_[k].core->ForgetEnd(this, k);
    }
  }

  Mutex mu_;
  // Not GUARDED_BY: a Side mixes what mu_ guards (inbox, the flags, the handlers)
  // with what is fixed or safe alone (core, peer_name, queued_bytes, gate).
  Side sides_[2];
};

class InprocConnection final : public Connection {
 public:
  InprocConnection(std::shared_ptr<Pipe> pipe, int side) : pipe_(std::move(pipe)), side_(side) {}
  ~InprocConnection() override {
    pipe_->Close(side_, CloseKind::kClose);
    pipe_->side(side_).gate.Close();
  }
  void Start(MessageHandler on_message, CloseHandler on_closed) override {
    pipe_->Start(side_, std::move(on_message), std::move(on_closed));
  }
  void Send(Message message, SendHandler on_sent) override {
    pipe_->Send(side_, std::move(message), std::move(on_sent));
  }
  uint64_t QueuedBytes() const override {
    return pipe_->side(side_).queued_bytes.load(std::memory_order_relaxed);
  }
  void Close() override { pipe_->Close(side_, CloseKind::kClose); }
  void Abort() override { pipe_->Close(side_, CloseKind::kAbort); }
  std::string PeerAddress() const override { return pipe_->side(side_).peer_name; }

 private:
  const std::shared_ptr<Pipe> pipe_;
  const int side_;
};

Result<std::string> Core::Listen(const std::string& address, AcceptHandler on_accept) {
  if (address.empty()) return Status::InvalidArgument("inproc listen: empty address");
  auto& registry = network->registry();
  std::string bound = address;
  {
    MutexLock registry_lock(registry.mu);
    auto taken = [&](const std::string& candidate) REQUIRES(registry.mu) {
      auto it = registry.listeners.find(candidate);
      return it != registry.listeners.end() && !it->second.expired();
    };
    if (address.size() >= 2 && address.ends_with(":0")) {
      const std::string prefix = address.substr(0, address.size() - 1);
      do {
        bound = prefix + std::to_string(registry.next_auto++);
      } while (taken(bound));
    } else if (taken(bound)) {
      return Status::FailedPrecondition("inproc listen: address " + bound + " already in use");
    }
    {
      MutexLock lock(mu_);
      if (closing_)
        return Status::FailedPrecondition("listen on " + address + ": transport shut down");
      handlers_[bound] = std::make_shared<AcceptHandler>(std::move(on_accept));
    }
    registry.listeners[bound] = weak_from_this();
  }
  return bound;
}

void Core::Connect(const std::string& address, ConnectHandler on_done) {
  auto fail = [&](Status status) {
    executor.Post([self = shared_from_this(), on_done = std::move(on_done),
                   status = std::move(status)]() mutable {
      if (!self->stopped()) on_done(std::move(status));
    });
  };
  std::shared_ptr<Core> listener;
  {
    auto& registry = network->registry();
    MutexLock lock(registry.mu);
    auto it = registry.listeners.find(address);
    if (it != registry.listeners.end()) listener = it->second.lock();
  }
  std::shared_ptr<AcceptHandler> acceptor = listener ? listener->Acceptor(address) : nullptr;
  if (!acceptor) {
    fail(Status::Unavailable("no inproc listener at " + address));
    return;
  }
  auto pipe = std::make_shared<Pipe>();
  pipe->side(0).core = shared_from_this();
  pipe->side(0).peer_name = address;
  pipe->side(1).core = listener;
  pipe->side(1).peer_name = name;
  if (!AddEnd(pipe, 0)) {
    fail(Status::Aborted("transport shut down"));
    return;
  }
  if (!listener->AddEnd(pipe, 1)) {
    pipe->Close(0, CloseKind::kAbort);
    fail(Status::Unavailable("inproc listener at " + address + " shut down"));
    return;
  }
  // The acceptor sees the link first, as after a TCP handshake.
  auto done = std::make_shared<ConnectHandler>(std::move(on_done));
  const bool posted =
      listener->executor.Post([pipe, acceptor, listener, done, self = shared_from_this()] {
        auto accepted = std::make_unique<InprocConnection>(pipe, 1);
        if (!listener->stopped() && *acceptor) (*acceptor)(std::move(accepted));
        self->executor.Post([pipe, done, self] {
          auto connection = std::make_unique<InprocConnection>(pipe, 0);
          if (!self->stopped()) (*done)(std::unique_ptr<Connection>(std::move(connection)));
        });
      });
  if (!posted) {
    pipe->Close(1, CloseKind::kShutdown);
    on_done = std::move(*done);
    fail(Status::Unavailable("inproc listener at " + address + " shut down"));
  }
}

void Core::Shutdown() {
  MutexLock shutdown_lock(shutdown_mu_);
  std::vector<std::pair<std::shared_ptr<Pipe>, int>> ends;
  std::vector<std::string> names;
  {
    MutexLock lock(mu_);
    if (closing_ && stopped()) return;
    closing_ = true;
    for (auto& [key, weak] : ends_) {
      if (auto pipe = weak.lock()) ends.emplace_back(std::move(pipe), key.second);
    }
    for (auto& [listen_name, handler] : handlers_) names.push_back(listen_name);
    handlers_.clear();
  }
  {
    auto& registry = network->registry();
    MutexLock lock(registry.mu);
    for (const auto& listen_name : names) {
      auto it = registry.listeners.find(listen_name);
      if (it != registry.listeners.end() && it->second.lock().get() == this) {
        registry.listeners.erase(it);
      }
    }
  }
  for (auto& [pipe, side] : ends) pipe->Close(side, CloseKind::kShutdown);
  ends.clear();
  executor.Stop(/*drain=*/true);  // the kAborted handlers run now
  stopped_.store(true, std::memory_order_release);
}

using InprocTransport = internal::CoreTransport<Core>;

}  // namespace

std::unique_ptr<Transport> MakeInprocTransport(std::shared_ptr<InprocNetwork> network,
                                               const InprocOptions& requested) {
  if (!network) network = std::make_shared<InprocNetwork>();
  InprocOptions options = requested;
  if (options.max_message_bytes == 0) options.max_message_bytes = kDefaultMaxMessageBytes;
  uint64_t id;
  {
    MutexLock lock(network->registry().mu);
    id = network->registry().next_transport++;
  }
  auto core = std::make_shared<Core>(network, options, "inproc-transport-" + std::to_string(id));
  return std::make_unique<InprocTransport>(std::move(core));
}

}  // namespace deltacast::transport
