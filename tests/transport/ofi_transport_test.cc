// ofi-specific behaviour: option validation and a peer killed with SIGKILL.
#include "transport/ofi/ofi_transport.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "tests/transport/test_util.h"
#include "transport/factory.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

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
  auto transport = MakeTransport("ofi", options);
  ASSERT_TRUE(transport.ok()) << transport.status().ToString();
  EXPECT_EQ((*transport)->capabilities().backend, "ofi");
  options.provider = "bogus";
  auto bad = MakeTransport("ofi", options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bogus"), std::string::npos);
}

// Not a test on its own: the body of the child process of OfiPeerKilled.
TEST(OfiChild, StreamsUntilKilled) {
  const char* address = getenv("DELTACAST_OFI_CHILD_ADDRESS");
  const char* provider = getenv("DELTACAST_OFI_CHILD_PROVIDER");
  if (!address || !provider) GTEST_SKIP() << "runs only as OfiPeerKilled's child";
  OfiOptions options;
  options.provider = provider;
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
  const auto killed_at = Clock::now();
  ASSERT_TRUE(sink.WaitClosed(milliseconds(5000)));
  EXPECT_LT(Clock::now() - killed_at, milliseconds(3000));
  EXPECT_FALSE(sink.close_status().ok());
  EXPECT_EQ(sink.close_status().code(), StatusCode::kUnavailable) << sink.close_status().ToString();
  ASSERT_TRUE(log.WaitCount(1, milliseconds(5000)));
  const auto start = Clock::now();
  (*server)->Shutdown();
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiPeerKilled, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) {
                           return info.param == "shm" ? std::string("Shm") : std::string("TcpRxm");
                         });

}  // namespace
}  // namespace deltacast::transport
