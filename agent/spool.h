// Spool: the CHUNK messages of one refit kept in a file, so a node can replay to a
// child that rejoins exactly the chunks it lacks. Only an index (sequence ->
// offset, length) stays in memory, so a node's memory does not grow with the delta.
//
// Thread safety: Append and Read may be called from different threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"
#include "transport/transport.h"

namespace deltacast::agent {

class Spool {
 public:
  // Opens `dir`/refit-<id>.spool, keeping the valid chunks a previous run of this
  // node spooled for the same refit (a relay that restarts must still replay what
  // it had forwarded); other refits' spools in `dir` are deleted. The file is
  // removed with the spool.
  static Result<std::unique_ptr<Spool>> Open(const std::filesystem::path& dir, uint64_t refit_id);
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  // Appends a CHUNK message under the chunk's sequence number (END: its own
  // sequence, one past the last data chunk). A sequence already spooled is ignored.
  Status Append(uint32_t sequence, ByteSpan message);
  // The message spooled under `sequence`, read back from the file.
  Result<transport::Message> Read(uint32_t sequence) const;
  // Every spooled sequence, ascending.
  std::vector<uint32_t> sequences() const;
  uint64_t refit_id() const { return refit_id_; }
  uint64_t bytes() const;

 private:
  Spool(int fd, std::filesystem::path path, uint64_t refit_id) : fd_(fd), path_(std::move(path)), refit_id_(refit_id) {}
  void Recover();
  Result<transport::Message> ReadAt(uint64_t offset, uint64_t length) const;
  struct Entry {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  int fd_;
  std::filesystem::path path_;
  uint64_t refit_id_;
  mutable std::mutex mu_;
  std::map<uint32_t, Entry> index_;
  uint64_t end_ = 0;
};

}  // namespace deltacast::agent
