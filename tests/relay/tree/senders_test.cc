// Stripes rooted at sender nodes (relay/tree/sender_agent.h; docs/protocol.md,
// "Senders"): the planner roots stripe i at the i-th sender and the source feeds
// each sender its stripe alone over loopback tcp. Every receiver's weights are
// checked against the target, bytes and version id.
#include <set>
#include <string>
#include <thread>

#include "relay/tree/sender_agent.h"
#include "tests/relay/tree/stripes_fixture.h"

namespace deltacast::relay::stripes_test {
namespace {

constexpr int kSenders = 2;
constexpr int kReceiverCount = 4;

std::string SendersToml(int base_port, const std::string& policy,
                        const std::string& connect_timeout) {
  std::string toml =
      "[cluster]\nname = \"senders-test\"\n\n[tree]\nfanout = 2\nchunk_size = \"4KiB\"\n"
      "window = 4\nstripes = 2\nconnect_timeout = \"" +
      connect_timeout + "\"\ncommit_timeout = \"20s\"\ncommit_policy = \"" + policy +
      "\"\n\n[[node]]\nid = \"src\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port) +
      "\nregion = \"r\"\nrole = \"source\"\n";
  for (int i = 1; i <= kSenders; ++i) {
    toml += "\n[[node]]\nid = \"s" + std::to_string(i) +
            "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port + i) +
            "\nregion = \"r\"\nrole = \"sender\"\n";
  }
  for (int i = 1; i <= kReceiverCount; ++i) {
    toml += "\n[[node]]\nid = \"n" + std::to_string(i) +
            "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port + kSenders + i) +
            "\nregion = \"r\"\nrole = \"receiver\"\n";
  }
  return toml;
}

// The next version: about `percent` % of the elements of `v.target` changed again.
void NextVersion(Versions& v, uint32_t seed, int percent) {
  std::mt19937 rng(seed);
  v.base = v.target;
  for (auto& tensor : v.target) {
    for (size_t i = 0; i + 1 < tensor.size(); i += 2) {
      if (rng() % 100 < static_cast<uint32_t>(percent)) tensor[i] ^= std::byte{2};
    }
  }
}

class SendersTest : public ::testing::Test {
 protected:
  void Configure(const std::string& policy, const std::string& connect_timeout) {
    for (int tries = 0; tries < 100; ++tries) {
      base_port_ = 20000 + static_cast<int>(std::random_device{}() % 1200) * 10;
      if (PortsFree(base_port_, 1 + kSenders + kReceiverCount)) break;
    }
    auto config = topology::ParseClusterConfig(SendersToml(base_port_, policy, connect_timeout),
                                               "senders-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    auto plan = topology::PlanStripes(config_);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    plan_ = *plan;
    ASSERT_EQ(plan_.stripes.size(), 2u);
    for (int s = 0; s < kSenders; ++s) {
      // The planner roots stripe s at sender s+1 (equal uplinks: by id), fed by the source.
      ASSERT_EQ(plan_.stripes[s].root, "s" + std::to_string(s + 1));
      ASSERT_EQ(plan_.stripes[s].feeder, "src");
    }
  }

  std::unique_ptr<transport::Transport> Tcp(std::shared_ptr<Sent> sent) {
    transport::TransportOptions options;
    options.connect_timeout = std::chrono::milliseconds(2000);
    auto t = transport::MakeTransport("tcp", options);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::make_unique<CountingTransport>(std::move(*t), std::move(sent));
  }

  void StartSender(int j) {
    SenderAgentOptions options;
    options.config = config_;
    options.node_id = "s" + std::to_string(j + 1);
    options.token = kToken;
    sender_sent_[j] = std::make_shared<Sent>();
    auto sender = SenderAgent::Start(std::move(options), Tcp(sender_sent_[j]), plan_);
    ASSERT_TRUE(sender.ok()) << sender.status().ToString();
    senders_[j] = std::move(*sender);
  }

  // Receiver n<i+1> over stores_[i].
  void StartReceiver(int i, const Versions& v) {
    auto replica = apply::Replica::ForStore(Borrow(v.tensors, stores_[i]), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok());
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n" + std::to_string(i + 1);
    options.token = kToken;
    options.apply_threads = 1;
    auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                  Tcp(std::make_shared<Sent>()), plan_);
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    agents_[i] = std::move(*agent);
  }

  // The senders, the receivers but those in `later`, and the source.
  void StartAll(const Versions& v, const std::set<int>& later = {}) {
    stores_.assign(kReceiverCount, v.base);
    agents_.resize(kReceiverCount);
    senders_.resize(kSenders);
    sender_sent_.resize(kSenders);
    for (int j = 0; j < kSenders; ++j) ASSERT_NO_FATAL_FAILURE(StartSender(j));
    for (int i = 0; i < kReceiverCount; ++i) {
      if (later.contains(i)) continue;
      ASSERT_NO_FATAL_FAILURE(StartReceiver(i, v));
    }
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    if (!state_dir_.empty()) options.UseStateDir(state_dir_);
    source_sent_ = std::make_shared<Sent>();
    auto transport = Tcp(source_sent_);
    if (source_bytes_per_second_ > 0) {
      transport::FaultPlan slow;
      slow.bandwidth_bytes_per_second = source_bytes_per_second_;
      transport = transport::WrapWithFaults(std::move(transport), slow);
    }
    auto source = Source::Start(options, std::move(transport), plan_);
    ASSERT_TRUE(source.ok()) << source.status().ToString();
    source_ = std::move(*source);
  }

  Result<PublishReport> Publish(Versions& v) {
    auto base = Borrow(v.tensors, v.base);
    auto target = Borrow(v.tensors, v.target);
    return source_->Publish(*base, ManifestOf(*base), *target, ManifestOf(*target));
  }

  // Every receiver holds `v.target`: its bytes and its version id (hash of every
  // partition).
  void ExpectAllAtTarget(Versions& v) {
    auto target = Borrow(v.tensors, v.target);
    const Digest128 want = ManifestOf(*target).VersionId();
    for (int i = 0; i < kReceiverCount; ++i) {
      auto held = Borrow(v.tensors, stores_[i]);
      EXPECT_EQ(ManifestOf(*held).VersionId(), want) << "n" << i + 1;
      EXPECT_TRUE(stores_[i] == v.target) << "n" << i + 1 << " is not bit-exact";
    }
  }

  // A thread that stops every sender once each has received two of its stripe's chunks.
  std::thread KillEverySenderOnceItsStripeStreams() {
    return std::thread([this] {
      const bool began = WaitUntil(
          [&] {
            return senders_[0]->stats().chunks_received >= 2 &&
                   senders_[1]->stats().chunks_received >= 2;
          },
          std::chrono::seconds(20));
      EXPECT_TRUE(began) << "the senders never received their stripes' chunks";
      for (auto& s : senders_) s->Stop();
    });
  }

  // Waits up to `timeout` for `done`.
  static bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  void TearDown() override {
    if (source_) source_->Stop();
    for (auto& s : senders_) {
      if (s) s->Stop();
    }
    for (auto& a : agents_) {
      if (a) a->Stop();
    }
    if (!state_dir_.empty()) std::filesystem::remove_all(state_dir_);
  }

  int base_port_ = 0;
  double source_bytes_per_second_ = 0;
  std::filesystem::path state_dir_;  // the source's decision log and kept deltas, if set
  topology::ClusterConfig config_;
  topology::StripedPlan plan_;
  std::vector<std::vector<std::vector<std::byte>>> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::vector<std::unique_ptr<SenderAgent>> senders_;
  std::vector<std::shared_ptr<Sent>> sender_sent_;
  std::shared_ptr<Sent> source_sent_;
  std::unique_ptr<Source> source_;
};

// Two senders, a stripe each: two refits commit bit-exact; the source sends each data
// chunk once (to the one sender whose stripe carries it), so its uplink carries about
// one copy of the delta; each sender forwards only its own stripe's chunks.
TEST_F(SendersTest, TwoSendersCommitTwoStepsBitExactAndTheSourceSendsOneCopy) {
  ASSERT_NO_FATAL_FAILURE(Configure("all", "5s"));
  Versions v = MakeVersions(256 << 10, 31);
  ASSERT_NO_FATAL_FAILURE(StartAll(v));
  for (int step = 0; step < 2; ++step) {
    if (step == 1) NextVersion(v, 32, 15);
    for (Sent* sent : {source_sent_.get(), sender_sent_[0].get(), sender_sent_[1].get()}) {
      std::lock_guard lock(sent->mu);
      sent->data_chunks.clear();
      sent->data_bytes = 0;
      sent->ends = 0;
    }
    auto report = Publish(v);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceiverCount));
    EXPECT_EQ(report->nodes_decided, static_cast<uint32_t>(kReceiverCount));
    ExpectAllAtTarget(v);
    const uint64_t data_chunks = report->delta.chunks - 1;
    ASSERT_GT(data_chunks, 16u);
    {
      std::lock_guard lock(source_sent_->mu);
      EXPECT_EQ(source_sent_->data_chunks.size(), data_chunks);
      for (const auto& [sequence, times] : source_sent_->data_chunks) {
        EXPECT_EQ(times, 1) << "the source sent data chunk " << sequence << " " << times
                            << " times";
      }
      const double share = static_cast<double>(source_sent_->data_bytes) /
                           static_cast<double>(report->delta.delta_bytes);
      EXPECT_LT(share, 1.3);
      RecordProperty("source_upload_over_delta_step" + std::to_string(step), std::to_string(share));
      EXPECT_EQ(source_sent_->ends, kSenders);  // the END goes to every sender
    }
    for (int j = 0; j < kSenders; ++j) {
      std::lock_guard lock(sender_sent_[j]->mu);
      EXPECT_FALSE(sender_sent_[j]->data_chunks.empty());
      for (const auto& [sequence, times] : sender_sent_[j]->data_chunks) {
        EXPECT_EQ(sequence % kSenders, static_cast<uint32_t>(j))
            << "sender s" << j + 1 << " forwarded chunk " << sequence << " of another stripe";
      }
    }
  }
  for (int j = 0; j < kSenders; ++j) {
    const SenderAgentStats stats = senders_[j]->stats();
    EXPECT_EQ(stats.refits_committed, 2u);
    EXPECT_EQ(stats.chunks_refused, 0u);
  }
}

// A sender killed mid-refit: its stripe's receivers fail over to the source (their
// failover parent in that stripe's tree), the refit commits (policy available) with
// every receiver bit-exact; the sender restarted rejoins and serves the next refit.
TEST_F(SendersTest, ASenderKilledMidRefitFailsItsStripeOverAndCommitsBitExact) {
  ASSERT_NO_FATAL_FAILURE(Configure("available", "2s"));
  source_bytes_per_second_ = 256 << 10;  // long enough a refit to kill a sender in it
  Versions v = MakeVersions(256 << 10, 41);
  ASSERT_NO_FATAL_FAILURE(StartAll(v));
  constexpr int kKilled = 1;  // s2, the root of stripe 1
  std::thread killer([&] {
    const bool began = WaitUntil([&] { return senders_[kKilled]->stats().chunks_received >= 4; },
                                 std::chrono::seconds(20));
    EXPECT_TRUE(began) << "s2 never received its stripe's chunks";
    senders_[kKilled]->Stop();
  });
  auto report = Publish(v);
  killer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceiverCount));
  ExpectAllAtTarget(v);

  // Restarted: its children come home between refits, and it serves the next one.
  senders_[kKilled].reset();
  ASSERT_NO_FATAL_FAILURE(StartSender(kKilled));
  const size_t children = plan_.stripes[kKilled].tree.nodes.front().children.size();
  ASSERT_TRUE(WaitUntil(
      [&] {
        const SenderAgentStats s = senders_[kKilled]->stats();
        return s.parent_joins >= 1 && s.children_joined >= children;
      },
      std::chrono::seconds(20)))
      << "the restarted sender's children did not come back";
  NextVersion(v, 42, 15);
  report = Publish(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  ExpectAllAtTarget(v);
  // It confirmed this refit, for its whole stripe: every receiver is in every tree.
  ASSERT_TRUE(
      WaitUntil([&] { return senders_[kKilled]->stats().last_committed_refit == report->refit_id; },
                std::chrono::seconds(5)));
  EXPECT_EQ(report->nodes_decided, static_cast<uint32_t>(kReceiverCount));
}

// Under commit policy `all` too: a sender holds no weights, so its death mid-refit
// fails nothing. Its stripe's first level fails over to the source, which replays
// them the stripe; every receiver prepares and the refit commits bit-exact. Each of
// them joined the dead sender's stripe twice and the other stripe once.
TEST_F(SendersTest, UnderPolicyAllASenderKilledMidRefitFailsItsStripeOverAndCommits) {
  ASSERT_NO_FATAL_FAILURE(Configure("all", "2s"));
  source_bytes_per_second_ = 256 << 10;  // long enough a refit to kill a sender in it
  Versions v = MakeVersions(256 << 10, 43);
  ASSERT_NO_FATAL_FAILURE(StartAll(v));
  constexpr int kKilled = 1;  // s2, the root of stripe 1
  std::atomic<uint64_t> n1_had = 0;
  std::thread killer([&] {
    const bool began = WaitUntil([&] { return senders_[kKilled]->stats().chunks_received >= 2; },
                                 std::chrono::seconds(20));
    EXPECT_TRUE(began) << "s2 never received its stripe's chunks";
    senders_[kKilled]->Stop();
    n1_had = agents_[0]->stats().chunks_received;
  });
  auto report = Publish(v);
  killer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_LT(n1_had.load(), report->delta.chunks) << "s2 died after n1 had every chunk";
  EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceiverCount));
  ExpectAllAtTarget(v);
  const std::vector<std::string>& first_level = plan_.stripes[kKilled].tree.nodes.front().children;
  ASSERT_FALSE(first_level.empty());
  for (const std::string& id : first_level) {
    const NodeAgentStats s = agents_[std::stoi(id.substr(1)) - 1]->stats();
    EXPECT_EQ(s.refits_committed, 1u) << id;
    EXPECT_EQ(s.stripe_parent_joins, (std::vector<uint64_t>{1, 2})) << id;
  }
  // Nor does a sender that stays dead stop the next refit: it is left out at the start.
  NextVersion(v, 44, 15);
  report = Publish(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceiverCount));
  ExpectAllAtTarget(v);
}

// Every sender killed mid-refit under `all`: while their stripes' first levels have
// not failed over yet, no stripe at the source has a node in it, and the refit must
// not commit then; it commits once every receiver prepared through the source.
TEST_F(SendersTest, UnderPolicyAllEverySenderKilledMidRefitCommitsOnceEveryReceiverPrepared) {
  ASSERT_NO_FATAL_FAILURE(Configure("all", "2s"));
  source_bytes_per_second_ = 256 << 10;
  Versions v = MakeVersions(256 << 10, 45);
  ASSERT_NO_FATAL_FAILURE(StartAll(v));
  std::thread killer = KillEverySenderOnceItsStripeStreams();
  auto report = Publish(v);
  killer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceiverCount))
      << "committed before every receiver prepared";
  ExpectAllAtTarget(v);
  for (int i = 0; i < kReceiverCount; ++i) {
    EXPECT_EQ(agents_[i]->stats().refits_committed, 1u) << "n" << i + 1;
  }
}

// Every sender killed mid-refit under `available`: each is left out at the connect
// timeout, before its stripe's first level fails over (kFailoverAfter is longer), so
// for a while no node that holds weights is in the refit at all. Nothing prepared, it
// must not commit (the source's version would move while no store did): it aborts,
// and every receiver, failed over to the source and replayed the ABORT, stays at the
// base, bytes and version id.
TEST_F(SendersTest, UnderPolicyAvailableEverySenderKilledMidRefitWithNothingPreparedAborts) {
  ASSERT_NO_FATAL_FAILURE(Configure("available", "1s"));
  source_bytes_per_second_ = 256 << 10;
  Versions v = MakeVersions(256 << 10, 47);
  ASSERT_NO_FATAL_FAILURE(StartAll(v));
  const Digest128 base_version = ManifestOf(*Borrow(v.tensors, v.base)).VersionId();
  std::thread killer = KillEverySenderOnceItsStripeStreams();
  auto report = Publish(v);
  killer.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed) << "committed with " << report->nodes.size()
                                  << " receivers prepared";
  EXPECT_TRUE(report->nodes.empty());
  EXPECT_NE(report->abort_reason.find("no receiver"), std::string::npos) << report->abort_reason;
  EXPECT_EQ(source_->version(), base_version) << "the source's version moved";
  // Each receiver learns the ABORT (failed over to the source, or from its parent).
  EXPECT_TRUE(WaitUntil(
      [&] {
        for (auto& a : agents_) {
          if (a->stats().refits_aborted == 0) return false;
        }
        return true;
      },
      std::chrono::seconds(30)))
      << "a receiver never learned the ABORT";
  for (int i = 0; i < kReceiverCount; ++i) {
    const NodeAgentStats s = agents_[i]->stats();
    EXPECT_EQ(s.refits_committed, 0u) << "n" << i + 1;
    EXPECT_EQ(s.version, base_version) << "n" << i + 1;
    auto held = Borrow(v.tensors, stores_[i]);
    EXPECT_EQ(ManifestOf(*held).VersionId(), base_version) << "n" << i + 1;
    EXPECT_TRUE(stores_[i] == v.base) << "n" << i + 1 << " is not at the base, bit for bit";
  }
}

// A receiver whose stripe-0 parent is a sender joins late, two versions behind: its
// catch-up requests (FETCH_CHAIN, FETCH_DELTA_CHUNK; FETCH_MANIFEST and FETCH if it
// goes by partitions) go to that sender, which forwards them to the source and passes
// the answers back; it catches up, takes the next refit and ends bit-exact.
TEST_F(SendersTest, ALateReceiverBelowASenderCatchesUpThroughIt) {
  ASSERT_NO_FATAL_FAILURE(Configure("available", "1s"));
  state_dir_ =
      std::filesystem::temp_directory_path() /
      ("deltacast-senders-test-" + std::to_string(base_port_) + "-" + std::to_string(::getpid()));
  // A child of s1 in stripe 0 (its stripe-0 parent, where requests up go).
  const std::string late_id = plan_.stripes[0].tree.nodes.front().children.front();
  const int late = std::stoi(late_id.substr(1)) - 1;
  Versions v = MakeVersions(64 << 10, 51);
  const Versions first = v;
  ASSERT_NO_FATAL_FAILURE(StartAll(v, {late}));
  // Two versions ahead of it: the parents' spools hold only the last refit, whose
  // base it lacks too, so it must catch up (a replay alone cannot take it there).
  Result<PublishReport> report = Status::Unavailable("not published yet");
  for (int step = 0; step < 2; ++step) {
    if (step == 1) NextVersion(v, 53, 15);
    report = Publish(v);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceiverCount - 1));
  }

  stores_[late] = first.base;  // two versions behind
  ASSERT_NO_FATAL_FAILURE(StartReceiver(late, first));
  // Its join check, through the first of its stripe parents that says the version
  // (s1, or its stripe-1 parent: docs/protocol.md, "The join check"): told the
  // version the cluster committed (a sender knows its id from the COMMIT), which its
  // weights are not.
  const JoinCheck::State joined = agents_[late]->WaitForJoin(std::chrono::seconds(10));
  EXPECT_TRUE(joined.checked) << joined.status.ToString();
  std::set<std::string> parents;
  for (const auto& stripe : plan_.stripes) parents.insert(*stripe.tree.Find(late_id)->parent);
  EXPECT_TRUE(parents.count(joined.parent)) << joined.parent;
  EXPECT_EQ(joined.parent_version, ManifestOf(*Borrow(v.tensors, v.target)).VersionId());
  EXPECT_EQ(joined.status.code(), StatusCode::kFailedPrecondition) << joined.status.ToString();
  const uint64_t forwarded_before = senders_[0]->stats().requests_forwarded;
  NextVersion(v, 52, 15);
  report = Publish(v);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(report->nodes.size(), static_cast<size_t>(kReceiverCount));
  ExpectAllAtTarget(v);
  EXPECT_GT(agents_[late]->stats().deltas_caught_up + agents_[late]->stats().partitions_caught_up,
            0u);
  EXPECT_GT(senders_[0]->stats().requests_forwarded, forwarded_before);
}

// A sender is not a receiver: NodeAgent refuses to run one, SenderAgent refuses a
// receiver.
TEST_F(SendersTest, ASenderRunsOnlyAsASenderAndAReceiverOnlyAsAReceiver) {
  ASSERT_NO_FATAL_FAILURE(Configure("all", "5s"));
  Versions v = MakeVersions(1 << 10, 7);
  std::vector<std::vector<std::byte>> buffers = v.base;
  auto replica = apply::Replica::ForStore(Borrow(v.tensors, buffers), kPartitionBytes, 1);
  ASSERT_TRUE(replica.ok());
  NodeAgentOptions node;
  node.config = config_;
  node.node_id = "s1";
  node.token = kToken;
  auto agent =
      NodeAgent::Start(std::move(node), std::move(*replica), Tcp(std::make_shared<Sent>()), plan_);
  ASSERT_FALSE(agent.ok());
  EXPECT_NE(agent.status().message().find("sender that roots a stripe"), std::string::npos)
      << agent.status().ToString();
  SenderAgentOptions sender;
  sender.config = config_;
  sender.node_id = "n1";
  sender.token = kToken;
  auto started = SenderAgent::Start(std::move(sender), Tcp(std::make_shared<Sent>()), plan_);
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("is not a sender"), std::string::npos)
      << started.status().ToString();
}

}  // namespace
}  // namespace deltacast::relay::stripes_test
