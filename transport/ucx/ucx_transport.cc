// The UCX backend's Core: the worker and its progress thread, listeners, endpoints
// and request bookkeeping (ucx_core.h); the facade and MakeUcxTransport.
#include "transport/ucx/ucx_transport.h"

#include <netdb.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "transport/internal/address.h"
#include "transport/internal/core_transport.h"
#include "transport/internal/link_connection.h"
#include "transport/ucx/ucx_core.h"

namespace deltacast::transport {
namespace ucx {
namespace {

constexpr auto kDeadlineCheckPeriod = std::chrono::milliseconds(5);
// After Shutdown force-closed every endpoint, how long the loop waits for UCX to
// confirm before destroying the worker anyway.
constexpr auto kShutdownGrace = std::chrono::seconds(2);

std::string SockaddrString(const sockaddr* addr, socklen_t length) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getnameinfo(addr, length, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "unknown";
  }
  return JoinHostPort(host, static_cast<uint16_t>(std::stoi(port)));
}

socklen_t SockaddrLength(const sockaddr_storage& storage) {
  return storage.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfo> Resolve(const std::string& address, bool passive) {
  ASSIGN_OR_RETURN(HostPort host_port, ParseHostPort(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  const int rc =
      getaddrinfo(host_port.host.c_str(), std::to_string(host_port.port).c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return Status::Unavailable("resolving " + address + ": " + gai_strerror(rc));
  }
  return AddrInfo(result);
}

}  // namespace

// ---- Core ----

Core::Core(const UcxOptions& opts, std::unique_ptr<UcxWorker> ucx_worker)
    : options(opts), ucx_(std::move(ucx_worker)) {
  caps.backend = options.tls.empty() ? "ucx" : "ucx(" + options.tls + ")";
  caps.ordered = true;
  caps.memory_types = {MemoryType::kHost};
  caps.max_message_bytes = options.max_message_bytes;
  caps.streams_per_link = 1;
}

Core::~Core() {
  if (thread_.joinable()) {
    if (OnThread()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
}

void Core::StartThread() {
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &Core::OnAm;
  am.arg = this;
  ucp_worker_set_am_recv_handler(ucx_->worker(), &am);
  // The thread keeps the core alive: a Shutdown called from a handler cannot join.
  thread_ = std::thread([self = shared_from_this()] {
    self->thread_id_.store(std::this_thread::get_id());
    self->Loop();
  });
  thread_id_.store(thread_.get_id());
}

bool Core::Post(std::function<void()> fn) {
  {
    MutexLock lock(post_mu_);
    if (!accepting_posts_) return false;
    posted_.push_back(std::move(fn));
    // Under the lock: Teardown destroys the worker once it has stopped posts, and
    // the loop may reach it the moment this command is queued.
    ucx_->Wake();
  }
  return true;
}

ucs_status_t Core::Submit(ucs_status_ptr_t ptr, RequestCtx* ctx) {
  if (ptr == nullptr) {
    delete ctx;
    return UCS_OK;
  }
  if (UCS_PTR_IS_ERR(ptr)) {
    delete ctx;
    return UCS_PTR_STATUS(ptr);
  }
  // A forced ep close may run callbacks before returning its request.
  if (!ctx->completed) live_.insert(ctx);
  return UCS_INPROGRESS;
}

void Core::Completed(RequestCtx* ctx, ucs_status_t status) {
  ctx->completed = true;
  live_.erase(ctx);
  Defer([this, ctx, status] {
    std::unique_ptr<RequestCtx> owned(ctx);
    switch (ctx->kind) {
      case RequestCtx::Kind::kSend:
        ctx->link->OnSendDone(ctx->seq, status);
        break;
      case RequestCtx::Kind::kRecv:
        ctx->link->OnRecvDone(ctx->seq, std::move(ctx->buffer), status);
        break;
      case RequestCtx::Kind::kControl:
        break;
      case RequestCtx::Kind::kEpClose:
        EpGone(ctx->ep);
        break;
    }
  });
}

void Core::Register(const std::shared_ptr<Link>& link, ucp_ep_h ep) {
  link->SetEp(ep);
  eps_[ep] = link;
  open_links_[link.get()] = link;
}

void Core::LinkClosed(const Link* link) { open_links_.erase(link); }

ucs_status_t Core::OnAm(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  auto* core = static_cast<Core*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
  auto it = core->eps_.find(param->reply_ep);
  if (it == core->eps_.end()) return UCS_OK;  // an endpoint we already closed
  std::shared_ptr<Link> link = it->second;
  const auto decoded = DecodeAmHeader(header, header_length);
  if (!decoded) {
    core->Defer([link] { link->OnEpError(UCS_ERR_INVALID_PARAM); });
    return UCS_OK;
  }
  if (decoded->type == AmType::kData) {
    return link->OnDataArrived(*decoded, data, length,
                               (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0);
  }
  core->Defer([link, h = *decoded] { link->OnControl(h); });
  return UCS_OK;
}

void Core::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* core = static_cast<Core*>(arg);
  core->Defer([core, ep, status] {
    auto it = core->eps_.find(ep);
    if (it != core->eps_.end()) {
      std::shared_ptr<Link> link = it->second;
      link->OnEpError(status);
    }
  });
}

void Core::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* listener = static_cast<ListenerState*>(arg);
  listener->core->Defer(
      [core = listener->core, listener, request] { core->Accept(listener, request); });
}

void Core::Accept(ListenerState* listener, ucp_conn_request_h request) {
  if (shutting_down_) {
    ucp_listener_reject(listener->handle, request);
    return;
  }
  std::string peer = "unknown";
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) == UCS_OK) {
    peer = SockaddrString(reinterpret_cast<const sockaddr*>(&attr.client_address),
                          SockaddrLength(attr.client_address));
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Core::OnEpError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(worker(), &params, &ep);
  if (status != UCS_OK) {
    log::Warn("transport(ucx): accepting a connection from " + peer + ": " +
              ucs_status_string(status));
    return;
  }
  auto link = std::make_shared<Link>(shared_from_this(), peer, Link::State::kAccepting);
  link->SetListener(listener);
  link->SetDeadline(Clock::now() + options.connect_timeout);
  Register(link, ep);
}

Result<std::string> Core::Listen(const std::string& address, AcceptHandler on_accept) {
  if (closing_) return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  if (OnThread()) return DoListen(address, std::move(on_accept));
  auto promise = std::make_shared<std::promise<Result<std::string>>>();
  auto future = promise->get_future();
  if (!Post([self = shared_from_this(), promise, address,
             on_accept = std::move(on_accept)]() mutable {
        promise->set_value(self->DoListen(address, std::move(on_accept)));
      })) {
    return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  }
  try {
    return future.get();
  } catch (const std::future_error&) {  // the loop ended before running it
    return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  }
}

Result<std::string> Core::DoListen(const std::string& address, AcceptHandler on_accept) {
  if (shutting_down_) {
    return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  }
  ASSIGN_OR_RETURN(AddrInfo info, Resolve(address, /*passive=*/true));
  auto listener = std::make_unique<ListenerState>();
  listener->core = this;
  listener->on_accept = std::move(on_accept);
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = info->ai_addr;
  params.sockaddr.addrlen = info->ai_addrlen;
  params.conn_handler.cb = &Core::OnConnRequest;
  params.conn_handler.arg = listener.get();
  const ucs_status_t status = ucp_listener_create(worker(), &params, &listener->handle);
  if (status == UCS_ERR_BUSY) {
    return Status::FailedPrecondition("listening on " + address + ": address in use");
  }
  if (status != UCS_OK) {
    return Status::Unavailable("listening on " + address + ": " + ucs_status_string(status));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(listener->handle, &attr) != UCS_OK) {
    ucp_listener_destroy(listener->handle);
    return Status::Internal("listening on " + address + ": cannot query the bound address");
  }
  listeners_.push_back(std::move(listener));
  return SockaddrString(reinterpret_cast<const sockaddr*>(&attr.sockaddr),
                        SockaddrLength(attr.sockaddr));
}

void Core::Connect(const std::string& address, ConnectHandler on_done) {
  Post([self = shared_from_this(), address, on_done = std::move(on_done)]() mutable {
    self->DoConnect(address, std::move(on_done));
  });
}

void Core::DoConnect(const std::string& address, ConnectHandler on_done) {
  if (shutting_down_) {
    if (!stopped()) on_done(Status::Aborted("transport shut down"));
    return;
  }
  auto info = Resolve(address, /*passive=*/false);
  if (!info.ok()) {
    on_done(info.status());
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = (*info)->ai_addr;
  params.sockaddr.addrlen = (*info)->ai_addrlen;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Core::OnEpError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(worker(), &params, &ep);
  if (status != UCS_OK) {
    on_done(Status::Unavailable("connecting to " + address + ": " + ucs_status_string(status)));
    return;
  }
  auto link = std::make_shared<Link>(shared_from_this(), address, Link::State::kConnecting);
  link->SetConnectHandler(std::move(on_done));
  link->SetDeadline(Clock::now() + options.connect_timeout);
  Register(link, ep);
  link->SendControl(AmType::kHello, options.max_message_bytes);
}

bool Core::RunPosted() {
  std::vector<std::function<void()>> batch;
  {
    MutexLock lock(post_mu_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
  return !batch.empty();
}

bool Core::RunDeferred() {
  bool ran = false;
  while (!deferred_.empty()) {
    auto fn = std::move(deferred_.front());
    deferred_.pop_front();
    fn();
    ran = true;
  }
  return ran;
}

bool Core::HasDeadlines() const {
  return std::any_of(eps_.begin(), eps_.end(),
                     [](const auto& entry) { return entry.second->has_deadline(); });
}

void Core::CheckDeadlines(Clock::time_point now) {
  std::vector<std::shared_ptr<Link>> links;
  for (auto& [ep, link] : eps_) {
    if (link->has_deadline()) links.push_back(link);
  }
  for (auto& link : links) link->OnDeadline(now);
}

void Core::Loop() {
  Clock::time_point last_event = Clock::now();
  Clock::time_point next_deadline_check = last_event + kDeadlineCheckPeriod;
  for (;;) {
    bool busy = RunPosted();
    for (int rounds = 0; rounds < 64 && ucp_worker_progress(worker()) != 0; ++rounds) busy = true;
    busy = RunDeferred() || busy;
    const Clock::time_point now = Clock::now();
    if (now >= next_deadline_check) {
      CheckDeadlines(now);
      RunDeferred();
      next_deadline_check = now + kDeadlineCheckPeriod;
    }
    if (shutting_down_ && (eps_.empty() || now >= shutdown_deadline_)) break;
    if (busy) {
      last_event = now;
      continue;
    }
    if (now - last_event < options.spin) continue;
    // Idle: block on the worker's fd. Deadlines are checked every few ms.
    const bool timed = shutting_down_ || HasDeadlines();
    ucx_->Wait(timed ? static_cast<int>(kDeadlineCheckPeriod.count()) : -1);
    last_event = Clock::now();
  }
  Teardown();
}

void Core::BeginShutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  shutdown_deadline_ = Clock::now() + kShutdownGrace;
  for (auto& listener : listeners_) ucp_listener_destroy(listener->handle);
  listeners_.clear();
  std::vector<std::shared_ptr<Link>> links;
  for (auto& [raw, link] : open_links_) links.push_back(link);
  for (auto& [ep, link] : eps_) links.push_back(link);
  for (auto& link : links) link->ShutdownNow();
  RunDeferred();
}

void Core::Teardown() {
  {
    MutexLock lock(post_mu_);
    accepting_posts_ = false;
  }
  stopped_.store(true, std::memory_order_release);
  RunDeferred();  // releases what completions hold; user handlers are silenced
  deferred_.clear();
  {
    std::vector<std::function<void()>> dropped;  // destroyed outside the lock, as before
    {
      MutexLock lock(post_mu_);
      dropped.swap(posted_);
    }
  }
  ucx_.reset();  // destroys the worker and the context
  for (RequestCtx* ctx : live_) delete ctx;
  live_.clear();
  eps_.clear();
  open_links_.clear();
}

void Core::Shutdown() {
  MutexLock shutdown_lock(shutdown_mu_);
  if (shut_down_) return;
  closing_.store(true);
  Post([self = shared_from_this()] { self->BeginShutdown(); });
  if (OnThread()) return;  // from a handler: everything closes, nobody waits
  if (thread_.joinable()) thread_.join();
  stopped_.store(true, std::memory_order_release);
  shut_down_ = true;
}

}  // namespace ucx
namespace {

using namespace ucx;  // NOLINT(build/namespaces): this backend's own pieces
using UcxTransport = internal::CoreTransport<Core>;

}  // namespace

Result<std::string> UcxTlsValue(const std::string& tls) {
  // UCX 1.13 sets client-server links up through its TCP connection manager, and
  // the endpoint's wireup lane must be a network transport: with "sm" alone the
  // connect fails (unreachable). With "sm,tcp" the AM lanes are shared memory and
  // tcp only carries wireup (and would carry emulated RMA, which we do not use).
  if (tls == "shm") return std::string("sm,tcp");
  for (char c : tls) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == ',' || c == '^';
    if (!ok) return Status::InvalidArgument("ucx transport: bad tls \"" + tls + "\"");
  }
  return tls;
}

Result<std::unique_ptr<Transport>> MakeUcxTransport(const UcxOptions& options) {
  if (options.max_message_bytes == 0) {
    return Status::InvalidArgument("ucx transport: max_message_bytes must be positive");
  }
  if (options.connect_timeout.count() <= 0 || options.linger_timeout.count() <= 0) {
    return Status::InvalidArgument(
        "ucx transport: connect_timeout and linger_timeout must be "
        "positive");
  }
  if (options.spin.count() < 0) {
    return Status::InvalidArgument("ucx transport: spin must not be negative");
  }
  ASSIGN_OR_RETURN(std::string tls, UcxTlsValue(options.tls));
  UcxWorkerConfig config{tls, options.net_devices, {}};
  if (options.tls == "shm") {
    // Rendezvous data as active-message fragments over the shared-memory AM lane,
    // not as put/get emulated over the tcp lane.
    config.settings.emplace_back("RNDV_SCHEME", "am");
  }
  ASSIGN_OR_RETURN(auto ucx_worker, UcxWorker::Create(config));
  static std::once_flag logged;
  std::call_once(logged, [&] {
    log::Info(ucx_worker->supports_cuda_memory()
                  ? "transport(ucx): this UCX build supports CUDA memory, but the backend moves "
                    "host memory only"
                  : "transport(ucx): CUDA device memory is not supported by this UCX build; "
                    "host memory only");
  });
  auto core = std::make_shared<Core>(options, std::move(ucx_worker));
  core->StartThread();
  return std::unique_ptr<Transport>(std::make_unique<UcxTransport>(std::move(core)));
}

}  // namespace deltacast::transport
