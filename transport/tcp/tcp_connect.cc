// The tcp backend's connect side: resolve, open the link's sockets, TLS if asked
// ("tls://"), a hello on each, wait for the acks.
#include "transport/internal/tcp_core.h"

namespace deltacast::transport::tcp_internal {

class ConnectOp : public std::enable_shared_from_this<ConnectOp> {
 public:
  ConnectOp(std::shared_ptr<Core> core, std::string address, ConnectHandler on_done)
      : core_(std::move(core)),
        address_(std::move(address)),
        on_done_(std::move(on_done)),
        resolver_(core_->io),
        timer_(core_->io),
        link_id_(core_->NewLinkId()) {}

  void Begin() {
    if (core_->closing()) {
      Finish(Status::Aborted("transport shut down"));
      return;
    }
    std::string_view target = address_;
    if (target.starts_with(kTlsScheme)) {
      target.remove_prefix(kTlsScheme.size());
      if (!core_->tls.client) {
        Finish(Status::InvalidArgument("cannot dial " + address_ +
                                       ": this tcp transport has no TLS certificate"));
        return;
      }
      tls_ = true;
    }
    auto host_port = ParseHostPort(std::string(target));
    if (!host_port.ok()) {
      Finish(host_port.status());
      return;
    }
    timer_.expires_after(core_->options.connect_timeout);
    timer_.async_wait(
        asio::bind_executor(core_->control, [self = shared_from_this()](const ErrorCode& ec) {
          if (ec) return;
          self->Fail(Status::Timeout("connecting to " + self->address_ + ": no link within " +
                                     std::to_string(self->core_->options.connect_timeout.count()) +
                                     " ms"));
        }));
    ErrorCode ec;
    const auto ip = asio::ip::make_address(host_port->host, ec);
    if (!ec) {
      endpoints_.emplace_back(ip, host_port->port);
      ConnectFirst();
      return;
    }
    resolver_.async_resolve(
        host_port->host, std::to_string(host_port->port),
        asio::bind_executor(
            core_->control,
            [self = shared_from_this()](const ErrorCode& ec, const tcp::resolver::results_type& r) {
              if (self->done_) return;
              if (ec || r.empty()) {
                self->Fail(StatusFromError(ec ? ec : asio::error::host_not_found,
                                           "resolving " + self->address_));
                return;
              }
              for (const auto& entry : r) {
                self->endpoints_.push_back(entry.endpoint());
              }
              self->ConnectFirst();
            }));
  }

  void Fail(Status status) {
    if (done_) return;
    Finish(std::move(status));
  }

 private:
  struct Setup {
    explicit Setup(asio::io_context& io) : io(std::make_unique<TcpStream>(tcp::socket(io))) {}
    StreamPtr io;
    std::array<std::byte, kFrameHeaderSize + kHelloSize> out{};
    std::array<std::byte, kFrameHeaderSize + kHelloSize> in{};
  };

  // Stream 0 tries each resolved endpoint in turn; the others follow it.
  void ConnectFirst() {
    streams_.clear();
    for (uint32_t i = 0; i < core_->options.streams_per_link; ++i) {
      streams_.push_back(std::make_unique<Setup>(core_->io));
    }
    ConnectStream(0);
  }

  void ConnectStream(size_t index) {
    const tcp::endpoint& endpoint = endpoints_[endpoint_index_];
    tcp::socket& socket = streams_[index]->io->socket();
    ErrorCode ec;
    socket.open(endpoint.protocol(), ec);
    if (ec) {
      Fail(StatusFromError(ec, "opening a socket for " + address_));
      return;
    }
    // Buffer sizes must be set before connecting to shape the window scale.
    if (Status s = ConfigureSocket(socket, core_->options); !s.ok()) {
      Fail(s);
      return;
    }
    socket.async_connect(
        endpoint, asio::bind_executor(core_->control,
                                      [self = shared_from_this(), index](const ErrorCode& ec) {
                                        self->OnConnected(index, ec);
                                      }));
  }

  void OnConnected(size_t index, const ErrorCode& ec) {
    if (done_) return;
    if (ec) {
      if (index == 0 && endpoint_index_ + 1 < endpoints_.size()) {
        ++endpoint_index_;
        ErrorCode ignored;
        streams_[0]->io->socket().close(ignored);
        ConnectStream(0);
        return;
      }
      Fail(StatusFromError(ec, "connecting to " + address_));
      return;
    }
    if (index == 0) {
      for (size_t i = 1; i < streams_.size(); ++i) ConnectStream(i);
    }
    if (!tls_) return SendHello(index);
    streams_[index]->io->StartTls(*core_->tls.client);
    streams_[index]->io->async_handshake(
        internal::ssl::stream_base::client,
        asio::bind_executor(
            core_->control, [self = shared_from_this(), index](const ErrorCode& ec) {
              if (self->done_) return;
              if (ec) {
                return self->Fail(Status::PermissionDenied("TLS handshake with " + self->address_ +
                                                           " failed: " + ec.message()));
              }
              self->SendHello(index);
            }));
  }

  void SendHello(size_t index) {
    Setup& setup = *streams_[index];
    EncodeFrameHeader({FrameType::kHello, kHelloSize, 0},
                      std::span<std::byte, kFrameHeaderSize>(setup.out.data(), kFrameHeaderSize));
    EncodeHello({link_id_, static_cast<uint32_t>(index), static_cast<uint32_t>(streams_.size()),
                 core_->options.max_message_bytes},
                std::span<std::byte, kHelloSize>(setup.out.data() + kFrameHeaderSize, kHelloSize));
    asio::async_write(*setup.io, asio::buffer(setup.out),
                      asio::bind_executor(core_->control, [self = shared_from_this(), index](
                                                              const ErrorCode& ec, size_t) {
                        self->OnHelloWritten(index, ec);
                      }));
  }

  void OnHelloWritten(size_t index, const ErrorCode& ec) {
    if (done_) return;
    if (ec) {
      Fail(StatusFromError(ec, "greeting " + address_));
      return;
    }
    Setup& setup = *streams_[index];
    asio::async_read(*setup.io, asio::buffer(setup.in),
                     asio::bind_executor(core_->control, [self = shared_from_this(), index](
                                                             const ErrorCode& ec, size_t) {
                       self->OnAck(index, ec);
                     }));
  }

  void OnAck(size_t index, const ErrorCode& ec) {
    if (done_) return;
    if (ec == asio::error::eof) {
      Fail(Status::Unavailable(address_ + " closed the connection during the handshake "
                                          "(not a deltacast transport, or it refused the link)"));
      return;
    }
    if (ec) {
      Fail(StatusFromError(ec, "waiting for " + address_ + " to accept"));
      return;
    }
    const Setup& setup = *streams_[index];
    auto header = DecodeFrameHeader(
        std::span<const std::byte, kFrameHeaderSize>(setup.in.data(), kFrameHeaderSize));
    if (!header.ok() || header->type != FrameType::kHelloAck) {
      Fail(Status::Corrupt(address_ + " answered the handshake with something else than an ack"));
      return;
    }
    auto ack = DecodeHello(
        std::span<const std::byte, kHelloSize>(setup.in.data() + kFrameHeaderSize, kHelloSize));
    if (!ack.ok() || ack->link_id != link_id_ || ack->stream_index != index ||
        ack->stream_count != streams_.size()) {
      Fail(Status::Corrupt(address_ + " acknowledged a different link"));
      return;
    }
    if (++acks_ < streams_.size()) return;

    std::vector<StreamPtr> sockets;
    for (auto& s : streams_) sockets.push_back(std::move(s->io));
    ErrorCode ignored;
    const auto remote = sockets[0]->socket().remote_endpoint(ignored);
    auto link = std::make_shared<Link>(core_, std::move(sockets),
                                       ignored ? address_ : EndpointString(remote));
    if (!core_->Register(link)) {
      link->CloseForShutdown();
      Finish(Status::Aborted("transport shut down"));
      return;
    }
    Finish(std::unique_ptr<Connection>(
        std::make_unique<internal::LinkConnection<Link>>(std::move(link))));
  }

  void Finish(Result<std::unique_ptr<Connection>> result) {
    done_ = true;
    timer_.cancel();
    resolver_.cancel();
    for (auto& s : streams_) {
      ErrorCode ignored;
      if (s->io) s->io->socket().close(ignored);
    }
    auto self = shared_from_this();  // the set below may hold the last reference
    core_->connects.erase(self);
    if (!core_->stopped() && on_done_) on_done_(std::move(result));
    on_done_ = nullptr;
  }

  const std::shared_ptr<Core> core_;
  const std::string address_;
  ConnectHandler on_done_;
  tcp::resolver resolver_;
  asio::steady_timer timer_;
  const uint64_t link_id_;
  std::vector<tcp::endpoint> endpoints_;
  size_t endpoint_index_ = 0;
  std::vector<std::unique_ptr<Setup>> streams_;
  size_t acks_ = 0;
  bool done_ = false;
  bool tls_ = false;  // dialled as "tls://host:port"
};

void Core::Connect(const std::string& address, ConnectHandler on_done) {
  auto op = std::make_shared<ConnectOp>(shared_from_this(), address, std::move(on_done));
  Post(control, [self = shared_from_this(), op] {
    self->connects.insert(op);
    op->Begin();
  });
}

void FailPendingConnects(Core& core) {
  for (auto& op : std::set<std::shared_ptr<ConnectOp>>(core.connects)) {
    op->Fail(Status::Aborted("transport shut down"));
  }
  core.connects.clear();
}

}  // namespace deltacast::transport::tcp_internal
