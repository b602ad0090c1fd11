// DiskSeam: the seam between the engine's files and a simulated disk. The engine
// reports here what it does to files at the few places it writes, names, links or syncs
// them (common/file_util.cc, relay/store/spool.cc, relay/store/delta_history.cc,
// apply/checkpoint_*.cc, apply/safetensors.cc, apply/delta_file.cc, ...); the files
// themselves stay real. With no disk installed (always, outside the simulator) every
// hook is one atomic load and changes nothing. With one (sim/sim_disk.h) the hooks
// tell it which bytes and names a machine crash would keep, and WillWrite may refuse
// a write with ENOSPC, which the caller returns as it would a real one.
//
// The disk is process-wide, like the runtime (common/runtime.h): the simulator
// installs it before it builds any engine object and removes it after the last is
// gone.
//
// Thread safety: Install with no engine object alive; the hooks are called from the
// simulator's one thread.
#pragma once

#include <cstdint>
#include <filesystem>

#include "common/status.h"

namespace deltacast {

class DiskSeam {
 public:
  virtual ~DiskSeam() = default;
  // Before `bytes` (> 0) are written to `path` with write(2). A non-OK status (an
  // IoError naming ENOSPC) means nothing was written.
  virtual Status WillWrite(const std::filesystem::path& path, uint64_t bytes) = 0;
  // `path` was opened with O_CREAT: a new, empty file unless the name existed (then
  // the same file, truncated if O_TRUNC).
  virtual void Created(const std::filesystem::path& path) = 0;
  virtual void Renamed(const std::filesystem::path& from, const std::filesystem::path& to) = 0;
  // `to` was made a hard link to `from`: a second name for the same file.
  virtual void Linked(const std::filesystem::path& from, const std::filesystem::path& to) = 0;
  // A file, or a directory and everything in it, was unlinked.
  virtual void Removed(const std::filesystem::path& path) = 0;
  // The bytes [offset, offset + length) of the file are on disk (msync of a range).
  virtual void SyncedRange(const std::filesystem::path& path, uint64_t offset, uint64_t length) = 0;
  // The whole file, its size included, is on disk (fsync, fdatasync).
  virtual void Synced(const std::filesystem::path& path) = 0;
  // The names in `dir` (creates, renames, unlinks) are on disk (fsync of the directory).
  virtual void DirSynced(const std::filesystem::path& dir) = 0;
};

// The installed disk, or null: the real file system only.
DiskSeam* SimDisk();
void InstallSimDisk(DiskSeam* disk);

// The hooks the engine calls: no-ops without a disk.
namespace disk {
inline Status WillWrite(const std::filesystem::path& path, uint64_t bytes) {
  DiskSeam* d = SimDisk();
  return d && bytes > 0 ? d->WillWrite(path, bytes) : Status::Ok();
}
inline void Created(const std::filesystem::path& path) {
  if (DiskSeam* d = SimDisk()) d->Created(path);
}
inline void Renamed(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (DiskSeam* d = SimDisk()) d->Renamed(from, to);
}
inline void Linked(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (DiskSeam* d = SimDisk()) d->Linked(from, to);
}
inline void Removed(const std::filesystem::path& path) {
  if (DiskSeam* d = SimDisk()) d->Removed(path);
}
inline void SyncedRange(const std::filesystem::path& path, uint64_t offset, uint64_t length) {
  if (DiskSeam* d = SimDisk()) d->SyncedRange(path, offset, length);
}
inline void Synced(const std::filesystem::path& path) {
  if (DiskSeam* d = SimDisk()) d->Synced(path);
}
inline void DirSynced(const std::filesystem::path& dir) {
  if (DiskSeam* d = SimDisk()) d->DirSynced(dir);
}
}  // namespace disk

}  // namespace deltacast
