// A striped node whose stripe parents are at different refits (docs/protocol.md,
// "Stripes", "Recovery"): the test plays the source, the node's parent in both
// stripes of a 2-stripe tree, over loopback tcp, and replays to the node, on a new
// stripe-1 link, the refit it committed while stripe 0 already streams the next one
// (what a stripe parent that lags behind sends a child that rejoins it). The node
// answers the old refit on that link and stays in the current one, which commits
// bit-exact (the simulator's --stripes seeds 284 and 1201).
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>

#include "apply/host_store.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "relay/tree/node_agent.h"
#include "relay/wire/protocol.h"
#include "tests/relay/tree/stripes_fixture.h"
#include "topology/stripe_plan.h"
#include "transport/factory.h"

namespace deltacast::relay::stripes_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// One link the node dialled, as the parent sees it: what came, in order.
class ParentSide {
 public:
  explicit ParentSide(std::unique_ptr<transport::Connection> c) : c_(std::move(c)) {
    c_->Authenticated();
    c_->Start(
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
  }
  ~ParentSide() { c_->Close(); }

  // CHALLENGE, the node's HELLO, WELCOME: the link's stripe is the HELLO's.
  std::optional<Hello> Handshake() {
    const auto nonce = RandomNonce();
    Send(EncodeChallenge({nonce, "src"}));
    auto m = Next(MessageType::kHello);
    if (!m) return std::nullopt;
    auto hello = ParseHello(**m);
    if (!hello.ok()) return std::nullopt;
    Send(EncodeWelcome({ParentProof(kToken, nonce, hello->nonce, "src", hello->node_id)}));
    return *hello;
  }
  void Send(const std::vector<std::byte>& bytes) { c_->Send(transport::MakeMessage(bytes)); }
  // The next message of `type` (others are noted and skipped), at most 10 s.
  std::optional<transport::Message> Next(MessageType type) {
    std::unique_lock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (true) {
      while (!inbox_.empty()) {
        transport::Message m = inbox_.front();
        inbox_.pop_front();
        auto t = PeekType(*m);
        if (!t.ok()) continue;
        seen_.push_back(*t);
        if (*t == type) return m;
      }
      if (closed_ || cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        if (inbox_.empty()) return std::nullopt;
      }
    }
  }
  // Every message type taken from the link so far (Next skips what it does not wait for).
  std::vector<MessageType> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  std::unique_ptr<transport::Connection> c_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<transport::Message> inbox_;
  std::vector<MessageType> seen_;
  bool closed_ = false;
};

// A delta's CHUNK messages (unsigned), by sequence; the END is the last.
std::vector<std::vector<std::byte>> Chunks(const std::vector<TensorSpec>& tensors,
                                           std::vector<std::vector<std::byte>>& from,
                                           std::vector<std::vector<std::byte>>& to) {
  auto base = Borrow(tensors, from);
  auto target = Borrow(tensors, to);
  codec::DeltaEncoderOptions options;
  options.chunk_bytes = 4 << 10;
  options.threads = 1;
  std::vector<std::vector<std::byte>> chunks;
  const Status s = codec::EncodeDelta(
      ManifestOf(*base), ManifestOf(*target), [&](size_t i) { return base->TensorData(i); },
      [&](size_t i) { return target->TensorData(i); }, Digest128{}, options,
      [&](std::vector<std::byte>&& chunk) {
        chunks.push_back(EncodeChunk(chunk));
        return Status::Ok();
      });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return chunks;
}

Digest128 VersionOf(const std::vector<TensorSpec>& tensors,
                    std::vector<std::vector<std::byte>>& data) {
  return ManifestOf(*Borrow(tensors, data)).VersionId();
}

class StaleStripeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int tries = 0; tries < 100; ++tries) {
      port_ = 20000 + static_cast<int>(std::random_device{}() % 1200) * 10 + 5;
      if (PortsFree(port_, 2)) break;
    }
    const std::string toml =
        "[cluster]\nname = \"stale-stripe\"\n\n[tree]\nstripes = 2\nchunk_size = \"4KiB\"\n"
        "window = 64\nidle_timeout = \"30s\"\ncommit_timeout = \"20s\"\n\n"
        "[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " +
        std::to_string(port_) + "\nrole = \"source\"\n\n[[node]]\nid = \"n1\"\n" +
        "host = \"127.0.0.1\"\nport = " + std::to_string(port_ + 1) + "\nrole = \"receiver\"\n";
    auto config = topology::ParseClusterConfig(toml, "stale-stripe.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    auto plan = topology::PlanStripes(*config);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->stripes.size(), 2u);
    transport::TransportOptions options;
    options.connect_timeout = milliseconds(2000);
    auto parent = transport::MakeTransport("tcp", options);
    ASSERT_TRUE(parent.ok());
    parent_ = std::move(*parent);
    auto listening = parent_->Listen("127.0.0.1:" + std::to_string(port_),
                                     [this](std::unique_ptr<transport::Connection> c) {
                                       std::lock_guard lock(mu_);
                                       accepted_.push_back(std::move(c));
                                       cv_.notify_all();
                                     });
    ASSERT_TRUE(listening.ok()) << listening.status().ToString();

    // v0 -> v1 (refit A), v1 -> v2 (refit B).
    Versions v = MakeVersions(16 << 10, 77);
    tensors_ = v.tensors;
    v0_ = v.base;
    v1_ = v.target;
    v2_ = v1_;
    std::mt19937 rng(78);
    for (auto& t : v2_) {
      for (size_t i = 0; i < t.size(); i += 2) {
        if (rng() % 100 < 20) t[i] ^= std::byte{2};
      }
    }
    store_ = v0_;
    auto replica = apply::Replica::ForStore(Borrow(tensors_, store_), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok());
    NodeAgentOptions node;
    node.config = *config;
    node.node_id = "n1";
    node.token = kToken;
    node.apply_threads = 1;
    auto transport = transport::MakeTransport("tcp", options);
    ASSERT_TRUE(transport.ok());
    auto agent = NodeAgent::Start(std::move(node), std::move(*replica), std::move(*transport),
                                  std::move(*plan));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agent_ = std::move(*agent);
  }
  void TearDown() override {
    if (agent_) agent_->Stop();
    links_.clear();
    if (parent_) parent_->Shutdown();
  }

  // The next link the node dials, handshaken, under links_[its stripe].
  void AcceptLink() {
    std::unique_ptr<transport::Connection> c;
    {
      std::unique_lock lock(mu_);
      ASSERT_TRUE(cv_.wait_for(lock, seconds(10), [&] { return !accepted_.empty(); }))
          << "the node did not dial";
      c = std::move(accepted_.front());
      accepted_.pop_front();
    }
    auto side = std::make_unique<ParentSide>(std::move(c));
    auto hello = side->Handshake();
    ASSERT_TRUE(hello.has_value()) << "no HELLO";
    ASSERT_EQ(hello->stripes, 2u);
    links_[hello->stripe] = std::move(side);
  }

  // The ids of v0, v1 and v2, which every scenario streams between.
  struct VersionIdsOf {
    Digest128 d0, d1, d2;
  };
  VersionIdsOf VersionIds() {
    return {VersionOf(tensors_, v0_), VersionOf(tensors_, v1_), VersionOf(tensors_, v2_)};
  }

  void AcceptBothLinks() {
    ASSERT_NO_FATAL_FAILURE(AcceptLink());
    ASSERT_NO_FATAL_FAILURE(AcceptLink());
    ASSERT_TRUE(links_.count(0) && links_.count(1));
  }
  // Until the node has received `chunks` chunks (10 s at most).
  void WaitForChunks(uint64_t chunks) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (agent_->stats().chunks_received < chunks &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  // Refit `id`'s BEGIN and data chunks on both stripes, and their ENDs if `end`.
  void StreamOnBothStripes(uint64_t id, const Digest128& base, const Digest128& target,
                           uint64_t begun_at_us, const std::vector<std::vector<std::byte>>& chunks,
                           bool end) {
    for (uint32_t s = 0; s < 2; ++s) {
      links_[s]->Send(EncodeBegin(BeginOf(id, base, target, s, begun_at_us)));
      SendStripe(s, chunks, true, end);
    }
  }
  // Refit `id` prepared on both stripes; committed there, and confirmed.
  void CommitOnBothStripes(uint64_t id, const Digest128& target) {
    for (uint32_t s = 0; s < 2; ++s) ASSERT_NO_FATAL_FAILURE(Expect(s, MessageType::kPrepared, id));
    for (uint32_t s = 0; s < 2; ++s)
      links_[s]->Send(EncodeDecision(MessageType::kCommit, {id, target}));
    for (uint32_t s = 0; s < 2; ++s)
      ASSERT_NO_FATAL_FAILURE(Expect(s, MessageType::kCommitted, id));
  }
  // No link carried a FAILED or a catch-up's request from the node.
  void ExpectNoFailureNorCatchUp() {
    for (auto& [s, link] : links_) {
      for (MessageType t : link->seen()) {
        EXPECT_NE(t, MessageType::kFailed) << "FAILED on stripe " << s;
        EXPECT_NE(t, MessageType::kFetchChain) << "a catch-up on stripe " << s;
        EXPECT_NE(t, MessageType::kFetchManifest) << "a catch-up on stripe " << s;
      }
    }
  }

  static Begin BeginOf(uint64_t id, const Digest128& base, const Digest128& target, uint32_t stripe,
                       uint64_t begun_at_us = 0) {
    Begin b{id, base, target, kPartitionBytes};
    b.begun_at_us = begun_at_us;
    b.stream_id = id * 7 + 1;
    b.stripe = stripe;
    b.stripes = 2;
    return b;
  }
  // Stripe `stripe`'s share of `chunks`: its data chunks (sequence mod 2), and the
  // END if `end`.
  void SendStripe(uint32_t stripe, const std::vector<std::vector<std::byte>>& chunks, bool data,
                  bool end) {
    for (size_t k = 0; k < chunks.size(); ++k) {
      const bool is_end = k + 1 == chunks.size();
      if ((is_end && end) || (!is_end && data && k % 2 == stripe)) links_[stripe]->Send(chunks[k]);
    }
  }
  // Waits for the node's `type` message of refit `id` on `stripe`'s link.
  void Expect(uint32_t stripe, MessageType type, uint64_t id) {
    while (true) {
      auto m = links_[stripe]->Next(type);
      ASSERT_TRUE(m.has_value()) << "no " << MessageTypeName(type) << " of refit " << id
                                 << " on stripe " << stripe;
      uint64_t got = 0;
      if (type == MessageType::kPrepared) got = ParsePrepared(**m)->refit_id;
      if (type == MessageType::kCommitted) got = ParseOutcome(**m)->refit_id;
      if (got == id) return;
    }
  }

  int port_ = 0;
  std::unique_ptr<transport::Transport> parent_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<transport::Connection>> accepted_;
  std::map<uint32_t, std::unique_ptr<ParentSide>> links_;
  std::vector<TensorSpec> tensors_;
  std::vector<std::vector<std::byte>> v0_, v1_, v2_, store_;
  std::unique_ptr<NodeAgent> agent_;
};

TEST_F(StaleStripeTest, ALaggingStripeParentsReplayOfTheLastRefitLeavesTheCurrentOneAlone) {
  ASSERT_NO_FATAL_FAILURE(AcceptBothLinks());
  const auto [d0, d1, d2] = VersionIds();
  const auto a = Chunks(tensors_, v0_, v1_);
  const auto b = Chunks(tensors_, v1_, v2_);
  ASSERT_GE(b.size(), 3u) << "B needs a data chunk on each stripe";
  constexpr uint64_t kA = 0xa1, kB = 0xb2;

  // Refit A, whole, on both stripes: committed.
  for (uint32_t s = 0; s < 2; ++s) {
    links_[s]->Send(EncodeBegin(BeginOf(kA, d0, d1, s)));
    SendStripe(s, a, true, true);
  }
  ASSERT_NO_FATAL_FAILURE(CommitOnBothStripes(kA, d1));
  ASSERT_EQ(agent_->stats().refits_committed, 1u);

  // Refit B begins on both stripes; their data chunks come, not their ENDs.
  for (uint32_t s = 0; s < 2; ++s) {
    links_[s]->Send(EncodeBegin(BeginOf(kB, d1, d2, s)));
    SendStripe(s, b, true, false);
  }
  WaitForChunks(a.size() - 1 + b.size() - 1);
  // Stripe 1's link drops; the node dials again, and its parent there, still in A
  // (it lags behind), replays what a child that rejoins it lacks: A's BEGIN, END
  // and COMMIT.
  links_.erase(1);
  ASSERT_NO_FATAL_FAILURE(AcceptLink());
  links_[1]->Send(EncodeBegin(BeginOf(kA, d0, d1, 1)));
  links_[1]->Send(a.back());
  links_[1]->Send(EncodeDecision(MessageType::kCommit, {kA, d1}));
  // Answered on that link (it committed A), and nothing else of A.
  ASSERT_NO_FATAL_FAILURE(Expect(1, MessageType::kCommitted, kA));

  // That parent moves on to B; the ENDs come: B commits, bit-exact.
  links_[1]->Send(EncodeBegin(BeginOf(kB, d1, d2, 1)));
  SendStripe(1, b, true, true);
  SendStripe(0, b, false, true);
  ASSERT_NO_FATAL_FAILURE(CommitOnBothStripes(kB, d2));
  EXPECT_EQ(agent_->stats().refits_committed, 2u);
  EXPECT_EQ(agent_->stats().version, d2);
  EXPECT_EQ(VersionOf(tensors_, store_), d2) << "the node's bytes are not v2's";
  EXPECT_EQ(store_, v2_);
  ExpectNoFailureNorCatchUp();
}

// Two refits from one base: the source aborted A (v0 -> v1) and began B (v0 -> v2)
// later; the node streams B when its stripe-1 parent, still in A, replays A to it.
// By the versions alone the node cannot tell which is live (it ran the last BEGIN:
// a catch-up to v0 that dropped B, and B's parents waited out the commit timeout:
// the simulator's --stripes seeds 10476, 10776, 11633); by when the source began
// each it can, and A is answered on that link only. B commits, bit-exact.
TEST_F(StaleStripeTest, AReplayOfAnEarlierRefitFromTheSameBaseLeavesTheLaterOneAlone) {
  ASSERT_NO_FATAL_FAILURE(AcceptBothLinks());
  const auto [d0, d1, d2] = VersionIds();
  const auto a = Chunks(tensors_, v0_, v1_);
  const auto b = Chunks(tensors_, v0_, v2_);
  ASSERT_GE(b.size(), 3u) << "B needs a data chunk on each stripe";
  constexpr uint64_t kA = 0xa1, kB = 0xb2;

  // B begins on both stripes; their data chunks come, not their ENDs.
  StreamOnBothStripes(kB, d0, d2, 2'000'000, b, false);
  WaitForChunks(b.size() - 1);
  ASSERT_EQ(agent_->stats().chunks_received, b.size() - 1);
  // Stripe 1's link drops; its parent there, still in A, replays A's BEGIN and chunks.
  links_.erase(1);
  ASSERT_NO_FATAL_FAILURE(AcceptLink());
  links_[1]->Send(EncodeBegin(BeginOf(kA, d0, d1, 1, 1'000'000)));
  SendStripe(1, a, true, true);
  // Then it learns of B, and B's stripe 1 comes whole; stripe 0's END too.
  links_[1]->Send(EncodeBegin(BeginOf(kB, d0, d2, 1, 2'000'000)));
  SendStripe(1, b, true, true);
  SendStripe(0, b, false, true);
  ASSERT_NO_FATAL_FAILURE(CommitOnBothStripes(kB, d2));
  EXPECT_EQ(agent_->stats().refits_committed, 1u);
  EXPECT_EQ(agent_->stats().version, d2);
  EXPECT_EQ(store_, v2_) << "the node's bytes are not v2's";
  ExpectNoFailureNorCatchUp();
}

// A replay of a refit from another base, begun before the node's current one (the
// simulator's --stripes seed 10803: a node behind at that base ran it and left the
// current refit). The node committed A (v0 -> v1) and streams C (v1 -> v2) when its
// stripe-1 parent, lagging, replays A2 (v0 -> v2), which the source began between
// them and aborted. By versions A2 looks like a refit the node is behind for (a
// catch-up to v0, backwards over its commit); by when it began it is decided, and
// it is answered on that link only. C commits, bit-exact.
TEST_F(StaleStripeTest, AReplayOfARefitBegunBeforeTheCurrentOneIsNeverRun) {
  ASSERT_NO_FATAL_FAILURE(AcceptBothLinks());
  const auto [d0, d1, d2] = VersionIds();
  const auto a = Chunks(tensors_, v0_, v1_);
  const auto a2 = Chunks(tensors_, v0_, v2_);
  const auto c = Chunks(tensors_, v1_, v2_);
  ASSERT_GE(c.size(), 3u) << "C needs a data chunk on each stripe";
  constexpr uint64_t kA = 0xa1, kA2 = 0xa2, kC = 0xc3;

  StreamOnBothStripes(kA, d0, d1, 1'000'000, a, true);
  ASSERT_NO_FATAL_FAILURE(CommitOnBothStripes(kA, d1));
  StreamOnBothStripes(kC, d1, d2, 3'000'000, c, false);
  WaitForChunks(a.size() - 1 + c.size() - 1);
  links_.erase(1);
  ASSERT_NO_FATAL_FAILURE(AcceptLink());
  links_[1]->Send(EncodeBegin(BeginOf(kA2, d0, d2, 1, 2'000'000)));
  SendStripe(1, a2, true, true);
  links_[1]->Send(EncodeBegin(BeginOf(kC, d1, d2, 1, 3'000'000)));
  SendStripe(1, c, true, true);
  SendStripe(0, c, false, true);
  ASSERT_NO_FATAL_FAILURE(CommitOnBothStripes(kC, d2));
  EXPECT_EQ(agent_->stats().refits_committed, 2u);
  EXPECT_EQ(agent_->stats().version, d2);
  EXPECT_EQ(store_, v2_) << "the node's bytes are not v2's";
  ExpectNoFailureNorCatchUp();
}

// Between refits a BEGIN from another base runs whatever it says of its time: a
// source restarted on a host whose clock was set back begins refits "before" the
// one the node last ran, and refusing them would stall the node until that clock
// caught up (only a refit in progress, or one from the same base, is ordered).
TEST_F(StaleStripeTest, ARefitFromASourceWhoseClockSteppedBackRunsBetweenRefits) {
  ASSERT_NO_FATAL_FAILURE(AcceptBothLinks());
  const auto [d0, d1, d2] = VersionIds();
  const auto a = Chunks(tensors_, v0_, v1_);
  const auto b = Chunks(tensors_, v1_, v2_);
  constexpr uint64_t kA = 0xa1, kB = 0xb2;
  const auto run = [&](uint64_t id, const Digest128& base, const Digest128& target,
                       uint64_t begun_at_us, const std::vector<std::vector<std::byte>>& chunks) {
    StreamOnBothStripes(id, base, target, begun_at_us, chunks, true);
    CommitOnBothStripes(id, target);
  };
  ASSERT_NO_FATAL_FAILURE(run(kA, d0, d1, 5'000'000, a));
  ASSERT_NO_FATAL_FAILURE(run(kB, d1, d2, 1'000'000, b));
  EXPECT_EQ(agent_->stats().refits_committed, 2u);
  EXPECT_EQ(store_, v2_) << "the node's bytes are not v2's";
}

}  // namespace
}  // namespace deltacast::relay::stripes_test
