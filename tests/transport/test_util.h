// Helpers shared by the transport tests: a thread-safe accept queue, a recording
// message sink, and deterministic payloads.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/hash.h"
#include "transport/transport.h"

namespace deltacast::transport::testutil {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

inline constexpr milliseconds kWait{10000};  // bound on anything that should happen

// Payload `index` of `size` bytes: a PRNG stream seeded by (seed, index), with the
// index in its first 8 bytes when it fits.
inline std::vector<std::byte> Payload(uint64_t seed, uint64_t index, size_t size) {
  std::vector<std::byte> bytes(size);
  std::mt19937_64 rng(seed * 1000003 + index);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, 8);
  }
  for (; i < size; ++i) bytes[i] = std::byte(rng() & 0xff);
  if (size >= 8) std::memcpy(bytes.data(), &index, 8);
  return bytes;
}

inline uint64_t HashOf(const std::vector<std::byte>& bytes) { return Hash64(bytes); }

// Collects accepted connections.
class AcceptQueue {
 public:
  AcceptHandler Handler() {
    return [this](std::unique_ptr<Connection> connection) {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(connection));
      cv_.notify_all();
    };
  }
  std::unique_ptr<Connection> Pop(milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return nullptr;
    auto connection = std::move(queue_.front());
    queue_.pop_front();
    return connection;
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return queue_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Connection>> queue_;
};

// Records what one connection delivers and checks the handler rules as it goes.
class Sink {
 public:
  // Optional hook run inside on_message (after recording).
  std::function<void(const Message&)> on_message_hook;

  // Marks the link authenticated first: these tests play an application that
  // trusts its peer, so frames above the pre-authentication limit flow.
  void Start(Connection& connection) {
    connection.Authenticated();
    connection.Start([this](Message m) { OnMessage(std::move(m)); },
                     [this](Status s) { OnClosed(std::move(s)); });
  }

  bool WaitMessages(size_t count, milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return messages_.size() >= count; });
  }
  bool WaitClosed(milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return close_count_ > 0; });
  }

  std::vector<Message> messages() {
    std::lock_guard lock(mu_);
    return messages_;
  }
  size_t message_count() {
    std::lock_guard lock(mu_);
    return messages_.size();
  }
  std::vector<Clock::time_point> arrivals() {
    std::lock_guard lock(mu_);
    return arrivals_;
  }
  Status close_status() {
    std::lock_guard lock(mu_);
    return close_status_;
  }
  int close_count() {
    std::lock_guard lock(mu_);
    return close_count_;
  }
  // Rule violations seen: a message after on_closed, concurrent on_message, null.
  int violations() {
    std::lock_guard lock(mu_);
    return violations_;
  }

 private:
  void OnMessage(Message m) {
    {
      std::lock_guard lock(mu_);
      if (in_message_ || close_count_ > 0 || !m) ++violations_;
      in_message_ = true;
      messages_.push_back(m);
      arrivals_.push_back(Clock::now());
      cv_.notify_all();
    }
    if (on_message_hook) on_message_hook(m);
    std::lock_guard lock(mu_);
    in_message_ = false;
  }
  void OnClosed(Status s) {
    std::lock_guard lock(mu_);
    ++close_count_;
    close_status_ = std::move(s);
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> messages_;
  std::vector<Clock::time_point> arrivals_;
  bool in_message_ = false;
  int close_count_ = 0;
  Status close_status_;
  int violations_ = 0;
};

// Records on_sent results in the order the handlers ran.
class SendLog {
 public:
  SendHandler Handler(uint64_t index) {
    return [this, index](Status s) {
      std::lock_guard lock(mu_);
      order_.push_back(index);
      statuses_.push_back(std::move(s));
      cv_.notify_all();
    };
  }
  bool WaitCount(size_t count, milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return order_.size() >= count; });
  }
  std::vector<uint64_t> order() {
    std::lock_guard lock(mu_);
    return order_;
  }
  std::vector<Status> statuses() {
    std::lock_guard lock(mu_);
    return statuses_;
  }
  size_t count() {
    std::lock_guard lock(mu_);
    return order_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> order_;
  std::vector<Status> statuses_;
};

// Polls `done` until it holds or `timeout` passes.
inline bool Eventually(const std::function<bool()>& done, milliseconds timeout = kWait) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// Sends payloads with the given sizes and returns their hashes.
inline std::vector<uint64_t> SendAll(Connection& connection, const std::vector<size_t>& sizes,
                                     uint64_t seed, SendLog* log) {
  std::vector<uint64_t> hashes;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto bytes = Payload(seed, i, sizes[i]);
    hashes.push_back(HashOf(bytes));
    connection.Send(MakeMessage(std::move(bytes)), log ? log->Handler(i) : SendHandler{});
  }
  return hashes;
}

inline void ExpectReceived(Sink& sink, const std::vector<size_t>& sizes,
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

// The two ends of a link: `client` dialled, `accepted` handed to the listener.
struct LinkEnds {
  std::unique_ptr<Connection> client;
  std::unique_ptr<Connection> accepted;
};

// Connects `client` to `address`, where a listener feeds `accept`. On failure
// records a test failure and returns what it has (ends may be null).
inline LinkEnds ConnectTo(const std::string& address, Transport& client, AcceptQueue& accept) {
  LinkEnds link;
  auto connection = ConnectBlocking(client, address, kWait);
  EXPECT_TRUE(connection.ok()) << connection.status().ToString();
  if (!connection.ok()) return link;
  link.client = std::move(connection).value();
  link.client->Authenticated();
  link.accepted = accept.Pop();
  EXPECT_NE(link.accepted, nullptr);
  if (link.accepted) link.accepted->Authenticated();
  return link;
}

// `server` listens on `listen_address` and `client` connects to it.
inline LinkEnds ListenAndConnect(Transport& server, Transport& client,
                                 const std::string& listen_address, AcceptQueue& accept) {
  auto address = server.Listen(listen_address, accept.Handler());
  EXPECT_TRUE(address.ok()) << address.status().ToString();
  if (!address.ok()) return {};
  return ConnectTo(*address, client, accept);
}

}  // namespace deltacast::transport::testutil
