// DeltaHistory: the source's last K committed deltas, kept as the spool files it
// streamed them from, so that a node that missed several versions catches up by the
// chain of deltas (a few percent of the model each) rather than by every partition
// that changed since (docs/recovery.md, "Catch-up").
//
// Layout: DIR/delta-<target>.spool per delta and DIR/history, one line per delta,
// oldest first: "<base hex> <target hex> <partition bytes> <chunks>"; the index is
// rewritten atomically after the file is in place, so a crash leaves at worst a
// spool file that no line names (removed on the next Add).
//
// A snapshot store (relay/store/snapshot_store.h) keeps its committed chain the same way:
// AddFile takes the node's spool without moving it (a hard link, else a copy), and
// Retain drops the links a new snapshot holds.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "relay/store/spool.h"
#include "relay/wire/protocol.h"
#include "transport/transport.h"

namespace deltacast::relay {

class DeltaHistory {
 public:
  // Reads DIR/history if there is one; `keep` deltas are retained (0: none).
  DeltaHistory(std::filesystem::path dir, size_t keep);

  // Moves `spool` (every chunk of the committed delta base -> target, END
  // included) into the history and drops the oldest beyond `keep`.
  Status Add(std::unique_ptr<Spool> spool, const ChainLink& link);

  // As Add, for a spool file that stays where it is (its node still replays it to
  // children): linked into the history (copied where it cannot be linked) and
  // fsynced with its directory before the index names it.
  Status AddFile(const std::filesystem::path& spool_file, const ChainLink& link);

  // Keeps only the deltas from `from` to `to` (Chain), deleting the others.
  Status Retain(const Digest128& from, const Digest128& to);

  // The retained deltas, oldest first, and the bytes of their files.
  std::vector<ChainLink> links() const;
  uint64_t FileBytes() const;
  std::filesystem::path FileOf(const Digest128& target) const;

  // The retained deltas leading from `from` to `to`, oldest first; empty when the
  // history does not reach back to `from` (or from == to).
  std::vector<ChainLink> Chain(const Digest128& from, const Digest128& to) const;

  // The CHUNK message `sequence` of the retained delta to `target`.
  Result<transport::Message> Read(const Digest128& target, uint32_t sequence) const;

  size_t size() const;

 private:
  Status WriteIndex(const std::vector<ChainLink>& links) const REQUIRES(mu_);
  // With mu_ held: names the file now in place as `link`'s, trims, rewrites the index;
  // where the index cannot be written, the chain stays as it was.
  Status Adopt(const ChainLink& link) REQUIRES(mu_);
  std::vector<ChainLink> ChainLocked(const Digest128& from, const Digest128& to) const
      REQUIRES(mu_);

  const std::filesystem::path dir_;
  const size_t keep_;
  mutable Mutex mu_;
  std::vector<ChainLink> links_ GUARDED_BY(mu_);  // oldest first
  mutable std::map<std::string, std::unique_ptr<Spool>> open_
      GUARDED_BY(mu_);  // target hex -> spool
};

}  // namespace deltacast::relay
