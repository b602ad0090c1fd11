// The tcp backend's accept side: listening, the transport handshake of accepted
// sockets (the caps on them, TLS or plaintext told by the first byte, the hello),
// multi-stream links assembled, acked and handed to the application.
#include "transport/internal/tcp_core.h"

namespace deltacast::transport::tcp_internal {
namespace {
const ProvenHosts kNoneProven;
}  // namespace

Result<std::string> Core::Listen(const std::string& address, AcceptHandler on_accept) {
  if (closing())
    return Status::FailedPrecondition("listen on " + address + ": transport shut down");
  ASSIGN_OR_RETURN(HostPort host_port, ParseHostPort(address));
  ErrorCode ec;
  tcp::endpoint endpoint;
  const auto ip = asio::ip::make_address(host_port.host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(ip, host_port.port);
  } else {
    tcp::resolver resolver(io);
    auto results = resolver.resolve(host_port.host, std::to_string(host_port.port),
                                    tcp::resolver::passive, ec);
    if (ec || results.empty()) {
      return StatusFromError(ec ? ec : asio::error::host_not_found, "resolving " + address);
    }
    endpoint = results.begin()->endpoint();
  }
  auto listener = std::make_shared<Listener>(io);
  listener->on_accept = std::move(on_accept);
  tcp::acceptor& acceptor = listener->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && options.socket_buffer_bytes > 0) {
    // Accepted sockets inherit it, before the handshake fixes the window scale.
    acceptor.set_option(asio::socket_base::receive_buffer_size(options.socket_buffer_bytes), ec);
  }
  if (ec) return StatusFromError(ec, "opening a listening socket for " + address);
  acceptor.bind(endpoint, ec);
  if (ec) return StatusFromError(ec, "binding " + address);
  acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return StatusFromError(ec, "listening on " + address);
  const tcp::endpoint bound = acceptor.local_endpoint(ec);
  if (ec) return StatusFromError(ec, "listening on " + address);
  asio::post(control, [self = shared_from_this(), listener] {
    if (self->closing()) {
      ErrorCode ignored;
      listener->acceptor.close(ignored);
      return;
    }
    self->listeners.push_back(listener);
    self->AcceptNext(listener);
  });
  return EndpointString(bound);
}

void Core::AcceptNext(const std::shared_ptr<Listener>& listener) {
  listener->acceptor.async_accept(asio::bind_executor(
      control, [self = shared_from_this(), listener](const ErrorCode& ec, tcp::socket socket) {
        if (self->closing() || !listener->acceptor.is_open()) return;
        if (!ec) {
          self->BeginHandshake(listener, std::move(socket));
          self->AcceptNext(listener);
          return;
        }
        if (ec == asio::error::operation_aborted) return;
        log::Warn("transport: accept failed: " + ec.message() + "; retrying");
        listener->retry.expires_after(std::chrono::milliseconds(100));
        listener->retry.async_wait(
            asio::bind_executor(self->control, [self, listener](const ErrorCode& ec) {
              if (!ec && !self->closing()) self->AcceptNext(listener);
            }));
      }));
}

void Core::BeginHandshake(const std::shared_ptr<Listener>& listener, tcp::socket socket) {
  if (!ConfigureSocket(socket, options).ok()) return;  // dropping the socket closes it
  ErrorCode ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return;  // already gone
  const std::string host = remote.address().to_string();
  // Caps before anything else: a socket over them costs this side nothing more
  // than the accept, and one address cannot use up the slots others need.
  const size_t from_host = pending_by_host.count(host) ? pending_by_host[host] : 0;
  std::string over;
  std::shared_ptr<AcceptedStream> evict;
  if (from_host >= options.max_handshakes_per_address) {
    over = std::to_string(from_host) +
           " sockets in the handshake from this address (max_handshakes_per_address)";
  } else if (options.max_links_per_address > 0 &&
             LinksFrom(host) + from_host >= options.max_links_per_address) {
    over = std::to_string(LinksFrom(host) + from_host) +
           " links from this address (max_links_per_address)";
  } else if (pending_sockets >= options.max_pending_handshakes) {
    // Every slot taken: a socket that has said nothing yet gives its slot up, the
    // oldest of the address holding the most, if that address holds more than
    // this one's (the rule the relay's listeners share: common/handshake_admission.h).
    // Streams of a multi-stream link that said hello keep theirs. No address counts
    // as proven here: anyone can complete this hello (the relay's handshake, which
    // takes the cluster token, is where addresses prove something).
    struct Silent {
      std::string host;
    };
    std::map<uint64_t, Silent> silent;
    std::map<uint64_t, std::shared_ptr<AcceptedStream>> by_serial;
    for (const auto& s : handshakes) {
      silent[s->serial] = {s->host};
      by_serial[s->serial] = s;
    }
    const HandshakeAdmission admission =
        AdmitHandshake(silent, host, options.max_pending_handshakes,
                       options.max_handshakes_per_address, kNoneProven, pending_sockets);
    if (admission.admit && admission.evict) {
      evict = by_serial[*admission.evict];
    } else {
      over = std::to_string(pending_sockets) + " sockets in the handshake (max_pending_handshakes)";
    }
  }
  if (!over.empty()) {
    // Rate-limited by nature (one line per refused socket would let a flood fill the
    // log): the first refusal of a burst is logged, the rest counted.
    if (refused_quietly_++ % 1000 == 0) {
      log::Warn("transport: refusing a connection from " + EndpointString(remote) + ": " + over +
                (refused_quietly_ > 1 ? " (" + std::to_string(refused_quietly_) + " refused so far)"
                                      : ""));
    }
    ErrorCode ignored;
    socket.close(ignored);
    return;
  }
  if (evict) {
    if (evicted_quietly_++ % 1000 == 0) {
      log::Warn("transport: " + std::to_string(pending_sockets) +
                " sockets in the handshake (max_pending_handshakes): closing the oldest from " +
                evict->host + ", the most represented address, for " + EndpointString(remote) +
                " (" + std::to_string(evicted_quietly_) + " closed so far)");
    }
    DropHandshake(evict, "");
  }
  ++pending_by_host[host];
  ++pending_sockets;
  auto stream = std::make_shared<AcceptedStream>(io, std::move(socket));
  stream->listener = listener;
  stream->host = host;
  stream->peer = EndpointString(remote);
  stream->serial = next_handshake_serial++;
  handshakes.insert(stream);
  stream->timer.expires_after(options.connect_timeout);
  stream->timer.async_wait(
      asio::bind_executor(control, [self = shared_from_this(), stream](const ErrorCode& ec) {
        if (!ec) self->DropHandshake(stream, "no hello in time", /*quiet=*/true);
      }));
  if (!tls.server) return ReadHello(stream);
  // With TLS configured a listener serves both kinds of link: its first byte says
  // which (peeked, so a plaintext hello stays whole).
  stream->io->socket().async_wait(
      tcp::socket::wait_read,
      asio::bind_executor(control, [self = shared_from_this(), stream](const ErrorCode& ec) {
        if (self->handshakes.count(stream) == 0) return;
        ErrorCode peek_ec;
        const size_t n = ec ? 0
                            : stream->io->socket().receive(asio::buffer(&stream->first_byte, 1),
                                                           tcp::socket::message_peek, peek_ec);
        if (ec || peek_ec || n == 0) return self->DropHandshake(stream, "");
        if (stream->first_byte != internal::kTlsHandshakeRecord) return self->ReadHello(stream);
        stream->io->StartTls(*self->tls.server);
        stream->io->async_handshake(
            internal::ssl::stream_base::server,
            asio::bind_executor(self->control, [self, stream](const ErrorCode& ec) {
              if (self->handshakes.count(stream) == 0) return;
              if (ec) {
                return self->DropHandshake(stream, "TLS handshake failed: " + ec.message(),
                                           /*quiet=*/true);
              }
              self->ReadHello(stream);
            }));
      }));
}

void Core::ReadHello(const std::shared_ptr<AcceptedStream>& stream) {
  asio::async_read(*stream->io, asio::buffer(stream->hello),
                   asio::bind_executor(
                       control, [self = shared_from_this(), stream](const ErrorCode& ec, size_t) {
                         self->OnHello(stream, ec);
                       }));
}

void Core::DropHandshake(const std::shared_ptr<AcceptedStream>& stream, std::string_view why,
                         bool quiet) {
  if (handshakes.erase(stream) == 0) return;
  PendingDone(stream->host);
  // What any peer can cause over and over (timeouts, failed TLS handshakes) is
  // logged once per hundred, so a flood cannot fill the log.
  if (!why.empty() && (!quiet || dropped_quietly_++ % 100 == 0)) {
    log::Warn("transport: refusing connection from " + stream->peer + ": " + std::string(why) +
              (quiet && dropped_quietly_ > 1
                   ? " (" + std::to_string(dropped_quietly_) + " such so far)"
                   : ""));
  }
  ErrorCode ignored;
  stream->timer.cancel();
  stream->io->socket().close(ignored);
}

void Core::OnHello(const std::shared_ptr<AcceptedStream>& stream, const ErrorCode& ec) {
  if (handshakes.count(stream) == 0) return;  // timed out or shut down
  if (ec) {
    DropHandshake(stream, ec == asio::error::eof ? "" : "reading hello: " + ec.message());
    return;
  }
  auto header = DecodeFrameHeader(
      std::span<const std::byte, kFrameHeaderSize>(stream->hello.data(), kFrameHeaderSize));
  if (!header.ok()) {
    DropHandshake(stream, header.status().ToString());
    return;
  }
  if (header->type != FrameType::kHello) {
    DropHandshake(stream, "first frame is not a hello");
    return;
  }
  auto hello = DecodeHello(
      std::span<const std::byte, kHelloSize>(stream->hello.data() + kFrameHeaderSize, kHelloSize));
  if (!hello.ok()) {
    DropHandshake(stream, hello.status().ToString());
    return;
  }
  auto key = std::make_pair(stream->host, hello->link_id);
  auto it = pending_links.find(key);
  if (it == pending_links.end()) {
    if (pending_links.size() >= kMaxPendingLinks) {
      DropHandshake(stream, "too many half-open links");
      return;
    }
    auto pending = std::make_shared<PendingLink>(io, hello->stream_count);
    pending->link_id = hello->link_id;
    pending->key = key;
    pending->listener = stream->listener;
    it = pending_links.emplace(key, pending).first;
    pending->timer.expires_after(options.connect_timeout);
    pending->timer.async_wait(
        asio::bind_executor(control, [self = shared_from_this(), pending](const ErrorCode& ec) {
          if (!ec) self->DropPendingLink(pending, "not all streams arrived in time");
        }));
  }
  std::shared_ptr<PendingLink> pending = it->second;
  if (pending->stream_count != hello->stream_count || pending->sockets[hello->stream_index]) {
    DropHandshake(stream, "inconsistent stream of a multi-stream link");
    DropPendingLink(pending, "");
    return;
  }
  handshakes.erase(stream);
  stream->timer.cancel();
  if (hello->stream_index == 0) pending->peer = stream->peer;
  pending->sockets[hello->stream_index] = std::move(stream->io);
  if (++pending->arrived < pending->stream_count) return;
  pending_links.erase(pending->key);
  pending->timer.cancel();
  SendAcks(pending);
}

void Core::DropPendingLink(const std::shared_ptr<PendingLink>& pending, std::string_view why) {
  auto it = pending_links.find(pending->key);
  if (it == pending_links.end() || it->second != pending) return;
  pending_links.erase(it);
  if (!why.empty()) log::Warn("transport: dropping half-open link: " + std::string(why));
  pending->timer.cancel();
  PendingDone(pending->key.first, pending->arrived);
  for (auto& socket : pending->sockets) {
    ErrorCode ignored;
    if (socket) socket->socket().close(ignored);
  }
}

void Core::SendAcks(const std::shared_ptr<PendingLink>& pending) {
  for (uint32_t i = 0; i < pending->stream_count; ++i) {
    auto& ack = pending->acks[i];
    EncodeFrameHeader({FrameType::kHelloAck, kHelloSize, 0},
                      std::span<std::byte, kFrameHeaderSize>(ack.data(), kFrameHeaderSize));
    EncodeHello({pending->link_id, i, pending->stream_count, options.max_message_bytes},
                std::span<std::byte, kHelloSize>(ack.data() + kFrameHeaderSize, kHelloSize));
    asio::async_write(*pending->sockets[i], asio::buffer(ack),
                      asio::bind_executor(control, [self = shared_from_this(), pending](
                                                       const ErrorCode& ec, size_t) {
                        if (ec) pending->failed = true;
                        if (++pending->acks_written == pending->stream_count) {
                          self->CompleteAccept(pending);
                        }
                      }));
  }
}

void Core::CompleteAccept(const std::shared_ptr<PendingLink>& pending) {
  std::vector<StreamPtr> sockets;
  for (auto& socket : pending->sockets) sockets.push_back(std::move(socket));
  PendingDone(pending->key.first, pending->arrived);
  if (pending->failed || closing()) return;  // dropping the sockets closes them
  // One link, one peer: every stream is TLS with the same certificate, or none is.
  for (auto& s : sockets) {
    if (s->tls() != sockets[0]->tls() || s->PeerIdentity() != sockets[0]->PeerIdentity()) {
      log::Warn("transport: refusing a link from " + pending->peer +
                " whose streams authenticate differently");
      return;
    }
  }
  auto link = std::make_shared<Link>(shared_from_this(), std::move(sockets), pending->peer,
                                     pending->key.first);
  if (!Register(link)) {
    link->CloseForShutdown();
    return;
  }
  auto connection = std::make_unique<internal::LinkConnection<Link>>(std::move(link));
  if (!stopped() && pending->listener->on_accept)
    pending->listener->on_accept(std::move(connection));
}

}  // namespace deltacast::transport::tcp_internal
