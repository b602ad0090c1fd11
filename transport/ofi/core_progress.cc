// The progress thread: commands, the wait, posting, completions, teardown.
#include <poll.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "transport/ofi/connection.h"
#include "transport/ofi/core.h"

namespace deltacast::transport::ofi {

LocalNames& Local() {
  static LocalNames* names = new LocalNames();  // never destroyed: used at exit
  return *names;
}

// ---------------------------------------------------------------------------
// Setup, commands and the progress loop.

Core::Core(const OfiOptions& options, std::unique_ptr<Fabric> fabric)
    : options_(options),
      fabric_(std::move(fabric)),
      pool_(std::make_shared<BufferPool>()),
      named_(fabric_->info().addr_format == FI_ADDR_STR),
      mr_required_(fabric_->needs_local_mr()),
      register_(mr_required_ || options.register_memory == OfiRegistration::kAlways),
      next_id_(static_cast<uint32_t>(std::random_device{}() | 1)) {
  caps.backend = "ofi";
  caps.ordered = true;
  caps.memory_types = {MemoryType::kHost};
  caps.max_message_bytes = options.max_message_bytes;
  caps.streams_per_link = 1;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  auto register_fn = [this](const void* data, size_t size) { return Register(data, size); };
  mr_cache_ = std::make_unique<MrCache>(options.mr_cache_bytes, register_fn);
  if (register_) pool_->EnableRegistration(register_fn);
  if (named_) {
    LocalNames& local = Local();
    WriterMutexLock lock(local.mu);
    ++local.live_cores;
  }
}

Core::~Core() {
  // Only the thread itself can be here with the thread still joinable.
  if (thread_.joinable()) thread_.detach();
  if (wake_fd_ >= 0) close(wake_fd_);
}

Result<MemoryRegion> Core::Register(const void* data, size_t size) {
  auto mr = fabric_->Register(data, size);
  if (mr.ok()) registrations_.fetch_add(1, std::memory_order_relaxed);
  return mr;
}

OfiStats Core::Stats() const {
  OfiStats stats;
  stats.registers_memory = register_;
  stats.provider_requires_mr = mr_required_;
  stats.registrations = registrations_.load(std::memory_order_relaxed);
  stats.control_registrations = control_registrations_.load(std::memory_order_relaxed);
  stats.receive_registrations = pool_->registrations();
  const MrCacheStats cache = mr_cache_->stats();
  stats.send_cache_hits = cache.hits;
  stats.send_cache_misses = cache.misses;
  stats.send_cache_evictions = cache.evictions;
  stats.send_cache_released = cache.released;
  stats.send_cache_entries = cache.entries;
  stats.send_cache_bytes = cache.cached_bytes;
  stats.forwarded_sends = pool_->forwarded_sends();
  return stats;
}

void Core::StartThread() {
  MutexLock lock(join_mu_);
  // The thread holds the core: a handler may drop the last other reference.
  thread_ = std::thread([self = shared_from_this()] { self->Loop(); });
  thread_id_ = thread_.get_id();
}

bool Core::Post(std::function<void()> fn) {
  bool wake = false;
  {
    MutexLock lock(mu_);
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
    MutexLock lock(mu_);
    if (!shutdown_requested_) {
      shutdown_requested_ = true;
      first = true;
    }
  }
  if (first) {
    // Bypasses Post's accepting_ check on purpose: this is the last command.
    bool wake = false;
    {
      MutexLock lock(mu_);
      commands_.push_back([this] { ShutdownOnThread(); });
      wake = sleeping_;
    }
    if (wake) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
    }
  }
  if (OnThread()) return;  // from a handler: the loop finishes after it returns
  MutexLock lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool Core::RunCommands() {
  std::deque<std::function<void()>> batch;
  {
    MutexLock lock(mu_);
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
    work |= FailDeferred();
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
    MutexLock lock(mu_);
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
    MutexLock lock(mu_);
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
    if (named_) {
      ReaderMutexLock lock(Local().mu);
      n = fi_cq_read(fabric_->cq(), entries, 32);
    } else {
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

bool Core::FailDeferred() {
  if (failed_.empty()) return false;
  std::vector<Op*> failed;
  failed.swap(failed_);
  for (Op* op : failed) {
    fi_cq_err_entry error{};
    error.op_context = op;
    error.err = op->post_error;
    OnError(op, error);
  }
  return true;
}

void Core::TickTimers() {
  const auto now = Clock::now();
  // Registrations of Messages nobody else holds any more, and MRs of buffers the
  // pool let go, are closed here (this thread owns the domain).
  mr_cache_->ReleaseUnused();
  pool_->CloseRetired();
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
    MutexLock lock(mu_);
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
    FailDeferred();
    if (DrainCompletions() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  links_.clear();
  blocked_.clear();
  failed_.clear();  // owned by ops_
  // MRs close before the domain: the cache's and the spare control buffers' now
  // (ops keep theirs until they are destroyed with `resources`, before the
  // fabric), the pool's including those of Messages the application still holds.
  mr_cache_->Clear();
  control_free_.clear();
  pool_->CloseRegistrations();
  Resources resources{std::move(fabric_), std::move(endpoints_), {}};
  for (Op* op : ops_) resources.ops.emplace_back(op);
  ops_.clear();
  if (!named_) return;  // destroying `resources` closes everything: no completion after this
  // shm: another transport of this process may still hold a mapping of these
  // regions and touch it in its own progress; keep them until the last one is done.
  std::vector<Resources> bury;
  {
    LocalNames& local = Local();
    WriterMutexLock lock(local.mu);
    for (auto& endpoint : resources.endpoints) {
      const auto& name = endpoint->endpoint->name();
      local.live.erase(std::string(reinterpret_cast<const char*>(name.data()), name.size()));
    }
    local.graveyard.push_back(std::move(resources));
    if (--local.live_cores == 0) bury.swap(local.graveyard);
  }
}

// ---------------------------------------------------------------------------
// Posting operations.

namespace {

// Hands `op` to libfabric; shm callers hold LocalNames::mu shared around it.
int PostToProvider(Op* op) {
  fid_ep* ep = op->endpoint->endpoint->ep();
  switch (op->kind) {
    case OpKind::kControlRecv:
      return static_cast<int>(
          fi_recv(ep, op->control.data(), op->control.size(), op->desc, FI_ADDR_UNSPEC, op));
    case OpKind::kControlSend:
      return static_cast<int>(
          fi_send(ep, op->control.data(), op->control.size(), op->desc, op->peer, op));
    case OpKind::kDataSend:
      return static_cast<int>(
          fi_tsend(ep, op->message->data(), op->message->size(), op->desc, op->peer, op->tag, op));
    case OpKind::kDataRecv:
      return static_cast<int>(fi_trecv(ep, op->receive.bytes->data(), op->receive.bytes->size(),
                                       op->desc, FI_ADDR_UNSPEC, op->tag, 0, op));
  }
  return -FI_EINVAL;
}

}  // namespace

int Core::PostOp(Op* op) {
  if (op->post_error != 0) return -op->post_error;
  if (!named_) return PostToProvider(op);
  LocalNames& local = Local();
  ReaderMutexLock lock(local.mu);
  if (op->kind == OpKind::kControlSend || op->kind == OpKind::kDataSend) {
    auto name = op->endpoint->names.find(op->peer);
    if (name != op->endpoint->names.end() && local.ever.count(name->second) &&
        !local.live.count(name->second)) {
      return -FI_ECONNREFUSED;
    }
  }
  return PostToProvider(op);
}

void Core::Submit(Op* op) {
  ops_.insert(op);
  if (op->post_error != 0) {
    failed_.push_back(op);  // fails from the loop: callers need not expect it inline
    return;
  }
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
        // OnError edits blocked_ (its Unblock erases an emptied entry, EndLink may
        // queue an ABORT here): settle this entry first, touch neither it nor
        // `queue` after, and restart next round.
        if (queue.empty()) blocked_.erase(it);
        fi_cq_err_entry error{};
        error.op_context = op;
        error.err = -rc;
        OnError(op, error);
        return true;
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
  FillControl(op, EncodeControl(header, payload));
  Submit(op);
}

void Core::FillControl(Op* op, std::vector<std::byte> encoded) {
  if (!register_) {
    op->control = std::move(encoded);
    return;
  }
  ControlBuffer buffer;
  if (!control_free_.empty() && control_free_.back().bytes.capacity() >= encoded.size()) {
    buffer = std::move(control_free_.back());
    control_free_.pop_back();
  } else {
    buffer.bytes.resize(std::max(kControlBufferBytes, encoded.size()));
    auto mr = Register(buffer.bytes.data(), buffer.bytes.size());
    if (!mr.ok()) {
      log::Warn("ofi: registering a control buffer: " + mr.status().ToString());
      op->control = std::move(encoded);
      if (mr_required_) op->post_error = FI_ENOMEM;
      return;
    }
    buffer.mr = std::move(mr).value();
    control_registrations_.fetch_add(1, std::memory_order_relaxed);
  }
  // Within capacity: the registered storage stays where it is.
  buffer.bytes.resize(encoded.size());
  std::memcpy(buffer.bytes.data(), encoded.data(), encoded.size());
  op->control = std::move(buffer.bytes);
  op->control_mr = std::move(buffer.mr);
  op->desc = op->control_mr.desc();
}

void Core::AttachSendRegistration(Op* op) {
  if (!register_) return;
  // A Message this transport received (a relay forwarding it): its pooled buffer
  // is registered already.
  if (void* desc = pool_->DescOf(op->message->data(), op->message->size())) {
    op->desc = desc;
    return;
  }
  auto registration = mr_cache_->Get(op->message);
  if (registration.ok()) {
    op->registration = std::move(registration).value();
    op->desc = op->registration->mr.desc();
    return;
  }
  log::Warn("ofi: registering a message to send: " + registration.status().ToString());
  if (mr_required_) op->post_error = FI_ENOMEM;  // else sent without a descriptor
}

void Core::FreeOp(Op* op) {
  if (op->kind == OpKind::kControlSend && op->control_mr && !stopping_ &&
      control_free_.size() < kMaxFreeControlBuffers) {
    control_free_.push_back({std::move(op->control), std::move(op->control_mr)});
  }
  if (!op->registration) {
    delete op;
    return;
  }
  const std::byte* data = op->message->data();
  const size_t size = op->message->size();
  delete op;
  // A Message sent and dropped by its caller is held by the cache alone now.
  mr_cache_->Release(data, size);
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
  FreeOp(op);
}

void Core::OnError(Op* op, const fi_cq_err_entry& error) {
  const Status status = OfiStatus(-error.err, "ofi operation failed");
  // FI_ECANCELED is not always our own fi_cancel: when a peer's connection drops,
  // tcp;ofi_rxm flushes what it had in flight on it (a rendezvous read into one
  // of our posted receives, a send) with FI_ECANCELED. Our cancels (EndLink) only
  // hit ops whose link_id is already 0, and never control receives. So a cancel
  // of an op that still belongs to a live link breaks that link like any other
  // error; were it skipped, the link would keep its Incoming::op pointing at the
  // op freed below, and the EndLink that peer_timeout brings later would write
  // through it (and fi_cancel it): a use-after-free.
  if (op->kind == OpKind::kControlRecv) {
    if (!stopping_) Submit(op);
    return;
  }
  if (!stopping_) {
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
  FreeOp(op);
}

size_t Core::CancelDataReceivesForTest() {
  size_t count = 0;
  for (Op* op : ops_) {
    if (op->kind != OpKind::kDataRecv) continue;
    fi_cancel(&op->endpoint->endpoint->ep()->fid, op);
    ++count;
  }
  return count;
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

}  // namespace deltacast::transport::ofi
