// The simulated disk (sim/sim_disk.h) driven through the engine's own file code
// (common/file_util.h, relay/store/spool.h) and the disk seam: what a power loss keeps and
// loses, and what a full disk refuses.
#include "sim/sim_disk.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "common/file_util.h"
#include "relay/store/spool.h"

namespace deltacast::sim {
namespace {

namespace fs = std::filesystem;

std::string Text(const fs::path& path) {
  auto bytes = ReadFile(path, 1 << 20);
  return bytes.ok() ? std::string(AsChars(*bytes)) : std::string("<missing>");
}

// Overwrites `data` at `offset` with no sync, as an unflushed write would.
void WriteAt(const fs::path& path, uint64_t offset, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset)),
            static_cast<ssize_t>(data.size()));
  ::close(fd);
}

class SimDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("deltacast-simdisk-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "sub");
    ASSERT_TRUE(WriteFile(root_ / "adopted", AsBytes(std::string_view("adopted"))).ok());
    disk_.Adopt(root_);
    InstallSimDisk(&disk_);
  }
  void TearDown() override {
    InstallSimDisk(nullptr);
    fs::remove_all(root_);
  }
  fs::path root_;
  SimDisk disk_{1};
};

TEST_F(SimDiskTest, AWriteNeverSyncedIsLostAndASyncedOneSurvives) {
  ASSERT_TRUE(WriteFileAtomic(root_ / "synced", AsBytes(std::string_view("durable"))).ok());
  ASSERT_TRUE(WriteFile(root_ / "unsynced", AsBytes(std::string_view("volatile"))).ok());
  const PowerLossReport rep = disk_.PowerLoss(root_, 1.0);
  EXPECT_EQ(Text(root_ / "synced"), "durable");
  EXPECT_EQ(Text(root_ / "adopted"), "adopted");
  EXPECT_FALSE(fs::exists(root_ / "unsynced"));  // its name was never made durable
  EXPECT_EQ(rep.names_lost, 1);
  EXPECT_TRUE(disk_.TakeErrors().empty());
}

TEST_F(SimDiskTest, BytesWrittenSinceTheLastSyncAreLostPageByPage) {
  // Three pages made durable, then all three rewritten in place and never synced.
  const std::string old_bytes(3 * SimDisk::kPageBytes, 'o');
  ASSERT_TRUE(WriteFileAtomic(root_ / "f", AsBytes(std::string_view(old_bytes))).ok());
  const std::string new_bytes(3 * SimDisk::kPageBytes, 'n');
  WriteAt(root_ / "f", 0, new_bytes);
  EXPECT_EQ(disk_.PowerLoss(root_, 0.0).pages_dirty, 3u);
  EXPECT_EQ(Text(root_ / "f"), old_bytes);

  WriteAt(root_ / "f", 0, new_bytes);
  EXPECT_EQ(disk_.PowerLoss(root_, 1.0).pages_kept, 3u);
  EXPECT_EQ(Text(root_ / "f"), new_bytes);  // what the crash kept is durable now

  // A synced range survives whatever the crash keeps of the rest.
  WriteAt(root_ / "f", 0, old_bytes);
  disk_.SyncedRange(root_ / "f", SimDisk::kPageBytes, SimDisk::kPageBytes);
  const PowerLossReport rep = disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(rep.pages_dirty, 2u);
  EXPECT_EQ(Text(root_ / "f"), std::string(SimDisk::kPageBytes, 'n') +
                                   std::string(SimDisk::kPageBytes, 'o') +
                                   std::string(SimDisk::kPageBytes, 'n'));
}

TEST_F(SimDiskTest, ARenameNotDirSyncedRevertsAndOneDirSyncedStays) {
  ASSERT_TRUE(WriteFileAtomic(root_ / "x", AsBytes(std::string_view("old"))).ok());
  // What WriteFileAtomic does, but for the directory sync.
  ASSERT_TRUE(WriteFile(root_ / "x.tmp", AsBytes(std::string_view("new"))).ok());
  disk::Synced(root_ / "x.tmp");
  ASSERT_EQ(::rename((root_ / "x.tmp").c_str(), (root_ / "x").c_str()), 0);
  disk::Renamed(root_ / "x.tmp", root_ / "x");
  ASSERT_EQ(Text(root_ / "x"), "new");
  disk_.PowerLoss(root_, 1.0);
  EXPECT_EQ(Text(root_ / "x"), "old");
  EXPECT_FALSE(fs::exists(root_ / "x.tmp"));

  ASSERT_TRUE(WriteFileAtomic(root_ / "x", AsBytes(std::string_view("new"))).ok());
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(root_ / "x"), "new");
  EXPECT_TRUE(disk_.TakeErrors().empty());
}

TEST_F(SimDiskTest, AnUnlinkNotDirSyncedComesBack) {
  ASSERT_TRUE(WriteFileAtomic(root_ / "sub" / "gone", AsBytes(std::string_view("bytes"))).ok());
  fs::remove(root_ / "sub" / "gone");
  disk::Removed(root_ / "sub" / "gone");
  EXPECT_EQ(disk_.PowerLoss(root_, 0.0).names_back, 1);
  EXPECT_EQ(Text(root_ / "sub" / "gone"), "bytes");
}

// The engine's fix: an append that creates a file syncs its directory.
TEST_F(SimDiskTest, AFileCreatedByADurableAppendSurvivesWithItsLines) {
  ASSERT_TRUE(AppendLineDurably(root_ / "sub" / "log", "one").ok());
  ASSERT_TRUE(AppendLineDurably(root_ / "sub" / "log", "two").ok());
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(root_ / "sub" / "log"), "one\ntwo\n");
}

TEST_F(SimDiskTest, SpoolChunksAppendedDurablySurviveAndTheOthersNeedNotLand) {
  const Digest128 target{};
  auto spool = relay::Spool::OpenEmpty(root_ / "spool", target);
  ASSERT_TRUE(spool.ok()) << spool.status().ToString();
  const fs::path file = (*spool)->path();
  const std::string one(100, '1'), two(100, '2');
  ASSERT_TRUE((*spool)->Append(1, AsBytes(std::string_view(one)), /*durable=*/true).ok());
  ASSERT_TRUE((*spool)->Append(2, AsBytes(std::string_view(two)), /*durable=*/false).ok());
  spool->reset();
  // Both chunks lie in one page: all of it or the synced part only.
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(file), one);
}

// Spool::Open (a resume) makes the spool when it is missing: its name must be as
// durable as OpenEmpty's, or the chunks fdatasynced into it go with the power.
TEST_F(SimDiskTest, ASpoolOpenedWhereNoneWasKeepsItsDurableChunks) {
  auto spool = relay::Spool::Open(root_ / "spool", Digest128{}, /*remove_others=*/false);
  ASSERT_TRUE(spool.ok()) << spool.status().ToString();
  const fs::path file = (*spool)->path();
  const std::string one(100, '1');
  ASSERT_TRUE((*spool)->Append(1, AsBytes(std::string_view(one)), /*durable=*/true).ok());
  spool->reset();
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(file), one);
}

TEST_F(SimDiskTest, AFullDiskRefusesWritesWithEnospcAndLeavesTheFileAlone) {
  ASSERT_TRUE(WriteFileAtomic(root_ / "x", AsBytes(std::string_view("old"))).ok());
  disk_.SetFull(root_, true);
  const Status full = WriteFileAtomic(root_ / "x", AsBytes(std::string_view("new")));
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("No space left on device"), std::string::npos) << full.ToString();
  EXPECT_NE(full.message().find("x.tmp"), std::string::npos) << full.ToString();
  EXPECT_FALSE(AppendLineDurably(root_ / "log", "line").ok());
  EXPECT_EQ(Text(root_ / "x"), "old");
  EXPECT_EQ(disk_.refused_writes(), 2u);
  disk_.SetFull(root_, false);
  EXPECT_TRUE(WriteFileAtomic(root_ / "x", AsBytes(std::string_view("new"))).ok());
  EXPECT_EQ(Text(root_ / "x"), "new");
}

TEST_F(SimDiskTest, AfterACutNothingBecomesDurable) {
  disk_.Cut(root_);
  ASSERT_TRUE(WriteFileAtomic(root_ / "late", AsBytes(std::string_view("late"))).ok());
  disk_.PowerLoss(root_, 1.0);
  EXPECT_FALSE(fs::exists(root_ / "late"));
  // The power is back: syncs count again.
  ASSERT_TRUE(WriteFileAtomic(root_ / "late", AsBytes(std::string_view("late"))).ok());
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(root_ / "late"), "late");
}

TEST_F(SimDiskTest, ADirectoryWhoseParentWasNotSyncedGoesWithEverythingInIt) {
  fs::create_directories(root_ / "new" / "deeper");
  ASSERT_TRUE(WriteFileAtomic(root_ / "new" / "deeper" / "f", AsBytes(std::string_view("f"))).ok());
  ASSERT_TRUE(FsyncDirectory(root_ / "new").ok());  // "deeper" is durable in "new", "new" is not
  const PowerLossReport rep = disk_.PowerLoss(root_, 1.0);
  EXPECT_EQ(rep.dirs_lost, 1);
  EXPECT_FALSE(fs::exists(root_ / "new"));
  EXPECT_TRUE(fs::exists(root_ / "sub"));  // adopted: durable

  // A directory removed without its parent synced comes back, with its durable files.
  ASSERT_TRUE(WriteFileAtomic(root_ / "sub" / "kept", AsBytes(std::string_view("k"))).ok());
  fs::remove_all(root_ / "sub");
  disk::Removed(root_ / "sub");
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(root_ / "sub" / "kept"), "k");
  // ... and not once the parent is synced.
  fs::remove_all(root_ / "sub");
  disk::Removed(root_ / "sub");
  ASSERT_TRUE(FsyncDirectory(root_).ok());
  disk_.PowerLoss(root_, 0.0);
  EXPECT_FALSE(fs::exists(root_ / "sub"));
  EXPECT_TRUE(disk_.TakeErrors().empty());
}

// The engine's fix: each directory it creates has its parent synced.
TEST_F(SimDiskTest, DirectoriesCreatedDurablySurviveWithTheirFiles) {
  ASSERT_TRUE(CreateDirectoriesDurably(root_ / "a" / "b" / "c").ok());
  ASSERT_TRUE(CreateDirectoriesDurably(root_ / "a" / "b" / "c").ok());  // there: nothing to do
  ASSERT_TRUE(WriteFileAtomic(root_ / "a" / "b" / "c" / "f", AsBytes(std::string_view("f"))).ok());
  EXPECT_EQ(disk_.PowerLoss(root_, 0.0).dirs_lost, 0);
  EXPECT_EQ(Text(root_ / "a" / "b" / "c" / "f"), "f");
}

// LinkOrCopyDurably's hard link (a snapshot store's first snapshot, its chain): a
// second name for the same file, durable once its directory is synced; the power
// loss puts both names back as one file (linked), torn the same way.
TEST_F(SimDiskTest, AHardLinkIsASecondNameForTheSameFile) {
  const std::string synced(2 * SimDisk::kPageBytes, 's');
  ASSERT_TRUE(WriteFileAtomic(root_ / "f", AsBytes(std::string_view(synced))).ok());
  ASSERT_TRUE(LinkOrCopyDurably(root_ / "f", root_ / "sub" / "g").ok());
  ASSERT_TRUE(LinkOrCopyDurably(root_ / "f", root_ / "h").ok());
  ASSERT_TRUE(FsyncDirectory(root_ / "sub").ok());                     // g's name durable, h's not
  WriteAt(root_ / "f", 0, std::string(2 * SimDisk::kPageBytes, 'u'));  // never synced
  const PowerLossReport rep = disk_.PowerLoss(root_, 0.5);
  EXPECT_TRUE(disk_.TakeErrors().empty());
  EXPECT_EQ(rep.names_lost, 1);  // h
  EXPECT_FALSE(fs::exists(root_ / "h"));
  EXPECT_EQ(Text(root_ / "f"), Text(root_ / "sub" / "g"));  // one file, one tear
  EXPECT_TRUE(fs::equivalent(root_ / "f", root_ / "sub" / "g"));
  // A sync through one name makes the bytes durable under both.
  WriteAt(root_ / "sub" / "g", 0, "new");
  disk_.Synced(root_ / "sub" / "g");
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(root_ / "f").substr(0, 3), "new");
  EXPECT_TRUE(disk_.TakeErrors().empty());
}

// A snapshot build's folder: written and synced as "x.building", renamed to "x". Its
// files go with it; the rename is durable once the parent is synced, not before.
TEST_F(SimDiskTest, ARenamedDirectoryTakesItsFilesAndIsDurableOnceItsParentIsSynced) {
  ASSERT_TRUE(CreateDirectoriesDurably(root_ / "sub" / "x.building").ok());
  ASSERT_TRUE(
      WriteFileAtomic(root_ / "sub" / "x.building" / "f", AsBytes(std::string_view("f"))).ok());
  fs::rename(root_ / "sub" / "x.building", root_ / "sub" / "x");
  disk_.Renamed(root_ / "sub" / "x.building", root_ / "sub" / "x");
  disk_.PowerLoss(root_, 1.0);  // the parent was not synced: the old name is back
  EXPECT_EQ(Text(root_ / "sub" / "x.building" / "f"), "f");
  EXPECT_FALSE(fs::exists(root_ / "sub" / "x"));

  fs::rename(root_ / "sub" / "x.building", root_ / "sub" / "x");
  disk_.Renamed(root_ / "sub" / "x.building", root_ / "sub" / "x");
  ASSERT_TRUE(FsyncDirectory(root_ / "sub").ok());
  disk_.PowerLoss(root_, 0.0);
  EXPECT_EQ(Text(root_ / "sub" / "x" / "f"), "f");
  EXPECT_FALSE(fs::exists(root_ / "sub" / "x.building"));
  ASSERT_TRUE(FsyncDirectory(root_ / "sub" / "x").ok());  // the seam knows f under its new name
  EXPECT_TRUE(disk_.TakeErrors().empty());
}

TEST_F(SimDiskTest, AHardLinkMadeBehindTheSeamIsReported) {
  ASSERT_TRUE(WriteFileAtomic(root_ / "f", AsBytes(std::string_view("f"))).ok());
  fs::create_hard_link(root_ / "f", root_ / "linked");
  ASSERT_TRUE(FsyncDirectory(root_).ok());
  const auto errors = disk_.TakeErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("linked"), std::string::npos) << errors[0];
}

TEST_F(SimDiskTest, AFileCreatedBehindTheSeamIsReported) {
  InstallSimDisk(nullptr);
  ASSERT_TRUE(WriteFile(root_ / "sneaky", AsBytes(std::string_view("x"))).ok());
  InstallSimDisk(&disk_);
  ASSERT_TRUE(FsyncDirectory(root_).ok());
  const auto errors = disk_.TakeErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("sneaky"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace deltacast::sim
