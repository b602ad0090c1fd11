// Helpers of the relay's security tests: versions to publish, free loopback ports,
// and an impostor that speaks the relay protocol from a parent's address the way an
// attacker's script would.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apply/host_store.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "relay/wire/protocol.h"
#include "transport/transport.h"

namespace deltacast::relay::testing {

constexpr uint64_t kPartitionBytes = 8 << 10;

struct Versions {
  std::vector<TensorSpec> tensors;
  std::vector<std::vector<std::byte>> base, target;
};

// A base, and a target in which ~3% of the BF16 elements of each tensor changed.
inline Versions MakeVersions(uint64_t elements, uint32_t seed) {
  Versions v;
  std::mt19937 rng(seed);
  for (int t = 0; t < 2; ++t) {
    v.tensors.push_back({"layer" + std::to_string(t) + ".weight", DType::kBF16, {elements}});
    std::vector<std::byte> b(elements * 2);
    for (auto& x : b) x = std::byte(rng());
    auto n = b;
    for (uint64_t i = 0; i < elements; ++i) {
      if (rng() % 100 < 3) n[2 * i] ^= std::byte{1};
    }
    v.base.push_back(std::move(b));
    v.target.push_back(std::move(n));
  }
  return v;
}

inline std::unique_ptr<apply::WeightStore> Borrow(const std::vector<TensorSpec>& tensors,
                                                  std::vector<std::vector<std::byte>>& buffers) {
  std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], MutableByteSpan(buffers[i]));
  return std::move(*apply::HostStore::Borrow(std::move(spans)));
}

inline codec::Manifest ManifestOf(const std::vector<TensorSpec>& tensors,
                                  const std::vector<std::vector<std::byte>>& data) {
  return codec::ComputeManifest(
      tensors, [&](size_t i) { return ByteSpan(data[i]); }, kPartitionBytes, 1);
}

// The CHUNK messages of the delta base -> target, as a source would send them
// (unsigned).
inline std::vector<std::vector<std::byte>> DeltaChunks(
    const Versions& v, const std::vector<std::vector<std::byte>>& to,
    uint64_t chunk_bytes = 16 << 10) {
  std::vector<std::vector<std::byte>> chunks;
  codec::DeltaEncoderOptions options;
  options.chunk_bytes = chunk_bytes;
  options.threads = 1;
  const Status s = codec::EncodeDelta(
      ManifestOf(v.tensors, v.base), ManifestOf(v.tensors, to),
      [&](size_t i) { return ByteSpan(v.base[i]); }, [&](size_t i) { return ByteSpan(to[i]); },
      Digest128{}, options,
      [&](std::vector<std::byte>&& chunk) {
        chunks.push_back(EncodeChunk(chunk));
        return Status::Ok();
      });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return chunks;
}

// Loopback ports nobody listens on right now (bound to 0, then released).
inline std::vector<uint16_t> FreePorts(int n) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ports.push_back(ntohs(a.sin_port));
    fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

// Listens where a parent should be and, to every child that dials it, says
// CHALLENGE and, to its HELLO, WELCOME (proved with `token`, which may be wrong);
// then AfterWelcome plays the rest of the script.
class ScriptedParent {
 public:
  ScriptedParent(std::unique_ptr<transport::Transport> transport, std::string address,
                 std::string parent_id, std::string token)
      : transport_(std::move(transport)),
        address_(std::move(address)),
        parent_id_(std::move(parent_id)),
        token_(std::move(token)) {}
  virtual ~ScriptedParent() { Stop(); }
  void Stop() {
    stop_ = true;
    transport_->Shutdown();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  std::atomic<int> hellos{0};  // children that answered its CHALLENGE

 protected:
  struct Inbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<transport::Message> messages;
    bool closed = false;
  };
  // Listens: a subclass calls it last in its constructor (the script is its own).
  void Listen() {
    auto bound = transport_->Listen(address_, [this](std::unique_ptr<transport::Connection> c) {
      std::lock_guard lock(mu_);
      threads_.emplace_back(
          [this, c = std::shared_ptr<transport::Connection>(std::move(c))] { Serve(*c); });
    });
    EXPECT_TRUE(bound.ok()) << bound.status().ToString();
  }
  // The script after WELCOME, on the connection's own thread.
  virtual void AfterWelcome(transport::Connection& c, Inbox& in) = 0;
  static std::optional<transport::Message> Next(Inbox& in, std::chrono::milliseconds timeout) {
    std::unique_lock lock(in.mu);
    if (!in.cv.wait_for(lock, timeout, [&] { return !in.messages.empty() || in.closed; }))
      return std::nullopt;
    if (in.messages.empty()) return std::nullopt;
    auto m = in.messages.front();
    in.messages.pop_front();
    return m;
  }
  std::atomic<bool> stop_{false};

 private:
  void Serve(transport::Connection& c) {
    auto in = std::make_shared<Inbox>();
    c.Authenticated();  // an attacker reads whatever it is sent
    c.Start(
        [in](transport::Message m) {
          std::lock_guard lock(in->mu);
          in->messages.push_back(std::move(m));
          in->cv.notify_all();
        },
        [in](Status) {
          std::lock_guard lock(in->mu);
          in->closed = true;
          in->cv.notify_all();
        });
    const auto nonce = RandomNonce();
    c.Send(transport::MakeMessage(EncodeChallenge({nonce, parent_id_})));
    auto hello_message = Next(*in, std::chrono::seconds(5));
    if (!hello_message) return;
    auto hello = ParseHello(**hello_message);
    if (!hello.ok()) return;
    ++hellos;
    c.Send(transport::MakeMessage(
        EncodeWelcome({ParentProof(token_, nonce, hello->nonce, parent_id_, hello->node_id)})));
    AfterWelcome(c, *in);
  }

  std::unique_ptr<transport::Transport> transport_;
  std::string address_;
  std::string parent_id_;
  std::string token_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

// A scripted source: after WELCOME, BEGIN, every chunk of `chunks` and, once the child
// says PREPARED (or after a while), COMMIT. What it saw is counted.
class Impostor : public ScriptedParent {
 public:
  Impostor(std::unique_ptr<transport::Transport> transport, std::string address,
           std::string parent_id, std::string token, Begin begin,
           std::vector<std::vector<std::byte>> chunks)
      : ScriptedParent(std::move(transport), std::move(address), std::move(parent_id),
                       std::move(token)),
        begin_(begin),
        chunks_(std::move(chunks)) {
    Listen();
  }
  ~Impostor() override { Stop(); }

  std::atomic<int> refused{0};   // children that sent REFUSE or hung up after WELCOME
  std::atomic<int> prepared{0};  // children that said PREPARED to its forged delta
  std::atomic<int> committed{0};

 private:
  void AfterWelcome(transport::Connection& c, Inbox& in) override {
    c.Send(transport::MakeMessage(EncodeBegin(begin_)));
    for (const auto& chunk : chunks_) c.Send(transport::MakeMessage(chunk));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool said_prepared = false;
    while (!stop_ && std::chrono::steady_clock::now() < deadline) {
      auto m = Next(in, std::chrono::milliseconds(50));
      if (!m) {
        std::lock_guard lock(in.mu);
        if (in.closed) {
          ++refused;
          return;
        }
        continue;
      }
      auto type = PeekType(**m);
      if (!type.ok()) continue;
      if (*type == MessageType::kRefuse) {
        ++refused;
        return;
      }
      if (*type == MessageType::kPrepared) {
        said_prepared = true;
        ++prepared;
        break;
      }
    }
    // Committed whether or not the child prepared: the decision is the attack.
    c.Send(transport::MakeMessage(
        EncodeDecision(MessageType::kCommit, {begin_.refit_id, begin_.target_version})));
    if (said_prepared) {
      auto m = Next(in, std::chrono::seconds(3));
      if (m && PeekType(**m).ok() && *PeekType(**m) == MessageType::kCommitted) ++committed;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    c.Close();
  }

  Begin begin_;
  std::vector<std::vector<std::byte>> chunks_;
};

// A parent that, after WELCOME, hands every message its child sends to `answer`,
// which may send anything back, until the child hangs up or the test ends.
class AnsweringParent : public ScriptedParent {
 public:
  using Answer = std::function<void(transport::Connection&, ByteSpan)>;
  AnsweringParent(std::unique_ptr<transport::Transport> transport, std::string address,
                  std::string parent_id, std::string token, Answer answer)
      : ScriptedParent(std::move(transport), std::move(address), std::move(parent_id),
                       std::move(token)),
        answer_(std::move(answer)) {
    Listen();
  }
  ~AnsweringParent() override { Stop(); }

 private:
  void AfterWelcome(transport::Connection& c, Inbox& in) override {
    while (!stop_) {
      auto m = Next(in, std::chrono::milliseconds(50));
      if (m) {
        answer_(c, **m);
        continue;
      }
      std::lock_guard lock(in.mu);
      if (in.closed) return;
    }
  }

  Answer answer_;
};

// A child that knows the token and joins `parent_id` at `address` as `node_id`,
// then says whatever the test makes it say.
class ChildPeer {
 public:
  ChildPeer(transport::Transport& transport, const std::string& address, std::string node_id,
            std::string parent_id, std::string token) {
    auto c = transport::ConnectBlocking(transport, address, std::chrono::seconds(5));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return;
    link_ = std::move(*c);
    link_->Authenticated();
    link_->Start(
        [this](transport::Message m) {
          std::lock_guard lock(mu_);
          inbox_.push_back(std::move(m));
          cv_.notify_all();
        },
        [this](Status) {
          std::lock_guard lock(mu_);
          closed_ = true;
          cv_.notify_all();
        });
    auto challenge = Next(MessageType::kChallenge);
    if (!challenge) return;
    auto c2 = ParseChallenge(**challenge);
    if (!c2.ok()) return;
    Hello hello;
    hello.node_id = node_id;
    hello.nonce = RandomNonce();
    hello.proof = ChildProof(token, c2->nonce, node_id, parent_id);
    link_->Send(transport::MakeMessage(EncodeHello(hello)));
    joined_ = Next(MessageType::kWelcome).has_value();
  }
  bool joined() const { return joined_; }
  bool closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }
  void Send(std::vector<std::byte> bytes) { link_->Send(transport::MakeMessage(std::move(bytes))); }
  // The next message of `type` (others are skipped), or nullopt after `timeout`.
  std::optional<transport::Message> Next(
      MessageType type, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lock(mu_);
    for (;;) {
      while (!inbox_.empty()) {
        auto m = inbox_.front();
        inbox_.pop_front();
        auto t = PeekType(*m);
        if (t.ok() && *t == type) return m;
      }
      if (closed_ || cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        if (inbox_.empty()) return std::nullopt;
      }
    }
  }

 private:
  std::unique_ptr<transport::Connection> link_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<transport::Message> inbox_;
  bool closed_ = false;
  bool joined_ = false;
};

}  // namespace deltacast::relay::testing
