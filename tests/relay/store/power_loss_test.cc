// Simulated power loss (docs/recovery.md, "Durability"). A leaf whose store is a
// checkpoint directory commits a version; its agent stops before the store is
// written back (a long write-back delay), and the store's file is put back to what a
// machine crash could leave on disk: the bytes as of the last flush, with an
// arbitrary subset of the pages written since. The restarted agent must bring the
// store back bit-exact to the committed version, with nothing torn (from its spool,
// and from its parent for partitions whose pages were half lost), and then take part
// in the next refit. Repeated over seeds and over how many pages survive.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "apply/safetensors.h"
#include "codec/manifest.h"
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

constexpr char kToken[] = "power-loss-token";
// Two 4 KiB pages per partition: a partition whose pages were half written back is
// torn, neither version.
constexpr size_t kPageBytes = 4096;

// src -> n1 (relay, host memory) -> n2 (leaf, checkpoint directory).
constexpr char kConfig[] = R"(
[cluster]
name = "power-loss"
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
)";

void WriteInPlace(const fs::path& path, const Bytes& bytes) {
  // In place (same inode), as the disk would hold it: not a new file.
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

class PowerLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("power-loss-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "n2");
    auto config = topology::ParseClusterConfig(kConfig, "power-loss.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    network_ = std::make_shared<transport::InprocNetwork>();
  }
  void TearDown() override {
    for (auto* a : {&n1_, &n2_}) {
      if (*a) (*a)->Stop();
    }
    fs::remove_all(dir_);
  }

  fs::path StoreDir() const { return dir_ / "n2"; }
  fs::path StoreFile() const { return StoreDir() / "model.safetensors"; }

  void WriteCheckpoint(const Tensors& data) {
    auto writer = apply::SafetensorsWriter::Create(StoreFile(), TensorTable());
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (const Bytes& t : data) ASSERT_TRUE((*writer)->Append(t).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
  }

  void StartN1(Tensors& buffers) {
    auto replica = apply::Replica::ForStore(Borrow(buffers), kPartitionBytes, 1);
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

  void StartN2(std::chrono::milliseconds write_back_delay) {
    auto replica = apply::Replica::OpenCheckpointDir(StoreDir(), kPartitionBytes, 2);
    ASSERT_TRUE(replica.ok()) << replica.status().ToString();
    NodeAgentOptions options;
    options.config = config_;
    options.node_id = "n2";
    options.token = kToken;
    options.apply_threads = 2;
    options.spool_dir = StoreDir() / apply::kStateDirName / "spool";
    options.write_back_delay = write_back_delay;
    auto agent = NodeAgent::Start(std::move(options), std::move(*replica),
                                  transport::MakeInprocTransport(network_));
    ASSERT_TRUE(agent.ok()) << agent.status().ToString();
    n2_ = std::move(*agent);
  }

  void Publish(Tensors& base, Tensors& target) {
    auto b = Borrow(base);
    auto t = Borrow(target);
    PublishOptions options;
    options.config = config_;
    options.token = kToken;
    auto report = relay::Publish(options, *b, ManifestOf(*b), *t, ManifestOf(*t),
                                 transport::MakeInprocTransport(network_));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << report->abort_reason;
    ASSERT_EQ(report->nodes_decided, 2u);
  }

  // The tensor bytes of n2's store, read from its file.
  void ExpectStoreAt(const Tensors& version) {
    auto store =
        apply::CheckpointDirStore::Open(StoreDir(), apply::CheckpointDirStore::Access::kReadOnly);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (size_t i = 0; i < version.size(); ++i) {
      const ByteSpan d = (*store)->TensorData(i);
      ASSERT_TRUE(std::equal(d.begin(), d.end(), version[i].begin(), version[i].end()))
          << "tensor " << i;
    }
  }

  fs::path dir_;
  topology::ClusterConfig config_;
  std::shared_ptr<transport::InprocNetwork> network_;
  std::unique_ptr<NodeAgent> n1_, n2_;
};

TEST_F(PowerLossTest, CommittedVersionSurvivesLosingAnySubsetOfUnflushedPages) {
  struct Case {
    uint32_t seed;
    double kept;  // chance that a page written since the last flush reached the disk
  };
  const Case cases[] = {{1, 0.0}, {2, 1.0}, {3, 0.5}, {4, 0.5}, {5, 0.1}, {6, 0.9}, {7, 0.3}};
  for (const Case& c : cases) {
    SCOPED_TRACE("seed " + std::to_string(c.seed) + ", pages kept " + std::to_string(c.kept));
    ASSERT_NO_FATAL_FAILURE(TearDown());
    ASSERT_NO_FATAL_FAILURE(SetUp());
    std::vector<Tensors> steps = MakeSteps(3, c.seed);
    ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(steps[0]));
    const Bytes flushed = ReadAll(StoreFile());  // on disk: the last flush
    Tensors n1_buffers = steps[0];
    ASSERT_NO_FATAL_FAILURE(StartN1(n1_buffers));
    ASSERT_NO_FATAL_FAILURE(StartN2(std::chrono::hours(1)));
    ASSERT_NO_FATAL_FAILURE(Publish(steps[0], steps[1]));
    // Committed, never written back: the journal says so.
    n2_->Stop();
    n2_.reset();
    ASSERT_TRUE(fs::exists(StoreDir() / apply::kStateDirName / "unflushed"));
    ASSERT_FALSE(fs::exists(StoreDir() / apply::kStateDirName / "inflight"));

    // The power goes: of the pages written since the flush, a random subset made it.
    const Bytes written = ReadAll(StoreFile());
    ASSERT_EQ(written.size(), flushed.size());
    Bytes disk = flushed;
    std::mt19937_64 rng(c.seed);
    size_t dirty = 0, kept = 0;
    for (size_t at = 0; at < disk.size(); at += kPageBytes) {
      const size_t n = std::min(kPageBytes, disk.size() - at);
      if (std::equal(flushed.begin() + at, flushed.begin() + at + n, written.begin() + at))
        continue;
      ++dirty;
      if (std::uniform_real_distribution<double>(0, 1)(rng) < c.kept) {
        std::copy(written.begin() + at, written.begin() + at + n, disk.begin() + at);
        ++kept;
      }
    }
    ASSERT_GT(dirty, 50u);  // at 3 % every page of the tensors changed
    ASSERT_NO_FATAL_FAILURE(WriteInPlace(StoreFile(), disk));

    // Back up: it mends the store before anything else.
    ASSERT_NO_FATAL_FAILURE(StartN2(std::chrono::milliseconds(0)));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (n2_->stats().stores_recovered == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(n2_->stats().stores_recovered, 1u);
    ExpectStoreAt(steps[1]);
    EXPECT_FALSE(fs::exists(StoreDir() / apply::kStateDirName / "unflushed"));
    if (kept == 0 || kept == dirty) {
      // Every partition at one version or the other: all from the spool, none fetched.
      EXPECT_EQ(n2_->stats().partitions_recovered, 0u);
    }
    // And it takes part in the next refit.
    ASSERT_NO_FATAL_FAILURE(Publish(steps[1], steps[2]));
    n2_->Stop();
    n2_.reset();
    ExpectStoreAt(steps[2]);
  }
}

}  // namespace
}  // namespace deltacast::relay
