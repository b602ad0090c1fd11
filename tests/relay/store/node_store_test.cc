// NodeStore over a checkpoint directory, driven directly (no network): the order of
// durability (the next refit waits for the last commit's write-back), and a PREPARED
// node whose writes were lost in a machine crash (it commits ahead of its bytes,
// from its spool, and reconciles). WriteBack on its own.
#include "relay/store/node_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/safetensors.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "common/file_util.h"
#include "relay/store/write_back.h"
#include "relay/tree/node_agent.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

constexpr uint64_t kPartitionBytes = 8 << 10;
constexpr uint64_t kElements = 1 << 15;  // per BF16 tensor

std::vector<TensorSpec> Tensors() {
  return {{"a.weight", DType::kBF16, {kElements}}, {"b.weight", DType::kBF16, {kElements}}};
}

// A store that counts FlushAll calls and can hold them back.
class CountingStore : public apply::WeightStore {
 public:
  explicit CountingStore(std::unique_ptr<apply::WeightStore> inner) : inner_(std::move(inner)) {}
  const std::vector<TensorSpec>& tensors() const override { return inner_->tensors(); }
  ByteSpan TensorData(size_t i) const override { return inner_->TensorData(i); }
  Result<MutableByteSpan> MutableTensorData(size_t i) override {
    return inner_->MutableTensorData(i);
  }
  Status Flush(size_t i, uint64_t o, uint64_t n) override { return inner_->Flush(i, o, n); }
  Status FlushAll() override {
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a slow disk
    ++flushes;
    return Status::Ok();
  }
  Digest128 LayoutId() const override { return {}; }
  std::atomic<int> flushes{0};
  std::atomic<bool> entered{false};

 private:
  std::unique_ptr<apply::WeightStore> inner_;
};

TEST(WriteBackTest, JoinStartsAPendingFlushAtOnceAndWaitsForIt) {
  auto store = CountingStore(std::move(*apply::HostStore::Create(Tensors())));
  WriteBack write_back(std::chrono::hours(1));
  std::atomic<int> done{0};
  write_back.Start(store, Digest128{1, 2}, [&] { ++done; });
  EXPECT_EQ(store.flushes, 0);  // waiting out the delay
  auto outcome = write_back.Join();
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(outcome->status.ok());
  EXPECT_EQ(outcome->target, (Digest128{1, 2}));
  EXPECT_EQ(store.flushes, 1);
  EXPECT_EQ(done, 1);
  EXPECT_FALSE(write_back.Join().has_value());  // nothing since
}

TEST(WriteBackTest, AbandonDropsAFlushThatHasNotStarted) {
  auto store = CountingStore(std::move(*apply::HostStore::Create(Tensors())));
  WriteBack write_back(std::chrono::hours(1));
  write_back.Start(store, Digest128{1, 2}, nullptr);
  EXPECT_FALSE(write_back.Abandon().has_value());
  EXPECT_EQ(store.flushes, 0);
  // One that started is waited for.
  WriteBack now(std::chrono::milliseconds(0));
  now.Start(store, Digest128{3, 4}, nullptr);
  while (!store.entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto outcome = now.Abandon();
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(store.flushes, 1);
}

class NodeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("node-store-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "store");
    std::mt19937 rng(5);
    versions_.resize(3);
    for (auto& t : Tensors()) {
      Bytes b(t.ByteSize());
      for (auto& x : b) x = std::byte(rng());
      versions_[0].push_back(b);
    }
    for (int v = 1; v < 3; ++v) {
      versions_[v] = versions_[v - 1];
      for (auto& t : versions_[v]) {
        for (uint64_t e = 0; e < kElements; ++e) {
          if (rng() % 100 < 3) t[2 * e] ^= std::byte{1};
        }
      }
    }
    auto writer = apply::SafetensorsWriter::Create(File(), Tensors());
    ASSERT_TRUE(writer.ok());
    for (const Bytes& t : versions_[0]) ASSERT_TRUE((*writer)->Append(t).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }

  fs::path Dir() const { return dir_ / "store"; }
  fs::path File() const { return Dir() / "model.safetensors"; }
  fs::path Spools() const { return Dir() / apply::kStateDirName / "spool"; }
  bool Noted(std::string_view file) const {
    return fs::exists(Dir() / apply::kStateDirName / file);
  }

  void Open(std::chrono::milliseconds write_back_delay) {
    auto replica = apply::Replica::OpenCheckpointDir(Dir(), kPartitionBytes, 2);
    ASSERT_TRUE(replica.ok()) << replica.status().ToString();
    NodeStore::Options options;
    options.apply_threads = 2;
    options.spool_dir = Spools();
    options.write_back_delay = write_back_delay;
    options.hooks = hooks_;
    loop_ = std::make_unique<EventLoop>();
    store_ = std::make_unique<NodeStore>(
        std::move(*replica), options, *loop_,
        [this](const NodeStore::Journal& j) {
          std::lock_guard lock(journal_mu_);
          journal_ = j;
        },
        nullptr);
    store_->Start();
    loop_->Start();
  }
  void Close() {
    store_->Stop();
    loop_->Stop();
    store_.reset();
    loop_.reset();
  }

  std::unique_ptr<apply::WeightStore> Borrow(int v) {
    std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
    const auto tensors = Tensors();
    for (size_t i = 0; i < tensors.size(); ++i)
      spans.emplace_back(tensors[i], MutableByteSpan(versions_[v][i]));
    return std::move(*apply::HostStore::Borrow(std::move(spans)));
  }
  codec::Manifest ManifestOf(int v) {
    auto s = Borrow(v);
    return codec::ComputeManifest(
        s->tensors(), [&](size_t i) { return s->TensorData(i); }, kPartitionBytes, 1);
  }

  // The delta v -> v + 1 as CHUNK messages, END last.
  std::vector<transport::Message> Delta(int v) {
    auto base = Borrow(v);
    auto target = Borrow(v + 1);
    codec::DeltaEncoderOptions options;
    options.chunk_bytes = 16 << 10;
    std::vector<transport::Message> out;
    EXPECT_TRUE(
        codec::EncodeDelta(
            ManifestOf(v), ManifestOf(v + 1), [&](size_t i) { return base->TensorData(i); },
            [&](size_t i) { return target->TensorData(i); },
            apply::CheckpointDirStore::Open(Dir(), apply::CheckpointDirStore::Access::kReadOnly)
                .value()
                ->LayoutId(),
            options,
            [&](std::vector<std::byte>&& chunk) {
              out.push_back(transport::MakeMessage(EncodeChunk(chunk)));
              return Status::Ok();
            })
            .ok());
    return out;
  }

  template <typename T, typename F>
  T Await(F call) {
    std::promise<T> p;
    auto f = p.get_future();
    call([&p](const T& v) { p.set_value(v); });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    return f.get();
  }

  // Applies refit `id`'s delta v -> v + 1 through END (spooling each chunk as the
  // agent does); true once PREPARED.
  bool ApplyDelta(uint64_t id, int v) {
    const auto chunks = Delta(v);
    auto header = codec::PeekChunkHeader(ChunkOf(*chunks[0]));
    auto spool = Spool::Open(Spools(), header->identity.target_version, false);
    EXPECT_TRUE(spool.ok());
    std::shared_ptr<Spool> shared = std::move(*spool);
    const Status begun = Await<Status>(
        [&](auto done) { store_->BeginRefit(id, header->identity, {}, shared, done); });
    EXPECT_TRUE(begun.ok()) << begun.ToString();
    NodeStore::ApplyResult last;
    for (const auto& m : chunks) {
      auto h = codec::PeekChunkHeader(ChunkOf(*m));
      EXPECT_TRUE(shared->Append(h->sequence, *m).ok());
      last = Await<NodeStore::ApplyResult>([&](auto done) {
        auto slot = std::make_shared<NodeStore::ChunkSlot>(m, h->kind);
        // As a node that forwarded it already: the apply reads it from the spool.
        if (h->sequence % 2 == 1) slot->Drop();
        store_->ApplyChunk(id, h->sequence, slot, shared, done);
      });
      EXPECT_TRUE(last.status.ok()) << last.status.ToString();
    }
    return last.end && last.torn.empty() && last.status.ok();
  }

  void Commit(uint64_t id) {
    std::promise<Status> p;
    auto f = p.get_future();
    store_->Commit(id, [&p](const Status& s, const Digest128&, const NodeStore::CommitTimes&) {
      p.set_value(s);
    });
    ASSERT_TRUE(f.get().ok());
  }

  void ExpectFileAt(int v) {
    auto store =
        apply::CheckpointDirStore::Open(Dir(), apply::CheckpointDirStore::Access::kReadOnly);
    ASSERT_TRUE(store.ok());
    for (size_t i = 0; i < versions_[v].size(); ++i) {
      const ByteSpan d = (*store)->TensorData(i);
      EXPECT_TRUE(std::equal(d.begin(), d.end(), versions_[v][i].begin(), versions_[v][i].end()));
    }
  }

  EngineHooks hooks_;  // Open's
  fs::path dir_;
  std::vector<std::vector<Bytes>> versions_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<NodeStore> store_;
  std::mutex journal_mu_;
  NodeStore::Journal journal_;  // the mirror, from the loop thread
};

// What the next refit does with the last commit's write-back still pending: it runs
// the write-back to the end and clears the note first, then begins (so at most one
// delta's writes are ever unaccounted for), and only then drops the older spool.
TEST_F(NodeStoreTest, NextRefitWaitsForTheLastCommitsWriteBack) {
  Open(std::chrono::hours(1));  // never on its own
  ASSERT_TRUE(ApplyDelta(1, 0));
  EXPECT_FALSE(Noted("unflushed"));  // nothing noted before the commit...
  ASSERT_NO_FATAL_FAILURE(Commit(1));
  EXPECT_TRUE(Noted("unflushed"));  // ...and the write-back waits
  EXPECT_FALSE(Noted("inflight"));
  const size_t spools = std::distance(fs::directory_iterator(Spools()), fs::directory_iterator());
  EXPECT_EQ(spools, 1u);

  ASSERT_TRUE(ApplyDelta(2, 1));
  // BEGIN of refit 2 ran the write-back and cleared its note before writing.
  EXPECT_FALSE(Noted("unflushed"));
  EXPECT_TRUE(Noted("inflight"));
  size_t now = 0;
  for (const auto& e : fs::directory_iterator(Spools())) now += e.path().extension() == ".spool";
  EXPECT_EQ(now, 1u);  // refit 1's spool went once its writes were on disk
  ASSERT_NO_FATAL_FAILURE(Commit(2));
  Close();
  ExpectFileAt(2);
  // A stop before the delayed write-back leaves the note for the next start.
  EXPECT_TRUE(Noted("unflushed"));
}

// A PREPARED node whose writes were lost (its file back at the base: the last flush)
// is told COMMIT after the restart: it commits ahead of its bytes, from its spool,
// and reconciles; here nothing is torn, so the spool alone mends the store.
TEST_F(NodeStoreTest, PreparedNodeWhoseWritesWereLostCommitsAheadAndReconciles) {
  const Bytes flushed = *ReadFile(File(), 1 << 30);
  Open(std::chrono::milliseconds(0));
  ASSERT_TRUE(ApplyDelta(1, 0));
  EXPECT_TRUE(Noted("prepared"));
  Close();  // the machine goes down before COMMIT arrives...
  {
    // ...and none of the writes since the last flush reached the disk.
    const int fd = ::open(File().c_str(), O_WRONLY);
    ASSERT_EQ(::pwrite(fd, flushed.data(), flushed.size(), 0), ssize_t(flushed.size()));
    ::close(fd);
  }
  Open(std::chrono::milliseconds(0));
  std::promise<Status> committed;
  store_->CommitPrepared(
      [&committed](const Status& s, const Digest128&) { committed.set_value(s); });
  ASSERT_TRUE(committed.get_future().get().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the journal mirror
  {
    std::lock_guard lock(journal_mu_);
    EXPECT_TRUE(journal_.needs_reconcile);
  }
  EXPECT_TRUE(Noted("unflushed"));
  EXPECT_FALSE(Noted("inflight"));
  std::promise<std::pair<Status, size_t>> reconciled;
  store_->Reconcile([&reconciled](const Status& s, std::vector<Fetch> differing) {
    reconciled.set_value({s, differing.size()});
  });
  auto [status, differing] = reconciled.get_future().get();
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(differing, 0u);
  Close();
  EXPECT_FALSE(Noted("unflushed"));
  ExpectFileAt(1);
}

// As above with half the partitions torn: Reconcile asks for them and each written
// with the committed version's bytes ends it.
TEST_F(NodeStoreTest, ReconcileFetchesTornPartitionsAndEndsBitExact) {
  const Bytes flushed = *ReadFile(File(), 1 << 30);
  Open(std::chrono::hours(1));
  ASSERT_TRUE(ApplyDelta(1, 0));
  ASSERT_NO_FATAL_FAILURE(Commit(1));
  Close();
  const Bytes written = *ReadFile(File(), 1 << 30);
  Bytes disk = flushed;
  for (size_t at = 0; at < disk.size(); at += 8192) {  // every other page reached the disk
    const size_t n = std::min<size_t>(4096, disk.size() - at);
    std::copy(written.begin() + at, written.begin() + at + n, disk.begin() + at);
  }
  {
    const int fd = ::open(File().c_str(), O_WRONLY);
    ASSERT_EQ(::pwrite(fd, disk.data(), disk.size(), 0), ssize_t(disk.size()));
    ::close(fd);
  }
  Open(std::chrono::milliseconds(0));
  std::promise<std::pair<Status, std::vector<Fetch>>> reconciled;
  store_->Reconcile([&reconciled](const Status& s, std::vector<Fetch> differing) {
    reconciled.set_value({s, differing});
  });
  auto [status, torn] = reconciled.get_future().get();
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_GT(torn.size(), 0u);
  const auto tensors = Tensors();
  for (size_t k = 0; k < torn.size(); ++k) {
    const Fetch& f = torn[k];
    const size_t t = f.tensor == tensors[0].name ? 0 : 1;
    const Bytes& v1 = versions_[1][t];
    auto bytes = std::make_shared<Bytes>(v1.begin() + f.element_offset * 2,
                                         v1.begin() + f.element_offset * 2 + f.byte_length);
    // Bytes that do not hash to what was asked for are refused.
    if (k == 0) {
      auto wrong = std::make_shared<Bytes>(*bytes);
      (*wrong)[0] ^= std::byte{1};
      std::promise<Status> refused;
      store_->RepairReconciled({f.tensor, f.element_offset}, wrong, f.hash,
                               [&refused](const Status& s, bool) { refused.set_value(s); });
      EXPECT_EQ(refused.get_future().get().code(), StatusCode::kCorrupt);
    }
    std::promise<std::pair<Status, bool>> written_one;
    store_->RepairReconciled({f.tensor, f.element_offset}, bytes, f.hash,
                             [&written_one](const Status& s, bool finished) {
                               written_one.set_value({s, finished});
                             });
    auto [s, finished] = written_one.get_future().get();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(finished, k + 1 == torn.size());
  }
  Close();
  EXPECT_FALSE(Noted("unflushed"));
  ExpectFileAt(1);
}

// Found by the simulated disk (docs/simulation.md): a node that lost power before
// its last commit's write-back, with partitions torn, could never mend them once the
// tree had moved on (their bytes at that version were nowhere), and took part in no
// refit again. A catch-up to the version the tree holds replaces the reconcile: it
// hashes the torn store as it is, overwrites what differs and clears the note.
TEST_F(NodeStoreTest, ATornStoreIsCaughtUpToANewerVersionInsteadOfReconciled) {
  const Bytes flushed = *ReadFile(File(), 1 << 30);
  Open(std::chrono::hours(1));
  ASSERT_TRUE(ApplyDelta(1, 0));
  ASSERT_NO_FATAL_FAILURE(Commit(1));
  Close();
  const Bytes written = *ReadFile(File(), 1 << 30);
  Bytes disk = flushed;
  for (size_t at = 0; at < disk.size(); at += 8192) {  // every other page reached the disk
    const size_t n = std::min<size_t>(4096, disk.size() - at);
    std::copy(written.begin() + at, written.begin() + at + n, disk.begin() + at);
  }
  {
    const int fd = ::open(File().c_str(), O_WRONLY);
    ASSERT_EQ(::pwrite(fd, disk.data(), disk.size(), 0), ssize_t(disk.size()));
    ::close(fd);
  }
  // The newer version: version 2's first tensor, and the second as version 1 left it,
  // so the torn partitions of that one are torn against both versions.
  versions_.push_back({versions_[2][0], versions_[1][1]});
  Open(std::chrono::milliseconds(0));
  auto [begun, parts] =
      Await<std::pair<Status, std::vector<apply::CatchUpPartition>>>([&](auto done) {
        store_->BeginCatchUp(ManifestOf(3), [done](const Status& s, auto p) { done({s, p}); });
      });
  ASSERT_TRUE(begun.ok()) << begun.ToString();
  EXPECT_FALSE(Noted("unflushed"));
  const auto tensors = Tensors();
  size_t torn_but_unchanged = 0;
  for (const auto& p : parts) {
    const size_t t = p.key.tensor == tensors[0].name ? 0 : 1;
    const size_t from = p.key.element_offset * 2;
    const Bytes& v1 = versions_[1][t];
    const Bytes& v2 = versions_[3][t];
    // A partition version 1 and the newer one share is listed only because it is
    // torn: the list comes from the bytes there are, not from version 1's manifest.
    torn_but_unchanged +=
        std::equal(v1.begin() + from, v1.begin() + from + p.byte_length, v2.begin() + from);
    auto bytes = std::make_shared<Bytes>(v2.begin() + from, v2.begin() + from + p.byte_length);
    const Status w =
        Await<Status>([&](auto done) { store_->WriteCatchUp(p.key, bytes, p.target_hash, done); });
    ASSERT_TRUE(w.ok()) << w.ToString();
  }
  EXPECT_GT(torn_but_unchanged, 0u);
  const Status committed = Await<Status>([&](auto done) { store_->CommitCatchUp(done); });
  ASSERT_TRUE(committed.ok()) << committed.ToString();
  Close();
  EXPECT_FALSE(Noted("unflushed"));
  ExpectFileAt(3);
  auto reopened = apply::Replica::OpenCheckpointDir(Dir(), kPartitionBytes, 1);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->version(), ManifestOf(3).VersionId());
  EXPECT_FALSE((*reopened)->needs_reconcile());
}

// A catch-up by partitions that fails before it writes anything (nobody up the tree
// has the bytes: the root of producers serves none) leaves the store as it was: at
// its version, nothing in flight, the engine running. Left in flight, its record
// kept a chain of kept deltas from that version from ever being taken (a chain
// resumes only the delta in flight), and the node stayed behind, paused, to the
// end (the simulator's --stripes --producers seed 31).
TEST_F(NodeStoreTest, ACatchUpThatWroteNothingLeavesTheStoreAtItsVersion) {
  std::atomic<int> pauses{0};
  std::promise<void> resumed;
  hooks_.pause = [&] {
    ++pauses;
    return Status::Ok();
  };
  std::atomic<int> resumes{0};
  hooks_.resume = [&] {
    if (++resumes == 1) resumed.set_value();
  };
  Open(std::chrono::milliseconds(0));
  auto [begun, parts] =
      Await<std::pair<Status, std::vector<apply::CatchUpPartition>>>([&](auto done) {
        store_->BeginCatchUp(ManifestOf(2), [done](const Status& s, auto p) { done({s, p}); });
      });
  ASSERT_TRUE(begun.ok()) << begun.ToString();
  ASSERT_FALSE(parts.empty());
  EXPECT_EQ(pauses, 1);
  store_->DropCatchUp();
  EXPECT_EQ(resumed.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  // The chain from its version is taken now: the delta 0 -> 1, applied and verified.
  const auto chunks = Delta(0);
  const Status linked = Await<Status>([&](auto done) {
    store_->BeginLink({ManifestOf(0).VersionId(), ManifestOf(1).VersionId(), kPartitionBytes,
                       static_cast<uint32_t>(chunks.size())},
                      [done](const Status& s, const std::set<uint32_t>&) { done(s); });
  });
  ASSERT_TRUE(linked.ok()) << linked.ToString();
  std::optional<codec::DeltaSummary> end;
  for (const auto& m : chunks) {
    auto h = codec::PeekChunkHeader(ChunkOf(*m));
    ASSERT_TRUE(h.ok());
    auto bytes = std::make_shared<Bytes>(m->begin(), m->end());
    auto [applied,
          summary] = Await<std::pair<Status, std::optional<codec::DeltaSummary>>>([&](auto done) {
      store_->ApplyLinkChunk(h->sequence, bytes, [done](const Status& s, auto e) { done({s, e}); });
    });
    ASSERT_TRUE(applied.ok()) << applied.ToString();
    if (summary) end = summary;
  }
  ASSERT_TRUE(end.has_value());
  const Status finished = Await<Status>([&](auto done) { store_->FinishLink(*end, done); });
  ASSERT_TRUE(finished.ok()) << finished.ToString();
  Close();
  EXPECT_EQ(pauses, 2);  // the catch-up's and the chain's, each resumed
  EXPECT_EQ(resumes, 2);
  ExpectFileAt(1);
  auto reopened = apply::Replica::OpenCheckpointDir(Dir(), kPartitionBytes, 1);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->version(), ManifestOf(1).VersionId());
  EXPECT_FALSE((*reopened)->inflight().has_value());
}

}  // namespace
}  // namespace deltacast::relay
