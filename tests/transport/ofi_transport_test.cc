// ofi-specific behaviour: option validation and a peer killed with SIGKILL.
#include "transport/ofi/ofi_transport.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>

#include "tests/transport/test_util.h"
#include "transport/factory.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

// libfabric's shm provider names a process's region after its pid ("PID:0:0" in
// /dev/shm) and removes it at exit; a killed child cannot, so the test does (else
// every run leaves 16 MiB behind, and a later process with the same pid fails).
void RemoveShmRegionsOf(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (entry.path().filename().string().starts_with(prefix)) std::filesystem::remove(entry, ec);
  }
}

TEST(OfiOptions, UnknownProviderIsRefusedByName) {
  OfiOptions options;
  options.provider = "no-such-provider";
  auto transport = MakeOfiTransport(options);
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(transport.status().message().find("no-such-provider"), std::string::npos)
      << transport.status().ToString();
}

TEST(OfiOptions, BadValuesAreRefused) {
  OfiOptions zero_limit;
  zero_limit.max_message_bytes = 0;
  EXPECT_EQ(MakeOfiTransport(zero_limit).status().code(), StatusCode::kInvalidArgument);
  OfiOptions tiny_timeout;
  tiny_timeout.peer_timeout = milliseconds(1);
  EXPECT_EQ(MakeOfiTransport(tiny_timeout).status().code(), StatusCode::kInvalidArgument);
}

TEST(OfiOptions, FactoryMapsProvider) {
  TransportOptions options;
  options.provider = "shm";
  options.net_device = "lo";
  auto transport = MakeTransport("ofi", options);
  ASSERT_TRUE(transport.ok()) << transport.status().ToString();
  EXPECT_EQ((*transport)->capabilities().backend, "ofi");
  options.provider = "bogus";
  auto bad = MakeTransport("ofi", options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bogus"), std::string::npos);
}

// net_device binds the endpoint a Connect uses: the listener sees the peer at the
// named interface's address, not at the provider's pick (tcp: an external
// interface, even to reach 127.0.0.1). Every test here passes "lo".
TEST(OfiOptions, NetDeviceBindsTheConnectingEndpoint) {
  OfiOptions options;
  options.net_device = "lo";
  auto server = MakeOfiTransport(options);
  auto client = MakeOfiTransport(options);
  ASSERT_TRUE(server.ok() && client.ok());
  AcceptQueue accept;
  auto [connection, accepted] = ListenAndConnect(**server, **client, "127.0.0.1:0", accept);
  ASSERT_TRUE(connection && accepted);
  EXPECT_TRUE(accepted->PeerAddress().starts_with("127.0.0.1:")) << accepted->PeerAddress();
  options.net_device = "no-such-if0";
  auto bad = MakeOfiTransport(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("no-such-if0"), std::string::npos);
}

// Before Authenticated() a large message is not granted (nothing allocated; the
// sender keeps it); small ones arrive. After it, the large one does too.
TEST(OfiLimits, LargeMessagesWaitForAuthentication) {
  OfiOptions options;
  options.net_device = "lo";
  auto server = MakeOfiTransport(options);
  auto client = MakeOfiTransport(options);
  ASSERT_TRUE(server.ok() && client.ok());
  AcceptQueue accept;
  auto address = (*server)->Listen("127.0.0.1:0", accept.Handler());
  ASSERT_TRUE(address.ok());
  auto connection = ConnectBlocking(**client, *address, kWait);
  ASSERT_TRUE(connection.ok()) << connection.status().ToString();
  auto peer = accept.Pop();
  ASSERT_NE(peer, nullptr);
  std::atomic<int> small{0}, large{0};
  peer->Start([&](Message m) { ++(m->size() > (1 << 20) ? large : small); }, [](Status) {});
  (*connection)->Start([](Message) {}, [](Status) {});
  (*connection)->Send(MakeMessage(std::vector<std::byte>(100, std::byte{1})));
  (*connection)->Send(MakeMessage(std::vector<std::byte>(4 << 20, std::byte{2})));
  for (int i = 0; i < 100 && small == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(small, 1);
  EXPECT_EQ(large, 0) << "a 4 MiB message was granted before authentication";
  peer->Authenticated();
  for (int i = 0; i < 300 && large == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(large, 1);
}

// Not a test on its own: the body of the child process of OfiPeerKilled.
TEST(OfiChild, StreamsUntilKilled) {
  const char* address = getenv("DELTACAST_OFI_CHILD_ADDRESS");
  const char* provider = getenv("DELTACAST_OFI_CHILD_PROVIDER");
  if (!address || !provider) GTEST_SKIP() << "runs only as OfiPeerKilled's child";
  OfiOptions options;
  options.provider = provider;
  options.net_device = "lo";
  auto client = MakeOfiTransport(options);
  if (!client.ok()) _exit(2);
  auto link = ConnectBlocking(**client, address, milliseconds(5000));
  if (!link.ok()) _exit(3);
  (*link)->Start([](Message) {}, [](Status) {});
  for (int i = 0; i < 100000; ++i) {
    while ((*link)->QueuedBytes() > (uint64_t{32} << 20)) usleep(1000);
    (*link)->Send(MakeMessage(Payload(21, i, 4 << 20)));
  }
  _exit(4);
}

class OfiPeerKilled : public ::testing::TestWithParam<std::string> {};

// A child process connects and streams 4 MiB messages; the parent reads a few and
// then kills it with SIGKILL. The parent's link must end with an error within
// peer_timeout (plus slack), and its own pending sends must fail, not hang.
TEST_P(OfiPeerKilled, SurvivorSeesTheLinkBreakInBoundedTime) {
  OfiOptions options;
  options.provider = GetParam();
  options.net_device = "lo";
  options.peer_timeout = milliseconds(1000);
  auto server = MakeOfiTransport(options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  AcceptQueue accepted;
  auto address =
      (*server)->Listen(GetParam() == "shm" ? "dc-kill:0" : "127.0.0.1:0", accepted.Handler());
  ASSERT_TRUE(address.ok()) << address.status().ToString();

  // The child is this test binary re-executed (a fresh process, no threads
  // inherited from fork), running OfiChild.StreamsUntilKilled.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("DELTACAST_OFI_CHILD_ADDRESS", address->c_str(), 1);
    setenv("DELTACAST_OFI_CHILD_PROVIDER", GetParam().c_str(), 1);
    execl("/proc/self/exe", "/proc/self/exe", "--gtest_filter=OfiChild.StreamsUntilKilled",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  struct Reaper {  // never leave the child behind, whatever fails, nor its shm region
    pid_t pid;
    ~Reaper() {
      if (pid <= 0) return;
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      RemoveShmRegionsOf(pid);
    }
  } reaper{child};
  auto connection = accepted.Pop();
  ASSERT_NE(connection, nullptr);
  Sink sink;
  sink.Start(*connection);
  ASSERT_TRUE(sink.WaitMessages(3));
  SendLog log;
  connection->Send(MakeMessage(Payload(22, 0, 1 << 20)), log.Handler(0));
  kill(child, SIGKILL);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  RemoveShmRegionsOf(child);
  reaper.pid = -1;
  const auto killed_at = Clock::now();
  ASSERT_TRUE(sink.WaitClosed(milliseconds(5000)));
  const auto detected = Clock::now() - killed_at;
  EXPECT_LT(detected, milliseconds(3000));
  std::printf("peer killed: link ended after %lld ms: %s\n",
              static_cast<long long>(std::chrono::duration_cast<milliseconds>(detected).count()),
              sink.close_status().ToString().c_str());
  EXPECT_FALSE(sink.close_status().ok());
  EXPECT_EQ(sink.close_status().code(), StatusCode::kUnavailable) << sink.close_status().ToString();
  ASSERT_TRUE(log.WaitCount(1, milliseconds(5000)));
  const auto start = Clock::now();
  (*server)->Shutdown();
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

class OfiLink : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Transport> Make(milliseconds peer_timeout = milliseconds(10000)) {
    OfiOptions options;
    options.provider = GetParam();
    options.net_device = "lo";
    options.peer_timeout = peer_timeout;
    auto transport = MakeOfiTransport(options);
    EXPECT_TRUE(transport.ok()) << transport.status().ToString();
    return transport.ok() ? std::move(transport).value() : nullptr;
  }
  std::string ListenAddress() const { return GetParam() == "shm" ? "dc-link:0" : "127.0.0.1:0"; }
  AcceptQueue accept_;
};

// Keepalives hold an idle link open well past peer_timeout. One second, not less:
// on a busy two-core machine a progress thread can go unscheduled for a few hundred
// milliseconds (a 300 ms timeout failed a full-suite run that way).
TEST_P(OfiLink, IdleLinkOutlivesPeerTimeout) {
  auto server = Make(milliseconds(1000));
  auto client = Make(milliseconds(1000));
  auto [connection, accepted] = ListenAndConnect(*server, *client, ListenAddress(), accept_);
  ASSERT_TRUE(connection && accepted);
  Sink server_sink, client_sink;
  server_sink.Start(*accepted);
  client_sink.Start(*connection);
  std::this_thread::sleep_for(milliseconds(3000));
  connection->Send(MakeMessage(Payload(31, 0, 100000)));
  ASSERT_TRUE(server_sink.WaitMessages(1));
  EXPECT_EQ(server_sink.close_count(), 0);
  EXPECT_EQ(client_sink.close_count(), 0);
}

// Small messages are handed over (on_sent OK) before the receiver starts; after
// the sender's orderly close the receiver still gets every one, then OK.
TEST_P(OfiLink, SmallMessagesSentBeforeStartSurviveTheSendersClose) {
  auto server = Make();
  auto client = Make();
  auto [connection, accepted] = ListenAndConnect(*server, *client, ListenAddress(), accept_);
  ASSERT_TRUE(connection && accepted);
  SendLog log;
  std::vector<size_t> sizes = {0, 1, 100, 4096, 17};
  std::vector<uint64_t> hashes;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto bytes = Payload(32, i, sizes[i]);
    hashes.push_back(HashOf(bytes));
    connection->Send(MakeMessage(std::move(bytes)), log.Handler(i));
  }
  ASSERT_TRUE(log.WaitCount(sizes.size()));
  for (const Status& status : log.statuses()) EXPECT_TRUE(status.ok()) << status.ToString();
  connection->Close();
  std::this_thread::sleep_for(milliseconds(50));
  Sink sink;
  sink.Start(*accepted);
  ExpectReceived(sink, sizes, hashes);
  ASSERT_TRUE(sink.WaitClosed());
  EXPECT_TRUE(sink.close_status().ok()) << sink.close_status().ToString();
}

// Agents listen on and connect to the "host:port" of the cluster config: over
// shm both sides map it to the same endpoint name, so they meet; another port
// is another name.
TEST(OfiShmAddresses, HostPortListenAndConnectMeet) {
  OfiOptions options;
  options.provider = "shm";
  options.net_device = "lo";
  options.connect_timeout = milliseconds(300);
  auto server = MakeOfiTransport(options);
  auto client = MakeOfiTransport(options);
  ASSERT_TRUE(server.ok() && client.ok());
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  AcceptQueue accept;
  auto bound = (*server)->Listen(address, accept.Handler());
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  // The port is taken now, as for tcp.
  EXPECT_FALSE((*server)->Listen(address, accept.Handler()).ok());
  for (const std::string& target : {address, *bound}) {
    auto connection = ConnectBlocking(**client, target, kWait);
    ASSERT_TRUE(connection.ok()) << target << ": " << connection.status().ToString();
    auto accepted = accept.Pop();
    ASSERT_NE(accepted, nullptr) << target;
    Sink sink;
    sink.Start(*accepted);
    (*connection)->Start([](Message) {}, [](Status) {});
    const std::vector<size_t> sizes = {10, 100000};
    const auto hashes = SendAll(**connection, sizes, 41, nullptr);
    ExpectReceived(sink, sizes, hashes);
  }
  auto other = ConnectBlocking(**client, "127.0.0.1:" + std::to_string(port + 1), kWait);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kUnavailable) << other.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiLink, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           return info.param == "shm" ? std::string("Shm") : std::string("TcpRxm");
                         });

INSTANTIATE_TEST_SUITE_P(Providers, OfiPeerKilled, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           return info.param == "shm" ? std::string("Shm") : std::string("TcpRxm");
                         });

}  // namespace
}  // namespace deltacast::transport

namespace deltacast::transport {
namespace {

// Measurements for docs/transport.md, not checks: run with
// --gtest_also_run_disabled_tests --gtest_filter='*OfiProbe*'.
class OfiProbe : public ::testing::TestWithParam<std::string> {
 protected:
  struct Pair {
    std::unique_ptr<Transport> server, client;
    std::unique_ptr<Connection> accepted, connected;
  };
  Pair MakePair(OfiRegistration registration = OfiRegistration::kAuto) {
    OfiOptions options;
    options.provider = GetParam();
    options.net_device = "lo";
    options.register_memory = registration;
    Pair p;
    p.server = std::move(MakeOfiTransport(options)).value();
    p.client = std::move(MakeOfiTransport(options)).value();
    auto address =
        p.server->Listen(GetParam() == "shm" ? "probe:0" : "127.0.0.1:0", accept_.Handler());
    p.connected = std::move(ConnectBlocking(*p.client, *address, kWait)).value();
    p.accepted = accept_.Pop();
    return p;
  }
  AcceptQueue accept_;
};

// One recurring Message (a send-cache hit every time with kAlways).
TEST_P(OfiProbe, DISABLED_OneWayThroughput) {
  for (auto registration : {OfiRegistration::kAuto, OfiRegistration::kAlways})
    for (size_t size : {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
      Pair p = MakePair(registration);
      std::atomic<uint64_t> received{0};
      p.accepted->Start([&](Message m) { received += m->size(); }, [](Status) {});
      p.connected->Start([](Message) {}, [](Status) {});
      const int count = static_cast<int>((uint64_t{2} << 30) / size);
      auto message = MakeMessage(Payload(1, 0, size));
      const auto start = Clock::now();
      std::atomic<int> in_flight{0};
      for (int i = 0; i < count; ++i) {
        while (in_flight >= 8) std::this_thread::yield();
        ++in_flight;
        p.connected->Send(message, [&](Status) { --in_flight; });
      }
      ASSERT_TRUE(
          Eventually([&] { return received == uint64_t(count) * size; }, milliseconds(60000)));
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      std::printf("%s %s %zu MiB x %d: %.0f MB/s\n", GetParam().c_str(),
                  registration == OfiRegistration::kAuto ? "kAuto" : "kAlways", size >> 20, count,
                  count * double(size) / seconds / 1e6);
    }
}

TEST_P(OfiProbe, DISABLED_PingPongLatency) {
  Pair p = MakePair();
  Connection* accepted = p.accepted.get();
  p.accepted->Start([accepted](Message m) { accepted->Send(m); }, [](Status) {});
  std::mutex mu;
  std::condition_variable cv;
  int got = 0;
  p.connected->Start(
      [&](Message) {
        std::lock_guard lock(mu);
        ++got;
        cv.notify_all();
      },
      [](Status) {});
  auto message = MakeMessage(Payload(2, 0, 64));
  for (int pause_ms : {0, 5}) {
    const int rounds = pause_ms ? 100 : 2000;
    double total = 0;
    for (int i = 0; i < rounds; ++i) {
      if (pause_ms) std::this_thread::sleep_for(milliseconds(pause_ms));  // let both sides idle
      const auto start = Clock::now();
      std::unique_lock lock(mu);
      const int want = got + 1;
      p.connected->Send(message);
      cv.wait(lock, [&] { return got >= want; });
      total += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    }
    std::printf("%s 64 B round trip (idle %d ms before each): %.1f us\n", GetParam().c_str(),
                pause_ms, total / rounds);
  }
}

TEST_P(OfiProbe, DISABLED_IdleCpu) {
  Pair p = MakePair();
  p.accepted->Start([](Message) {}, [](Status) {});
  p.connected->Start([](Message) {}, [](Status) {});
  const auto cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
  };
  const double before = cpu();
  std::this_thread::sleep_for(milliseconds(3000));
  std::printf("%s idle: %.1f%% of one core for two transports\n", GetParam().c_str(),
              (cpu() - before) / 3.0 * 100);
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiProbe, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           return info.param == "shm" ? std::string("Shm") : std::string("TcpRxm");
                         });

}  // namespace
}  // namespace deltacast::transport
