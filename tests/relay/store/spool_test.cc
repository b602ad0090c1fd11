// Spool: what a new stream of a delta starts from.
#include "relay/store/spool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "codec/chunk.h"
#include "codec/partition_codec.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {
namespace {

namespace fs = std::filesystem;

class SpoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "spool_test.XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // An END chunk message of delta base -> target (the smallest valid chunk).
  static std::vector<std::byte> Chunk(uint8_t base, uint8_t target, uint32_t sequence) {
    Digest128 b, t;
    b.bytes[0] = base;
    t.bytes[0] = target;
    codec::DeltaSummary summary;
    summary.data_chunks = sequence;
    return EncodeChunk(codec::BuildEndChunk({b, t, 4096}, sequence, summary));
  }
  // A data chunk message with one literal record of `payload_bytes` random bytes:
  // any size, so appends straddle the spool's blocks and staging buffer unevenly.
  static std::vector<std::byte> DataChunk(uint8_t target, uint32_t sequence, size_t payload_bytes,
                                          uint32_t seed) {
    Digest128 t;
    t.bytes[0] = target;
    codec::EncodedPartition literal;
    literal.encoding = codec::Encoding::kLiteral;
    literal.raw_size = payload_bytes;
    literal.change_count = payload_bytes;
    literal.payload.resize(payload_bytes);
    std::mt19937 rng(seed);
    for (auto& b : literal.payload) b = static_cast<std::byte>(rng());
    codec::ChunkBuilder builder({Digest128{}, t, uint64_t{16} << 20}, sequence);  // one partition
    builder.Add("w", DType::kU8, 0, payload_bytes, {}, {}, literal);
    return EncodeChunk(builder.Finish());
  }
  static std::vector<std::byte> FileBytes(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> bytes(chars.size());
    std::memcpy(bytes.data(), chars.data(), chars.size());
    return bytes;
  }
  // Appends chunks of uneven sizes (one larger than the staging buffer), checks the
  // file after each: exactly the messages so far, back to back, whichever path wrote
  // them; then reopens it and appends more after the partial block it ends in.
  void AppendUnevenChunksAndReopen(const fs::path& dir, bool expect_direct) {
    Digest128 target;
    target.bytes[0] = 9;
    const std::vector<size_t> sizes = {
        10, 4095, 4096 - 97, (size_t{4} << 20) + 257, 1, (size_t{9} << 20) + 4321, 300000};
    std::vector<std::vector<std::byte>> chunks;
    for (uint32_t s = 0; s < sizes.size(); ++s) chunks.push_back(DataChunk(9, s, sizes[s], s));
    std::vector<std::byte> expected;
    fs::path file;
    {
      auto spool = Spool::OpenEmpty(dir, target);
      ASSERT_TRUE(spool.ok()) << spool.status().ToString();
      EXPECT_EQ((*spool)->direct_writes(), expect_direct);
      file = (*spool)->path();
      for (uint32_t s = 0; s < 4; ++s) {
        ASSERT_TRUE((*spool)->Append(s, chunks[s], /*durable=*/s == 2).ok());
        expected.insert(expected.end(), chunks[s].begin(), chunks[s].end());
        ASSERT_EQ((*spool)->bytes(), expected.size());
        ASSERT_EQ(FileBytes(file), expected) << "after chunk " << s;
      }
      ASSERT_TRUE((*spool)->Sync().ok());
    }
    auto reopened = Spool::Open(dir, target, /*remove_others=*/false);
    ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    EXPECT_EQ((*reopened)->direct_writes(), expect_direct);
    EXPECT_EQ((*reopened)->sequences(), (std::vector<uint32_t>{0, 1, 2, 3}));
    for (uint32_t s = 4; s < chunks.size(); ++s) {
      ASSERT_TRUE((*reopened)->Append(s, chunks[s]).ok());
      expected.insert(expected.end(), chunks[s].begin(), chunks[s].end());
      ASSERT_EQ(FileBytes(file), expected) << "after chunk " << s;
    }
    ASSERT_TRUE((*reopened)->Sync(/*taken=*/5).ok());
    for (uint32_t s = 0; s < chunks.size(); ++s) {
      auto read = (*reopened)->Read(s);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      EXPECT_EQ(**read, chunks[s]) << "chunk " << s;
    }
  }
  fs::path dir_;
};

// On a file system that takes O_DIRECT (the test's temporary directory is expected
// to be one, as a spool directory on a disk is), appends bypass the page cache, and
// the file is exactly what buffered appends leave.
TEST_F(SpoolTest, DirectAppendsLeaveExactlyTheChunksBackToBack) {
  if (!Spool::DirectWritesWork(dir_)) GTEST_SKIP() << dir_ << " refuses O_DIRECT";
  AppendUnevenChunksAndReopen(dir_, /*expect_direct=*/true);
}

// Where O_DIRECT is refused (tmpfs before Linux 6.6), the spool says so and appends
// buffered: the same file, the same reads. Where every file system here takes it,
// DELTACAST_SPOOL_BUFFERED=1 forces the buffered path the same way.
TEST_F(SpoolTest, BufferedAppendsLeaveTheSameFileWhereDirectIsRefusedOrOff) {
  const fs::path shm = "/dev/shm";
  if (fs::is_directory(shm) && !Spool::DirectWritesWork(shm)) {
    std::string tmpl = (shm / "spool_test.XXXXXX").string();
    const fs::path dir = ::mkdtemp(tmpl.data());
    AppendUnevenChunksAndReopen(dir, /*expect_direct=*/false);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  ::setenv("DELTACAST_SPOOL_BUFFERED", "1", 1);
  AppendUnevenChunksAndReopen(dir_, /*expect_direct=*/false);
  ::unsetenv("DELTACAST_SPOOL_BUFFERED");
}

// The stream that numbered a spool's chunks outlives the process beside it (a node
// names it in its HELLO after a restart), goes with the chunks when the spool is
// opened empty or discarded, and with the other deltas' spools.
TEST_F(SpoolTest, TheStreamThatNumberedTheChunksIsKeptBesideThemAndGoesWithThem) {
  Digest128 target;
  target.bytes[0] = 5;
  Digest128 other;
  other.bytes[0] = 6;
  EXPECT_EQ(Spool::StreamOf(dir_, target), 0u);
  EXPECT_FALSE(Spool::HoldsChunks(dir_, target));
  {
    auto spool = Spool::OpenEmpty(dir_, target);
    ASSERT_TRUE(spool.ok()) << spool.status().ToString();
    ASSERT_TRUE((*spool)->RecordStream(0xabcdef0123456789ULL).ok());
    EXPECT_FALSE(Spool::HoldsChunks(dir_, target));
    ASSERT_TRUE((*spool)->Append(0, Chunk(1, 5, 0), /*durable=*/true).ok());
    auto kept = Spool::OpenEmpty(dir_, other);
    ASSERT_TRUE(kept.ok());
    ASSERT_TRUE((*kept)->RecordStream(7).ok());
  }
  EXPECT_EQ(Spool::StreamOf(dir_, target), 0xabcdef0123456789ULL);
  EXPECT_TRUE(Spool::HoldsChunks(dir_, target));
  // Reopened as it is (a resume): the stream stays.
  ASSERT_TRUE(Spool::Open(dir_, target, /*remove_others=*/false).ok());
  EXPECT_EQ(Spool::StreamOf(dir_, target), 0xabcdef0123456789ULL);
  EXPECT_EQ(Spool::StreamOf(dir_, other), 7u);
  // Another delta's spool is removed with its stream.
  Spool::RemoveOthers(dir_, target);
  EXPECT_EQ(Spool::StreamOf(dir_, other), 0u);
  EXPECT_EQ(Spool::StreamOf(dir_, target), 0xabcdef0123456789ULL);
  // Opened empty, the chunks and their stream are gone.
  {
    auto fresh = Spool::OpenEmpty(dir_, target);
    ASSERT_TRUE(fresh.ok());
    EXPECT_EQ(Spool::StreamOf(dir_, target), 0u);
    EXPECT_FALSE(Spool::HoldsChunks(dir_, target));
    ASSERT_TRUE((*fresh)->RecordStream(9).ok());
    EXPECT_EQ(Spool::StreamOf(dir_, target), 9u);
    (*fresh)->Discard();
  }
  EXPECT_EQ(Spool::StreamOf(dir_, target), 0u);
}

// The refit that opened the spool is kept with its stream (a node restarted with the
// delta in flight reads that refit's commit record); a file written before it was
// kept names the stream alone, and the refit is then unknown (0).
TEST_F(SpoolTest, TheRefitIsKeptWithTheStreamAndAnOldFileLeavesItUnknown) {
  Digest128 target;
  target.bytes[0] = 8;
  EXPECT_EQ(Spool::RefitOf(dir_, target), 0u);
  {
    auto spool = Spool::OpenEmpty(dir_, target);
    ASSERT_TRUE(spool.ok()) << spool.status().ToString();
    ASSERT_TRUE((*spool)->RecordStream(0x1234, 0xfedcba9876543210ULL).ok());
  }
  EXPECT_EQ(Spool::StreamOf(dir_, target), 0x1234u);
  EXPECT_EQ(Spool::RefitOf(dir_, target), 0xfedcba9876543210ULL);
  {
    auto spool = Spool::OpenEmpty(dir_, target);
    ASSERT_TRUE(spool.ok());
    ASSERT_TRUE((*spool)->RecordStream(0x99).ok());  // as an older version wrote it
  }
  EXPECT_EQ(Spool::StreamOf(dir_, target), 0x99u);
  EXPECT_EQ(Spool::RefitOf(dir_, target), 0u);
}

TEST_F(SpoolTest, OpenKeepsAnEarlierStreamsChunksAndOpenEmptyDropsThem) {
  Digest128 target;
  target.bytes[0] = 2;
  Digest128 other;
  other.bytes[0] = 3;
  const auto old_chunk = Chunk(1, 2, 0);
  {
    auto spool = Spool::Open(dir_, target);
    ASSERT_TRUE(spool.ok()) << spool.status().ToString();
    ASSERT_TRUE((*spool)->Append(0, old_chunk, /*durable=*/true).ok());
    auto kept = Spool::Open(dir_, other, /*remove_others=*/false);
    ASSERT_TRUE(kept.ok());
    ASSERT_TRUE((*kept)->Append(0, Chunk(1, 3, 0), true).ok());
  }
  auto reopened = Spool::Open(dir_, target, /*remove_others=*/false);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->sequences(), std::vector<uint32_t>{0});  // a resume needs them

  // Another stream of a delta to the same target (here from another base): its
  // chunk 0 must not be taken for the old one, nor the old one read back for it.
  auto fresh = Spool::OpenEmpty(dir_, target);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE((*fresh)->sequences().empty());
  const auto new_chunk = Chunk(4, 2, 0);
  ASSERT_TRUE((*fresh)->Append(0, new_chunk, true).ok());
  auto read = (*fresh)->Read(0);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(std::equal((*read)->begin(), (*read)->end(), new_chunk.begin(), new_chunk.end()));
  // A spool still open on the old file (a rollback finishing) reads what it indexed.
  auto old_read = (*reopened)->Read(0);
  ASSERT_TRUE(old_read.ok());
  EXPECT_TRUE(
      std::equal((*old_read)->begin(), (*old_read)->end(), old_chunk.begin(), old_chunk.end()));
  // Other deltas' spools are left alone, and a restart finds the new stream.
  auto other_again = Spool::Open(dir_, other, /*remove_others=*/false);
  ASSERT_TRUE(other_again.ok());
  EXPECT_EQ((*other_again)->sequences(), std::vector<uint32_t>{0});
  fresh->reset();
  auto after_restart = Spool::Open(dir_, target, /*remove_others=*/false);
  ASSERT_TRUE(after_restart.ok());
  auto again = (*after_restart)->Read(0);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(std::equal((*again)->begin(), (*again)->end(), new_chunk.begin(), new_chunk.end()));
}

// Sync is a group commit: one fdatasync covers every chunk appended before it, a
// Sync with nothing new does none, and bytes dropped from the page cache once
// durable (Spool::DropCached) still read back whole, now and after a reopen.
TEST_F(SpoolTest, SyncCoversEverythingAppendedOnceAndDurableChunksReadBack) {
  Digest128 target;
  target.bytes[0] = 7;
  std::vector<std::vector<std::byte>> chunks;
  for (uint32_t s = 0; s < 4; ++s) chunks.push_back(Chunk(1, 7, s));
  {
    auto spool = Spool::OpenEmpty(dir_, target);
    ASSERT_TRUE(spool.ok()) << spool.status().ToString();
    for (uint32_t s = 0; s < 3; ++s) ASSERT_TRUE((*spool)->Append(s, chunks[s]).ok());
    EXPECT_EQ((*spool)->syncs(), 0u);
    ASSERT_TRUE((*spool)->Sync(/*taken=*/1).ok());  // chunks 0 and 1 leave the cache
    EXPECT_EQ((*spool)->syncs(), 1u);               // three chunks, one fdatasync
    ASSERT_TRUE((*spool)->Sync().ok());
    EXPECT_EQ((*spool)->syncs(), 1u);  // nothing new: nothing to sync
    ASSERT_TRUE((*spool)->Append(3, chunks[3]).ok());
    ASSERT_TRUE((*spool)->Append(3, chunks[0]).ok());  // a sequence spooled is ignored
    ASSERT_TRUE((*spool)->Sync(/*taken=*/3).ok());
    EXPECT_EQ((*spool)->syncs(), 2u);
    for (uint32_t s = 0; s < 4; ++s) {
      auto read = (*spool)->Read(s);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      EXPECT_EQ(**read, chunks[s]) << "chunk " << s;
    }
  }
  auto reopened = Spool::Open(dir_, target, /*remove_others=*/false);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->sequences(), (std::vector<uint32_t>{0, 1, 2, 3}));
  for (uint32_t s = 0; s < 4; ++s) {
    auto read = (*reopened)->Read(s);
    ASSERT_TRUE(read.ok());
    EXPECT_EQ(**read, chunks[s]) << "chunk " << s;
  }
}

// The node's loop appends while an apply worker syncs (the fdatasync is not taken
// under the lock Append needs): every chunk lands whole and in the index, a Sync
// that returns covers what was appended before it, and the file reopens intact.
TEST_F(SpoolTest, AppendsGoOnWhileAnotherThreadSyncs) {
  Digest128 target;
  target.bytes[0] = 8;
  constexpr uint32_t kChunks = 200;
  std::vector<std::vector<std::byte>> chunks;
  for (uint32_t s = 0; s < kChunks; ++s) chunks.push_back(Chunk(2, 8, s));
  {
    auto opened = Spool::OpenEmpty(dir_, target);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    Spool& spool = **opened;
    std::atomic<bool> done{false};
    std::atomic<int> sync_errors{0};
    std::atomic<int> uncovered{0};
    std::thread syncer([&] {
      while (!done) {
        const uint64_t before = spool.bytes();
        // As an apply does: the last chunk it took leaves the page cache once durable.
        const std::vector<uint32_t> spooled = spool.sequences();
        std::optional<uint32_t> taken;
        if (!spooled.empty()) taken = spooled.back();
        if (!spool.Sync(taken).ok()) ++sync_errors;
        // What was appended before the call is durable now: syncing again at that
        // length must find nothing to do unless more came meanwhile.
        if (spool.bytes() == before && spool.syncs() > 0) {
          const uint64_t syncs = spool.syncs();
          if (!spool.Sync().ok()) ++sync_errors;
          if (spool.bytes() == before && spool.syncs() != syncs) ++uncovered;
        }
      }
    });
    for (uint32_t s = 0; s < kChunks; ++s) ASSERT_TRUE(spool.Append(s, chunks[s]).ok());
    done = true;
    syncer.join();
    EXPECT_EQ(sync_errors, 0);
    EXPECT_EQ(uncovered, 0);
    ASSERT_TRUE(spool.Sync().ok());
    EXPECT_EQ(spool.sequences().size(), kChunks);
  }
  auto reopened = Spool::Open(dir_, target, /*remove_others=*/false);
  ASSERT_TRUE(reopened.ok());
  ASSERT_EQ((*reopened)->sequences().size(), kChunks);
  for (uint32_t s = 0; s < kChunks; ++s) {
    auto read = (*reopened)->Read(s);
    ASSERT_TRUE(read.ok());
    ASSERT_EQ(**read, chunks[s]) << "chunk " << s;
  }
}

}  // namespace
}  // namespace deltacast::relay
