// SnapshotStore (relay/store/snapshot_store.h): a leaf whose checkpoint directory is a
// snapshot store commits refits without writing the model, comes back after a stop
// at its committed version bit-exact (the snapshot mapped, the chain replayed),
// materializes byte-identical to the trainer's checkpoint, switches snapshots, and
// survives a kill at every step of a snapshot build (a forked child killed at each
// crash point: the store then reopens at its committed version).
#include "relay/store/snapshot_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/safetensors.h"
#include "codec/manifest.h"
#include "common/crash_point.h"
#include "common/file_util.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "tests/relay/store/leaf_steps.h"
#include "topology/cluster_config.h"
#include "transport/inproc/inproc_transport.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;
using namespace leaf_steps;  // tests/relay/store/leaf_steps.h

constexpr char kToken[] = "snapshot-token";

// src -> n1 (relay, host memory) -> n2 (leaf, snapshot store).
constexpr char kConfig[] = R"(
[cluster]
name = "snapshot"
[tree]
fanout = 1
chunk_size = "16KiB"
window = 4
connect_timeout = "5s"
idle_timeout = "30s"
commit_timeout = "20s"
[[node]]
id = "src"
host = "mem"
port = 1
role = "source"
[[node]]
id = "n1"
host = "mem"
port = 4
role = "receiver"
[[node]]
id = "n2"
host = "mem"
port = 7
role = "receiver"
checkpoint = "snapshot"
)";

void WriteCheckpoint(const fs::path& dir, const Tensors& data) {
  fs::create_directories(dir);
  auto writer = apply::SafetensorsWriter::Create(dir / "model.safetensors", TensorTable());
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  for (const Bytes& t : data) ASSERT_TRUE((*writer)->Append(t).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  // A file no loader reads as tensors: a snapshot keeps it byte for byte.
  ASSERT_TRUE(WriteFile(dir / "config.json", AsBytes(std::string("{\"layers\": 3}\n"))).ok());
}

class SnapshotStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("snapshot-store-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    auto config = topology::ParseClusterConfig(kConfig, "snapshot.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    network_ = std::make_shared<transport::InprocNetwork>();
    steps_ = MakeSteps(6, 7);
    n1_buffers_ = steps_[0];
    ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(StoreDir(), steps_[0]));
    given_ = ReadAll(StoreDir() / "model.safetensors");
  }
  void TearDown() override {
    StopN2();
    if (n1_) n1_->Stop();
    n1_.reset();
    fs::remove_all(dir_);
  }

  fs::path StoreDir() const { return dir_ / "n2"; }

  void StartN1() {
    auto replica = apply::Replica::ForStore(Borrow(n1_buffers_), kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok());
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n1";
    options.token = kToken;
    options.apply_threads = 1;
    auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                  transport::MakeInprocTransport(network_));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    n1_ = std::move(*agent);
  }

  void StartN2(SnapshotPolicy policy = NoBackground()) {
    auto opened = SnapshotStore::Open(StoreDir(), kPartitionBytes, 2, policy);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    snapshots_ = opened->store;
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n2";
    options.token = kToken;
    options.apply_threads = 2;
    options.spool_dir = StoreDir() / apply::kStateDirName / "spool";
    options.snapshots = opened->store;
    auto agent = NodeAgent::Start(std::move(options), std::move(opened->replica),
                                  transport::MakeInprocTransport(network_));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    n2_ = std::move(*agent);
  }
  void StopN2() {
    if (n2_) n2_->Stop();
    n2_.reset();
    snapshots_.reset();
  }

  static SnapshotPolicy NoBackground() {
    SnapshotPolicy p;
    p.background = false;
    return p;
  }

  void Publish(int from, int to) {
    auto b = Borrow(steps_[from]);
    auto t = Borrow(steps_[to]);
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    auto report = relay::Publish(options, *b, ManifestOf(*b), *t, ManifestOf(*t),
                                 transport::MakeInprocTransport(network_));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    ASSERT_EQ(report->nodes_decided, 2u);
  }

  Digest128 VersionOf(int step) {
    auto s = Borrow(steps_[step]);
    return ManifestOf(*s).VersionId();
  }

  // The store's committed version, rebuilt from disk, is step `step`'s bytes.
  void ExpectCommittedAt(int step) {
    codec::Manifest manifest;
    auto store = SnapshotStore::OpenCommitted(StoreDir(), kPartitionBytes, 1, manifest);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(manifest.VersionId(), VersionOf(step));
    for (size_t i = 0; i < steps_[step].size(); ++i) {
      const ByteSpan d = (*store)->TensorData(i);
      ASSERT_TRUE(std::equal(d.begin(), d.end(), steps_[step][i].begin(), steps_[step][i].end()))
          << "tensor " << i << " is not step " << step << "'s";
    }
  }

  // `deltacast materialize`: the same files, byte for byte, as the trainer's step.
  void ExpectMaterializesAs(int step) {
    codec::Manifest manifest;
    auto store = SnapshotStore::OpenCommitted(StoreDir(), kPartitionBytes, 1, manifest);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const fs::path out = dir_ / ("materialized-" + std::to_string(step));
    const fs::path reference = dir_ / ("reference-" + std::to_string(step));
    fs::remove_all(out);
    fs::remove_all(reference);
    ASSERT_TRUE(SnapshotStore::WriteDirectory(**store, out, 0).ok());
    ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(reference, steps_[step]));
    size_t files = 0;
    for (const auto& entry : fs::directory_iterator(reference)) {
      ++files;
      EXPECT_EQ(Hash128(ReadAll(out / entry.path().filename())), Hash128(ReadAll(entry.path())))
          << entry.path().filename();
    }
    EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()),
              static_cast<long>(files));
  }

  // Nothing of the model was ever written: the file given is as it was.
  void ExpectGivenFileUntouched() {
    EXPECT_EQ(Hash128(ReadAll(StoreDir() / "model.safetensors")), Hash128(given_));
  }

  fs::path dir_;
  topology::ClusterConfig config_;
  std::shared_ptr<transport::InprocNetwork> network_;
  std::vector<Tensors> steps_;
  Tensors n1_buffers_;
  Bytes given_;
  std::unique_ptr<NodeAgent> n1_, n2_;
  std::shared_ptr<SnapshotStore> snapshots_;
};

TEST_F(SnapshotStoreTest, CommitsKeepTheChainAndRestartReplaysItBitExact) {
  ASSERT_NO_FATAL_FAILURE(StartN1());
  ASSERT_NO_FATAL_FAILURE(StartN2());
  ASSERT_NO_FATAL_FAILURE(Publish(0, 1));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 2));
  EXPECT_EQ(n2_->stats().version, VersionOf(2));
  EXPECT_EQ(snapshots_->stats().chain_links, 2u);
  EXPECT_EQ(snapshots_->stats().snapshot, VersionOf(0));
  // No write-back: nothing noted unflushed, the model's file as given.
  EXPECT_FALSE(fs::exists(StoreDir() / apply::kStateDirName / "unflushed"));
  ExpectGivenFileUntouched();
  auto check = n2_->Verify();  // the weights it serves hash to the committed version
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  EXPECT_TRUE(check->diff.empty());
  StopN2();
  ExpectCommittedAt(2);
  ExpectMaterializesAs(2);
  // Back up: the snapshot mapped, two deltas replayed; it takes the next refit.
  ASSERT_NO_FATAL_FAILURE(StartN2());
  EXPECT_EQ(n2_->stats().version, VersionOf(2));
  ASSERT_NO_FATAL_FAILURE(Publish(2, 3));
  StopN2();
  ExpectCommittedAt(3);
  ExpectGivenFileUntouched();
}

TEST_F(SnapshotStoreTest, SnapshotSwitchDropsTheChainItHolds) {
  ASSERT_NO_FATAL_FAILURE(StartN1());
  ASSERT_NO_FATAL_FAILURE(StartN2());
  ASSERT_NO_FATAL_FAILURE(Publish(0, 1));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 2));
  ASSERT_TRUE(snapshots_->BuildNow(VersionOf(2)).ok());
  const SnapshotStore::Stats stats = snapshots_->stats();
  EXPECT_EQ(stats.snapshot, VersionOf(2));
  EXPECT_EQ(stats.chain_links, 0u);
  EXPECT_EQ(stats.snapshots_built, 1u);
  // The new snapshot's file is the trainer's step 2 byte for byte.
  const fs::path snapshots = StoreDir() / apply::kStateDirName / "snapshots";
  const fs::path reference = dir_ / "reference";
  ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(reference, steps_[2]));
  EXPECT_EQ(Hash128(ReadAll(snapshots / VersionOf(2).ToHex() / "model.safetensors")),
            Hash128(ReadAll(reference / "model.safetensors")));
  ASSERT_NO_FATAL_FAILURE(Publish(2, 3));
  EXPECT_EQ(snapshots_->stats().chain_links, 1u);
  StopN2();
  ExpectCommittedAt(3);
  ASSERT_NO_FATAL_FAILURE(StartN2());
  // The old folder, which the weights mapped until the restart, is gone.
  EXPECT_FALSE(fs::exists(snapshots / VersionOf(0).ToHex()));
  ASSERT_NO_FATAL_FAILURE(Publish(3, 4));
  StopN2();
  ExpectCommittedAt(4);
  ExpectMaterializesAs(4);
  ExpectGivenFileUntouched();
}

TEST_F(SnapshotStoreTest, BackgroundBuildsFollowThePolicy) {
  SnapshotPolicy policy;
  policy.every = 2;
  policy.chain_percent = 0;
  policy.rate = 0;
  ASSERT_NO_FATAL_FAILURE(StartN1());
  ASSERT_NO_FATAL_FAILURE(StartN2(policy));
  for (int s = 0; s < 5; ++s) {
    ASSERT_NO_FATAL_FAILURE(Publish(s, s + 1));
    snapshots_->WaitForBuild();
  }
  // Builds after refits 2 and 4: the snapshot at step 4, one link after it.
  const SnapshotStore::Stats stats = snapshots_->stats();
  EXPECT_EQ(stats.snapshots_built, 2u);
  EXPECT_EQ(stats.snapshot, VersionOf(4));
  EXPECT_EQ(stats.chain_links, 1u);
  StopN2();
  ExpectCommittedAt(5);
  ExpectMaterializesAs(5);
}

// A kill at each step of a build (a forked child, so the kill is real: nothing after
// the crash point runs) leaves one valid snapshot and chain: the store reopens at its
// committed version, and a later build succeeds.
TEST_F(SnapshotStoreTest, KillAtEveryStepOfABuildLeavesOneValidSnapshot) {
  ASSERT_NO_FATAL_FAILURE(StartN1());
  ASSERT_NO_FATAL_FAILURE(StartN2());
  ASSERT_NO_FATAL_FAILURE(Publish(0, 1));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 2));
  StopN2();
  const fs::path pristine = dir_ / "pristine";
  fs::copy(StoreDir(), pristine, fs::copy_options::recursive);
  for (const char* point : {"snapshot.copy_block", "snapshot.applied", "snapshot.flushed",
                            "snapshot.renamed", "snapshot.switched", "snapshot.dropped"}) {
    SCOPED_TRACE(point);
    // Every pass starts at step 2: the relay's weights too.
    n1_->Stop();
    n1_.reset();
    n1_buffers_ = steps_[2];
    ASSERT_NO_FATAL_FAILURE(StartN1());
    fs::remove_all(StoreDir());
    fs::copy(pristine, StoreDir(), fs::copy_options::recursive);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      static const char* target;
      target = point;
      InstallCrashPointHandler(
          [](std::string_view name, void*) {
            if (name == target) ::_exit(137);  // as SIGKILL: nothing more runs
          },
          nullptr);
      auto opened = SnapshotStore::Open(StoreDir(), kPartitionBytes, 1, NoBackground());
      if (!opened.ok()) ::_exit(2);
      (void)opened->store->BuildNow(VersionOf(2));
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 137) << "the build never reached " << point;
    ExpectCommittedAt(2);
    // Opening cleans up; the store takes refits and builds again.
    ASSERT_NO_FATAL_FAILURE(StartN2());
    const Digest128 snapshot = snapshots_->stats().snapshot;
    EXPECT_TRUE(snapshot == VersionOf(0) || snapshot == VersionOf(2)) << snapshot.ShortHex();
    ASSERT_NO_FATAL_FAILURE(Publish(2, 3));
    ASSERT_TRUE(snapshots_->BuildNow(VersionOf(3)).ok());
    EXPECT_EQ(snapshots_->stats().chain_links, 0u);
    StopN2();
    ExpectCommittedAt(3);
    {
      auto reopened = SnapshotStore::Open(StoreDir(), kPartitionBytes, 1, NoBackground());
      ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    }
    size_t folders = 0;
    for (const auto& e : fs::directory_iterator(StoreDir() / apply::kStateDirName / "snapshots")) {
      (void)e;
      ++folders;
    }
    EXPECT_EQ(folders, 1u);
  }
  ExpectGivenFileUntouched();
}

// A store that never committed (a late joiner) catches up by partitions: the
// catch-up's commit writes its target as the snapshot and switches, then writes
// `active`. Cut short between the two, there is no `active` to tell the switch from
// the first snapshot: the catch-up in flight to the snapshot's version does, and the
// commit stands as it does for a store that had committed (found by the simulator,
// seeds 95, 144, 197: it reopened at version 0 over the target's bytes).
TEST_F(SnapshotStoreTest, ACatchUpCutShortAfterItsSwitchStandsOnAStoreThatNeverCommitted) {
  const fs::path caught_up = dir_ / "caught-up";
  ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(caught_up, steps_[2]));
  auto live =
      apply::CheckpointDirStore::Open(caught_up, apply::CheckpointDirStore::Access::kPrivate);
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  const codec::Manifest target = ManifestOf(*Borrow(steps_[2]));
  {
    auto opened = SnapshotStore::Open(StoreDir(), kPartitionBytes, 1, NoBackground());
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    ASSERT_TRUE(
        apply::CheckpointState(StoreDir()).WriteInflight({VersionOf(0), VersionOf(2)}).ok());
    ASSERT_TRUE(opened->store->SnapshotFrom(**live, target).ok());
  }  // the process dies here, before `active`
  auto reopened = SnapshotStore::Open(StoreDir(), kPartitionBytes, 1, NoBackground());
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ(reopened->replica->version(), VersionOf(2));
  EXPECT_FALSE(reopened->replica->inflight());
  EXPECT_EQ(reopened->replica->manifest().VersionId(), VersionOf(2));
  reopened->replica.reset();
  reopened->store.reset();
  ExpectCommittedAt(2);
  ExpectGivenFileUntouched();
}

TEST_F(SnapshotStoreTest, InPlaceOpenRefusesASnapshotStore) {
  ASSERT_NO_FATAL_FAILURE(StartN1());
  ASSERT_NO_FATAL_FAILURE(StartN2());
  ASSERT_NO_FATAL_FAILURE(Publish(0, 1));
  StopN2();
  auto replica = apply::Replica::OpenCheckpointDir(StoreDir(), kPartitionBytes, 1);
  ASSERT_FALSE(replica.ok());
  EXPECT_EQ(replica.status().code(), StatusCode::kFailedPrecondition);
  ExpectGivenFileUntouched();
}

// A commit made ahead of its bytes (a PREPARED node back after a crash commits from
// its spool, then reconciles) notes the store unflushed; killed before the
// reconcile ends, the note is on disk. The chain already holds the delta: the store
// opens at the committed version and the note goes.
TEST_F(SnapshotStoreTest, AnUnflushedNoteFromACommitAheadIsSettledByTheChain) {
  ASSERT_NO_FATAL_FAILURE(StartN1());
  ASSERT_NO_FATAL_FAILURE(StartN2());
  ASSERT_NO_FATAL_FAILURE(Publish(0, 1));
  StopN2();
  apply::CheckpointState journal(StoreDir());
  ASSERT_TRUE(journal.WriteUnflushed({VersionOf(0), VersionOf(1)}).ok());
  ASSERT_NO_FATAL_FAILURE(StartN2());
  EXPECT_EQ(n2_->stats().version, VersionOf(1));
  EXPECT_FALSE(fs::exists(StoreDir() / apply::kStateDirName / "unflushed"));
  ASSERT_NO_FATAL_FAILURE(Publish(1, 2));
  StopN2();
  ExpectCommittedAt(2);
}

TEST_F(SnapshotStoreTest, ALostChainFileIsNamedNotGuessed) {
  ASSERT_NO_FATAL_FAILURE(StartN1());
  ASSERT_NO_FATAL_FAILURE(StartN2());
  ASSERT_NO_FATAL_FAILURE(Publish(0, 1));
  StopN2();
  const fs::path chain = StoreDir() / apply::kStateDirName / "chain";
  fs::remove(chain / ("delta-" + VersionOf(1).ToHex() + ".spool"));
  auto opened = SnapshotStore::Open(StoreDir(), kPartitionBytes, 1, NoBackground());
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(opened.status().message().find(VersionOf(1).ShortHex()), std::string::npos)
      << opened.status().ToString();
}

}  // namespace
}  // namespace deltacast::relay
