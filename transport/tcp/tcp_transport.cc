#include "transport/tcp/tcp_transport.h"

#include "common/thread_annotations.h"
#include "common/thread_name.h"
#include "transport/internal/tcp_core.h"

namespace deltacast::transport {
namespace tcp_internal {

Core::Core(const TcpOptions& opts) : options(opts), control(asio::make_strand(io)) {
  caps.backend = "tcp";
  caps.ordered = true;
  caps.memory_types = {MemoryType::kHost};
  caps.max_message_bytes = options.max_message_bytes;
  caps.streams_per_link = options.streams_per_link;
  work_.emplace(io.get_executor());
}

void Core::StartThreads() {
  asio::post(control, [self = shared_from_this()] { self->TrimPoolLater(); });
  for (size_t i = 0; i < options.io_threads; ++i) {
    // The thread keeps the core alive: it may be detached by a Shutdown called from
    // one of its own handlers.
    threads_.emplace_back([self = shared_from_this()] {
      NameThisThread("tcp-io");
      self->io.run();
    });
    thread_ids_.push_back(threads_.back().get_id());
  }
}

bool Core::Register(const std::shared_ptr<Link>& link) {
  MutexLock lock(mu_);
  if (closing_) return false;
  links_.emplace(link.get(), link);
  if (!link->inbound_host().empty()) ++links_by_host_[link->inbound_host()];
  return true;
}

void Core::Unregister(const Link* link) {
  MutexLock lock(mu_);
  if (links_.erase(link) == 0) return;
  if (!link->inbound_host().empty()) {
    auto it = links_by_host_.find(link->inbound_host());
    if (it != links_by_host_.end() && --it->second == 0) links_by_host_.erase(it);
  }
}

void Core::TrimPoolLater() {
  const auto period = std::max(std::chrono::milliseconds(100), options.receive_pool_idle / 2);
  trim_timer.expires_after(period);
  trim_timer.async_wait(
      asio::bind_executor(control, [self = shared_from_this()](const ErrorCode& ec) {
        if (ec || self->closing()) return;
        self->receive_pool->Trim();
        self->TrimPoolLater();
      }));
}

void Core::CloseControlState() {
  ErrorCode ignored;
  trim_timer.cancel();
  for (auto& listener : listeners) {
    listener->acceptor.close(ignored);
    listener->retry.cancel();
  }
  listeners.clear();
  FailPendingConnects(*this);
  for (auto& stream : std::set<std::shared_ptr<AcceptedStream>>(handshakes)) {
    DropHandshake(stream, "");
  }
  std::vector<std::shared_ptr<PendingLink>> pending;
  for (auto& [key, link] : pending_links) pending.push_back(link);
  for (auto& link : pending) DropPendingLink(link, "");
}

void Core::Shutdown() {
  MutexLock shutdown_lock(shutdown_mu_);
  if (shut_down_) return;
  std::vector<std::shared_ptr<Link>> links;
  {
    MutexLock lock(mu_);
    closing_ = true;
    for (auto& [raw, weak] : links_) {
      if (auto link = weak.lock()) links.push_back(std::move(link));
    }
  }
  Post(control, [self = shared_from_this()] { self->CloseControlState(); });
  for (auto& link : links) link->CloseForShutdown();
  links.clear();
  // With every socket closed and every timer cancelled, run() returns once the
  // resulting handlers (on_sent / on_closed with kAborted) have run.
  work_.reset();
  const bool on_io_thread = std::find(thread_ids_.begin(), thread_ids_.end(),
                                      std::this_thread::get_id()) != thread_ids_.end();
  for (auto& thread : threads_) {
    if (on_io_thread) {
      thread.detach();
    } else {
      thread.join();
    }
  }
  threads_.clear();
  {
    MutexLock lock(mu_);
    stopped_.store(true, std::memory_order_release);
  }
  if (!on_io_thread) {
    // Handlers posted between run() returning and `stopped_`: run them here so they
    // release what they hold; user handlers are suppressed (stopped_).
    io.restart();
    while (io.poll() > 0) {
    }
  }
  shut_down_ = true;
}

using TcpTransport = internal::CoreTransport<Core>;

}  // namespace tcp_internal

namespace {
using TcpTransport = internal::CoreTransport<tcp_internal::Core>;
}  // namespace

Result<std::unique_ptr<Transport>> MakeTcpTransport(const TcpOptions& options) {
  if (options.io_threads < 1 || options.io_threads > 256) {
    return Status::InvalidArgument("tcp transport: io_threads " +
                                   std::to_string(options.io_threads) + " outside 1..256");
  }
  if (options.streams_per_link < 1 || options.streams_per_link > kMaxStreamsPerLink) {
    return Status::InvalidArgument("tcp transport: streams_per_link " +
                                   std::to_string(options.streams_per_link) + " outside 1.." +
                                   std::to_string(kMaxStreamsPerLink));
  }
  if (options.connect_timeout.count() <= 0) {
    return Status::InvalidArgument("tcp transport: connect_timeout must be positive");
  }
  if (options.max_message_bytes == 0) {
    return Status::InvalidArgument("tcp transport: max_message_bytes must be positive");
  }
  if (options.socket_buffer_bytes < 0) {
    return Status::InvalidArgument("tcp transport: socket_buffer_bytes must not be negative");
  }
  if (options.max_pending_handshakes < 1 || options.max_handshakes_per_address < 1) {
    return Status::InvalidArgument(
        "tcp transport: max_pending_handshakes and max_handshakes_per_address must be >= 1");
  }
  if (options.receive_pool_idle.count() <= 0) {
    return Status::InvalidArgument("tcp transport: receive_pool_idle must be positive");
  }
  auto core = std::make_shared<tcp_internal::Core>(options);
  if (options.tls) {
    ASSIGN_OR_RETURN(core->tls, internal::MakeTlsContexts(*options.tls));
    core->caps.backend = "tcp";  // TLS is per link (PeerIdentity), not a capability
  }
  core->StartThreads();
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(std::move(core)));
}

}  // namespace deltacast::transport
