// Spool: the CHUNK messages of one delta kept in a file, so a node can replay to a
// child that rejoins exactly the chunks it lacks, and can roll itself back from the
// delta's own records after a restart. Only an index (sequence -> offset, length)
// stays in memory, so a node's memory does not grow with the delta.
//
// Appends bypass the page cache where the file system allows it (O_DIRECT from a
// page-aligned staging buffer the spool keeps warm): a chunk is written once and read
// again only by a lagging apply, a replay or a rollback, and on a VM a copy into the
// page cache costs a fault-like allocation per page. Where O_DIRECT is refused
// (tmpfs, some network file systems) and in the simulator (whose disk model knows
// plain writes), appends are ordinary buffered writes, as they are with
// DELTACAST_SPOOL_BUFFERED=1 in the environment; direct_writes() says which.
// Either way the file holds the same bytes, and durability is still fdatasync's.
//
// Thread safety: Append and Read may be called from different threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "common/bytes.h"
#include "common/hash.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "transport/transport.h"

namespace deltacast::relay {

class Spool {
 public:
  // Opens `dir`/delta-<target>.spool, keeping the valid chunks a previous run of
  // this node spooled for the same delta (a relay that restarts must still replay
  // what it had forwarded); with `remove_others`, spools of other deltas in `dir`
  // are deleted. The file is removed by Discard, not by the destructor: it
  // outlives a crash on purpose.
  static Result<std::unique_ptr<Spool>> Open(const std::filesystem::path& dir,
                                             const Digest128& target, bool remove_others = true);
  // Opens `dir`/delta-<target>.spool empty, dropping whatever an earlier stream of
  // the same delta left in it (spools of other deltas are kept). For a node that
  // holds nothing of the delta: a chunk is named by its delta and sequence alone,
  // and another refit of the same delta may number its chunks differently (a root
  // merges its producers' chunks in the order they come), so old copies must
  // neither stand in for this stream's chunks nor roll back what it applies.
  static Result<std::unique_ptr<Spool>> OpenEmpty(const std::filesystem::path& dir,
                                                  const Digest128& target);
  // Deletes every spool in `dir` but `target`'s (a node, once the last commit's
  // writes are flushed and its spool is no longer needed to recover them).
  static void RemoveOthers(const std::filesystem::path& dir, const Digest128& target);
  // The stream (BEGIN's stream_id) that numbered the chunks spooled for `target`
  // in `dir`, as RecordStream noted it; 0 when none was noted. A node's journaled
  // chunks are spooled before they are applied, so this names its HELLO's list too.
  static uint64_t StreamOf(const std::filesystem::path& dir, const Digest128& target);
  // Whether `dir` holds a non-empty spool for `target`: a node spools each chunk
  // before it applies it, so with none it applied nothing of the delta.
  static bool HoldsChunks(const std::filesystem::path& dir, const Digest128& target);
  // The refit whose BEGIN opened the spool for `target` in `dir`, as RecordStream
  // noted it; 0 when unknown (none noted, or noted by a version that did not keep it).
  static uint64_t RefitOf(const std::filesystem::path& dir, const Digest128& target);
  // Notes, durably, that `stream` numbers this spool's chunks (before any of them
  // is applied), and the refit that streams it (0: unknown): delta-<target>.stream
  // beside the spool. A node that restarts with the delta in flight reads its
  // commit record by that refit (docs/recovery.md, "The commit record").
  Status RecordStream(uint64_t stream, uint64_t refit_id = 0);
  // Opens one spool file as it is (the source's retained deltas), touching nothing
  // else.
  static Result<std::unique_ptr<Spool>> OpenFile(const std::filesystem::path& file);
  const std::filesystem::path& path() const { return path_; }
  // Makes everything appended so far durable (fdatasync; nothing if nothing new).
  // Appends may go on meanwhile (the disk is never waited for under the lock Append
  // takes); concurrent Syncs share one fdatasync where one covers the other's bytes.
  // With `taken` (the chunk an apply holds in memory, about to be applied), the
  // durable bytes up to its end leave the page cache: they are read again only by a
  // replay or a rollback.
  Status Sync(std::optional<uint32_t> taken = std::nullopt);
  // fdatasyncs done so far (Sync and durable Appends): how well syncs are grouped.
  uint64_t syncs() const;
  // Whether appends go to the disk directly (O_DIRECT) rather than through the page
  // cache: false where the file system refused it, in the simulator, or after a
  // direct write was refused (the spool then goes on with buffered writes).
  bool direct_writes() const;
  // Whether a spool in `dir` would append with O_DIRECT (a probe file is made and
  // removed); what a benchmark reports as the path that ran.
  static bool DirectWritesWork(const std::filesystem::path& dir);
  // Deletes the file (the delta was decided and nobody needs a replay of it).
  void Discard();
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  // Appends a CHUNK message under the chunk's sequence number (END: its own
  // sequence, one past the last data chunk). A sequence already spooled is ignored.
  // With `durable`, the bytes are on disk when it returns (a receiver spools a
  // chunk durably before applying it, so it can always undo what it applied).
  Status Append(uint32_t sequence, ByteSpan message, bool durable = false);
  // Forgets the copy spooled under `sequence` (a chunk refused as wrong: the copy
  // fetched again replaces it; after a restart the later copy in the file wins).
  void Forget(uint32_t sequence);
  // The message spooled under `sequence`, read back from the file.
  Result<transport::Message> Read(uint32_t sequence) const;
  // Every spooled sequence, ascending.
  std::vector<uint32_t> sequences() const;
  uint64_t bytes() const;

 private:
  Spool(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  void Recover();
  // Opens the O_DIRECT descriptor and loads the last partial block of the file into
  // the staging buffer; leaves the spool buffered where that is not possible.
  void StartDirect();
  // Writes `message` at end_ through the O_DIRECT descriptor. False with an OK
  // status: the file system refused the direct write (EINVAL), nothing past end_ is
  // relied on, and the caller writes it buffered.
  Result<bool> AppendDirect(ByteSpan message) REQUIRES(mu_);
  Status AppendBuffered(ByteSpan message) REQUIRES(mu_);
  bool LoadTail() REQUIRES(mu_);
  Result<transport::Message> ReadAt(uint64_t offset, uint64_t length) const;
  uint64_t SyncedEnd() const;
  void DropTaken(uint32_t sequence);
  struct Entry {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  int fd_;
  std::filesystem::path path_;
  Mutex sync_mu_ ACQUIRED_BEFORE(mu_);  // held across one fdatasync
  mutable Mutex mu_;
  std::map<uint32_t, Entry> index_ GUARDED_BY(mu_);
  uint64_t end_ GUARDED_BY(mu_) = 0;
  // Bytes [0, synced_end_) are known durable (0 after Open: what a crashed run left
  // may still be only in the page cache, so the first Sync syncs it).
  uint64_t synced_end_ GUARDED_BY(mu_) = 0;
  uint64_t dropped_end_ GUARDED_BY(mu_) = 0;  // [0, dropped_end_) left the page cache
  uint64_t syncs_ GUARDED_BY(mu_) = 0;
  // The direct path: its descriptor (-1: buffered writes), and a staging buffer,
  // aligned for O_DIRECT and reused for every append, whose first tail_ bytes are
  // the file's bytes [end_ - tail_, end_), the partial block a next append rewrites.
  int direct_fd_ GUARDED_BY(mu_) = -1;
  struct FreeStaging {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, FreeStaging> staging_ GUARDED_BY(mu_);
  size_t tail_ GUARDED_BY(mu_) = 0;
};

// The folder a process spools in: the configured one, else a folder of its own per
// process and node (a volatile store's spool need not outlive the process, and two
// processes never share one), which Release removes with everything in it.
class SpoolDir {
 public:
  SpoolDir(std::filesystem::path configured, std::string_view kind, std::string_view node_id);
  const std::filesystem::path& path() const { return path_; }
  void Release();  // removes the folder if it is this process's own; idempotent

 private:
  std::filesystem::path path_;
  bool owned_ = false;
};

}  // namespace deltacast::relay
