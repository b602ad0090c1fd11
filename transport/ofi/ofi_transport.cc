// The ofi backend's Core (every libfabric call, on one progress thread) and its
// Connection. Protocol and design: ofi_transport.h and docs/transport.md "ofi".
#include "transport/ofi/ofi_transport.h"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/log.h"
#include "transport/internal/address.h"
#include "transport/internal/core_transport.h"
#include "transport/internal/handler_gate.h"
#include "transport/ofi/buffer_pool.h"
#include "transport/ofi/fabric.h"
#include "transport/ofi/wire.h"

namespace deltacast::transport {
namespace ofi {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kControlRecvsPerEndpoint = 64;
// Messages of one link announced (RTS or inline kData) and not yet answered
// (CTS): bounds what a receiver that has not started holds for that link.
constexpr size_t kMaxAnnouncedPerLink = 64;
// Bytes of posted receives per link; a single larger message is still granted alone.
constexpr uint64_t kGrantBudgetBytes = uint64_t{256} << 20;
// A RTS this far ahead of the next expected message is corrupt.
constexpr uint64_t kMaxSeqAhead = uint64_t{1} << 20;
// Spin this long on the CQ after the last work before blocking.
constexpr auto kSpinTime = std::chrono::microseconds(50);
// How long Shutdown waits for its ABORT messages to leave.
constexpr auto kShutdownFlush = milliseconds(200);

struct EndpointState;

enum class OpKind : uint8_t { kControlRecv, kControlSend, kDataSend, kDataRecv };

// One posted libfabric operation; its address is the operation context.
struct Op {
  fi_context2 context;  // first member: libfabric may use it (FI_CONTEXT2 mode)
  OpKind kind = OpKind::kControlSend;
  EndpointState* endpoint = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  uint32_t link_id = 0;     // the local link it serves; 0 once that link ended
  uint32_t connect_id = 0;  // a CONNECT's pending connect
  uint64_t seq = 0;
  uint64_t tag = 0;
  std::vector<std::byte> control;  // control message bytes (send or receive buffer)
  Message message;                 // kDataSend: the bytes being sent
  std::unique_ptr<std::vector<std::byte>> receive;  // kDataRecv: the buffer being filled
};

struct EndpointState {
  std::unique_ptr<Endpoint> endpoint;
  AcceptHandler on_accept;                               // set for listeners
  std::unordered_map<std::string, fi_addr_t> addresses;  // peer name (raw bytes) -> AV entry
  std::unordered_map<fi_addr_t, std::string> names;      // the reverse
  std::vector<Op*> control_recvs;
};

// shm peers inside this process (tests; a node with two transports): shm maps a
// peer's region by name and touches it on send and during progress, so closing an
// endpoint while another transport of the process still sends to it crashes in
// the provider. Names of this process's endpoints are tracked here: closing takes
// the lock exclusively, sends and CQ reads of shm transports share it, and a
// send to a local name that is gone fails like a refused connection.
// Everything of a torn-down transport that libfabric may still point into.
struct Resources {
  std::unique_ptr<Fabric> fabric;  // destroyed last
  std::vector<std::unique_ptr<EndpointState>> endpoints;
  std::vector<std::unique_ptr<Op>> ops;
};
struct LocalNames {
  std::shared_mutex mu;
  std::unordered_set<std::string> live;
  std::unordered_set<std::string> ever;
  int live_cores = 0;                // shm transports of this process not torn down
  std::vector<Resources> graveyard;  // torn down while others were live
};
LocalNames& Local() {
  static LocalNames* names = new LocalNames();  // never destroyed: used at exit
  return *names;
}

struct PendingSend {
  uint64_t seq = 0;
  Message message;
  SendHandler on_sent;
  uint64_t bytes = 0;  // counted in queued_bytes
  bool announced = false;
  bool done = false;
  Status status;
};

struct Incoming {
  uint64_t size = 0;
  bool granted = false;
  bool complete = false;  // inline messages arrive complete
  Op* op = nullptr;       // the posted receive while granted and not complete
  std::unique_ptr<std::vector<std::byte>> bytes;
};

// One logical link. Fields below the atomics are touched only on the progress thread.
struct Link {
  uint32_t id = 0;
  uint32_t remote_id = 0;
  EndpointState* endpoint = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  std::string peer_address;
  HandlerGate gate;
  std::atomic<uint64_t> queued_bytes{0};

  bool started = false;
  MessageHandler on_message;
  CloseHandler on_closed;

  std::deque<PendingSend> sends;  // by seq, front = oldest whose on_sent has not run
  uint64_t next_send_seq = 0;
  size_t unanswered = 0;  // RTS/kData sent, CTS not yet received
  uint64_t sent_ok = 0;   // messages whose on_sent ran OK

  std::map<uint64_t, Incoming> incoming;
  uint64_t announced_by_peer = 0;  // 1 + highest seq the peer announced
  uint64_t next_grant = 0;
  uint64_t next_deliver = 0;
  uint64_t granted_bytes = 0;

  bool peer_ended = false;  // GOODBYE or ABORT received
  Status peer_status;
  uint64_t peer_count = 0;

  bool ended = false;
  Status final_status;
  Status late_status;  // what sends issued after the end complete with
  bool close_reported = false;
  std::vector<SendHandler> late_sends;  // their on_sent runs after on_closed

  Clock::time_point last_heard;
  Clock::time_point last_said;
};

struct PendingConnect {
  ConnectHandler on_done;
  std::string address;
  EndpointState* endpoint = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  Clock::time_point deadline;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(const OfiOptions& options, std::unique_ptr<Fabric> fabric);
  ~Core();

  Capabilities caps;

  void StartThread();
  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept);
  void Connect(const std::string& address, ConnectHandler on_done);
  void Shutdown();

  // Queues `fn` for the progress thread; false (fn dropped) once shut down.
  bool Post(std::function<void()> fn);
  bool OnThread() const { return std::this_thread::get_id() == thread_id_; }

  // Progress-thread side of the Connection methods.
  void StartLink(const std::shared_ptr<Link>& link, MessageHandler on_message,
                 CloseHandler on_closed);
  void SendOnLink(const std::shared_ptr<Link>& link, Message message, SendHandler on_sent,
                  Status precheck);
  void CloseLink(const std::shared_ptr<Link>& link, bool abort);

 private:
  void Loop();
  bool RunCommands();
  int DrainCompletions();
  bool RetryBlocked();
  void TickTimers();
  void WaitForWork(int idle_waits);
  void ShutdownOnThread();
  void Teardown();

  Result<std::string> ListenOnThread(const std::string& address, AcceptHandler on_accept);
  void ConnectOnThread(const std::string& address, ConnectHandler on_done);
  Result<EndpointState*> ClientEndpoint();
  Result<EndpointState*> AddEndpoint(const char* node, const char* service);
  Result<fi_addr_t> AddressOf(EndpointState* endpoint, const std::vector<std::byte>& name);

  // Posting: ops that meet -FI_EAGAIN wait in blocked_ (in order) and are retried.
  void Submit(Op* op);
  void Unblock(Op* op);
  int PostOp(Op* op);
  void SendControl(EndpointState* endpoint, fi_addr_t peer, const ControlHeader& header,
                   uint32_t link_id, std::span<const std::byte> payload = {},
                   uint32_t connect_id = 0);
  void SendControl(Link& link, ControlType type, uint64_t seq = 0, uint64_t value = 0);

  void OnCompletion(Op* op, size_t len);
  void OnError(Op* op, const fi_cq_err_entry& error);
  void OnControl(Op* op, size_t len);
  void OnConnect(EndpointState* endpoint, const ControlHeader& header,
                 std::span<const std::byte> name);
  void OnAccept(const ControlHeader& header);
  Link* LinkFor(const Op* op, const ControlHeader& header);

  void Announce(Link& link);
  void OnCts(Link& link, uint64_t seq);
  void FinishSends(Link& link);
  // A message announced (RTS) or, with `inline_bytes`, arrived whole (kData).
  void OnRts(Link& link, uint64_t seq, uint64_t size,
             std::optional<std::span<const std::byte>> inline_bytes);
  void Grant(Link& link);
  void Deliver(Link& link);
  void MaybeEndAfterPeer(Link& link);
  void FailConnect(uint32_t connect_id, Status status);
  // Ends the link: pending sends fail with `send_status`, the peer is told
  // (GOODBYE/ABORT) unless `notify` is empty, on_closed(final) runs once started.
  void EndLink(Link& link, Status final_status, Status send_status,
               std::optional<ControlType> notify);
  void ReportClose(Link& link);
  Link* FindLink(uint32_t id);
  uint32_t NewId();

  template <typename F>
  void RunHandler(Link& link, F&& fn) {
    link.gate.Run(std::forward<F>(fn));
  }

  const OfiOptions options_;
  std::unique_ptr<Fabric> fabric_;
  std::shared_ptr<BufferPool> pool_;
  int wake_fd_ = -1;
  const bool named_;  // FI_ADDR_STR endpoints (shm): see LocalNames

  std::mutex mu_;  // guards the command queue and the flags next to it
  std::deque<std::function<void()>> commands_;
  bool accepting_ = true;
  bool shutdown_requested_ = false;
  bool sleeping_ = false;

  std::mutex join_mu_;
  std::thread thread_;
  std::thread::id thread_id_;

  // Progress thread only.
  bool stopping_ = false;
  std::vector<std::unique_ptr<EndpointState>> endpoints_;
  EndpointState* client_endpoint_ = nullptr;
  std::unordered_map<uint32_t, std::shared_ptr<Link>> links_;
  std::unordered_map<uint32_t, PendingConnect> connects_;
  struct Abandoned {
    EndpointState* endpoint;
    fi_addr_t peer;
    Clock::time_point since;
  };
  std::unordered_map<uint32_t, Abandoned> abandoned_;  // connects that failed, by id
  std::unordered_set<Op*> ops_;                        // every op posted or blocked, owned here
  // Ops that met -FI_EAGAIN, per (endpoint, peer): order matters only per peer,
  // and a peer that cannot take sends (rxm reconnecting, a dead shm name) must not
  // hold up the others.
  std::map<std::pair<EndpointState*, fi_addr_t>, std::deque<Op*>> blocked_;
  uint32_t next_id_;
  Clock::time_point next_tick_;
};

class OfiConnection final : public Connection {
 public:
  OfiConnection(std::shared_ptr<Core> core, std::shared_ptr<Link> link)
      : core_(std::move(core)), link_(std::move(link)) {}
  ~OfiConnection() override {
    core_->Post([core = core_.get(), link = link_] { core->CloseLink(link, /*abort=*/false); });
    link_->gate.Close();
  }

  void Start(MessageHandler on_message, CloseHandler on_closed) override {
    core_->Post([core = core_.get(), link = link_, m = std::move(on_message),
                 c = std::move(on_closed)]() mutable {
      core->StartLink(link, std::move(m), std::move(c));
    });
  }

  void Send(Message message, SendHandler on_sent) override {
    Status precheck;
    uint64_t bytes = 0;
    if (!message) {
      precheck = Status::InvalidArgument("null message");
    } else if (message->size() > core_->caps.max_message_bytes) {
      precheck = Status::InvalidArgument("message of " + std::to_string(message->size()) +
                                         " bytes exceeds max_message_bytes " +
                                         std::to_string(core_->caps.max_message_bytes));
    } else {
      bytes = message->size();
    }
    link_->queued_bytes += bytes;
    const bool posted = core_->Post([core = core_.get(), link = link_, m = std::move(message),
                                     s = std::move(on_sent), p = std::move(precheck)]() mutable {
      core->SendOnLink(link, std::move(m), std::move(s), std::move(p));
    });
    if (!posted) link_->queued_bytes -= bytes;
  }

  uint64_t QueuedBytes() const override { return link_->queued_bytes.load(); }

  void Close() override {
    core_->Post([core = core_.get(), link = link_] { core->CloseLink(link, /*abort=*/false); });
  }
  void Abort() override {
    core_->Post([core = core_.get(), link = link_] { core->CloseLink(link, /*abort=*/true); });
  }

  std::string PeerAddress() const override { return link_->peer_address; }

 private:
  // Shared: the core must outlive every connection it handed out (they may
  // outlive the Transport), and the link is shared with the core's table.
  const std::shared_ptr<Core> core_;
  const std::shared_ptr<Link> link_;
};

// ---------------------------------------------------------------------------
// Setup, commands and the progress loop.

Core::Core(const OfiOptions& options, std::unique_ptr<Fabric> fabric)
    : options_(options),
      fabric_(std::move(fabric)),
      pool_(std::make_shared<BufferPool>()),
      named_(fabric_->info().addr_format == FI_ADDR_STR),
      next_id_(static_cast<uint32_t>(std::random_device{}() | 1)) {
  caps.backend = "ofi";
  caps.ordered = true;
  caps.memory_types = {MemoryType::kHost};
  caps.max_message_bytes = options.max_message_bytes;
  caps.streams_per_link = 1;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (named_) {
    std::unique_lock lock(Local().mu);
    ++Local().live_cores;
  }
}

Core::~Core() {
  // Only the thread itself can be here with the thread still joinable.
  if (thread_.joinable()) thread_.detach();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void Core::StartThread() {
  std::lock_guard lock(join_mu_);
  // The thread holds the core: a handler may drop the last other reference.
  thread_ = std::thread([self = shared_from_this()] { self->Loop(); });
  thread_id_ = thread_.get_id();
}

bool Core::Post(std::function<void()> fn) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (!accepting_) return false;
    commands_.push_back(std::move(fn));
    wake = sleeping_;
  }
  if (wake) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  return true;
}

void Core::Shutdown() {
  bool first = false;
  {
    std::lock_guard lock(mu_);
    if (!shutdown_requested_) {
      shutdown_requested_ = true;
      first = true;
    }
  }
  if (first) {
    // Bypasses Post's accepting_ check on purpose: this is the last command.
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      commands_.push_back([this] { ShutdownOnThread(); });
      wake = sleeping_;
    }
    if (wake) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    }
  }
  if (OnThread()) return;  // from a handler: the loop finishes after it returns
  std::lock_guard lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool Core::RunCommands() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard lock(mu_);
    batch.swap(commands_);
  }
  for (auto& fn : batch) {
    fn();
    fn = nullptr;
  }
  return !batch.empty();
}

void Core::Loop() {
  auto last_work = Clock::now();
  int idle_waits = 0;
  while (!stopping_) {
    bool work = RunCommands();
    if (stopping_) break;
    work |= DrainCompletions() > 0;
    work |= RetryBlocked();
    const auto now = Clock::now();
    if (now >= next_tick_) TickTimers();
    if (work) {
      last_work = now;
      idle_waits = 0;
      continue;
    }
    if (now - last_work < kSpinTime) continue;
    WaitForWork(idle_waits++);
  }
  Teardown();
}

void Core::WaitForWork(int idle_waits) {
  {
    std::lock_guard lock(mu_);
    if (!commands_.empty()) return;
    sleeping_ = true;
  }
  const auto until_tick =
      std::chrono::duration_cast<std::chrono::microseconds>(next_tick_ - Clock::now());
  auto timeout = std::max(std::chrono::microseconds(0), until_tick);
  // Blocked posts clear as the provider progresses: look again within 1 ms.
  if (!blocked_.empty()) timeout = std::min(timeout, std::chrono::microseconds(1000));
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {fabric_->wait_fd(), POLLIN, 0}};
  nfds_t nfds = 1;
  bool wait = true;
  if (fabric_->wait_fd() >= 0) {
    fid* cq = &fabric_->cq()->fid;
    // fi_trywait makes progress and says whether blocking on the fd is safe.
    if (fi_trywait(fabric_->fabric(), &cq, 1) == FI_SUCCESS) {
      nfds = 2;
    } else {
      wait = false;
    }
  } else {
    // No wait object: back off 50 us, 100 us, ... up to 1 ms.
    const auto backoff = std::chrono::microseconds(50 << std::min(idle_waits, 5));
    timeout = std::min(timeout, std::min(backoff, std::chrono::microseconds(1000)));
  }
  if (wait) {
    timespec ts{};
    ts.tv_sec = timeout.count() / 1000000;
    ts.tv_nsec = (timeout.count() % 1000000) * 1000;
    ppoll(fds, nfds, &ts, nullptr);
  }
  {
    std::lock_guard lock(mu_);
    sleeping_ = false;
  }
  uint64_t drained;
  [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof(drained));
}

int Core::DrainCompletions() {
  int handled = 0;
  fi_cq_tagged_entry entries[32];
  while (true) {
    ssize_t n;
    {
      std::shared_lock<std::shared_mutex> lock;
      if (named_) lock = std::shared_lock(Local().mu);
      n = fi_cq_read(fabric_->cq(), entries, 32);
    }
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        OnCompletion(static_cast<Op*>(entries[i].op_context), entries[i].len);
      }
      handled += static_cast<int>(n);
      if (n < 32 || stopping_) break;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (fi_cq_readerr(fabric_->cq(), &error, 0) > 0) {
        OnError(static_cast<Op*>(error.op_context), error);
        ++handled;
        continue;
      }
    }
    break;
  }
  return handled;
}

void Core::TickTimers() {
  const auto now = Clock::now();
  const auto keepalive_every = options_.peer_timeout / 4;
  next_tick_ = now + std::clamp(keepalive_every / 2, milliseconds(5), milliseconds(100));
  std::vector<uint32_t> expired;
  for (auto& [id, pending] : connects_) {
    if (now >= pending.deadline) expired.push_back(id);
  }
  for (uint32_t id : expired) {
    // Unavailable, not Timeout: RDM providers retry a refused connection silently
    // (rxm does), so a closed address and a dead host both look like silence.
    FailConnect(id, Status::Unavailable("no ofi listener answered at " + connects_[id].address +
                                        " within " +
                                        std::to_string(options_.connect_timeout.count()) + " ms"));
  }
  std::erase_if(abandoned_, [&](const auto& entry) {
    return now - entry.second.since > options_.connect_timeout + options_.peer_timeout;
  });
  std::vector<std::shared_ptr<Link>> links;
  for (auto& [id, link] : links_) links.push_back(link);
  for (auto& link : links) {
    if (link->ended) continue;
    // A peer that said GOODBYE/ABORT is silent on purpose.
    if (!link->peer_ended && now - link->last_heard > options_.peer_timeout) {
      EndLink(*link,
              Status::Unavailable("no word from peer " + link->peer_address + " for " +
                                  std::to_string(options_.peer_timeout.count()) + " ms"),
              Status::Unavailable("peer " + link->peer_address + " timed out"),
              ControlType::kAbort);
    } else if (!link->peer_ended && now - link->last_said > keepalive_every) {
      SendControl(*link, ControlType::kKeepalive);
    }
  }
}

void Core::ShutdownOnThread() {
  {
    std::lock_guard lock(mu_);
    accepting_ = false;
  }
  RunCommands();  // what was queued before Shutdown still happens, then aborts
  std::vector<std::shared_ptr<Link>> links;
  for (auto& [id, link] : links_) links.push_back(link);
  for (auto& link : links) {
    EndLink(*link, Status::Aborted("transport shut down"), Status::Aborted("transport shut down"),
            ControlType::kAbort);
  }
  std::vector<uint32_t> connects;
  for (auto& [id, pending] : connects_) connects.push_back(id);
  for (uint32_t id : connects) FailConnect(id, Status::Aborted("transport shut down"));
  for (auto& endpoint : endpoints_) endpoint->on_accept = nullptr;
  stopping_ = true;
}

void Core::Teardown() {
  // Let the ABORTs leave: wait until no control send is outstanding (bounded).
  const auto deadline = Clock::now() + kShutdownFlush;
  auto control_sends_left = [&] {
    for (Op* op : ops_) {
      if (op->kind == OpKind::kControlSend) return true;
    }
    return false;
  };
  while (control_sends_left() && Clock::now() < deadline) {
    RetryBlocked();
    if (DrainCompletions() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  links_.clear();
  blocked_.clear();
  Resources resources{std::move(fabric_), std::move(endpoints_), {}};
  for (Op* op : ops_) resources.ops.emplace_back(op);
  ops_.clear();
  if (!named_) return;  // destroying `resources` closes everything: no completion after this
  // shm: another transport of this process may still hold a mapping of these
  // regions and touch it in its own progress; keep them until the last one is done.
  std::vector<Resources> bury;
  {
    std::unique_lock lock(Local().mu);
    for (auto& endpoint : resources.endpoints) {
      const auto& name = endpoint->endpoint->name();
      Local().live.erase(std::string(reinterpret_cast<const char*>(name.data()), name.size()));
    }
    Local().graveyard.push_back(std::move(resources));
    if (--Local().live_cores == 0) bury.swap(Local().graveyard);
  }
}

// ---------------------------------------------------------------------------
// Endpoints, Listen, Connect.

Result<EndpointState*> Core::AddEndpoint(const char* node, const char* service) {
  auto endpoint = Endpoint::Open(*fabric_, node, service);
  if (!endpoint.ok()) return endpoint.status();
  auto state = std::make_unique<EndpointState>();
  state->endpoint = std::move(endpoint).value();
  EndpointState* raw = state.get();
  if (named_) {
    const auto& name = raw->endpoint->name();
    std::unique_lock lock(Local().mu);
    Local().live.emplace(reinterpret_cast<const char*>(name.data()), name.size());
    Local().ever.emplace(reinterpret_cast<const char*>(name.data()), name.size());
  }
  endpoints_.push_back(std::move(state));
  for (size_t i = 0; i < kControlRecvsPerEndpoint; ++i) {
    Op* op = new Op();
    op->kind = OpKind::kControlRecv;
    op->endpoint = raw;
    op->control.resize(kControlBufferBytes);
    ops_.insert(op);
    Submit(op);
  }
  return raw;
}

Result<EndpointState*> Core::ClientEndpoint() {
  if (client_endpoint_) return client_endpoint_;
  auto endpoint = AddEndpoint(nullptr, nullptr);
  if (!endpoint.ok()) return endpoint.status();
  client_endpoint_ = *endpoint;
  return client_endpoint_;
}

Result<fi_addr_t> Core::AddressOf(EndpointState* endpoint, const std::vector<std::byte>& name) {
  const std::string key(reinterpret_cast<const char*>(name.data()), name.size());
  auto it = endpoint->addresses.find(key);
  if (it != endpoint->addresses.end()) return it->second;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int rc = fi_av_insert(endpoint->endpoint->av(), name.data(), 1, &addr, 0, nullptr);
  if (rc != 1) return OfiStatus(rc < 0 ? rc : -FI_EADDRNOTAVAIL, "fi_av_insert");
  endpoint->addresses.emplace(key, addr);
  endpoint->names.emplace(addr, key);
  return addr;
}

Result<std::string> Core::Listen(const std::string& address, AcceptHandler on_accept) {
  if (OnThread()) return ListenOnThread(address, std::move(on_accept));
  auto promise = std::make_shared<std::promise<Result<std::string>>>();
  auto future = promise->get_future();
  if (!Post([this, promise, address, a = std::move(on_accept)]() mutable {
        promise->set_value(ListenOnThread(address, std::move(a)));
      })) {
    return Status::FailedPrecondition("ofi transport is shut down");
  }
  return future.get();
}

Result<std::string> Core::ListenOnThread(const std::string& address, AcceptHandler on_accept) {
  if (stopping_) return Status::FailedPrecondition("ofi transport is shut down");
  Result<EndpointState*> endpoint = Status::Internal("unset");
  if (fabric_->info().addr_format == FI_ADDR_STR) {
    // Named endpoints (shm): the address is the name; "" or a ":0" suffix picks one.
    std::string name = address;
    if (name.empty() || name.ends_with(":0")) {
      static std::atomic<uint64_t> counter{0};
      name = (name.empty() ? std::string("deltacast") : name.substr(0, name.size() - 2)) + "-" +
             std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(NewId());
    }
    endpoint = AddEndpoint(name.c_str(), nullptr);
  } else {
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return host_port.status();
    const std::string service = std::to_string(host_port->port);
    endpoint = AddEndpoint(host_port->host.c_str(), service.c_str());
  }
  if (!endpoint.ok()) {
    return Status(endpoint.status().code(),
                  "listening on \"" + address + "\": " + endpoint.status().message());
  }
  (*endpoint)->on_accept = std::move(on_accept);
  std::string bound =
      NameToAddress((*endpoint)->endpoint->addr_format(), (*endpoint)->endpoint->name());
  if (bound.empty()) return Status::Internal("ofi: cannot print the bound endpoint name");
  return bound;
}

void Core::Connect(const std::string& address, ConnectHandler on_done) {
  Post([this, address, d = std::move(on_done)]() mutable {
    ConnectOnThread(address, std::move(d));
  });
}

void Core::ConnectOnThread(const std::string& address, ConnectHandler on_done) {
  if (stopping_) return on_done(Status::Aborted("transport shut down"));
  auto endpoint = ClientEndpoint();
  if (!endpoint.ok()) return on_done(endpoint.status());
  fi_addr_t peer = FI_ADDR_UNSPEC;
  if ((*endpoint)->endpoint->addr_format() == FI_ADDR_STR) {
    std::vector<std::byte> name(address.size() + 1);
    std::memcpy(name.data(), address.c_str(), address.size() + 1);
    auto addr = AddressOf(*endpoint, name);
    if (!addr.ok()) return on_done(Status::Unavailable(addr.status().message()));
    peer = *addr;
  } else {
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return on_done(host_port.status());
    const std::string service = std::to_string(host_port->port);
    const int rc = fi_av_insertsvc((*endpoint)->endpoint->av(), host_port->host.c_str(),
                                   service.c_str(), &peer, 0, nullptr);
    if (rc != 1) {
      return on_done(Status::Unavailable(
          OfiStatus(rc < 0 ? rc : -FI_EADDRNOTAVAIL, "resolving " + address).message()));
    }
  }
  const uint32_t id = NewId();
  connects_[id] = PendingConnect{std::move(on_done), address, *endpoint, peer,
                                 Clock::now() + options_.connect_timeout};
  ControlHeader header;
  header.type = ControlType::kConnect;
  header.src_id = id;
  const auto& name = (*endpoint)->endpoint->name();
  SendControl(*endpoint, peer, header, 0, name, id);
}

void Core::FailConnect(uint32_t connect_id, Status status) {
  auto it = connects_.find(connect_id);
  if (it == connects_.end()) return;
  ConnectHandler on_done = std::move(it->second.on_done);
  abandoned_[connect_id] = {it->second.endpoint, it->second.peer, Clock::now()};
  connects_.erase(it);
  // A CONNECT the provider never took would be retried forever: drop it.
  std::vector<Op*> stale;
  for (Op* op : ops_) {
    if (op->connect_id == connect_id) op->connect_id = 0;
  }
  for (auto& [key, queue] : blocked_) {
    for (Op* op : queue) {
      if (op->kind == OpKind::kControlSend && op->connect_id == 0 && op->link_id == 0 &&
          DecodeControl(op->control)->type == ControlType::kConnect) {
        stale.push_back(op);
      }
    }
  }
  for (Op* op : stale) {
    Unblock(op);
    ops_.erase(op);
    delete op;
  }
  on_done(std::move(status));
}

// ---------------------------------------------------------------------------
// Posting operations.

int Core::PostOp(Op* op) {
  std::shared_lock<std::shared_mutex> lock;
  if (named_) {
    lock = std::shared_lock(Local().mu);
    if (op->kind == OpKind::kControlSend || op->kind == OpKind::kDataSend) {
      auto name = op->endpoint->names.find(op->peer);
      if (name != op->endpoint->names.end() && Local().ever.count(name->second) &&
          !Local().live.count(name->second)) {
        return -FI_ECONNREFUSED;
      }
    }
  }
  fid_ep* ep = op->endpoint->endpoint->ep();
  switch (op->kind) {
    case OpKind::kControlRecv:
      return static_cast<int>(
          fi_recv(ep, op->control.data(), op->control.size(), nullptr, FI_ADDR_UNSPEC, op));
    case OpKind::kControlSend:
      return static_cast<int>(
          fi_send(ep, op->control.data(), op->control.size(), nullptr, op->peer, op));
    case OpKind::kDataSend:
      return static_cast<int>(
          fi_tsend(ep, op->message->data(), op->message->size(), nullptr, op->peer, op->tag, op));
    case OpKind::kDataRecv:
      return static_cast<int>(fi_trecv(ep, op->receive->data(), op->receive->size(), nullptr,
                                       FI_ADDR_UNSPEC, op->tag, 0, op));
  }
  return -FI_EINVAL;
}

void Core::Submit(Op* op) {
  ops_.insert(op);
  const auto key = std::make_pair(op->endpoint, op->peer);
  auto it = blocked_.find(key);
  if (it == blocked_.end()) {
    const int rc = PostOp(op);
    if (rc == 0) return;
    if (rc != -FI_EAGAIN) {
      fi_cq_err_entry error{};
      error.op_context = op;
      error.err = -rc;
      OnError(op, error);
      return;
    }
  }
  blocked_[key].push_back(op);  // keeps posting order behind earlier blocked ops
}

bool Core::RetryBlocked() {
  bool any = false;
  for (auto it = blocked_.begin(); it != blocked_.end();) {
    auto& queue = it->second;
    while (!queue.empty()) {
      Op* op = queue.front();
      const int rc = PostOp(op);
      if (rc == -FI_EAGAIN) break;
      queue.pop_front();
      any = true;
      if (rc != 0) {
        fi_cq_err_entry error{};
        error.op_context = op;
        error.err = -rc;
        OnError(op, error);
        break;  // OnError may have changed blocked_
      }
    }
    if (queue.empty()) {
      it = blocked_.erase(it);
    } else {
      ++it;
    }
    if (any) break;  // restart next round: OnError/handlers may have edited the map
  }
  return any;
}

void Core::Unblock(Op* op) {
  auto it = blocked_.find({op->endpoint, op->peer});
  if (it == blocked_.end()) return;
  std::erase(it->second, op);
  if (it->second.empty()) blocked_.erase(it);
}

void Core::SendControl(EndpointState* endpoint, fi_addr_t peer, const ControlHeader& header,
                       uint32_t link_id, std::span<const std::byte> payload, uint32_t connect_id) {
  Op* op = new Op();
  op->kind = OpKind::kControlSend;
  op->endpoint = endpoint;
  op->peer = peer;
  op->link_id = link_id;
  op->connect_id = connect_id;
  op->control = EncodeControl(header, payload);
  Submit(op);
}

void Core::SendControl(Link& link, ControlType type, uint64_t seq, uint64_t value) {
  ControlHeader header{type, link.remote_id, link.id, seq, value};
  link.last_said = Clock::now();
  // ABORT/GOODBYE are sent after the link ended: their errors concern nobody.
  const bool final = type == ControlType::kGoodbye || type == ControlType::kAbort;
  SendControl(link.endpoint, link.peer, header, final ? 0 : link.id);
}

// ---------------------------------------------------------------------------
// Completions.

void Core::OnCompletion(Op* op, size_t len) {
  switch (op->kind) {
    case OpKind::kControlRecv:
      if (stopping_) return;
      OnControl(op, len);
      Submit(op);  // repost the same buffer
      return;
    case OpKind::kControlSend:
      if (!op->message) break;
      [[fallthrough]];  // an inline message: handed over now
    case OpKind::kDataSend:
      if (Link* link = FindLink(op->link_id); link && !link->ended) {
        for (PendingSend& send : link->sends) {
          if (send.seq != op->seq || send.done) continue;
          send.done = true;
          FinishSends(*link);
          break;
        }
      }
      break;
    case OpKind::kDataRecv:
      if (Link* link = FindLink(op->link_id); link && !link->ended) {
        auto it = link->incoming.find(op->seq);
        if (it != link->incoming.end()) {
          link->last_heard = Clock::now();
          if (len != it->second.size) {
            EndLink(*link,
                    Status::Corrupt("message " + std::to_string(op->seq) + " arrived with " +
                                    std::to_string(len) + " bytes, announced " +
                                    std::to_string(it->second.size)),
                    Status::Unavailable("link broke"), ControlType::kAbort);
            break;
          }
          it->second.complete = true;
          it->second.op = nullptr;
          it->second.bytes = std::move(op->receive);
          Deliver(*link);
        }
      }
      break;
  }
  ops_.erase(op);
  delete op;
}

void Core::OnError(Op* op, const fi_cq_err_entry& error) {
  const Status status = OfiStatus(-error.err, "ofi operation failed");
  if (op->kind == OpKind::kControlRecv) {
    if (!stopping_ && error.err != FI_ECANCELED) Submit(op);
    return;
  }
  if (!stopping_ && error.err != FI_ECANCELED) {
    if (op->connect_id != 0) {
      FailConnect(op->connect_id, Status::Unavailable("connecting: " + status.message()));
    }
    Link* link = FindLink(op->link_id);
    // A peer that said GOODBYE/ABORT may be gone: failing to answer it is expected.
    if (link && link->peer_ended && op->kind == OpKind::kControlSend) link = nullptr;
    if (link && !link->ended) {
      const bool truncated = error.err == FI_ETRUNC;
      Status final = truncated
                         ? Status::Corrupt("peer sent more than it announced: " + status.message())
                         : Status::Unavailable("link to " + link->peer_address +
                                               " broke: " + status.message());
      EndLink(*link, final, Status::Unavailable(final.message()), ControlType::kAbort);
    }
  }
  ops_.erase(op);
  Unblock(op);
  delete op;
}

Link* Core::FindLink(uint32_t id) {
  if (id == 0) return nullptr;
  auto it = links_.find(id);
  return it == links_.end() ? nullptr : it->second.get();
}

Link* Core::LinkFor(const Op* op, const ControlHeader& header) {
  Link* link = FindLink(header.dst_id);
  if (!link || link->endpoint != op->endpoint || link->remote_id != header.src_id) return nullptr;
  return link;
}

void Core::OnControl(Op* op, size_t len) {
  std::span<const std::byte> bytes(op->control.data(), std::min(len, op->control.size()));
  auto header = DecodeControl(bytes);
  if (!header) return;  // not ours: ignore
  switch (header->type) {
    case ControlType::kConnect:
      return OnConnect(op->endpoint, *header, bytes.subspan(kHeaderBytes));
    case ControlType::kAccept:
      return OnAccept(*header);
    default:
      break;
  }
  Link* link = LinkFor(op, *header);
  if (!link || link->ended) return;
  link->last_heard = Clock::now();
  switch (header->type) {
    case ControlType::kRts:
      return OnRts(*link, header->seq, header->value, std::nullopt);
    case ControlType::kData:
      return OnRts(*link, header->seq, header->value, bytes.subspan(kHeaderBytes));
    case ControlType::kCts:
      return OnCts(*link, header->seq);
    case ControlType::kGoodbye:
    case ControlType::kAbort:
      if (link->peer_ended) return;
      link->peer_ended = true;
      link->peer_status =
          header->type == ControlType::kGoodbye
              ? Status::Ok()
              : Status::Unavailable("peer " + link->peer_address + " aborted the link");
      // Only announced messages can have been sent OK.
      link->peer_count = std::min(header->value, link->announced_by_peer);
      return MaybeEndAfterPeer(*link);
    default:
      return;
  }
}

void Core::OnConnect(EndpointState* endpoint, const ControlHeader& header,
                     std::span<const std::byte> name_bytes) {
  if (!endpoint->on_accept || name_bytes.empty()) return;
  std::vector<std::byte> name(name_bytes.begin(), name_bytes.end());
  auto peer = AddressOf(endpoint, name);
  if (!peer.ok()) {
    log::Warn("ofi: cannot reach a connecting peer: " + peer.status().ToString());
    return;
  }
  auto link = std::make_shared<Link>();
  link->id = NewId();
  link->remote_id = header.src_id;
  link->endpoint = endpoint;
  link->peer = *peer;
  link->peer_address = NameToAddress(endpoint->endpoint->addr_format(), name);
  link->last_heard = link->last_said = Clock::now();
  links_[link->id] = link;
  SendControl(*link, ControlType::kAccept);
  endpoint->on_accept(std::make_unique<OfiConnection>(shared_from_this(), link));
}

void Core::OnAccept(const ControlHeader& header) {
  auto it = connects_.find(header.dst_id);
  if (it == connects_.end()) {
    // A connect we gave up on reached its listener late: break that link.
    auto gave_up = abandoned_.find(header.dst_id);
    if (gave_up != abandoned_.end()) {
      ControlHeader abort{ControlType::kAbort, header.src_id, header.dst_id, 0, 0};
      SendControl(gave_up->second.endpoint, gave_up->second.peer, abort, 0);
      abandoned_.erase(gave_up);
    }
    return;
  }
  PendingConnect pending = std::move(it->second);
  connects_.erase(it);
  auto link = std::make_shared<Link>();
  link->id = header.dst_id;
  link->remote_id = header.src_id;
  link->endpoint = pending.endpoint;
  link->peer = pending.peer;
  link->peer_address = pending.address;
  link->last_heard = link->last_said = Clock::now();
  links_[link->id] = link;
  pending.on_done(
      std::unique_ptr<Connection>(std::make_unique<OfiConnection>(shared_from_this(), link)));
}

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
    op->control = EncodeControl({ControlType::kData, link.remote_id, link.id, send.seq, send.bytes},
                                *send.message);
    link.last_said = Clock::now();
    Submit(op);
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
    std::memcpy(in.bytes->data(), inline_bytes->data(), size);
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
    in.granted = true;
    link.granted_bytes += in.size;
    if (in.complete) {
      completed_now = true;  // inline: nothing to receive, just answer
    } else if (in.size == 0) {
      in.complete = true;
      completed_now = true;
      in.bytes = std::make_unique<std::vector<std::byte>>();
    } else {
      Op* op = new Op();
      op->kind = OpKind::kDataRecv;
      op->endpoint = link.endpoint;
      op->peer = link.peer;
      op->link_id = link.id;
      op->seq = link.next_grant;
      op->tag = DataTag(link.id, link.next_grant);
      op->receive = pool_->Acquire(in.size);
      in.op = op;
      Submit(op);  // the receive is posted before the CTS leaves
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

}  // namespace
}  // namespace ofi

Result<std::unique_ptr<Transport>> MakeOfiTransport(const OfiOptions& options) {
  if (options.max_message_bytes == 0) {
    return Status::InvalidArgument("ofi: max_message_bytes must be positive");
  }
  if (options.connect_timeout <= std::chrono::milliseconds(0) ||
      options.peer_timeout < std::chrono::milliseconds(20)) {
    return Status::InvalidArgument("ofi: connect_timeout must be positive, peer_timeout >= 20 ms");
  }
  auto fabric = ofi::Fabric::Open(options.provider);
  if (!fabric.ok()) return fabric.status();
  log::Debug("ofi: provider " + (*fabric)->provider_name() + ", idle progress " +
             ((*fabric)->wait_fd() >= 0 ? "blocks on the CQ wait fd" : "backs off (no wait fd)"));
  static std::once_flag logged;
  std::call_once(logged, [&] {
    auto hmem = ofi::GetRdmInfo((*fabric)->provider_name(), nullptr, nullptr, false, FI_HMEM);
    log::Info("ofi: provider " + (*fabric)->provider_name() +
              (hmem.ok() ? " reports FI_HMEM" : " has no FI_HMEM") +
              "; CUDA device memory is not supported by this backend here (host memory only)");
  });
  auto core = std::make_shared<ofi::Core>(options, std::move(fabric).value());
  core->StartThread();
  return std::unique_ptr<Transport>(
      std::make_unique<internal::CoreTransport<ofi::Core>>(std::move(core)));
}

}  // namespace deltacast::transport
