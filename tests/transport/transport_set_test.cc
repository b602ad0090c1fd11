// TransportSet: listening on every member at port + offset, dialing by scheme, and
// falling back along a preference list when a backend does not connect.
#include "transport/transport_set.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <future>

#include "tests/transport/test_util.h"
#include "transport/internal/address.h"
#include "transport/tcp/tcp_transport.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

std::unique_ptr<Transport> Tcp() { return std::move(MakeTcpTransport()).value(); }

// Two tcp transports posing as backends "tcp" (offset 0) and "fast" (offset 1).
std::unique_ptr<TransportSet> TwoBackends() {
  std::vector<TransportSet::Member> members;
  members.push_back({"fast", Tcp(), 1});
  members.push_back({"tcp", Tcp(), 0});
  return std::make_unique<TransportSet>(std::move(members));
}

struct Dialed {
  Result<std::unique_ptr<Connection>> connection = Status::Internal("not called");
  std::string backend;
};

Dialed DialFirst(TransportSet& set, uint16_t port, std::vector<std::string> backends) {
  std::promise<Dialed> done;
  set.ConnectFirst("127.0.0.1", port, std::move(backends),
                   [&](Result<std::unique_ptr<Connection>> r, const std::string& backend) {
                     done.set_value(Dialed{std::move(r), backend});
                   });
  auto future = done.get_future();
  EXPECT_EQ(future.wait_for(kWait), std::future_status::ready);
  return future.get();
}

// A base port whose next port is free too, below the kernel's ephemeral range (an
// ephemeral base's neighbour may be held by another process's connection: CI saw it).
uint16_t FreePairBase() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const auto base = static_cast<uint16_t>(31500 + ((::getpid() + attempt * 7) % 300) * 4);
    AcceptQueue ignored;
    auto first = Tcp(), second = Tcp();
    if (first->Listen("127.0.0.1:" + std::to_string(base), ignored.Handler()).ok() &&
        second->Listen("127.0.0.1:" + std::to_string(base + 1), ignored.Handler()).ok()) {
      return base;
    }
  }
  return 0;
}

TEST(TransportSetTest, ListensOnEveryMemberAtItsOffset) {
  auto server = TwoBackends();
  AcceptQueue accepted;
  const uint16_t free_base = FreePairBase();
  ASSERT_NE(free_base, 0) << "no two free neighbouring ports";
  auto address = server->Listen("127.0.0.1:" + std::to_string(free_base), accepted.Handler());
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  const uint16_t base = ParseHostPort(*address)->port;
  ASSERT_EQ(base, free_base);
  EXPECT_EQ(server->capabilities().backend, "set(fast,tcp)");
  EXPECT_EQ(server->Names(), (std::vector<std::string>{"fast", "tcp"}));

  auto client = TwoBackends();
  Dialed fast = DialFirst(*client, base, {"fast", "tcp"});
  ASSERT_TRUE(fast.connection.ok()) << fast.connection.status().ToString();
  EXPECT_EQ(fast.backend, "fast");
  EXPECT_EQ(ParseHostPort((*fast.connection)->PeerAddress())->port, base + 1);
  ASSERT_NE(accepted.Pop(), nullptr);

  // Plain addresses go to the first member; "name://" to that member as given.
  auto plain = ConnectBlocking(*client, "127.0.0.1:" + std::to_string(base + 1), kWait);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  auto named = ConnectBlocking(*client, "tcp://127.0.0.1:" + std::to_string(base), kWait);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_NE(accepted.Pop(), nullptr);
  EXPECT_NE(accepted.Pop(), nullptr);
  auto unknown = ConnectBlocking(*client, "ofi://127.0.0.1:1", kWait);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
}

TEST(TransportSetTest, FallsBackWhenThePreferredBackendDoesNotConnect) {
  // The server speaks only plain tcp: the client's "fast" dial (port + 1) is refused.
  auto server = Tcp();
  AcceptQueue accepted;
  auto address = server->Listen("127.0.0.1:0", accepted.Handler());
  ASSERT_TRUE(address.ok());
  const uint16_t base = ParseHostPort(*address)->port;
  auto client = TwoBackends();
  Dialed dialed = DialFirst(*client, base, {"ucx", "fast", "tcp"});
  ASSERT_TRUE(dialed.connection.ok()) << dialed.connection.status().ToString();
  EXPECT_EQ(dialed.backend, "tcp");
  EXPECT_NE(accepted.Pop(), nullptr);

  // Nothing listening at all: one error naming every backend tried.
  server->Shutdown();
  Dialed none = DialFirst(*client, base, {"fast", "tcp"});
  ASSERT_FALSE(none.connection.ok());
  EXPECT_EQ(none.connection.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.connection.status().message().find("fast 127.0.0.1:"), std::string::npos);
  EXPECT_NE(none.connection.status().message().find("; tcp 127.0.0.1:"), std::string::npos);
  EXPECT_TRUE(none.backend.empty());
}

TEST(TransportSetTest, AMemberThatCannotListenIsLeftOutAndPeersFallBack) {
  // Occupy port P, then listen on a set at base P - 1: "fast" (P) cannot bind.
  AcceptQueue accepted;
  std::unique_ptr<Transport> squatter;
  std::unique_ptr<TransportSet> server;
  uint16_t base = 0;
  for (int attempt = 0; attempt < 20 && base == 0; ++attempt) {
    squatter = Tcp();
    auto taken = squatter->Listen("127.0.0.1:0", [](std::unique_ptr<Connection>) {});
    ASSERT_TRUE(taken.ok());
    const uint16_t p = ParseHostPort(*taken)->port;
    server = TwoBackends();
    auto address = server->Listen("127.0.0.1:" + std::to_string(p - 1), accepted.Handler());
    if (address.ok()) base = p - 1;  // else p - 1 was busy too: try another port
  }
  ASSERT_NE(base, 0);
  EXPECT_EQ(server->Accepting(), (std::vector<std::string>{"tcp"}));
  EXPECT_EQ(server->Names(), (std::vector<std::string>{"fast", "tcp"}));
  // What the server still accepts on works.
  auto client = TwoBackends();
  Dialed dialed = DialFirst(*client, base, {"tcp"});
  ASSERT_TRUE(dialed.connection.ok()) << dialed.connection.status().ToString();
  EXPECT_NE(accepted.Pop(), nullptr);
}

}  // namespace
}  // namespace deltacast::transport
