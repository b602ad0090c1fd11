// TcpStream: one TCP socket of the tcp backend, plain or wrapped in TLS 1.3, behind
// one type, so the framing code (transport/tcp/tcp_transport.cc) reads and writes
// the same way either way. It models Asio's AsyncReadStream and AsyncWriteStream;
// the choice is made once, before any byte flows (StartTls), and only plain
// handlers (no completion tokens) are passed, so both branches return void.
//
// TLS contexts (MakeTlsContexts) require TLS 1.3 and a peer certificate that chains
// to the cluster CA, both ways; a peer's identity is its certificate's CN.
//
// Thread safety: like the socket it wraps: one strand at a time.
#pragma once

// <utility> before Boost.Asio: Boost 1.74 + g++ 12 C++20 (TOOLCHAIN-NOTES).
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/status.h"
#include "transport/tcp/tcp_transport.h"

namespace deltacast::transport::internal {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;

// The first byte of a TLS connection (a handshake record); a plaintext link starts
// with the frame magic's 'D' (transport/tcp/frame.h).
inline constexpr unsigned char kTlsHandshakeRecord = 0x16;

struct TlsContexts {
  std::unique_ptr<ssl::context> server;
  std::unique_ptr<ssl::context> client;
};

// Loads `files` into a server and a client context. kNotFound / kInvalidArgument
// naming the file and OpenSSL's reason when a file is missing or does not hold what
// it should (or the key does not match the certificate).
Result<TlsContexts> MakeTlsContexts(const TlsFiles& files);

// The CN of the certificate `ssl` verified for its peer; empty without one.
std::string PeerCommonName(SSL* ssl);

class TcpStream {
 public:
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket;

  explicit TcpStream(tcp::socket socket) : plain_(std::move(socket)) {}
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  // Wraps the socket in TLS with `context` (which must outlive this stream). Call
  // before any byte is read or written.
  void StartTls(ssl::context& context) {
    tls_.emplace(std::move(*plain_), context);
    plain_.reset();
  }
  bool tls() const { return tls_.has_value(); }
  tcp::socket& socket() { return tls_ ? tls_->next_layer() : *plain_; }
  executor_type get_executor() { return socket().get_executor(); }

  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_read_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_read_some(buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_write_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_write_some(buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Handler>
  void async_handshake(ssl::stream_base::handshake_type type, Handler&& handler) {
    tls_->async_handshake(type, std::forward<Handler>(handler));
  }

  // Writes what fits without blocking (a goodbye on close); best effort.
  void WriteNowNonBlocking(asio::const_buffer bytes) {
    boost::system::error_code ec;
    socket().non_blocking(true, ec);
    if (ec) return;
    if (tls_) {
      tls_->write_some(bytes, ec);
    } else {
      plain_->write_some(bytes, ec);
    }
  }

  // The verified peer certificate's CN (TLS only; empty otherwise).
  std::string PeerIdentity() { return tls_ ? PeerCommonName(tls_->native_handle()) : ""; }

 private:
  std::optional<tcp::socket> plain_;
  std::optional<ssl::stream<tcp::socket>> tls_;
};

}  // namespace deltacast::transport::internal
