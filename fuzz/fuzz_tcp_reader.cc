// The tcp transport's reader end to end: a listener of the real backend (one per
// process, small limits) takes each input as the bytes a peer writes to a fresh
// socket, then the socket closes. The transport must refuse, hold or deliver,
// never crash; accepted links are authenticated half the time (first byte), so
// both sides of the pre-authentication limit run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/tcp/tcp_transport.h"

using namespace deltacast;
using namespace deltacast::transport;

namespace {

struct Server {
  std::unique_ptr<Transport> transport;
  uint16_t port = 0;
  std::atomic<bool> authenticate{false};
  std::mutex mu;
  std::vector<std::unique_ptr<Connection>> links;  // kept until the next input
};

Server& TheServer() {
  static Server* server = [] {
    auto* s = new Server;
    TcpOptions options;
    options.max_message_bytes = 1 << 20;
    options.handshake_max_message_bytes = 4096;
    options.connect_timeout = std::chrono::milliseconds(200);
    options.max_handshakes_per_address = 1024;
    options.max_pending_handshakes = 1024;
    options.max_links_per_address = 0;
    s->transport = std::move(*MakeTcpTransport(options));
    auto bound = s->transport->Listen("127.0.0.1:0", [s](std::unique_ptr<Connection> c) {
      if (s->authenticate) c->Authenticated();
      c->Start([](Message) {}, [](Status) {});
      std::lock_guard lock(s->mu);
      s->links.push_back(std::move(c));
    });
    s->port = static_cast<uint16_t>(std::stoi(bound->substr(bound->rfind(':') + 1)));
    return s;
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Server& server = TheServer();
  if (size < 1) return 0;
  server.authenticate = data[0] & 1;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(server.port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    (void)!::send(fd, data + 1, size - 1, MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    // Give the transport a moment with the bytes, then drain what it answers.
    char buf[4096];
    timeval tv{0, 20000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
  }
  ::close(fd);
  std::vector<std::unique_ptr<Connection>> old;
  {
    std::lock_guard lock(server.mu);
    old.swap(server.links);
  }
  return 0;  // `old` closes the links accepted for this input
}
