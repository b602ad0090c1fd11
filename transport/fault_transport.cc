#include "transport/fault_transport.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "transport/internal/handler_gate.h"
#include "transport/internal/link_connection.h"
#include "transport/internal/task_thread.h"

namespace deltacast::transport {
namespace {

using Clock = std::chrono::steady_clock;

struct Counters {
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint64_t> delayed{0};
  std::atomic<uint64_t> resets{0};
  std::atomic<uint64_t> stalled{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> failed_sends{0};
  std::atomic<uint64_t> failed_connects{0};
};

class FaultLink;

// Shared by the wrapper and every wrapped connection.
struct FaultCore : std::enable_shared_from_this<FaultCore> {
  FaultCore(std::unique_ptr<Transport> inner_transport, const FaultPlan& fault_plan)
      : plan(fault_plan), inner(std::move(inner_transport)) {
    caps = inner->capabilities();
    caps.backend = "fault(" + caps.backend + ")";
  }

  std::unique_ptr<Connection> Wrap(std::unique_ptr<Connection> connection);

  const FaultPlan plan;
  Capabilities caps;
  const std::unique_ptr<Transport> inner;
  TaskThread timer;  // held sends, and handlers that must not run inline
  Counters counters;
  std::atomic<uint64_t> connects{0};
  std::atomic<uint64_t> links{0};
  std::atomic<bool> stopped{false};
};

// One wrapped connection. Every Send gets an index; its on_sent is recorded under
// that index by whoever completes it (the inner connection, the timer thread, a
// fault) and handlers are released strictly in index order.
class FaultLink : public std::enable_shared_from_this<FaultLink> {
 public:
  FaultLink(std::shared_ptr<FaultCore> core, std::unique_ptr<Connection> inner, uint64_t number)
      : core_(std::move(core)),
        plan_(core_->plan),
        peer_(inner->PeerAddress()),
        identity_(inner->PeerIdentity()),
        inner_(std::move(inner)),
        stalls_(plan_.stall_after_messages >= 0 &&
                (plan_.stall_links < 0 || number < static_cast<uint64_t>(plan_.stall_links))),
        rng_(plan_.seed ^ (number * 0x9e3779b97f4a7c15ull)) {}

  void Start(MessageHandler on_message, CloseHandler on_closed) {
    MutexLock lock(mu_);
    if (started_) return;
    started_ = true;
    on_message_ = std::move(on_message);
    on_closed_ = std::move(on_closed);
    if (!inner_) return;
    std::weak_ptr<FaultLink> weak = weak_from_this();
    inner_->Start(
        [weak](Message message) {
          if (auto self = weak.lock()) self->OnMessage(std::move(message));
        },
        [weak](Status status) {
          if (auto self = weak.lock()) self->OnInnerClosed(std::move(status));
        });
  }

  void Send(Message message, SendHandler on_sent) {
    MutexLock lock(mu_);
    const uint64_t index = next_index_++;
    Status reject;
    if (closed_) {
      reject = send_abort_status_;
    } else if (plan_.fail_nth_send >= 0 && index == static_cast<uint64_t>(plan_.fail_nth_send)) {
      core_->counters.failed_sends.fetch_add(1, std::memory_order_relaxed);
      reject = Status::Unavailable("fault injection: send #" + std::to_string(index) + " failed");
    }
    if (!reject.ok()) {
      RecordLocked(index, std::move(on_sent), std::move(reject));
      PostDrain();
      return;
    }
    if (!message || message->size() > core_->caps.max_message_bytes) {
      ForwardLocked(index, std::move(message), std::move(on_sent), /*drop=*/false);
      return;  // the inner connection reports the error
    }
    const uint64_t size = message->size();
    if (stalls_ && index >= static_cast<uint64_t>(plan_.stall_after_messages)) {
      // Held until the link closes; later messages queue behind it.
      core_->counters.stalled.fetch_add(1, std::memory_order_relaxed);
      last_release_ = Clock::time_point::max();
      waiting_bytes_ += size;
      waiting_.push_back(Held{index, std::move(message), std::move(on_sent), last_release_, false});
      return;
    }
    const bool drop = plan_.drop_probability > 0 && Uniform() < plan_.drop_probability;
    const Clock::time_point now = Clock::now();
    Clock::time_point release = now;
    if (plan_.bandwidth_bytes_per_second > 0) {
      const auto busy = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
          static_cast<double>(size) / plan_.bandwidth_bytes_per_second));
      link_free_ = std::max(now, link_free_) + busy;
      release = link_free_;
    }
    release += plan_.delay;
    release = std::max(release, last_release_);  // never overtake a held message
    last_release_ = release;
    if (release <= now && waiting_.empty()) {
      ForwardLocked(index, std::move(message), std::move(on_sent), drop);
      return;
    }
    core_->counters.delayed.fetch_add(1, std::memory_order_relaxed);
    waiting_bytes_ += size;
    waiting_.push_back(Held{index, std::move(message), std::move(on_sent), release, drop});
    core_->timer.PostAt(release, [weak = weak_from_this()] {
      if (auto self = weak.lock()) self->ReleaseDue();
    });
  }

  uint64_t QueuedBytes() const {
    MutexLock lock(mu_);
    return waiting_bytes_ + (inner_ ? inner_->QueuedBytes() : 0);
  }

  void Close(bool abortive) {
    {
      MutexLock lock(mu_);
      if (!closed_) {
        closed_ = true;
        send_abort_status_ =
            Status::Aborted(abortive ? "connection aborted before the message was sent"
                                     : "connection closed before the message was sent");
        AbortHeldLocked(send_abort_status_);
      }
      if (inner_) {
        if (abortive) {
          inner_->Abort();
        } else {
          inner_->Close();
        }
      }
    }
    PostDrain();
  }

  // The wrapping Connection is being destroyed: no user handler runs after this.
  void Detach() {
    Close(/*abortive=*/false);
    gate_.Close();
    std::unique_ptr<Connection> inner;
    {
      MutexLock lock(mu_);
      inner = std::move(inner_);
    }
    inner.reset();  // waits for the inner connection's handlers
  }

  const std::string& peer() const { return peer_; }
  const std::string& identity() const { return identity_; }
  void Authenticated() {
    MutexLock lock(mu_);
    if (inner_) inner_->Authenticated();
  }

 private:
  struct Held {
    uint64_t index;
    Message message;
    SendHandler on_sent;
    Clock::time_point release;
    bool drop;
  };

  double Uniform() REQUIRES(mu_) { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  Status ResetStatus() const {
    return Status::Unavailable("fault injection: link reset after " +
                               std::to_string(plan_.reset_after_messages) + " messages");
  }

  template <typename F>
  void Invoke(F&& fn) {
    if (core_->stopped.load(std::memory_order_acquire)) return;
    gate_.Run(std::forward<F>(fn));
  }

  void RecordLocked(uint64_t index, SendHandler on_sent, Status status) REQUIRES(mu_) {
    done_.emplace(index, std::make_pair(std::move(on_sent), std::move(status)));
  }

  void PostDrain() {
    core_->timer.Post([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->Drain();
    });
  }

  void ReleaseDue() {
    MutexLock lock(mu_);
    const Clock::time_point now = Clock::now();
    while (!waiting_.empty() && waiting_.front().release <= now) {
      Held held = std::move(waiting_.front());
      waiting_.pop_front();
      waiting_bytes_ -= held.message->size();
      ForwardLocked(held.index, std::move(held.message), std::move(held.on_sent), held.drop);
    }
  }

  void ForwardLocked(uint64_t index, Message message, SendHandler on_sent, bool drop)
      REQUIRES(mu_) {
    const int64_t reset_after = plan_.reset_after_messages;
    Status reject;
    if (closed_) {
      reject = send_abort_status_;
    } else if (reset_after >= 0 && forwarded_ >= static_cast<uint64_t>(reset_after)) {
      if (!reset_pending_) TriggerResetLocked();  // reset_after_messages == 0
      reject = ResetStatus();
    } else if (!inner_) {
      reject = Status::Aborted("connection destroyed");
    }
    if (!reject.ok() || drop) {
      if (drop && reject.ok()) core_->counters.dropped.fetch_add(1, std::memory_order_relaxed);
      RecordLocked(index, std::move(on_sent), std::move(reject));
      PostDrain();
      return;
    }
    if (message) {
      core_->counters.sent.fetch_add(1, std::memory_order_relaxed);
      core_->counters.bytes.fetch_add(message->size(), std::memory_order_relaxed);
    }
    ++forwarded_;
    const bool last = reset_after >= 0 && forwarded_ == static_cast<uint64_t>(reset_after);
    if (last) reset_pending_ = true;
    inner_->Send(std::move(message), [weak = weak_from_this(), index, on_sent = std::move(on_sent),
                                      last](Status status) mutable {
      if (auto self = weak.lock()) {
        self->OnInnerSent(index, std::move(on_sent), std::move(status), last);
      }
    });
  }

  void OnInnerSent(uint64_t index, SendHandler on_sent, Status status, bool last) {
    {
      MutexLock lock(mu_);
      const bool reset = last && status.ok();
      RecordLocked(index, std::move(on_sent), std::move(status));
      if (reset) TriggerResetLocked();
    }
    Drain();
  }

  void TriggerResetLocked() REQUIRES(mu_) {
    if (reset_triggered_) return;
    reset_triggered_ = true;
    reset_pending_ = true;
    core_->counters.resets.fetch_add(1, std::memory_order_relaxed);
    closed_ = true;
    send_abort_status_ = ResetStatus();
    AbortHeldLocked(send_abort_status_);
    if (inner_) inner_->Abort();
  }

  void AbortHeldLocked(const Status& status) REQUIRES(mu_) {
    for (auto& held : waiting_) RecordLocked(held.index, std::move(held.on_sent), status);
    waiting_.clear();
    waiting_bytes_ = 0;
  }

  void OnMessage(Message message) {
    if (on_message_) Invoke([&] { on_message_(std::move(message)); });
  }

  void OnInnerClosed(Status status) {
    {
      MutexLock lock(mu_);
      inner_closed_ = true;
      close_status_ = reset_triggered_ ? ResetStatus() : std::move(status);
      if (!closed_) {
        closed_ = true;
        send_abort_status_ =
            close_status_.ok()
                ? Status::Unavailable("peer closed the connection before the message was sent")
                : close_status_;
      }
      AbortHeldLocked(send_abort_status_);
      close_barrier_ = next_index_;
    }
    Drain();
  }

  // Runs recorded on_sent handlers in index order, then on_closed once every Send
  // issued before the close has completed. One thread drains at a time.
  void Drain() {
    MutexLock lock(mu_);
    if (draining_) return;
    draining_ = true;
    while (true) {
      auto first = done_.begin();
      if (first != done_.end() && first->first == next_complete_) {
        // Named, not a structured binding: clang 15 (the fuzz build) cannot capture those.
        SendHandler on_sent = std::move(first->second.first);
        Status status = std::move(first->second.second);
        done_.erase(first);
        ++next_complete_;
        lock.Unlock();
        if (on_sent) Invoke([&] { on_sent(std::move(status)); });
        lock.Lock();
        continue;
      }
      if (inner_closed_ && started_ && !close_notified_ && next_complete_ >= close_barrier_) {
        close_notified_ = true;
        CloseHandler on_closed = std::move(on_closed_);
        on_closed_ = nullptr;
        Status status = close_status_;
        lock.Unlock();
        if (on_closed) Invoke([&] { on_closed(std::move(status)); });
        lock.Lock();
        continue;
      }
      break;
    }
    draining_ = false;
  }

  const std::shared_ptr<FaultCore> core_;
  const FaultPlan& plan_;
  const std::string peer_;
  const std::string identity_;
  HandlerGate gate_;

  mutable Mutex mu_;
  std::unique_ptr<Connection> inner_
      GUARDED_BY(mu_);  // null once the wrapping Connection is destroyed
  const bool stalls_;   // stall_after_messages applies to this link
  std::mt19937_64 rng_ GUARDED_BY(mu_);
  bool started_ GUARDED_BY(mu_) = false;
  MessageHandler on_message_;  // set by Start, before the inner link delivers
  CloseHandler on_closed_ GUARDED_BY(mu_);
  uint64_t next_index_ GUARDED_BY(mu_) = 0;  // index of the next Send
  uint64_t forwarded_ GUARDED_BY(mu_) = 0;   // messages handed to inner_
  Clock::time_point link_free_ GUARDED_BY(mu_){};
  Clock::time_point last_release_ GUARDED_BY(mu_){};
  std::deque<Held> waiting_ GUARDED_BY(mu_);
  uint64_t waiting_bytes_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::pair<SendHandler, Status>> done_ GUARDED_BY(mu_);
  uint64_t next_complete_ GUARDED_BY(mu_) = 0;
  bool draining_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  bool reset_pending_ GUARDED_BY(mu_) = false;  // the last message before the reset is out
  bool reset_triggered_ GUARDED_BY(mu_) = false;
  Status send_abort_status_ GUARDED_BY(mu_);
  bool inner_closed_ GUARDED_BY(mu_) = false;
  bool close_notified_ GUARDED_BY(mu_) = false;
  Status close_status_ GUARDED_BY(mu_);
  uint64_t close_barrier_ GUARDED_BY(mu_) = 0;  // Sends below this index complete before on_closed
};

std::unique_ptr<Connection> FaultCore::Wrap(std::unique_ptr<Connection> connection) {
  const uint64_t number = links.fetch_add(1, std::memory_order_relaxed);
  return std::make_unique<internal::LinkConnection<FaultLink>>(
      std::make_shared<FaultLink>(shared_from_this(), std::move(connection), number));
}

class FaultTransportImpl final : public FaultTransport {
 public:
  explicit FaultTransportImpl(std::shared_ptr<FaultCore> core) : core_(std::move(core)) {}
  ~FaultTransportImpl() override { Shutdown(); }

  const Capabilities& capabilities() const override { return core_->caps; }

  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept) override {
    std::weak_ptr<FaultCore> weak = core_;
    return core_->inner->Listen(address, [weak, on_accept](std::unique_ptr<Connection> connection) {
      auto core = weak.lock();
      if (!core || core->stopped.load()) return;
      on_accept(core->Wrap(std::move(connection)));
    });
  }

  void Connect(const std::string& address, ConnectHandler on_done) override {
    const uint64_t index = core_->connects.fetch_add(1, std::memory_order_relaxed);
    if (core_->plan.fail_nth_connect >= 0 &&
        index == static_cast<uint64_t>(core_->plan.fail_nth_connect)) {
      core_->counters.failed_connects.fetch_add(1, std::memory_order_relaxed);
      core_->timer.Post([core = core_, on_done, index, address] {
        if (core->stopped.load()) return;
        on_done(Status::Unavailable("fault injection: connect #" + std::to_string(index) + " to " +
                                    address + " failed"));
      });
      return;
    }
    std::weak_ptr<FaultCore> weak = core_;
    core_->inner->Connect(address, [weak, on_done](Result<std::unique_ptr<Connection>> result) {
      auto core = weak.lock();
      if (!core || core->stopped.load()) return;
      if (!result.ok()) {
        on_done(result.status());
        return;
      }
      on_done(core->Wrap(std::move(result).value()));
    });
  }

  void Shutdown() override {
    core_->inner->Shutdown();  // wrapped connections see their inner on_closed here
    core_->timer.Stop(/*drain=*/false);
    core_->stopped.store(true, std::memory_order_release);
  }

  FaultStats stats() const override {
    const Counters& c = core_->counters;
    FaultStats s;
    s.sent = c.sent.load();
    s.dropped = c.dropped.load();
    s.delayed = c.delayed.load();
    s.resets = c.resets.load();
    s.stalled = c.stalled.load();
    s.bytes = c.bytes.load();
    s.failed_sends = c.failed_sends.load();
    s.failed_connects = c.failed_connects.load();
    return s;
  }

  const FaultPlan& plan() const override { return core_->plan; }

 private:
  const std::shared_ptr<FaultCore> core_;
};

}  // namespace

std::unique_ptr<Transport> WrapWithFaults(std::unique_ptr<Transport> inner, FaultPlan plan) {
  assert(inner != nullptr && "WrapWithFaults needs a transport to wrap");
  if (!inner) return nullptr;
  if (!(plan.drop_probability >= 0 && plan.drop_probability <= 1)) {
    log::Warn("fault transport: drop_probability " + std::to_string(plan.drop_probability) +
              " clamped to [0, 1]");
    plan.drop_probability = plan.drop_probability > 1 ? 1 : 0;
  }
  if (plan.delay.count() < 0) {
    log::Warn("fault transport: negative delay treated as 0");
    plan.delay = std::chrono::microseconds(0);
  }
  if (!(plan.bandwidth_bytes_per_second >= 0)) {
    log::Warn("fault transport: negative bandwidth treated as uncapped");
    plan.bandwidth_bytes_per_second = 0;
  }
  auto core = std::make_shared<FaultCore>(std::move(inner), plan);
  return std::make_unique<FaultTransportImpl>(std::move(core));
}

FaultTransport* AsFaultTransport(Transport* transport) {
  return dynamic_cast<FaultTransport*>(transport);
}

const FaultTransport* AsFaultTransport(const Transport* transport) {
  return dynamic_cast<const FaultTransport*>(transport);
}

}  // namespace deltacast::transport
