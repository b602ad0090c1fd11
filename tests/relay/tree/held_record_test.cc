// A node restarted with a delta in flight, its source's machine lost for good,
// settles the delta from the commit record (issue 32; docs/recovery.md, "The commit
// record"): src -> n1 in one process over the inproc transport, n1 on a real
// checkpoint directory (its journal and spool on disk), the in-memory store. The
// source dies at a crash point once n1 PREPARED; n1 is stopped and started again on
// the same directory, so only its journal and spool say what it holds. Every check
// is on n1's bytes, hashed as they are on disk.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "apply/safetensors.h"
#include "codec/manifest.h"
#include "common/crash_point.h"
#include "common/file_util.h"
#include "relay/store/spool.h"
#include "relay/tree/commit_record_memory.h"
#include "relay/tree/coordinator.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
#include "relay/tree/source_records.h"
#include "topology/cluster_config.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Tensors = std::vector<std::vector<std::byte>>;

constexpr char kToken[] = "held-record-test-token";
constexpr char kCluster[] = "held-record-test";
constexpr uint64_t kPartitionBytes = 8 << 10;
constexpr auto kSourceTimeout = 300ms;
constexpr auto kPoll = 50ms;
constexpr auto kBound = 10s;  // the node settles its delta within this of the record

std::string ConfigToml() {
  return std::string("[cluster]\nname = \"") + kCluster +
         "\"\n\n[tree]\nfanout = 2\nchunk_size = \"8KiB\"\nwindow = 4\n"
         "connect_timeout = \"5s\"\ncommit_timeout = \"5s\"\ncommit_policy = \"all\"\n\n"
         "[[node]]\nid = \"src\"\nhost = \"mem\"\nport = 1\nregion = \"r\"\nrole = \"source\"\n"
         "\n[[node]]\nid = \"n1\"\nhost = \"mem\"\nport = 4\nregion = \"r\"\n"
         "role = \"receiver\"\n";
}

struct Lost {};  // unwinds the source's Publish at its crash point (the machine is gone)

std::atomic<const char*> g_crash_at{nullptr};
std::function<void()>* g_on_crash = nullptr;

void OnCrashPoint(std::string_view name, void*) {
  const char* armed = g_crash_at.load();
  if (!armed || name != armed) return;
  g_crash_at = nullptr;
  (*g_on_crash)();
  throw Lost{};
}

class HeldRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(33);
    for (int t = 0; t < 3; ++t) {
      tensors_.push_back({"layer" + std::to_string(t) + ".weight", DType::kBF16, {1 << 14}});
      std::vector<std::byte> b(size_t{2} << 14);
      for (auto& x : b) x = std::byte(rng());
      base_.push_back(b);
      for (size_t i = 0; i < b.size(); i += 2) {
        if (rng() % 100 < 3) b[i] ^= std::byte{1};
      }
      target_.push_back(std::move(b));
    }
    auto config = topology::ParseClusterConfig(ConfigToml(), "held-record-test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    dir_ = fs::temp_directory_path() / ("held-record-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(Checkpoint());
    auto writer = apply::SafetensorsWriter::Create(Checkpoint() / "model.safetensors", tensors_);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (const auto& t : base_) ASSERT_TRUE((*writer)->Append(t).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
    base_id_ = ManifestOf(base_).VersionId();
    target_id_ = ManifestOf(target_).VersionId();
    store_ = std::make_shared<InMemoryCommitRecords>(kCluster);
    network_ = std::make_shared<transport::InprocNetwork>();
    on_crash_ = [this] { source_transport_->Shutdown(); };
    g_on_crash = &on_crash_;
    InstallCrashPointHandler(&OnCrashPoint, nullptr);
    StartNode();
    StartSource();
  }

  void TearDown() override {
    if (coordinator_) coordinator_->Stop();
    source_.reset();
    if (node_) node_->Stop();
    node_.reset();
    g_crash_at = nullptr;
    InstallCrashPointHandler(nullptr, nullptr);
    fs::remove_all(dir_);
  }

  fs::path Checkpoint() const { return dir_ / "n1"; }
  fs::path Spools() const { return Checkpoint() / apply::kStateDirName / "spool"; }

  void StartNode() {
    auto replica = apply::Replica::OpenCheckpointDir(Checkpoint(), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok()) << replica.status().ToString();
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n1";
    options.token = kToken;
    options.apply_threads = 1;
    options.spool_dir = Spools();
    options.commit_records = store_;
    options.source_timeout = kSourceTimeout;
    options.poll_interval = kPoll;
    auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                  transport::MakeInprocTransport(network_));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    node_ = std::move(*agent);
  }

  void StartSource() {
    PublishOptions o;
    o.config = config_;
    o.token = kToken;
    o.keep_deltas = 0;
    o.UseStateDir(dir_ / "src");
    o.commit_records = store_;
    o.source_timeout = kSourceTimeout;
    o.poll_interval = kPoll;
    auto transport = transport::MakeInprocTransport(network_);
    source_transport_ = transport.get();
    auto source = Source::Start(std::move(o), std::move(transport));
    ASSERT_TRUE(source.ok()) << source.status().ToString();
    source_ = std::move(*source);
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

  // Publishes base -> target and loses the source once n1 PREPARED (its crash point
  // before the decision); then restarts n1 on its directory. Returns the refit's id.
  uint64_t PrepareLoseSourceAndRestart() {
    g_crash_at = "source.before_decision";
    bool lost = false;
    try {
      auto base = Borrow(base_), target = Borrow(target_);
      (void)source_->Publish(*base, ManifestOf(base_), *target, ManifestOf(target_));
    } catch (const Lost&) {
      lost = true;
    }
    EXPECT_TRUE(lost) << "the source never reached its decision";
    source_.reset();  // the machine is gone: nothing of it renews or sends
    auto undecided = store_->Undecided();
    EXPECT_TRUE(undecided.ok() && undecided->size() == 1u);
    const uint64_t id = undecided.ok() && !undecided->empty() ? (*undecided)[0].refit_id : 0;
    node_->Stop();
    node_.reset();
    {
      // What the node holds, as its restart will read it: PREPARED, the delta's refit kept.
      auto replica = apply::Replica::OpenCheckpointDir(Checkpoint(), kPartitionBytes, 1);
      EXPECT_TRUE(replica.ok()) << replica.status().ToString();
      if (replica.ok()) {
        EXPECT_TRUE((*replica)->inflight().has_value());
        EXPECT_TRUE((*replica)->prepared());
      }
      EXPECT_EQ(Spool::RefitOf(Spools(), target_id_), id);
    }
    return id;
  }

  // Waits until n1 has ended `committed` + `aborted` refits, at most kBound.
  bool Ended(uint64_t committed, uint64_t aborted) {
    const auto deadline = std::chrono::steady_clock::now() + kBound;
    for (;;) {
      const NodeAgentStats s = node_->stats();
      if (s.refits_committed == committed && s.refits_aborted == aborted) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(10ms);
    }
  }

  // Stops n1 and checks its directory holds `version` exactly, nothing in flight.
  void ExpectDiskIs(const Digest128& version, const char* what) {
    node_->Stop();
    node_.reset();
    auto replica = apply::Replica::OpenCheckpointDir(Checkpoint(), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok()) << replica.status().ToString();
    EXPECT_FALSE((*replica)->inflight().has_value()) << "a delta is still in flight";
    EXPECT_EQ((*replica)->version(), version) << "the journal is not at " << what;
    auto hashed = (*replica)->HashStoreNow();
    ASSERT_TRUE(hashed.ok()) << hashed.status().ToString();
    EXPECT_EQ(hashed->VersionId(), version) << "the bytes on disk are not " << what;
  }

  // n1 still holds the delta, undecided: nothing settled, nothing ended.
  void ExpectStillHeld() {
    const NodeAgentStats s = node_->stats();
    EXPECT_EQ(s.refits_committed, 0u);
    EXPECT_EQ(s.refits_aborted, 0u);
    EXPECT_EQ(s.held_settled_from_record, 0u);
  }

  std::vector<TensorSpec> tensors_;
  Tensors base_, target_;
  Digest128 base_id_, target_id_;
  topology::ClusterConfig config_;
  fs::path dir_;
  std::shared_ptr<InMemoryCommitRecords> store_;
  std::shared_ptr<transport::InprocNetwork> network_;
  transport::Transport* source_transport_ = nullptr;
  std::function<void()> on_crash_;
  std::unique_ptr<NodeAgent> node_;
  std::unique_ptr<Source> source_;
  std::unique_ptr<StandbyCoordinator> coordinator_;
};

TEST_F(HeldRecordTest, NoRecordTheRestartedNodeWaitsThenACommitRecordCommitsIt) {
  const uint64_t id = PrepareLoseSourceAndRestart();
  ASSERT_NE(id, 0u);
  StartNode();
  // No record (and no coordinator): it holds the delta, past many polls.
  std::this_thread::sleep_for(kSourceTimeout + 8 * kPoll);
  ExpectStillHeld();
  // Records it must never follow: another cluster's, and one naming other versions.
  store_->OverwriteUnchecked(
      id, CommitRecord{"another-cluster", id, base_id_, target_id_, true, kDecidedBySource});
  std::this_thread::sleep_for(6 * kPoll);
  ExpectStillHeld();
  store_->OverwriteUnchecked(
      id, CommitRecord{kCluster, id, base_id_, base_id_, true, kDecidedBySource});
  std::this_thread::sleep_for(6 * kPoll);
  ExpectStillHeld();
  // The source's COMMIT (it wrote it, then its machine was lost).
  store_->OverwriteUnchecked(
      id, CommitRecord{kCluster, id, base_id_, target_id_, true, kDecidedBySource});
  ASSERT_TRUE(Ended(1, 0)) << "the held delta was not committed from the record";
  EXPECT_EQ(node_->stats().held_settled_from_record, 1u);
  EXPECT_EQ(node_->stats().version, target_id_);
  ExpectDiskIs(target_id_, "the target");
}

TEST_F(HeldRecordTest, TheCoordinatorsAbortRollsTheRestartedNodeBackToTheBase) {
  const uint64_t id = PrepareLoseSourceAndRestart();
  ASSERT_NE(id, 0u);
  StartNode();
  coordinator_ = std::make_unique<StandbyCoordinator>(store_, kCluster, "standby", kPoll);
  coordinator_->Start();
  ASSERT_TRUE(Ended(0, 1)) << "the held delta was not rolled back from the record";
  const auto records = store_->All();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].refit_id, id);
  EXPECT_FALSE(records[0].commit);
  EXPECT_EQ(records[0].decided_by, "coordinator:standby");
  EXPECT_EQ(node_->stats().held_settled_from_record, 1u);
  ExpectDiskIs(base_id_, "the base");
}

// A spool noted before the refit id was kept with it: the record is found by base and
// target. It waits while a refit of that delta is announced and undecided (it may be
// the one held); a COMMIT among several records of the delta wins.
TEST_F(HeldRecordTest, WithoutTheRefitIdARecordOfTheSameDeltaIsFollowedCommitFirst) {
  const uint64_t id = PrepareLoseSourceAndRestart();
  ASSERT_NE(id, 0u);
  const fs::path stream_file = Spools() / ("delta-" + target_id_.ToHex() + ".stream");
  const uint64_t stream = Spool::StreamOf(Spools(), target_id_);
  ASSERT_NE(stream, 0u);
  const std::string old = fmt::format("{:016x}\n", stream);
  ASSERT_TRUE(WriteFileAtomic(stream_file,
                              ByteSpan(reinterpret_cast<const std::byte*>(old.data()), old.size()))
                  .ok());
  ASSERT_EQ(Spool::RefitOf(Spools(), target_id_), 0u);
  ASSERT_EQ(Spool::StreamOf(Spools(), target_id_), stream);
  StartNode();
  // An earlier attempt of the same delta, aborted; the held refit still announced.
  ASSERT_TRUE(
      store_->Decide({kCluster, id + 1, base_id_, target_id_, false, "coordinator:x"}).ok());
  std::this_thread::sleep_for(kSourceTimeout + 8 * kPoll);
  ExpectStillHeld();
  ASSERT_TRUE(store_->Decide({kCluster, id, base_id_, target_id_, true, kDecidedBySource}).ok());
  ASSERT_TRUE(
      store_->Decide({kCluster, id + 2, base_id_, target_id_, false, "coordinator:x"}).ok());
  ASSERT_TRUE(Ended(1, 0)) << "the held delta was not committed from the record";
  EXPECT_EQ(node_->stats().held_settled_from_record, 1u);
  ExpectDiskIs(target_id_, "the target");
}

}  // namespace
}  // namespace deltacast::relay
