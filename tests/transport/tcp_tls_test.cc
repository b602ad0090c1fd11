// TLS 1.3 on tcp links: the conformance suite over TLS, mutual authentication
// against the cluster CA (a certificate of another CA is refused both ways), the
// peer's identity, plaintext and TLS on one listener, and proof that the bytes on
// the wire are not the bytes sent (a recording proxy between the two ends).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "tests/transport/conformance_suite.h"
#include "tests/transport/raw_peer.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tls_certs.h"

namespace deltacast::transport {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// One CA for the process ("cluster"), and a second one nobody trusts ("rogue").
const fs::path& CertDir(const std::string& which) {
  static const fs::path base =
      fs::temp_directory_path() / ("deltacast-tls-test-" + std::to_string(::getpid()));
  static const bool made = [] {
    EXPECT_TRUE(WriteClusterCertificates(base / "cluster", {"server", "client", "other"}).ok());
    EXPECT_TRUE(WriteClusterCertificates(base / "rogue", {"server", "client"}).ok());
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(base, ec);
    });
    return true;
  }();
  (void)made;
  static const fs::path cluster = base / "cluster", rogue = base / "rogue";
  return which == "rogue" ? rogue : cluster;
}

TlsFiles Files(const std::string& node, const std::string& ca = "cluster",
               const std::string& issuer = "cluster") {
  return {CertDir(ca) / "ca.crt", CertDir(issuer) / (node + ".crt"),
          CertDir(issuer) / (node + ".key")};
}

std::unique_ptr<Transport> TlsTcp(const std::string& node, uint64_t max = kDefaultMaxMessageBytes,
                                  uint32_t streams = 1, TlsFiles files = {}) {
  TcpOptions options;
  options.max_message_bytes = max;
  options.streams_per_link = streams;
  options.tls = files.ca.empty() ? Files(node) : files;
  auto t = MakeTcpTransport(options);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// Dials every address over TLS ("tls://" + address), so the unchanged conformance
// suite runs over TLS links.
class TlsDialer final : public Transport {
 public:
  explicit TlsDialer(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  const Capabilities& capabilities() const override { return inner_->capabilities(); }
  Result<std::string> Listen(const std::string& a, AcceptHandler h) override {
    return inner_->Listen(a, std::move(h));
  }
  void Connect(const std::string& a, ConnectHandler h) override {
    inner_->Connect("tls://" + a, std::move(h));
  }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  std::unique_ptr<Transport> inner_;
};

BackendParam TlsParam(uint32_t streams) {
  return {.name = streams == 1 ? "TcpTls" : "TcpTls4Streams",
          .make = [streams](const MakeArgs& a) -> std::unique_ptr<Transport> {
            return std::make_unique<TlsDialer>(TlsTcp("server", a.max_message_bytes, streams));
          },
          .expected_backend = "tcp",
          .streams_per_link = streams};
}

INSTANTIATE_TEST_SUITE_P(Tls, ConformanceTest, ::testing::Values(TlsParam(1), TlsParam(4)),
                         BackendParamName);

struct Ends {
  std::unique_ptr<Connection> client, accepted;
};

Ends Dial(Transport& server, Transport& client, const std::string& scheme,
          testutil::AcceptQueue& accept) {
  auto address = server.Listen("127.0.0.1:0", accept.Handler());
  EXPECT_TRUE(address.ok());
  auto c = ConnectBlocking(client, scheme + *address, 5s);
  Ends ends;
  if (!c.ok()) return ends;
  ends.client = std::move(*c);
  ends.accepted = accept.Pop(2s);
  return ends;
}

TEST(TcpTlsTest, BothEndsLearnThePeersCertifiedIdentity) {
  auto server = TlsTcp("server"), client = TlsTcp("client");
  testutil::AcceptQueue accept;
  Ends ends = Dial(*server, *client, "tls://", accept);
  ASSERT_NE(ends.client, nullptr);
  ASSERT_NE(ends.accepted, nullptr);
  EXPECT_EQ(ends.client->PeerIdentity(), "server");
  EXPECT_EQ(ends.accepted->PeerIdentity(), "client");
}

TEST(TcpTlsTest, OneListenerServesTlsAndPlaintextLinks) {
  auto server = TlsTcp("server"), tls_client = TlsTcp("client");
  auto plain_client = std::move(*MakeTcpTransport());
  testutil::AcceptQueue accept;
  auto address = server->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  auto plain = ConnectBlocking(*plain_client, *address, 5s);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  auto plain_accepted = accept.Pop(2s);
  ASSERT_NE(plain_accepted, nullptr);
  EXPECT_EQ(plain_accepted->PeerIdentity(), "") << "plaintext: nobody proved anything";
  auto tls = ConnectBlocking(*tls_client, "tls://" + *address, 5s);
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  auto tls_accepted = accept.Pop(2s);
  ASSERT_NE(tls_accepted, nullptr);
  EXPECT_EQ(tls_accepted->PeerIdentity(), "client");
  // A transport without certificates cannot dial TLS.
  EXPECT_EQ(ConnectBlocking(*plain_client, "tls://" + *address, 5s).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TcpTlsTest, CertificatesOfAnotherCaAreRefusedEitherWay) {
  testutil::AcceptQueue accept;
  {
    // The client's certificate is not the cluster's: the server refuses it.
    auto server = TlsTcp("server");
    auto client = TlsTcp("client", kDefaultMaxMessageBytes, 1, Files("client", "cluster", "rogue"));
    Ends ends = Dial(*server, *client, "tls://", accept);
    EXPECT_EQ(ends.accepted, nullptr);
  }
  {
    // The server's certificate is not the cluster's: the client refuses it.
    auto server = TlsTcp("server", kDefaultMaxMessageBytes, 1, Files("server", "cluster", "rogue"));
    auto client = TlsTcp("client");
    auto address = server->Listen("127.0.0.1:0", accept.Handler());
    ASSERT_TRUE(address.ok());
    auto c = ConnectBlocking(*client, "tls://" + *address, 5s);
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(accept.Pop(500ms), nullptr);
  }
}

TEST(TcpTlsTest, MissingOrMismatchedFilesAreClearErrors) {
  TcpOptions options;
  options.tls = Files("server");
  options.tls->key = CertDir("cluster") / "client.key";
  auto mismatched = MakeTcpTransport(options);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("does not match"), std::string::npos)
      << mismatched.status().message();
  options.tls = Files("nobody");
  auto missing = MakeTcpTransport(options);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nobody.crt"), std::string::npos);
}

// A proxy between the ends that keeps a copy of every byte the client sends.
class RecordingProxy {
 public:
  explicit RecordingProxy(uint16_t to) : to_(to) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd_, 4);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~RecordingProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }
  std::vector<std::byte> recorded() {
    std::lock_guard lock(mu_);
    return recorded_;
  }

 private:
  void Run() {
    const int in = ::accept(listen_fd_, nullptr, nullptr);
    if (in < 0) return;
    const int out = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(to_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a);
    std::vector<char> buf(1 << 16);
    while (!stop_) {
      pollfd fds[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
      if (::poll(fds, 2, 100) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        const ssize_t n = ::recv(fds[i].fd, buf.data(), buf.size(), 0);
        if (n <= 0) {
          stop_ = true;
          break;
        }
        if (i == 0) {
          std::lock_guard lock(mu_);
          recorded_.insert(recorded_.end(), reinterpret_cast<std::byte*>(buf.data()),
                           reinterpret_cast<std::byte*>(buf.data()) + n);
        }
        ::send(fds[1 - i].fd, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL);
      }
    }
    ::close(in);
    ::close(out);
  }

  uint16_t to_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::byte> recorded_;
};

bool Contains(const std::vector<std::byte>& haystack, std::string_view needle) {
  const auto* n = reinterpret_cast<const std::byte*>(needle.data());
  return std::search(haystack.begin(), haystack.end(), n, n + needle.size()) != haystack.end();
}

// What crosses the wire: over TLS, not the weights; over plaintext, the weights.
TEST(TcpTlsTest, TheWireCarriesCiphertextNotTheMessage) {
  constexpr std::string_view kMarker = "BF16-WEIGHTS-OF-LAYER-7:";
  std::string text;
  while (text.size() < (64 << 10)) text += kMarker;
  const auto message = MakeMessage(
      std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                             reinterpret_cast<const std::byte*>(text.data()) + text.size()));
  for (const bool tls : {true, false}) {
    auto server = TlsTcp("server"), client = TlsTcp("client");
    testutil::AcceptQueue accept;
    auto address = server->Listen("127.0.0.1:0", accept.Handler());
    ASSERT_TRUE(address.ok());
    RecordingProxy proxy(
        static_cast<uint16_t>(std::stoi(address->substr(address->rfind(':') + 1))));
    auto c = ConnectBlocking(
        *client, std::string(tls ? "tls://" : "") + "127.0.0.1:" + std::to_string(proxy.port()),
        5s);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto accepted = accept.Pop(2s);
    ASSERT_NE(accepted, nullptr);
    std::atomic<int> got{0};
    accepted->Authenticated();
    accepted->Start([&](Message m) { got += *m == *message ? 1 : 0; }, [](Status) {});
    (*c)->Authenticated();
    (*c)->Start([](Message) {}, [](Status) {});
    (*c)->Send(message);
    for (int i = 0; i < 200 && got == 0; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_EQ(got, 1) << "the message arrived intact";
    const auto wire = proxy.recorded();
    EXPECT_GE(wire.size(), text.size());
    EXPECT_EQ(Contains(wire, kMarker), !tls) << (tls ? "TLS" : "plaintext");
  }
}

}  // namespace
}  // namespace deltacast::transport
