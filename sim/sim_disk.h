// SimDisk: the simulated disk under the processes of a simulated run. The files stay
// real (in the run's directory); through the engine's DiskSeam (common/disk_seam.h)
// this keeps, per process directory (a "root"), the image a machine crash would
// leave, modelled on what a POSIX file system promises:
//   - a file's bytes are durable once synced (fsync, fdatasync: the whole file and
//     its size; msync: a range), per file, whatever name it has (a hard link is a
//     second name for the same file);
//   - a name (create, rename, unlink) is durable once its directory is synced;
//     a directory's own name too (mkdir, rmdir, rename: once its parent is synced,
//     the names in a renamed directory with it), and a file survives only where
//     every directory above it (in the root) does.
// PowerLoss puts a root back to such an image: each durable name bound to its file's
// durable bytes plus a seeded random subset of the 4 KiB pages written since (torn
// pages), its size the synced one or the latest, names never made durable gone.
// SetFull makes a root refuse writes with ENOSPC.
//
// What the engine did behind the seam (a file created or removed without a hook) is
// found when its directory is synced or the power goes, and reported by TakeErrors.
//
// Thread safety: none; used from the simulator's one thread (the engine's hooks
// included).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/disk_seam.h"

namespace deltacast::sim {

struct PowerLossReport {
  int files = 0;             // durable names put back
  int names_lost = 0;        // names that were not durable, gone
  int names_back = 0;        // names unlinked but not durably, back
  int dirs_lost = 0;         // directories whose names were not durable, gone with all in them
  uint64_t pages_dirty = 0;  // pages that differed from their durable bytes
  uint64_t pages_kept = 0;   // ... of which the crash kept the newer one
  std::string Describe() const;
};

class SimDisk : public DiskSeam {
 public:
  static constexpr uint64_t kPageBytes = 4096;

  explicit SimDisk(uint64_t seed);

  // Tracks `root` from now on, everything in it durable as it is.
  void Adopt(const std::filesystem::path& root);
  // While full, every write under `root` fails with ENOSPC.
  void SetFull(const std::filesystem::path& root, bool full);
  bool full(const std::filesystem::path& root) const;
  // The machine of `root` is lost and replaced (--coord): every file under it is gone,
  // durable or not, and the empty folder is tracked from now on.
  void Replace(const std::filesystem::path& root);
  // The machine of `root` loses power now: nothing done there from now on becomes
  // durable (its process may still run its destructors) until PowerLoss.
  void Cut(const std::filesystem::path& root);
  bool cut(const std::filesystem::path& root) const;
  // Rewrites `root` to what the crash left (see above); the result is durable.
  // `keep`: the share of the pages written since their sync that reached the disk;
  // without it, drawn from the seed (none, all, or a uniform share).
  PowerLossReport PowerLoss(const std::filesystem::path& root,
                            std::optional<double> keep = std::nullopt);

  // Seam gaps found so far (each once); clears them.
  std::vector<std::string> TakeErrors();
  uint64_t refused_writes() const { return refused_; }

  // DiskSeam.
  Status WillWrite(const std::filesystem::path& path, uint64_t bytes) override;
  void Created(const std::filesystem::path& path) override;
  void Renamed(const std::filesystem::path& from, const std::filesystem::path& to) override;
  void Linked(const std::filesystem::path& from, const std::filesystem::path& to) override;
  void Removed(const std::filesystem::path& path) override;
  void SyncedRange(const std::filesystem::path& path, uint64_t offset, uint64_t length) override;
  void Synced(const std::filesystem::path& path) override;
  void DirSynced(const std::filesystem::path& dir) override;

 private:
  using Path = std::filesystem::path;
  struct Root {
    Path path;
    bool full = false;
    bool cut = false;
    std::map<Path, uint64_t> names;    // now: path -> file
    std::map<Path, uint64_t> durable;  // what a crash keeps: path -> file
    std::set<Path> dirs;               // directories whose names a crash keeps
    // Directories renamed (from, to) whose new name's directory is not synced yet.
    std::vector<std::pair<Path, Path>> dir_renames;
  };

  Root* RootOf(const Path& path);
  const Root* RootOf(const Path& path) const;
  void Collect();  // drops the images of files no name refers to
  void Gap(const std::string& what);
  void Unbound(const Path& path);                          // a sync of a path no file is bound to
  static bool Reachable(const Root& r, const Path& path);  // every directory above is durable

  std::mt19937_64 rng_;
  std::vector<Root> roots_;
  std::map<uint64_t, std::vector<std::byte>> images_;  // file -> its durable bytes
  uint64_t next_file_ = 1;
  uint64_t refused_ = 0;
  std::vector<std::string> errors_;
  std::vector<std::string> reported_;
};

}  // namespace deltacast::sim
