// One suite, run against every backend: what transport.h promises, checked the same
// way for tcp (1 and 4 streams per link), inproc, and the fault wrapper with an
// empty plan. TCP-only wire checks (raw frames over plain sockets) follow at the end.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "common/bytes.h"
#include "tests/transport/test_util.h"
#include "transport/fault_transport.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/internal/address.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

enum class Backend { kTcp, kTcp4Streams, kInproc, kFaultTcp };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  switch (info.param) {
    case Backend::kTcp:
      return "Tcp";
    case Backend::kTcp4Streams:
      return "Tcp4Streams";
    case Backend::kInproc:
      return "Inproc";
    case Backend::kFaultTcp:
      return "FaultEmptyPlanOverTcp";
  }
  return "Unknown";
}

class ConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  std::unique_ptr<Transport> Make(uint64_t max_message_bytes = kDefaultMaxMessageBytes) {
    TcpOptions tcp;
    tcp.max_message_bytes = max_message_bytes;
    switch (GetParam()) {
      case Backend::kTcp4Streams:
        tcp.streams_per_link = 4;
        [[fallthrough]];
      case Backend::kTcp: {
        auto t = MakeTcpTransport(tcp);
        EXPECT_TRUE(t.ok()) << t.status().ToString();
        return std::move(t).value();
      }
      case Backend::kInproc:
        return MakeInprocTransport(network_, InprocOptions{max_message_bytes});
      case Backend::kFaultTcp: {
        auto t = MakeTcpTransport(tcp);
        EXPECT_TRUE(t.ok()) << t.status().ToString();
        return WrapWithFaults(std::move(t).value(), FaultPlan{});
      }
    }
    return nullptr;
  }

  // Listens on `server` and connects `client` to it.
  struct Link {
    std::unique_ptr<Connection> client;    // the connecting side
    std::unique_ptr<Connection> accepted;  // the listening side
  };
  Link Connect(Transport& server, Transport& client) {
    auto address = server.Listen("127.0.0.1:0", accept_.Handler());
    EXPECT_TRUE(address.ok()) << address.status().ToString();
    if (!address.ok()) return {};
    return ConnectTo(*address, client);
  }
  Link ConnectTo(const std::string& address, Transport& client) {
    Link link;
    auto connection = ConnectBlocking(client, address, kWait);
    EXPECT_TRUE(connection.ok()) << connection.status().ToString();
    if (!connection.ok()) return link;
    link.client = std::move(connection).value();
    link.accepted = accept_.Pop();
    EXPECT_NE(link.accepted, nullptr);
    return link;
  }

  std::shared_ptr<InprocNetwork> network_ = std::make_shared<InprocNetwork>();
  AcceptQueue accept_;
};

// Sends payloads with the given sizes and returns their hashes.
std::vector<uint64_t> SendAll(Connection& connection, const std::vector<size_t>& sizes,
                              uint64_t seed, SendLog* log) {
  std::vector<uint64_t> hashes;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto bytes = Payload(seed, i, sizes[i]);
    hashes.push_back(HashOf(bytes));
    connection.Send(MakeMessage(std::move(bytes)), log ? log->Handler(i) : SendHandler{});
  }
  return hashes;
}

void ExpectReceived(Sink& sink, const std::vector<size_t>& sizes,
                    const std::vector<uint64_t>& hashes) {
  ASSERT_TRUE(sink.WaitMessages(sizes.size()))
      << "got " << sink.message_count() << " of " << sizes.size();
  auto messages = sink.messages();
  ASSERT_EQ(messages.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(messages[i]->size(), sizes[i]) << "message " << i;
    ASSERT_EQ(HashOf(*messages[i]), hashes[i]) << "message " << i;
  }
  EXPECT_EQ(sink.violations(), 0);
}

void ExpectAllOkInOrder(SendLog& log, size_t count) {
  ASSERT_TRUE(log.WaitCount(count));
  auto order = log.order();
  auto statuses = log.statuses();
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(order[i], i);
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
  }
}

TEST_P(ConformanceTest, CapabilitiesDescribeTheBackend) {
  auto t = Make(12345678);
  const Capabilities& caps = t->capabilities();
  EXPECT_FALSE(caps.backend.empty());
  EXPECT_TRUE(caps.ordered);
  EXPECT_EQ(caps.max_message_bytes, 12345678u);
  ASSERT_FALSE(caps.memory_types.empty());
  EXPECT_EQ(caps.memory_types[0], MemoryType::kHost);
  EXPECT_EQ(caps.streams_per_link, GetParam() == Backend::kTcp4Streams ? 4u : 1u);
  if (GetParam() == Backend::kFaultTcp) {
    EXPECT_EQ(caps.backend, "fault(tcp)");
    EXPECT_NE(AsFaultTransport(t.get()), nullptr);
  } else {
    EXPECT_EQ(AsFaultTransport(t.get()), nullptr);
  }
}

TEST_P(ConformanceTest, ConnectAcceptAndExchange) {
  Sink server_sink, client_sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  EXPECT_FALSE(link.client->PeerAddress().empty());
  EXPECT_FALSE(link.accepted->PeerAddress().empty());
  server_sink.Start(*link.accepted);
  client_sink.Start(*link.client);
  SendLog client_log, server_log;
  link.client->Send(MakeMessage(Payload(1, 0, 100)), client_log.Handler(0));
  link.accepted->Send(MakeMessage(Payload(2, 0, 200)), server_log.Handler(0));
  ExpectReceived(server_sink, {100}, {HashOf(Payload(1, 0, 100))});
  ExpectReceived(client_sink, {200}, {HashOf(Payload(2, 0, 200))});
  ExpectAllOkInOrder(client_log, 1);
  ExpectAllOkInOrder(server_log, 1);
  EXPECT_TRUE(Eventually([&] { return link.client->QueuedBytes() == 0; }));
  EXPECT_EQ(server_sink.close_count(), 0);
}

TEST_P(ConformanceTest, OrderedDeliveryOfRandomSizes) {
  Sink sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  sink.Start(*link.accepted);
  std::mt19937_64 rng(42);
  std::vector<size_t> sizes(2000);
  for (auto& size : sizes) size = rng() % (64 * 1024 + 1);
  sizes[7] = 0;  // empty messages are messages too
  SendLog log;
  auto hashes = SendAll(*link.client, sizes, 3, &log);
  ExpectReceived(sink, sizes, hashes);
  ExpectAllOkInOrder(log, sizes.size());
  EXPECT_EQ(link.client->QueuedBytes(), 0u);
}

TEST_P(ConformanceTest, LargeMessages) {
  Sink sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  sink.Start(*link.accepted);
  const std::vector<size_t> sizes = {16 << 20, 16 << 20, 64 << 20, (16 << 20) + 1};
  SendLog log;
  auto hashes = SendAll(*link.client, sizes, 4, &log);
  ExpectReceived(sink, sizes, hashes);
  ExpectAllOkInOrder(log, sizes.size());
}

TEST_P(ConformanceTest, BothDirectionsConcurrently) {
  Sink server_sink, client_sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  server_sink.Start(*link.accepted);
  client_sink.Start(*link.client);
  std::mt19937_64 rng(5);
  std::vector<size_t> up(400), down(400);
  for (auto& s : up) s = rng() % (64 * 1024);
  for (auto& s : down) s = rng() % (64 * 1024);
  up[100] = down[200] = 4 << 20;
  std::vector<uint64_t> up_hashes, down_hashes;
  SendLog up_log, down_log;
  std::thread a([&] { up_hashes = SendAll(*link.client, up, 6, &up_log); });
  std::thread b([&] { down_hashes = SendAll(*link.accepted, down, 7, &down_log); });
  a.join();
  b.join();
  ExpectReceived(server_sink, up, up_hashes);
  ExpectReceived(client_sink, down, down_hashes);
  ExpectAllOkInOrder(up_log, up.size());
  ExpectAllOkInOrder(down_log, down.size());
}

TEST_P(ConformanceTest, ManyConnectionsAtOnce) {
  constexpr int kConnections = 24;
  constexpr int kMessages = 20;
  std::vector<std::unique_ptr<Sink>> sinks;
  for (int i = 0; i < kConnections; ++i) sinks.push_back(std::make_unique<Sink>());
  auto server = Make();
  auto client = Make();
  auto address = server->Listen("127.0.0.1:0", accept_.Handler());
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  // All connects in flight together.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Connection>> clients;
  int failures = 0;
  for (int i = 0; i < kConnections; ++i) {
    client->Connect(*address, [&](Result<std::unique_ptr<Connection>> r) {
      std::lock_guard lock(mu);
      if (r.ok()) {
        clients.push_back(std::move(r).value());
      } else {
        ++failures;
        ADD_FAILURE() << r.status().ToString();
      }
      cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, kWait, [&] { return clients.size() + failures == kConnections; }));
  }
  ASSERT_EQ(clients.size(), static_cast<size_t>(kConnections));
  std::vector<std::unique_ptr<Connection>> accepted;
  for (int i = 0; i < kConnections; ++i) {
    accepted.push_back(accept_.Pop());
    ASSERT_NE(accepted.back(), nullptr);
    sinks[i]->Start(*accepted.back());
  }
  // Client j tags its messages with j; each accepted connection must see one
  // client's messages, complete and in order.
  for (int j = 0; j < kConnections; ++j) {
    for (int m = 0; m < kMessages; ++m) {
      auto bytes = Payload(100 + j, m, 1000 + 37 * m);
      clients[j]->Send(MakeMessage(std::move(bytes)));
    }
  }
  std::set<uint64_t> seeds;
  for (int i = 0; i < kConnections; ++i) {
    ASSERT_TRUE(sinks[i]->WaitMessages(kMessages));
    auto messages = sinks[i]->messages();
    ASSERT_EQ(messages.size(), static_cast<size_t>(kMessages));
    int owner = -1;
    for (int j = 0; j < kConnections && owner < 0; ++j) {
      if (*messages[0] == Payload(100 + j, 0, 1000)) owner = j;
    }
    ASSERT_GE(owner, 0);
    seeds.insert(owner);
    for (int m = 0; m < kMessages; ++m) {
      ASSERT_EQ(*messages[m], Payload(100 + owner, m, 1000 + 37 * m));
    }
  }
  EXPECT_EQ(seeds.size(), static_cast<size_t>(kConnections));
}

TEST_P(ConformanceTest, SendAboveOwnLimitFailsAndKeepsTheLink) {
  Sink sink;
  auto server = Make();
  auto client = Make(1 << 20);
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  sink.Start(*link.accepted);
  SendLog log;
  link.client->Send(MakeMessage(std::vector<std::byte>((1 << 20) + 1)), log.Handler(0));
  link.client->Send(nullptr, log.Handler(1));
  link.client->Send(MakeMessage(Payload(8, 0, 1 << 20)), log.Handler(2));
  ASSERT_TRUE(log.WaitCount(3));
  EXPECT_EQ(log.order(), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(log.statuses()[0].code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(log.statuses()[1].code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(log.statuses()[2].ok());
  ExpectReceived(sink, {1 << 20}, {HashOf(Payload(8, 0, 1 << 20))});
  EXPECT_EQ(sink.close_count(), 0);
}

TEST_P(ConformanceTest, ReceiverRejectsMessageAboveItsLimitAndClosesTheLink) {
  Sink server_sink, client_sink;
  auto server = Make(1 << 20);
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  server_sink.Start(*link.accepted);
  client_sink.Start(*link.client);
  link.client->Send(MakeMessage(Payload(9, 0, 1000)));
  ASSERT_TRUE(server_sink.WaitMessages(1));
  link.client->Send(MakeMessage(std::vector<std::byte>((1 << 20) + 1)));
  ASSERT_TRUE(server_sink.WaitClosed());
  EXPECT_EQ(server_sink.close_status().code(), StatusCode::kCorrupt)
      << server_sink.close_status().ToString();
  EXPECT_NE(server_sink.close_status().message().find("max_message_bytes"), std::string::npos);
  EXPECT_EQ(server_sink.message_count(), 1u);
  ASSERT_TRUE(client_sink.WaitClosed());
  EXPECT_FALSE(client_sink.close_status().ok());
  EXPECT_EQ(server_sink.close_count(), 1);
  EXPECT_EQ(server_sink.violations(), 0);
}

TEST_P(ConformanceTest, OrderlyCloseDeliversEverythingSentBefore) {
  Sink server_sink, client_sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  server_sink.Start(*link.accepted);
  client_sink.Start(*link.client);
  std::vector<size_t> sizes(10, 50000);
  SendLog log;
  auto hashes = SendAll(*link.client, sizes, 10, &log);
  ExpectAllOkInOrder(log, sizes.size());
  link.client->Close();
  link.client->Close();  // idempotent
  ASSERT_TRUE(client_sink.WaitClosed());
  EXPECT_TRUE(client_sink.close_status().ok()) << client_sink.close_status().ToString();
  ExpectReceived(server_sink, sizes, hashes);
  ASSERT_TRUE(server_sink.WaitClosed());
  EXPECT_TRUE(server_sink.close_status().ok()) << server_sink.close_status().ToString();
  // Sends after the close fail, after on_closed.
  SendLog late;
  link.client->Send(MakeMessage(Payload(1, 1, 10)), late.Handler(0));
  link.accepted->Send(MakeMessage(Payload(1, 1, 10)), late.Handler(1));
  ASSERT_TRUE(late.WaitCount(2));
  for (const Status& s : late.statuses()) EXPECT_FALSE(s.ok());
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(client_sink.close_count(), 1);
  EXPECT_EQ(server_sink.close_count(), 1);
  EXPECT_EQ(server_sink.message_count(), sizes.size());
}

TEST_P(ConformanceTest, CloseFailsPendingSendsAndRunsOnClosedLast) {
  Sink server_sink, client_sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  // The server does not read yet, so sends pile up behind the socket buffers.
  constexpr int kCount = 64;
  std::atomic<int> sent_before_close{-1};
  std::atomic<int> on_sent_calls{0};
  client_sink.Start(*link.client);
  SendLog log;
  std::vector<size_t> sizes(kCount, 1 << 20);
  for (int i = 0; i < kCount; ++i) {
    link.client->Send(MakeMessage(Payload(11, i, sizes[i])), [&, i, h = log.Handler(i)](Status s) {
      ++on_sent_calls;
      if (client_sink.close_count() > 0) sent_before_close = i;  // after on_closed: a bug
      h(std::move(s));
    });
  }
  EXPECT_GT(link.client->QueuedBytes(), 0u);
  link.client->Close();
  ASSERT_TRUE(client_sink.WaitClosed());
  EXPECT_TRUE(client_sink.close_status().ok()) << client_sink.close_status().ToString();
  EXPECT_EQ(on_sent_calls.load(), kCount);  // every on_sent ran, before on_closed
  EXPECT_EQ(sent_before_close.load(), -1);
  auto order = log.order();
  auto statuses = log.statuses();
  // Leading messages were handed over; the rest were cut off. (On a striped link a
  // later message may have gone out on another stream while an earlier one was cut.)
  size_t ok = 0;
  while (ok < statuses.size() && statuses[ok].ok()) ++ok;
  ASSERT_LT(ok, statuses.size()) << "nothing was pending when Close ran";
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i);
  for (size_t i = ok; i < statuses.size(); ++i) {
    if (!statuses[i].ok()) {
      EXPECT_EQ(statuses[i].code(), StatusCode::kAborted) << i << ": " << statuses[i].ToString();
    }
  }
  EXPECT_FALSE(statuses.back().ok());
  EXPECT_EQ(link.client->QueuedBytes(), 0u);
  // The peer gets a prefix of what was handed over, then exactly one on_closed.
  server_sink.Start(*link.accepted);
  ASSERT_TRUE(server_sink.WaitClosed());
  auto received = server_sink.messages();
  EXPECT_LE(received.size(), ok);
  for (size_t i = 0; i < received.size(); ++i) {
    EXPECT_EQ(*received[i], Payload(11, i, sizes[i]));
  }
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(server_sink.close_count(), 1);
  EXPECT_EQ(client_sink.close_count(), 1);
  EXPECT_EQ(server_sink.violations(), 0);
}

TEST_P(ConformanceTest, StartAfterThePeerClosedStillReportsTheClose) {
  Sink sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  link.client->Close();
  link.client.reset();
  std::this_thread::sleep_for(milliseconds(20));
  sink.Start(*link.accepted);
  link.accepted->Start([](Message) {}, [](Status) { ADD_FAILURE() << "second Start ran"; });
  ASSERT_TRUE(sink.WaitClosed());
  EXPECT_TRUE(sink.close_status().ok()) << sink.close_status().ToString();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(sink.close_count(), 1);
}

TEST_P(ConformanceTest, AbortMakesThePeerSeeABrokenLink) {
  Sink server_sink, client_sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  server_sink.Start(*link.accepted);
  client_sink.Start(*link.client);
  SendLog log;
  auto hashes = SendAll(*link.client, {1000, 2000}, 12, &log);
  ExpectAllOkInOrder(log, 2);
  link.client->Abort();
  ASSERT_TRUE(client_sink.WaitClosed());
  EXPECT_EQ(client_sink.close_status().code(), StatusCode::kAborted);
  ASSERT_TRUE(server_sink.WaitClosed());
  EXPECT_EQ(server_sink.close_status().code(), StatusCode::kUnavailable)
      << server_sink.close_status().ToString();
  ExpectReceived(server_sink, {1000, 2000}, hashes);  // everything handed over arrived
}

TEST_P(ConformanceTest, DestroyingAConnectionSilencesItsHandlers) {
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  std::atomic<bool> destroyed{false};
  std::atomic<int> after{0};
  std::atomic<int> received{0};
  link.accepted->Start(
      [&](Message) {
        if (destroyed) ++after;
        ++received;
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow consumer
        if (destroyed) ++after;
      },
      [&](Status) {
        if (destroyed) ++after;
      });
  for (int i = 0; i < 2000; ++i) link.client->Send(MakeMessage(Payload(13, i, 4000)));
  ASSERT_TRUE(Eventually([&] { return received > 10; }));
  link.accepted.reset();
  destroyed = true;
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(after.load(), 0);
}

TEST_P(ConformanceTest, AConnectionMayDestroyItselfFromItsOwnHandler) {
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  std::mutex mu;
  std::unique_ptr<Connection> accepted = std::move(link.accepted);
  std::atomic<bool> done{false};
  accepted->Start(
      [&](Message) {
        std::lock_guard lock(mu);
        accepted.reset();  // the destructor must not wait for this very handler
        done = true;
      },
      [](Status) {});
  link.client->Send(MakeMessage(Payload(14, 0, 10)));
  link.client->Send(MakeMessage(Payload(14, 1, 10)));
  ASSERT_TRUE(Eventually([&] { return done.load(); }));
}

TEST_P(ConformanceTest, SenderTransportDiesMidMessage) {
  Sink server_sink, client_sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  client_sink.Start(*link.client);
  // The receiver is not reading: a 64 MiB message cannot be fully handed over.
  SendLog log;
  link.client->Send(MakeMessage(std::vector<std::byte>(64 << 20)), log.Handler(0));
  std::this_thread::sleep_for(milliseconds(20));
  const auto start = Clock::now();
  client->Shutdown();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(log.count(), 1u);  // ran during Shutdown
  EXPECT_EQ(log.statuses()[0].code(), StatusCode::kAborted) << log.statuses()[0].ToString();
  ASSERT_EQ(client_sink.close_count(), 1);
  EXPECT_EQ(client_sink.close_status().code(), StatusCode::kAborted);
  server_sink.Start(*link.accepted);
  ASSERT_TRUE(server_sink.WaitClosed());
  EXPECT_EQ(server_sink.close_status().code(), StatusCode::kUnavailable)
      << server_sink.close_status().ToString();
  EXPECT_EQ(server_sink.message_count(), 0u);
}

TEST_P(ConformanceTest, ReceiverTransportDiesMidMessage) {
  Sink client_sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  client_sink.Start(*link.client);
  SendLog log;
  link.client->Send(MakeMessage(std::vector<std::byte>(64 << 20)), log.Handler(0));
  std::this_thread::sleep_for(milliseconds(20));
  server->Shutdown();
  ASSERT_TRUE(client_sink.WaitClosed());
  EXPECT_EQ(client_sink.close_status().code(), StatusCode::kUnavailable)
      << client_sink.close_status().ToString();
  ASSERT_TRUE(log.WaitCount(1));
  EXPECT_FALSE(log.statuses()[0].ok());
}

TEST_P(ConformanceTest, ConnectToAClosedAddressIsUnavailable) {
  auto server = Make();
  auto client = Make();
  auto address = server->Listen("127.0.0.1:0", accept_.Handler());
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  server->Shutdown();
  const auto start = Clock::now();
  auto connection = ConnectBlocking(*client, *address, milliseconds(5000));
  ASSERT_FALSE(connection.ok());
  EXPECT_EQ(connection.status().code(), StatusCode::kUnavailable) << connection.status().ToString();
  EXPECT_LT(Clock::now() - start, milliseconds(4000));
  // A malformed address is refused as such.
  auto bad = ConnectBlocking(*client, "no-port-here", milliseconds(5000));
  ASSERT_FALSE(bad.ok());
  if (GetParam() != Backend::kInproc) {
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST_P(ConformanceTest, ShutdownWithLiveTrafficJoinsAndSilencesHandlers) {
  auto server = Make();
  auto client = Make();
  std::atomic<bool> server_down{false}, client_down{false};
  std::atomic<int> late{0};
  std::atomic<int> server_closed{0}, client_closed{0};
  std::vector<Link> links;
  for (int i = 0; i < 4; ++i) {
    if (i == 0) {
      links.push_back(Connect(*server, *client));
    } else {
      auto address = server->Listen("127.0.0.1:0", accept_.Handler());
      ASSERT_TRUE(address.ok());
      links.push_back(ConnectTo(*address, *client));
    }
    ASSERT_TRUE(links.back().client && links.back().accepted);
  }
  // Each client keeps two messages in flight, re-sending from on_sent; each
  // server echoes.
  std::function<void(Connection*, int)> pump = [&](Connection* c, int n) {
    c->Send(MakeMessage(Payload(15, n, 30000)), [&, c, n](Status s) {
      if (client_down) ++late;
      if (s.ok()) pump(c, n + 1);
    });
  };
  for (auto& link : links) {
    Connection* accepted = link.accepted.get();
    accepted->Start(
        [&, accepted](Message m) {
          if (server_down) ++late;
          accepted->Send(m, [&](Status) {
            if (server_down) ++late;
          });
        },
        [&](Status) {
          if (server_down) ++late;
          ++server_closed;
        });
    link.client->Start(
        [&](Message) {
          if (client_down) ++late;
        },
        [&](Status) {
          if (client_down) ++late;
          ++client_closed;
        });
    pump(link.client.get(), 0);
    pump(link.client.get(), 1000000);
  }
  std::this_thread::sleep_for(milliseconds(100));
  server->Shutdown();
  server_down = true;
  EXPECT_EQ(server_closed.load(), 4);  // their on_closed ran during Shutdown
  ASSERT_TRUE(Eventually([&] { return client_closed.load() == 4; }));
  client->Shutdown();
  client_down = true;
  // Using connections of a shut-down transport is safe and silent.
  for (auto& link : links) {
    link.client->Send(MakeMessage(Payload(1, 1, 10)), [&](Status) { ++late; });
    link.accepted->Send(MakeMessage(Payload(1, 1, 10)), [&](Status) { ++late; });
    link.client->Close();
  }
  server->Shutdown();  // idempotent
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(late.load(), 0);
  links.clear();  // connections outlive their transports
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest,
                         ::testing::Values(Backend::kTcp, Backend::kTcp4Streams, Backend::kInproc,
                                           Backend::kFaultTcp),
                         BackendName);

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

TEST(TcpWireTest, HandWrittenFramesAreDelivered) {
  AcceptQueue accept;
  Sink sink;
  auto server = MakeTcp();
  auto address = server->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  RawSocket raw(*address);
  Handshake(raw, 77, 0, 1);
  ExpectAck(raw, 77, 0, 1);
  auto connection = accept.Pop();
  ASSERT_NE(connection, nullptr);
  sink.Start(*connection);
  auto bytes = Frame(1, 5, 0);
  for (char c : std::string("hello")) bytes.push_back(std::byte(c));
  auto empty = Frame(1, 0, 1);
  bytes.insert(bytes.end(), empty.begin(), empty.end());
  raw.Write(bytes);
  ASSERT_TRUE(sink.WaitMessages(2));
  EXPECT_EQ(AsChars(*sink.messages()[0]), "hello");
  EXPECT_TRUE(sink.messages()[1]->empty());
  // An orderly goodbye after 2 messages closes the link with OK.
  raw.Write(Frame(4, 0, 2));
  ASSERT_TRUE(sink.WaitClosed());
  EXPECT_TRUE(sink.close_status().ok()) << sink.close_status().ToString();
}

TEST(TcpWireTest, GoodbyeAnnouncingUnsentMessagesBreaksTheLink) {
  AcceptQueue accept;
  Sink sink;
  auto server = MakeTcp();
  auto address = server->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  RawSocket raw(*address);
  Handshake(raw, 5, 0, 1);
  ExpectAck(raw, 5, 0, 1);
  auto connection = accept.Pop();
  ASSERT_NE(connection, nullptr);
  sink.Start(*connection);
  auto bytes = Frame(1, 1, 0);
  bytes.push_back(std::byte{'x'});
  auto goodbye = Frame(4, 0, 3);  // claims three messages, sent one
  bytes.insert(bytes.end(), goodbye.begin(), goodbye.end());
  raw.Write(bytes);
  ASSERT_TRUE(sink.WaitClosed());
  EXPECT_EQ(sink.close_status().code(), StatusCode::kUnavailable) << sink.close_status().ToString();
  EXPECT_EQ(sink.message_count(), 1u);
}

TEST(TcpWireTest, HugeLengthClosesTheLinkBeforeAllocating) {
  AcceptQueue accept;
  Sink sink;
  auto server = MakeTcp(1 << 20);
  auto address = server->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  RawSocket raw(*address);
  Handshake(raw, 1, 0, 1);
  ExpectAck(raw, 1, 0, 1);
  auto connection = accept.Pop();
  ASSERT_NE(connection, nullptr);
  sink.Start(*connection);
  raw.Write(Frame(1, uint64_t{1} << 50, 0));  // a petabyte: allocating it would abort
  ASSERT_TRUE(sink.WaitClosed());
  EXPECT_EQ(sink.close_status().code(), StatusCode::kCorrupt) << sink.close_status().ToString();
  EXPECT_EQ(sink.message_count(), 0u);
  EXPECT_TRUE(raw.SeesClose());
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
    AcceptQueue accept;
    Sink sink;
    auto server = MakeTcp();
    auto address = server->Listen("127.0.0.1:0", accept.Handler());
    ASSERT_TRUE(address.ok());
    RawSocket raw(*address);
    Handshake(raw, 2, 0, 1);
    ExpectAck(raw, 2, 0, 1);
    auto connection = accept.Pop();
    ASSERT_NE(connection, nullptr);
    sink.Start(*connection);
    c.bytes.resize(c.bytes.size() + 8);  // some payload bytes
    raw.Write(c.bytes);
    ASSERT_TRUE(sink.WaitClosed());
    EXPECT_EQ(sink.close_status().code(), StatusCode::kCorrupt) << sink.close_status().ToString();
    EXPECT_EQ(sink.message_count(), 0u);
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
