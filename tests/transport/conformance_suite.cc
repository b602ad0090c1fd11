// The conformance suite's tests (the fixture and backend parameter are in
// conformance_suite.h); each backend instantiates it in its own test file.
#include "tests/transport/conformance_suite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "common/bytes.h"
#include "tests/transport/test_util.h"
#include "transport/fault_transport.h"
#include "transport/transport.h"

namespace deltacast::transport {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

namespace {

void ExpectAllOkInOrder(SendLog& log, size_t count) {
  ASSERT_TRUE(log.WaitCount(count));
  auto order = log.order();
  auto statuses = log.statuses();
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(order[i], i);
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].ToString();
  }
}

}  // namespace

TEST_P(ConformanceTest, CapabilitiesDescribeTheBackend) {
  auto t = Make(12345678);
  const Capabilities& caps = t->capabilities();
  EXPECT_FALSE(caps.backend.empty());
  EXPECT_TRUE(caps.ordered);
  EXPECT_EQ(caps.max_message_bytes, 12345678u);
  ASSERT_FALSE(caps.memory_types.empty());
  EXPECT_EQ(caps.memory_types[0], MemoryType::kHost);
  EXPECT_EQ(caps.streams_per_link, GetParam().streams_per_link);
  EXPECT_EQ(caps.backend, GetParam().expected_backend);
  if (GetParam().is_fault_wrapper) {
    EXPECT_NE(AsFaultTransport(t.get()), nullptr);
  } else {
    EXPECT_EQ(AsFaultTransport(t.get()), nullptr);
  }
}

TEST_P(ConformanceTest, RegionsOfHostMemorySendAndDeviceMemoryIsRefusedByCapability) {
  Sink sink;
  auto server = Make();
  auto client = Make();
  auto link = Connect(*server, *client);
  ASSERT_TRUE(link.client && link.accepted);
  sink.Start(*link.accepted);
  const auto bytes = Payload(21, 0, 5000);
  SendLog log;
  ASSERT_TRUE(
      link.client->SendRegion({MemoryType::kHost, bytes.data(), bytes.size()}, log.Handler(0))
          .ok());
  ExpectReceived(sink, {5000}, {HashOf(bytes)});
  ExpectAllOkInOrder(log, 1);
  const auto& types = client->capabilities().memory_types;
  if (std::find(types.begin(), types.end(), MemoryType::kCudaDevice) == types.end()) {
    int device_buffer = 0;  // never dereferenced: refused by type
    const Status refused = link.client->SendRegion(
        {MemoryType::kCudaDevice, &device_buffer, sizeof device_buffer}, log.Handler(1));
    EXPECT_EQ(refused.code(), StatusCode::kUnsupported) << refused.ToString();
    EXPECT_NE(refused.message().find("stage it through host"), std::string::npos);
    std::this_thread::sleep_for(milliseconds(20));
    EXPECT_EQ(log.count(), 1u);        // its on_sent never runs
    EXPECT_EQ(sink.close_count(), 0);  // and the link stays up
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
  auto address = server->Listen(GetParam().listen_address, accept_.Handler());
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
  auto address = server->Listen(GetParam().listen_address, accept_.Handler());
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
  if (GetParam().rejects_malformed_address) {
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
      auto address = server->Listen(GetParam().listen_address, accept_.Handler());
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

}  // namespace deltacast::transport
