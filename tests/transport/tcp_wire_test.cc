// TCP-only wire checks (raw frames over plain POSIX sockets), address parsing and
// inproc naming: what the conformance suite cannot express backend-neutrally.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "common/bytes.h"
#include "tests/transport/test_util.h"
#include "transport/arrival.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/internal/address.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

// ---- TCP wire checks: raw frames over plain POSIX sockets ----

// A blocking client socket to 127.0.0.1:port.
class RawSocket {
 public:
  explicit RawSocket(const std::string& address) {
    auto host_port = ParseHostPort(address);
    EXPECT_TRUE(host_port.ok());
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(host_port->port);
    ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawSocket() { ::close(fd_); }
  int fd() const { return fd_; }
  void Write(const std::vector<std::byte>& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // Reads exactly n bytes; false on EOF or error.
  bool Read(size_t n, std::vector<std::byte>* out) {
    out->resize(n);
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd_, out->data() + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  // True once the peer closed (EOF or reset) within the receive timeout.
  bool SeesClose() {
    std::byte b[4096];
    while (true) {
      const ssize_t r = ::recv(fd_, b, sizeof(b), 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET;
    }
  }

 private:
  int fd_ = -1;
};

// Frame bytes written out by hand from the byte table in docs/transport.md, not with
// EncodeFrameHeader: the spec and the code must agree.
std::vector<std::byte> Frame(uint8_t type, uint64_t length, uint64_t sequence) {
  std::vector<std::byte> out(24);
  std::memcpy(out.data(), "DCTP", 4);    // magic
  out[4] = std::byte{1};                 // version
  out[5] = std::byte{type};              // type
  StoreLE<uint16_t>(out.data() + 6, 0);  // flags
  StoreLE<uint64_t>(out.data() + 8, length);
  StoreLE<uint64_t>(out.data() + 16, sequence);
  return out;
}

std::vector<std::byte> HelloFrame(uint64_t link_id, uint32_t index, uint32_t count) {
  std::vector<std::byte> out = Frame(2, 24, 0);
  out.resize(48);
  StoreLE<uint64_t>(out.data() + 24, link_id);
  StoreLE<uint32_t>(out.data() + 32, index);
  StoreLE<uint32_t>(out.data() + 36, count);
  StoreLE<uint64_t>(out.data() + 40, 1 << 20);  // max_message_bytes
  return out;
}

std::unique_ptr<Transport> MakeTcp(uint64_t max_message_bytes = kDefaultMaxMessageBytes,
                                   milliseconds connect_timeout = milliseconds(5000)) {
  TcpOptions options;
  options.max_message_bytes = max_message_bytes;
  options.connect_timeout = connect_timeout;
  auto t = MakeTcpTransport(options);
  EXPECT_TRUE(t.ok());
  return std::move(t).value();
}

// Connects a raw socket as one stream of a link and checks the ack.
void Handshake(RawSocket& raw, uint64_t link_id, uint32_t index, uint32_t count) {
  raw.Write(HelloFrame(link_id, index, count));
}
void ExpectAck(RawSocket& raw, uint64_t link_id, uint32_t index, uint32_t count) {
  std::vector<std::byte> ack;
  ASSERT_TRUE(raw.Read(48, &ack));
  EXPECT_EQ(AsChars(ByteSpan(ack).first(4)), "DCTP");
  EXPECT_EQ(static_cast<uint8_t>(ack[5]), 3);  // hello-ack
  EXPECT_EQ(LoadLE<uint64_t>(ack.data() + 8), 24u);
  EXPECT_EQ(LoadLE<uint64_t>(ack.data() + 24), link_id);
  EXPECT_EQ(LoadLE<uint32_t>(ack.data() + 32), index);
  EXPECT_EQ(LoadLE<uint32_t>(ack.data() + 36), count);
}

// A tcp listener and one hand-written peer linked to it as a one-stream link: the raw
// socket, the accepted connection and a Sink started on it.
struct RawLink {
  AcceptQueue accept;
  Sink sink;
  std::unique_ptr<Transport> server;
  std::unique_ptr<RawSocket> raw;
  std::unique_ptr<Connection> connection;

  // Listens, dials, says `link_id`'s hello and starts the sink on what was accepted.
  void Open(uint64_t link_id, uint64_t max_message_bytes = kDefaultMaxMessageBytes) {
    server = MakeTcp(max_message_bytes);
    auto address = server->Listen("127.0.0.1:0", accept.Handler());
    ASSERT_TRUE(address.ok());
    raw = std::make_unique<RawSocket>(*address);
    Handshake(*raw, link_id, 0, 1);
    ExpectAck(*raw, link_id, 0, 1);
    connection = accept.Pop();
    ASSERT_NE(connection, nullptr);
    sink.Start(*connection);
  }
};

TEST(TcpWireTest, HandWrittenFramesAreDelivered) {
  RawLink link;
  ASSERT_NO_FATAL_FAILURE(link.Open(77));
  auto bytes = Frame(1, 5, 0);
  for (char c : std::string("hello")) bytes.push_back(std::byte(c));
  auto empty = Frame(1, 0, 1);
  bytes.insert(bytes.end(), empty.begin(), empty.end());
  link.raw->Write(bytes);
  ASSERT_TRUE(link.sink.WaitMessages(2));
  EXPECT_EQ(AsChars(*link.sink.messages()[0]), "hello");
  EXPECT_TRUE(link.sink.messages()[1]->empty());
  // An orderly goodbye after 2 messages closes the link with OK.
  link.raw->Write(Frame(4, 0, 2));
  ASSERT_TRUE(link.sink.WaitClosed());
  EXPECT_TRUE(link.sink.close_status().ok()) << link.sink.close_status().ToString();
}

// A message that takes long to arrive is not silence: every read that brings bytes of
// it moves the link's arrival time (LastHeard), which the relay's idle check reads (a
// 4 MiB chunk on a 1 Mbit/s flow takes longer than the default idle_timeout).
TEST(TcpWireTest, BytesOfAMessageStillArrivingMoveTheArrivalTime) {
  RawLink link;
  ASSERT_NO_FATAL_FAILURE(link.Open(78));
  auto arrival = [&] { return LastHeard(*link.connection, {}); };
  // Waits until the arrival time passes `after` (2 s at most).
  auto arrival_after = [&](std::chrono::steady_clock::time_point after) {
    for (int i = 0; i < 2000 && arrival() <= after; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return arrival();
  };
  const auto before = arrival();
  std::vector<std::byte> piece(100, std::byte{7});
  auto bytes = Frame(1, 3 * piece.size(), 0);
  bytes.insert(bytes.end(), piece.begin(), piece.end());
  link.raw->Write(bytes);
  const auto first = arrival_after(before);
  EXPECT_GT(first, before);
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto last = arrival();
    EXPECT_TRUE(link.sink.messages().empty()) << "delivered before its last byte";
    link.raw->Write(piece);
    EXPECT_GT(arrival_after(last), last) << "piece " << i + 2 << " of 3";
  }
  ASSERT_TRUE(link.sink.WaitMessages(1));
  EXPECT_EQ(link.sink.messages()[0]->size(), 3 * piece.size());
  EXPECT_GE(arrival() - first, std::chrono::milliseconds(40));
}

TEST(TcpWireTest, GoodbyeAnnouncingUnsentMessagesBreaksTheLink) {
  RawLink link;
  ASSERT_NO_FATAL_FAILURE(link.Open(5));
  auto bytes = Frame(1, 1, 0);
  bytes.push_back(std::byte{'x'});
  auto goodbye = Frame(4, 0, 3);  // claims three messages, sent one
  bytes.insert(bytes.end(), goodbye.begin(), goodbye.end());
  link.raw->Write(bytes);
  ASSERT_TRUE(link.sink.WaitClosed());
  EXPECT_EQ(link.sink.close_status().code(), StatusCode::kUnavailable)
      << link.sink.close_status().ToString();
  EXPECT_EQ(link.sink.message_count(), 1u);
}

TEST(TcpWireTest, HugeLengthClosesTheLinkBeforeAllocating) {
  RawLink link;
  ASSERT_NO_FATAL_FAILURE(link.Open(1, 1 << 20));
  link.raw->Write(Frame(1, uint64_t{1} << 50, 0));  // a petabyte: allocating it would abort
  ASSERT_TRUE(link.sink.WaitClosed());
  EXPECT_EQ(link.sink.close_status().code(), StatusCode::kCorrupt)
      << link.sink.close_status().ToString();
  EXPECT_EQ(link.sink.message_count(), 0u);
  EXPECT_TRUE(link.raw->SeesClose());
}

TEST(TcpWireTest, MalformedFramesCloseTheLinkWithCorrupt) {
  struct Case {
    const char* name;
    std::vector<std::byte> bytes;
  };
  std::vector<Case> cases;
  auto bad_magic = Frame(1, 1, 0);
  bad_magic[0] = std::byte{'X'};
  cases.push_back({"bad magic", bad_magic});
  auto bad_version = Frame(1, 1, 0);
  bad_version[4] = std::byte{9};
  cases.push_back({"bad version", bad_version});
  cases.push_back({"unknown type", Frame(9, 1, 0)});
  auto flags = Frame(1, 1, 0);
  flags[6] = std::byte{1};
  cases.push_back({"reserved flags", flags});
  cases.push_back({"sequence gap", Frame(1, 1, 5)});
  cases.push_back({"hello on a live link", HelloFrame(1, 0, 1)});
  cases.push_back({"goodbye with payload", Frame(4, 3, 0)});
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    RawLink link;
    ASSERT_NO_FATAL_FAILURE(link.Open(2));
    c.bytes.resize(c.bytes.size() + 8);  // some payload bytes
    link.raw->Write(c.bytes);
    ASSERT_TRUE(link.sink.WaitClosed());
    EXPECT_EQ(link.sink.close_status().code(), StatusCode::kCorrupt)
        << link.sink.close_status().ToString();
    EXPECT_EQ(link.sink.message_count(), 0u);
  }
}

TEST(TcpWireTest, BadHandshakeIsRefusedWithoutAnAccept) {
  AcceptQueue accept;
  auto server = MakeTcp();
  auto address = server->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  {
    RawSocket raw(*address);
    std::vector<std::byte> garbage(48, std::byte{0x5a});
    raw.Write(garbage);
    EXPECT_TRUE(raw.SeesClose());
  }
  {
    RawSocket raw(*address);
    raw.Write(HelloFrame(3, 5, 2));  // index beyond count
    EXPECT_TRUE(raw.SeesClose());
  }
  {
    RawSocket raw(*address);
    raw.Write(Frame(1, 0, 0));  // data before hello
    raw.Write(std::vector<std::byte>(24));
    EXPECT_TRUE(raw.SeesClose());
  }
  EXPECT_EQ(accept.size(), 0u);
}

TEST(TcpWireTest, StripedStreamsAreReorderedBySequence) {
  AcceptQueue accept;
  Sink sink;
  auto server = MakeTcp();
  auto address = server->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  RawSocket s0(*address);
  auto s1 = std::make_unique<RawSocket>(*address);
  Handshake(*s1, 99, 1, 2);
  Handshake(s0, 99, 0, 2);
  ExpectAck(s0, 99, 0, 2);
  ExpectAck(*s1, 99, 1, 2);
  auto connection = accept.Pop();
  ASSERT_NE(connection, nullptr);
  sink.Start(*connection);
  auto second = Frame(1, 1, 1);
  second.push_back(std::byte{'b'});
  auto first = Frame(1, 1, 0);
  first.push_back(std::byte{'a'});
  s1->Write(second);  // sequence 1 arrives first, on stream 1
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(sink.message_count(), 0u);
  s0.Write(first);
  ASSERT_TRUE(sink.WaitMessages(2));
  EXPECT_EQ(AsChars(*sink.messages()[0]), "a");
  EXPECT_EQ(AsChars(*sink.messages()[1]), "b");
  // A stream that ends cleanly between frames leaves the others running...
  s1.reset();
  auto third = Frame(1, 1, 2);
  third.push_back(std::byte{'c'});
  s0.Write(third);
  ASSERT_TRUE(sink.WaitMessages(3));
  EXPECT_EQ(AsChars(*sink.messages()[2]), "c");
  EXPECT_EQ(sink.close_count(), 0);
  // ...but a stream cut inside a frame breaks the whole link at once.
  s0.Write(Frame(1, 100, 3));
  s0.Write(std::vector<std::byte>(10));
  ::shutdown(s0.fd(), SHUT_WR);
  ASSERT_TRUE(sink.WaitClosed());
  EXPECT_EQ(sink.close_status().code(), StatusCode::kUnavailable) << sink.close_status().ToString();
  EXPECT_NE(sink.close_status().message().find("middle of a 100-byte message"), std::string::npos)
      << sink.close_status().ToString();
}

TEST(TcpWireTest, ConnectTimesOutWhenThePeerNeverAnswers) {
  // A listening socket that nobody accepts from: TCP connects, the hello is
  // buffered, the ack never comes.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  auto client = MakeTcp(kDefaultMaxMessageBytes, milliseconds(300));
  const auto start = Clock::now();
  auto connection =
      ConnectBlocking(*client, "127.0.0.1:" + std::to_string(ntohs(sa.sin_port)), kWait);
  ASSERT_FALSE(connection.ok());
  EXPECT_EQ(connection.status().code(), StatusCode::kTimeout) << connection.status().ToString();
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  ::close(fd);
}

TEST(TcpWireTest, OptionsAreValidated) {
  TcpOptions options;
  options.io_threads = 0;
  EXPECT_EQ(MakeTcpTransport(options).status().code(), StatusCode::kInvalidArgument);
  options = {};
  options.streams_per_link = kMaxStreamsPerLink + 1;
  EXPECT_EQ(MakeTcpTransport(options).status().code(), StatusCode::kInvalidArgument);
  options = {};
  options.max_message_bytes = 0;
  EXPECT_EQ(MakeTcpTransport(options).status().code(), StatusCode::kInvalidArgument);
  auto t = MakeTcp();
  EXPECT_EQ(t->Listen("nonsense", {}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TcpWireTest, SeveralIoThreadsAndSocketBuffers) {
  TcpOptions options;
  options.io_threads = 3;
  options.streams_per_link = 3;
  options.socket_buffer_bytes = 256 * 1024;
  auto server = MakeTcpTransport(options);
  auto client = MakeTcpTransport(options);
  ASSERT_TRUE(server.ok() && client.ok());
  AcceptQueue accept;
  Sink sink;
  auto address = (*server)->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  auto connection = ConnectBlocking(**client, *address, kWait);
  ASSERT_TRUE(connection.ok()) << connection.status().ToString();
  auto accepted = accept.Pop();
  ASSERT_NE(accepted, nullptr);
  sink.Start(*accepted);
  std::mt19937_64 rng(16);
  std::vector<size_t> sizes(500);
  for (auto& s : sizes) s = rng() % (256 * 1024);
  auto hashes = SendAll(**connection, sizes, 17, nullptr);
  ExpectReceived(sink, sizes, hashes);
}

TEST(AddressTest, ParsesHostPortForms) {
  auto v4 = ParseHostPort("127.0.0.1:5000");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 5000);
  auto v6 = ParseHostPort("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  auto name = ParseHostPort("relay-3.example:65535");
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(name->host, "relay-3.example");
  for (const char* bad : {"", "host", ":80", "host:", "host:65536", "host:12a", "::1:80", "[::1]80",
                          "[::1", "host:-1", "host:123456"}) {
    auto r = ParseHostPort(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 80), "10.0.0.1:80");
}

TEST(InprocTest, NamesAreRegisteredAndReleased) {
  auto network = std::make_shared<InprocNetwork>();
  auto a = MakeInprocTransport(network);
  auto b = MakeInprocTransport(network);
  AcceptQueue accept;
  auto named = a->Listen("inproc:relay", accept.Handler());
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(*named, "inproc:relay");
  EXPECT_EQ(b->Listen("inproc:relay", accept.Handler()).status().code(),
            StatusCode::kFailedPrecondition);
  auto picked = a->Listen("node:0", accept.Handler());
  ASSERT_TRUE(picked.ok());
  EXPECT_NE(*picked, "node:0");
  EXPECT_EQ(network->ListenerNames().size(), 2u);
  auto c = ConnectBlocking(*b, "inproc:relay", kWait);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->PeerAddress(), "inproc:relay");
  a->Shutdown();
  EXPECT_TRUE(network->ListenerNames().empty());
  EXPECT_EQ(ConnectBlocking(*b, "inproc:relay", kWait).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace deltacast::transport
