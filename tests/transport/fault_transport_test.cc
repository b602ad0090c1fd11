// The fault wrapper does what its plan says: drops, resets, failed sends and
// connects replay exactly for a seed; delay and the bandwidth cap hold messages
// without blocking the caller.
#include "transport/fault_transport.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <thread>

#include "tests/transport/test_util.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace deltacast::transport {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): test helpers

// A wrapped client connected to a plain server on one inproc network (or tcp).
struct Harness {
  void Connect(const FaultPlan& plan, bool tcp = false) {
    if (tcp) {
      server_ = std::move(MakeTcpTransport()).value();
      client_ = WrapWithFaults(std::move(MakeTcpTransport()).value(), plan);
    } else {
      server_ = MakeInprocTransport(network_);
      client_ = WrapWithFaults(MakeInprocTransport(network_), plan);
    }
    fault_ = AsFaultTransport(client_.get());
    ASSERT_NE(fault_, nullptr);
    auto address = server_->Listen("127.0.0.1:0", accept_.Handler());
    ASSERT_TRUE(address.ok());
    address_ = *address;
    auto connection = ConnectBlocking(*client_, address_, kWait);
    ASSERT_TRUE(connection.ok()) << connection.status().ToString();
    client_conn_ = std::move(connection).value();
    server_conn_ = accept_.Pop();
    ASSERT_NE(server_conn_, nullptr);
    server_sink_.Start(*server_conn_);
    client_sink_.Start(*client_conn_);
  }

  // Sends `count` messages of `size` bytes, payload i carrying index i.
  void SendN(int count, size_t size = 100) {
    for (int i = 0; i < count; ++i) {
      client_conn_->Send(MakeMessage(Payload(1, i, size)), log_.Handler(i));
    }
  }

  std::vector<uint64_t> ReceivedIndices() {
    std::vector<uint64_t> indices;
    for (const auto& m : server_sink_.messages()) {
      uint64_t index;
      std::memcpy(&index, m->data(), 8);
      indices.push_back(index);
    }
    return indices;
  }

  // Declared first: the handlers they own must outlive the transports.
  Sink server_sink_, client_sink_;
  SendLog log_;
  AcceptQueue accept_;
  std::shared_ptr<InprocNetwork> network_ = std::make_shared<InprocNetwork>();
  std::unique_ptr<Transport> server_, client_;
  FaultTransport* fault_ = nullptr;
  std::string address_;
  std::unique_ptr<Connection> client_conn_, server_conn_;
};

class FaultTest : public ::testing::Test, public Harness {};

TEST_F(FaultTest, EmptyPlanPassesEverythingThrough) {
  Connect(FaultPlan{});
  SendN(50, 1000);
  ASSERT_TRUE(server_sink_.WaitMessages(50));
  ASSERT_TRUE(log_.WaitCount(50));
  const FaultStats stats = fault_->stats();
  EXPECT_EQ(stats.sent, 50u);
  EXPECT_EQ(stats.bytes, 50000u);
  EXPECT_EQ(stats.dropped + stats.delayed + stats.resets + stats.failed_sends, 0u);
  EXPECT_EQ(client_->capabilities().backend, "fault(inproc)");
}

std::vector<uint64_t> DeliveredWithDrops(uint64_t seed) {
  FaultPlan plan;
  plan.seed = seed;
  plan.drop_probability = 0.3;
  Harness run;
  run.Connect(plan);
  run.SendN(500);
  EXPECT_TRUE(run.log_.WaitCount(500));
  for (const Status& s : run.log_.statuses()) EXPECT_TRUE(s.ok());  // drops look sent
  const FaultStats stats = run.fault_->stats();
  EXPECT_EQ(stats.sent + stats.dropped, 500u);
  EXPECT_TRUE(run.server_sink_.WaitMessages(stats.sent));
  std::this_thread::sleep_for(milliseconds(20));
  auto indices = run.ReceivedIndices();
  EXPECT_EQ(indices.size(), stats.sent);
  EXPECT_TRUE(std::is_sorted(indices.begin(), indices.end()));
  EXPECT_GT(stats.dropped, 100u);  // 150 expected
  EXPECT_LT(stats.dropped, 200u);
  return indices;
}

TEST(FaultDropTest, DropsReplayExactlyForASeed) {
  const auto first = DeliveredWithDrops(7);
  const auto again = DeliveredWithDrops(7);
  const auto other = DeliveredWithDrops(8);
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
}

TEST_F(FaultTest, ResetAfterMessagesOverInproc) {
  FaultPlan plan;
  plan.reset_after_messages = 5;
  Connect(plan);
  SendN(12);
  ASSERT_TRUE(log_.WaitCount(12));
  auto statuses = log_.statuses();
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(statuses[i].ok(), i < 5) << i << ": " << statuses[i].ToString();
    if (i >= 5) {
      EXPECT_EQ(statuses[i].code(), StatusCode::kUnavailable);
    }
  }
  ASSERT_TRUE(client_sink_.WaitClosed());
  EXPECT_EQ(client_sink_.close_status().code(), StatusCode::kUnavailable);
  EXPECT_NE(client_sink_.close_status().message().find("reset"), std::string::npos);
  ASSERT_TRUE(server_sink_.WaitClosed());
  EXPECT_EQ(server_sink_.close_status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ReceivedIndices(), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(fault_->stats().resets, 1u);
  EXPECT_EQ(fault_->stats().sent, 5u);
}

TEST_F(FaultTest, ResetAfterMessagesOverTcp) {
  FaultPlan plan;
  plan.reset_after_messages = 3;
  Connect(plan, /*tcp=*/true);
  SendN(8, 20000);
  ASSERT_TRUE(log_.WaitCount(8));
  ASSERT_TRUE(server_sink_.WaitClosed());
  EXPECT_EQ(server_sink_.close_status().code(), StatusCode::kUnavailable)
      << server_sink_.close_status().ToString();
  EXPECT_EQ(ReceivedIndices(), (std::vector<uint64_t>{0, 1, 2}));
  ASSERT_TRUE(client_sink_.WaitClosed());
  EXPECT_EQ(client_sink_.close_status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(fault_->stats().resets, 1u);
}

TEST_F(FaultTest, StallHoldsEverythingAfterNUntilTheLinkCloses) {
  FaultPlan plan;
  plan.stall_after_messages = 3;
  Connect(plan);
  SendN(6, 1000);
  ASSERT_TRUE(server_sink_.WaitMessages(3));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(ReceivedIndices(), (std::vector<uint64_t>{0, 1, 2}));  // and nothing more
  EXPECT_EQ(log_.count(), 3u);  // the held sends have not completed
  EXPECT_EQ(client_conn_->QueuedBytes(), 3000u);
  EXPECT_EQ(server_sink_.close_count(), 0);  // the link looks alive
  EXPECT_EQ(fault_->stats().stalled, 3u);
  client_conn_->Close();
  ASSERT_TRUE(log_.WaitCount(6));
  for (int i = 3; i < 6; ++i) EXPECT_EQ(log_.statuses()[i].code(), StatusCode::kAborted);
}

TEST_F(FaultTest, OnlyTheFirstStallLinksStall) {
  FaultPlan plan;
  plan.stall_after_messages = 0;
  plan.stall_links = 1;
  Connect(plan);  // link 0: stalls at once
  SendN(2);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(server_sink_.message_count(), 0u);
  auto second = ConnectBlocking(*client_, address_, kWait);  // link 1: does not
  ASSERT_TRUE(second.ok());
  auto accepted = accept_.Pop();
  ASSERT_NE(accepted, nullptr);
  Sink sink;
  sink.Start(*accepted);
  (*second)->Send(MakeMessage(Payload(2, 0, 10)));
  EXPECT_TRUE(sink.WaitMessages(1));
}

TEST_F(FaultTest, FailNthSendFailsOnlyThatSend) {
  FaultPlan plan;
  plan.fail_nth_send = 3;
  Connect(plan);
  SendN(8);
  ASSERT_TRUE(log_.WaitCount(8));
  auto statuses = log_.statuses();
  EXPECT_EQ(log_.order(), (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(statuses[i].ok(), i != 3) << i;
  }
  EXPECT_EQ(statuses[3].code(), StatusCode::kUnavailable);
  ASSERT_TRUE(server_sink_.WaitMessages(7));
  EXPECT_EQ(ReceivedIndices(), (std::vector<uint64_t>{0, 1, 2, 4, 5, 6, 7}));
  EXPECT_EQ(fault_->stats().failed_sends, 1u);
  EXPECT_EQ(client_sink_.close_count(), 0);
}

TEST_F(FaultTest, FailNthConnectFailsOnlyThatConnect) {
  FaultPlan plan;
  plan.fail_nth_connect = 1;
  Connect(plan);  // connect #0
  auto second = ConnectBlocking(*client_, address_, kWait);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  auto third = ConnectBlocking(*client_, address_, kWait);
  EXPECT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(fault_->stats().failed_connects, 1u);
}

TEST_F(FaultTest, DelayHoldsEveryMessageAndKeepsOrder) {
  FaultPlan plan;
  plan.delay = std::chrono::milliseconds(30);
  Connect(plan);
  const auto start = Clock::now();
  SendN(50);
  const auto sent = Clock::now();
  ASSERT_TRUE(server_sink_.WaitMessages(50));
  for (const auto& arrival : server_sink_.arrivals()) {
    EXPECT_GE(arrival - start, milliseconds(30));
  }
  EXPECT_LT(sent - start, milliseconds(30));  // Send never waited for the delay
  std::vector<uint64_t> expected(50);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(ReceivedIndices(), expected);
  EXPECT_EQ(fault_->stats().delayed, 50u);
}

TEST_F(FaultTest, BandwidthCapIsMeasurable) {
  constexpr double kRate = 20e6;
  FaultPlan plan;
  plan.bandwidth_bytes_per_second = kRate;
  Connect(plan);
  constexpr int kCount = 80;
  constexpr size_t kSize = 256 * 1024;  // ~21 MB: about one second at the cap
  const auto start = Clock::now();
  SendN(kCount, kSize);
  EXPECT_LT(Clock::now() - start, milliseconds(300));          // pacing never blocks Send
  EXPECT_GT(client_conn_->QueuedBytes(), kSize * kCount / 2);  // held bytes count as queued
  ASSERT_TRUE(server_sink_.WaitMessages(kCount));
  const auto arrivals = server_sink_.arrivals();
  const double seconds = std::chrono::duration<double>(arrivals.back() - arrivals.front()).count();
  const double rate = static_cast<double>(kSize) * (kCount - 1) / seconds;
  EXPECT_GT(rate, kRate * 0.75) << rate / 1e6 << " MB/s";
  EXPECT_LT(rate, kRate * 1.25) << rate / 1e6 << " MB/s";
  ASSERT_TRUE(log_.WaitCount(kCount));
  EXPECT_EQ(client_conn_->QueuedBytes(), 0u);
}

TEST_F(FaultTest, CloseAbortsHeldMessagesBeforeOnClosed) {
  FaultPlan plan;
  plan.delay = std::chrono::seconds(30);
  Connect(plan);
  SendN(5);
  client_conn_->Close();
  ASSERT_TRUE(log_.WaitCount(5));
  for (const Status& s : log_.statuses()) EXPECT_EQ(s.code(), StatusCode::kAborted);
  ASSERT_TRUE(client_sink_.WaitClosed());
  EXPECT_TRUE(client_sink_.close_status().ok());
  ASSERT_TRUE(server_sink_.WaitClosed());
  EXPECT_EQ(server_sink_.message_count(), 0u);
}

TEST_F(FaultTest, ShutdownWithHeldMessagesIsPrompt) {
  FaultPlan plan;
  plan.delay = std::chrono::seconds(30);
  Connect(plan);
  SendN(5);
  const auto start = Clock::now();
  client_->Shutdown();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  ASSERT_EQ(log_.count(), 5u);  // aborted during Shutdown
  for (const Status& s : log_.statuses()) EXPECT_FALSE(s.ok());
  EXPECT_EQ(client_sink_.close_count(), 1);
  const size_t after = log_.count();
  client_conn_->Send(MakeMessage(Payload(1, 1, 1)), log_.Handler(99));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(log_.count(), after);  // nothing runs after Shutdown
}

TEST(FaultPlanTest, OutOfRangeValuesAreClamped) {
  FaultPlan plan;
  plan.drop_probability = 3;
  plan.delay = std::chrono::microseconds(-5);
  plan.bandwidth_bytes_per_second = -1;
  auto t = WrapWithFaults(MakeInprocTransport(nullptr), plan);
  const FaultPlan& used = AsFaultTransport(t.get())->plan();
  EXPECT_EQ(used.drop_probability, 1);
  EXPECT_EQ(used.delay.count(), 0);
  EXPECT_EQ(used.bandwidth_bytes_per_second, 0);
}

}  // namespace
}  // namespace deltacast::transport
