// The commit record in a running tree (issue 32; docs/recovery.md, "The commit
// record"): a source and four nodes (two relays, two leaves) in one process over the
// inproc transport, with the in-memory store and a standby coordinator. The source is
// "lost" at a crash point: its links go at once and its Publish unwinds, as a machine
// that died would leave things. Every check is on the nodes' bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "apply/host_store.h"
#include "apply/replica.h"
#include "codec/manifest.h"
#include "common/crash_point.h"
#include "relay/tree/commit_record_memory.h"
#include "relay/tree/coordinator.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
#include "relay/wire/signing.h"
#include "topology/cluster_config.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {
namespace {

using namespace std::chrono_literals;
using Tensors = std::vector<std::vector<std::byte>>;

constexpr char kToken[] = "coordination-test-token";
constexpr char kCluster[] = "coordination-test";
constexpr uint64_t kPartitionBytes = 8 << 10;
constexpr int kReceivers = 4;  // src -> n1, n2; n1 -> n3, n4
constexpr auto kSourceTimeout = 400ms;
constexpr auto kPoll = 50ms;
// Every node must be at one version within this of the source's loss.
constexpr auto kBound = 10s;

std::string ConfigToml() {
  std::string toml =
      std::string("[cluster]\nname = \"") + kCluster +
      "\"\n\n[tree]\nfanout = 2\nchunk_size = \"8KiB\"\nwindow = 4\n"
      "connect_timeout = \"5s\"\ncommit_timeout = \"5s\"\ncommit_policy = \"all\"\n\n"
      "[[node]]\nid = \"src\"\nhost = \"mem\"\nport = 1\nregion = \"r\"\n"
      "role = \"source\"\n";
  for (int i = 1; i <= kReceivers; ++i) {
    toml += "\n[[node]]\nid = \"n" + std::to_string(i) +
            "\"\nhost = \"mem\"\nport = " + std::to_string(1 + 3 * i) +
            "\nregion = \"r\"\nrole = \"receiver\"\n";
  }
  return toml;
}

// What unwinds the source's Publish at its crash point (the machine is gone).
struct Lost {};

std::atomic<const char*> g_crash_at{nullptr};
std::function<void()>* g_on_crash = nullptr;

void OnCrashPoint(std::string_view name, void*) {
  const char* armed = g_crash_at.load();
  if (!armed || name != armed) return;
  g_crash_at = nullptr;
  (*g_on_crash)();
  throw Lost{};
}

class CoordinationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(32);
    for (int t = 0; t < 3; ++t) {
      tensors_.push_back({"layer" + std::to_string(t) + ".weight", DType::kBF16, {1 << 15}});
      std::vector<std::byte> b(size_t{2} << 15);
      for (auto& x : b) x = std::byte(rng());
      base_.push_back(b);
      for (size_t i = 0; i < b.size(); i += 2) {
        if (rng() % 100 < 3) b[i] ^= std::byte{1};
      }
      target_.push_back(std::move(b));
    }
    auto config = topology::ParseClusterConfig(ConfigToml(), "coordination-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    state_ = std::filesystem::temp_directory_path() /
             ("coordination-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(state_);
    store_ = std::make_shared<InMemoryCommitRecords>(kCluster);
    network_ = std::make_shared<transport::InprocNetwork>();
    on_crash_ = [this] { source_transport_->Shutdown(); };
    g_on_crash = &on_crash_;
    InstallCrashPointHandler(&OnCrashPoint, nullptr);
    if (signed_) {
      auto key = SigningKey::Generate();
      ASSERT_TRUE(key.ok()) << key.status().ToString();
      signing_key_ = std::make_shared<const SigningKey>(*key);
      verify_key_ = std::make_shared<const VerifyKey>(key->Public());
    }
    stores_.assign(kReceivers, base_);
    for (int i = 0; i < kReceivers; ++i) {
      auto replica = apply::Replica::ForStore(Borrow(stores_[i]), kPartitionBytes, 1);
      ASSERT_TRUE(replica.ok());
      NodeAgentOptions options;
      options.config = config_;
      options.node_id = "n" + std::to_string(i + 1);
      options.token = kToken;
      options.apply_threads = 1;
      options.commit_records = store_;
      options.source_timeout = kSourceTimeout;
      options.poll_interval = kPoll;
      options.verify_key = verify_key_;
      auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                    transport::MakeInprocTransport(network_));
      ASSERT_TRUE(agent.ok()) << agent.status().ToString();
      agents_.push_back(std::move(*agent));
    }
    StartSource("first");
  }

  void TearDown() override {
    if (coordinator_) coordinator_->Stop();
    source_.reset();
    for (auto& a : agents_) a->Stop();
    agents_.clear();
    g_crash_at = nullptr;
    InstallCrashPointHandler(nullptr, nullptr);
    std::filesystem::remove_all(state_);
  }

  void StartSource(const std::string& state) {
    PublishOptions o;
    o.config = config_;
    o.token = kToken;
    o.keep_deltas = 0;
    o.UseStateDir(state_ / state);
    o.commit_records = store_;
    o.source_timeout = kSourceTimeout;
    o.poll_interval = kPoll;
    o.signing_key = signing_key_;
    o.on_progress = [this](const PublishProgress&) {
      if (fail_store_mid_refit_) store_->SetFault(InMemoryCommitRecords::Fault::kUnavailable);
    };
    auto transport = transport::MakeInprocTransport(network_);
    source_transport_ = transport.get();
    auto source = Source::Start(std::move(o), std::move(transport));
    ASSERT_TRUE(source.ok()) << source.status().ToString();
    source_ = std::move(*source);
  }

  void StartCoordinator() {
    coordinator_ = std::make_unique<StandbyCoordinator>(store_, kCluster, "standby", kPoll);
    coordinator_->Start();
  }

  std::unique_ptr<apply::WeightStore> Borrow(Tensors& buffers) {
    std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
    for (size_t i = 0; i < tensors_.size(); ++i)
      spans.emplace_back(tensors_[i], MutableByteSpan(buffers[i]));
    return std::move(*apply::HostStore::Borrow(std::move(spans)));
  }
  codec::Manifest ManifestOf(const Tensors& t) {
    return codec::ComputeManifest(
        tensors_, [&](size_t i) { return ByteSpan(t[i]); }, kPartitionBytes, 1);
  }

  Result<PublishReport> Publish() {
    auto base = Borrow(base_), target = Borrow(target_);
    return source_->Publish(*base, ManifestOf(base_), *target, ManifestOf(target_));
  }
  // Publishes with the source lost at `point`: returns once its Publish unwound.
  void PublishAndLoseSourceAt(const char* point) {
    g_crash_at = point;
    bool lost = false;
    try {
      (void)Publish();
    } catch (const Lost&) {
      lost = true;
    }
    ASSERT_TRUE(lost) << "the source never reached " << point;
    source_.reset();  // the machine is gone: nothing of it renews or sends
  }

  // Waits until every node has ended `count` refits, at most kBound.
  bool AllEnded(uint64_t committed, uint64_t aborted) {
    const auto deadline = std::chrono::steady_clock::now() + kBound;
    for (;;) {
      bool all = true;
      for (const auto& a : agents_) {
        const NodeAgentStats s = a->stats();
        all &= s.refits_committed == committed && s.refits_aborted == aborted;
      }
      if (all) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(10ms);
    }
  }
  void ExpectAllAre(const Tensors& version, const char* what) {
    for (int i = 0; i < kReceivers; ++i) {
      for (size_t t = 0; t < tensors_.size(); ++t) {
        EXPECT_TRUE(stores_[i][t] == version[t])
            << "n" << i + 1 << " tensor " << t << " is not " << what;
      }
    }
  }
  uint64_t AnnouncedRefit() {
    auto undecided = store_->Undecided();
    EXPECT_TRUE(undecided.ok() && undecided->size() == 1u);
    return undecided.ok() && !undecided->empty() ? (*undecided)[0].refit_id : 0;
  }

  bool signed_ = false;  // the source signs, the nodes check ([security])
  std::shared_ptr<const SigningKey> signing_key_;
  std::shared_ptr<const VerifyKey> verify_key_;
  std::vector<TensorSpec> tensors_;
  Tensors base_, target_;
  topology::ClusterConfig config_;
  std::filesystem::path state_;
  std::shared_ptr<InMemoryCommitRecords> store_;
  std::shared_ptr<transport::InprocNetwork> network_;
  transport::Transport* source_transport_ = nullptr;
  std::function<void()> on_crash_;
  std::atomic<bool> fail_store_mid_refit_{false};
  std::vector<Tensors> stores_;
  std::vector<std::unique_ptr<NodeAgent>> agents_;
  std::unique_ptr<Source> source_;
  std::unique_ptr<StandbyCoordinator> coordinator_;
};

TEST_F(CoordinationTest, WithTheStoreARefitCommitsAndItsRecordSaysSo) {
  auto report = Publish();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->committed) << report->abort_reason;
  ExpectAllAre(target_, "the target");
  auto record = store_->Read(report->refit_id);
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_TRUE((*record)->commit);
  EXPECT_EQ((*record)->decided_by, "source");
  EXPECT_TRUE(store_->Undecided()->empty()) << "the announcement outlived the decision";
}

TEST_F(CoordinationTest, SourceLostAfterAllPreparedTheCoordinatorAbortsAndAllRollBack) {
  StartCoordinator();
  const auto lost_at = std::chrono::steady_clock::now();
  PublishAndLoseSourceAt("source.before_decision");
  ASSERT_TRUE(AllEnded(0, 1)) << "not every node rolled back within the bound";
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - lost_at).count();
  ExpectAllAre(base_, "the base");
  const auto records = store_->All();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_FALSE(records[0].commit);
  EXPECT_EQ(records[0].decided_by, "coordinator:standby");
  EXPECT_EQ(coordinator_->stats().aborts_written, 1u);
  RecordProperty("seconds_to_rollback", std::to_string(seconds));
  // A source that comes back, its state gone, follows the record: the cluster is at
  // the base, and the next refit commits.
  StartSource("second");
  EXPECT_TRUE(source_->version().IsZero() || source_->version() == ManifestOf(base_).VersionId());
  auto again = Publish();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->committed) << again->abort_reason;
  ExpectAllAre(target_, "the target");
}

TEST_F(CoordinationTest, CommitRecordWrittenThenSourceLostTheNodesCommitFromTheRecord) {
  StartCoordinator();
  PublishAndLoseSourceAt("source.decided");
  ASSERT_TRUE(AllEnded(1, 0)) << "not every node committed from the record within the bound";
  ExpectAllAre(target_, "the target");
  const auto records = store_->All();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_TRUE(records[0].commit);
  EXPECT_EQ(coordinator_->stats().aborts_written, 0u) << "the coordinator wrote over a COMMIT";
  // Back with its state deleted: the record gives it the cluster's version.
  StartSource("second");
  EXPECT_EQ(source_->version(), ManifestOf(target_).VersionId());
}

// Signatures checked: a relay that took the decision from the record does not pass
// an unsigned one down (its children would refuse it and drop the link); they read
// the record themselves.
class SignedCoordinationTest : public CoordinationTest {
 protected:
  SignedCoordinationTest() { signed_ = true; }
};

TEST_F(SignedCoordinationTest, EveryNodeCommitsFromTheRecordWithNoUnsignedDecisionSent) {
  PublishAndLoseSourceAt("source.decided");
  ASSERT_TRUE(AllEnded(1, 0)) << "not every node committed from the record within the bound";
  ExpectAllAre(target_, "the target");
}

TEST_F(CoordinationTest, StoreUnavailableBeforeTheRefitNothingIsSent) {
  store_->SetFault(InMemoryCommitRecords::Fault::kUnavailable);
  auto report = Publish();
  ASSERT_FALSE(report.ok()) << "a refit was published with the store out of reach";
  EXPECT_NE(report.status().message().find("commit record store"), std::string::npos)
      << report.status().ToString();
  for (const auto& a : agents_) EXPECT_EQ(a->stats().chunks_received, 0u);
  ExpectAllAre(base_, "the base");
}

TEST_F(CoordinationTest, StoreUnavailableDuringTheRefitNoCommit) {
  fail_store_mid_refit_ = true;
  auto report = Publish();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->committed) << "committed with no record written";
  EXPECT_NE(report->abort_reason.find("commit record store"), std::string::npos)
      << report->abort_reason;
  ASSERT_TRUE(AllEnded(0, 1));
  ExpectAllAre(base_, "the base");
  fail_store_mid_refit_ = false;
  store_->SetFault(InMemoryCommitRecords::Fault::kNone);
  EXPECT_TRUE(store_->All().empty());
  auto again = Publish();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->committed) << again->abort_reason;
  ExpectAllAre(target_, "the target");
}

TEST_F(CoordinationTest, ARecordNamingAnotherVersionIsNeverFollowed) {
  PublishAndLoseSourceAt("source.before_decision");
  const uint64_t id = AnnouncedRefit();
  CommitRecord wrong{
      kCluster, id, ManifestOf(base_).VersionId(), ManifestOf(base_).VersionId(), true, "source"};
  store_->OverwriteUnchecked(id, wrong);
  std::this_thread::sleep_for(kSourceTimeout + 10 * kPoll);
  for (const auto& a : agents_) {
    EXPECT_EQ(a->stats().refits_committed, 0u) << "a node followed a record of another version";
    EXPECT_EQ(a->stats().refits_aborted, 0u);
  }
  CommitRecord right = wrong;
  right.target_version = ManifestOf(target_).VersionId();
  right.commit = false;
  store_->OverwriteUnchecked(id, right);
  ASSERT_TRUE(AllEnded(0, 1));
  ExpectAllAre(base_, "the base");
}

}  // namespace
}  // namespace deltacast::relay
